"""The audit's report.html in a real browser: the headline, the three plots loaded beside it,
and the findings. Rendered from values (the page and plots take no Spark), so the picture in
docs/audit.md is this test's screenshot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, expect

from tests.audit_conftest import require_pyspark

require_pyspark()  # the audit's extra: matplotlib draws the plots

from rig_conductor.audit import report  # noqa: E402

END = datetime(2026, 11, 28, 12, tzinfo=UTC)


def findings() -> dict[str, Any]:
    return {
        "tenant": "default",
        "window": {"since": None, "until": None, "end": END.isoformat()},
        "events": 48_213,
        "dispatched": 2_400,
        "completed": 2_391,
        "deadLettered": 6,
        "pending": 2,
        "lost": [{"stream": "rig:dispatch", "entryId": "1795912141128-0", "issueId": "rc-1812"}],
        "duplicates": [],
        "reclaims": 41,
        "reclaimsByReason": {"down": 37, "pod-gone": 4},
        "reclaimLatencyMs": {"p50": 9_800, "p95": 61_000, "max": 600_400},
        "agentDownMs": 600_000,
        "deadLetterRate": [
            {"stream": "rig:dispatch", "dispatched": 2_400, "deadLettered": 6, "rate": 0.0025}
        ],
        "agents": [
            {
                "agentId": "builder-a",
                "availability": 1.0,
                "downMs": 0,
                "downPeriods": 0,
                "downAtEnd": False,
            },
            {
                "agentId": "builder-b",
                "availability": 0.93,
                "downMs": 6_048_000,
                "downPeriods": 2,
                "downAtEnd": False,
            },
        ],
    }


def report_data() -> report.ReportData:
    start = END - timedelta(days=1)
    hours = [start + timedelta(hours=h) for h in range(25)]
    return report.ReportData(
        latency_bins=[
            report.HistogramBin(start_ms=b * 10_000, end_ms=(b + 1) * 10_000, count=c)
            for b, c in enumerate([12, 17, 5, 3, 2, 1, 0, 1])
        ],
        timelines=[
            report.AgentTimeline("builder-a", start, 1.0),
            report.AgentTimeline(
                "builder-b",
                start,
                0.93,
                down=[(hours[6], hours[7]), (hours[15], hours[15] + timedelta(minutes=40))],
            ),
        ],
        window_end=END,
        pending=[
            report.PendingPoint(at, dispatched=100, finished=100 - n % 3, outstanding=n % 4)
            for n, at in enumerate(hours)
        ],
        tables={"lost": "lost", "duplicates": "duplicates"},
    )


async def test_the_audit_report_shows_its_findings_and_plots(
    browser: Browser, tmp_path: Path, screenshots: Path
) -> None:
    values, data = findings(), report_data()
    plots = report.write_plots(tmp_path, values, data)
    report.write_html(tmp_path / "report.html", values, data, plots)
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    await page.goto((tmp_path / "report.html").as_uri())
    await expect(page.locator("body")).to_contain_text("rc-1812")
    images = page.locator("img")
    await expect(images).to_have_count(len(plots))
    for n in range(len(plots)):
        loaded = await images.nth(n).evaluate("img => img.complete && img.naturalWidth > 0")
        assert loaded, plots[n]
    await page.screenshot(path=screenshots / "audit-report.png", full_page=True)
