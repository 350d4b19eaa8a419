// The per-invocation context handed to a function handler.
import { writeSync } from 'node:fs';
import { format } from 'node:util';

import { CallError } from './errors.mjs';
import { hex16 } from './wire.mjs';

/**
 * Writes `text` to stderr (the function's log file), every line prefixed.
 * Synchronous: a line is never lost when the process exits right after.
 */
export function writeLog(prefix, text) {
  const line = text.includes('\n')
    ? `${prefix}${text.replace(/\n/g, `\n${prefix}`)}\n`
    : `${prefix}${text}\n`;
  try {
    writeSync(2, line);
  } catch {
    // stderr closed or full: logging must never fail an invocation.
  }
}

// Wall-clock time in ms with sub-ms precision: Date.now() is whole
// milliseconds, which would overstate the time left by up to 1 ms. The
// performance clock is monotonic, so re-base it if the wall clock steps.
let wallBase = performance.timeOrigin;

export function wallMs() {
  const p = performance.now();
  const t = wallBase + p;
  const d = Date.now(); // the real time is in [d, d + 1)
  if (t > d - 1 && t < d + 2) return t;
  wallBase = d + 0.5 - p;
  return d + 0.5;
}

/**
 * What a handler knows about its invocation, and how it calls others.
 *
 * `callId` / `parentCallId` are the wire ids as BigInts (`parentCallId` is 0n
 * for calls from the gateway); `deadlineUs` is the absolute deadline in
 * microseconds since the Unix epoch (0n: none). `traceId`, `traceparent` and
 * `tracestate` are the invocation's W3C trace context when it has one (on an
 * engine that traces, --otlp-endpoint: it records the call, or its caller
 * sent a context), else null; internal calls carry it without being told.
 */
export class Context {
  #channel;
  #prefix = null;
  #logger = null;
  #trace;

  constructor(channel, callId, parentCallId, deadlineUs, trace = null) {
    this.#channel = channel;
    this.callId = callId;
    this.parentCallId = parentCallId;
    this.deadlineUs = deadlineUs;
    this.#trace = trace; // the Dispatch's trace bytes, or null
  }

  /** The trace's id, 32 lower-case hex digits, or null. */
  get traceId() {
    return this.#trace === null ? null : this.#trace.toString('hex', 0, 16);
  }

  /**
   * A `traceparent` header naming this invocation's span as the parent (for
   * calls to services outside Staccato), or null.
   */
  get traceparent() {
    const t = this.#trace;
    if (t === null) return null;
    return `00-${t.toString('hex', 0, 16)}-${t.toString('hex', 16, 24)}-0${t[24] & 1}`;
  }

  /** The caller's `tracestate`, or null when there is none. */
  get tracestate() {
    const t = this.#trace;
    return t === null || t.length <= 25 ? null : t.toString('latin1', 25);
  }

  /** The function's name. */
  get function() {
    return this.#channel.runtime.function;
  }

  /** The id of the worker (channel) running this invocation. */
  get workerId() {
    return this.#channel.workerId;
  }

  /** The deadline as a Date, or null when there is none. */
  get deadline() {
    return this.deadlineUs === 0n ? null : new Date(Number(this.deadlineUs) / 1000);
  }

  /** Milliseconds left until the deadline (never negative), or null. */
  remainingMs() {
    if (this.deadlineUs === 0n) return null;
    return Math.max(0, Number(this.deadlineUs) / 1000 - wallMs());
  }

  /**
   * Calls function `name` with `data` (Buffer, Uint8Array, string or
   * undefined); resolves to the callee's output Buffer, rejects with a
   * CallError when the call fails. Many calls may be in flight at once
   * (Promise.all). The callee gets this invocation's deadline.
   */
  call(name, data) {
    return this.#channel.startCall(name, data, this.callId, this.deadlineUs);
  }

  /** The CallError class, for `err instanceof ctx.CallError`. */
  get CallError() {
    return CallError;
  }

  /** Writes one log line (util.format of the arguments) to the function's log. */
  log(...args) {
    writeLog(this.#linePrefix(), format(...args));
  }

  /** `info`, `warn`, `error` and `debug`, each writing like `log`. */
  get logger() {
    // Built lazily: most invocations never log.
    if (this.#logger === null) {
      const prefix = () => this.#linePrefix();
      this.#logger = Object.freeze({
        debug: (...args) => writeLog(`${prefix()}DEBUG `, format(...args)),
        info: (...args) => writeLog(prefix(), format(...args)),
        warn: (...args) => writeLog(`${prefix()}WARN `, format(...args)),
        error: (...args) => writeLog(`${prefix()}ERROR `, format(...args)),
      });
    }
    return this.#logger;
  }

  #linePrefix() {
    if (this.#prefix === null) this.#prefix = `[${this.function} ${hex16(this.callId)}] `;
    return this.#prefix;
  }
}
