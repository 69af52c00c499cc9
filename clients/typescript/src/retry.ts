// The agent's waits: backoff with jitter, Retry-After, a pause cut short by a stop, and the one
// retry loop every conductor call and every Redis read goes through. Pure but for the timers.

export const BACKOFF_START_MS = 500;
export const BACKOFF_MAX_MS = 10_000;
export const RETRY_AFTER_MAX_MS = 60_000;

/** Exponential from 0.5 s up to 10 s (the n-th failure, from 1), with jitter so a fleet does not
 * retry in step: a uniform draw from the upper half of the ceiling. */
export function backoff(attempt: number, random: () => number = Math.random): number {
  const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_START_MS * 2 ** Math.max(0, attempt - 1));
  return ceiling / 2 + random() * (ceiling / 2);
}

/** Milliseconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped at 60 s;
 * undefined when there is none or it cannot be read. */
export function retryAfter(header: string | null | undefined, now: number = Date.now()): number | undefined {
  if (!header) return undefined;
  const text = header.trim();
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1000, RETRY_AFTER_MAX_MS);
  // An HTTP date: IMF-fixdate (or the obsolete forms Date.parse also reads); it names a zone.
  if (!/[A-Za-z]{3}/.test(text)) return undefined;
  const when = Date.parse(text);
  if (Number.isNaN(when)) return undefined;
  return Math.min(Math.max(when - now, 0), RETRY_AFTER_MAX_MS);
}

/** Wait `ms` (at most about 24 days); cut short when `until` (any of them) is aborted. Never
 * rejects, and leaves no timer behind once cut short. */
export function pause(ms: number, until?: AbortSignal | readonly AbortSignal[]): Promise<void> {
  const signals = until === undefined ? [] : Array.isArray(until) ? until : [until as AbortSignal];
  return new Promise((done) => {
    if (signals.some((s) => s.aborted)) {
      done();
      return;
    }
    const finish = (): void => {
      clearTimeout(timer);
      for (const s of signals) s.removeEventListener("abort", finish);
      done();
    };
    const timer = setTimeout(finish, Math.min(Math.max(0, ms), 2 ** 31 - 1));
    for (const s of signals) s.addEventListener("abort", finish, { once: true });
  });
}

export interface RetryOptions {
  /** Which failures to retry; anything else is thrown at once. */
  retryOn: (error: unknown) => boolean;
  log?: (error: unknown, ms: number) => void;
  /** Once aborted, the next failure is thrown (a stop during a wait still gets one last try). */
  stop?: AbortSignal | undefined;
  /** At most this many calls (unlimited when undefined). */
  tries?: number | undefined;
  /** The wait after the n-th failure; undefined or 0: `backoff(n)`. */
  delay?: (error: unknown, attempt: number) => number | undefined;
}

/** `call()` until it returns, waiting between failures as `RetryOptions` say. */
export async function retry<T>(call: () => Promise<T>, options: RetryOptions): Promise<T> {
  for (let attempt = 1; ; attempt += 1) {
    const last = (options.tries !== undefined && attempt >= options.tries) || options.stop?.aborted === true;
    try {
      return await call();
    } catch (error) {
      if (last || !options.retryOn(error)) throw error;
      const ms = options.delay?.(error, attempt) || backoff(attempt);
      options.log?.(error, ms);
      await pause(ms, options.stop);
    }
  }
}
