"""The number predicates the config, the point files, the sweep and the server share."""

import math

import pytest

from decodecliff import values

CASES = [  # value, (is_int, is_integral, is_number, is_finite_number, is_positive_seconds)
    (6, (True, True, True, True, True)),
    (6.0, (False, True, True, True, True)),
    (0.5, (False, False, True, True, True)),
    (0, (True, True, True, True, False)),
    (-1.0, (False, True, True, True, False)),
    (math.nan, (False, False, True, False, False)),
    (math.inf, (False, False, True, False, False)),
    (True, (False, False, False, False, False)),
    ("6", (False, False, False, False, False)),
    (None, (False, False, False, False, False)),
]
CHECKS = ("is_int", "is_integral", "is_number", "is_finite_number", "is_positive_seconds")


@pytest.mark.parametrize(("value", "expected"), CASES, ids=[repr(v) for v, _ in CASES])
def test_each_predicate_as_json_reads_the_value(value: object, expected: tuple) -> None:
    assert tuple(getattr(values, name)(value) for name in CHECKS) == expected
