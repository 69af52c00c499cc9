#!/usr/bin/env bash
# Hunt flaky tests: run the suite RUNS times in a row and count what failed in each round.
# Every round runs to its end, so one failure does not hide another; the summary lists every
# failed test with the rounds it failed in, then every test that came near its hang bound.
#
#   scripts/flake.sh [RUNS] [pytest args...]      (make flake RUNS=10 LOAD=3 ARGS='tests/e2e')
#
# Without pytest args a round is every tier `make test` runs (unit, integration, the Spark
# audit, end-to-end, topologies, browser); name paths to hunt fewer, e.g. the timing-sensitive
# `tests/e2e tests/topologies tests/browser`.
#
# LOAD=N (default 0) keeps N busy-loop processes spinning for the whole hunt, a machine already
# loaded by another run: at least WORKERS of them load it as CI's own parallel workers do. They
# are killed when the hunt ends, however it ends (Ctrl-C included).
#
# The servers are whatever the suite would use: the embedded ones unless RIG_TEST_REDIS_URL and
# RIG_TEST_DATABASE_URL name others. Each round shares its tests among WORKERS pytest-xdist
# workers (default 3, as `make test` does). Reports land in .artifacts/flake/round-N.{xml,log}.
set -uo pipefail
cd "$(dirname "$0")/.."

runs="${1:-10}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(tests --ignore=tests/install --ignore=tests/image --ignore=tests/chart)
load="${LOAD:-0}"
if ! [[ "$runs" =~ ^[1-9][0-9]*$ && "$load" =~ ^[0-9]+$ ]]; then
  echo "flake: RUNS must be a whole number >= 1 and LOAD >= 0 (got RUNS=$runs LOAD=$load)" >&2
  exit 2
fi
out="${RIG_ARTIFACTS_DIR:-$PWD/.artifacts}/flake"
rm -rf "$out"
mkdir -p "$out"

hogs=()
stop_hogs() {
  ((${#hogs[@]})) && kill "${hogs[@]}" 2>/dev/null
  wait "${hogs[@]}" 2>/dev/null
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT
trap 'stop_hogs; exit 143' TERM
for _ in $(seq 1 "$load"); do
  (while :; do :; done) &
  hogs+=($!)
done
((load)) && echo "load: $load busy-loop processes (pids ${hogs[*]})"

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
stop_hogs

.venv/bin/python - "$out" "$runs" "$load" <<'PY'
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

out, runs, load = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
failures: dict[str, list[int]] = defaultdict(list)
# A hang bound only stops a hang: a test past NEAR of its bound in any round is named, with its
# worst share, before a slower round fails it (docs/development.md).
NEAR = 0.4
near: dict[str, tuple[float, float, float]] = {}
executed = 0
for round_ in range(1, runs + 1):
    report = out / f"round-{round_}.xml"
    if not report.exists():
        failures["(no report: the run died)"].append(round_)
        continue
    for case in ET.parse(report).iter("testcase"):
        executed += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failures[name].append(round_)
        bounds = [p.get("value") for p in case.iter("property") if p.get("name") == "hang_bound_s"]
        bound = float(bounds[0]) if bounds else 0.0
        took = float(case.get("time") or 0)
        share = took / bound if bound else 0.0
        if share > max(NEAR, near.get(name, (0.0,))[0]):
            near[name] = (share, took, bound)
loaded = f", under {load} busy-loop processes" if load else ""
print(f"{runs} rounds{loaded}, {executed} tests run, {sum(map(len, failures.values()))} failures")
for name, rounds in sorted(failures.items()):
    print(f"  {name}: failed in round(s) {', '.join(map(str, rounds))}")
if near:
    print(f"{len(near)} tests took over {NEAR:.0%} of their hang bound (pytest.mark.timeout):")
    for name, (share, took, bound) in sorted(near.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name}: {took:.0f} s of {bound:.0f} s ({share:.0%})")
PY
((failed_rounds == 0))
