import asyncio
import os


def handle(ctx, data):
    """Answers, then the whole process exits right after the reply is sent:
    the engine sees the reply and the hang-up together."""
    asyncio.get_running_loop().call_soon(os._exit, 0)
    return b"bye"
