// Finishing an entry: the completion and its staged files' publication, and the dead-letter path.
//
// A completion reports the files its attempt staged; the conductor records them with the
// acceptance. Only then are they renamed onto their paths, reported published (WORK_PUBLISHED),
// and the entry XACKed, in that order. A crash anywhere in between leaves the entry pending with
// its outputs recorded: whoever holds it next is answered `done` with the outputs still to
// publish, and finishes the publish (`recover`). A fenced attempt's files are discarded.
import { type Answer, type Conflict, ConductorClient, ConductorRejected, ConductorUnavailable, type WorkRef, isDone } from "./conductor.js";
import { log } from "./log.js";
import type { GroupReader } from "./reader.js";
import * as staging from "./staging.js";

/** What `recover` and `publish` say when the accepted outputs are found nowhere: the completion
 * does not count, and the entry runs again. */
export const REOPENED = "reopened";

export class Settler {
  constructor(
    private readonly reader: GroupReader,
    private readonly conductor: ConductorClient,
    private readonly stop: AbortSignal,
    private readonly onConductorDown: () => void,
  ) {}

  /** Ask the conductor to dead-letter the entry. One whose completion was accepted is published
   * and acked instead. Returns the outcome and, when done, the accepted attempt. */
  async deadLetter(ref: WorkRef, reason: string): Promise<[string, number | undefined]> {
    let answer: Answer;
    try {
      answer = await this.conductor.deadLetter(ref, reason);
    } catch (error) {
      if (error instanceof ConductorUnavailable) {
        this.onConductorDown();
        return [`left pending: DEAD_LETTER not answered (${error.message})`, undefined];
      }
      if (error instanceof ConductorRejected) return [`left pending: DEAD_LETTER rejected (${error.message})`, undefined];
      throw error;
    }
    if (answer.kind !== "accepted") {
      if (isDone(answer)) return [await this.recover(ref, answer), answer.attempt];
      return [`left pending: dead letter refused (${answer.detail})`, undefined];
    }
    const data = answer.data;
    return [
      `dead-lettered (${reason}) to ${String(data["dlqStream"])} after ${String(data["deliveries"])} deliveries`,
      undefined,
    ];
  }

  /** WORK_COMPLETED with the staged files; on acceptance their publication, then XACK. */
  async complete(ref: WorkRef, attempt: number, files: staging.StagedOutput[]): Promise<string> {
    if (files.length > 0) staging.flush(files);
    let answer: Answer;
    try {
      answer = await this.conductor.workCompleted(ref, attempt, files, this.stop);
    } catch (error) {
      if (error instanceof ConductorUnavailable) {
        // It may have been accepted without our hearing: the files stay staged, and whoever
        // holds the entry next is told whether to publish them.
        return `left pending: WORK_COMPLETED not answered (${error.message}); staged files kept`;
      }
      if (error instanceof ConductorRejected) {
        staging.discard(files);
        return `left pending: WORK_COMPLETED rejected (${error.message}); staged files discarded`;
      }
      throw error;
    }
    if (answer.kind !== "accepted" && !(isDone(answer) && answer.attempt === attempt)) {
      staging.discard(files);
      return `fenced at completion: attempt ${answer.attempt} (${answer.state}) owns it; staged files discarded, not acked`;
    }
    // Accepted; or this very attempt is done already: a retry whose first try was accepted
    // before its answer was lost. Its files are the accepted ones.
    return "completed" + (await this.publish(ref, attempt, files));
  }

  /** The entry is done: `answer.attempt` was accepted. Publish its outputs not published yet (a
   * crash interrupted it), then ack. Publishing twice renames nothing twice. */
  async recover(ref: WorkRef, answer: Conflict): Promise<string> {
    let files: staging.StagedOutput[];
    try {
      files = staging.fromOutputs(answer.outputs, answer.attempt);
    } catch (error) {
      log.error(`Refused the recorded outputs of ${ref.entryId}: ${(error as Error).message}`);
      return `left pending: recorded outputs refused (${(error as Error).message})`;
    }
    if (files.length === 0) {
      await this.reader.ack(ref.entryId);
      return "already done: acked";
    }
    return "already done" + (await this.publish(ref, answer.attempt, files));
  }

  /** Rename the accepted attempt's files onto their paths, report them published, XACK. Without
   * the report the entry stays pending, and the next holder publishes them. */
  async publish(ref: WorkRef, attempt: number, files: staging.StagedOutput[]): Promise<string> {
    const committed = staging.commit(files);
    if (files.length > 0) {
      let answer: Answer;
      try {
        answer = await this.conductor.workPublished(ref, attempt, committed.lost, this.stop);
      } catch (error) {
        if (error instanceof ConductorUnavailable || error instanceof ConductorRejected) {
          return `; outputs renamed: ${committed.renamed}, WORK_PUBLISHED not recorded (${error.message}); not acked`;
        }
        throw error;
      }
      if (committed.lost.length > 0) {
        const state = answer.kind === "accepted" ? "the entry runs again" : `${answer.state}: ${answer.detail}`;
        return `; ${REOPENED}: staged outputs found nowhere (${committed.lost.join(", ")}), so attempt ${attempt} does not count (${state})`;
      }
      if (answer.kind !== "accepted") return `; outputs renamed, WORK_PUBLISHED refused (${answer.detail}); not acked`;
      staging.removeLeftovers(files, ref.entryId, attempt);
    }
    await this.reader.ack(ref.entryId);
    if (files.length === 0) return "";
    return `; staged files published: ${committed.renamed} (already ${committed.already})`;
  }
}
