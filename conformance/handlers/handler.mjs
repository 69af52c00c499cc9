// The conformance handler for the TypeScript runtime: what `conformance/README.md` specifies, in
// JavaScript. `rig-agent --handler conformance/handlers/handler.mjs`.
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

// The runtime the agent runs (`dist/bin.js`), so `instanceof` holds for Degraded and Fenced.
import { Degraded, Fenced } from "../../clients/typescript/dist/index.js";

function matches(value, consumer) {
  return value === "*" || (Array.isArray(value) && value.includes(consumer));
}

function touch(...parts) {
  mkdirSync(join(...parts.slice(0, -1)), { recursive: true });
  writeFileSync(join(...parts), "");
}

export default async function handle(entry) {
  const out = process.env.CONFORMANCE_OUT;
  const issue = entry.fields.issueId;
  const me = `${issue}.${entry.consumer}`;
  touch(out, "calls", `${me}.a${entry.attempt}`);
  const payload = JSON.parse(entry.fields.payload || "{}");
  if (payload.fail) throw new Error(`${issue} fails on every call`);
  if (matches(payload.degraded, entry.consumer)) {
    const until = new Date(Date.now() + Number(payload.pauseS ?? 30) * 1000);
    throw new Degraded("conformance_degraded", { until });
  }
  if (matches(payload.hold, entry.consumer)) {
    touch(out, "holding", me);
    // Deaf to `entry.signal`: a hung call, as a deadlocked tool would be.
    while (!existsSync(join(out, "release", issue))) await sleep(50);
  }
  if ("workS" in payload) {
    const every = Number(payload.progressS);
    for (let n = Math.round(Number(payload.workS) / every); n > 0; n -= 1) {
      await sleep(every * 1000);
      try {
        await entry.progress();
      } catch (error) {
        if (error instanceof Fenced) touch(out, "fenced", `${me}.a${entry.attempt}`);
        throw error;
      }
    }
  }
  const effect = { issueId: issue, entryId: entry.id, consumer: entry.consumer, attempt: entry.attempt };
  writeFileSync(entry.stage(join(out, "effects", `${issue}.json`)), JSON.stringify(effect));
}
