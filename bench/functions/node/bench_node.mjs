// Benchmark functions for `staccato bench micro` (Node.js).

export function nop() {
  return undefined;
}

/** Input "<n>:<function>": n sequential internal calls, each timed (u32 ns, little-endian). */
export async function caller(ctx, data) {
  const text = data.toString();
  const colon = text.indexOf(':');
  const n = Number(text.slice(0, colon));
  const target = text.slice(colon + 1);
  const out = Buffer.alloc(4 * n);
  const empty = Buffer.alloc(0);
  const clock = process.hrtime.bigint;
  for (let i = 0; i < n; i++) {
    const t0 = clock();
    await ctx.call(target, empty);
    out.writeUInt32LE(Math.min(Number(clock() - t0), 0xffffffff), 4 * i);
  }
  return out;
}
