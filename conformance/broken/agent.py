"""Deliberately broken agents: the Python runtime with one flaw each, for the suite's negative
tests (`conformance/negative`). Each flaw breaks one rule of docs/protocol.md, and the scenario
that checks the rule must fail against it.

    python conformance/broken/agent.py <flaw> --handler MODULE:FUNC --agent-id ID --group G ...

Never run one against real work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `conformance` for the handler


def _no_ack() -> None:
    """Never XACKs: a finished entry stays pending for ever."""
    from redis.asyncio import Redis

    async def xack(self: Any, *args: Any, **kwargs: Any) -> int:
        return 1

    Redis.xack = xack  # type: ignore[method-assign]


def _ack_before_work() -> None:
    """XACKs as soon as WORK_STARTED is answered, before the handler has done anything."""
    from rig_conductor.agent.settle import Settler

    start = Settler.start

    async def early(self: Settler, entry_id: str, issue: str | None, reopened: str = "") -> Any:
        started = await start(self, entry_id, issue, reopened)
        if isinstance(started, int):
            await self._redis.xack(self.stream, self.group, entry_id)
        return started

    Settler.start = early  # type: ignore[method-assign]


def _publish_fenced() -> None:
    """Publishes a fenced attempt's staged files instead of discarding them."""
    from rig_conductor.agent import settle, staging

    def discard(files: Any) -> int:
        staging.commit(list(files))
        return 0

    settle.staging.discard = discard  # type: ignore[attr-defined]


def _silent_progress() -> None:
    """`progress()` sends nothing: a long entry looks hung to the reaper."""
    from rig_conductor.agent.conductor import Accepted, ConductorClient

    async def work_progress(self: Any, *, attempt: int, **kwargs: Any) -> Accepted:
        return Accepted(attempt, "running")

    ConductorClient.work_progress = work_progress  # type: ignore[method-assign]


def _no_deadline() -> None:
    """Waits on a handler for ever: no abandoning at RIG_ENTRY_DEADLINE_MS."""
    from rig_conductor.agent import cli, settings

    load = settings.load_agent_settings

    def load_without_deadline(**overrides: Any) -> settings.AgentSettings:
        return load(**overrides).model_copy(update={"entry_deadline_ms": 0})

    settings.load_agent_settings = load_without_deadline
    assert cli  # `cli.main` imports the name from `settings` when it runs


def _reads_while_degraded() -> None:
    """Flags its heartbeats after `Degraded`, but reads on."""
    from rig_conductor.agent.runtime import Agent

    after = Agent._after_failure

    def keep_reading(self: Agent, entry_id: str, result: Any) -> str:
        error = after(self, entry_id, result)
        self._paused_until = 0.0
        return error

    Agent._after_failure = keep_reading  # type: ignore[method-assign]


def _no_dead_letter() -> None:
    """Runs a worn-out entry again and again, never asking for its dead letter."""
    from rig_conductor.agent import runtime

    runtime.triage = lambda fields, **kwargs: "handle"  # type: ignore[assignment]


def _dead_letters_itself() -> None:
    """Writes the dead letter into `<stream>:dlq` itself and acks, as agents did in 0.1.0: a
    least-privilege agent user may not, and nobody records why."""
    from rig_conductor.agent.settle import Settler

    async def dead_letter(self: Settler, entry_id: str, issue: str | None, reason: str) -> Any:
        fields = {"originalId": entry_id, "stream": self.stream, "group": self.group}
        fields |= {"consumer": self.consumer, "reason": reason, "issueId": issue or ""}
        await self._redis.xadd(f"{self.stream}:dlq", fields)
        await self._redis.xack(self.stream, self.group, entry_id)
        return "dead-lettered by the agent itself", None

    Settler.dead_letter = dead_letter  # type: ignore[method-assign]


def _no_regroup() -> None:
    """After NOGROUP, reads on without creating the group again."""
    from rig_conductor.agent.runtime import Agent

    async def rejoin(self: Agent) -> None:
        self._joined = True

    Agent._rejoin_group = rejoin  # type: ignore[method-assign]


def _dies_on_sigterm() -> None:
    """Leaves SIGTERM to its default action: killed mid-entry, exit status -15."""
    from rig_conductor.agent import process

    run = process.run_agent

    async def without_signals(*args: Any, **kwargs: Any) -> None:
        await run(*args, **{**kwargs, "handle_signals": False})

    process.run_agent = without_signals  # type: ignore[assignment]


def _token_read_once() -> None:
    """Reads RIG_API_TOKEN_FILE at start only."""
    from rig_conductor.agent.token_file import TokenFile

    def current(self: TokenFile) -> str:
        return self._token

    TokenFile.current = current  # type: ignore[method-assign]
    TokenFile.refresh = lambda self: False  # type: ignore[method-assign]


def _no_lease() -> None:
    """Takes no consumer-name lease: two processes can read with one name."""
    from rig_conductor.agent.lease import ConsumerLease

    async def yes(self: Any, *args: Any, **kwargs: Any) -> bool:
        return True

    async def nothing(self: Any) -> None:
        return None

    ConsumerLease.acquire = yes  # type: ignore[method-assign]
    ConsumerLease.renew = yes  # type: ignore[method-assign]
    ConsumerLease.release = nothing  # type: ignore[method-assign]


# flaw -> (what it breaks, the scenario that must fail, the patch)
FLAWS: dict[str, tuple[str, str, Callable[[], None]]] = {
    "no-ack": ("never XACKs", "test_work.py::test_work_is_finished_once", _no_ack),
    "ack-before-work": (
        "XACKs before the handler runs",
        "test_work.py::test_a_sigkill_mid_entry_loses_nothing",
        _ack_before_work,
    ),
    "publish-fenced": (
        "publishes a fenced attempt's output",
        "test_work.py::test_a_stale_completion_is_fenced_and_never_published",
        _publish_fenced,
    ),
    "silent-progress": (
        "progress() sends nothing",
        "test_timing.py::test_progress_keeps_a_long_entry",
        _silent_progress,
    ),
    "no-deadline": (
        "never abandons a hung handler",
        "test_timing.py::test_a_hung_handler_is_abandoned_at_the_deadline",
        _no_deadline,
    ),
    "reads-while-degraded": (
        "reads on while self-fenced",
        "test_timing.py::test_degraded_pauses_reading_and_the_entries_move",
        _reads_while_degraded,
    ),
    "no-dead-letter": (
        "runs a worn-out entry for ever",
        "test_redis.py::test_a_poison_entry_is_dead_lettered_with_its_fields",
        _no_dead_letter,
    ),
    "no-regroup": (
        "does not create a vanished group again",
        "test_redis.py::test_a_vanished_group_is_created_again",
        _no_regroup,
    ),
    "dies-on-sigterm": (
        "is killed by SIGTERM mid-entry",
        "test_timing.py::test_sigterm_finishes_the_entry_in_hand_and_exits_0",
        _dies_on_sigterm,
    ),
    "token-read-once": (
        "reads its token file once",
        "test_work.py::test_a_rotated_token_file_is_read_again",
        _token_read_once,
    ),
    "no-lease": (
        "takes no consumer-name lease",
        "test_redis.py::test_two_processes_with_one_consumer_name_are_refused",
        _no_lease,
    ),
    "dead-letters-itself": (
        "writes the dead-letter stream itself",
        "test_redis.py::test_a_least_privilege_agent_user_suffices",
        _dead_letters_itself,
    ),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in FLAWS:
        print(
            f"usage: agent.py <{'|'.join(FLAWS)}> <rig-conductor agent arguments>", file=sys.stderr
        )
        return 2
    FLAWS[argv[0]][2]()
    from rig_conductor.agent import cli

    return cli._standalone(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
