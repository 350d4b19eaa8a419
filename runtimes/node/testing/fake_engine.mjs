// Plays the engine's side of docs/protocol.md §1 against a real launcher
// process: real FIFOs (made with mkfifo(1)), real shm files, a real `node
// launcher.mjs` child. Used by test/launcher.test.mjs and bench.mjs; it lives
// outside test/ because `node --test` runs every file under a test/ folder.
//
// Every wait has a timeout, so a broken runtime fails a test instead of
// hanging it.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  COMPLETION, CREATE_WORKER, DISPATCH, FAILURE, INLINE_MAX, LAUNCHER_HELLO, MESSAGE_LEN,
  PAYLOAD_IN_SHM, WORKER_HELLO, decodeAt, encode, hex16,
} from '../wire.mjs';

export const LAUNCHER = fileURLToPath(new URL('../launcher.mjs', import.meta.url));
export const TIMEOUT_MS = 10_000;
export const GATEWAY = 1n << 63n;

const { O_RDONLY, O_RDWR, O_NONBLOCK } = fs.constants;

/** Rejects with a TimeoutError-like error if `promise` takes longer than `ms`. */
export function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The engine's end of one channel: e2w O_RDWR, w2e O_RDONLY|O_NONBLOCK. */
export class Chan {
  constructor(ipc, workerId) {
    const base = path.join(ipc, String(workerId));
    execFileSync('mkfifo', ['-m', '600', `${base}.e2w`, `${base}.w2e`]);
    this.workerId = workerId;
    this.e2w = fs.openSync(`${base}.e2w`, O_RDWR);
    this.msgs = []; // decoded messages not received yet
    this.waiter = null; // {resolve, reject} of the one pending recv/expectEof
    this.eof = false;
    this.partial = Buffer.alloc(MESSAGE_LEN);
    this.partialLen = 0;
    /** When set, called as onRaw(buf, off) for each message instead of queueing (benchmarks). */
    this.onRaw = null;
    const w2e = fs.openSync(`${base}.w2e`, O_RDONLY | O_NONBLOCK);
    this.sock = new net.Socket({
      fd: w2e,
      readable: true,
      writable: false,
      onread: { buffer: Buffer.alloc(64 * MESSAGE_LEN), callback: (n, buf) => this.onRead(n, buf) },
    });
    this.sock.on('end', () => {
      this.eof = true;
      this.wake();
    });
    this.sock.on('error', () => {
      this.eof = true;
      this.wake();
    });
  }

  onRead(n, buf) {
    let off = 0;
    if (this.partialLen) {
      const take = Math.min(MESSAGE_LEN - this.partialLen, n);
      buf.copy(this.partial, this.partialLen, 0, take);
      this.partialLen += take;
      off = take;
      if (this.partialLen < MESSAGE_LEN) return;
      this.partialLen = 0;
      this.deliver(this.partial, 0);
    }
    for (; n - off >= MESSAGE_LEN; off += MESSAGE_LEN) this.deliver(buf, off);
    if (off < n) {
      buf.copy(this.partial, 0, off, n);
      this.partialLen = n - off;
    }
  }

  deliver(buf, off) {
    if (this.onRaw !== null) {
      this.onRaw(buf, off);
      return;
    }
    this.msgs.push(decodeAt(buf, off)); // throws on an invalid message: the test fails
    this.wake();
  }

  wake() {
    const w = this.waiter;
    if (w !== null) {
      this.waiter = null;
      w();
    }
  }

  /** Stops reading w2e (the FIFO fills up), until resume(). */
  pause() {
    this.sock.pause();
  }

  resume() {
    this.sock.resume();
  }

  send(msg) {
    fs.writeSync(this.e2w, encode({ workerId: this.workerId, ...msg }));
  }

  /** The next message from the launcher/worker. */
  async recv(timeout = TIMEOUT_MS) {
    const deadline = Date.now() + timeout;
    while (this.msgs.length === 0) {
      if (this.eof) throw new Error(`channel ${this.workerId}: EOF`);
      await this.waitEvent(deadline, 'a message');
    }
    return this.msgs.shift();
  }

  /** Waits for EOF on w2e; fails on any message before it. */
  async expectEof(timeout = TIMEOUT_MS) {
    const deadline = Date.now() + timeout;
    while (!this.eof) await this.waitEvent(deadline, 'EOF');
    if (this.msgs.length !== 0) throw new Error(`unexpected message before EOF: ${this.msgs[0].kindName}`);
  }

  waitEvent(deadline, what) {
    return new Promise((resolve, reject) => {
      const ms = deadline - Date.now();
      if (ms <= 0) {
        reject(new Error(`channel ${this.workerId}: no ${what} within the timeout`));
        return;
      }
      const timer = setTimeout(() => {
        this.waiter = null;
        reject(new Error(`channel ${this.workerId}: no ${what} within ${ms} ms`));
      }, ms);
      this.waiter = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  /** The engine drops its end of e2w (the worker sees EOF). */
  closeE2w() {
    if (this.e2w !== -1) {
      fs.closeSync(this.e2w);
      this.e2w = -1;
    }
  }

  close() {
    this.closeE2w();
    this.sock.destroy();
  }
}

/** A fake engine around one launcher process. */
export class Engine {
  /**
   * files: {name: source} written into the code dir; handler: STACCATO_HANDLER
   * (unset when null); env: extra environment; nodeArgs: node options for
   * the launcher (e.g. --cpu-prof).
   */
  constructor({ files, handler = 'handler.mjs:handle', payloadMax, env = {}, name = 'fn', nodeArgs = [] } = {}) {
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'staccato-node-'));
    this.ipc = path.join(this.tmp, 'ipc', `${name}.1`);
    this.shm = path.join(this.ipc, 'shm');
    fs.mkdirSync(this.shm, { recursive: true });
    this.code = path.join(this.tmp, 'code');
    fs.mkdirSync(this.code);
    for (const [file, source] of Object.entries(files ?? {})) {
      fs.writeFileSync(path.join(this.code, file), source);
    }
    this.chan0 = new Chan(this.ipc, 0);
    this.workers = new Map();
    this.nextWorker = 1;
    this.stderrPath = path.join(this.tmp, 'launcher.stderr');
    const childEnv = { ...process.env, STACCATO_FUNCTION: name, STACCATO_IPC_DIR: this.ipc, ...env };
    if (handler === null) delete childEnv.STACCATO_HANDLER;
    else childEnv.STACCATO_HANDLER = handler;
    if (payloadMax !== undefined) childEnv.STACCATO_PAYLOAD_MAX = String(payloadMax);
    const err = fs.openSync(this.stderrPath, 'w');
    this.proc = spawn(process.execPath, [...nodeArgs, LAUNCHER], {
      cwd: this.code, env: childEnv, stdio: ['ignore', 'ignore', err],
    });
    fs.closeSync(err);
    this.exitCode = undefined;
    this.exited = new Promise((resolve) => {
      this.proc.on('exit', (code, signal) => {
        this.exitCode = code ?? signal;
        resolve(this.exitCode);
      });
    });
  }

  get stderr() {
    return fs.readFileSync(this.stderrPath, 'utf8');
  }

  /** Receives the LauncherHello; checks it. */
  async hello() {
    const msg = await this.chan0.recv();
    if (msg.kind !== LAUNCHER_HELLO || msg.aux !== this.proc.pid || msg.workerId !== 0) {
      throw new Error(`bad LauncherHello: ${JSON.stringify(msg, bigintJson)}`);
    }
    return msg;
  }

  /** Makes the FIFOs of a new worker, sends CreateWorker, waits for WorkerHello. */
  async createWorker() {
    const id = this.nextWorker++;
    const chan = new Chan(this.ipc, id);
    this.workers.set(id, chan);
    this.chan0.send({ kind: CREATE_WORKER, workerId: id });
    const msg = await chan.recv();
    if (msg.kind !== WORKER_HELLO || msg.workerId !== id || msg.aux !== this.proc.pid) {
      throw new Error(`bad WorkerHello: ${JSON.stringify(msg, bigintJson)}`);
    }
    return chan;
  }

  shmPath(callId, suffix) {
    return path.join(this.shm, `${hex16(callId)}.${suffix}`);
  }

  writeShm(callId, suffix, data) {
    fs.writeFileSync(this.shmPath(callId, suffix), data, { mode: 0o600 });
  }

  /** `trace`: the call's trace context bytes (the Dispatch's prefix), if any. */
  dispatch(chan, data, callId, { parent = 0n, deadlineUs = 0n, trace = Buffer.alloc(0) } = {}) {
    data = Buffer.from(data);
    const nameLen = trace.length;
    if (nameLen + data.length <= INLINE_MAX) {
      const inline = Buffer.concat([trace, data]);
      chan.send({ kind: DISPATCH, payloadLen: inline.length, callId, parentCallId: parent, deadlineUs, nameLen, inline });
    } else {
      this.writeShm(callId, 'i', data);
      chan.send({
        kind: DISPATCH, flags: PAYLOAD_IN_SHM, payloadLen: data.length, callId, parentCallId: parent, deadlineUs,
        nameLen, inline: trace,
      });
    }
  }

  reply(chan, callId, data = '', errorKind = 0) {
    data = Buffer.from(data);
    const kind = errorKind ? FAILURE : COMPLETION;
    if (data.length <= INLINE_MAX) {
      chan.send({ kind, payloadLen: data.length, callId, errorKind, inline: data });
    } else {
      this.writeShm(callId, 'o', data);
      chan.send({ kind, flags: PAYLOAD_IN_SHM, payloadLen: data.length, callId, errorKind });
    }
  }

  /** A received message's payload (an Invoke's input); shm files are read and unlinked. */
  payload(msg, suffix) {
    if (!msg.inShm) return msg.inline.subarray(msg.nameLen);
    const p = this.shmPath(msg.callId, suffix);
    const data = fs.readFileSync(p);
    fs.unlinkSync(p);
    if (data.length !== msg.payloadLen) throw new Error(`shm file ${p}: ${data.length} != ${msg.payloadLen}`);
    return data;
  }

  /** Dispatch and wait for the result message. */
  async call(chan, data, callId, opts) {
    this.dispatch(chan, data, callId, opts);
    const msg = await chan.recv();
    if (msg.callId !== callId || msg.workerId !== chan.workerId || (msg.kind !== COMPLETION && msg.kind !== FAILURE)) {
      throw new Error(`unexpected reply: ${JSON.stringify(msg, bigintJson)}`);
    }
    return msg;
  }

  /** The launcher's exit code (or signal name). */
  wait(timeout = TIMEOUT_MS) {
    return withTimeout(this.exited, timeout, 'launcher exit');
  }

  async close() {
    if (this.exitCode === undefined) {
      this.proc.kill('SIGKILL');
      await this.wait();
    }
    this.chan0.close();
    for (const chan of this.workers.values()) chan.close();
    fs.rmSync(this.tmp, { recursive: true, force: true });
  }
}

export function bigintJson(_key, value) {
  return typeof value === 'bigint' ? value.toString() : value;
}
