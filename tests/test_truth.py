"""The ground truth itself, checked against exact rationals (fractions.Fraction)."""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import FORMAT_NAMES, exact_dot, round_fraction, same, to_array, values, vectors

from refkern import truth


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_truth_dot_equals_fraction(fmt, data):
    xs = data.draw(vectors(fmt, max_size=25))
    ys = data.draw(st.lists(values(fmt), min_size=len(xs), max_size=len(xs)))
    got = truth.dot(to_array(xs, fmt), to_array(ys, fmt))
    want = round_fraction(exact_dot(xs, ys), fmt)
    assert same(got, want) or (want == 0 and float(got) == 0)


def test_mpmath_default_precision_would_be_wrong():
    """Why the precision is derived: at 53 bits mpmath drops the 1."""
    with mpmath.workprec(53):
        assert mpmath.fsum([mpmath.mpf(2) ** 1000, 1, -(mpmath.mpf(2) ** 1000)]) == 0
    assert truth.sum(np.array([2.0**1000, 1.0, -(2.0**1000)])) == 1.0


def test_derived_precision_covers_the_span():
    terms = [(2.0**1000, 2.0**20), (2.0**-1074, 0.5)]
    assert truth.exact_precision(terms) >= (1000 + 21) - (-1074 - 106)


def test_explicit_low_precision_is_honoured():
    """A user-chosen precision is used as given (and can be inexact): documented, not hidden."""
    x = np.array([2.0**100, 1.0, -(2.0**100)])
    assert truth.sum(x, precision=53) == 0.0
    assert truth.sum(x) == 1.0


@pytest.mark.parametrize(
    "xs,ys,want",
    [
        ([math.inf, 0.0], [0.0, 1.0], math.nan),
        ([math.inf, -math.inf], [1.0, 1.0], math.nan),
        ([math.inf, 1e308], [1.0, 1e308], math.inf),
        ([-0.0], [1.0], -0.0),
        ([1e-200], [-1e-200], -0.0),  # a nonzero product that rounds to -0 in float64
    ],
)
def test_truth_specials(xs, ys, want):
    assert same(truth.dot(np.array(xs), np.array(ys)), want)
