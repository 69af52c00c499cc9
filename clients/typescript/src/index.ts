// @rig-conductor/agent: the agent runtime for Node. `runAgent(handler, options)` reads one
// consumer group of one stream and runs `handler(entry)` per entry, as docs/protocol.md
// (protocol version 2) says an agent must.
import { MissingPermission, missingPermission, overPrivileged, overPrivilegedWarning } from "./access.js";
import { ConductorClient } from "./conductor.js";
import type { Handler } from "./entry.js";
import { Agent, SHUTDOWN_GRACE_MS } from "./runtime.js";
import { type AnyRedis, connect, connectNow, watchErrors } from "./redis.js";
import { log, setLogFormat } from "./log.js";
import { consumerName, loadSettings, type Settings } from "./settings.js";
import { TokenFile } from "./tokenFile.js";

export type { Entry, Handler } from "./entry.js";
export { AgentError, ConsumerInUse, Degraded, Fenced, LeaseLost, SettingsError } from "./errors.js";
export { MissingPermission } from "./access.js";
export type { LogFormat } from "./log.js";
export type { Settings } from "./settings.js";
export { loadSettings } from "./settings.js";
export { TokenFileError } from "./tokenFile.js";
export { RedisUnavailable } from "./redis.js";

/** The agent protocol version this runtime speaks. */
export const PROTOCOL_VERSION = 2;

export interface RunAgentOptions {
  /** The agent id sent with every event; the consumer name must resolve to it. */
  agentId: string;
  /** The consumer group to read in. */
  group: string;
  /** The stream to read (default: RIG_DISPATCH_STREAM, else `rig:dispatch`). */
  stream?: string;
  /** Where a newly created group starts: `0` (default), `$` or an entry id. */
  startId?: string;
  /** The consumer name (default: CONSUMER_ID, else HOSTNAME, else `<agentId>-<uuid>`). */
  consumer?: string;
  /** Aborting it stops the agent: it reads nothing more, finishes the entry in hand (or gives it
   * up after `graceMs`), releases its consumer name and resolves. */
  signal?: AbortSignal;
  /** Aborting it gives the entry in hand up at once (left pending); a second SIGTERM. */
  abandonSignal?: AbortSignal;
  /** How long a stop waits for the entry in hand (default 30 s). */
  graceMs?: number;
  /** The settings (default: read from the RIG_* environment, `loadSettings()`). */
  settings?: Settings;
}

/** Run an agent until `options.signal` is aborted. Rejects with ConsumerInUse when another live
 * process holds the consumer name, LeaseLost when one takes it over, SettingsError for a bad
 * RIG_* value, RedisUnavailable when Redis cannot be reached at start, MissingPermission when
 * its Redis user may not run a command an agent needs. Logs to stderr in `settings.logFormat`
 * (RIG_LOG_FORMAT). */
export async function runAgent(handler: Handler, options: RunAgentOptions): Promise<void> {
  const settings = options.settings ?? loadSettings();
  if (settings.logFormat) setLogFormat(settings.logFormat);
  const consumer = options.consumer ?? consumerName(options.agentId);
  const stream = options.stream ?? settings.dispatchStream;
  const stop = new AbortController();
  const abandon = new AbortController();
  const link = (from: AbortSignal | undefined, to: AbortController): (() => void) => {
    if (from === undefined) return () => undefined;
    const forward = (): void => to.abort();
    if (from.aborted) to.abort();
    from.addEventListener("abort", forward, { once: true });
    return () => from.removeEventListener("abort", forward);
  };
  const unlinkStop = link(options.signal, stop);
  const unlinkAbandon = link(options.abandonSignal, abandon);
  const tokenFile = settings.apiTokenFile ? new TokenFile(settings.apiTokenFile) : undefined;
  const redis = connect(settings);
  const blocking = redis.duplicate();
  const warn = (message: string): void => log.warn(`Redis connection error: ${message}`);
  const lastError = watchErrors(redis, warn);
  const lastBlockingError = watchErrors(blocking, () => undefined); // one voice is enough
  try {
    await connectNow(redis, lastError);
    await checkRights(redis, stream, options.agentId);
    await connectNow(blocking, lastBlockingError);
    const conductor = new ConductorClient({
      baseUrl: settings.conductorUrl,
      agentId: options.agentId,
      consumer,
      group: options.group,
      token: settings.apiToken,
      tokenFile,
    });
    const agent = new Agent(handler, {
      settings,
      agentId: options.agentId,
      group: options.group,
      stream,
      consumer,
      redis,
      blocking,
      conductor,
      startId: options.startId ?? "0",
      stop,
      abandon,
      graceMs: options.graceMs ?? SHUTDOWN_GRACE_MS,
    });
    await agent.run();
  } finally {
    unlinkStop();
    unlinkAbandon();
    blocking.disconnect();
    redis.disconnect();
  }
}

/** Refuse to start (MissingPermission) when the agent's Redis user may not run every command an
 * agent needs on `stream` and on its own keys; warn when it may do more (the conductor's rights,
 * one user shared by all): it keeps working. */
async function checkRights(redis: AnyRedis, stream: string, agentId: string): Promise<void> {
  const refused = await missingPermission(redis, stream, agentId);
  if (refused !== undefined) throw new MissingPermission(refused);
  if (await overPrivileged(redis, stream)) log.warn(overPrivilegedWarning(stream, agentId));
}
