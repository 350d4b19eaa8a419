import os


async def handle(ctx, data: bytes) -> bytes:
    name = data.decode() or "world"
    ctx.logger.info("greeting %s", name)
    return f"{os.environ.get('GREETING', 'Hello')}, {name}!".encode()
