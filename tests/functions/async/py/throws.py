"""Raises: a function_error, not retried unless async.retry_on says so."""


def handle(ctx, data):
    raise RuntimeError("refused: " + data.decode(errors="replace"))
