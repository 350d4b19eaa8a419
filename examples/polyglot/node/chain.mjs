export async function handle(ctx, data) {
  const inner = await ctx.call('poly-cpp', data);
  return `node(${inner})`;
}
