"""Python client for the Plover HTTP API.

Standard library only; NumPy is used, and imported, only when you pass an
array or ask for one (``dtype=``).

    import plover
    c = plover.Client()                     # $PLOVER_SERVER, $PLOVER_TOKEN
    out = c.invoke("vecadd", b"...")        # bytes in, bytes out
    print(c.last_start, c.last_timing["kernels"])
"""

from .client import (
    DEFAULT_SERVER,
    BUNDLE_MEDIA_TYPE,
    Client,
    PloverError,
    parse_error,
    parse_server_timing,
)

__all__ = [
    "DEFAULT_SERVER",
    "BUNDLE_MEDIA_TYPE",
    "Client",
    "PloverError",
    "parse_error",
    "parse_server_timing",
]
__version__ = "0.1.0"
