export async function handle(ctx, data) {
  const inner = JSON.parse(await ctx.call('tr-cpp', data));
  const me = { fn: 'tr-node', trace_id: ctx.traceId, traceparent: ctx.traceparent, tracestate: ctx.tracestate };
  return JSON.stringify([me, ...inner]);
}
