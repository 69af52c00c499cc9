// The consumer-name lease: a Redis key that says "this consumer name is in use". The key and the
// scripts are the Python runtime's (`rig_conductor.agent.lease`, its scripts in
// `rig_conductor.adapters.redis.lua`), byte for byte, so the two runtimes exclude each other.
import { randomUUID } from "node:crypto";

import { ConsumerInUse } from "./errors.js";
import { log } from "./log.js";
import type { AnyRedis } from "./redis.js";
import { pause } from "./retry.js";

// Renew the lease only while this instance holds it; take it again if it expired meanwhile.
export const RENEW_LUA = `
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
`;
export const RELEASE_LUA = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`;

/** `rig:agent:<agentId>:`: the keys an agent writes, the agent id percent-encoded as the
 * Python runtime's `redis_keys.agent_prefix` does (every byte but `A-Z a-z 0-9 _ . - ~`), so an
 * ACL key pattern gives each agent its own keys and no other agent's. */
export function agentPrefix(agentId: string): string {
  const encoded = encodeURIComponent(agentId).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
  return `rig:agent:${encoded}:`;
}

export function leaseKey(agentId: string, stream: string, group: string, consumer: string): string {
  return `${agentPrefix(agentId)}lease:${stream}:${group}:${consumer}`;
}

export class ConsumerLease {
  readonly instance = randomUUID().replaceAll("-", "");

  constructor(
    private readonly redis: AnyRedis,
    readonly key: string,
    private readonly ttlMs: number,
    private readonly pollMs = 100,
  ) {}

  /** Take the name. A holder whose key expires within one lifetime was a dead predecessor (a
   * restarted pod); a holder still there after that, or another holder meanwhile, is alive (it
   * renews), and this process must not start (ConsumerInUse). Only GET and SET: the agent's
   * least-privilege Redis user may run nothing else on the key (no PTTL).
   * False when `until` was aborted while waiting. */
  async acquire(until?: AbortSignal): Promise<boolean> {
    let first: string | undefined;
    let deadline = 0;
    while (!until?.aborted) {
      if ((await this.redis.set(this.key, this.instance, "PX", this.ttlMs, "NX")) === "OK") return true;
      const holder = await this.redis.get(this.key);
      if (holder === null) continue; // expired meanwhile: take it
      if (first === undefined) {
        first = holder;
        deadline = performance.now() + this.ttlMs + 1000;
        log.info(`Consumer name lease ${this.key} is held by instance ${holder}; waiting up to ${this.ttlMs} ms for it to expire`);
      }
      if (holder !== first || performance.now() > deadline) {
        throw new ConsumerInUse(
          `consumer name in use by another live process (lease ${this.key} renewed by instance ${holder}); ` +
            "give each process its own CONSUMER_ID",
        );
      }
      await pause(this.pollMs, until);
    }
    return false;
  }

  /** False when another instance holds the name now. */
  async renew(): Promise<boolean> {
    return Number(await this.redis.eval(RENEW_LUA, 1, this.key, this.instance, this.ttlMs)) === 1;
  }

  async release(): Promise<void> {
    try {
      await this.redis.eval(RELEASE_LUA, 1, this.key, this.instance);
    } catch {
      // a clean stop that cannot reach Redis: the lease expires by itself
    }
  }
}
