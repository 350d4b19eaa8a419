// Error kinds (docs/protocol.md §1, "Error kinds") and the call error type.

/** Error kind name -> wire code. Names are the protocol's names. */
export const ErrorKind = Object.freeze({
  not_found: 1,
  payload_too_large: 2,
  function_error: 3,
  worker_crashed: 4,
  timeout: 5,
  engine_unavailable: 6,
  bad_request: 7,
  internal: 8,
  out_of_memory: 9,
  output_too_large: 10,
  call_cycle: 11,
  call_depth_exceeded: 12,
  function_removed: 13,
  overloaded: 14,
});

/** Wire code -> error kind name (index 0 unused). */
export const ERROR_NAMES = Object.freeze(
  Object.entries(ErrorKind).reduce((names, [name, code]) => { names[code] = name; return names; }, []));

/**
 * An internal call (`ctx.call`) ended in a Failure. `kind` is the error kind
 * name (e.g. 'not_found'), `message` the UTF-8 message the engine or the
 * callee sent.
 */
export class CallError extends Error {
  constructor(kind, message = '') {
    super(message);
    this.name = 'CallError';
    this.kind = kind;
  }

  /** The numeric error kind code, or undefined for an unknown name. */
  get code() {
    return ErrorKind[this.kind];
  }

  toString() {
    return this.message ? `CallError: ${this.kind}: ${this.message}` : `CallError: ${this.kind}`;
  }
}
