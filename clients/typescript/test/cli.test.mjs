import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { loadHandler, parseArguments } from "../dist/cli.js";

test("arguments: the Python runtime's flags", () => {
  const args = parseArguments(["--agent-id", "builder", "--group", "builders", "--handler", "./h.mjs#build"]);
  assert.deepEqual(args, { agentId: "builder", group: "builders", stream: undefined, startId: "0", handler: "./h.mjs#build" });
  assert.equal(parseArguments(["--agent-id", "a", "--group", "g", "--handler", "h", "--start-id", "$"]).startId, "$");
  assert.throws(() => parseArguments(["--group", "g", "--handler", "h"]), /--agent-id is required/);
  assert.throws(() => parseArguments(["--agent-id", "a", "--group", "g", "--handler", "h", "--start-id", "x"]), /--start-id "x": must be 0, \$/);
  assert.throws(() => parseArguments(["--agent-id", "a", "--group", "g", "--handler", "h", "--nope"]), /Unknown option '--nope'/);
});

test("--handler: the default export, or a named one; a bad one is one line", async () => {
  const dir = mkdtempSync(join(tmpdir(), "rig-handler-"));
  writeFileSync(join(dir, "h.mjs"), "export default async () => 'd';\nexport const named = async () => 'n';\nexport const x = 1;\n");
  assert.equal(await (await loadHandler("./h.mjs", dir))(), "d");
  assert.equal(await (await loadHandler(`${join(dir, "h.mjs")}#named`))(), "n");
  await assert.rejects(loadHandler("./h.mjs#missing", dir), /has no export missing/);
  await assert.rejects(loadHandler("./h.mjs#x", dir), /x is not a function/);
  await assert.rejects(loadHandler("./nothing.mjs", dir), /cannot import \.\/nothing\.mjs/);
});
