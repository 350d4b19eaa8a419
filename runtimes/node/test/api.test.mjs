// The public names (index.mjs) and small pure helpers.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { CallError, Context, ERROR_NAMES, ErrorKind } from '../index.mjs';
import { wallMs } from '../context.mjs';
import { nextSeq } from '../runtime.mjs';

test('ErrorKind matches docs/protocol.md "Error kinds"', () => {
  assert.deepEqual({ ...ErrorKind }, {
    not_found: 1, payload_too_large: 2, function_error: 3, worker_crashed: 4, timeout: 5,
    engine_unavailable: 6, bad_request: 7, internal: 8, out_of_memory: 9, output_too_large: 10,
    call_cycle: 11, call_depth_exceeded: 12, function_removed: 13, overloaded: 14,
  });
  for (const [name, code] of Object.entries(ErrorKind)) assert.equal(ERROR_NAMES[code], name);
  assert.ok(Object.isFrozen(ErrorKind));
});

test('CallError carries kind, message and code', () => {
  const e = new CallError('timeout', 'too slow');
  assert.ok(e instanceof Error);
  assert.equal(e.name, 'CallError');
  assert.equal(e.kind, 'timeout');
  assert.equal(e.message, 'too slow');
  assert.equal(e.code, 5);
  assert.equal(String(e), 'CallError: timeout: too slow');
  assert.equal(String(new CallError('internal')), 'CallError: internal');
  assert.equal(new CallError('bogus').code, undefined);
});

test('Context exposes the call fields and the deadline helpers', () => {
  const fake = { runtime: { function: 'f' }, workerId: 3 };
  const deadlineUs = BigInt(Date.now() + 10_000) * 1000n;
  const ctx = new Context(fake, 0x0000000300000001n, 1n << 63n, deadlineUs);
  assert.equal(ctx.function, 'f');
  assert.equal(ctx.workerId, 3);
  assert.equal(ctx.deadline.getTime(), Number(deadlineUs / 1000n));
  assert.ok(ctx.remainingMs() > 9000 && ctx.remainingMs() <= 10_000);
  assert.equal(ctx.CallError, CallError);
  const none = new Context(fake, 1n, 0n, 0n);
  assert.equal(none.deadline, null);
  assert.equal(none.remainingMs(), null);
  const past = new Context(fake, 1n, 0n, 1000n);
  assert.equal(past.remainingMs(), 0);
});

test('call sequence numbers wrap from 2^32 - 1 to 1, never 0', () => {
  assert.equal(nextSeq(0), 1);
  assert.equal(nextSeq(41), 42);
  assert.equal(nextSeq(2 ** 32 - 2), 2 ** 32 - 1);
  assert.equal(nextSeq(2 ** 32 - 1), 1);
});

test('wallMs: sub-millisecond wall clock, within 1 ms behind and 2 ms ahead of Date.now()', () => {
  let fractional = false;
  for (let i = 0; i < 1000; i++) {
    const before = Date.now();
    const t = wallMs();
    const after = Date.now();
    // wallMs re-bases when it strays from (Date.now() - 1, Date.now() + 2):
    // the monotonic clock it reads drifts from the wall clock.
    assert.ok(t >= before - 1 && t < after + 2.01, `${before} ${t} ${after}`);
    if (t !== Math.floor(t)) fractional = true;
  }
  assert.ok(fractional);
});
