// The chaos soak's handler for TypeScript agents (`rig-agent --handler bench/chaos_handler.mjs#handle`):
// exactly what `handle` in chaos.py does for Python agents, so one group can mix the runtimes and
// the report cannot tell them apart by their effects.
//
// Sleep 5 ms, then stage `<issueId>--<entryId>.a<attempt>.json` in CHAOS_OUT_DIR; poison throws.
// With CHAOS_DEGRADED every call throws Degraded (out of quota, 6 s); with CHAOS_HANG_EVERY=n the
// first attempt of every n-th issue hangs for 20 s without progress, heeding no signal (a
// deadlocked CLI).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

// The runtime the agent runs (`dist/bin.js`), so `instanceof Degraded` holds there.
import { Degraded } from "../clients/typescript/dist/index.js";

export async function handle(entry) {
  const issue = entry.fields.issueId;
  if (process.env.CHAOS_DEGRADED) {
    const until = new Date(Date.now() + 6_000);
    throw new Degraded("chaos_quota_exhausted", { until });
  }
  if (JSON.parse(entry.fields.payload || "{}").poison) {
    throw new Error(`${issue} is poison: its build fails every time`);
  }
  const hangEvery = Number.parseInt(process.env.CHAOS_HANG_EVERY ?? "0", 10);
  const n = Number.parseInt(issue.slice(issue.lastIndexOf("-") + 1), 10);
  if (hangEvery && entry.attempt === 1 && n % hangEvery === 0) {
    await sleep(20_000);
  }
  await sleep(5);
  const effect = { issueId: issue, entryId: entry.id, attempt: entry.attempt };
  const final = join(process.env.CHAOS_OUT_DIR, `${issue}--${entry.id}.a${entry.attempt}.json`);
  writeFileSync(entry.stage(final), JSON.stringify(effect));
}

export default handle;
