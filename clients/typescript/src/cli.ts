// `rig-agent`'s command line: arguments, the handler module, exit codes. Operator mistakes (a bad
// RIG_* value, a bad --handler, a consumer name in use, a Redis user without a right an agent
// needs) end with one line on stderr and exit 2, never a stack trace. Runs until SIGTERM/SIGINT
// (a second one abandons the entry in hand), then exits 0.
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import { MissingPermission } from "./access.js";
import { ConsumerInUse, LeaseLost, SettingsError } from "./errors.js";
import type { Handler } from "./entry.js";
import { runAgent } from "./index.js";
import { jsonText, log, setLogFormat } from "./log.js";
import { RedisUnavailable } from "./redis.js";
import { describe, loadSettings } from "./settings.js";
import { TokenFileError } from "./tokenFile.js";

const EXIT_OK = 0;
export const EXIT_FAILED = 1;
const EXIT_USAGE = 2;
const START_ID = /^(\$|\d+(-\d+)?)$/;
const USAGE = "usage: rig-agent --agent-id ID --group G [--stream S] [--start-id ID] --handler ./module.mjs[#name]";

class UsageError extends Error {}

export interface Arguments {
  agentId: string;
  group: string;
  stream: string | undefined;
  startId: string;
  handler: string;
}

export function parseArguments(argv: string[]): Arguments {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        "agent-id": { type: "string" },
        group: { type: "string" },
        stream: { type: "string" },
        "start-id": { type: "string" },
        handler: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    throw new UsageError(`${(error as Error).message.split("\n")[0] ?? ""}; ${USAGE}`);
  }
  if (values["help"]) throw new UsageError(USAGE);
  for (const name of ["agent-id", "group", "handler"]) {
    const given = values[name];
    if (typeof given !== "string" || given.trim() === "") throw new UsageError(`--${name} is required; ${USAGE}`);
  }
  const startId = (values["start-id"] as string | undefined) ?? "0";
  if (!START_ID.test(startId)) {
    throw new UsageError(`--start-id ${JSON.stringify(startId)}: must be 0, $ or a stream entry id like 1700000000000-0`);
  }
  return {
    agentId: values["agent-id"] as string,
    group: values["group"] as string,
    stream: values["stream"] as string | undefined,
    startId,
    handler: values["handler"] as string,
  };
}

/** `./module.mjs` (its default export) or `./module.mjs#name` (that export) -> the handler. */
export async function loadHandler(spec: string, cwd: string = process.cwd()): Promise<Handler> {
  const hash = spec.lastIndexOf("#");
  const specifier = hash >= 0 ? spec.slice(0, hash) : spec;
  const name = hash >= 0 ? spec.slice(hash + 1) : "default";
  if (specifier === "" || name === "") throw new UsageError(`--handler ${JSON.stringify(spec)}: expected ./module.mjs or ./module.mjs#name`);
  const local = specifier.startsWith(".") || specifier.startsWith("/") || existsSync(resolve(cwd, specifier));
  const target = local ? pathToFileURL(resolve(cwd, specifier)).href : specifier;
  let module: Record<string, unknown>;
  try {
    module = (await import(target)) as Record<string, unknown>;
  } catch (error) {
    const why = error instanceof Error ? `${error.name}: ${error.message.split("\n")[0] ?? ""}` : String(error);
    throw new UsageError(`--handler ${JSON.stringify(spec)}: cannot import ${specifier}: ${why}`);
  }
  const handler = module[name];
  if (handler === undefined) throw new UsageError(`--handler ${JSON.stringify(spec)}: ${specifier} has no export ${name}`);
  if (typeof handler !== "function") throw new UsageError(`--handler ${JSON.stringify(spec)}: ${name} is not a function`);
  return handler as Handler;
}

export async function main(argv: string[]): Promise<number> {
  let args: Arguments;
  let handler: Handler;
  let settings;
  try {
    args = parseArguments(argv);
    settings = loadSettings();
    setLogFormat(settings.logFormat);
    handler = await loadHandler(args.handler);
  } catch (error) {
    if (error instanceof UsageError || error instanceof SettingsError) {
      process.stderr.write(`rig-agent: ${error.message}\n`);
      return EXIT_USAGE;
    }
    throw error;
  }
  const stream = args.stream ?? settings.dispatchStream;
  log.info(
    `rig-agent ${args.agentId}: stream ${stream}, group ${args.group}, handler ${args.handler}, ` +
      `effective configuration: ${jsonText(describe(settings))}`,
  );
  const stop = new AbortController();
  const abandon = new AbortController();
  const received = (signal: NodeJS.Signals): void => {
    if (stop.signal.aborted) {
      log.warn(`${signal} again: abandoning the current entry`);
      abandon.abort();
      return;
    }
    log.info(`${signal} received: stopping after the current entry`);
    stop.abort();
  };
  process.on("SIGTERM", received);
  process.on("SIGINT", received);
  try {
    await runAgent(handler, {
      agentId: args.agentId,
      group: args.group,
      stream,
      startId: args.startId,
      signal: stop.signal,
      abandonSignal: abandon.signal,
      settings,
    });
  } catch (error) {
    if (error instanceof ConsumerInUse || error instanceof MissingPermission) {
      log.error(`Refusing to start: ${error.message}`);
      return EXIT_USAGE;
    }
    if (error instanceof TokenFileError) {
      log.error(`Refusing to start: RIG_API_TOKEN_FILE: ${error.message}`);
      return EXIT_USAGE;
    }
    if (error instanceof RedisUnavailable) {
      log.error(error.message);
      return EXIT_FAILED;
    }
    if (error instanceof LeaseLost) {
      log.error(error.message);
      return EXIT_FAILED;
    }
    const text = error instanceof Error ? `${error.name}: ${error.message.split("\n")[0] ?? ""}` : String(error);
    log.error(`Stopped: ${text}`);
    return EXIT_FAILED;
  }
  return EXIT_OK;
}

