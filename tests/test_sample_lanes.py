"""The verdict's left-to-right and pairwise models on a sample with rows as vector lanes
(refkern.analysis.evaluate: _naive_lanes, _pairwise_lanes) against sums written here: every term rounded
to the format, each partial sum rounded to it, the bias last; the rounding by strategies.round_fraction
(exact rationals), a float64 sum of two values of a format of p <= 24 bits rounded once more being the
format's own sum (53 >= 2 p + 2). Row counts cross the 32 lanes and the 64-row tasks."""

import math
import types
from fractions import Fraction

import numpy as np
import pytest
from strategies import round_fraction

from refkern.analysis.evaluate import sample_run
from refkern.kernels._element import NAIVE, PAIRWISE

FORMATS = {"bfloat16": (8, -126, 127), "float16": (11, -14, 15), "tfloat32": (11, -126, 127)}


def _rnd(v, fmt):
    if not math.isfinite(v):
        return v
    if fmt == "tfloat32":  # float32's range, 11 bits: round_fraction's bfloat16 rule with 11 bits
        prec, emin, emax = FORMATS[fmt]
        if v == 0:
            return v
        q = abs(Fraction(v))
        e = math.frexp(v)[1] - 1
        quantum = Fraction(2) ** (max(e, emin) - prec + 1)
        n, rest = divmod(q, quantum)
        if rest > quantum / 2 or (rest == quantum / 2 and n % 2 == 1):
            n += 1
        r = math.inf if n * quantum >= Fraction(2) ** (emax + 1) else float(n * quantum)
        return math.copysign(r, v)
    return math.copysign(round_fraction(Fraction(v), fmt), v) if v != 0 else v


def _terms(L, R, bias, has_bias, s, fmt):
    t = [_rnd(float(L[s, k] * R[s, k]), fmt) for k in range(L.shape[1])]
    return t + ([_rnd(float(bias[s]), fmt)] if has_bias else [])


def _naive(L, R, bias, has_bias, fmt):
    out = []
    for s in range(L.shape[0]):
        c = 0.0
        for t in _terms(L, R, bias, has_bias, s, fmt):
            c = _rnd(c + t, fmt)
        out.append(c)
    return np.array(out)


def _pairwise(L, R, bias, has_bias, fmt):
    out = []
    for s in range(L.shape[0]):
        x = _terms(L, R, bias, has_bias, s, fmt)
        while len(x) > 1:  # one level: neighbours summed, an odd last one carried up
            x = [_rnd(x[2 * k] + x[2 * k + 1], fmt) for k in range(len(x) // 2)] + ([x[-1]] if len(x) % 2 else [])
        out.append(x[0] if x else 0.0)
    return np.array(out)


def _data(rows, K, fmt, seed):
    rng = np.random.default_rng(seed)
    r = np.vectorize(lambda v: _rnd(float(v), fmt), otypes=[np.float64])
    L = r(rng.standard_normal((rows, K)) * 2.0 ** rng.integers(-20, 12, (rows, K)))
    R = rng.choice([0.5, 1.0, 2.0**-12, 3.0, -1.0, 2.0**-120], (rows, K))
    if K >= 4:
        L[0, :4] = [1.0, 2.0**-8, 2.0**-8, 2.0**-8]  # ties to even in bfloat16 (and inexact sums in the others)
        R[0, :4] = 1.0
        L[-1, :] = -0.0  # every term -0: the sum starts at +0
    if rows > 2 and K >= 3:
        L[1, :3], R[1, :3] = [60000.0, 60000.0, -60000.0], 1.0  # float16 overflows to inf, stays inf
    b = r(rng.standard_normal(rows))
    return np.ascontiguousarray(L, np.float64), np.ascontiguousarray(R, np.float64), b


@pytest.mark.parametrize("method", [NAIVE, PAIRWISE])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rows, K", [(1, 5), (33, 37), (70, 16), (5, 1), (3, 0)])
@pytest.mark.parametrize("has_bias", [False, True])
def test_lanes_equal_the_sums_written_out(method, fmt, rows, K, has_bias):
    L, R, b = _data(rows, K, fmt, rows * 100 + K)
    p = types.SimpleNamespace(kernel_args=(method, True, *FORMATS[fmt]))
    got, _ = sample_run(L, R, b, has_bias, p)
    want = (_naive if method == NAIVE else _pairwise)(L, R, b, has_bias, fmt)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_pairwise_is_not_left_to_right():
    """The tree and the chain differ here (bfloat16): each of the chain's additions of 2**-8 to 1 ties to
    even (1), the tree's second level adds 2**-8 + 2**-8 = 2**-7 to 1 exactly."""
    L = np.array([[1.0, 2.0**-8, 2.0**-8, 2.0**-8]])
    R = np.ones_like(L)
    chain = sample_run(L, R, np.zeros(1), False, types.SimpleNamespace(kernel_args=(NAIVE, True, 8, -126, 127)))[0]
    tree = sample_run(L, R, np.zeros(1), False, types.SimpleNamespace(kernel_args=(PAIRWISE, True, 8, -126, 127)))[0]
    assert chain[0] == 1.0 and tree[0] == 1.0 + 2.0**-7
