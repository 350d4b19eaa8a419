"""Staccato Python function runtime.

A function is a module with ``async def handle(ctx, data: bytes)`` (or a plain
``def``) returning bytes, bytearray, memoryview, str or None. ``ctx`` is a
:class:`Context`; ``await ctx.call(name, data)`` calls another function.
"""
from .context import Context
from .errors import CallError, ErrorKind

__all__ = ["Context", "CallError", "ErrorKind"]
