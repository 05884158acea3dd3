"""What counts as a number in a value read from JSON or YAML: one definition for the study's
config, the point files, the sweep's time limits and the server's requests. A bool is never a
number (Python's True == 1; JSON's true is not 1). Torch-free."""

from __future__ import annotations

import math


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
