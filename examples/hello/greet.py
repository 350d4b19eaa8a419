async def handle(ctx, data: bytes) -> bytes:
    """Greets via `hello`, then shouts via the C function `upper`:
    two internal calls that never leave this machine's engine."""
    greeting = await ctx.call("hello", data)
    return await ctx.call("upper", greeting)
