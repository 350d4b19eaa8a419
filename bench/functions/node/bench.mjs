export function nop() {
  return undefined;
}

// Input "<n>:<function>": n sequential internal calls, each timed; returns
// the latencies as n little-endian u32 nanoseconds.
export async function caller(ctx, data) {
  const text = data.toString();
  const colon = text.indexOf(':');
  const n = Number.parseInt(text.slice(0, colon), 10);
  const target = text.slice(colon + 1);
  const out = Buffer.alloc(4 * n);
  const empty = Buffer.alloc(0);
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await ctx.call(target, empty);
    out.writeUInt32LE(Number(process.hrtime.bigint() - t0), 4 * i);
  }
  return out;
}
