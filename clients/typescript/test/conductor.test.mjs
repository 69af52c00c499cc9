// How the conductor's answers are read (docs/protocol.md, "Every answer the agent can get").
import assert from "node:assert/strict";
import { test } from "node:test";

import { classify, ConductorRejected, ConductorUnavailable, isDone } from "../dist/conductor.js";

const headers = (map) => ({ get: (name) => map[name.toLowerCase()] ?? null });

test("2xx: accepted, with WORK_STARTED's attempt", () => {
  const answer = classify(202, { attempt: 3, state: "running" });
  assert.equal(answer.kind, "accepted");
  assert.equal(answer.attempt, 3);
  assert.equal(classify(201, { dlqStream: "rig:dispatch:dlq" }).data.dlqStream, "rig:dispatch:dlq");
});

test("409 fenced: done with outputs to publish, or a newer attempt", () => {
  const outputs = [{ staged: "/o/.a.1-0.a2.tmp", path: "/o/a" }, { nonsense: true }];
  const done = classify(409, { detail: "fenced: the entry is already done", attempt: 2, state: "done", outputs });
  assert.equal(done.kind, "fenced");
  assert.ok(isDone(done));
  assert.deepEqual(done.outputs, [{ staged: "/o/.a.1-0.a2.tmp", path: "/o/a" }]);
  const newer = classify(409, { detail: "fenced: a newer attempt owns this entry", attempt: 4, state: "running" });
  assert.equal(newer.kind, "fenced");
  assert.ok(!isDone(newer));
});

test("409 refused: never done, whatever its state says", () => {
  const refused = classify(409, { detail: "refused: consumer x does not hold entry 1-0", attempt: 2, state: "done" });
  assert.equal(refused.kind, "refused");
  assert.ok(!isDone(refused));
});

test("429, 502, 503, 504: unavailable, honouring Retry-After; others rejected", () => {
  for (const status of [429, 502, 503, 504]) {
    const failure = classify(status, { detail: "busy" }, headers({ "retry-after": "2" }));
    assert.ok(failure instanceof ConductorUnavailable, String(status));
    assert.equal(failure.retryAfterMs, 2000);
  }
  for (const status of [400, 401, 403, 404, 422, 500]) {
    assert.ok(classify(status, { detail: "no" }) instanceof ConductorRejected, String(status));
  }
  assert.match(classify(422, { detail: [{ loc: ["body", "outputs"] }] }).message, /^422 .*outputs/);
});
