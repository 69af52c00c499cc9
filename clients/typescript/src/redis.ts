// One way to reach Redis, whatever the topology: a standalone server, the master a set of
// sentinels names (ioredis follows failovers), or a cluster (ioredis follows MOVED and ASK); TLS
// for `rediss://` URLs with the configured CA and client certificate. Connects lazily.
import { readFileSync } from "node:fs";
import type { ConnectionOptions } from "node:tls";

import { Cluster, Redis } from "ioredis";
import type { RedisOptions } from "ioredis";

import type { Settings } from "./settings.js";

export type AnyRedis = Redis | Cluster;

const RETRIES = 6; // connection blips: a command fails after this many reconnects

function tls(settings: Settings): ConnectionOptions | undefined {
  if (!settings.redisUrl.startsWith("rediss://")) return undefined;
  const options: ConnectionOptions = { rejectUnauthorized: true };
  if (settings.redisTlsCaFile) options.ca = readFileSync(settings.redisTlsCaFile);
  if (settings.redisTlsCertFile && settings.redisTlsKeyFile) {
    options.cert = readFileSync(settings.redisTlsCertFile);
    options.key = readFileSync(settings.redisTlsKeyFile);
  }
  return options;
}

function credentials(url: string): Pick<RedisOptions, "username" | "password" | "db"> {
  if (url.startsWith("unix://")) return {};
  const parsed = new URL(url);
  const found: Pick<RedisOptions, "username" | "password" | "db"> = {};
  if (parsed.username) found.username = decodeURIComponent(parsed.username);
  if (parsed.password) found.password = decodeURIComponent(parsed.password);
  const db = parsed.pathname.replace(/^\//, "") || parsed.searchParams.get("db") || "";
  if (/^\d+$/.test(db)) found.db = Number(db);
  return found;
}

function common(settings: Settings): RedisOptions {
  const options: RedisOptions = {
    connectTimeout: 5_000,
    maxRetriesPerRequest: RETRIES,
    retryStrategy: (times) => Math.min(50 * 2 ** times, 2_000),
    lazyConnect: true,
    // The ready check sends INFO, which the agent's least-privilege Redis user may not run.
    enableReadyCheck: false,
  };
  const secure = tls(settings);
  if (secure) options.tls = secure;
  return options;
}

/** The client for the streams' Redis in the configured mode. */
export function connect(settings: Settings): AnyRedis {
  const options = common(settings);
  if (settings.redisMode === "cluster") {
    const url = new URL(settings.redisUrl);
    const { username, password } = credentials(settings.redisUrl);
    const nodeOptions: RedisOptions = { ...options };
    if (username) nodeOptions.username = username;
    if (password) nodeOptions.password = password;
    return new Cluster([{ host: url.hostname, port: Number(url.port || 6379) }], {
      redisOptions: nodeOptions,
      lazyConnect: true,
      ...(options.tls ? { dnsLookup: (address, done) => done(null, address) } : {}),
    });
  }
  if (settings.redisMode === "sentinel") {
    const sentinelOptions: RedisOptions = {
      ...options,
      ...credentials(settings.redisUrl),
      sentinels: settings.redisSentinels,
      name: settings.redisSentinelMaster,
    };
    if (settings.redisSentinelPassword) sentinelOptions.sentinelPassword = settings.redisSentinelPassword;
    if (options.tls) {
      sentinelOptions.enableTLSForSentinelMode = true;
      sentinelOptions.sentinelTLS = options.tls;
    }
    return new Redis(sentinelOptions);
  }
  if (settings.redisUrl.startsWith("unix://")) {
    const url = new URL(settings.redisUrl);
    return new Redis({ ...options, ...credentials(settings.redisUrl), path: url.pathname });
  }
  return new Redis(settings.redisUrl, options);
}

/** Redis could not be reached at start; the message is one line naming the cause. */
export class RedisUnavailable extends Error {
  override name = "RedisUnavailable";
}

/** Log a client's connection errors, each distinct one once until it connects again (ioredis
 * retries by itself; an unheard error event would print a stack trace). The last error, for a
 * start that fails. */
export function watchErrors(client: AnyRedis, onError: (message: string) => void): () => Error | undefined {
  let last: Error | undefined;
  let said = "";
  client.on("error", (error: Error) => {
    last = error;
    if (error.message !== said) {
      said = error.message;
      onError(error.message);
    }
  });
  client.on("ready", () => {
    said = "";
  });
  return () => last;
}

/** Connect now; RedisUnavailable with the cause when the first try fails. */
export async function connectNow(client: AnyRedis, lastError: () => Error | undefined): Promise<void> {
  try {
    await client.connect();
  } catch (error) {
    const cause = lastError() ?? (error as Error);
    throw new RedisUnavailable(`Redis unavailable: ${cause.name}: ${cause.message.split("\n")[0] ?? ""}`);
  }
}
