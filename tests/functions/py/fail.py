def handle(ctx, data):
    raise ValueError("bad input: " + data.decode(errors="replace"))
