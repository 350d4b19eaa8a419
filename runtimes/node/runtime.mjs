// FIFO channels between the engine and this process (docs/protocol.md §1).
//
// One process multiplexes every channel on Node's event loop (Nightcore
// §4.2): channel 0 is the launcher channel, channel N > 0 is worker N.
//
// Reading: each e2w FIFO is wrapped in a net.Socket (a libuv pipe handle, so
// readiness comes from epoll and no read ever goes through the threadpool),
// with the `onread` option: libuv reads straight into one static buffer
// shared by all channels, and whole 1024-byte messages are handled in place
// (a partial message, which the engine never sends, is kept per channel).
//
// Writing: a message is built in one static buffer and written with
// fs.writeSync on the non-blocking w2e fd. 1024 <= PIPE_BUF, so the write is
// atomic: all of it, or EAGAIN when the engine is not draining the FIFO;
// then the channel queues its messages, in order, on a net.Socket over w2e
// (libuv waits for writability) until that queue is empty again.
import fs from 'node:fs';
import net from 'node:net';
import { inspect } from 'node:util';

import { Context, writeLog } from './context.mjs';
import { CallError, ErrorKind, ERROR_NAMES } from './errors.mjs';
import {
  COMPLETION, CREATE_WORKER, DISPATCH, FAILURE, HEADER_LEN, INLINE_MAX, INVOKE, KIND_NAMES,
  LAUNCHER_HELLO, MESSAGE_LEN, NAME_MAX, OFF_CALL_ID, OFF_DEADLINE_US, OFF_ERROR_KIND, OFF_FLAGS,
  OFF_NAME_LEN, OFF_PARENT_CALL_ID, OFF_PAYLOAD_LEN, OFF_WORKER_ID, PAYLOAD_IN_SHM, STOP_WORKER, WORKER_HELLO,
  channelFileNames, shmFileName, validate, writeHeader,
} from './wire.mjs';

const { O_RDONLY, O_WRONLY, O_NONBLOCK } = fs.constants;

const FUNCTION_ERROR = ErrorKind.function_error;
const INTERNAL = ErrorKind.internal;
const SEQ_MAX = 0xffffffff;
const EMPTY = Buffer.alloc(0);
const now = process.hrtime.bigint; // CLOCK_MONOTONIC, ns

// Messages read per read(2): the default pipe capacity is 64 KiB. Shared by
// every channel: a read callback handles all of its bytes before returning.
const readBuf = Buffer.alloc(64 * MESSAGE_LEN);
// Every outgoing message is built here, then written synchronously. The
// inline area is kept zeroed (the used part is cleared after each write).
const out = Buffer.alloc(MESSAGE_LEN);

/** Runtime diagnostics to stderr (never on the hot path). */
export function logRuntime(level, text) {
  writeLog(`${new Date().toISOString()} ${level} staccato.runtime `, text);
}

/**
 * Opens channel `workerId`: returns [e2w read fd, w2e write fd]. The engine
 * holds both FIFOs open already, so the protocol allows blocking opens;
 * O_NONBLOCK gives the same result then, but fails (ENXIO) instead of hanging
 * the whole process if the engine broke that promise. libuv opens fds
 * close-on-exec, so a handler's child process never keeps w2e open (which
 * would hide our death from the engine).
 */
export function openFifos(ipcDir, workerId) {
  const [e2w, w2e] = channelFileNames(workerId);
  const rfd = fs.openSync(`${ipcDir}/${e2w}`, O_RDONLY | O_NONBLOCK);
  try {
    return [rfd, fs.openSync(`${ipcDir}/${w2e}`, O_WRONLY | O_NONBLOCK)];
  } catch (e) {
    fs.closeSync(rfd);
    throw e;
  }
}

/** Reads a payload file and unlinks it (the receiver owns it). */
export function readShm(path, size) {
  let data;
  try {
    data = fs.readFileSync(path);
  } finally {
    try {
      fs.unlinkSync(path);
    } catch {
      // already gone
    }
  }
  if (data.length !== size) {
    throw new Error(`shm payload ${path} is ${data.length} bytes, expected ${size}`);
  }
  return data;
}

/** Writes a whole payload file (mode 0600); done before the message naming it. */
export function writeShm(path, data) {
  fs.writeFileSync(path, data, { mode: 0o600 });
}

/** The next per-channel call sequence number: 32 bits, wrapping to 1, never 0. */
export function nextSeq(seq) {
  return seq >= SEQ_MAX ? 1 : seq + 1;
}

/** A handler's result or a call's input as bytes; null for a type not allowed. */
function resultBytes(result) {
  if (Buffer.isBuffer(result)) return result;
  if (result === undefined || result === null) return EMPTY;
  if (typeof result === 'string') return Buffer.from(result, 'utf8');
  if (ArrayBuffer.isView(result)) return Buffer.from(result.buffer, result.byteOffset, result.byteLength);
  if (result instanceof ArrayBuffer) return Buffer.from(result);
  return null;
}


function typeName(v) {
  if (v === null) return 'null';
  if (typeof v === 'object') return v.constructor?.name ?? 'object';
  return typeof v;
}

/** Message and log text for a handler that threw `err`. */
function describeError(err) {
  if (err instanceof CallError) return [err.toString(), err.stack];
  if (err instanceof Error) {
    const name = err.name || 'Error';
    return [err.message ? `${name}: ${err.message}` : name, err.stack || `${name}: ${err.message}`];
  }
  const text = typeof err === 'string' ? err : inspect(err);
  return [text, `non-Error thrown: ${text}`];
}

/** UTF-8 bytes of an error message, cut to fit inline at a character boundary. */
function messageBytes(message) {
  const data = Buffer.from(message, 'utf8');
  if (data.length <= INLINE_MAX) return data;
  let end = INLINE_MAX - 3;
  while (end > 0 && (data[end] & 0xc0) === 0x80) end--; // not inside a character
  return Buffer.concat([data.subarray(0, end), Buffer.from('...')]);
}

/** Message framing and I/O for one FIFO pair; subclasses handle messages. */
class Channel {
  constructor(runtime, workerId, rfd, wfd) {
    this.runtime = runtime;
    this.workerId = workerId;
    this.wfd = wfd;
    this.closed = false;
    this.partial = null; // bytes of a partial message, rarely needed
    this.partialLen = 0;
    this.writer = null; // net.Socket over w2e, made on the first EAGAIN
    this.queued = 0; // messages written through `writer` and not done yet
    this.reader = new net.Socket({
      fd: rfd,
      readable: true,
      writable: false,
      onread: { buffer: readBuf, callback: (n, buf) => this.onRead(n, buf) },
    });
    this.reader.on('end', () => this.onEof('end of file on e2w'));
    this.reader.on('error', (e) => this.onEof(`read error: ${e.message}`));
  }

  // -- reading ---------------------------------------------------------

  onRead(n, buf) {
    let off = 0;
    if (this.partialLen !== 0) {
      // Complete the partial message first.
      const take = Math.min(MESSAGE_LEN - this.partialLen, n);
      buf.copy(this.partial, this.partialLen, 0, take);
      this.partialLen += take;
      off = take;
      if (this.partialLen < MESSAGE_LEN) return;
      this.partialLen = 0;
      this.handle(this.partial, 0);
      if (this.closed) return;
    }
    // A read may return several messages.
    while (n - off >= MESSAGE_LEN) {
      this.handle(buf, off);
      if (this.closed) return;
      off += MESSAGE_LEN;
    }
    if (off < n) {
      if (this.partial === null) this.partial = Buffer.alloc(MESSAGE_LEN);
      buf.copy(this.partial, 0, off, n);
      this.partialLen = n - off;
    }
  }

  handle(buf, off) {
    const err = validate(buf, off);
    if (err !== null) {
      // The fixed size keeps the stream aligned: log and drop.
      logRuntime('ERROR', `channel ${this.workerId}: dropping invalid message: ${err}`);
      return;
    }
    this.onMessage(buf.readUInt16LE(off), buf, off);
  }

  /** Handles one valid message at buf[off..]; each kind of channel decides how. */
  onMessage(kind, buf, off) { // eslint-disable-line no-unused-vars
    throw new Error('abstract');
  }

  onEof(reason) {
    if (this.partialLen !== 0) {
      logRuntime('WARN', `channel ${this.workerId}: EOF after a partial message (${this.partialLen} bytes)`);
    }
    this.close(reason);
  }

  // -- writing ---------------------------------------------------------

  /** Writes the message built in `out`, then clears its first `used` inline bytes. */
  send(used) {
    if (!this.closed) {
      if (this.writer !== null && this.queued !== 0) {
        this.enqueue(Buffer.from(out));
      } else {
        try {
          fs.writeSync(this.wfd, out, 0, MESSAGE_LEN);
        } catch (e) {
          if (e.code === 'EAGAIN') {
            // The engine is not draining w2e fast enough: queue in order and
            // let libuv tell us when there is room, instead of blocking every
            // other channel.
            this.enqueue(Buffer.from(out));
          } else {
            // EPIPE: the engine closed its read end.
            out.fill(0, HEADER_LEN, HEADER_LEN + used);
            this.close(`write error: ${e.message}`);
            return;
          }
        }
      }
    }
    if (used !== 0) out.fill(0, HEADER_LEN, HEADER_LEN + used);
  }

  enqueue(msg) {
    if (this.writer === null) {
      logRuntime('WARN', `channel ${this.workerId}: w2e is full (engine not reading); queueing messages`);
      this.writer = new net.Socket({ fd: this.wfd, readable: false, writable: true });
      this.writer.on('error', (e) => this.close(`write error: ${e.message}`));
    }
    this.queued++;
    this.writer.write(msg, () => { this.queued--; });
  }

  // -- shutdown --------------------------------------------------------

  close(reason = 'closed') {
    if (this.closed) return;
    this.closed = true;
    this.reader.destroy(); // closes e2w
    if (this.writer !== null) {
      this.writer.destroy(); // closes w2e
    } else {
      try {
        fs.closeSync(this.wfd);
      } catch {
        // nothing to do
      }
    }
    this.onClosed(reason);
  }

  onClosed(reason) {} // eslint-disable-line no-unused-vars
}

/** Worker `workerId`: runs Dispatches, routes replies to ctx.call. */
export class WorkerChannel extends Channel {
  constructor(runtime, workerId, rfd, wfd) {
    super(runtime, workerId, rfd, wfd);
    this.shmDir = runtime.shmDir;
    this.seq = 0;
    this.pending = new Map(); // seq of an Invoke in flight -> {resolve, reject}
  }

  onMessage(kind, buf, off) {
    if (kind === COMPLETION || kind === FAILURE) this.onReply(kind, buf, off);
    else if (kind === DISPATCH) this.onDispatch(buf, off);
    else if (kind === STOP_WORKER) this.close('StopWorker');
    else logRuntime('WARN', `worker ${this.workerId}: ignoring unexpected ${KIND_NAMES[kind]}`);
  }

  // -- running the handler -------------------------------------------

  onDispatch(buf, off) {
    const callId = buf.readBigUInt64LE(off + OFF_CALL_ID);
    const parentCallId = buf.readBigUInt64LE(off + OFF_PARENT_CALL_ID);
    const deadlineUs = buf.readBigUInt64LE(off + OFF_DEADLINE_US);
    let len = buf.readUInt32LE(off + OFF_PAYLOAD_LEN);
    // A trace context first, if the call has one (docs/protocol.md).
    const traceLen = buf.readUInt16LE(off + OFF_NAME_LEN);
    const trace = traceLen === 0 ? null : Buffer.from(buf.subarray(off + HEADER_LEN, off + HEADER_LEN + traceLen));
    let data;
    if (buf.readUInt16LE(off + OFF_FLAGS) & PAYLOAD_IN_SHM) {
      try {
        data = readShm(`${this.shmDir}/${shmFileName(callId, DISPATCH)}`, len);
      } catch (e) {
        this.sendFailure(callId, parentCallId, INTERNAL, `cannot read input: ${e.message}`);
        return;
      }
    } else if (len === traceLen) {
      data = Buffer.alloc(0);
    } else {
      len -= traceLen;
      data = Buffer.allocUnsafe(len);
      buf.copy(data, 0, off + HEADER_LEN + traceLen, off + HEADER_LEN + traceLen + len);
    }
    const ctx = new Context(this, callId, parentCallId, deadlineUs, trace);
    let result;
    try {
      result = this.runtime.handler(ctx, data);
    } catch (e) {
      this.handlerFailed(ctx, e);
      return;
    }
    if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
      result.then((r) => this.sendResult(ctx, r), (e) => this.handlerFailed(ctx, e));
    } else {
      this.sendResult(ctx, result);
    }
  }

  handlerFailed(ctx, err) {
    const [message, logText] = describeError(err);
    ctx.logger.error(`handler failed: ${logText}`);
    this.sendFailure(ctx.callId, ctx.parentCallId, FUNCTION_ERROR, message);
  }

  /** Sends the Completion for a dispatched call (inline or via shm). */
  sendResult(ctx, result) {
    const { callId, parentCallId } = ctx;
    if (typeof result === 'string' && result.length <= INLINE_MAX / 3) {
      // Fits for sure (<= 3 UTF-8 bytes per UTF-16 unit): encode in place.
      const n = out.write(result, HEADER_LEN, 'utf8');
      writeHeader(out, 0, COMPLETION, 0, n, callId, parentCallId, this.workerId, 0, 0, 0n, now(), 0);
      this.send(n);
      return;
    }
    const data = resultBytes(result);
    if (data === null) {
      this.sendFailure(callId, parentCallId, FUNCTION_ERROR,
        `TypeError: handler returned ${typeName(result)}; expected Buffer, Uint8Array, string or undefined`);
      return;
    }
    const n = data.length;
    if (n <= INLINE_MAX) {
      data.copy(out, HEADER_LEN);
      writeHeader(out, 0, COMPLETION, 0, n, callId, parentCallId, this.workerId, 0, 0, 0n, now(), 0);
      this.send(n);
      return;
    }
    const limit = this.runtime.payloadMax;
    if (n > limit) {
      this.sendFailure(callId, parentCallId, ErrorKind.output_too_large,
        `output of ${n} bytes exceeds the maximum of ${limit}`);
      return;
    }
    if (this.closed) return; // no file nobody would unlink
    try {
      writeShm(`${this.shmDir}/${shmFileName(callId, COMPLETION)}`, data);
    } catch (e) {
      this.sendFailure(callId, parentCallId, INTERNAL, `cannot write output: ${e.message}`);
      return;
    }
    writeHeader(out, 0, COMPLETION, PAYLOAD_IN_SHM, n, callId, parentCallId, this.workerId, 0, 0, 0n, now(), 0);
    this.send(0);
  }

  sendFailure(callId, parentCallId, errorKind, message) {
    // Error messages are cut to fit inline: they are for humans, and shm is
    // not worth it for them.
    const data = messageBytes(message);
    data.copy(out, HEADER_LEN);
    writeHeader(out, 0, FAILURE, 0, data.length, callId, parentCallId, this.workerId, 0, errorKind, 0n, now(), 0);
    this.send(data.length);
  }

  // -- internal calls (ctx.call) --------------------------------------

  /** Sends an Invoke; returns a promise of the callee's output. */
  startCall(name, data, parentCallId, deadlineUs) {
    if (typeof name !== 'string') {
      return Promise.reject(new TypeError(`function name must be a string, got ${typeName(name)}`));
    }
    const nameLen = Buffer.byteLength(name, 'utf8');
    if (nameLen < 1 || nameLen > NAME_MAX) {
      return Promise.reject(new RangeError(`function name must be 1..${NAME_MAX} UTF-8 bytes, got ${nameLen}`));
    }
    const input = resultBytes(data);
    if (input === null) {
      return Promise.reject(new TypeError(
        `call input must be a Buffer, Uint8Array, string or undefined, got ${typeName(data)}`));
    }
    if (this.closed) {
      return Promise.reject(new CallError('engine_unavailable', `worker channel ${this.workerId} is closed`));
    }
    const n = input.length;
    const seq = nextSeq(this.seq);
    let flags = 0;
    let payloadLen = nameLen + n;
    if (payloadLen > INLINE_MAX) {
      const limit = this.runtime.payloadMax;
      if (n > limit) {
        return Promise.reject(new CallError('payload_too_large',
          `input of ${n} bytes exceeds the maximum of ${limit}`));
      }
      try {
        writeShm(`${this.shmDir}/${shmFileName(this.callId(seq), INVOKE)}`, input);
      } catch (e) {
        return Promise.reject(new CallError('internal', `cannot write input: ${e.message}`));
      }
      // In shm the name stays inline and payload_len counts the input only.
      flags = PAYLOAD_IN_SHM;
      payloadLen = n;
    } else {
      input.copy(out, HEADER_LEN + nameLen);
    }
    this.seq = seq;
    out.write(name, HEADER_LEN, 'utf8');
    writeHeader(out, 0, INVOKE, flags, payloadLen, 0n, parentCallId, this.workerId, nameLen, 0,
      deadlineUs, now(), 0);
    // call_id = (worker_id << 32) | seq, written as two u32 halves.
    out.writeUInt32LE(seq, OFF_CALL_ID);
    out.writeUInt32LE(this.workerId, OFF_CALL_ID + 4);
    // Registered before sending: a failed send closes the channel, which
    // rejects every pending call.
    const promise = new Promise((resolve, reject) => {
      this.pending.set(seq, { resolve, reject });
    });
    this.send(flags === 0 ? payloadLen : nameLen);
    return promise;
  }

  /** The call id of this channel's `seq`-th internal call (docs/protocol.md "Call ids"). */
  callId(seq) {
    return (BigInt(this.workerId) << 32n) | BigInt(seq);
  }

  onReply(kind, buf, off) {
    const seq = buf.readUInt32LE(off + OFF_CALL_ID);
    const high = buf.readUInt32LE(off + OFF_CALL_ID + 4);
    let waiter;
    if (high === this.workerId) {
      waiter = this.pending.get(seq);
      if (waiter !== undefined) this.pending.delete(seq);
    }
    const len = buf.readUInt32LE(off + OFF_PAYLOAD_LEN);
    let payload;
    if (buf.readUInt16LE(off + OFF_FLAGS) & PAYLOAD_IN_SHM) {
      const path = `${this.shmDir}/${shmFileName((BigInt(high) << 32n) | BigInt(seq), kind)}`;
      if (waiter === undefined) {
        // Nobody waits (the call timed out): the file is ours, remove it.
        try {
          fs.unlinkSync(path);
        } catch {
          // already gone
        }
        return;
      }
      try {
        payload = readShm(path, len);
      } catch (e) {
        waiter.reject(new CallError('internal', `cannot read reply: ${e.message}`));
        return;
      }
    } else if (waiter === undefined) {
      return; // a late reply (the call timed out) or an unknown id: dropped
    } else {
      payload = Buffer.allocUnsafe(len);
      buf.copy(payload, 0, off + HEADER_LEN, off + HEADER_LEN + len);
    }
    if (kind === COMPLETION) {
      waiter.resolve(payload);
    } else {
      const errorKind = buf.readUInt16LE(off + OFF_ERROR_KIND);
      waiter.reject(new CallError(ERROR_NAMES[errorKind], payload.toString('utf8')));
    }
  }

  onClosed(reason) {
    this.runtime.channelClosed(this);
    const pending = this.pending;
    this.pending = new Map();
    for (const waiter of pending.values()) {
      waiter.reject(new CallError('engine_unavailable', `worker channel ${this.workerId} closed: ${reason}`));
    }
  }
}

/** Channel 0: CreateWorker requests; EOF means the engine is gone. */
export class LauncherChannel extends Channel {
  onMessage(kind, buf, off) {
    if (kind === CREATE_WORKER) this.runtime.createWorker(buf.readUInt32LE(off + OFF_WORKER_ID));
    else logRuntime('WARN', `launcher channel: ignoring unexpected ${KIND_NAMES[kind]}`);
  }

  onClosed(reason) {
    this.runtime.stop(`launcher channel: ${reason}`);
  }
}

/** All channels of one launcher process. */
export class Runtime {
  constructor({ function: fn, ipcDir, handler, payloadMax, onStop }) {
    this.function = fn;
    this.ipcDir = ipcDir;
    this.shmDir = `${ipcDir}/shm`;
    this.handler = handler;
    this.payloadMax = payloadMax;
    this.onStop = onStop;
    this.workers = new Map(); // worker id -> WorkerChannel
    this.launcher = null;
    this.stopped = false;
  }

  /**
   * Serves channel 0 (already open as rfd/wfd): sends LauncherHello.
   * `collectGarbage`: V8's gc(), when the launcher was given it.
   */
  start(rfd, wfd, collectGarbage = null) {
    this.launcher = new LauncherChannel(this, 0, rfd, wfd);
    // The engine asks for a worker as soon as it hears the hello, and the
    // first worker's path set off a scavenge of what start-up allocated
    // (~1 ms then; the first worker was ready ~2.3 ms after the request,
    // the next ones ~0.2 ms). Emptying the young generation here, before the
    // hello, takes ~0.9 ms and halves that first worker's start (A/B in
    // BENCHMARKS.md); running the worker path once beforehand did not help.
    if (collectGarbage !== null) collectGarbage({ type: 'minor' });
    writeHeader(out, 0, LAUNCHER_HELLO, 0, 0, 0n, 0n, 0, 0, 0, 0n, now(), process.pid);
    this.launcher.send(0);
  }

  createWorker(workerId) {
    // Worker ids are below 2^31 so internal call ids keep bit 63 clear.
    if (workerId === 0 || workerId >= 2 ** 31 || this.workers.has(workerId)) {
      logRuntime('ERROR', `${this.function}: CreateWorker for invalid or open worker id ${workerId}`);
      return;
    }
    let fds;
    try {
      fds = openFifos(this.ipcDir, workerId);
    } catch (e) {
      // Nothing to answer on: the engine notices the missing WorkerHello.
      logRuntime('ERROR', `${this.function}: cannot open worker channel ${workerId}: ${e.message}`);
      return;
    }
    const channel = new WorkerChannel(this, workerId, fds[0], fds[1]);
    this.workers.set(workerId, channel);
    writeHeader(out, 0, WORKER_HELLO, 0, 0, 0n, 0n, workerId, 0, 0, 0n, now(), process.pid);
    channel.send(0);
  }

  channelClosed(channel) {
    if (this.workers.get(channel.workerId) === channel) this.workers.delete(channel.workerId);
  }

  /** The engine is gone: closes every channel, then calls onStop(reason). */
  stop(reason) {
    if (this.stopped) return;
    this.stopped = true;
    this.launcher.close(reason);
    for (const channel of [...this.workers.values()]) channel.close(reason);
    this.onStop(reason);
  }
}
