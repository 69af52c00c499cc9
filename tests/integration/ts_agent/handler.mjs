// Handlers the TypeScript-agent tests run inside real `rig-agent` processes, configured through
// the agent's environment as `tests/e2e/handlers.py` is:
//
// - E2E_OUT_DIR (required): effects go to `effects/<issueId>.json`, staged with `entry.stage`, so
//   a file appears only once the conductor has accepted the attempt's completion. Every call
//   first leaves a marker `calls/<issueId>.<consumer>.a<attempt>`.
// - E2E_WORK_S (default 0.05): the work, a sleep.
// - E2E_HOLD_FILE: a call blocks while this file exists, writing `holding-<consumer>` first (a
//   worker stuck in a long build, about to be killed).
// An issue dispatched with payload `{"poison": true}` fails on every call.
//
// `hang` blocks on the issues named in E2E_HANG_ISSUES (comma list) while E2E_HANG_FILE exists,
// reporting no progress and heeding no signal (a deadlocked CLI); other issues build. `review`
// throws `Degraded` while E2E_DEGRADED_CALLS calls are not spent (pausing E2E_DEGRADED_PAUSE_S),
// then builds.
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

// The runtime the agent runs (`dist/bin.js`), so `instanceof Degraded` holds.
import { Degraded } from "../../../clients/typescript/dist/index.js";

let calls = 0;

export async function build(entry) {
  const out = process.env.E2E_OUT_DIR;
  const issue = entry.fields.issueId;
  mkdirSync(join(out, "calls"), { recursive: true });
  writeFileSync(join(out, "calls", `${issue}.${entry.consumer}.a${entry.attempt}`), "");
  if (JSON.parse(entry.fields.payload || "{}").poison) {
    throw new Error(`${issue} is poison: its build fails every time`);
  }
  const hold = process.env.E2E_HOLD_FILE;
  if (hold && existsSync(hold)) {
    writeFileSync(join(out, `holding-${entry.consumer}`), entry.id);
    while (existsSync(hold) && !entry.signal.aborted) await sleep(50);
  }
  await sleep(Number(process.env.E2E_WORK_S ?? "0.05") * 1000);
  const effect = { issueId: issue, entryId: entry.id, consumer: entry.consumer, attempt: entry.attempt };
  writeFileSync(entry.stage(join(out, "effects", `${issue}.json`)), JSON.stringify(effect));
}

export async function hang(entry) {
  const out = process.env.E2E_OUT_DIR;
  const hangs = (process.env.E2E_HANG_ISSUES ?? "").split(",");
  const file = process.env.E2E_HANG_FILE;
  if (hangs.includes(entry.fields.issueId) && file && existsSync(file)) {
    mkdirSync(out, { recursive: true });
    writeFileSync(join(out, `hanging-${entry.consumer}`), entry.id);
    while (existsSync(file)) await sleep(50);
  }
  await build(entry);
}

export async function review(entry) {
  calls += 1;
  if (calls <= Number(process.env.E2E_DEGRADED_CALLS ?? "0")) {
    const until = new Date(Date.now() + Number(process.env.E2E_DEGRADED_PAUSE_S) * 1000);
    throw new Degraded(`codex_quota_exhausted_until_${until.toISOString()}`, { until });
  }
  await build(entry);
}

export default build;
