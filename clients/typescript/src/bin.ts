#!/usr/bin/env node
// `rig-agent`: run an agent from the command line (see `cli.ts`).
import { main } from "./cli.js";

// Exit once stopped, whatever a handler left running (an abandoned handler may never settle).
main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`rig-agent: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exit(1);
  },
);
