// One line per event on stderr, in the format RIG_LOG_FORMAT names, as the Python runtime writes
// them (`rig_conductor.logs`):
//
// - `text` (the default): `<YYYY-MM-DD HH:MM:SS,mmm> <LEVEL, padded to 7> rig-agent: <message>`,
//   local time, with every control character written as a Python literal would (`\n`, `\x1b`,
//   `\u2028`): one event is one line, whatever text it quotes (an error message, a field of an
//   entry), so nobody can forge a line by choosing that text.
// - `json`: one object per line, `{"time", "level", "logger", "message", ...fields}`: `time` in
//   ISO 8601 UTC with milliseconds and `+00:00`, `message` the same sentence as in text, and the
//   parts of the sentence as fields of their own (the per-entry line's `entryId`, `issueId`,
//   `attempt`, `outcome`, `stream`, `group`, `consumer`). Encoded as Python's `json.dumps` does
//   (`", "` and `": "` between items, non-ASCII as `\uXXXX`), so the two runtimes' lines read alike.

export type LogFormat = "text" | "json";
export type LogLevel = "INFO" | "WARNING" | "ERROR";
/** The parts of a sentence, as JSON fields beside `message` (ignored by the text format). */
export type LogFields = Record<string, unknown>;

export const LOG_FORMATS: readonly LogFormat[] = ["text", "json"];
export const LOGGER = "rig-agent";

let current: LogFormat = "text";

/** Write every line from now on in `format`. */
export function setLogFormat(format: LogFormat): void {
  current = format;
}

export function logFormat(): LogFormat {
  return current;
}

// The characters the text format escapes, as the Python runtime's `domain.CONTROL`.
const CONTROL = /[\x00-\x1f\x7f-\x9f\u2028\u2029]/g;
const SHORT: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };

/** `text` with its control characters escaped (`\n`, `\x1b`, `\u2028`): on one line. */
export function escapeControl(text: string): string {
  return text.replace(CONTROL, (char) => {
    const code = char.charCodeAt(0);
    return SHORT[char] ?? (code < 0x100 ? `\\x${hex(code, 2)}` : `\\u${hex(code, 4)}`);
  });
}

function hex(code: number, width: number): string {
  return code.toString(16).padStart(width, "0");
}

const pad = (n: number, width = 2): string => String(n).padStart(width, "0");

/** Python's `%(asctime)s`: local time, `2024-05-01 12:00:00,123`. */
function asctime(at: Date): string {
  const day = `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}`;
  return `${day} ${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())},${pad(at.getMilliseconds(), 3)}`;
}

/** A string as JSON, exactly as Python's `json.dumps` writes it (ASCII only). */
function quote(text: string): string {
  return JSON.stringify(text).replace(/[\u007f-\uffff]/g, (char) => `\\u${hex(char.charCodeAt(0), 4)}`);
}

/** A value as JSON, as `json.dumps(value, default=str)` writes it; what JSON has no word for
 * (undefined) is null, what it cannot hold is its text. */
function encode(value: unknown, seen: Set<object> = new Set()): string {
  if (value === null || value === undefined) return "null";
  switch (typeof value) {
    case "string":
      return quote(value);
    case "boolean":
      return value ? "true" : "false";
    case "number":
      return Number.isFinite(value) ? JSON.stringify(value) : quote(String(value));
    case "bigint":
      return value.toString();
    case "object": {
      if (value instanceof Date) return quote(Number.isNaN(value.getTime()) ? String(value) : value.toISOString());
      if (value instanceof Error || seen.has(value)) return quote(String(value));
      seen.add(value);
      try {
        if (Array.isArray(value)) return `[${value.map((item) => encode(item, seen)).join(", ")}]`;
        return object(Object.entries(value as Record<string, unknown>), seen);
      } finally {
        seen.delete(value);
      }
    }
    default:
      return quote(String(value));
  }
}

function object(entries: Array<[string, unknown]>, seen: Set<object> = new Set()): string {
  return `{${entries.map(([key, item]) => `${quote(key)}: ${encode(item, seen)}`).join(", ")}}`;
}

/** `value` as JSON, as the Python runtime's `json.dumps` writes it (`", "`, `": "`, ASCII). */
export function jsonText(value: unknown): string {
  return encode(value);
}

/** The line (without its newline) for one event in `format`. */
export function formatLine(
  level: LogLevel,
  message: string,
  fields: LogFields = {},
  format: LogFormat = current,
  at: Date = new Date(),
): string {
  if (format === "json") {
    const head: Array<[string, unknown]> = [
      ["time", at.toISOString().replace(/Z$/, "+00:00")],
      ["level", level],
      ["logger", LOGGER],
      ["message", message],
    ];
    const taken = new Set(head.map(([key]) => key));
    return object([...head, ...Object.entries(fields).filter(([key]) => !taken.has(key))]);
  }
  return escapeControl(`${asctime(at)} ${level.padEnd(7)} ${LOGGER}: ${message}`);
}

function write(level: LogLevel, message: string, fields?: LogFields): void {
  process.stderr.write(`${formatLine(level, message, fields)}\n`);
}

export const log = {
  info: (message: string, fields?: LogFields): void => write("INFO", message, fields),
  warn: (message: string, fields?: LogFields): void => write("WARNING", message, fields),
  error: (message: string, fields?: LogFields): void => write("ERROR", message, fields),
};
