async def handle(ctx, data: bytes) -> bytes:
    return data
