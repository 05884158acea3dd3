"""What counts as a number in a value read from JSON or YAML: one definition for the study's
config, the point files, the sweep's time limits and the server's requests. A bool is never a
number (Python's True == 1; JSON's true is not 1). And what counts as a server's URL, for the
study's config and the sweep alike. Torch-free."""

from __future__ import annotations

import math
from urllib.parse import urlsplit


def is_int(value: object) -> bool:
    """An integer as written: 6, not 6.0 (a command formatted from it must read ``6``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value: object) -> bool:
    """JSON Schema's integer: 6 or 6.0 (a point file's numbers pass through float arithmetic)."""
    return is_int(value) or (isinstance(value, float) and value.is_integer())


def is_number(value: object) -> bool:
    """Any int or float, NaN and infinity included (a point file records a NaN as measured)."""
    return is_int(value) or isinstance(value, float)


def is_finite_number(value: object) -> bool:
    """A number a bound can judge: NaN passes every minimum and maximum, infinity is no limit."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def is_positive_seconds(value: object) -> bool:
    """A time limit that can run out."""
    return is_finite_number(value) and value > 0


def is_server_url(url: object) -> bool:
    """Whether ``url`` is http(s)://HOST[:PORT][/PREFIX], a port being 1..65535 (a server a sweep
    reaches: it adds /health, /generate, ... to it; a prefix: a server behind a proxy)."""
    if not isinstance(url, str):
        return False
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0  # urlsplit reads the port when asked
    except ValueError:  # not a number, or past 65535
        return False
    web = parts.scheme in ("http", "https") and bool(parts.hostname)
    return web and not parts.query and port_ok
