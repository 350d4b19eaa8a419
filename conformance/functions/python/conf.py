"""The Python runtime's conformance functions (conformance/README.md,
section 2), one handler per role, written with the runtime's ordinary API."""
import asyncio
import json

from staccato import CallError

LANG = "python"


async def nop(ctx, data):
    return None


async def echo(ctx, data):
    return data


async def fail(ctx, data):
    raise RuntimeError(f"conformance failure: {data.decode('utf-8', errors='replace')}")


async def call(ctx, data):
    """Input "<target>:<data>": the callee's output, or its error as JSON."""
    target, sep, payload = data.partition(b":")
    if not sep or not target:
        raise ValueError("input must be <target>:<data>")
    try:
        return await ctx.call(target.decode("utf-8"), payload)
    except CallError as e:
        return json.dumps({"error_kind": e.kind, "message": e.message})


async def deadline(ctx, data):
    remaining = ctx.remaining()
    return json.dumps({
        "call_id": f"{ctx.call_id:016x}",
        "parent_call_id": f"{ctx.parent_call_id:016x}",
        "deadline_us": ctx.deadline_us,
        "remaining_ms": None if remaining is None else remaining * 1000,
    })


async def chain_deadline(ctx, data):
    return await ctx.call(f"conf-{LANG}-deadline", b"")


async def fanout(ctx, data):
    """16 internal calls to echo in flight at once; outputs in input order."""
    outs = await asyncio.gather(*(ctx.call(f"conf-{LANG}-echo", str(i).encode()) for i in range(16)))
    return json.dumps([o.decode("utf-8") for o in outs])


async def log(ctx, data):
    ctx.logger.info("conformance log %s", data.decode("utf-8", errors="replace"))
    return "ok"
