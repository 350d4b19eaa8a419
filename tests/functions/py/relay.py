async def handle(ctx, data):
    """Forwards its input through an internal call; the caller's name goes first."""
    target = ctx.call_id and "echo"
    out = await ctx.call(target, data)
    return out
