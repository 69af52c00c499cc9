"""`rig-conductor work | pending | move | deadletters | reclaims`: the operator's calls to the
HTTP API, printed as a table (or, with `-o json`, the API's JSON as it came)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from rig_conductor.ops_cli import client
from rig_conductor.ops_cli.tables import table
from rig_conductor.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], Any]


def add_parsers(sub: Any) -> None:
    """Register the operator commands on the `rig-conductor` subcommands."""
    work = _parser(sub, "work", "the whole story of one issue (or, with --stream, one entry)")
    work.add_argument("issue_id", metavar="ISSUE_ID")
    work.add_argument("--stream", help="take ISSUE_ID as an entry id of this stream")
    _paged(work, "timeline items per page")
    work.set_defaults(command=_run(_work, _print_work))

    pending = _parser(sub, "pending", "a group's pending entries, oldest first")
    pending.add_argument("stream", metavar="STREAM")
    pending.add_argument("group", metavar="GROUP")
    pending.add_argument("--consumer", help="only this consumer's")
    _paged(pending, "entries per page")
    pending.set_defaults(command=_run(_pending, _print_pending))

    move = _parser(sub, "move", "move pending entries to a live consumer (operator)")
    move.add_argument("stream", metavar="STREAM")
    move.add_argument("group", metavar="GROUP")
    move.add_argument("entry_ids", metavar="ID", nargs="+")
    move.add_argument("--to", required=True, metavar="CONSUMER", help="the consumer to move to")
    move.set_defaults(command=_run(_move, _print_move))

    letters = _parser(sub, "deadletters", "list, requeue or delete dead letters")
    actions = letters.add_subparsers(required=True, metavar="ACTION", dest="action")
    listing = actions.add_parser("list", help="the newest dead letters of a stream")
    listing.add_argument("--stream", help="default: RIG_DISPATCH_STREAM")
    listing.add_argument("--count", type=int, default=100, help="how many (at most 1,000)")
    _output(listing)
    listing.set_defaults(command=_run(_letters, _print_letters))
    for action in ("requeue", "delete"):
        acting = actions.add_parser(action, help=f"{action} dead letters (operator)")
        acting.add_argument("dlq_ids", metavar="DLQ_ID", nargs="*", help="dead letter ids")
        acting.add_argument("--stream", help="default: RIG_DISPATCH_STREAM")
        acting.add_argument("--reason", help="every dead letter with this reason")
        acting.add_argument("--text", help="every dead letter with this text in a field")
        _output(acting)
        acting.set_defaults(command=_run(_act_on_letters, _print_counts))

    reclaims = _parser(sub, "reclaims", "the moves, newest first")
    reclaims.add_argument("--stream")
    reclaims.add_argument("--agent", help="moves from or to this agent")
    reclaims.add_argument("--reason", help="down, pod-gone, degraded, stalled or manual")
    reclaims.add_argument("--since", metavar="ISO", help="moves at or after this time")
    _paged(reclaims, "moves per page")
    reclaims.set_defaults(command=_run(_reclaims, _print_reclaims))


def _parser(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=text,
        description=f"{text[0].upper()}{text[1:]}, over the HTTP API (RIG_CONDUCTOR_URL, "
        "RIG_API_TOKEN or RIG_API_TOKEN_FILE). Exit 1 with one line when the API refuses.",
    )
    if name != "deadletters":
        _output(parser)
    return parser


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="table or json"
    )


def _paged(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--limit", type=int, help=what)
    parser.add_argument("--after", help="the cursor the previous page ended with")


def _run(ask: Handler, show: Callable[[Any], str]) -> Callable[[argparse.Namespace, Settings], int]:
    def command(args: argparse.Namespace, settings: Settings) -> int:
        try:
            answer = ask(args, settings)
        except client.Stop as stop:
            print(f"rig-conductor: {stop.message}", file=sys.stderr)
            return stop.code
        if args.output == "json":
            print(json.dumps(answer, indent=2))
        else:
            print(show(answer))
        return client.EXIT_OK

    return command


def _seg(text: str) -> str:
    return quote(text, safe="")


def _work(args: argparse.Namespace, settings: Settings) -> Any:
    params = {"limit": args.limit, "after": args.after}
    if args.stream:
        path = f"/api/streams/{_seg(args.stream)}/entries/{_seg(args.issue_id)}"
    else:
        path = f"/api/work/{_seg(args.issue_id)}"
    return client.call("GET", path, params=params)


def _print_work(story: dict[str, Any]) -> str:
    head = (
        f"issue {story.get('issueId') or '-'}  {story['stream']} {story['entryId']}  "
        f"state {story['state']}"
    )
    groups = table(
        ("GROUP", "STATE", "HOLDER", "ATTEMPT"),
        [(g["group"], g["state"], g["holder"], g["attempt"]) for g in story["groups"]],
    )
    items = table(
        ("AT", "KIND", "ENTRY", "GROUP", "CONSUMER", "ATTEMPT", "DETAIL"),
        [
            (
                item["at"],
                item["kind"],
                item.get("entryId"),
                item.get("group"),
                item.get("consumer") or item.get("agentId"),
                item.get("attempt"),
                _detail(item),
            )
            for item in story["timeline"]
        ],
    )
    more = f"\n(more: --after {story['next']})" if story.get("next") else ""
    return f"{head}\n\n{groups}\n\n{items}{more}"


def _detail(item: dict[str, Any]) -> str:
    parts = []
    if "from" in item or "to" in item:
        parts.append(f"{item.get('from')} -> {item.get('to')}")
    if item.get("reason"):
        parts.append(str(item["reason"]))
    if item.get("count"):
        parts.append(f"x{item['count']} until {item.get('until')}")
    for key in ("by", "askedBy", "dlqId", "replaces"):
        if item.get(key):
            parts.append(f"{key} {item[key]}")
    return "; ".join(parts)


def _pending(args: argparse.Namespace, settings: Settings) -> Any:
    path = f"/api/streams/{_seg(args.stream)}/groups/{_seg(args.group)}/pending"
    params = {"consumer": args.consumer, "limit": args.limit, "after": args.after}
    return client.call("GET", path, params=params)


def _print_pending(rows: list[dict[str, Any]]) -> str:
    return table(
        ("ENTRY", "CONSUMER", "IDLE_MS", "DELIVERIES", "ISSUE"),
        [(r["entryId"], r["consumer"], r["idleMs"], r["deliveries"], r["issueId"]) for r in rows],
    )


def _move(args: argparse.Namespace, settings: Settings) -> Any:
    body = {"stream": args.stream, "group": args.group, "entryIds": args.entry_ids, "to": args.to}
    return client.call("POST", "/api/moves", json=body)


def _print_move(done: dict[str, Any]) -> str:
    rows = [(i, "moved") for i in done["moved"]]
    rows += [(s["entryId"], f"skipped: {s['why']}") for s in done["skipped"]]
    return table(("ENTRY", "RESULT"), rows)


def _letters(args: argparse.Namespace, settings: Settings) -> Any:
    params = {"stream": args.stream, "count": args.count}
    return client.call("GET", "/api/deadletters", params=params)


def _print_letters(rows: list[dict[str, Any]]) -> str:
    return table(
        ("DLQ_ID", "ORIGINAL", "GROUP", "CONSUMER", "DELIVERIES", "REASON", "ISSUE"),
        [
            (
                r["dlqId"],
                r["originalId"],
                r["group"],
                r["consumer"],
                r["deliveries"],
                r["reason"],
                r["fields"].get("issueId"),
            )
            for r in rows
        ],
    )


def _act_on_letters(args: argparse.Namespace, settings: Settings) -> Any:
    stream = args.stream or settings.dispatch_stream
    body: dict[str, Any] = {"stream": stream}
    if args.dlq_ids:
        if args.reason or args.text:
            raise client.Stop(
                client.EXIT_USAGE, "give dead letter ids or --reason/--text, not both"
            )
        body["dlqIds"] = args.dlq_ids
    elif args.reason or args.text:
        body["match"] = {k: v for k, v in (("reason", args.reason), ("text", args.text)) if v}
    else:
        raise client.Stop(client.EXIT_USAGE, "give dead letter ids, --reason or --text")
    if args.action == "requeue":
        return client.call("POST", "/api/deadletters/requeue", json=body)
    return client.call("DELETE", "/api/deadletters", json=body)


def _print_counts(done: dict[str, Any]) -> str:
    said = [f"{what} {done[what]}" for what in ("requeued", "deleted") if what in done]
    return f"{done['stream']}: {', '.join(said)}"


def _reclaims(args: argparse.Namespace, settings: Settings) -> Any:
    params = {
        "stream": args.stream,
        "agent": args.agent,
        "reason": args.reason,
        "since": args.since,
        "limit": args.limit,
        "after": args.after,
    }
    return client.call("GET", "/api/reclaims", params=params)


def _print_reclaims(rows: list[dict[str, Any]]) -> str:
    return table(
        ("AT", "STREAM", "GROUP", "FROM", "TO", "REASON", "BY", "ENTRIES", "ID"),
        [
            (
                r["at"],
                r["stream"],
                r["group"],
                r["from"],
                r["to"],
                r["reason"],
                r.get("by"),
                _ids(r["entryIds"]),
                r["id"],
            )
            for r in rows
        ],
    )


def _ids(ids: list[str]) -> str:
    return " ".join(ids) if len(ids) <= 3 else f"{' '.join(ids[:3])} (+{len(ids) - 3})"
