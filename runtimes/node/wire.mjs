// Worker messages, docs/protocol.md §1: fixed 1024-byte messages.
//
// A message is a 64-byte little-endian header followed by a 960-byte inline
// payload area. Every field is read and written at its explicit offset; u64
// fields are BigInts. This module is on the hot path: `validate` and
// `writeHeader` work in place on a caller's buffer and allocate nothing but
// the BigInts they are given or asked for.

export const MESSAGE_LEN = 1024;
export const HEADER_LEN = 64;
export const INLINE_MAX = MESSAGE_LEN - HEADER_LEN; // 960
export const NAME_MAX = 64;
/** A traced Dispatch starts its inline area with trace id (16), span id (8),
 * flags (1), then the tracestate (up to 512 bytes): name_len bytes. */
export const TRACE_CONTEXT_LEN = 25;
export const TRACE_LEN_MAX = TRACE_CONTEXT_LEN + 512;

// Header offsets.
export const OFF_KIND = 0;
export const OFF_FLAGS = 2;
export const OFF_PAYLOAD_LEN = 4;
export const OFF_CALL_ID = 8;
export const OFF_PARENT_CALL_ID = 16;
export const OFF_WORKER_ID = 24;
export const OFF_NAME_LEN = 28;
export const OFF_ERROR_KIND = 30;
export const OFF_DEADLINE_US = 32;
export const OFF_SEND_TS_NS = 40;
export const OFF_AUX = 48;
export const OFF_RESERVED = 52; // 12 bytes, must be zero

// Message kinds.
export const LAUNCHER_HELLO = 1;
export const WORKER_HELLO = 2;
export const CREATE_WORKER = 3;
export const STOP_WORKER = 4;
export const DISPATCH = 5;
export const COMPLETION = 6;
export const FAILURE = 7;
export const INVOKE = 8;

/** Kind code -> protocol name (index 0 unused). */
export const KIND_NAMES = Object.freeze([
  undefined, 'LauncherHello', 'WorkerHello', 'CreateWorker', 'StopWorker',
  'Dispatch', 'Completion', 'Failure', 'Invoke',
]);
/** Protocol name -> kind code. */
export const KINDS = Object.freeze(Object.fromEntries(
  KIND_NAMES.map((name, code) => [name, code]).filter(([name]) => name !== undefined)));

// Flags.
export const PAYLOAD_IN_SHM = 1;
/** Dispatch: measure the call's CPU time; Completion/Failure: aux holds it (µs). This runtime does not measure. */
export const CPU_TIME = 2;

/** Highest known error kind code (codes are 1..ERROR_KIND_MAX). */
export const ERROR_KIND_MAX = 14;

export class WireError extends Error {
  constructor(message) {
    super(message);
    this.name = 'WireError';
  }
}

/**
 * Checks the 1024 bytes at `buf[off..off+1024)` against every decoder rule of
 * docs/protocol.md §1 ("Rules a decoder enforces"). Returns null when the
 * message is valid, else a description of the first violation. The caller
 * guarantees the 1024 bytes exist.
 */
export function validate(buf, off = 0) {
  const kind = buf.readUInt16LE(off);
  if (kind < LAUNCHER_HELLO || kind > INVOKE) return `unknown message kind ${kind}`;
  const flags = buf.readUInt16LE(off + OFF_FLAGS);
  if ((flags & ~(PAYLOAD_IN_SHM | CPU_TIME)) !== 0) return `unknown flag bits 0x${flags.toString(16).padStart(4, '0')}`;
  if ((flags & CPU_TIME) !== 0 && kind !== DISPATCH && kind !== COMPLETION && kind !== FAILURE) {
    return `CPU_TIME on ${KIND_NAMES[kind]}`;
  }
  for (let i = off + OFF_RESERVED, end = off + HEADER_LEN; i < end; i++) {
    if (buf[i] !== 0) return `reserved header byte ${i - off} is not zero`;
  }
  const nameLen = buf.readUInt16LE(off + OFF_NAME_LEN);
  if (kind === INVOKE) {
    if (nameLen < 1 || nameLen > NAME_MAX) return `Invoke name_len ${nameLen} outside 1..${NAME_MAX}`;
  } else if (kind === DISPATCH) {
    if (nameLen !== 0 && (nameLen < TRACE_CONTEXT_LEN || nameLen > TRACE_LEN_MAX)) {
      return `Dispatch name_len ${nameLen} is neither 0 nor ${TRACE_CONTEXT_LEN}..${TRACE_LEN_MAX}`;
    }
  } else if (nameLen !== 0) {
    return `name_len ${nameLen} on a ${KIND_NAMES[kind]}`;
  }
  if ((flags & PAYLOAD_IN_SHM) !== 0) {
    if (kind < DISPATCH) return `PAYLOAD_IN_SHM on ${KIND_NAMES[kind]}`;
    // In shm, only an Invoke's callee name or a Dispatch's trace context
    // stays inline (name_len <= 537 < 960).
  } else {
    const payloadLen = buf.readUInt32LE(off + OFF_PAYLOAD_LEN);
    if (payloadLen > INLINE_MAX) return `inline payload_len ${payloadLen} exceeds ${INLINE_MAX}`;
    if (nameLen > payloadLen) return `name_len ${nameLen} exceeds payload_len ${payloadLen}`;
  }
  const errorKind = buf.readUInt16LE(off + OFF_ERROR_KIND);
  if (kind === FAILURE) {
    if (errorKind < 1 || errorKind > ERROR_KIND_MAX) return `Failure with invalid error_kind ${errorKind}`;
  } else if (errorKind !== 0) {
    return `error_kind ${errorKind} on ${KIND_NAMES[kind]}`;
  }
  return null;
}

/**
 * Number of used inline bytes of a valid message at `off`: the payload when
 * it is inline, the callee name of an Invoke or the trace context of a
 * Dispatch whose input is in shm, else 0.
 */
export function inlineUsed(buf, off = 0) {
  if (buf.readUInt16LE(off + OFF_FLAGS) & PAYLOAD_IN_SHM) return buf.readUInt16LE(off + OFF_NAME_LEN);
  return buf.readUInt32LE(off + OFF_PAYLOAD_LEN);
}

/**
 * Writes a complete 64-byte header at `buf[off..]` (reserved bytes zeroed).
 * u64 arguments are BigInts. Does not touch the inline area.
 */
export function writeHeader(buf, off, kind, flags, payloadLen, callId, parentCallId, workerId,
  nameLen, errorKind, deadlineUs, sendTsNs, aux) {
  buf.writeUInt16LE(kind, off);
  buf.writeUInt16LE(flags, off + OFF_FLAGS);
  buf.writeUInt32LE(payloadLen, off + OFF_PAYLOAD_LEN);
  buf.writeBigUInt64LE(callId, off + OFF_CALL_ID);
  buf.writeBigUInt64LE(parentCallId, off + OFF_PARENT_CALL_ID);
  buf.writeUInt32LE(workerId, off + OFF_WORKER_ID);
  buf.writeUInt16LE(nameLen, off + OFF_NAME_LEN);
  buf.writeUInt16LE(errorKind, off + OFF_ERROR_KIND);
  buf.writeBigUInt64LE(deadlineUs, off + OFF_DEADLINE_US);
  buf.writeBigUInt64LE(sendTsNs, off + OFF_SEND_TS_NS);
  buf.writeUInt32LE(aux, off + OFF_AUX);
  buf.fill(0, off + OFF_RESERVED, off + HEADER_LEN);
}

/** One decoded worker message (u64 fields are BigInts). */
export class Message {
  /**
   * `inline` holds the used inline bytes: the payload when it is inline, the
   * callee name for an Invoke whose input is in shm, else empty.
   */
  constructor({
    kind, flags = 0, payloadLen = 0, callId = 0n, parentCallId = 0n, workerId = 0,
    nameLen = 0, errorKind = 0, deadlineUs = 0n, sendTsNs = 0n, aux = 0, inline = EMPTY,
  } = {}) {
    this.kind = kind;
    this.flags = flags;
    this.payloadLen = payloadLen;
    this.callId = BigInt(callId);
    this.parentCallId = BigInt(parentCallId);
    this.workerId = workerId;
    this.nameLen = nameLen;
    this.errorKind = errorKind;
    this.deadlineUs = BigInt(deadlineUs);
    this.sendTsNs = BigInt(sendTsNs);
    this.aux = aux;
    this.inline = toBuffer(inline);
  }

  get inShm() {
    return (this.flags & PAYLOAD_IN_SHM) !== 0;
  }

  get kindName() {
    return KIND_NAMES[this.kind];
  }
}

const EMPTY = Buffer.alloc(0);

function toBuffer(b) {
  if (Buffer.isBuffer(b)) return b;
  if (typeof b === 'string') return Buffer.from(b, 'utf8');
  if (ArrayBuffer.isView(b)) return Buffer.from(b.buffer, b.byteOffset, b.byteLength);
  if (b instanceof ArrayBuffer) return Buffer.from(b);
  throw new TypeError('inline must be a Buffer, Uint8Array or string');
}

/**
 * Decodes the message at `buf[off..off+1024)` (which the caller guarantees
 * exists); throws WireError when it breaks a rule. `inline` is a copy.
 */
export function decodeAt(buf, off) {
  const err = validate(buf, off);
  if (err !== null) throw new WireError(err);
  const used = inlineUsed(buf, off);
  const inline = Buffer.allocUnsafe(used);
  buf.copy(inline, 0, off + HEADER_LEN, off + HEADER_LEN + used);
  return new Message({
    kind: buf.readUInt16LE(off),
    flags: buf.readUInt16LE(off + OFF_FLAGS),
    payloadLen: buf.readUInt32LE(off + OFF_PAYLOAD_LEN),
    callId: buf.readBigUInt64LE(off + OFF_CALL_ID),
    parentCallId: buf.readBigUInt64LE(off + OFF_PARENT_CALL_ID),
    workerId: buf.readUInt32LE(off + OFF_WORKER_ID),
    nameLen: buf.readUInt16LE(off + OFF_NAME_LEN),
    errorKind: buf.readUInt16LE(off + OFF_ERROR_KIND),
    deadlineUs: buf.readBigUInt64LE(off + OFF_DEADLINE_US),
    sendTsNs: buf.readBigUInt64LE(off + OFF_SEND_TS_NS),
    aux: buf.readUInt32LE(off + OFF_AUX),
    inline,
  });
}

/** Decodes one message (Buffer or Uint8Array of exactly 1024 bytes). */
export function decode(buf) {
  if (!ArrayBuffer.isView(buf)) throw new WireError('message must be a Buffer or Uint8Array');
  if (buf.byteLength !== MESSAGE_LEN) {
    throw new WireError(`message is ${buf.byteLength} bytes, expected ${MESSAGE_LEN}`);
  }
  return decodeAt(toBuffer(buf), 0);
}

/**
 * Encodes `msg` (a Message or any object with its fields) into a new
 * 1024-byte Buffer; unused inline bytes are zero. This is not a validator
 * (decode is): it only refuses what cannot be framed.
 */
export function encode(msg) {
  const inline = msg.inline === undefined ? EMPTY : toBuffer(msg.inline);
  if (inline.length > INLINE_MAX) {
    throw new WireError(`inline bytes (${inline.length}) exceed ${INLINE_MAX}`);
  }
  const out = Buffer.alloc(MESSAGE_LEN);
  writeHeader(out, 0, msg.kind, msg.flags ?? 0, msg.payloadLen ?? 0, BigInt(msg.callId ?? 0n),
    BigInt(msg.parentCallId ?? 0n), msg.workerId ?? 0, msg.nameLen ?? 0, msg.errorKind ?? 0,
    BigInt(msg.deadlineUs ?? 0n), BigInt(msg.sendTsNs ?? 0n), msg.aux ?? 0);
  inline.copy(out, HEADER_LEN);
  return out;
}

/** `call_id` as the 16 lowercase hex digits used in shm file names and logs. */
export function hex16(id) {
  return id.toString(16).padStart(16, '0');
}

/** Payload file suffixes (docs/protocol.md §1 "Shared-memory payload files"). */
export const SHM_SUFFIX = Object.freeze({ [DISPATCH]: 'i', [INVOKE]: 'i', [COMPLETION]: 'o', [FAILURE]: 'o' });

/** The payload file, in `shm/`, of a `kind` message about `callId` (a BigInt). */
export function shmFileName(callId, kind) {
  return `${hex16(callId)}.${SHM_SUFFIX[kind]}`;
}

/** Channel `workerId`'s FIFOs in the function's IPC directory: [e2w, w2e]. */
export function channelFileNames(workerId) {
  return [`${workerId}.e2w`, `${workerId}.w2e`];
}
