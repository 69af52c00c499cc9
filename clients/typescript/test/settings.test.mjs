// The RIG_* settings: the Python runtime's names, defaults and one-line errors.
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { consumerName, leaseTtlMs, loadSettings, maskUrl } from "../dist/settings.js";
import { triage } from "../dist/entry.js";
import { agentPrefix, leaseKey } from "../dist/lease.js";

test("defaults", () => {
  const s = loadSettings({});
  assert.equal(s.redisUrl, "redis://localhost:6379/0");
  assert.equal(s.redisMode, "standalone");
  assert.equal(s.conductorUrl, "http://localhost:8080");
  assert.equal(s.heartbeatIntervalS, 10);
  assert.equal(s.scanIntervalS, 60);
  assert.equal(s.entryDeadlineMs, 3_600_000);
  assert.equal(s.maxDeliveries, 5);
  assert.equal(s.dispatchStream, "rig:dispatch");
  assert.equal(leaseTtlMs(s), 30_000);
});

test("values are read, blanks mean unset", () => {
  const s = loadSettings({
    RIG_CONDUCTOR_URL: "https://conductor.example:8443/",
    RIG_HEARTBEAT_INTERVAL_S: "0.5",
    RIG_MAX_DELIVERIES: "3",
    RIG_ENTRY_DEADLINE_MS: "0",
    RIG_REDIS_MODE: " Sentinel ",
    RIG_REDIS_SENTINELS: "s1:26379, [::1]:26380",
    RIG_API_TOKEN: "  ",
  });
  assert.equal(s.conductorUrl, "https://conductor.example:8443");
  assert.equal(s.heartbeatIntervalS, 0.5);
  assert.equal(leaseTtlMs(s), 1500);
  assert.equal(s.maxDeliveries, 3);
  assert.equal(s.entryDeadlineMs, 0);
  assert.equal(s.redisMode, "sentinel");
  assert.deepEqual(s.redisSentinels, [{ host: "s1", port: 26379 }, { host: "::1", port: 26380 }]);
  assert.equal(s.apiToken, undefined);
});

test("a bad value is one line naming its variable, secrets never echoed", () => {
  const cases = [
    [{ RIG_HEARTBEAT_INTERVAL_S: "0" }, /^RIG_HEARTBEAT_INTERVAL_S: must be greater than 0/],
    [{ RIG_SCAN_INTERVAL_S: "soon" }, /^RIG_SCAN_INTERVAL_S: must be a number/],
    [{ RIG_MAX_DELIVERIES: "0" }, /^RIG_MAX_DELIVERIES: must be at least 1/],
    [{ RIG_ENTRY_DEADLINE_MS: "1.5" }, /^RIG_ENTRY_DEADLINE_MS: must be a whole number/],
    [{ RIG_REDIS_MODE: "ring" }, /^RIG_REDIS_MODE: must be standalone, cluster or sentinel/],
    [{ RIG_REDIS_URL: "http://user:hunter2@x" }, /^RIG_REDIS_URL: must be a redis:\/\/, rediss:\/\/ or unix:\/\/ URL$/],
    [{ RIG_REDIS_MODE: "cluster", RIG_REDIS_URL: "redis://x:6379/3" }, /^RIG_REDIS_URL: cluster mode has database 0 only/],
    [{ RIG_REDIS_MODE: "sentinel" }, /^RIG_REDIS_SENTINELS: sentinel mode needs at least one/],
    [{ RIG_REDIS_SENTINELS: "nohost" }, /^RIG_REDIS_SENTINELS: each sentinel must be host:port/],
    [{ RIG_REDIS_TLS_CA_FILE: "/no/such/ca.pem" }, /^RIG_REDIS_TLS_CA_FILE: no such file/],
    [{ RIG_CONDUCTOR_URL: "ftp://x" }, /^RIG_CONDUCTOR_URL: must be an http:\/\/ or https:\/\/ URL/],
    [{ RIG_API_TOKEN_FILE: "/no/such/token" }, /^RIG_API_TOKEN_FILE: cannot read \/no\/such\/token/],
  ];
  for (const [env, expected] of cases) {
    assert.throws(() => loadSettings(env), (error) => {
      assert.equal(error.name, "SettingsError");
      assert.match(error.message, expected);
      assert.ok(!error.message.includes("\n") && !error.message.includes("hunter2"), error.message);
      return true;
    });
  }
});

test("a token and a token file: one of them", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-token-"));
  writeFileSync(join(dir, "token"), "abc\n");
  assert.equal(loadSettings({ RIG_API_TOKEN_FILE: join(dir, "token") }).apiTokenFile, join(dir, "token"));
  assert.throws(
    () => loadSettings({ RIG_API_TOKEN_FILE: join(dir, "token"), RIG_API_TOKEN: "t" }),
    /^SettingsError: RIG_API_TOKEN_FILE: RIG_API_TOKEN and RIG_API_TOKEN_FILE are both set/,
  );
  writeFileSync(join(dir, "empty"), " \n");
  assert.throws(() => loadSettings({ RIG_API_TOKEN_FILE: join(dir, "empty") }), /RIG_API_TOKEN_FILE: .* is empty/);
});

test("consumer name: CONSUMER_ID, else HOSTNAME, else the agent id and a UUID", () => {
  assert.equal(consumerName("builder", { CONSUMER_ID: "c-1", HOSTNAME: "pod-0" }), "c-1");
  assert.equal(consumerName("builder", { CONSUMER_ID: " ", HOSTNAME: "pod-0" }), "pod-0");
  const made = consumerName("builder", {});
  assert.match(made, /^builder-[0-9a-f-]{36}$/);
  assert.notEqual(made, consumerName("builder", {}));
});

test("the lease key is the Python runtime's", () => {
  assert.equal(leaseKey("b", "rig:dispatch", "builders", "b-0"), "rig:agent:b:lease:rig:dispatch:builders:b-0");
  // The agent id percent-encoded as Python's quote(id, safe=""): no ':' and no glob character.
  assert.equal(agentPrefix("dev-e:x"), "rig:agent:dev-e%3Ax:");
  assert.equal(agentPrefix("a*b?[c]'(!)"), "rig:agent:a%2Ab%3F%5Bc%5D%27%28%21%29:");
  assert.equal(agentPrefix("ü.b_c~d"), "rig:agent:%C3%BC.b_c~d:");
});

test("triage: trimmed entries and worn-out ones are not handled", () => {
  assert.equal(triage({}, 1, 5), "trimmed");
  assert.equal(triage({ issueId: "rc-1" }, 1, 5), "handle");
  assert.equal(triage({ issueId: "rc-1" }, 5, 5), "handle"); // 4 deliveries before this read
  assert.equal(triage({ issueId: "rc-1" }, 6, 5), "max-deliveries");
});

test("masked URLs keep the user, never the password", () => {
  assert.equal(maskUrl("redis://agent:secret@redis:6379/0"), "redis://agent:***@redis:6379/0");
  assert.equal(maskUrl("redis://:secret@redis:6379/0"), "redis://***@redis:6379/0");
  assert.equal(maskUrl("redis://redis:6379/0"), "redis://redis:6379/0");
});
