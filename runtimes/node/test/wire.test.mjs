// Worker message encoding against the shared vectors (docs/protocol.md §1).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe, test } from 'node:test';

import {
  COMPLETION, DISPATCH, FAILURE, HEADER_LEN, INLINE_MAX, INVOKE, KINDS, MESSAGE_LEN, Message,
  PAYLOAD_IN_SHM, WireError, decode, decodeAt, encode, validate,
} from '../wire.mjs';

const VECTORS = JSON.parse(fs.readFileSync(new URL('../../../testvectors/message_v1.json', import.meta.url)));
const VALID = VECTORS.tests.filter((t) => t.result === 'valid');
const INVALID = VECTORS.tests.filter((t) => t.result === 'invalid');
const U64 = new Set(['call_id', 'parent_call_id', 'deadline_us', 'send_ts_ns']);
const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** Vector fields as Message properties (u64s are decimal strings in the file). */
function expectedFields(fields) {
  const out = {};
  for (const [name, value] of Object.entries(fields)) {
    if (name === 'kind') out.kind = KINDS[value];
    else if (name === 'inline') out.inline = Buffer.from(value, 'hex');
    else if (U64.has(name)) out[camel(name)] = BigInt(value);
    else out[camel(name)] = value;
  }
  return out;
}

test('vector file is complete', () => {
  assert.equal(VECTORS.schema, 'staccato_message_v1');
  assert.equal(VECTORS.tests.length, VECTORS.numberOfTests);
  assert.ok(VALID.length > 0 && INVALID.length > 0);
});

describe('valid vectors', () => {
  for (const tc of VALID) {
    test(`${tc.tcId} ${tc.comment}: decodes to the fields, re-encodes byte for byte`, () => {
      const raw = Buffer.from(tc.msg, 'hex');
      const msg = decode(raw);
      const want = expectedFields(tc.fields);
      assert.equal(Object.keys(want).length, 12);
      for (const [name, value] of Object.entries(want)) assert.deepEqual(msg[name], value, name);
      assert.deepEqual(encode(msg), raw);
      assert.deepEqual(encode(new Message(want)), raw);
      assert.equal(validate(raw, 0), null);
    });
  }
});

describe('invalid vectors', () => {
  for (const tc of INVALID) {
    test(`${tc.tcId} ${tc.comment}: rejected`, () => {
      assert.throws(() => decode(Buffer.from(tc.msg, 'hex')), WireError);
    });
  }
});

test('sizes', () => {
  assert.equal(HEADER_LEN, 64);
  assert.equal(MESSAGE_LEN, 1024);
  assert.equal(INLINE_MAX, 960);
});

test('round trip of all fields, unused inline bytes zero', () => {
  const msg = new Message({
    kind: INVOKE, payloadLen: 7, callId: (3n << 32n) | 9n, parentCallId: (1n << 63n) | 5n, workerId: 3,
    nameLen: 3, deadlineUs: 1_790_000_000_000_000n, sendTsNs: 99n, inline: Buffer.from('fooabcd'),
  });
  const raw = encode(msg);
  assert.equal(raw.length, 1024);
  assert.deepEqual(decode(raw), msg);
  assert.equal(raw.subarray(64, 71).toString(), 'fooabcd');
  assert.ok(raw.subarray(71).every((b) => b === 0));
});

test('decode accepts a Uint8Array; decodeAt reads at an offset; inline is a copy', () => {
  const raw = encode({ kind: COMPLETION, payloadLen: 2, callId: 5n, workerId: 1, inline: Buffer.from('ok') });
  const big = Buffer.alloc(3 * 1024);
  raw.copy(big, 1024);
  const msg = decodeAt(big, 1024);
  assert.equal(msg.inline.toString(), 'ok');
  big[1024 + 64] = 0x21;
  assert.equal(msg.inline.toString(), 'ok');
  assert.equal(decode(new Uint8Array(raw)).inline.toString(), 'ok');
});

test('decoder ignores bytes past the payload', () => {
  const raw = encode({ kind: DISPATCH, payloadLen: 3, callId: 1n, workerId: 1, inline: Buffer.from('abc') });
  raw[500] = 0xff;
  assert.equal(decode(raw).inline.toString(), 'abc');
});

test('Invoke in shm keeps the name inline; name_len not bounded by payload_len, still by 64', () => {
  const raw = encode({
    kind: INVOKE, flags: PAYLOAD_IN_SHM, payloadLen: 1 << 20, callId: 1n, parentCallId: 2n, workerId: 1,
    nameLen: 4, inline: Buffer.from('echo'),
  });
  assert.equal(decode(raw).inline.toString(), 'echo');
  const empty = encode({ kind: INVOKE, flags: PAYLOAD_IN_SHM, payloadLen: 0, callId: 1n, nameLen: 4, inline: Buffer.from('echo') });
  assert.equal(decode(empty).payloadLen, 0);
  raw.writeUInt16LE(65, 28);
  assert.throws(() => decode(raw), /name_len 65/);
});

test('every error kind code 1..9 is valid on a Failure, none elsewhere', () => {
  for (let code = 1; code <= 9; code++) {
    assert.equal(decode(encode({ kind: FAILURE, errorKind: code, callId: 1n })).errorKind, code);
    assert.throws(() => decode(encode({ kind: COMPLETION, errorKind: code, callId: 1n })), WireError);
  }
});

test('shm flag is allowed exactly on Dispatch, Completion, Failure, Invoke', () => {
  for (let kind = 1; kind <= 8; kind++) {
    const raw = encode({
      kind, flags: PAYLOAD_IN_SHM, payloadLen: 5000, errorKind: kind === FAILURE ? 3 : 0,
      nameLen: kind === INVOKE ? 1 : 0, inline: kind === INVOKE ? 'x' : '',
    });
    assert.equal(validate(raw, 0) === null, kind >= DISPATCH, `kind ${kind}`);
  }
});

test('u64 extremes survive', () => {
  const max = (1n << 64n) - 1n;
  const msg = decode(encode({ kind: DISPATCH, callId: max, parentCallId: max, deadlineUs: max, sendTsNs: max }));
  assert.equal(msg.callId, max);
  assert.equal(msg.deadlineUs, max);
});

test('encode refuses oversized inline bytes', () => {
  assert.throws(() => encode({ kind: COMPLETION, payloadLen: 961, inline: Buffer.alloc(961) }), WireError);
});

test('decode rejects non-buffers and wrong sizes with WireError', () => {
  assert.throws(() => decode('x'.repeat(1024)), WireError);
  assert.throws(() => decode(Buffer.alloc(0)), WireError);
  assert.throws(() => decode(Buffer.alloc(2048)), WireError);
});

test('randomized: decode never throws anything but WireError, valid messages round-trip', () => {
  let seed = 12345;
  const rnd = () => { // mulberry32
    let t = (seed = (seed + 0x6d2b79f5) | 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) & 0x7fffffff;
  };
  const raw = Buffer.alloc(1024);
  let valid = 0;
  for (let i = 0; i < 20000; i++) {
    raw.fill(0);
    raw.writeUInt16LE(rnd() % 10, 0);
    raw.writeUInt16LE(rnd() % 8 === 0 ? rnd() & 0xffff : rnd() & 1, 2);
    raw.writeUInt32LE(rnd() % 4 === 0 ? rnd() >>> 0 : rnd() % 1000, 4);
    raw.writeUInt16LE(rnd() % 4 === 0 ? rnd() % 100 : 0, 28);
    raw.writeUInt16LE(rnd() % 3 === 0 ? rnd() % 11 : 0, 30);
    if (rnd() % 50 === 0) raw[52 + (rnd() % 12)] = 1;
    try {
      const msg = decode(raw);
      valid++;
      const again = encode(msg);
      assert.deepEqual(decode(again), msg);
    } catch (e) {
      assert.ok(e instanceof WireError, e.stack);
    }
  }
  assert.ok(valid > 100);
});

// ---- the rest of the cross-language contract (testvectors/contract_v1.json)

describe('contract', () => {
  const CONTRACT = JSON.parse(fs.readFileSync(new URL('../../../testvectors/contract_v1.json', import.meta.url)));

  test('error kinds are the contract\'s', async () => {
    const { ErrorKind, ERROR_NAMES } = await import('../errors.mjs');
    const { ERROR_KIND_MAX } = await import('../wire.mjs');
    const want = Object.fromEntries(CONTRACT.error_kinds.map((k) => [k.name, k.code]));
    assert.deepEqual({ ...ErrorKind }, want);
    for (const k of CONTRACT.error_kinds) assert.equal(ERROR_NAMES[k.code], k.name);
    assert.equal(ERROR_KIND_MAX, Math.max(...Object.values(want)));
  });

  test('payload file names are the contract\'s', async () => {
    const { shmFileName } = await import('../wire.mjs');
    for (const c of CONTRACT.payload_files) {
      assert.equal(`shm/${shmFileName(BigInt(c.call_id), KINDS[c.kind])}`, c.path);
    }
  });

  test('channel file names are the contract\'s', async () => {
    const { channelFileNames } = await import('../wire.mjs');
    for (const c of CONTRACT.channel_files) assert.deepEqual(channelFileNames(c.id), [c.e2w, c.w2e]);
  });

  test('only the contract\'s environment variables are read', () => {
    const dir = new URL('../', import.meta.url);
    const used = new Set();
    for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.mjs'))) {
      const text = fs.readFileSync(new URL(f, dir), 'utf8');
      for (const m of text.matchAll(/(?:env\.|["'`])(STACCATO_[A-Z0-9_]+)/g)) used.add(m[1]);
    }
    const allowed = new Set([...CONTRACT.env.launcher, ...CONTRACT.env.runtime.node]);
    assert.ok(used.size > 0, 'the scan found nothing: it is broken');
    assert.deepEqual([...used].filter((n) => !allowed.has(n)), []);
  });
});
