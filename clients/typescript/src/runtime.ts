// The runtime's loop: read a consumer group, run a handler per entry, report (docs/protocol.md).
//
// One entry at a time. Per entry: WORK_STARTED (the attempt), the handler (`handlers`), then
// WORK_COMPLETED and the staged files' rename and XACK, or the dead-letter path (`settle`). A
// handler that throws `Degraded` pauses all reading and flags the heartbeats; one past
// RIG_ENTRY_DEADLINE_MS without progress is abandoned, and its entry left for the reaper. The
// handler's errors never stop the runtime; it does not decide reclaims (the reaper does).
import { type Answer, ConductorClient, ConductorRejected, ConductorUnavailable, type WorkRef, isDone } from "./conductor.js";
import { makeEntry, type Handler, ProgressReporter, triage } from "./entry.js";
import { LeaseLost } from "./errors.js";
import { callHandler, type HandlerResult } from "./handlers.js";
import { ConsumerLease, leaseKey } from "./lease.js";
import { log } from "./log.js";
import { GroupReader, isNoGroup } from "./reader.js";
import type { AnyRedis } from "./redis.js";
import { backoff, pause, retry } from "./retry.js";
import { leaseTtlMs, type Settings } from "./settings.js";
import { REOPENED, Settler } from "./settle.js";
import * as staging from "./staging.js";

export const BLOCK_MS = 1_000; // short, so a stop and the periodic pending-list read stay prompt
export const SHUTDOWN_GRACE_MS = 30_000;
const ABANDONED_MEMORY = 1_000; // entries given up at their deadline, never run again here

export interface AgentOptions {
  settings: Settings;
  agentId: string;
  group: string;
  stream: string;
  consumer: string;
  redis: AnyRedis;
  blocking: AnyRedis;
  conductor: ConductorClient;
  startId: string;
  stop: AbortController;
  abandon: AbortController;
  graceMs: number;
  blockMs?: number;
}

type Outcome = [string, number | undefined];

export class Agent {
  private readonly reader: GroupReader;
  private readonly lease: ConsumerLease;
  private readonly settler: Settler;
  private readonly stop: AbortSignal;
  private readonly closing = new AbortController(); // the heartbeat loop's own end
  private leaseLost = false;
  private joined = false;
  private nextScan = 0; // performance.now() time our own pending list is next read
  private conductorDown = false;
  private current: string | undefined;
  private degraded: string[] = [];
  private pausedUntil = 0;
  private readonly abandoned = new Set<string>(); // given up at their deadline: the reaper moves them

  constructor(
    private readonly handler: Handler,
    private readonly o: AgentOptions,
  ) {
    this.stop = o.stop.signal;
    this.reader = new GroupReader(o.redis, o.blocking, o.stream, o.group, o.consumer);
    this.lease = new ConsumerLease(o.redis, leaseKey(o.agentId, o.stream, o.group, o.consumer), leaseTtlMs(o.settings));
    this.settler = new Settler(this.reader, o.conductor, this.stop, () => (this.conductorDown = true));
  }

  /** Until `stop` is aborted: then finish the current entry (bounded by the grace period, or
   * `abandon`) and resolve. Rejects with ConsumerInUse or LeaseLost. */
  async run(): Promise<void> {
    if (!(await this.lease.acquire(this.stop))) return;
    try {
      await this.reader.join(this.o.startId);
      this.joined = true;
      log.info(`Agent ${this.o.agentId} reads ${this.o.stream} as consumer ${this.o.consumer} of group ${this.o.group}`);
      if (!(await this.introduce())) return;
      const beat = this.heartbeats();
      const work = this.consume();
      try {
        await this.untilStopped(work);
      } finally {
        this.closing.abort();
        await beat;
      }
    } finally {
      await this.lease.release();
    }
    if (this.leaseLost) {
      throw new LeaseLost(`consumer name ${this.o.consumer} was taken over by another process (lease ${this.lease.key}); stopped`);
    }
    log.info(`Agent ${this.o.agentId} stopped`);
  }

  private async untilStopped(work: Promise<void>): Promise<void> {
    let failure: unknown;
    const ended = new AbortController();
    void work.then(
      () => ended.abort(),
      (error: unknown) => {
        failure = error;
        ended.abort();
      },
    );
    while (!this.stop.aborted && !ended.signal.aborted) await pause(Infinity, [this.stop, ended.signal]);
    if (!ended.signal.aborted) {
      if (this.current !== undefined) {
        log.info(`Stopping: finishing entry ${this.current} (up to ${Math.round(this.o.graceMs / 1000)}s)`);
      }
      await pause(this.o.graceMs, [ended.signal, this.o.abandon.signal]);
    }
    if (!ended.signal.aborted) {
      log.warn(`Abandoned entry ${this.current ?? "-"}: it stays pending`);
      this.o.abandon.abort();
      // The loop returns once the handler call gives up; a report in flight gets a moment.
      await pause(5_000, ended.signal);
      return;
    }
    if (failure !== undefined) throw failure; // a crash of the loop itself surfaces here
  }

  /** Renew the consumer-name lease and heartbeat, every RIG_HEARTBEAT_INTERVAL_S. */
  private async heartbeats(): Promise<void> {
    const intervalMs = this.o.settings.heartbeatIntervalS * 1000;
    while (!this.closing.signal.aborted) {
      try {
        if (!(await this.lease.renew())) {
          log.error(`Consumer name ${this.o.consumer} is held by another process now; stopping`);
          this.leaseLost = true;
          this.o.stop.abort();
          return;
        }
      } catch (error) {
        log.warn(`Could not renew the consumer-name lease: ${(error as Error).message}`);
      }
      // Bounded, so a hanging conductor never delays the lease past its lifetime.
      const bound = new AbortController();
      const beat = this.beat().then(
        () => undefined,
        (error: unknown) => `Heartbeat failed: ${(error as Error).message}`,
      );
      const failed = await Promise.race([beat, pause(intervalMs, bound.signal).then(() => "Heartbeat failed: no answer in time")]);
      bound.abort();
      if (failed !== undefined) log.warn(failed);
      await pause(intervalMs, this.closing.signal);
    }
  }

  private beat(): Promise<void> {
    return this.o.conductor.heartbeat(this.degraded.length > 0, this.degraded);
  }

  /** Heartbeat by name before reading anything; false if stopped first. A consumer holding
   * entries must be one the conductor has heard of, or it could never be judged down. */
  private async introduce(): Promise<boolean> {
    return retry(
      async () => {
        if (this.stop.aborted) return false;
        await this.o.conductor.heartbeat();
        return true;
      },
      {
        retryOn: (e) => e instanceof ConductorUnavailable || e instanceof ConductorRejected,
        stop: this.stop,
        log: (e, ms) =>
          log.warn(`First heartbeat failed (${(e as Error).message}): reading nothing until the conductor accepts one; retrying in ${(ms / 1000).toFixed(1)}s`),
      },
    ).catch((error: unknown) => {
      if (this.stop.aborted) return false;
      throw error;
    });
  }

  /** Own pending list at start and every RIG_SCAN_INTERVAL_S; new entries in between. A Redis
   * error is retried with backoff; a stop ends the loop. */
  private async consume(): Promise<void> {
    while (!this.stop.aborted) {
      try {
        await retry(() => this.readStep(), {
          retryOn: () => true,
          stop: this.stop,
          log: (error, ms) => this.readFailed(error, ms),
        });
      } catch {
        // a failure begun after the stop: nothing is left to read then
      }
    }
  }

  private async readStep(): Promise<void> {
    const now = performance.now();
    if (this.conductorDown) {
      await this.awaitConductor();
      this.nextScan = 0; // the entries left pending meanwhile come first
    } else if (this.pausedUntil > now) {
      // Self-fenced: read nothing at all, not even our own pending entries.
      await pause(this.pausedUntil - now, this.stop);
      this.nextScan = 0;
    } else {
      if (!this.joined) {
        // The group vanished (NOGROUP): again from id 0, whatever --start-id said, so nothing
        // the conductor appends again after Redis lost its data is skipped.
        await this.reader.join("0");
        this.joined = true;
      }
      if (now >= this.nextScan) {
        await this.readPending();
        this.nextScan = performance.now() + this.o.settings.scanIntervalS * 1000;
      } else {
        const untilScan = Math.floor(this.nextScan - now);
        for (const [id, fields] of await this.reader.fresh(Math.max(1, Math.min(this.o.blockMs ?? BLOCK_MS, untilScan)))) {
          await this.process(id, fields);
        }
      }
    }
  }

  private readFailed(error: unknown, ms: number): void {
    if (isNoGroup(error)) {
      this.joined = false;
      log.warn(
        `Group ${this.o.group} of ${this.o.stream} is gone (Redis lost its data: restarted empty, flushed, ` +
          `or failed over to an empty replica); creating it again from 0 in ${(ms / 1000).toFixed(1)}s`,
      );
    } else {
      log.warn(`Redis error while reading: ${(error as Error).message}; retrying in ${(ms / 1000).toFixed(1)}s`);
    }
  }

  /** This consumer's pending entries, reclaimed ones included, one at a time. Entries abandoned
   * at their deadline are stepped over without a read (a read counts as a delivery), and
   * forgotten once the reaper has moved them away. */
  private async readPending(): Promise<void> {
    if (this.abandoned.size > 0) {
      const mine = await this.reader.allPendingIds();
      for (const id of this.abandoned) if (!mine.has(id)) this.abandoned.delete(id);
    }
    let cursor = "0";
    while (!(this.stop.aborted || this.conductorDown || this.pausedUntil > performance.now())) {
      if (this.abandoned.size > 0) {
        cursor = await this.reader.cursorSkipping(this.abandoned, cursor);
        if (cursor === "") return;
      }
      const batch = await this.reader.pendingAfter(cursor);
      if (batch.length === 0) return;
      for (const [id, fields] of batch) {
        await this.process(id, fields);
        cursor = id;
      }
    }
  }

  /** While the conductor does not answer, read nothing: every read counts as a delivery and
   * would wear entries out towards the dead-letter stream without running them. */
  private async awaitConductor(): Promise<void> {
    if (this.stop.aborted) return;
    await pause(backoff(1), this.stop);
    const answers = await retry(
      async () => {
        try {
          await this.o.conductor.heartbeat();
        } catch (error) {
          if (error instanceof ConductorUnavailable && this.stop.aborted) return false;
          if (!(error instanceof ConductorRejected)) throw error; // it answers, if only to refuse
        }
        return true;
      },
      {
        retryOn: (e) => e instanceof ConductorUnavailable,
        stop: this.stop,
        delay: (_e, n) => backoff(n + 1),
      },
    ).catch(() => false);
    if (answers) {
      this.conductorDown = false;
      log.info("The conductor answers again; resuming");
    }
  }

  private async process(entryId: string, fields: Record<string, string>): Promise<void> {
    if (this.stop.aborted) {
      log.info(`Entry ${entryId} left pending: shutting down`);
      return;
    }
    if (this.abandoned.has(entryId)) return; // given up at its deadline: the reaper moves it
    this.current = entryId;
    const ref: WorkRef = { stream: this.o.stream, entryId, issueId: fields["issueId"] };
    let outcome: Outcome;
    try {
      outcome = await this.handle(ref, fields);
    } catch (error) {
      // A bug or a Redis error here must not stop the loop; the entry stays pending.
      outcome = [`left pending: ${(error as Error).name}: ${(error as Error).message}`, undefined];
    } finally {
      this.current = undefined;
    }
    const [what, attempt] = outcome;
    const { stream, group, consumer } = this.o;
    log.info(`Entry ${entryId} (issue ${ref.issueId || "-"}, attempt ${attempt ?? "-"}): ${what}`, {
      entryId,
      issueId: ref.issueId ?? null,
      attempt: attempt ?? null,
      outcome: what,
      stream,
      group,
      consumer,
    });
  }

  private async handle(ref: WorkRef, fields: Record<string, string>): Promise<Outcome> {
    const deliveries = await this.reader.deliveries(ref.entryId);
    if (deliveries === undefined) return ["skipped: no longer pending for this consumer", undefined];
    const verdict = triage(fields, deliveries, this.o.settings.maxDeliveries);
    if (verdict !== "handle") {
      const [outcome, attempt] = await this.settler.deadLetter(ref, verdict);
      if (!outcome.includes(REOPENED)) return [outcome, attempt];
      // The accepted outputs were lost: the completion is void, and this consumer holds the
      // attempt reserved to run it again, however often it was delivered.
      return this.runEntry(ref, fields, outcome);
    }
    return this.runEntry(ref, fields, "");
  }

  private async runEntry(ref: WorkRef, fields: Record<string, string>, reopened: string): Promise<Outcome> {
    const started = await this.start(ref, reopened);
    if (Array.isArray(started)) return started;
    const attempt = started;
    const area = new staging.Staging(ref.entryId, attempt);
    const progress = new ProgressReporter(() => this.sendProgress(ref, attempt));
    const giveUp = new AbortController();
    const { stream, group, consumer } = this.o;
    const entry = makeEntry({ id: ref.entryId, stream, group, consumer, attempt, fields }, area, progress, giveUp.signal);
    const result = await callHandler(this.handler, entry, {
      progress,
      deadlineMs: this.o.settings.entryDeadlineMs,
      abandon: this.o.abandon.signal,
      giveUp,
    });
    const files = area.close();
    if (result.kind === "ok") {
      if (this.degraded.length > 0) {
        log.info("Handler succeeded again: no longer degraded");
        this.degraded = [];
      }
      return [await this.settler.complete(ref, attempt, files), attempt];
    }
    staging.discard(files);
    if (result.kind === "stopped") return ["abandoned at stop: left pending", attempt];
    const error = this.afterFailure(ref.entryId, result);
    try {
      await this.o.conductor.workFailed(ref, attempt, error);
    } catch (e) {
      log.warn(`WORK_FAILED for ${ref.entryId} not recorded: ${(e as Error).message}`);
    }
    if (result.kind === "degraded") {
      await this.beat().catch(() => undefined); // the conductor's grace period starts now
    }
    return [`failed, left pending: ${error.split("\n")[0] ?? ""}`, attempt];
  }

  /** WORK_STARTED: the attempt to run, or what became of the entry when there is none (a done
   * entry is published and acked here; one whose outputs were lost runs again). */
  private async start(ref: WorkRef, reopened: string): Promise<number | Outcome> {
    let answer: Answer;
    try {
      answer = await this.o.conductor.workStarted(ref);
    } catch (error) {
      if (error instanceof ConductorUnavailable) {
        this.conductorDown = true;
        return [`left pending: conductor unreachable for WORK_STARTED (${error.message})`, undefined];
      }
      if (error instanceof ConductorRejected) return [`left pending: WORK_STARTED rejected (${error.message})`, undefined];
      throw error;
    }
    if (answer.kind !== "accepted") {
      if (isDone(answer) && !reopened) {
        const outcome = await this.settler.recover(ref, answer);
        if (outcome.includes(REOPENED)) return this.start(ref, outcome);
        return [outcome, answer.attempt];
      }
      return [`${answer.detail} (attempt ${answer.attempt}, ${answer.state}); not acked`, undefined];
    }
    if (reopened) log.warn(`Entry ${ref.entryId} runs again: ${reopened}`);
    if (answer.attempt === undefined) throw new Error("WORK_STARTED was accepted without an attempt");
    return answer.attempt;
  }

  /** Remember what a failed call means for what comes next; the error text to report. */
  private afterFailure(entryId: string, result: Exclude<HandlerResult, { kind: "ok" | "stopped" }>): string {
    if (result.kind === "abandoned") {
      this.abandoned.add(entryId);
      if (this.abandoned.size > ABANDONED_MEMORY) {
        const oldest = this.abandoned.values().next();
        if (!oldest.done) this.abandoned.delete(oldest.value);
      }
    }
    if (result.kind !== "degraded") return result.error;
    const { degraded } = result;
    const ms = degraded.pauseMs();
    if (!this.degraded.includes(degraded.reason)) this.degraded.push(degraded.reason);
    this.pausedUntil = performance.now() + ms;
    log.warn(`Degraded (${degraded.reason}): reading nothing for ${Math.round(ms / 1000)}s; the entry stays pending`);
    return `degraded: ${degraded.reason}`;
  }

  private async sendProgress(ref: WorkRef, attempt: number): Promise<boolean> {
    try {
      return (await this.o.conductor.workProgress(ref, attempt)).kind === "accepted";
    } catch (error) {
      // Not recorded: the local deadline still counts it, the reaper may not.
      log.warn(`WORK_PROGRESS for ${ref.entryId} not recorded: ${(error as Error).message}`);
      return true;
    }
  }
}
