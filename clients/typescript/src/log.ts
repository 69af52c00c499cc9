// One line per event on stderr, `<ISO time> <LEVEL> <message>`, as the Python runtime's text logs.

function line(level: string, message: string): void {
  process.stderr.write(`${new Date().toISOString()} ${level} rig-agent: ${message}\n`);
}

export const log = {
  info: (message: string): void => line("INFO", message),
  warn: (message: string): void => line("WARNING", message),
  error: (message: string): void => line("ERROR", message),
};
