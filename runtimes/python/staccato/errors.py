"""Error kinds (docs/protocol.md §1, "Error kinds") and the call error type."""
import enum


class ErrorKind(enum.IntEnum):
    """Wire error kind codes. Member names are the protocol's names, so
    ``ErrorKind(code).name`` is the name used in gateway error bodies."""

    not_found = 1
    payload_too_large = 2
    function_error = 3
    worker_crashed = 4
    timeout = 5
    engine_unavailable = 6
    bad_request = 7
    internal = 8
    out_of_memory = 9
    output_too_large = 10
    call_cycle = 11
    call_depth_exceeded = 12
    function_removed = 13
    overloaded = 14


# Plain dicts for the hot path (enum lookups are comparatively slow).
ERROR_NAMES = {k.value: k.name for k in ErrorKind}
ERROR_CODES = {k.name: k.value for k in ErrorKind}


class CallError(Exception):
    """An internal call (``Context.call``) ended in a Failure.

    ``kind`` is the error kind name (e.g. ``'not_found'``), ``message`` the
    UTF-8 message sent by the engine or callee.
    """

    def __init__(self, kind, message=""):
        super().__init__(kind, message)
        self.kind = kind
        self.message = message

    @property
    def code(self):
        """The numeric error kind code, or None for an unknown name."""
        return ERROR_CODES.get(self.kind)

    def __str__(self):
        return f"{self.kind}: {self.message}" if self.message else self.kind
