// Running one handler call, bounded by RIG_ENTRY_DEADLINE_MS without progress. A handler past
// its deadline is abandoned: its `signal` is aborted and its attempt fenced, so whatever it does
// later does not count (JavaScript cannot stop a promise; the handler is asked to).
import { Degraded } from "./errors.js";
import type { Entry, Handler, ProgressReporter } from "./entry.js";
import { log } from "./log.js";
import { pause } from "./retry.js";

export const CANCEL_WAIT_MS = 1_000; // how long an abandoned handler may take to unwind on its signal

export type HandlerResult =
  | { kind: "ok" }
  | { kind: "error"; error: string }
  | { kind: "degraded"; degraded: Degraded }
  | { kind: "abandoned"; error: string } // at its deadline: WORK_FAILED, never run here again
  | { kind: "stopped" }; // the runtime stopped without waiting for it: left pending as it is

type Settled = { ok: true } | { ok: false; error: unknown };

function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return `Error: ${String(error)}`;
}

/** Run `handler(entry)` until it resolves, rejects, runs `deadlineMs` past its last progress
 * (`progress.last`, its start at first) without reporting any, or `abandon` is aborted (the
 * runtime stops without waiting for it). `giveUp` aborts the entry's signal. */
export async function callHandler(
  handler: Handler,
  entry: Entry,
  options: { progress: ProgressReporter; deadlineMs: number; abandon: AbortSignal; giveUp: AbortController },
): Promise<HandlerResult> {
  const { progress, deadlineMs, abandon: stopNow, giveUp } = options;
  let settled: Settled | undefined;
  const work: Promise<Settled> = (async () => {
    try {
      await handler(entry);
      return { ok: true } as const;
    } catch (error) {
      return { ok: false, error } as const;
    }
  })().then((s) => (settled = s));
  while (settled === undefined) {
    if (stopNow.aborted) {
      progress.fence();
      giveUp.abort(new Error("the runtime stopped"));
      return { kind: "stopped" };
    }
    let waitMs = 3_600_000;
    if (deadlineMs > 0) {
      waitMs = progress.last + deadlineMs - performance.now();
      if (waitMs <= 0) return await abandon(work, entry, progress, deadlineMs, giveUp);
    }
    // One wait per turn, its timer cleared after: a pending timer would hold the process up.
    const tick = new AbortController();
    const wake = (): void => tick.abort();
    stopNow.addEventListener("abort", wake, { once: true });
    await Promise.race([work, pause(waitMs, tick.signal)]);
    tick.abort();
    stopNow.removeEventListener("abort", wake);
  }
  const done: Settled = settled;
  if (done.ok) return { kind: "ok" };
  const error = done.error;
  if (error instanceof Degraded) return { kind: "degraded", degraded: error };
  log.warn(`Handler raised on entry ${entry.id}: ${describeError(error)}`);
  return { kind: "error", error: describeError(error) };
}

async function abandon(
  work: Promise<Settled>,
  entry: Entry,
  progress: ProgressReporter,
  deadlineMs: number,
  giveUp: AbortController,
): Promise<HandlerResult> {
  progress.fence();
  giveUp.abort(new Error(`no progress within ${deadlineMs} ms`));
  const unwound = new AbortController();
  await Promise.race([work.then(() => unwound.abort()), pause(CANCEL_WAIT_MS, unwound.signal)]);
  unwound.abort();
  log.warn(
    `Abandoned entry ${entry.id} (attempt ${entry.attempt}): no progress for ${deadlineMs / 1000}s; ` +
      "the reaper moves it elsewhere",
  );
  return { kind: "abandoned", error: `abandoned: no progress within ${deadlineMs / 1000}s` };
}
