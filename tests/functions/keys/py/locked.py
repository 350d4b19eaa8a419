async def handle(ctx, data: bytes) -> bytes:
    return b"locked:" + data
