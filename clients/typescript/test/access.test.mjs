// The start-up permission probe asks Redis what the Python runtime asks
// (`adapters.redis.access`): access-probes.json is computed by it.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { ReplyError } from "ioredis";

import { agentProbes, missingPermission, overPrivileged, overPrivilegedWarning, probeKey } from "../dist/access.js";
import { MissingPermission } from "../dist/index.js";
import { agentPrefix } from "../dist/lease.js";
import { RedisUnavailable } from "../dist/redis.js";

const table = JSON.parse(readFileSync(new URL("./access-probes.json", import.meta.url), "utf8"));

/** A Redis that records each command and answers `answer(words)`: a value, or an error thrown. */
function fakeRedis(answer = () => "OK") {
  const sent = [];
  return {
    sent,
    async call(...words) {
      sent.push(words);
      const reply = answer(words);
      if (reply instanceof Error) throw reply;
      return reply;
    },
  };
}

const refuse = (command) => (words) =>
  words[0] === command ? new ReplyError(`NOPERM User rig-agent-a has no permissions to run the '${command.toLowerCase()}' command`) : "OK";

test("the probes are the Python runtime's, on the same keys", () => {
  assert.equal(`${agentPrefix(table.agentId)}rig-access-probe`, table.own);
  assert.deepEqual(agentProbes(table.stream, table.own), table.probes);
  for (const { stream, clustered, key } of table.probeKey) assert.equal(probeKey(stream, clustered), key);
});

test("a user with every right passes: every probe is sent, a subcommand as its own word", async () => {
  const redis = fakeRedis((words) => (words[0] === "XREADGROUP" ? new ReplyError("NOGROUP No such key") : null));
  assert.equal(await missingPermission(redis, table.stream, table.agentId), undefined);
  assert.deepEqual(
    redis.sent,
    table.probes.map(([name, ...args]) => [...name.split(" "), ...args]),
  );
});

test("the first missing right is named in one line, as the Python runtime words it", async () => {
  const line = await missingPermission(fakeRedis(refuse("XREADGROUP")), "rig:dispatch", "a");
  assert.equal(
    line,
    "Redis user lacks a permission the agent needs: XREADGROUP (User rig-agent-a has no permissions to run the 'xreadgroup' command)",
  );
  const keyRefused = fakeRedis((words) =>
    words[0] === "EVALSHA" ? new ReplyError("NOPERM this user has no permissions to access one of the keys used as arguments") : null,
  );
  assert.equal(
    await missingPermission(keyRefused, "rig:dispatch", "a"),
    "Redis user lacks a permission the agent needs: EVALSHA on key rig:agent:a:rig-access-probe " +
      "(this user has no permissions to access one of the keys used as arguments)",
  );
  const subcommand = fakeRedis((words) => (words[0] === "XGROUP" && words[1] === "CREATECONSUMER" ? new ReplyError("NOPERM no") : null));
  assert.match(await missingPermission(subcommand, "s", "a"), /needs: XGROUP CREATECONSUMER \(no\)$/);
});

test("no connection is RedisUnavailable, not a missing right", async () => {
  const down = fakeRedis(() => new Error("Connection is closed."));
  await assert.rejects(missingPermission(down, "s", "a"), (error) => {
    assert.ok(error instanceof RedisUnavailable);
    assert.equal(error.message, "Redis unavailable: Error: Connection is closed.");
    return true;
  });
});

test("over-privileged: the user may XADD (tried with NOMKSTREAM beside the stream)", async () => {
  const shared = fakeRedis(() => null);
  assert.equal(await overPrivileged(shared, "rig:dispatch"), true);
  assert.deepEqual(shared.sent, [["XADD", "rig:dispatch:rig-access-probe", "NOMKSTREAM", "*", "probe", "1"]]);
  assert.equal(await overPrivileged(fakeRedis(refuse("XADD")), "rig:dispatch"), false);
  // Any other answer means the command was allowed.
  assert.equal(await overPrivileged(fakeRedis(() => new ReplyError("WRONGTYPE no")), "rig:dispatch"), true);
  assert.equal(
    overPrivilegedWarning("rig:dispatch", "builder"),
    "This agent's Redis user may add entries to rig:dispatch (XADD): it has the conductor's rights, so this agent " +
      "could forge dispatches, dead letters or markers. Give each agent its own user: " +
      "`rig-conductor redis-acl --agent-id builder` prints it",
  );
});

test("MissingPermission is exported, an AgentError with its one line", () => {
  const error = new MissingPermission("Redis user lacks a permission the agent needs: PING (no)");
  assert.equal(error.name, "MissingPermission");
  assert.ok(error instanceof Error);
});
