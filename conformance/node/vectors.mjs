// Conformance vector program for the Node.js runtime (conformance/README.md):
//   node conformance/node/vectors.mjs testvectors/message_v1.json
// Prints one JSON object per test case, using the runtime's real codec.
import fs from 'node:fs';

import { KIND_NAMES, decode, encode } from '../../runtimes/node/wire.mjs';

const file = process.argv[process.argv.length - 1];
const vectors = JSON.parse(fs.readFileSync(file, 'utf8'));

// Message property -> vector field name (u64s as decimal strings).
const FIELDS = [
  ['kind', 'kind'], ['flags', 'flags'], ['payloadLen', 'payload_len'], ['callId', 'call_id'],
  ['parentCallId', 'parent_call_id'], ['workerId', 'worker_id'], ['nameLen', 'name_len'],
  ['errorKind', 'error_kind'], ['deadlineUs', 'deadline_us'], ['sendTsNs', 'send_ts_ns'],
  ['aux', 'aux'], ['inline', 'inline'],
];

const lines = [];
for (const tc of vectors.tests) {
  let msg;
  try {
    msg = decode(Buffer.from(tc.msg, 'hex'));
  } catch (e) {
    lines.push(JSON.stringify({ tcId: tc.tcId, decoded: false, error: e.message }));
    continue;
  }
  const fields = {};
  for (const [prop, name] of FIELDS) {
    const v = msg[prop];
    if (prop === 'kind') fields[name] = KIND_NAMES[v];
    else if (prop === 'inline') fields[name] = v.toString('hex');
    else if (typeof v === 'bigint') fields[name] = v.toString();
    else fields[name] = v;
  }
  lines.push(JSON.stringify({ tcId: tc.tcId, decoded: true, fields, reencoded: encode(msg).toString('hex') }));
}
process.stdout.write(`${lines.join('\n')}\n`);
