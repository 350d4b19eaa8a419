// Live tests: the fake engine (../testing/fake_engine.mjs) plays the engine
// against a real `node launcher.mjs` process. FIFOs, shm files and the
// launcher are real; every wait has a timeout.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Engine, GATEWAY, TIMEOUT_MS, withTimeout } from '../testing/fake_engine.mjs';
import {
  COMPLETION, DISPATCH, FAILURE, INVOKE, STOP_WORKER, encode,
} from '../wire.mjs';

const T = { timeout: 4 * TIMEOUT_MS };

const HANDLER = `
import fs from 'node:fs';

function split(data) {
  const sp = data.indexOf(0x20);
  return sp < 0 ? [data.toString(), Buffer.alloc(0)] : [data.subarray(0, sp).toString(), data.subarray(sp + 1)];
}

export async function handle(ctx, data) {
  const [cmd, arg] = split(data);
  switch (cmd) {
    case 'echo': return arg;
    case 'str': return arg.toString() + '!';
    case 'longstr': return 'é'.repeat(Number(arg));
    case 'none': return undefined;
    case 'null': return null;
    case 'u8': return new Uint8Array(arg);
    case 'ab': return new Uint8Array(arg).buffer;
    case 'big': return Buffer.alloc(Number(arg), 'x');
    case 'raise': throw new TypeError('boom');
    case 'throwstr': throw 'plain string';
    case 'longerr': throw new Error('é'.repeat(600));
    case 'badtype': return 42;
    case 'ctx': return JSON.stringify({
      callId: ctx.callId.toString(), parent: ctx.parentCallId.toString(), deadlineUs: ctx.deadlineUs.toString(),
      deadline: ctx.deadline && ctx.deadline.getTime(), remaining: ctx.remainingMs(), function: ctx.function,
      workerId: ctx.workerId, types: [typeof ctx.callId, typeof ctx.parentCallId, typeof ctx.deadlineUs],
      traceId: ctx.traceId, traceparent: ctx.traceparent, tracestate: ctx.tracestate, input: arg.length,
    });
    case 'call': {
      const [name, payload] = split(arg);
      return Buffer.concat([Buffer.from('got:'), await ctx.call(name, payload)]);
    }
    case 'callstr': return 'got:' + (await ctx.call('s', arg.toString())).toString();
    case 'callbig': {
      const out = await ctx.call('big', Buffer.alloc(Number(arg), 'i'));
      return String(out.length);
    }
    case 'fanout': {
      const outs = await Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map((i) => ctx.call('f' + i, String(i))));
      return outs.map((b) => b.toString()).join(',');
    }
    case 'many': {
      const n = Number(arg);
      const outs = await Promise.all(Array.from({ length: n }, (_, i) => ctx.call('m', String(i))));
      return String(outs.reduce((s, b) => s + Number(b.toString()), 0));
    }
    case 'callerr':
      try {
        await ctx.call('nope', '');
        return 'no error';
      } catch (e) {
        return [e instanceof ctx.CallError, e.name, e.kind, e.code, e.message].join('|');
      }
    case 'uncaught': await ctx.call('nope'); return 'unreachable';
    case 'badname':
      try {
        await ctx.call('n'.repeat(65));
      } catch (e) {
        return e.name;
      }
      return 'no error';
    case 'log':
      ctx.log('hello %s', arg.toString());
      ctx.logger.warn('two\\nlines');
      return 'logged';
    case 'pending': {
      // arg: a file recording what happened to a call cut off by close
      let result;
      try {
        await ctx.call('slow', '');
        result = 'completed';
      } catch (e) {
        result = e.kind;
      }
      fs.writeFileSync(arg.toString(), result);
      return '';
    }
    default: return 'unknown command ' + cmd;
  }
}

export function syncHandle(ctx, data) {
  if (data.toString() === 'raise') throw new RangeError('r');
  return data.toString().toUpperCase();
}

export function echo(ctx, data) {
  return data;
}
`;

let nextId = 1n;
const gwId = () => GATEWAY | nextId++;
const futureUs = (s) => BigInt(Date.now() + s * 1000) * 1000n;

function isZero(buf, from) {
  for (let i = from; i < buf.length; i++) if (buf[i] !== 0) return false;
  return true;
}

describe('launcher (shared engine)', T, () => {
  let eng;
  before(async () => {
    eng = new Engine({ files: { 'handler.mjs': HANDLER } });
    await eng.hello();
  });
  after(async () => {
    await eng.close();
  });

  test('handshakes: WorkerHello names the worker and the pid', async () => {
    const w = await eng.createWorker();
    assert.ok(w.workerId >= 1);
  });

  test('echo small, inline', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    const msg = await eng.call(w, 'echo hello', cid);
    assert.equal(msg.kind, COMPLETION);
    assert.equal(msg.inShm, false);
    assert.equal(msg.inline.toString(), 'hello');
    assert.equal(msg.payloadLen, 5);
    assert.equal(msg.workerId, w.workerId);
  });

  test('result types', async () => {
    const w = await eng.createWorker();
    const cases = [['str abc', 'abc!'], ['none', ''], ['null', ''], ['u8 xyz', 'xyz'], ['ab q', 'q'],
      ['longstr 320', 'é'.repeat(320)], ['longstr 480', 'é'.repeat(480)], ['longstr 481', 'é'.repeat(481)]];
    for (const [cmd, want] of cases) {
      const msg = await eng.call(w, cmd, gwId());
      assert.equal(msg.kind, COMPLETION, cmd);
      assert.equal(eng.payload(msg, 'o').toString(), want, cmd);
    }
  });

  test('1 MiB through shm both ways, files unlinked', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    const data = Buffer.alloc(1 << 20);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7919) & 0xff;
    const msg = await eng.call(w, Buffer.concat([Buffer.from('echo '), data]), cid);
    assert.equal(msg.kind, COMPLETION);
    assert.ok(msg.inShm);
    assert.equal(msg.payloadLen, data.length);
    assert.equal(fs.existsSync(eng.shmPath(cid, 'i')), false, 'input file consumed');
    assert.equal(fs.statSync(eng.shmPath(cid, 'o')).mode & 0o777, 0o600);
    assert.ok(eng.payload(msg, 'o').equals(data));
    assert.deepEqual(fs.readdirSync(eng.shm), []);
  });

  test('exactly 960 output bytes stay inline, 961 go to shm', async () => {
    const w = await eng.createWorker();
    let msg = await eng.call(w, 'big 960', gwId());
    assert.equal(msg.inShm, false);
    assert.ok(msg.inline.equals(Buffer.alloc(960, 'x')));
    msg = await eng.call(w, 'big 961', gwId());
    assert.ok(msg.inShm);
    assert.ok(eng.payload(msg, 'o').equals(Buffer.alloc(961, 'x')));
  });

  test('serial calls on one worker; unused inline bytes are zero', async () => {
    const w = await eng.createWorker();
    await eng.call(w, `echo ${'y'.repeat(900)}`, gwId());
    for (let i = 0; i < 50; i++) {
      const msg = await eng.call(w, `echo ${i}`, gwId());
      assert.equal(msg.inline.toString(), String(i));
      assert.ok(isZero(encode(msg), 64 + msg.payloadLen));
    }
  });

  test('context fields', async () => {
    const w = await eng.createWorker();
    const cid = (BigInt(w.workerId) << 32n) | 77n; // an internal call dispatched to us
    const deadlineUs = futureUs(30);
    let msg = await eng.call(w, 'ctx', cid, { parent: GATEWAY | 5n, deadlineUs });
    let info = JSON.parse(msg.inline.toString());
    assert.equal(info.callId, cid.toString());
    assert.equal(info.parent, (GATEWAY | 5n).toString());
    assert.equal(info.deadlineUs, deadlineUs.toString());
    assert.equal(info.deadline, Number(deadlineUs / 1000n));
    assert.ok(info.remaining > 25_000 && info.remaining <= 30_000, String(info.remaining));
    assert.equal(info.function, 'fn');
    assert.equal(info.workerId, w.workerId);
    assert.deepEqual(info.types, ['bigint', 'bigint', 'bigint']);
    msg = await eng.call(w, 'ctx', gwId());
    info = JSON.parse(msg.inline.toString());
    assert.equal(info.deadline, null);
    assert.equal(info.remaining, null);
    assert.equal(info.parent, '0');
    assert.equal(info.deadlineUs, '0');
    assert.deepEqual([info.traceId, info.traceparent, info.tracestate], [null, null, null]);
  });

  test('the trace context before the input, inline and with the input in shm', async () => {
    const w = await eng.createWorker();
    const trace = Buffer.concat([
      Buffer.from('4bf92f3577b34da6a3ce929d0e0e4736' + '00f067aa0ba902b7' + '01', 'hex'), Buffer.from('rojo=1,congo=2'),
    ]);
    for (const size of [3, 2000]) {
      const msg = await eng.call(w, 'ctx ' + 'x'.repeat(size), gwId(), { trace });
      const info = JSON.parse(eng.payload(msg, 'o').toString());
      assert.equal(info.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
      assert.equal(info.traceparent, '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
      assert.equal(info.tracestate, 'rojo=1,congo=2');
      assert.equal(info.input, size);
    }
    const unsampled = Buffer.concat([trace.subarray(0, 24), Buffer.from([0])]);
    const info = JSON.parse((await eng.call(w, 'ctx', gwId(), { trace: unsampled })).inline.toString());
    assert.ok(info.traceparent.endsWith('-00'));
    assert.equal(info.tracestate, null);
  });

  test('a handler that throws sends function_error with name: message, stack to stderr', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    const msg = await eng.call(w, 'raise', cid);
    assert.equal(msg.kind, FAILURE);
    assert.equal(msg.errorKind, 3);
    assert.equal(msg.inline.toString(), 'TypeError: boom');
    const log = eng.stderr;
    assert.match(log, new RegExp(`\\[fn ${cid.toString(16)}\\] ERROR handler failed: TypeError: boom`));
    assert.match(log, /handler\.mjs:\d+/); // the stack
  });

  test('other failures: non-Error throw, bad result type, long message cut to 960 bytes', async () => {
    const w = await eng.createWorker();
    let msg = await eng.call(w, 'throwstr', gwId());
    assert.equal(msg.errorKind, 3);
    assert.equal(msg.inline.toString(), 'plain string');
    msg = await eng.call(w, 'badtype', gwId());
    assert.equal(msg.errorKind, 3);
    assert.match(msg.inline.toString(), /^TypeError: handler returned number/);
    msg = await eng.call(w, 'longerr', gwId());
    assert.equal(msg.errorKind, 3);
    assert.equal(msg.inShm, false);
    assert.ok(msg.payloadLen <= 960);
    const text = msg.inline.toString();
    assert.ok(text.startsWith('Error: éé') && text.endsWith('é...'), text.slice(-10));
    assert.ok(!text.includes('\ufffd'));
  });

  test('the worker survives a failure', async () => {
    const w = await eng.createWorker();
    await eng.call(w, 'raise', gwId());
    assert.equal((await eng.call(w, 'echo ok', gwId())).inline.toString(), 'ok');
  });

  test('ctx.log / ctx.logger write prefixed lines to stderr', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    assert.equal((await eng.call(w, 'log world', cid)).inline.toString(), 'logged');
    const prefix = `[fn ${cid.toString(16).padStart(16, '0')}] `;
    const lines = eng.stderr.split('\n');
    assert.ok(lines.includes(`${prefix}hello world`));
    assert.ok(lines.includes(`${prefix}WARN two`));
    assert.ok(lines.includes(`${prefix}WARN lines`));
  });

  // -- internal calls (ctx.call) ------------------------------------------

  test('ctx.call sends an Invoke; the Completion is its output', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    const deadlineUs = futureUs(30);
    eng.dispatch(w, 'call x ping', cid, { deadlineUs });
    let inv = await w.recv();
    assert.equal(inv.kind, INVOKE);
    assert.equal(inv.inShm, false);
    assert.equal(inv.inline.subarray(0, inv.nameLen).toString(), 'x');
    assert.equal(eng.payload(inv, 'i').toString(), 'ping');
    assert.equal(inv.parentCallId, cid);
    assert.equal(inv.deadlineUs, deadlineUs);
    assert.equal(inv.workerId, w.workerId);
    assert.ok(inv.sendTsNs > 0n);
    // call id layout: (worker_id << 32) | seq, seq from 1 per channel.
    assert.equal(inv.callId, (BigInt(w.workerId) << 32n) | 1n);
    eng.reply(w, inv.callId, 'pong');
    let msg = await w.recv();
    assert.equal(msg.kind, COMPLETION);
    assert.equal(msg.callId, cid);
    assert.equal(msg.inline.toString(), 'got:pong');

    // The per-channel sequence goes on; an empty input is name only.
    eng.dispatch(w, 'call y ', gwId());
    inv = await w.recv();
    assert.equal(inv.callId, (BigInt(w.workerId) << 32n) | 2n);
    assert.equal(inv.payloadLen, 1);
    assert.equal(inv.nameLen, 1);
    eng.reply(w, inv.callId, '');
    assert.equal((await w.recv()).inline.toString(), 'got:');

    // String input.
    eng.dispatch(w, 'callstr héllo', gwId());
    inv = await w.recv();
    assert.equal(eng.payload(inv, 'i').toString(), 'héllo');
    eng.reply(w, inv.callId, 'ok');
    assert.equal((await w.recv()).inline.toString(), 'got:ok');
  });

  test('ctx.call with large input and output uses shm', async () => {
    const w = await eng.createWorker();
    eng.dispatch(w, 'callbig 2000000', gwId());
    const inv = await w.recv();
    assert.equal(inv.kind, INVOKE);
    assert.ok(inv.inShm);
    assert.equal(inv.nameLen, 3);
    assert.equal(inv.inline.toString(), 'big');
    assert.equal(inv.payloadLen, 2_000_000);
    assert.ok(eng.payload(inv, 'i').equals(Buffer.alloc(2_000_000, 'i')));
    eng.reply(w, inv.callId, Buffer.alloc(3_000_000, 'o'));
    const msg = await w.recv();
    assert.equal(msg.kind, COMPLETION);
    assert.equal(msg.inline.toString(), '3000000');
    assert.equal(fs.existsSync(eng.shmPath(inv.callId, 'o')), false, 'launcher unlinked the reply file');
    assert.deepEqual(fs.readdirSync(eng.shm), []);
  });

  test('ctx.call: name + input of exactly 960 bytes inline, 961 via shm', async () => {
    const w = await eng.createWorker();
    eng.dispatch(w, `call abc ${'z'.repeat(957)}`, gwId());
    let inv = await w.recv();
    assert.equal(inv.inShm, false);
    assert.equal(inv.payloadLen, 960);
    eng.reply(w, inv.callId, '1');
    assert.equal((await w.recv()).inline.toString(), 'got:1');
    eng.dispatch(w, `call abc ${'z'.repeat(958)}`, gwId());
    inv = await w.recv();
    assert.ok(inv.inShm);
    assert.equal(inv.payloadLen, 958);
    assert.equal(inv.inline.toString(), 'abc');
    assert.equal(eng.payload(inv, 'i').toString(), 'z'.repeat(958));
    eng.reply(w, inv.callId, '2');
    assert.equal((await w.recv()).inline.toString(), 'got:2');
  });

  test('8 concurrent calls answered out of order', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    eng.dispatch(w, 'fanout', cid);
    const invokes = [];
    for (let i = 0; i < 8; i++) invokes.push(await w.recv());
    assert.ok(invokes.every((m) => m.kind === INVOKE && m.parentCallId === cid));
    assert.equal(new Set(invokes.map((m) => m.callId)).size, 8);
    const byName = new Map(invokes.map((m) => [m.inline.subarray(0, m.nameLen).toString(), m]));
    assert.deepEqual([...byName.keys()].sort(), ['f0', 'f1', 'f2', 'f3', 'f4', 'f5', 'f6', 'f7']);
    for (const i of [5, 2, 7, 0, 3, 6, 1, 4]) {
      const inv = byName.get(`f${i}`);
      eng.reply(w, inv.callId, `r${eng.payload(inv, 'i')}`);
    }
    const msg = await w.recv();
    assert.equal(msg.kind, COMPLETION);
    assert.equal(msg.callId, cid);
    assert.equal(msg.inline.toString(), 'r0,r1,r2,r3,r4,r5,r6,r7');
  });

  test('a fan-out larger than the FIFO (engine not reading) is queued, in order', async () => {
    const w = await eng.createWorker();
    w.pause();
    eng.dispatch(w, 'many 300', gwId());
    await new Promise((r) => setTimeout(r, 300)); // the launcher fills w2e and queues the rest
    w.resume();
    const seen = [];
    for (let i = 0; i < 300; i++) {
      const inv = await w.recv();
      assert.equal(inv.kind, INVOKE);
      seen.push(Number(inv.callId & 0xffffffffn));
      eng.reply(w, inv.callId, eng.payload(inv, 'i'));
    }
    assert.deepEqual(seen, Array.from({ length: 300 }, (_, i) => i + 1));
    const msg = await w.recv();
    assert.equal(msg.inline.toString(), String((299 * 300) / 2));
    assert.match(eng.stderr, new RegExp(`channel ${w.workerId}: w2e is full`));
    // Back to direct writes.
    assert.equal((await eng.call(w, 'echo after', gwId())).inline.toString(), 'after');
  });

  test('a Failure reply rejects with CallError', async () => {
    const w = await eng.createWorker();
    eng.dispatch(w, 'callerr', gwId());
    const inv = await w.recv();
    assert.equal(inv.inline.subarray(0, inv.nameLen).toString(), 'nope');
    eng.reply(w, inv.callId, "no function 'nope'", 1);
    assert.equal((await w.recv()).inline.toString(), "true|CallError|not_found|1|no function 'nope'");
  });

  test('an uncaught CallError is function_error', async () => {
    const w = await eng.createWorker();
    const cid = gwId();
    eng.dispatch(w, 'uncaught', cid);
    const inv = await w.recv();
    eng.reply(w, inv.callId, 'too slow', 5);
    const msg = await w.recv();
    assert.equal(msg.kind, FAILURE);
    assert.equal(msg.callId, cid);
    assert.equal(msg.errorKind, 3);
    assert.equal(msg.inline.toString(), 'CallError: timeout: too slow');
  });

  test('an invalid callee name rejects with RangeError, nothing sent', async () => {
    const w = await eng.createWorker();
    assert.equal((await eng.call(w, 'badname', gwId())).inline.toString(), 'RangeError');
  });

  test('a late reply for an unknown call is dropped, its shm file unlinked', async () => {
    const w = await eng.createWorker();
    const stray = (BigInt(w.workerId) << 32n) | 999n;
    eng.reply(w, stray, Buffer.alloc(5000, 'z'));
    eng.reply(w, stray + 1n, 'inline stray', 5);
    assert.equal((await eng.call(w, 'echo still', gwId())).inline.toString(), 'still');
    assert.deepEqual(fs.readdirSync(eng.shm), []);
  });

  test('invalid and unexpected messages are logged and dropped', async () => {
    const w = await eng.createWorker();
    const bad = encode({ kind: DISPATCH, payloadLen: 5, callId: gwId(), workerId: w.workerId, inline: 'hello' });
    bad[60] = 1; // reserved byte
    fs.writeSync(w.e2w, bad);
    w.send({ kind: INVOKE, payloadLen: 1, nameLen: 1, callId: 1n, inline: 'x' });
    assert.equal((await eng.call(w, 'echo fine', gwId())).inline.toString(), 'fine');
    assert.match(eng.stderr, /dropping invalid message: reserved header byte 60/);
    assert.match(eng.stderr, /ignoring unexpected Invoke/);
  });

  // -- channel lifecycle --------------------------------------------------

  test('StopWorker closes the channel, the launcher lives on', async () => {
    const w = await eng.createWorker();
    w.send({ kind: STOP_WORKER });
    await w.expectEof();
    assert.equal(eng.exitCode, undefined);
  });

  test('EOF on a worker channel closes it and fails its pending calls', async () => {
    const w = await eng.createWorker();
    const record = path.join(eng.tmp, `pending-${w.workerId}`);
    eng.dispatch(w, `pending ${record}`, gwId());
    assert.equal((await w.recv()).kind, INVOKE);
    w.closeE2w(); // the engine drops its end of e2w
    await w.expectEof();
    await withTimeout((async () => {
      while (!fs.existsSync(record) || fs.readFileSync(record, 'utf8') === '') {
        await new Promise((r) => setTimeout(r, 10));
      }
    })(), TIMEOUT_MS, 'pending call failed');
    assert.equal(fs.readFileSync(record, 'utf8'), 'engine_unavailable');
    const other = await eng.createWorker();
    assert.equal((await eng.call(other, 'echo alive', gwId())).inline.toString(), 'alive');
  });

  test('several workers in one process, replies routed per channel', async () => {
    const a = await eng.createWorker();
    const b = await eng.createWorker();
    const ca = gwId();
    const cb = gwId();
    eng.dispatch(a, 'call sa 1', ca);
    eng.dispatch(b, 'call sb 2', cb);
    const ia = await a.recv();
    const ib = await b.recv();
    assert.equal(ia.callId >> 32n, BigInt(a.workerId));
    assert.equal(ib.callId >> 32n, BigInt(b.workerId));
    eng.reply(b, ib.callId, 'B');
    eng.reply(a, ia.callId, 'A');
    assert.equal((await b.recv()).inline.toString(), 'got:B');
    assert.equal((await a.recv()).inline.toString(), 'got:A');
  });
});

describe('launcher (own engine)', T, () => {
  test('raw echo of 0 B, 960 B, 961 B and 1 MiB', T, async () => {
    const eng = new Engine({ files: { 'h.mjs': HANDLER }, handler: 'h.mjs:echo' });
    try {
      await eng.hello();
      const w = await eng.createWorker();
      for (const size of [0, 1, 960, 961, 1 << 20]) {
        const data = Buffer.alloc(size);
        for (let i = 0; i < size; i++) data[i] = (i * 31 + size) & 0xff;
        const cid = gwId();
        const msg = await eng.call(w, data, cid);
        assert.equal(msg.kind, COMPLETION, `size ${size}`);
        assert.equal(msg.inShm, size > 960, `size ${size}`);
        assert.equal(msg.payloadLen, size);
        assert.equal(fs.existsSync(eng.shmPath(cid, 'i')), false);
        assert.ok(eng.payload(msg, 'o').equals(data), `size ${size}`);
        assert.deepEqual(fs.readdirSync(eng.shm), [], `size ${size}`);
      }
    } finally {
      await eng.close();
    }
  });

  test('started with --expose-gc as the engine does: handlers do not see gc()', T, async () => {
    const files = { 'g.mjs': 'export function handle() { return `${typeof globalThis.gc} ${typeof gc}`; }\n' };
    const eng = new Engine({ files, handler: 'g.mjs:handle', nodeArgs: ['--expose-gc'] });
    try {
      await eng.hello();
      const w = await eng.createWorker();
      assert.equal((await eng.call(w, '', gwId())).inline.toString(), 'undefined undefined');
    } finally {
      await eng.close();
    }
  });

  test('EOF on channel 0: the launcher exits 0 and closes every channel', T, async () => {
    const eng = new Engine({ files: { 'handler.mjs': HANDLER } });
    try {
      await eng.hello();
      const w = await eng.createWorker();
      assert.equal((await eng.call(w, 'echo x', gwId())).inline.toString(), 'x');
      eng.chan0.closeE2w();
      assert.equal(await eng.wait(), 0);
      await eng.chan0.expectEof();
      await w.expectEof();
    } finally {
      await eng.close();
    }
  });

  test('output above STACCATO_PAYLOAD_MAX is output_too_large; input payload_too_large', T, async () => {
    const eng = new Engine({ files: { 'handler.mjs': HANDLER }, payloadMax: 4096 });
    try {
      await eng.hello();
      const w = await eng.createWorker();
      let msg = await eng.call(w, 'big 4097', gwId());
      assert.equal(msg.kind, FAILURE);
      assert.equal(msg.errorKind, 10);
      assert.match(msg.inline.toString(), /4097 bytes exceeds the maximum of 4096/);
      assert.deepEqual(fs.readdirSync(eng.shm), []);
      assert.equal((await eng.call(w, 'big 4096', gwId())).payloadLen, 4096);
      msg = await eng.call(w, 'callbig 4097', gwId());
      assert.equal(msg.errorKind, 3);
      assert.equal(msg.inline.toString(), 'CallError: payload_too_large: input of 4097 bytes exceeds the maximum of 4096');
    } finally {
      await eng.close();
    }
  });

  test('sync handler; default handler spec; CommonJS handler', T, async () => {
    const engines = [
      new Engine({ files: { 'handler.mjs': HANDLER }, handler: 'handler.mjs:syncHandle' }),
      new Engine({ files: { 'handler.mjs': 'export const handle = (ctx, d) => "default:" + d;' }, handler: null }),
      new Engine({ files: { 'fn.js': 'exports.handle = function (ctx, d) { return "cjs:" + d; };' }, handler: 'fn.js:handle' }),
      new Engine({ files: { 'fn.cjs': 'module.exports = { go: async (ctx, d) => "cjs2:" + d };' }, handler: 'fn.cjs:go' }),
    ];
    try {
      await Promise.all(engines.map((e) => e.hello()));
      const [sync, def, cjs, cjs2] = await Promise.all(engines.map((e) => e.createWorker()));
      assert.equal((await engines[0].call(sync, 'abc', gwId())).inline.toString(), 'ABC');
      const msg = await engines[0].call(sync, 'raise', gwId());
      assert.equal(msg.errorKind, 3);
      assert.equal(msg.inline.toString(), 'RangeError: r');
      assert.equal((await engines[1].call(def, 'x', gwId())).inline.toString(), 'default:x');
      assert.equal((await engines[2].call(cjs, 'y', gwId())).inline.toString(), 'cjs:y');
      assert.equal((await engines[3].call(cjs2, 'z', gwId())).inline.toString(), 'cjs2:z');
    } finally {
      await Promise.all(engines.map((e) => e.close()));
    }
  });

  const broken = [
    ['handler.mjs:handle', { 'handler.mjs': 'throw new Error("broken module");' }, /cannot load handler file handler\.mjs: Error: broken module/],
    ['handler.mjs:handle', { 'handler.mjs': 'export function handle( {' }, /cannot load handler file handler\.mjs: SyntaxError/],
    ['handler.mjs:missing', { 'handler.mjs': 'export function handle() {}' }, /has no export 'missing'/],
    ['handler.mjs:x', { 'handler.mjs': 'export const x = 1;' }, /is not a function/],
    ['nofile.mjs:handle', {}, /handler file nofile\.mjs not found/],
    ['justafile.mjs', {}, /must be '<file>:<export>'/],
  ];
  for (const [handler, files, needle] of broken) {
    test(`startup error (${needle.source}): one line on stderr, exit 1, channel 0 never opened`, T, async () => {
      const eng = new Engine({ files, handler });
      try {
        assert.equal(await eng.wait(), 1);
        const err = eng.stderr;
        assert.match(err, needle);
        assert.match(err, /^staccato launcher \(fn\): [^\n]*\n$/);
        await assert.rejects(eng.chan0.recv(100), /no a message within/);
      } finally {
        await eng.close();
      }
    });
  }
});
