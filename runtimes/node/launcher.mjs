// The Node.js launcher: `node <repo>/runtimes/node/launcher.mjs`.
//
// Started by the engine once per function, in the function's code directory
// (docs/protocol.md §1, "Launchers and workers"). It loads the handler, opens
// channel 0, says LauncherHello, and then opens every worker channel the
// engine asks for inside this same process: Node's event loop multiplexes
// all channels.
//
// Environment: STACCATO_FUNCTION, STACCATO_IPC_DIR, STACCATO_HANDLER
// (`<file>:<export>`, file relative to the working directory, default
// `handler.mjs:handle`), STACCATO_PAYLOAD_MAX (default 6 MiB).
// STACCATO_SPIN_US is a hint this runtime ignores (it cannot poll cheaply).
import { existsSync, writeSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { inspect } from 'node:util';
import { setFlagsFromString } from 'node:v8';

// The runtime's own modules are compiled whole as they load, not function
// by function on first use: the first worker's path (CreateWorker ->
// WorkerHello) otherwise compiles a few dozen functions while the engine
// waits (BENCHMARKS.md, "Worker start"). Lazy compilation is back on before
// the handler loads, so a function's own code and dependencies are not
// compiled eagerly.
setFlagsFromString('--no-lazy');
const { Runtime, logRuntime, openFifos } = await import('./runtime.mjs');
setFlagsFromString('--lazy');

const DEFAULT_HANDLER = 'handler.mjs:handle';
const DEFAULT_PAYLOAD_MAX = 6 << 20;

class StartupError extends Error {}

function oneLine(text) {
  return String(text).replace(/\s*\n\s*/g, ' | ');
}

/**
 * Loads `<file>:<export>` (ESM or CommonJS) and returns the function. The
 * export is looked up on the module, then on its default export (a CommonJS
 * module's `module.exports`).
 */
async function loadHandler(spec, cwd = process.cwd()) {
  const colon = spec.indexOf(':');
  const file = colon < 0 ? '' : spec.slice(0, colon);
  const name = colon < 0 ? '' : spec.slice(colon + 1);
  if (!file || !name) throw new StartupError(`STACCATO_HANDLER must be '<file>:<export>', got '${spec}'`);
  const path = resolve(cwd, file);
  if (!existsSync(path)) throw new StartupError(`handler file ${file} not found in ${cwd}`);
  let mod;
  try {
    mod = await import(pathToFileURL(path).href);
  } catch (e) {
    const what = e instanceof Error ? `${e.name}: ${e.message}` : inspect(e);
    throw new StartupError(`cannot load handler file ${file}: ${oneLine(what)}`);
  }
  let handler = mod[name];
  const def = mod.default;
  if (typeof handler !== 'function' && def != null && typeof def[name] === 'function') handler = def[name];
  if (handler === undefined) throw new StartupError(`handler file ${file} has no export '${name}'`);
  if (typeof handler !== 'function') {
    throw new StartupError(`handler ${file}:${name} is not a function (it is ${typeof handler})`);
  }
  return handler;
}

// The runtime's own way out; handlers get one that fails only their call.
const exitProcess = process.exit.bind(process);

// V8's gc(), exposed by the engine's --expose-gc for the launcher's warm-up
// only: gone from the global object before any handler code loads (the
// property cannot be deleted, only emptied). A handler determined to
// collect garbage can still (a new vm context, v8.setFlagsFromString); that
// touches only its own process's heap.
const collectGarbage = typeof globalThis.gc === 'function' ? globalThis.gc : null;
globalThis.gc = undefined;

function fail(fn, message) {
  try {
    writeSync(2, `staccato launcher (${fn || '?'}): ${message}\n`);
  } catch {
    // no stderr: the exit status still tells
  }
  exitProcess(1);
}

async function main() {
  const env = process.env;
  const fn = env.STACCATO_FUNCTION || '';
  const ipcDir = env.STACCATO_IPC_DIR;
  const spec = env.STACCATO_HANDLER || DEFAULT_HANDLER;
  if (!ipcDir) fail(fn, 'STACCATO_IPC_DIR is not set');
  let payloadMax = DEFAULT_PAYLOAD_MAX;
  if (env.STACCATO_PAYLOAD_MAX) {
    payloadMax = Number(env.STACCATO_PAYLOAD_MAX);
    if (!Number.isSafeInteger(payloadMax) || payloadMax < 0) {
      fail(fn, `STACCATO_PAYLOAD_MAX is not an integer: '${env.STACCATO_PAYLOAD_MAX}'`);
    }
  }

  // Load before touching channel 0, so a broken function fails at startup
  // rather than on its first call.
  let handler;
  try {
    handler = await loadHandler(spec);
  } catch (e) {
    fail(fn, e instanceof StartupError ? e.message : oneLine(e?.stack ?? e));
  }

  let fds;
  try {
    fds = openFifos(ipcDir, 0);
  } catch (e) {
    fail(fn, `cannot open channel 0: ${e.message}`);
  }

  // One process serves every worker: a stray error in one invocation's
  // callbacks is logged, not allowed to kill the others (like an asyncio
  // loop's exception handler).
  process.on('unhandledRejection', (reason) => {
    logRuntime('ERROR', `${fn}: unhandled promise rejection: ${reason?.stack ?? inspect(reason)}`);
  });
  process.on('uncaughtException', (err) => {
    logRuntime('ERROR', `${fn}: uncaught exception: ${err?.stack ?? inspect(err)}`);
  });

  // One process runs every call of the function: process.exit() in one
  // handler fails that call (it throws) instead of ending the others.
  process.exit = (code) => {
    throw new Error(`process.exit(${code ?? ''}) called by the handler: this call failed, the function's other calls go on`);
  };

  const runtime = new Runtime({
    function: fn,
    ipcDir,
    handler,
    payloadMax,
    onStop: (reason) => {
      logRuntime('INFO', `${fn}: launcher exiting (${reason})`);
      exitProcess(0);
    },
  });
  runtime.start(fds[0], fds[1], collectGarbage);
}

await main();
