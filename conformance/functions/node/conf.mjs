// Conformance functions for the Node.js runtime (conformance/README.md),
// written with the runtime's ordinary API: handle(ctx, data: Buffer).

const hex16 = (id) => id.toString(16).padStart(16, '0');

/** nop: anything -> empty. */
export function nop() {
  return undefined;
}

/** echo: bytes -> the same bytes. */
export function echo(ctx, data) {
  return data;
}

/** fail: text -> throws, message `conformance failure: <input>`. */
export function fail(ctx, data) {
  throw new Error(`conformance failure: ${data.toString('utf8')}`);
}

/**
 * call: `<target>:<data>` -> the target's output; when the call fails,
 * (successfully) JSON {"error_kind", "message"} from the CallError caught.
 */
export async function call(ctx, data) {
  const colon = data.indexOf(0x3a); // ':'
  const target = (colon < 0 ? data : data.subarray(0, colon)).toString('utf8');
  const input = colon < 0 ? Buffer.alloc(0) : data.subarray(colon + 1);
  try {
    return await ctx.call(target, input);
  } catch (err) {
    if (!(err instanceof ctx.CallError)) throw err;
    return JSON.stringify({ error_kind: err.kind, message: err.message });
  }
}

/** deadline: anything -> JSON of the context's ids and deadline. */
export function deadline(ctx) {
  // Built by hand: deadline_us is a u64 (a BigInt here), printed exactly.
  return `{"call_id": "${hex16(ctx.callId)}", "parent_call_id": "${hex16(ctx.parentCallId)}", `
    + `"deadline_us": ${ctx.deadlineUs}, "remaining_ms": ${JSON.stringify(ctx.remainingMs())}}`;
}

/** chain-deadline: calls conf-node-deadline, returns its output unchanged. */
export async function chainDeadline(ctx) {
  return ctx.call('conf-node-deadline', '');
}

/** fanout: 16 concurrent calls to conf-node-echo ("0".."15"), outputs in input order. */
export async function fanout(ctx) {
  const outs = await Promise.all(Array.from({ length: 16 }, (_, i) => ctx.call('conf-node-echo', String(i))));
  return JSON.stringify(outs.map((out) => out.toString('utf8')));
}

/** log: text -> writes `conformance log <input>` to the function's log, returns ok. */
export function log(ctx, data) {
  ctx.logger.info(`conformance log ${data.toString('utf8')}`);
  return 'ok';
}
