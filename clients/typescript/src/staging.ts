// Staged file writes: a handler writes beside the final path, the runtime renames on acceptance.
//
// The names are the protocol's (`/dir/.<name>.<entryId>.a<attempt>.tmp`, `name` cut to 200
// characters), exactly as the Python runtime and the conductor compute them. Publishing is
// idempotent; nothing here decides whether to publish: the runtime does.
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, renameSync, unlinkSync } from "node:fs";
import { posix, resolve } from "node:path";

import { log } from "./log.js";

export const STAGED_NAME_MAX = 200;
const STAGED_SUFFIX = /^\.([0-9]{1,20}-[0-9]{1,20})\.a([0-9]{1,9})\.tmp$/;

export interface StagedOutput {
  staged: string;
  path: string;
}

/** The first `n` characters (code points, as Python counts them) of `text`. */
function cut(text: string, n: number): string {
  const points = Array.from(text);
  return points.length <= n ? text : points.slice(0, n).join("");
}

function split(path: string): [string, string] {
  // posixpath.split: the head keeps no trailing slash unless it is all slashes.
  const at = path.lastIndexOf("/") + 1;
  let head = path.slice(0, at);
  const tail = path.slice(at);
  if (head && !/^\/+$/.test(head)) head = head.replace(/\/+$/, "");
  return [head, tail];
}

function join(directory: string, name: string): string {
  if (directory === "") return name;
  return directory.endsWith("/") ? directory + name : `${directory}/${name}`;
}

/** Where attempt `attempt` of `entryId` stages the file it publishes at `path`. */
export function stagedPath(path: string, entryId: string, attempt: number): string {
  const [directory, base] = split(path);
  return join(directory, `.${cut(base, STAGED_NAME_MAX)}.${entryId}.a${attempt}.tmp`);
}

function normalised(path: string): boolean {
  return posix.isAbsolute(path) && !path.endsWith("/") && posix.normalize(path) === path;
}

/** `(staged, path)` as a recorded output of attempt `attempt`; throws saying why not: `path`
 * absolute and normalised, naming a file; `staged` the staging path of that attempt (of any
 * entry id: a dispatch appended again after Redis lost its data keeps the old entry's). */
export function stagedOutput(staged: string, path: string, attempt: number): StagedOutput {
  if ((staged + path).includes("\0") || !normalised(path)) {
    throw new Error(`path ${JSON.stringify(path)} is not absolute and normalised`);
  }
  const [directory, base] = split(path);
  if (base === "") throw new Error(`path ${JSON.stringify(path)} names no file`);
  const prefix = join(directory, `.${cut(base, STAGED_NAME_MAX)}`);
  const suffix = staged.startsWith(prefix) ? STAGED_SUFFIX.exec(staged.slice(prefix.length)) : null;
  if (suffix === null || Number(suffix[2]) !== attempt) {
    const expected = stagedPath(path, "<entryId>", attempt);
    throw new Error(`staged file ${JSON.stringify(staged)} is not ${JSON.stringify(expected)}`);
  }
  return { staged, path };
}

/** The files one attempt of one entry staged, in the order first staged. */
export class Staging {
  private readonly files = new Map<string, string>(); // final -> staged
  private closed = false;

  constructor(
    readonly entryId: string,
    readonly attempt: number,
  ) {}

  stage(path: string): string {
    const final = resolve(path);
    const [directory, base] = split(final);
    if (base === "" || final === directory) throw new Error(`cannot stage ${path}: not a file path`);
    if (this.closed) throw new Error("stage() called after the handler returned");
    let staged = this.files.get(final);
    if (staged === undefined) {
      staged = stagedPath(final, this.entryId, this.attempt);
      this.files.set(final, staged);
    }
    mkdirSync(directory, { recursive: true });
    return staged;
  }

  /** No more staging; the files staged. */
  close(): StagedOutput[] {
    this.closed = true;
    return [...this.files].map(([path, staged]) => ({ staged, path }));
  }
}

function code(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException).code;
}

/** fsync each staged file, so a rename never publishes data still in the page cache. */
export function flush(files: readonly StagedOutput[]): void {
  for (const file of files) {
    let fd: number;
    try {
      fd = openSync(file.staged, "r");
    } catch (error) {
      if (code(error) === "ENOENT") continue;
      throw error;
    }
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
}

export interface Committed {
  renamed: number;
  already: number; // an earlier publish (maybe by another runtime) renamed it
  lost: string[]; // final paths whose staged file exists nowhere and that do not exist either
}

/** Rename every staged file onto its path (rename(2): atomic), then fsync the directories.
 * Idempotent: a staged file that is gone while its path exists was published before. */
export function commit(files: readonly StagedOutput[]): Committed {
  const result: Committed = { renamed: 0, already: 0, lost: [] };
  const directories = new Set<string>();
  for (const file of files) {
    try {
      renameSync(file.staged, file.path);
    } catch (error) {
      if (code(error) !== "ENOENT") throw error;
      if (existsSync(file.path)) {
        result.already += 1;
      } else {
        result.lost.push(file.path);
        log.warn(`Staged file ${file.staged} is gone and ${file.path} does not exist`);
      }
      continue;
    }
    result.renamed += 1;
    directories.add(split(file.path)[0]);
  }
  for (const directory of directories) fsyncDirectory(directory);
  return result;
}

function fsyncDirectory(directory: string): void {
  let fd: number;
  try {
    fd = openSync(directory, "r");
  } catch {
    return;
  }
  try {
    fsyncSync(fd);
  } catch {
    // not every filesystem fsyncs directories
  } finally {
    closeSync(fd);
  }
}

/** Remove the staged files of an attempt that will never be published. */
export function discard(files: readonly StagedOutput[]): number {
  let removed = 0;
  for (const file of files) {
    try {
      unlinkSync(file.staged);
      removed += 1;
    } catch (error) {
      if (code(error) !== "ENOENT") throw error;
    }
  }
  return removed;
}

/** Remove other attempts' staged files for the same paths of the same entry (an attempt killed
 * mid-handler never reported them, so once the entry is done nothing can publish them). */
export function removeLeftovers(files: readonly StagedOutput[], entryId: string, keepAttempt: number): number {
  let removed = 0;
  for (const file of files) {
    const [directory, base] = split(file.path);
    const prefix = `.${cut(base, STAGED_NAME_MAX)}.${entryId}.a`;
    let names: string[];
    try {
      names = readdirSync(directory || ".");
    } catch {
      continue;
    }
    for (const name of names) {
      if (!name.startsWith(prefix) || !name.endsWith(".tmp")) continue;
      const attempt = name.slice(prefix.length, -".tmp".length);
      if (/^\d+$/.test(attempt) && Number(attempt) !== keepAttempt) {
        try {
          unlinkSync(join(directory, name));
          removed += 1;
        } catch {
          // gone meanwhile
        }
      }
    }
  }
  return removed;
}

/** The outputs the conductor recorded for `attempt`, as files to publish; throws when one is not
 * a staging path of its path for that attempt: nothing is renamed then. */
export function fromOutputs(recorded: readonly StagedOutput[], attempt: number): StagedOutput[] {
  return recorded.map((o) => stagedOutput(o.staged, o.path, attempt));
}
