// What a handler sees: the `Entry`, its `progress()`, `stage()` and `signal`; and the small
// decisions the runtime makes about an entry before any handler runs (`triage`).
import { Fenced } from "./errors.js";
import type { Staging } from "./staging.js";

/** One stream entry as a handler sees it, for one attempt. */
export interface Entry {
  readonly id: string;
  readonly stream: string;
  readonly group: string;
  readonly consumer: string;
  /** The attempt the conductor gave this run (WORK_STARTED). */
  readonly attempt: number;
  readonly fields: Readonly<Record<string, string>>;
  /** Report progress (WORK_PROGRESS): the entry keeps its deadline (reaper rule 4b). Rejects with
   * `Fenced` when a newer attempt owns the entry. The runtime never reports progress on its own:
   * a hung handler must look hung. */
  progress(): Promise<void>;
  /** A path beside `path` to write instead; renamed onto `path` once the conductor accepts this
   * attempt's completion, removed if the attempt is fenced off or fails. */
  stage(path: string): string;
  /** Aborted when the runtime gives this attempt up: at its deadline, or when it stops without
   * waiting for it (the grace period ran out, or a second SIGTERM). */
  readonly signal: AbortSignal;
}

/** Resolving = done; throwing = failed (left pending); throwing `Degraded` self-fences. */
export type Handler = (entry: Entry) => Promise<unknown> | unknown;

/** Sends WORK_PROGRESS for one attempt and keeps the time of the last sign of progress, which
 * the runtime's deadline counts from. `send` resolves true when accepted, false when fenced. */
export class ProgressReporter {
  last = performance.now();
  fenced = false;

  constructor(private readonly send: () => Promise<boolean>) {}

  /** The runtime gave this attempt up: from now on progress() rejects with Fenced. */
  fence(): void {
    this.fenced = true;
  }

  async report(): Promise<void> {
    if (this.fenced) throw new Fenced("this attempt was abandoned or fenced off");
    this.last = performance.now();
    if (!(await this.send())) {
      this.fenced = true;
      throw new Fenced("a newer attempt owns this entry");
    }
  }
}

export function makeEntry(
  base: Omit<Entry, "progress" | "stage" | "signal">,
  staging: Staging,
  progress: ProgressReporter,
  signal: AbortSignal,
): Entry {
  return Object.freeze({
    ...base,
    fields: Object.freeze({ ...base.fields }),
    progress: () => progress.report(),
    stage: (path: string) => staging.stage(path),
    signal,
  });
}

export type Triage = "trimmed" | "max-deliveries" | "handle";

/** What to do with an entry just read. `deliveries` counts the read that returned it. An entry
 * with no fields was deleted or trimmed from the stream (Redis still lists it as pending).
 * Otherwise the count before this read decides, as the reaper's rule does. */
export function triage(fields: Readonly<Record<string, string>>, deliveries: number, maxDeliveries: number): Triage {
  if (Object.keys(fields).length === 0) return "trimmed";
  if (deliveries - 1 >= maxDeliveries) return "max-deliveries";
  return "handle";
}
