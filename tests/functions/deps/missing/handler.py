def handle(ctx, payload):
    return payload
