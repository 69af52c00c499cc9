import assert from "node:assert/strict";
import { mkdtempSync, renameSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { ProgressReporter } from "../dist/entry.js";
import { Fenced } from "../dist/errors.js";
import { TokenFile, TokenFileError } from "../dist/tokenFile.js";

test("progress(): accepted goes on; fenced rejects with Fenced, then every later call too", async () => {
  const answers = [true, false];
  const reporter = new ProgressReporter(async () => answers.shift() ?? true);
  await reporter.report();
  await assert.rejects(reporter.report(), Fenced);
  await assert.rejects(reporter.report(), Fenced); // the conductor is not asked again
  assert.deepEqual(answers, []);
});

test("progress() after the runtime gave the attempt up rejects without asking", async () => {
  let asked = 0;
  const reporter = new ProgressReporter(async () => ++asked > 0);
  reporter.fence();
  await assert.rejects(reporter.report(), /abandoned or fenced off/);
  assert.equal(asked, 0);
});

test("a token file is read again when the file behind the path changes", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-token-"));
  const path = join(dir, "token");
  writeFileSync(path, "first\n");
  let now = 0;
  const file = new TokenFile(path, 5000, () => now);
  assert.equal(file.current(), "first");
  writeFileSync(join(dir, "next"), "second-token\n");
  renameSync(join(dir, "next"), path); // as the kubelet swaps its ..data link: a new inode
  assert.equal(file.current(), "second-token");
});

test("after a 401 the file is read again at most every 5 s", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-token-"));
  const path = join(dir, "token");
  writeFileSync(path, "first");
  let now = 0;
  const file = new TokenFile(path, 5000, () => now);
  assert.equal(file.refresh(), false); // just read
  now = 6000;
  assert.equal(file.refresh(), false); // read again: the same token
  now = 12000;
  assert.equal(file.refresh(), false);
  assert.throws(() => new TokenFile(join(dir, "missing")), TokenFileError);
});
