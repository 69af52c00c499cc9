"""The audit's human-readable output: three PNG plots and a self-contained report.html.

Takes plain Python values that `main` collected from the findings; no Spark here. Figures use
matplotlib's object API on the Agg canvas: no pyplot state and no display needed. The page is
templates/report.html (Jinja2, autoescaped), shipped in the wheel as package data; this module
only picks the values it shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from matplotlib import dates
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LATENCY_PNG = "reclaim_latency.png"
AVAILABILITY_PNG = "availability.png"
PENDING_PNG = "pending_over_time.png"
MAX_TIMELINE_AGENTS = 40
MAX_TABLE_ROWS = 200

_UP, _DOWN, _ACCENT = "#4c9a2a", "#c0392b", "#2c6fbb"


@dataclass(frozen=True, slots=True)
class HistogramBin:
    start_ms: float
    end_ms: float
    count: int


@dataclass(frozen=True, slots=True)
class AgentTimeline:
    agent_id: str
    first_heartbeat: datetime
    availability: float
    down: Sequence[tuple[datetime, datetime]] = ()


@dataclass(frozen=True, slots=True)
class PendingPoint:
    at: datetime
    dispatched: int
    finished: int
    outstanding: int


@dataclass(frozen=True, slots=True)
class ReportData:
    """Everything the page shows besides summary.json's numbers."""

    latency_bins: Sequence[HistogramBin] = ()
    timelines: Sequence[AgentTimeline] = ()
    window_end: datetime | None = None
    pending: Sequence[PendingPoint] = ()
    tables: Mapping[str, str] = field(default_factory=dict)  # name -> relative Parquet path


def _day(value: datetime) -> float:
    """matplotlib's date number for an instant: days since its default epoch, 1970-01-01 UTC."""
    return value.timestamp() / 86_400


def _time_axis(axes: Axes) -> None:
    # matplotlib.dates ships without annotations.
    locator = dates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    formatter = dates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_formatter(formatter)


def _save(figure: Figure, path: Path) -> None:
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=100)


def _empty(figure: Figure, message: str) -> None:
    axes = figure.add_subplot()
    axes.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="#666666")
    axes.set_axis_off()


def plot_latency(path: Path, bins: Sequence[HistogramBin], latency: Mapping[str, Any]) -> None:
    """Histogram of reclaim latency (s), with p50 and p95 marked."""
    figure = Figure(figsize=(8, 4), layout="constrained")
    if not bins:
        _empty(figure, "No reclaim with a last heartbeat in this window")
    else:
        axes = figure.add_subplot()
        axes.bar(
            [b.start_ms / 1000 for b in bins],
            [b.count for b in bins],
            width=[(b.end_ms - b.start_ms) / 1000 for b in bins],
            align="edge",
            color=_ACCENT,
            edgecolor="white",
        )
        for name, style in (("p50", "--"), ("p95", ":")):
            value = latency.get(name)
            if value is not None:
                axes.axvline(
                    value / 1000, color=_DOWN, linestyle=style, label=f"{name} {value:,.0f} ms"
                )
        axes.set_xlabel("reclaim time - owner's last heartbeat (s)")
        axes.set_ylabel("reclaimed entries")
        axes.set_title("Reclaim latency")
        axes.legend()
    _save(figure, path)


def plot_availability(
    path: Path, timelines: Sequence[AgentTimeline], window_end: datetime | None
) -> None:
    """One bar per agent from its first heartbeat to the window's end; down time in red."""
    shown = list(timelines)[:MAX_TIMELINE_AGENTS]
    height = 1.5 + 0.35 * max(len(shown), 1)
    figure = Figure(figsize=(10, height), layout="constrained")
    if not shown or window_end is None:
        _empty(figure, "No heartbeat in this window")
        _save(figure, path)
        return
    axes = figure.add_subplot()
    end = _day(window_end)
    for row, agent in enumerate(reversed(shown)):
        start = _day(agent.first_heartbeat)
        axes.barh(row, end - start, left=start, height=0.6, color=_UP)
        for down_from, down_until in agent.down:
            left = _day(down_from)
            axes.barh(row, _day(down_until) - left, left=left, height=0.6, color=_DOWN)
    _time_axis(axes)
    axes.set_yticks(
        range(len(shown)),
        [f"{a.agent_id} ({a.availability:.1%})" for a in reversed(shown)],
        fontsize=8,
    )
    axes.set_xlabel("time (UTC)")
    title = "Agent availability from heartbeat gaps (red: down)"
    if len(timelines) > len(shown):
        title += f"; the {len(shown)} least available of {len(timelines)} agents"
    axes.set_title(title)
    _save(figure, path)


def plot_pending(path: Path, points: Sequence[PendingPoint]) -> None:
    """Outstanding entries (dispatched minus finished) over time, with the per-bucket flows."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    if not points:
        _empty(figure, "Nothing dispatched in this window")
        _save(figure, path)
        return
    axes = figure.add_subplot()
    times = [_day(p.at) for p in points]
    marker = "o" if len(points) < 30 else None  # a handful of buckets: show each one
    axes.step(
        times,
        [p.outstanding for p in points],
        where="post",
        color=_ACCENT,
        marker=marker,
        label="outstanding (dispatched - finished)",
    )
    axes.plot(
        times,
        [p.dispatched for p in points],
        color="#999999",
        linewidth=0.8,
        label="dispatched per bucket",
    )
    axes.plot(
        times, [p.finished for p in points], color=_UP, linewidth=0.8, label="finished per bucket"
    )
    _time_axis(axes)
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel("entries")
    axes.set_title("Pending over time")
    axes.legend()
    _save(figure, path)


def write_plots(directory: Path, summary: Mapping[str, Any], data: ReportData) -> list[str]:
    plot_latency(directory / LATENCY_PNG, data.latency_bins, summary["reclaimLatencyMs"])
    plot_availability(directory / AVAILABILITY_PNG, data.timelines, data.window_end)
    plot_pending(directory / PENDING_PNG, data.pending)
    return [LATENCY_PNG, AVAILABILITY_PNG, PENDING_PNG]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if value < 1 else f"{value:,.0f}"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value)
    return str(value)


_PAGES = Environment(
    loader=PackageLoader("rig_conductor.audit", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    keep_trailing_newline=True,
)
_PAGES.filters["cell"] = _cell
_PAGES.globals["max_rows"] = MAX_TABLE_ROWS


def write_html(
    path: Path, summary: Mapping[str, Any], data: ReportData, plots: Sequence[str]
) -> None:
    """report.html from templates/report.html: the headline, the plots, the listed findings."""
    window = summary.get("window", {})
    page = _PAGES.get_template("report.html").render(
        tenant=str(summary.get("tenant", "")),
        since=str(window.get("since") or "start of log"),
        until=str(window.get("until") or window.get("end") or "now"),
        events=f"{summary.get('events', 0):,}",
        down_ms=f"{summary.get('agentDownMs', 0):,}",
        headline=_headline(summary),
        plots=plots,
        lost=[(d["stream"], d["entryId"], d["issueId"]) for d in summary["lost"]],
        lost_count=summary.get("lostCount"),
        duplicates=[(d["issueId"], d["consumers"]) for d in summary["duplicates"]],
        duplicate_count=summary.get("duplicateCount"),
        rates=[
            (r["stream"], r["dispatched"], r["deadLettered"], r["rate"])
            for r in summary.get("deadLetterRate", [])
        ],
        agents=[
            (a["agentId"], a["availability"], a["downMs"], a["downPeriods"], a["downAtEnd"])
            for a in summary.get("agents", [])
        ],
        tables=[(name, f"{rel}/") for name, rel in sorted(data.tables.items())],
    )
    path.write_text(page, encoding="utf-8")


def _headline(summary: Mapping[str, Any]) -> list[tuple[str, Any]]:
    latency = summary["reclaimLatencyMs"]
    return [
        ("dispatched", summary["dispatched"]),
        ("completed", summary["completed"]),
        ("dead-lettered", summary["deadLettered"]),
        ("pending", summary["pending"]),
        ("lost", summary.get("lostCount", len(summary["lost"]))),
        ("duplicates", summary.get("duplicateCount", len(summary["duplicates"]))),
        ("reclaims", summary["reclaims"]),
        (
            "reclaims by reason",
            ", ".join(f"{r} {n:,}" for r, n in summary.get("reclaimsByReason", {}).items())
            or "none",
        ),
        (
            "reclaim latency p50 / p95 / max (ms)",
            f"{latency['p50']:,} / {latency['p95']:,} / {latency['max']:,}",
        ),
    ]
