// staccato-runtime/testing: handlers run in a unit test as the runtime runs
// them, and the package installs on its own (package.json).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { CallError, Context, FakeCalls, runHandler } from '../testing/handler.mjs';

test('sync and async handlers and what they may return', async () => {
  assert.equal((await runHandler((ctx, d) => d.toString().toUpperCase(), 'abc')).toString(), 'ABC');
  assert.equal((await runHandler(async (ctx, d) => Buffer.concat([Buffer.from('é'), d]), 'x')).toString(), 'éx');
  assert.equal((await runHandler(() => undefined)).length, 0);
  assert.equal((await runHandler(() => new Uint8Array([104, 105]))).toString(), 'hi');
  await assert.rejects(runHandler(() => 42), /returned Number/);
});

test('the context is a real one', async () => {
  let seen;
  await runHandler((ctx) => {
    seen = { ctx, fn: ctx.function, id: ctx.callId, parent: ctx.parentCallId, left: ctx.remainingMs() };
    ctx.logger.info('logged');
  }, '', { function: 'greet', timeoutMs: 5000, callId: 77n });
  assert.ok(seen.ctx instanceof Context);
  assert.deepEqual([seen.fn, seen.id, seen.parent], ['greet', 77n, 0n]);
  assert.ok(seen.left > 4000 && seen.left <= 5000, String(seen.left));
  await runHandler((ctx) => { seen = [ctx.deadline, ctx.remainingMs()]; });
  assert.deepEqual(seen, [null, null]);
});

test('calls are answered by the fakes and recorded', async () => {
  const calls = new FakeCalls({
    upper: async (d) => d.toString().toUpperCase(),
    fixed: 'F',
    down: new CallError('timeout', 'too slow'),
  });
  const out = await runHandler(async (ctx, d) => {
    const [a, b] = await Promise.all([ctx.call('upper', d), ctx.call('fixed')]);
    const kinds = [];
    for (const name of ['down', 'nobody']) {
      try {
        await ctx.call(name, '?');
      } catch (e) {
        assert.ok(e instanceof ctx.CallError);
        kinds.push(e.kind);
      }
    }
    return [a, b, ...kinds].join('|');
  }, 'hi', { calls });
  assert.equal(out.toString(), 'HI|F|timeout|not_found');
  assert.deepEqual(calls.made.map(([n, d]) => [n, d.toString()]).sort(),
    [['down', '?'], ['fixed', ''], ['nobody', '?'], ['upper', 'hi']]);
  const viaObject = await runHandler((ctx, d) => ctx.call('x', d), '1', { calls: { x: (d) => `${d}2` } });
  assert.equal(viaObject.toString(), '12');
});

test('a handler that throws or overruns fails', async () => {
  await assert.rejects(runHandler(() => { throw new RangeError('boom'); }), /boom/);
  await assert.rejects(runHandler(() => new Promise(() => {}), '', { timeoutMs: 50 }), /deadline/);
});

test('the package installs from the repository and brings the helper', { timeout: 120000 }, () => {
  const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'staccato-npm-'));
  try {
    const tgz = execFileSync('npm', ['pack', '--silent', '--pack-destination', tmp, here], { encoding: 'utf8' }).trim();
    const app = path.join(tmp, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), '{"name": "app", "private": true, "type": "module"}');
    execFileSync('npm', ['install', '--silent', '--offline', '--no-audit', '--no-fund', path.join(tmp, tgz.split('\n').pop())],
      { cwd: app });
    fs.writeFileSync(path.join(app, 't.mjs'),
      "import { runHandler } from 'staccato-runtime/testing'; import { CallError } from 'staccato-runtime';\n"
      + "const out = await runHandler((ctx, d) => Buffer.from(d).reverse(), 'abc');\n"
      + "if (typeof CallError !== 'function') throw new Error('no CallError');\nprocess.stdout.write(out);\n");
    assert.equal(execFileSync(process.execPath, ['t.mjs'], { cwd: app, encoding: 'utf8' }), 'cba');
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test('a trace context can be given', async () => {
  const handle = (ctx) => `${ctx.traceId} ${ctx.traceparent} ${ctx.tracestate}`;
  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  const out = await runHandler(handle, '', { traceparent: tp, tracestate: 'k=v' });
  assert.equal(out.toString(), `4bf92f3577b34da6a3ce929d0e0e4736 ${tp} k=v`);
  assert.equal((await runHandler(handle)).toString(), 'null null null');
  await assert.rejects(runHandler(handle, '', { traceparent: '00-short' }), /traceparent/);
});
