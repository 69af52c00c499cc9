// What a handler may throw (Degraded) or meet (Fenced), and the agent's own one-line failures.

/** `entry.progress()` rejects with it when a newer attempt owns the entry (the reaper moved it,
 * or the runtime abandoned this attempt at its deadline): stop; nothing this attempt does counts. */
export class Fenced extends Error {
  override name = "Fenced";
}

export const DEGRADED_PAUSE_MS = 60_000; // a Degraded without `until` pauses reading this long

/** Throw from a handler when the agent cannot serve work now (a provider's quota, a 429).
 *
 * The entry stays pending; the agent heartbeats `degraded: true` with `reason` and reads nothing
 * until `until` (60 s from now when not given). Its entries go to healthy consumers once the
 * conductor's grace period has passed (reaper rule 3b). */
export class Degraded extends Error {
  override name = "Degraded";
  readonly reason: string;
  readonly until: Date | undefined;

  constructor(reason: string, options: { until?: Date } = {}) {
    super(reason);
    this.reason = reason;
    this.until = options.until;
  }

  /** Milliseconds to read nothing: until `until`, or the default pause. */
  pauseMs(now: number = Date.now()): number {
    if (this.until === undefined) return DEGRADED_PAUSE_MS;
    return Math.max(0, this.until.getTime() - now);
  }
}

/** The agent cannot start or has to stop; the message is one line for the operator. */
export class AgentError extends Error {
  override name = "AgentError";
}

/** Another live process reads with the same consumer name. */
export class ConsumerInUse extends AgentError {
  override name = "ConsumerInUse";
}

/** Another process took the consumer name over while this one ran. */
export class LeaseLost extends AgentError {
  override name = "LeaseLost";
}

/** A bad RIG_* value, phrased as one line that names the variable. */
export class SettingsError extends Error {
  override name = "SettingsError";
}
