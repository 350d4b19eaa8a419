// The Staccato Node.js runtime's public names, for code that wants them by
// import (handlers normally need only their `ctx`; `ctx.CallError` is the
// same class as CallError here).
//
//   export async function handle(ctx, data) {
//     try {
//       return await ctx.call('other', data);
//     } catch (err) {
//       if (err instanceof ctx.CallError && err.kind === 'not_found') return 'no other';
//       throw err;
//     }
//   }
export { CallError, ErrorKind, ERROR_NAMES } from './errors.mjs';
export { Context } from './context.mjs';
