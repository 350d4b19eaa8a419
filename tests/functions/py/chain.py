async def handle_a(ctx, data):
    return b"a(" + await ctx.call("chain-b", data) + b")"


async def handle_b(ctx, data):
    return b"b(" + await ctx.call("chain-c", data) + b")"


async def handle_c(ctx, data):
    return b"c(" + data + b")"
