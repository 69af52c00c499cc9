// The logger writes the Python runtime's lines (`rig_conductor.logs`): log-lines.json is computed
// by its formatters (and kept in step by tests/unit/test_typescript_log_lines.py).
process.env.TZ = "UTC"; // the text format writes local time; the table is in UTC

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { escapeControl, formatLine, log, logFormat, setLogFormat } from "../dist/log.js";
import { loadSettings } from "../dist/settings.js";

const table = JSON.parse(readFileSync(new URL("./log-lines.json", import.meta.url), "utf8"));

/** What `fn` writes to stderr, line by line. */
function captured(fn) {
  const written = [];
  const write = process.stderr.write;
  process.stderr.write = (chunk) => {
    written.push(String(chunk));
    return true;
  };
  try {
    fn();
  } finally {
    process.stderr.write = write;
  }
  return written.join("").split("\n").slice(0, -1);
}

test("JSON lines are the Python runtime's, character for character", () => {
  for (const { level, message, fields, timeMs, json } of table.lines) {
    assert.equal(formatLine(level, message, fields, "json", new Date(timeMs)), json, message);
  }
});

test("text lines are the Python runtime's, character for character", () => {
  for (const { level, message, fields, timeMs, text } of table.lines) {
    assert.equal(formatLine(level, message, fields, "text", new Date(timeMs)), text, message);
  }
});

test("one event is one line, whatever it quotes", () => {
  const forged = "x\n2023-11-14 22:13:20,123 INFO    rig-agent: Entry 1-0 (issue rc-1, attempt 1): completed";
  for (const format of ["text", "json"]) {
    const line = formatLine("WARNING", forged, { outcome: "a\nb\u2028c" }, format);
    assert.equal(line.split(/[\n\r\u2028\u2029]/).length, 1, format);
  }
  assert.equal(escapeControl("a\r\nb\tc\x00\x9f\u2029"), "a\\r\\nb\\tc\\x00\\x9f\\u2029");
});

test("JSON: the fields beside the message, null for what is missing, never over the head", () => {
  const line = JSON.parse(
    formatLine("INFO", "m", { entryId: "1-0", issueId: undefined, attempt: null, nested: { a: [1, "b"] }, level: "forged" }, "json"),
  );
  assert.deepEqual(Object.keys(line), ["time", "level", "logger", "message", "entryId", "issueId", "attempt", "nested"]);
  assert.equal(line.level, "INFO");
  assert.equal(line.logger, "rig-agent");
  assert.equal(line.issueId, null);
  assert.deepEqual(line.nested, { a: [1, "b"] });
  assert.match(line.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$/);
});

test("the logger writes in the format it was set to, text by default", () => {
  assert.equal(logFormat(), "text");
  try {
    const [text] = captured(() => log.info("hello", { entryId: "1-0" }));
    assert.match(text, /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO    rig-agent: hello$/);
    setLogFormat("json");
    const lines = captured(() => {
      log.warn("careful");
      log.error("broken", { entryId: "1-0" });
    });
    assert.deepEqual(
      lines.map((l) => JSON.parse(l)).map(({ level, message, entryId }) => ({ level, message, entryId })),
      [
        { level: "WARNING", message: "careful", entryId: undefined },
        { level: "ERROR", message: "broken", entryId: "1-0" },
      ],
    );
  } finally {
    setLogFormat("text");
  }
});

test("RIG_LOG_FORMAT: text or json, whatever the case; blank means the default; else one line naming it", () => {
  assert.equal(loadSettings({}).logFormat, "text");
  assert.equal(loadSettings({ RIG_LOG_FORMAT: " JSON " }).logFormat, "json");
  assert.equal(loadSettings({ RIG_LOG_FORMAT: "Text" }).logFormat, "text");
  assert.equal(loadSettings({ RIG_LOG_FORMAT: "" }).logFormat, "text");
  assert.throws(() => loadSettings({ RIG_LOG_FORMAT: "xml" }), {
    name: "SettingsError",
    message: 'RIG_LOG_FORMAT: must be text or json (got "xml")',
  });
});
