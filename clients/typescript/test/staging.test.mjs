// Staging names must be exactly the Python runtime's and the conductor's (`domain.staged_path`,
// `domain.staged_output`): staged-names.json is computed by them.
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { commit, discard, fromOutputs, removeLeftovers, Staging, stagedOutput, stagedPath } from "../dist/staging.js";

const names = JSON.parse(readFileSync(new URL("./staged-names.json", import.meta.url), "utf8"));

test("staging paths are the Python runtime's, character for character", () => {
  for (const { path, entryId, attempt, staged } of names.stagedPath) {
    assert.equal(stagedPath(path, entryId, attempt), staged, path);
  }
});

test("recorded outputs are checked as the conductor checks them", () => {
  for (const { staged, path, attempt, valid } of names.stagedOutput) {
    let accepted = true;
    try {
      stagedOutput(staged, path, attempt);
    } catch {
      accepted = false;
    }
    assert.equal(accepted, valid, `${staged} -> ${path} (attempt ${attempt})`);
  }
});

test("a staged file is published by commit, once; a second commit counts it as already done", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-stage-"));
  const area = new Staging("1700000000000-0", 2);
  const staged = area.stage(join(dir, "out", "rc-1.json"));
  assert.equal(staged, join(dir, "out", ".rc-1.json.1700000000000-0.a2.tmp"));
  assert.equal(area.stage(join(dir, "out", "rc-1.json")), staged); // one staging file per path
  writeFileSync(staged, "{}");
  const files = area.close();
  assert.throws(() => area.stage(join(dir, "late")), /after the handler returned/);
  assert.deepEqual(commit(files), { renamed: 1, already: 0, lost: [] });
  assert.equal(readFileSync(join(dir, "out", "rc-1.json"), "utf8"), "{}");
  assert.deepEqual(commit(files), { renamed: 0, already: 1, lost: [] });
});

test("a staged file found nowhere is reported lost", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-stage-"));
  const files = [{ staged: join(dir, ".x.1-0.a1.tmp"), path: join(dir, "x") }];
  assert.deepEqual(commit(files), { renamed: 0, already: 0, lost: [join(dir, "x")] });
});

test("discard removes an attempt's files; leftovers of other attempts go once one is published", () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-stage-"));
  const path = join(dir, "rc-1.json");
  for (const attempt of [1, 2, 3]) writeFileSync(stagedPath(path, "5-0", attempt), "x");
  writeFileSync(stagedPath(path, "6-0", 1), "another entry's");
  assert.equal(discard([{ staged: stagedPath(path, "5-0", 3), path }]), 1);
  assert.equal(removeLeftovers([{ staged: stagedPath(path, "5-0", 2), path }], "5-0", 2), 1);
  assert.deepEqual(readdirSync(dir).sort(), [".rc-1.json.5-0.a2.tmp", ".rc-1.json.6-0.a1.tmp"]);
  assert.ok(!existsSync(stagedPath(path, "5-0", 1)));
});

test("recorded outputs of another attempt are refused before anything is renamed", () => {
  const ok = { staged: "/out/.a.json.1-0.a2.tmp", path: "/out/a.json" };
  assert.deepEqual(fromOutputs([ok], 2), [ok]);
  assert.throws(() => fromOutputs([ok, { staged: "/etc/passwd", path: "/out/b.json" }], 2), /is not/);
  assert.throws(() => fromOutputs([ok], 3), /is not/);
});
