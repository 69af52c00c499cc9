// A thin client for the conductor's `POST /api/events`: heartbeats and WORK_* / DEAD_LETTER
// reports. Retries what the protocol says to retry (no answer, 429, 502, 503, 504) with backoff,
// honouring Retry-After, and turns answers into small result objects (`classify`). Decides
// nothing about entries: the runtime does.
import { log } from "./log.js";
import { retry, retryAfter } from "./retry.js";
import type { StagedOutput } from "./staging.js";
import type { TokenFile } from "./tokenFile.js";

const RETRYABLE = new Set([429, 502, 503, 504]);
export const REQUEST_TIMEOUT_MS = 10_000;

/** No answer from the conductor (connection errors, 429, 5xx) within the retries allowed. */
export class ConductorUnavailable extends Error {
  override name = "ConductorUnavailable";
  constructor(
    message: string,
    readonly retryAfterMs?: number,
  ) {
    super(message);
  }
}

/** The conductor refused the request itself (401, 403, 422, ...): retrying will not help. */
export class ConductorRejected extends Error {
  override name = "ConductorRejected";
}

/** A 2xx: WORK_STARTED's attempt, or a report recorded. */
export interface Accepted {
  kind: "accepted";
  attempt: number | undefined;
  state: string | undefined;
  data: Record<string, unknown>;
}

/** A 409. `fenced`: the report's attempt is not current (`state` says why: `done`, `dead`,
 * `superseded`, or a newer attempt `running`); `refused`: this consumer may not send it. A done
 * entry's `outputs` are the accepted attempt's files still to publish. */
export interface Conflict {
  kind: "fenced" | "refused";
  attempt: number;
  state: string;
  detail: string;
  outputs: StagedOutput[];
}

export type Answer = Accepted | Conflict;

/** True when the answer says the entry's completion was accepted (publish, then ack). */
export function isDone(answer: Answer): boolean {
  return answer.kind === "fenced" && answer.state === "done";
}

/** An HTTP answer as the protocol reads it: accepted, fenced, refused; or a failure to throw. */
export function classify(
  status: number,
  body: unknown,
  headers: { get(name: string): string | null } = { get: () => null },
): Answer | ConductorUnavailable | ConductorRejected {
  const data = (typeof body === "object" && body !== null ? body : {}) as Record<string, unknown>;
  const detail = typeof data["detail"] === "string" ? data["detail"] : JSON.stringify(data["detail"] ?? "");
  if (status >= 200 && status < 300) {
    return {
      kind: "accepted",
      attempt: typeof data["attempt"] === "number" ? data["attempt"] : undefined,
      state: typeof data["state"] === "string" ? data["state"] : undefined,
      data,
    };
  }
  if (status === 409) {
    const outputs: StagedOutput[] = [];
    for (const item of Array.isArray(data["outputs"]) ? data["outputs"] : []) {
      const o = item as Record<string, unknown>;
      if (typeof o["staged"] === "string" && typeof o["path"] === "string") {
        outputs.push({ staged: o["staged"], path: o["path"] });
      }
    }
    return {
      // Only `fenced:` means the attempt is not current; anything else leaves the entry alone.
      kind: detail.startsWith("fenced:") ? "fenced" : "refused",
      attempt: typeof data["attempt"] === "number" ? data["attempt"] : 0,
      state: typeof data["state"] === "string" ? data["state"] : "",
      detail,
      outputs,
    };
  }
  const problem = `${status} ${detail.slice(0, 200)}`.trim();
  if (RETRYABLE.has(status)) return new ConductorUnavailable(problem, retryAfter(headers.get("retry-after")));
  return new ConductorRejected(problem);
}

export interface WorkRef {
  stream: string;
  entryId: string;
  issueId: string | undefined;
}

export interface ClientOptions {
  baseUrl: string;
  agentId: string;
  consumer: string;
  group: string;
  token?: string | undefined;
  tokenFile?: TokenFile | undefined;
  timeoutMs?: number;
}

/** One agent's (agentId + consumer + group) view of the events API. */
export class ConductorClient {
  private readonly url: string;

  constructor(private readonly options: ClientOptions) {
    this.url = `${options.baseUrl.replace(/\/+$/, "")}/api/events`;
  }

  /** One try: the next heartbeat is the retry. */
  async heartbeat(degraded = false, reasons: readonly string[] = []): Promise<void> {
    const body: Record<string, unknown> = { type: "HEARTBEAT", consumer: this.options.consumer };
    body["degraded"] = degraded;
    body["degradedReasons"] = degraded ? [...reasons] : [];
    await this.post(body, { tries: 1 });
  }

  workStarted(ref: WorkRef): Promise<Answer> {
    return this.post(this.work("WORK_STARTED", ref), { tries: 3 });
  }

  workProgress(ref: WorkRef, attempt: number): Promise<Answer> {
    return this.post(this.work("WORK_PROGRESS", ref, { attempt }), { tries: 2 });
  }

  async workFailed(ref: WorkRef, attempt: number, error: string): Promise<Answer> {
    return this.post(this.work("WORK_FAILED", ref, { attempt, error: error.slice(0, 4096) }), { tries: 3 });
  }

  /** Retries until the conductor answers, or until `until` is aborted (then one last try). */
  workCompleted(ref: WorkRef, attempt: number, outputs: readonly StagedOutput[], until?: AbortSignal): Promise<Answer> {
    const extra: Record<string, unknown> = { attempt };
    if (outputs.length > 0) extra["outputs"] = outputs.map((o) => ({ staged: o.staged, path: o.path }));
    return this.post(this.work("WORK_COMPLETED", ref, extra), { until });
  }

  /** The accepted attempt's outputs are renamed (or, `missing`, found nowhere). Retries like
   * WORK_COMPLETED: until it is recorded the entry is not acked. */
  workPublished(ref: WorkRef, attempt: number, missing: readonly string[], until?: AbortSignal): Promise<Answer> {
    const extra: Record<string, unknown> = { attempt };
    if (missing.length > 0) extra["missing"] = [...missing];
    return this.post(this.work("WORK_PUBLISHED", ref, extra), { until });
  }

  /** Ask the conductor to dead-letter an entry this consumer holds. */
  deadLetter(ref: WorkRef, reason: string): Promise<Answer> {
    return this.post(this.work("DEAD_LETTER", ref, { reason }), { tries: 3 });
  }

  private work(type: string, ref: WorkRef, extra: Record<string, unknown> = {}): Record<string, unknown> {
    const body: Record<string, unknown> = {
      type,
      consumer: this.options.consumer,
      stream: ref.stream,
      group: this.options.group,
      entryId: ref.entryId,
      ...extra,
    };
    if (ref.issueId) body["issueId"] = ref.issueId;
    return body;
  }

  /** POST one event; a 2xx or 409 answer is returned, anything else thrown. `tries` undefined
   * retries without limit until `until` is aborted, then makes one last try. */
  private post(
    event: Record<string, unknown>,
    opts: { tries?: number; until?: AbortSignal | undefined },
  ): Promise<Answer> {
    const body = JSON.stringify({ ...event, agentId: this.options.agentId });
    return retry(() => this.postOnce(body), {
      retryOn: (error) => error instanceof ConductorUnavailable,
      tries: opts.tries,
      stop: opts.until,
      delay: (error) => (error instanceof ConductorUnavailable ? error.retryAfterMs : undefined),
      log: (error, ms) => log.info(`${String(event["type"])} not delivered (${String(error)}); retrying in ${(ms / 1000).toFixed(1)}s`),
    });
  }

  private async postOnce(body: string): Promise<Answer> {
    let response = await this.send(body);
    if (response.status === 401 && this.options.tokenFile?.refresh()) {
      // Rotated since the last stat (or a refusal a newer token answers): once more.
      response = await this.send(body);
    }
    let data: unknown = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    const answer = classify(response.status, data, response.headers);
    if (answer instanceof Error) throw answer;
    return answer;
  }

  private async send(body: string): Promise<Response> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    const token = this.options.tokenFile?.current() ?? this.options.token;
    if (token) headers["authorization"] = `Bearer ${token}`;
    try {
      return await fetch(this.url, {
        method: "POST",
        headers,
        body,
        signal: AbortSignal.timeout(this.options.timeoutMs ?? REQUEST_TIMEOUT_MS),
      });
    } catch (error) {
      const cause = (error as { cause?: unknown }).cause;
      const why = cause instanceof Error ? `${cause.name}: ${cause.message}` : `${(error as Error).name}: ${(error as Error).message}`;
      throw new ConductorUnavailable(why);
    }
  }
}
