// Reading one consumer group as one consumer: join it, read pending and new entries one at a
// time, page through its pending ids without reading them, and look up an entry's delivery count.
// Redis I/O only; what to do with an entry is the runtime's business.
import { log } from "./log.js";
import type { AnyRedis } from "./redis.js";

/** (entry id, fields); an entry deleted or trimmed from the stream comes with no fields. */
export type Read = [string, Record<string, string>];

type RawEntry = [string, string[] | null];
type RawReply = Array<[string, RawEntry[]]> | null;

export function entries(reply: unknown): Read[] {
  const reads: Read[] = [];
  for (const [, batch] of (reply as RawReply) ?? []) {
    for (const [id, flat] of batch) {
      const fields: Record<string, string> = {};
      for (let i = 0; flat && i + 1 < flat.length; i += 2) fields[flat[i] as string] = flat[i + 1] as string;
      reads.push([id, fields]);
    }
  }
  return reads;
}

/** The greatest stream id below `entryId`: reading after it starts at `entryId`. */
export function before(entryId: string): string {
  const [ms = "0", seq = "0"] = entryId.split("-");
  if (BigInt(seq) > 0n) return `${ms}-${BigInt(seq) - 1n}`;
  return BigInt(ms) > 0n ? `${BigInt(ms) - 1n}-18446744073709551615` : "0";
}

export function isNoGroup(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith("NOGROUP");
}

export class GroupReader {
  constructor(
    private readonly redis: AnyRedis,
    /** A connection of its own for blocking reads, so they never hold up the lease's renewal. */
    private readonly blocking: AnyRedis,
    readonly stream: string,
    readonly group: string,
    readonly consumer: string,
  ) {}

  /** Create the group lazily (BUSYGROUP is fine), then register this consumer, so it is a
   * reclaim target before it has read anything. */
  async join(startId: string): Promise<void> {
    try {
      await this.redis.xgroup("CREATE", this.stream, this.group, startId, "MKSTREAM");
      log.info(`Created group ${this.group} on ${this.stream} from ${startId}`);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.includes("BUSYGROUP")) throw error;
    }
    await this.redis.xgroup("CREATECONSUMER", this.stream, this.group, this.consumer);
  }

  /** The next of this consumer's own pending entries after `cursor` (where reclaimed ones land).
   * One at a time: a read counts as a delivery. */
  async pendingAfter(cursor: string): Promise<Read[]> {
    const reply = await this.redis.xreadgroup(
      "GROUP", this.group, this.consumer, "COUNT", 1, "STREAMS", this.stream, cursor,
    );
    return entries(reply);
  }

  async fresh(blockMs: number): Promise<Read[]> {
    const reply = await this.blocking.xreadgroup(
      "GROUP", this.group, this.consumer, "COUNT", 1, "BLOCK", blockMs, "STREAMS", this.stream, ">",
    );
    return entries(reply);
  }

  /** Ids of this consumer's pending entries after `after` ('-' for all), without reading them:
   * XPENDING does not count as a delivery, where XREADGROUP does. */
  async pendingIds(after: string, count: number): Promise<string[]> {
    const start = after === "-" || after === "0" ? "-" : `(${after}`;
    const rows = (await this.redis.xpending(this.stream, this.group, start, "+", count, this.consumer)) as Array<
      [string, string, number, number]
    >;
    return rows.map((row) => row[0]);
  }

  /** A cursor just before this consumer's next pending entry after `cursor` that is not in
   * `skip`; '' when there is none. Reads ids only, so nothing skipped is delivered. */
  async cursorSkipping(skip: ReadonlySet<string>, cursor: string): Promise<string> {
    let after = cursor;
    for (;;) {
      const ids = await this.pendingIds(after, 100);
      for (const id of ids) if (!skip.has(id)) return before(id);
      if (ids.length < 100) return "";
      after = ids[ids.length - 1] as string;
    }
  }

  async allPendingIds(): Promise<Set<string>> {
    const mine = new Set<string>();
    let after = "-";
    for (;;) {
      const ids = await this.pendingIds(after, 1000);
      for (const id of ids) mine.add(id);
      if (ids.length < 1000) return mine;
      after = ids[ids.length - 1] as string;
    }
  }

  /** The entry's delivery count, undefined when it is no longer pending for this consumer. */
  async deliveries(entryId: string): Promise<number | undefined> {
    const rows = (await this.redis.xpending(this.stream, this.group, entryId, entryId, 1, this.consumer)) as Array<
      [string, string, number, number]
    >;
    const row = rows[0];
    return row === undefined ? undefined : Number(row[3]);
  }

  async ack(entryId: string): Promise<void> {
    await this.redis.xack(this.stream, this.group, entryId);
  }
}
