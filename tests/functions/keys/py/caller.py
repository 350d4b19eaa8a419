async def handle(ctx, data: bytes) -> bytes:
    """Calls `locked` internally: no key, the engine authorises it."""
    return b"via-caller:" + await ctx.call("locked", data)
