// The agent's settings, read from RIG_* environment variables: the same names, defaults and
// checks as the Python runtime's (`rig_conductor.agent.settings`). Pure: takes the environment.
import { existsSync, statSync } from "node:fs";

import { SettingsError } from "./errors.js";
import { LOG_FORMATS, type LogFormat } from "./log.js";
import { readToken, TokenFileError } from "./tokenFile.js";

export type RedisMode = "standalone" | "cluster" | "sentinel";

export interface Settings {
  redisMode: RedisMode;
  redisUrl: string;
  redisSentinels: Array<{ host: string; port: number }>;
  redisSentinelMaster: string;
  redisSentinelPassword: string | undefined;
  redisTlsCaFile: string | undefined;
  redisTlsCertFile: string | undefined;
  redisTlsKeyFile: string | undefined;
  conductorUrl: string;
  apiToken: string | undefined;
  apiTokenFile: string | undefined;
  heartbeatIntervalS: number;
  scanIntervalS: number;
  maxDeliveries: number;
  entryDeadlineMs: number;
  dispatchStream: string;
  /** `text` or `json` (one object per line; `message` is the same sentence as in text). */
  logFormat: LogFormat;
}

type Env = Record<string, string | undefined>;

/** `RIG_X=` (empty, or spaces only) means what leaving RIG_X out means: unset. */
function value(env: Env, name: string): string | undefined {
  const raw = env[name];
  return raw === undefined || raw.trim() === "" ? undefined : raw;
}

function bad(name: string, problem: string, got?: string): never {
  throw new SettingsError(
    got === undefined ? `${name}: ${problem}` : `${name}: ${problem} (got ${JSON.stringify(got)})`,
  );
}

function number(env: Env, name: string, fallback: number, check: (n: number) => string | null): number {
  const raw = value(env, name);
  if (raw === undefined) return fallback;
  const parsed = Number(raw.trim());
  if (!Number.isFinite(parsed)) bad(name, "must be a number", raw);
  const problem = check(parsed);
  if (problem !== null) bad(name, problem, raw);
  return parsed;
}

function integer(env: Env, name: string, fallback: number, min: number): number {
  const raw = value(env, name);
  if (raw === undefined) return fallback;
  if (!/^\s*[+-]?\d+\s*$/.test(raw)) bad(name, "must be a whole number", raw);
  const parsed = Number.parseInt(raw, 10);
  if (parsed < min) bad(name, `must be at least ${min}`, raw);
  return parsed;
}

function file(env: Env, name: string): string | undefined {
  const path = value(env, name);
  if (path === undefined) return undefined;
  if (!existsSync(path) || !statSync(path).isFile()) bad(name, `no such file: ${path}`);
  return path;
}

/** The database number a redis:// URL names (its path, else `?db=`). */
export function urlDb(url: string): number {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error("is not a Redis URL");
  }
  const path = parsed.pathname.replace(/^\//, "");
  const db = path !== "" ? path : (parsed.searchParams.get("db") ?? "0");
  if (!/^\d+$/.test(db)) throw new Error(`has a database that is not a number: ${db}`);
  return Number.parseInt(db, 10);
}

export function parseSentinels(raw: string): Array<{ host: string; port: number }> {
  const sentinels: Array<{ host: string; port: number }> = [];
  for (const part of raw.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    const at = part.lastIndexOf(":");
    const host = at > 0 ? part.slice(0, at).replace(/^\[|\]$/g, "") : "";
    const port = at > 0 ? part.slice(at + 1) : "";
    if (host === "" || !/^\d+$/.test(port) || Number(port) <= 0 || Number(port) >= 65536) {
      throw new Error("each sentinel must be host:port");
    }
    sentinels.push({ host, port: Number(port) });
  }
  return sentinels;
}

function conductorUrl(env: Env): string {
  const raw = value(env, "RIG_CONDUCTOR_URL") ?? "http://localhost:8080";
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return bad("RIG_CONDUCTOR_URL", "is not a URL", raw);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.hostname === "") {
    bad("RIG_CONDUCTOR_URL", "must be an http:// or https:// URL with a host", raw);
  }
  return raw.replace(/\/+$/, "");
}

/** Read the environment; throws SettingsError with one line naming the variable. Secrets (the
 * Redis URL, the tokens, the sentinel password) are never echoed. */
export function loadSettings(env: Env = process.env): Settings {
  const mode = (value(env, "RIG_REDIS_MODE") ?? "standalone").trim().toLowerCase();
  if (mode !== "standalone" && mode !== "cluster" && mode !== "sentinel") {
    bad("RIG_REDIS_MODE", "must be standalone, cluster or sentinel", env["RIG_REDIS_MODE"]);
  }
  const redisUrl = value(env, "RIG_REDIS_URL") ?? "redis://localhost:6379/0";
  if (!/^(redis|rediss|unix):\/\//.test(redisUrl)) {
    bad("RIG_REDIS_URL", "must be a redis://, rediss:// or unix:// URL");
  }
  if (mode === "cluster") {
    if (redisUrl.startsWith("unix://")) {
      bad("RIG_REDIS_URL", "cluster mode needs a redis:// or rediss:// URL, not a socket");
    }
    let db: number;
    try {
      db = urlDb(redisUrl);
    } catch (error) {
      return bad("RIG_REDIS_URL", (error as Error).message);
    }
    if (db !== 0) bad("RIG_REDIS_URL", "cluster mode has database 0 only; remove the /<db> from the URL");
  }
  let redisSentinels: Array<{ host: string; port: number }> = [];
  const sentinels = value(env, "RIG_REDIS_SENTINELS");
  if (sentinels !== undefined) {
    try {
      redisSentinels = parseSentinels(sentinels);
    } catch (error) {
      bad("RIG_REDIS_SENTINELS", (error as Error).message, sentinels);
    }
  }
  if (mode === "sentinel" && redisSentinels.length === 0) {
    bad("RIG_REDIS_SENTINELS", "sentinel mode needs at least one host:port sentinel");
  }
  const redisTlsCaFile = file(env, "RIG_REDIS_TLS_CA_FILE");
  const redisTlsCertFile = file(env, "RIG_REDIS_TLS_CERT_FILE");
  const redisTlsKeyFile = file(env, "RIG_REDIS_TLS_KEY_FILE");
  if ((redisTlsCertFile === undefined) !== (redisTlsKeyFile === undefined)) {
    bad(
      "RIG_REDIS_TLS_KEY_FILE",
      "the client certificate needs both RIG_REDIS_TLS_CERT_FILE and RIG_REDIS_TLS_KEY_FILE",
    );
  }
  const apiToken = value(env, "RIG_API_TOKEN")?.trim();
  const apiTokenFile = value(env, "RIG_API_TOKEN_FILE");
  if (apiTokenFile !== undefined) {
    if (apiToken !== undefined) {
      bad("RIG_API_TOKEN_FILE", "RIG_API_TOKEN and RIG_API_TOKEN_FILE are both set; set one of them");
    }
    try {
      readToken(apiTokenFile);
    } catch (error) {
      if (error instanceof TokenFileError) bad("RIG_API_TOKEN_FILE", error.message);
      throw error;
    }
  }
  const positive = (n: number): string | null => (n > 0 ? null : "must be greater than 0");
  const dispatchStream = env["RIG_DISPATCH_STREAM"] ?? "rig:dispatch";
  if (dispatchStream === "") bad("RIG_DISPATCH_STREAM", "must not be empty");
  const logFormat = (value(env, "RIG_LOG_FORMAT") ?? "text").trim().toLowerCase();
  if (!(LOG_FORMATS as readonly string[]).includes(logFormat)) {
    bad("RIG_LOG_FORMAT", "must be text or json", env["RIG_LOG_FORMAT"]);
  }
  return {
    redisMode: mode,
    redisUrl,
    redisSentinels,
    redisSentinelMaster: value(env, "RIG_REDIS_SENTINEL_MASTER") ?? "mymaster",
    redisSentinelPassword: value(env, "RIG_REDIS_SENTINEL_PASSWORD"),
    redisTlsCaFile,
    redisTlsCertFile,
    redisTlsKeyFile,
    conductorUrl: conductorUrl(env),
    apiToken,
    apiTokenFile,
    heartbeatIntervalS: number(env, "RIG_HEARTBEAT_INTERVAL_S", 10, positive),
    scanIntervalS: number(env, "RIG_SCAN_INTERVAL_S", 60, positive),
    maxDeliveries: integer(env, "RIG_MAX_DELIVERIES", 5, 1),
    entryDeadlineMs: integer(env, "RIG_ENTRY_DEADLINE_MS", 3_600_000, 0),
    dispatchStream,
    logFormat: logFormat as LogFormat,
  };
}

/** Lifetime of the consumer-name lease: three heartbeats, so one late renewal is fine. */
export function leaseTtlMs(settings: Pick<Settings, "heartbeatIntervalS">): number {
  return Math.max(1, Math.round(settings.heartbeatIntervalS * 3000));
}

/** The consumer name: CONSUMER_ID, else HOSTNAME (the pod name), else `<agent-id>-<uuid>`. Never a
 * constant: two processes sharing a name would share one pending list. */
export function consumerName(agentId: string, env: Env = process.env): string {
  for (const name of ["CONSUMER_ID", "HOSTNAME"]) {
    const found = env[name]?.trim();
    if (found) return found;
  }
  return `${agentId}-${crypto.randomUUID()}`;
}

/** The effective configuration for the start-up line, secrets masked. */
export function describe(settings: Settings): Record<string, unknown> {
  return {
    RIG_REDIS_MODE: settings.redisMode,
    RIG_REDIS_URL: maskUrl(settings.redisUrl),
    RIG_LOG_FORMAT: settings.logFormat,
    RIG_REDIS_SENTINELS: settings.redisSentinels.map((s) => `${s.host}:${s.port}`).join(","),
    RIG_CONDUCTOR_URL: settings.conductorUrl,
    RIG_API_TOKEN: settings.apiToken === undefined ? null : "<set>",
    RIG_API_TOKEN_FILE: settings.apiTokenFile ?? null,
    RIG_HEARTBEAT_INTERVAL_S: settings.heartbeatIntervalS,
    RIG_SCAN_INTERVAL_S: settings.scanIntervalS,
    RIG_MAX_DELIVERIES: settings.maxDeliveries,
    RIG_ENTRY_DEADLINE_MS: settings.entryDeadlineMs,
    RIG_DISPATCH_STREAM: settings.dispatchStream,
  };
}

export function maskUrl(url: string): string {
  const sep = url.indexOf("://");
  if (sep < 0) return url;
  const rest = url.slice(sep + 3);
  const at = rest.lastIndexOf("@");
  if (at < 0) return url;
  const user = rest.slice(0, at).split(":")[0] ?? "";
  const scheme = url.slice(0, sep);
  return user ? `${scheme}://${user}:***@${rest.slice(at + 1)}` : `${scheme}://***@${rest.slice(at + 1)}`;
}
