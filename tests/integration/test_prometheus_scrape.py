"""A real Prometheus scrapes `rig-conductor serve` and loads the chart's alerting rules.

Needs /usr/bin/prometheus (Debian's prometheus package). Without it the test is skipped, unless
CI is set: CI installs the package, so there a missing binary is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from .helpers import fill, free_port, read, register, serve

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "rig-conductor" / "files" / "prometheus-rules.yaml"
PROMETHEUS = Path("/usr/bin/prometheus")
STREAM, GROUP = "rig:dispatch", "workers"
DEADLINE_S = 30.0


def prometheus_binary() -> Path:
    if PROMETHEUS.is_file() and os.access(PROMETHEUS, os.X_OK):
        return PROMETHEUS
    message = f"{PROMETHEUS} not found (Debian package: prometheus)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it (apt-get install prometheus)")
    pytest.skip(message)


@contextmanager
def prometheus(
    binary: Path, workdir: Path, target: str
) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """Prometheus on a free loopback port scraping `target` every second; always stopped."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "rig-conductor", "static_configs": [{"targets": [target]}]}
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    log = workdir / "prometheus.log"
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", log, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def log_tail(log: Path) -> str:
    return log.read_text()[-2000:] if log.exists() else ""


async def poll(check: Any, what: str, log: Path, deadline: float) -> Any:
    """Await `check()` until it returns something truthy, or fail before `deadline`."""
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except httpx.TransportError as exc:
            last = exc
        else:
            if last:
                return last
        await asyncio.sleep(0.25)
    tail = await asyncio.to_thread(log_tail, log)
    pytest.fail(f"timed out waiting for {what}; last answer: {last!r}\nprometheus log:\n{tail}")


async def test_prometheus_scrapes_a_reclaim_and_loads_the_rules(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    binary = prometheus_binary()
    expected_alerts = set(re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE))
    assert expected_alerts, f"no alerts in {RULES}"
    deadline = time.monotonic() + DEADLINE_S
    async with serve(
        redis_url,
        database_url,
        RIG_STREAMS=STREAM,
        RIG_AGENT_IDS="dev-e,qa-e",
        RIG_ENTRY_STALE_MS="0",
        RIG_SCAN_INTERVAL_S="0.5",
        RIG_STARTUP_DELAY_S="0",
    ) as conductor:
        target = urlsplit(conductor.url).netloc
        with prometheus(binary, tmp_path, target) as (prom_url, log, process):
            async with httpx.AsyncClient(base_url=prom_url, timeout=5) as prom:

                async def ready() -> bool:
                    if process.poll() is not None:
                        tail = await asyncio.to_thread(log_tail, log)
                        pytest.fail(f"prometheus exited with {process.returncode}:\n{tail}")
                    return (await prom.get("/-/ready")).status_code == 200

                await poll(ready, "Prometheus to be ready", log, deadline)

                # dev-e (never heartbeated: down) holds 3 entries; qa-e-0 is live.
                await fill(redis, STREAM, GROUP, 3)
                assert len(await read(redis, STREAM, GROUP, "dev-e-rig-agent-runtime-0", 3)) == 3
                await register(redis, STREAM, GROUP, "qa-e-0")
                async with httpx.AsyncClient(base_url=conductor.url) as api:
                    answer = await api.post(
                        "/api/events",
                        json={"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"},
                    )
                    assert answer.status_code == 202, answer.text

                want = {
                    "__name__": "rig_reclaimed_entries_total",
                    "job": "rig-conductor",
                    "instance": target,
                    "stream": STREAM,
                    "group": GROUP,
                    "from_agent": "dev-e",
                    "to_agent": "qa-e",
                    "reason": "down",
                }

                async def reclaimed() -> list[Any]:
                    answer = await prom.get(
                        "/api/v1/query", params={"query": "rig_reclaimed_entries_total"}
                    )
                    result = answer.json()["data"]["result"]
                    return [r for r in result if r["metric"] == want and r["value"][1] == "3"]

                await poll(
                    reclaimed, "rig_reclaimed_entries_total == 3 in Prometheus", log, deadline
                )

                async def scans_increasing() -> list[Any]:
                    query = "sum(increase(rig_reaper_scans_total[1m])) > 0"
                    answer = await prom.get("/api/v1/query", params={"query": query})
                    return list(answer.json()["data"]["result"])

                await poll(scans_increasing, "reaper scans increasing in Prometheus", log, deadline)

                async def alerts_settled() -> dict[str, Any] | None:
                    answer = await prom.get("/api/v1/rules", params={"type": "alert"})
                    rules = {
                        r["name"]: r for g in answer.json()["data"]["groups"] for r in g["rules"]
                    }
                    if not rules or any(r["health"] != "ok" for r in rules.values()):
                        return None
                    # Pending at start-up (nothing scraped yet: absent), quiet once scans show.
                    scanning = rules["RigReaperNotScanning"]["state"] == "inactive"
                    down = {a["labels"].get("agent") for a in rules["RigAgentDown"]["alerts"]}
                    return rules if scanning and down == {"dev-e"} else None

                rules = await poll(alerts_settled, "alert states to settle", log, deadline)
                assert set(rules) == expected_alerts
                assert not [r["lastError"] for r in rules.values() if r.get("lastError")]
                assert rules["RigAgentDown"]["state"] == "pending"  # for: 10m
