import attr
import six


def handle(ctx, payload):
    return f"six {six.__version__} attrs {attr.__version__} from {six.__file__}".encode()
