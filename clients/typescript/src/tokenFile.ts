// The bearer token read from a file that may be replaced at any time (RIG_API_TOKEN_FILE).
//
// The kubelet rotates a projected ServiceAccount token by swapping the volume's `..data` symlink,
// so the path keeps its name while the file behind it changes. `current()` stats the path
// (following symlinks) before every request and reads it again when its inode, size or mtime
// moved; after a 401, `refresh()` reads it again whatever the stat says, at most every 5 s.
import { readFileSync, statSync } from "node:fs";

export const REREAD_INTERVAL_MS = 5_000;

export class TokenFileError extends Error {
  override name = "TokenFileError";
}

/** The token in `path`, surrounding whitespace stripped. Throws TokenFileError. */
export function readToken(path: string): string {
  let token: string;
  try {
    token = new TextDecoder("utf-8", { fatal: true }).decode(readFileSync(path)).trim();
  } catch (error) {
    if (error instanceof TypeError) throw new TokenFileError(`${path} does not hold a text token`);
    const code = (error as NodeJS.ErrnoException).code ?? String(error);
    throw new TokenFileError(`cannot read ${path}: ${code}`);
  }
  if (token === "") throw new TokenFileError(`${path} is empty`);
  return token;
}

function stamp(path: string): string | null {
  try {
    const st = statSync(path, { bigint: true });
    return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}`;
  } catch {
    return null;
  }
}

export class TokenFile {
  private token: string;
  private stamp: string | null;
  private readAt: number;

  constructor(
    readonly path: string,
    private readonly rereadIntervalMs: number = REREAD_INTERVAL_MS,
    private readonly clock: () => number = () => performance.now(),
  ) {
    this.stamp = stamp(path);
    this.token = readToken(path);
    this.readAt = clock();
  }

  /** The token, read again first when the file behind the path has changed. */
  current(): string {
    const now = stamp(this.path);
    if (now !== null && now !== this.stamp) this.reload(now);
    return this.token;
  }

  /** Read again after the token was refused; true when the file now holds another. */
  refresh(): boolean {
    if (this.clock() - this.readAt < this.rereadIntervalMs) return false;
    const before = this.token;
    this.reload(stamp(this.path));
    return this.token !== before;
  }

  private reload(now: string | null): void {
    this.readAt = this.clock();
    let token: string;
    try {
      token = readToken(this.path);
    } catch (error) {
      // Mid-rotation or a broken mount: the previous token may still be valid for a while.
      console.warn(`Keeping the previous API token: ${(error as Error).message}`);
      return;
    }
    if (token !== this.token) console.info(`API token read again from ${this.path} (the file changed)`);
    this.token = token;
    this.stamp = now;
  }
}
