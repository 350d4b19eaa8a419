// Round-trip latency of the Node runtime against the fake engine:
//   node runtimes/node/testing/bench.mjs [iterations]
//
// 1. dispatch: engine writes a Dispatch (3-byte input), the echo handler
//    answers; time from the engine's write to its read of the Completion.
// 2. internal call: a caller handler awaits ctx.call('callee', 3 bytes) in a
//    loop; the fake engine forwards each Invoke as a Dispatch to a second
//    launcher (echo) and its Completion back. Time between consecutive
//    Invokes = one whole internal call as the caller sees it (both runtimes'
//    share plus the fake engine's routing, which is JavaScript here).
// Both sides block in epoll; on a machine with fewer cores than the three
// processes involved, numbers include scheduler wake-ups.
import fs from 'node:fs';

import { Engine, GATEWAY } from './fake_engine.mjs';
import {
  COMPLETION, DISPATCH, INVOKE, MESSAGE_LEN, OFF_CALL_ID, OFF_PARENT_CALL_ID, OFF_PAYLOAD_LEN,
  OFF_WORKER_ID, OFF_NAME_LEN, encode,
} from '../wire.mjs';

const N = Number(process.argv[2] ?? 20000);
const WARMUP = Math.min(2000, N / 5);
const CODE = `
export function echo(ctx, data) { return data; }
export async function loop(ctx, data) {
  const n = Number(data.toString());
  for (let i = 0; i < n; i++) await ctx.call('callee', 'abc');
  return 'done';
}`;

function stats(name, samples) {
  samples.sort((a, b) => a - b);
  const q = (p) => (samples[Math.min(samples.length - 1, Math.floor(p * samples.length))] / 1000).toFixed(1);
  console.log(`${name.padEnd(28)} n=${samples.length}  p50=${q(0.5)} µs  p90=${q(0.9)} µs  p99=${q(0.99)} µs  max=${q(1)} µs`);
}

function done(promiseBox) {
  return new Promise((resolve) => { promiseBox.resolve = resolve; });
}

async function benchDispatch() {
  const eng = new Engine({ files: { 'h.mjs': CODE }, handler: 'h.mjs:echo' });
  try {
    await eng.hello();
    const w = await eng.createWorker();
    const msg = encode({ kind: DISPATCH, payloadLen: 3, callId: GATEWAY, workerId: w.workerId, inline: 'abc' });
    const samples = [];
    const box = {};
    const finished = done(box);
    let i = 0;
    let t0 = 0n;
    const send = () => {
      msg.writeUInt32LE(++i, OFF_CALL_ID);
      t0 = process.hrtime.bigint();
      fs.writeSync(w.e2w, msg);
    };
    w.onRaw = (buf, off) => {
      const t1 = process.hrtime.bigint();
      if (buf.readUInt16LE(off) !== COMPLETION || buf.readUInt32LE(off + OFF_CALL_ID) !== i) throw new Error('bad reply');
      if (i > WARMUP) samples.push(Number(t1 - t0));
      if (i < N + WARMUP) send();
      else box.resolve();
    };
    send();
    await finished;
    stats('dispatch -> completion', samples);
  } finally {
    await eng.close();
  }
}

async function benchInternalCall() {
  const caller = new Engine({ name: 'caller', files: { 'h.mjs': CODE }, handler: 'h.mjs:loop' });
  const callee = new Engine({ name: 'callee', files: { 'h.mjs': CODE }, handler: 'h.mjs:echo' });
  try {
    await Promise.all([caller.hello(), callee.hello()]);
    const cw = await caller.createWorker();
    const ew = await callee.createWorker();
    const dispatch = Buffer.alloc(MESSAGE_LEN);
    const completion = Buffer.alloc(MESSAGE_LEN);
    dispatch.writeUInt16LE(DISPATCH, 0);
    dispatch.writeUInt32LE(ew.workerId, OFF_WORKER_ID);
    completion.writeUInt16LE(COMPLETION, 0);
    completion.writeUInt32LE(cw.workerId, OFF_WORKER_ID);
    const samples = [];
    const box = {};
    const finished = done(box);
    let last = 0n;
    let count = 0;
    cw.onRaw = (buf, off) => {
      const kind = buf.readUInt16LE(off);
      if (kind === INVOKE) {
        const t = process.hrtime.bigint();
        if (count++ > WARMUP) samples.push(Number(t - last));
        last = t;
        // Forward: the Invoke's call id and parent, its input after the name.
        const nameLen = buf.readUInt16LE(off + OFF_NAME_LEN);
        const len = buf.readUInt32LE(off + OFF_PAYLOAD_LEN) - nameLen;
        buf.copy(dispatch, OFF_CALL_ID, off + OFF_CALL_ID, off + OFF_PARENT_CALL_ID + 8);
        dispatch.writeUInt32LE(len, OFF_PAYLOAD_LEN);
        buf.copy(dispatch, 64, off + 64 + nameLen, off + 64 + nameLen + len);
        fs.writeSync(ew.e2w, dispatch);
      } else if (kind === COMPLETION) {
        box.resolve(buf.toString('utf8', off + 64, off + 64 + buf.readUInt32LE(off + OFF_PAYLOAD_LEN)));
      } else {
        throw new Error(`caller sent kind ${kind}`);
      }
    };
    ew.onRaw = (buf, off) => {
      const len = buf.readUInt32LE(off + OFF_PAYLOAD_LEN);
      buf.copy(completion, OFF_CALL_ID, off + OFF_CALL_ID, off + OFF_CALL_ID + 8);
      completion.writeUInt32LE(len, OFF_PAYLOAD_LEN);
      buf.copy(completion, 64, off + 64, off + 64 + len);
      fs.writeSync(cw.e2w, completion);
    };
    caller.dispatch(cw, String(N + WARMUP + 1), GATEWAY | 1n);
    const out = await finished;
    if (out !== 'done') throw new Error(`caller returned ${out}`);
    stats('internal call (2 launchers)', samples);
  } finally {
    await Promise.all([caller.close(), callee.close()]);
  }
}

await benchDispatch();
await benchInternalCall();
