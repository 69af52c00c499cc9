#!/usr/bin/env bash
# Hunt flaky tests: run the timing-sensitive tiers (end-to-end and Redis topologies) RUNS times
# in a row and count what failed in each round. Every round runs to its end, so one failure does
# not hide another; the summary lists every failed test with the rounds it failed in.
#
#   scripts/flake.sh [RUNS] [pytest args...]      (make flake RUNS=10)
#
# The servers are whatever the suite would use: the embedded ones unless RIG_TEST_REDIS_URL and
# RIG_TEST_DATABASE_URL name others. Each round shares its tests among WORKERS pytest-xdist
# workers (default 3, as `make test` does), so they run as loaded as in CI. Reports land in
# .artifacts/flake/round-N.xml.
set -uo pipefail
cd "$(dirname "$0")/.."

runs="${1:-10}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(tests/e2e tests/topologies)
out="${RIG_ARTIFACTS_DIR:-$PWD/.artifacts}/flake"
rm -rf "$out"
mkdir -p "$out"

failed_rounds=0
for round in $(seq 1 "$runs"); do
  started=$SECONDS
  .venv/bin/python -m pytest -q -p no:cacheprovider -n "${WORKERS:-3}" \
    --junitxml="$out/round-$round.xml" "${targets[@]}" >"$out/round-$round.log" 2>&1
  code=$?
  tail -n 1 "$out/round-$round.log" | sed "s/^/round $round ($((SECONDS - started)) s): /"
  if ((code != 0)); then
    failed_rounds=$((failed_rounds + 1))
    grep -E '^(FAILED|ERROR) ' "$out/round-$round.log" | sed 's/^/    /'
  fi
done

.venv/bin/python - "$out" "$runs" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

out, runs = Path(sys.argv[1]), int(sys.argv[2])
failures: dict[str, list[int]] = defaultdict(list)
executed = 0
for round_ in range(1, runs + 1):
    report = out / f"round-{round_}.xml"
    if not report.exists():
        failures["(no report: the run died)"].append(round_)
        continue
    for case in ET.parse(report).iter("testcase"):
        executed += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failures[f"{case.get('classname')}::{case.get('name')}"].append(round_)
print(f"{runs} rounds, {executed} tests run, {sum(map(len, failures.values()))} failures")
for name, rounds in sorted(failures.items()):
    print(f"  {name}: failed in round(s) {', '.join(map(str, rounds))}")
EOF
((failed_rounds == 0))
