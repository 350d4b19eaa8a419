import time
from array import array


def nop(ctx, data):
    return b""


async def caller(ctx, data):
    """Input "<n>:<function>": n sequential internal calls, each timed."""
    n, target = data.decode().split(":", 1)
    out = array("I")
    clock = time.perf_counter_ns
    call = ctx.call
    for _ in range(int(n)):
        t0 = clock()
        await call(target, b"")
        out.append(clock() - t0)
    return out.tobytes()
