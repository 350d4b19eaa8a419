"""Worker messages, docs/protocol.md §1: fixed 1024-byte messages.

A message is a 64-byte little-endian header followed by a 960-byte inline
payload area. Everything is packed by offset with one precompiled
``struct.Struct``; this module is on the hot path, so it avoids per-call
lookups and keeps validation to plain integer comparisons.
"""
import struct

MESSAGE_LEN = 1024
HEADER_LEN = 64
INLINE_MAX = MESSAGE_LEN - HEADER_LEN  # 960
NAME_MAX = 64
# A traced Dispatch's inline area starts with its trace context: trace id
# (16), span id (8), flags (1), then its tracestate (up to 512 bytes).
TRACE_CONTEXT_LEN = 25
TRACE_LEN_MAX = TRACE_CONTEXT_LEN + 512

# kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len,
# error_kind, deadline_us, send_ts_ns, aux, reserved
HEADER = struct.Struct("<HHIQQIHHQQI12s")
assert HEADER.size == HEADER_LEN

# Message kinds.
LAUNCHER_HELLO = 1
WORKER_HELLO = 2
CREATE_WORKER = 3
STOP_WORKER = 4
DISPATCH = 5
COMPLETION = 6
FAILURE = 7
INVOKE = 8
KIND_NAMES = {
    LAUNCHER_HELLO: "LauncherHello",
    WORKER_HELLO: "WorkerHello",
    CREATE_WORKER: "CreateWorker",
    STOP_WORKER: "StopWorker",
    DISPATCH: "Dispatch",
    COMPLETION: "Completion",
    FAILURE: "Failure",
    INVOKE: "Invoke",
}
KINDS = {name: code for code, name in KIND_NAMES.items()}

# Flags.
PAYLOAD_IN_SHM = 1
# Dispatch: measure the call's CPU time; Completion/Failure: aux holds it (µs).
CPU_TIME = 2

# Highest known error kind code (codes are 1..ERROR_KIND_MAX, see errors.py).
ERROR_KIND_MAX = 14

# Payload file suffixes (docs/protocol.md §1 "Shared-memory payload files").
SHM_SUFFIX = {DISPATCH: "i", INVOKE: "i", COMPLETION: "o", FAILURE: "o"}


def shm_file_name(call_id, kind):
    """The payload file of a ``kind`` message about ``call_id``, in ``shm/``."""
    return f"{call_id:016x}.{SHM_SUFFIX[kind]}"


def channel_file_names(worker_id):
    """Channel ``worker_id``'s FIFOs in the function's IPC directory: (e2w, w2e)."""
    return f"{worker_id}.e2w", f"{worker_id}.w2e"

_RESERVED = bytes(12)
_ZEROS = bytes(INLINE_MAX)
_pack = HEADER.pack
_unpack_from = HEADER.unpack_from


class WireError(ValueError):
    """A buffer that is not a valid worker message."""


class Message:
    """One decoded worker message.

    ``inline`` holds the used inline bytes: the payload when it is inline,
    the callee name for an ``Invoke`` whose input is in shm, else empty.
    """

    __slots__ = ("kind", "flags", "payload_len", "call_id", "parent_call_id",
                 "worker_id", "name_len", "error_kind", "deadline_us",
                 "send_ts_ns", "aux", "inline")

    def __init__(self, kind, flags=0, payload_len=0, call_id=0, parent_call_id=0,
                 worker_id=0, name_len=0, error_kind=0, deadline_us=0,
                 send_ts_ns=0, aux=0, inline=b""):
        self.kind = kind
        self.flags = flags
        self.payload_len = payload_len
        self.call_id = call_id
        self.parent_call_id = parent_call_id
        self.worker_id = worker_id
        self.name_len = name_len
        self.error_kind = error_kind
        self.deadline_us = deadline_us
        self.send_ts_ns = send_ts_ns
        self.aux = aux
        self.inline = inline

    @property
    def in_shm(self):
        return bool(self.flags & PAYLOAD_IN_SHM)

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self):
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__[1:])
        return f"Message({KIND_NAMES.get(self.kind, self.kind)}, {fields})"


def pack(kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len,
         error_kind, deadline_us, send_ts_ns, aux, inline):
    """Encodes one message from its fields; the runtime's fast path.

    The caller guarantees consistent fields (this is not a validator); only
    the inline size is checked because it would break the 1024-byte framing.
    """
    n = len(inline)
    if n > INLINE_MAX:
        raise WireError(f"inline payload of {n} bytes exceeds {INLINE_MAX}")
    # Concatenation measured faster than pack_into a fresh bytearray.
    return _pack(kind, flags, payload_len, call_id, parent_call_id, worker_id,
                 name_len, error_kind, deadline_us, send_ts_ns, aux,
                 _RESERVED) + inline + _ZEROS[n:]


def _fast_module():
    """staccato._fast (the hot path in C, built by scripts/setup.sh), or None
    when it was not built for this interpreter or STACCATO_PY_PURE is set
    (to anything but empty or 0)."""
    import os
    if os.environ.get("STACCATO_PY_PURE", "") not in ("", "0"):
        return None
    try:
        from . import _fast
    except ImportError:
        return None
    _fast.init(WireError)
    return _fast


FAST = _fast_module()
if FAST is not None:
    # Same arguments and bytes; a field out of range raises OverflowError
    # where struct raises struct.error (the runtime never passes one).
    pack = FAST.pack  # noqa: F811


def encode(msg):
    """Encodes ``msg`` into exactly MESSAGE_LEN bytes."""
    return pack(msg.kind, msg.flags, msg.payload_len, msg.call_id, msg.parent_call_id,
                msg.worker_id, msg.name_len, msg.error_kind, msg.deadline_us,
                msg.send_ts_ns, msg.aux, bytes(msg.inline))


def decode(buf):
    """Decodes and validates one message (bytes, bytearray or memoryview).

    Raises WireError on any rule violation listed in docs/protocol.md §1.
    """
    if len(buf) != MESSAGE_LEN:
        raise WireError(f"message is {len(buf)} bytes, expected {MESSAGE_LEN}")
    (kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len,
     error_kind, deadline_us, send_ts_ns, aux, reserved) = _unpack_from(buf)
    if not 1 <= kind <= INVOKE:
        raise WireError(f"unknown kind {kind}")
    if flags & ~(PAYLOAD_IN_SHM | CPU_TIME):
        raise WireError(f"unknown flag bits 0x{flags:04x}")
    if flags & CPU_TIME and kind != DISPATCH and kind != COMPLETION and kind != FAILURE:
        raise WireError(f"CPU_TIME on {KIND_NAMES[kind]}")
    if reserved != _RESERVED:
        raise WireError("reserved header bytes are not zero")

    if kind == INVOKE:
        if not 1 <= name_len <= NAME_MAX:
            raise WireError(f"Invoke name_len {name_len} outside 1..{NAME_MAX}")
    elif kind == DISPATCH:
        if name_len and not TRACE_CONTEXT_LEN <= name_len <= TRACE_LEN_MAX:
            raise WireError(f"Dispatch name_len {name_len} is neither 0 nor {TRACE_CONTEXT_LEN}..{TRACE_LEN_MAX}")
    elif name_len:
        raise WireError(f"name_len {name_len} on a {KIND_NAMES[kind]}")

    if flags & PAYLOAD_IN_SHM:
        if kind < DISPATCH:
            raise WireError(f"PAYLOAD_IN_SHM on {KIND_NAMES[kind]}")
        # In shm, only an Invoke's callee name or a Dispatch's trace
        # context stays inline.
        used = name_len
    else:
        if payload_len > INLINE_MAX:
            raise WireError(f"inline payload_len {payload_len} exceeds {INLINE_MAX}")
        if name_len > payload_len:
            raise WireError(f"name_len {name_len} exceeds payload_len {payload_len}")
        used = payload_len

    if kind == FAILURE:
        if not 1 <= error_kind <= ERROR_KIND_MAX:
            raise WireError(f"Failure with invalid error_kind {error_kind}")
    elif error_kind:
        raise WireError(f"error_kind {error_kind} on {KIND_NAMES[kind]}")

    inline = bytes(buf[HEADER_LEN:HEADER_LEN + used]) if used else b""
    return Message(kind, flags, payload_len, call_id, parent_call_id, worker_id,
                   name_len, error_kind, deadline_us, send_ts_ns, aux, inline)
