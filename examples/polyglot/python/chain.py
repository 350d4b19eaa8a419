async def handle(ctx, data: bytes) -> bytes:
    inner = await ctx.call("poly-go", data)
    return b"python(" + inner + b")"
