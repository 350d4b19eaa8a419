// The conformance functions (conformance/functions/node/) against real
// launchers, with the fake engine routing internal calls between them the way
// the engine does: the Invoke's call id becomes the callee's call id, its
// parent_call_id the callee's parent, the deadline the earlier of the
// caller's and the callee's own timeout. conformance/test_conformance.py
// checks the same behaviour against a real `staccato up`.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, test } from 'node:test';

import { Engine, GATEWAY, TIMEOUT_MS } from '../testing/fake_engine.mjs';
import { COMPLETION, FAILURE, INVOKE } from '../wire.mjs';
import { ERROR_NAMES } from '../errors.mjs';

const CODE = fs.readFileSync(new URL('../../../conformance/functions/node/conf.mjs', import.meta.url), 'utf8');
const MANIFEST = fs.readFileSync(new URL('../../../conformance/functions/node/staccato.yml', import.meta.url), 'utf8');
const T = { timeout: 6 * TIMEOUT_MS };

// role -> [export, timeout seconds], as in staccato.yml
const ROLES = {
  nop: ['nop', 30], echo: ['echo', 30], fail: ['fail', 30], call: ['call', 30],
  deadline: ['deadline', 60], 'chain-deadline': ['chainDeadline', 5], fanout: ['fanout', 30], log: ['log', 30],
};

let nextId = 1n;
const fns = new Map(); // function name -> {eng, w, timeout, lock}

function nowUs() {
  return BigInt(Date.now()) * 1000n;
}

/** Runs one call of function `name` like the engine; resolves to {kind, errorKind, payload}. */
async function runCall(name, input, callId, parent, callerDeadlineUs) {
  const f = fns.get(name);
  if (f === undefined) return { kind: FAILURE, errorKind: 1, payload: Buffer.from(`function '${name}' not found`) };
  let own = nowUs() + BigInt(f.timeout) * 1_000_000n;
  if (callerDeadlineUs !== 0n && callerDeadlineUs < own) own = callerDeadlineUs;
  // One Dispatch at a time per worker: wait for the function's previous call.
  const prev = f.lock;
  let release;
  f.lock = new Promise((r) => { release = r; });
  await prev;
  try {
    f.eng.dispatch(f.w, input, callId, { parent, deadlineUs: own });
    for (;;) {
      const msg = await f.w.recv();
      if (msg.kind === INVOKE) {
        const callee = msg.inline.subarray(0, msg.nameLen).toString();
        const data = f.eng.payload(msg, 'i');
        runCall(callee, data, msg.callId, msg.parentCallId, msg.deadlineUs).then((r) => {
          f.eng.reply(f.w, msg.callId, r.payload, r.kind === FAILURE ? r.errorKind : 0);
        });
        continue;
      }
      assert.equal(msg.callId, callId);
      return { kind: msg.kind, errorKind: msg.errorKind, payload: f.eng.payload(msg, 'o'), deadlineUs: own };
    }
  } finally {
    release();
  }
}

function gateway(role, input = '') {
  return runCall(`conf-node-${role}`, Buffer.from(input), GATEWAY | nextId++, 0n, 0n);
}

async function ok(role, input) {
  const r = await gateway(role, input);
  assert.equal(r.kind, COMPLETION, r.payload.toString());
  return r.payload;
}

describe('conformance functions (node)', T, () => {
  before(async () => {
    await Promise.all(Object.entries(ROLES).map(async ([role, [exp, timeout]]) => {
      const name = `conf-node-${role}`;
      const eng = new Engine({ name, files: { 'conf.mjs': CODE }, handler: `conf.mjs:${exp}` });
      await eng.hello();
      fns.set(name, { eng, w: await eng.createWorker(), timeout, lock: Promise.resolve() });
    }));
  });
  after(async () => {
    await Promise.all([...fns.values()].map((f) => f.eng.close()));
  });

  test('the manifest deploys every role with the right handler and timeouts', () => {
    // The manifest's simple shape: `  <name>:` then `    key: value` lines.
    const manifest = {};
    let current = null;
    for (const line of MANIFEST.split('\n')) {
      let m = /^ {2}(\S+):$/.exec(line);
      if (m) manifest[(current = m[1])] = {};
      else if ((m = /^ {4}(\w+): (\S+)$/.exec(line)) && current) manifest[current][m[1]] = m[2];
    }
    assert.deepEqual(Object.keys(manifest).sort(), Object.keys(ROLES).map((r) => `conf-node-${r}`).sort());
    for (const [role, [exp, timeout]] of Object.entries(ROLES)) {
      const fn = manifest[`conf-node-${role}`];
      assert.equal(fn.runtime, 'node', role);
      assert.equal(fn.handler, `conf.mjs:${exp}`, role);
      if (timeout !== 30) assert.equal(fn.timeout, `${timeout}s`, role);
    }
  });

  test('nop', async () => {
    assert.equal((await ok('nop', 'anything')).length, 0);
  });

  test('echo 0 B / 960 B / 961 B / 1 MiB, direct and through call', async () => {
    for (const size of [0, 960, 961, 1 << 20]) {
      const data = Buffer.alloc(size);
      for (let i = 0; i < size; i++) data[i] = (i * 13 + 7) & 0xff;
      assert.ok((await ok('echo', data)).equals(data), `direct ${size}`);
      const via = await ok('call', Buffer.concat([Buffer.from('conf-node-echo:'), data]));
      assert.ok(via.equals(data), `through call ${size}`);
    }
    for (const f of fns.values()) assert.deepEqual(fs.readdirSync(f.eng.shm), []);
  });

  test('fail: function_error with the message', async () => {
    const r = await gateway('fail', 'oops');
    assert.equal(r.kind, FAILURE);
    assert.equal(ERROR_NAMES[r.errorKind], 'function_error');
    assert.match(r.payload.toString(), /conformance failure: oops/);
  });

  test('call: errors come back as JSON from the CallError', async () => {
    let out = JSON.parse(await ok('call', 'conf-node-missing:x'));
    assert.equal(out.error_kind, 'not_found');
    assert.equal(out.message, "function 'conf-node-missing' not found");
    out = JSON.parse(await ok('call', 'conf-node-fail:boom'));
    assert.deepEqual(out, { error_kind: 'function_error', message: 'Error: conformance failure: boom' });
  });

  test('deadline: well-formed fields', async () => {
    const before = nowUs();
    const r = await gateway('deadline');
    const out = JSON.parse(r.payload);
    assert.deepEqual(Object.keys(out), ['call_id', 'parent_call_id', 'deadline_us', 'remaining_ms']);
    assert.match(out.call_id, /^[0-9a-f]{16}$/);
    assert.equal(out.parent_call_id, '0000000000000000');
    assert.equal(BigInt(out.deadline_us), r.deadlineUs);
    assert.ok(BigInt(out.deadline_us) > before + 59_000_000n);
    assert.ok(out.remaining_ms > 58_000 && out.remaining_ms <= 60_000, String(out.remaining_ms));
  });

  test('chain-deadline: parent links, the deadline propagates', async () => {
    const callId = GATEWAY | nextId++;
    const r = await runCall('conf-node-chain-deadline', Buffer.alloc(0), callId, 0n, 0n);
    assert.equal(r.kind, COMPLETION);
    const out = JSON.parse(r.payload);
    assert.equal(out.parent_call_id, callId.toString(16).padStart(16, '0'));
    assert.notEqual(out.call_id, out.parent_call_id);
    assert.ok(BigInt(out.deadline_us) <= r.deadlineUs);
    assert.ok(out.remaining_ms <= 5000 && out.remaining_ms > 0, String(out.remaining_ms));
  });

  test('fanout: 16 concurrent calls, outputs in input order', async () => {
    const out = JSON.parse(await ok('fanout'));
    assert.deepEqual(out, Array.from({ length: 16 }, (_, i) => String(i)));
  });

  test('log: the line reaches the function log', async () => {
    assert.equal((await ok('log', 'hello 42')).toString(), 'ok');
    assert.match(fns.get('conf-node-log').eng.stderr, /^\[conf-node-log [0-9a-f]{16}\] conformance log hello 42$/m);
  });
});
