import assert from "node:assert/strict";
import { test } from "node:test";

import { backoff, retry, retryAfter } from "../dist/retry.js";

test("backoff doubles from 0.5 s to 10 s, drawn from the upper half of its ceiling", () => {
  const ceilings = [500, 1000, 2000, 4000, 8000, 10000, 10000];
  ceilings.forEach((ceiling, i) => {
    assert.equal(backoff(i + 1, () => 0), ceiling / 2);
    assert.equal(backoff(i + 1, () => 0.999999), ceiling / 2 + 0.999999 * (ceiling / 2));
  });
  assert.equal(backoff(100, () => 1), 10000);
});

test("Retry-After: delta-seconds or an HTTP date, capped at 60 s", () => {
  const now = Date.parse("Sun, 29 Nov 2026 01:00:00 GMT");
  assert.equal(retryAfter("3", now), 3000);
  assert.equal(retryAfter(" 7 ", now), 7000);
  assert.equal(retryAfter("600", now), 60000);
  assert.equal(retryAfter("Sun, 29 Nov 2026 01:00:05 GMT", now), 5000);
  assert.equal(retryAfter("Sun, 29 Nov 2026 00:59:00 GMT", now), 0);
  assert.equal(retryAfter("Sun, 29 Nov 2026 02:00:00 GMT", now), 60000);
  for (const unreadable of [undefined, null, "", "soon", "-1", "1.5"]) {
    assert.equal(retryAfter(unreadable, now), undefined, String(unreadable));
  }
});

test("retry stops at its tries and rethrows what it must not retry", async () => {
  let calls = 0;
  const failing = async () => {
    calls += 1;
    throw new Error(`try ${calls}`);
  };
  await assert.rejects(retry(failing, { retryOn: () => true, tries: 3, delay: () => 1 }), /try 3/);
  assert.equal(calls, 3);
  calls = 0;
  await assert.rejects(retry(failing, { retryOn: () => false, delay: () => 1 }), /try 1/);
  assert.equal(calls, 1);
});

test("a stopped retry makes one last try, then gives up", async () => {
  const stop = new AbortController();
  stop.abort();
  let calls = 0;
  await assert.rejects(
    retry(async () => {
      calls += 1;
      throw new Error("down");
    }, { retryOn: () => true, stop: stop.signal }),
    /down/,
  );
  assert.equal(calls, 1);
});
