// What the agent's Redis user must be allowed, checked at start with harmless probes, as the
// Python runtime does (`rig_conductor.adapters.redis.access`): the same commands, on the same
// keys, with the same lines.
//
// Each probe runs one command the agent needs, on its stream in a form that changes nothing there
// (a group that does not exist, an id that is not one) or on a key of its own that does not
// exist. Redis checks the ACL before anything else, so a NOPERM answer names exactly what is
// missing, and any other answer (no such key, NOGROUP, NOSCRIPT) means the command is allowed.
// The user `rig-conductor redis-acl --agent-id <id>` prints passes every probe.
import { Cluster, ReplyError } from "ioredis";

import { AgentError } from "./errors.js";
import { agentPrefix } from "./lease.js";
import type { AnyRedis } from "./redis.js";
import { RedisUnavailable } from "./redis.js";

const NO_SHA = "0".repeat(40);
const GROUP = "rig-access-probe";
const CONSUMER = "rig-access-probe";
const PROBE = "rig-access-probe";

/** A command as the Python runtime names it (a subcommand as a word pair, "XGROUP CREATE"),
 * then its arguments. */
type Probe = [string, ...string[]];

/** The Redis user may not run a command the agent needs; the message is one line naming it. */
export class MissingPermission extends AgentError {
  override name = "MissingPermission";
}

/** What an agent runs: on its stream, and on `own`, a key of its own that does not exist. */
export function agentProbes(stream: string, own: string): Probe[] {
  return [
    ["PING"],
    ["XPENDING", stream, GROUP, "-", "+", "1"],
    ["XACK", stream, GROUP, "0-1"],
    ["XREADGROUP", "GROUP", GROUP, CONSUMER, "COUNT", "1", "STREAMS", stream, "0"],
    ["XGROUP CREATE", stream, GROUP, "not-an-id"],
    ["XGROUP CREATECONSUMER", stream, GROUP, CONSUMER],
    ["SCRIPT LOAD", "return 0"],
    ["SCRIPT EXISTS", NO_SHA],
    ["EVALSHA", NO_SHA, "1", own],
    ["GET", own],
    ["SET", own, "1", "XX"],
    ["PTTL", own],
    ["PEXPIRE", own, "1"],
    ["DEL", own],
  ];
}

/** True when Redis Cluster hashes only part of `name`: a `{...}` with something inside. */
function hasHashTag(name: string): boolean {
  const start = name.indexOf("{");
  return start >= 0 && name.indexOf("}", start + 1) > start + 1;
}

/** A companion key of `stream` (its prefix, and its slot on a cluster) that nothing uses. */
export function probeKey(stream: string, clustered: boolean): string {
  const prefix = !clustered || hasHashTag(stream) || stream.includes("}") ? stream : `{${stream}}`;
  return `${prefix}:${PROBE}`;
}

export function isNoPermission(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith("NOPERM");
}

/** Run one probe: the error Redis answered with (a refusal or not), or undefined. An error
 * that is not Redis's answer (no connection) is RedisUnavailable. */
async function run(redis: AnyRedis, [name, ...args]: Probe): Promise<Error | undefined> {
  const [command = name, ...sub] = name.split(" ");
  try {
    await redis.call(command, ...sub, ...args);
    return undefined;
  } catch (error) {
    if (error instanceof ReplyError) return error as Error;
    const cause = error instanceof Error ? error : new Error(String(error));
    throw new RedisUnavailable(`Redis unavailable: ${cause.name}: ${cause.message.split("\n")[0] ?? ""}`);
  }
}

/** One line naming the missing permission, as the Python runtime words it. */
function missing(probe: Probe, error: Error, keys: string[]): string {
  const [name, ...args] = probe;
  const key = args.find((arg) => keys.includes(arg));
  const what = key !== undefined && error.message.toLowerCase().includes("key") ? `${name} on key ${key}` : name;
  // As redis-py words the error: without the NOPERM code in front.
  const text = error.message.replace(/^NOPERM\s*/, "");
  return `Redis user lacks a permission the agent needs: ${what} (${text})`;
}

/** Undefined when the Redis user may run everything the agent needs on `stream` and on
 * `agentId`'s own keys; else one line naming the first missing permission. RedisUnavailable
 * when Redis cannot be reached. */
export async function missingPermission(redis: AnyRedis, stream: string, agentId: string): Promise<string | undefined> {
  const own = `${agentPrefix(agentId)}${PROBE}`;
  for (const probe of agentProbes(stream, own)) {
    const error = await run(redis, probe);
    if (error !== undefined && isNoPermission(error)) return missing(probe, error, [stream, own]);
  }
  return undefined;
}

/** True when the agent's user may add entries to streams (XADD, tried where it changes nothing:
 * NOMKSTREAM on a key that does not exist): it has the conductor's rights, as one user shared by
 * the conductor and every agent does, and could forge dispatches, dead letters or markers. */
export async function overPrivileged(redis: AnyRedis, stream: string): Promise<boolean> {
  const error = await run(redis, ["XADD", probeKey(stream, redis instanceof Cluster), "NOMKSTREAM", "*", "probe", "1"]);
  return error === undefined || !isNoPermission(error);
}

/** The warning for an over-privileged agent user, the Python runtime's words. */
export function overPrivilegedWarning(stream: string, agentId: string): string {
  return (
    `This agent's Redis user may add entries to ${stream} (XADD): it has the conductor's rights, ` +
    "so this agent could forge dispatches, dead letters or markers. Give each agent its own user: " +
    `\`rig-conductor redis-acl --agent-id ${agentId}\` prints it`
  );
}
