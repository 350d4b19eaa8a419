// Running a handler in a unit test, without an engine:
//
//   import { runHandler, FakeCalls } from 'staccato-runtime/testing';
//
//   test('greets', async () => {
//     assert.equal((await runHandler(handle, 'ann')).toString(), 'hello ann');
//   });
//   test('calls its store', async () => {
//     const calls = new FakeCalls({ store: (data) => Buffer.concat([Buffer.from('saved '), data]) });
//     await runHandler(handle, 'x', { calls });
//     assert.deepEqual(calls.made.map(([name]) => name), ['store']);
//   });
//
// The handler gets a real Context (call id, deadline and remainingMs(),
// logger) whose ctx.call is answered by `calls`: per callee a function of
// the input Buffer (sync or async) returning a Buffer or string, a
// Buffer/string to return as is, or a CallError to reject with. A callee not
// listed rejects with CallError('not_found'), as the engine would. The
// result becomes a Buffer as the runtime makes it (string as UTF-8,
// undefined/null as empty); another type throws a TypeError.
import { Context } from '../context.mjs';
import { CallError } from '../errors.mjs';

let nextId = 1n;

/** What ctx.call answers in a test, and the calls it saw. */
export class FakeCalls {
  constructor(callees = {}) {
    this.callees = { ...callees };
    this.made = []; // [name, Buffer input] in the order the handler called
  }

  async answer(name, data) {
    this.made.push([name, data]);
    if (!Object.hasOwn(this.callees, name)) throw new CallError('not_found', `no function named '${name}'`);
    let a = this.callees[name];
    if (a instanceof CallError) throw a;
    if (typeof a === 'function') a = await a(data);
    return asBuffer(a, `the fake callee '${name}'`);
  }
}

/** A traceparent (and tracestate) as the Dispatch carries them. */
function traceBytes(traceparent, tracestate) {
  if (traceparent === undefined || traceparent === null) return null;
  const m = /^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(traceparent);
  if (m === null) throw new RangeError(`traceparent ${JSON.stringify(traceparent)} is not 00-<32 hex>-<16 hex>-<2 hex>`);
  return Buffer.concat([Buffer.from(m[1] + m[2] + m[3], 'hex'), Buffer.from(tracestate ?? '', 'latin1')]);
}

function asBuffer(v, what) {
  if (v === undefined || v === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(v)) return v;
  if (typeof v === 'string') return Buffer.from(v, 'utf8');
  if (ArrayBuffer.isView(v)) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return Buffer.from(v);
  throw new TypeError(`${what} returned ${v?.constructor?.name ?? typeof v}; expected Buffer, Uint8Array, string or undefined`);
}

/**
 * Runs `handler(ctx, data)` once, as the runtime would; resolves to its
 * output Buffer. Options: `function` (ctx.function, default 'test'),
 * `calls` (a FakeCalls or a plain object of callees), `timeoutMs` (the
 * call's deadline: ctx.remainingMs(); the promise rejects past it),
 * `callId` (a BigInt), `traceparent` and `tracestate` (the invocation's
 * trace context: ctx.traceId ...; none by default).
 */
export async function runHandler(handler, data = Buffer.alloc(0), options = {}) {
  const calls = options.calls instanceof FakeCalls ? options.calls : new FakeCalls(options.calls ?? {});
  const fn = options.function ?? 'test';
  const channel = {
    runtime: { function: fn },
    workerId: 1,
    startCall: (name, input, parentCallId, deadlineUs) => calls.answer(name, asBuffer(input, 'ctx.call input')),
  };
  const timeoutMs = options.timeoutMs ?? 0;
  const deadlineUs = timeoutMs > 0 ? BigInt(Math.round((Date.now() + timeoutMs) * 1000)) : 0n;
  const callId = options.callId ?? nextId++;
  const ctx = new Context(channel, callId, 0n, deadlineUs, traceBytes(options.traceparent, options.tracestate));
  const input = typeof data === 'string' ? Buffer.from(data, 'utf8') : asBuffer(data, 'the input');
  let result = Promise.resolve().then(() => handler(ctx, input));
  if (timeoutMs > 0) {
    let timer;
    const overrun = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the handler ran past its ${timeoutMs} ms deadline`)), timeoutMs);
    });
    result = Promise.race([result, overrun]).finally(() => clearTimeout(timer));
  }
  return asBuffer(await result, 'the handler');
}

export { CallError, Context };
