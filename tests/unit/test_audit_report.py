"""report.html from its template: what the page lists, and that every value is escaped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.audit_conftest import require_pyspark

require_pyspark()

from rig_conductor.audit import report  # noqa: E402

NASTY = "<script>alert('x')</script>&"


def summary(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tenant": NASTY,
        "window": {"since": None, "until": None, "end": "2026-05-16T00:00:00+00:00"},
        "events": 1234567,
        "dispatched": 24,
        "completed": 18,
        "deadLettered": 2,
        "pending": 0,
        "lost": [{"stream": "rig:dispatch", "entryId": "1-0", "issueId": NASTY}],
        "duplicates": [{"issueId": "rc-12", "consumers": ["a-0", "b-0"]}],
        "reclaims": 3,
        "reclaimsByReason": {"owner-down": 1234},
        "reclaimLatencyMs": {"p50": 1500, "p95": 2500, "max": 30000},
        "agentDownMs": 600000,
    }
    return base | overrides


def render(tmp_path: Path, values: dict[str, Any], plots: tuple[str, ...] = ()) -> str:
    page = tmp_path / "report.html"
    report.write_html(page, values, report.ReportData(tables={"lost": "lost"}), plots)
    return page.read_text()


def test_the_page_shows_the_findings(tmp_path: Path) -> None:
    page = render(tmp_path, summary(), ("reclaim_latency.png",))
    assert page.startswith("<!doctype html>\n") and page.endswith("</body></html>\n")
    assert "window start of log to\n2026-05-16T00:00:00+00:00;\n1,234,567 events read." in page
    assert "<tr><td>reclaims by reason</td><td>owner-down 1,234</td></tr>" in page
    assert "<td>1,500 / 2,500 / 30,000</td>" in page
    assert "<tr><td>rc-12</td><td>a-0, b-0</td></tr>" in page
    assert "<img src='reclaim_latency.png' alt='reclaim_latency.png'>" in page
    assert "longer than 600,000 ms" in page
    assert "<tr><td>lost</td><td>lost/</td></tr>" in page
    assert page.count("<p class='none'>None.</p>") == 2  # no dead-letter rates, no agents


def test_every_value_is_escaped(tmp_path: Path) -> None:
    page = render(tmp_path, summary(), ("it's.png",))
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;" in page
    assert "<img src='it&#39;s.png'" in page


def test_a_long_list_is_cut_with_a_note(tmp_path: Path) -> None:
    lost = [{"stream": "s", "entryId": f"{i}-0", "issueId": f"rc-{i}"} for i in range(250)]
    page = render(tmp_path, summary(lost=lost, lostCount=1000))
    assert page.count("<td>s</td>") == report.MAX_TABLE_ROWS
    assert f"First {report.MAX_TABLE_ROWS} of 1000; all rows are in the Parquet table." in page
