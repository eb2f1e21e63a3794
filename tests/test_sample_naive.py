"""The verdict's left-to-right models on a sample (refkern.analysis.evaluate: _naive_f32 in float32
arithmetic itself, _naive_rows by round_to, four rows at a time) against numpy's float32 and float16 scalars
summed one by one: every term rounded to the format, each partial sum rounded to it, the bias last."""

import types

import numpy as np
import pytest

from refkern.analysis.evaluate import sample_run
from refkern.kernels._element import NAIVE

F32 = types.SimpleNamespace(kernel_args=(NAIVE, True, 24, -126, 127))  # a Plan's (method, narrow, prec, emin, emax)


def _truth(L, R, bias, has_bias, t=np.float32):
    """numpy's scalars of type ``t``: float64 -> t rounds once (numpy's float16 conversion too); a float16
    sum is formed in float32 and rounded to float16, innocuous as 24 >= 2 * 11 + 2."""
    out = np.empty(L.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(L.shape[0]):
            c = t(0.0)
            for k in range(L.shape[1]):
                c = t(c + t(L[s, k] * R[s, k]))  # the product is exact in float64
            if has_bias:
                c = t(c + t(bias[s]))
            out[s] = float(c)
    return out


def _f32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def _check(L, R, bias, has_bias):
    got, mag = sample_run(np.ascontiguousarray(L), np.ascontiguousarray(R), np.asarray(bias, np.float64),
                          has_bias, F32)  # fmt: skip
    want = _truth(L, R, bias, has_bias)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    return got


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 9])  # groups of four and the rows left over
@pytest.mark.parametrize("has_bias", [False, True])
def test_random_rows(rows, has_bias):
    rng = np.random.default_rng(rows)
    L, R = _f32(rng.standard_normal((rows, 37))), _f32(rng.standard_normal((rows, 37)))
    _check(L, R, _f32(rng.standard_normal(rows)), has_bias)


def test_wide_exponents_and_cancellation():
    rng = np.random.default_rng(7)
    L = _f32(rng.standard_normal((8, 64)) * 2.0 ** rng.integers(-60, 60, (8, 64)))
    R = _f32(rng.standard_normal((8, 64)) * 2.0 ** rng.integers(-60, 60, (8, 64)))
    L[:, 32:] = -L[:, :32]  # the second half cancels the first: partial sums of every size
    R[:, 32:] = R[:, :32]
    _check(L, R, np.zeros(8), False)


def test_ties_subnormals_overflow_and_zeros():
    one, tie = 1.0, 2.0**-24  # 1 + 2**-24 is a tie between 1 and 1 + 2**-23: even, 1.0
    rows = [
        ([one, tie, tie], [1.0, 1.0, 1.0], 0.0, 1.0),  # each addition ties to even: stays 1.0
        ([one, 2.0**-23, tie], [1.0, 1.0, 1.0], 0.0, 1.0 + 2.0**-22),  # 1 + 2**-23 is odd: the tie goes up
        ([2.0**-75, 2.0**-75, -(2.0**-140)], [2.0**-74, 1.0, 2.0**-9], 0.0, None),  # subnormal terms and sums
        ([3.0e38, 3.0e38, -3.0e38], [1.0, 1.0, 1.0], 0.0, np.inf),  # overflow stays inf
        ([-0.0, -0.0, -0.0], [1.0, 1.0, 1.0], 0.0, 0.0),  # +0 + -0 = +0: the sum starts at +0
        ([1.0, np.inf, -np.inf], [1.0, 1.0, 1.0], 0.0, np.nan),
        ([1.0, 2.0, 3.0], [0.5, 0.25, 0.125], 2.0**-30, None),  # a bias below the sum's last place
    ]  # fmt: skip
    L = np.array([r[0] for r in rows], np.float64)
    R = np.array([r[1] for r in rows], np.float64)
    got = _check(L, R, np.array([r[2] for r in rows]), True)
    for g, r in zip(got, rows):
        if r[3] is not None:
            assert g == r[3] or (np.isnan(g) and np.isnan(r[3]))
    assert not np.signbit(got[4])


def test_other_formats_keep_the_emulation():
    """bfloat16 (8 bits) is not float32: its left-to-right sum differs from the float32 one here."""
    L = np.array([[1.0, 2.0**-8, 2.0**-8, 2.0**-8]])
    R = np.ones_like(L)
    bf16 = types.SimpleNamespace(kernel_args=(NAIVE, True, 8, -126, 127))
    got, _ = sample_run(L, R, np.zeros(1), False, bf16)
    assert got[0] == 1.0  # every addition of 2**-8 to 1 ties to even in bfloat16
    assert _truth(L, R, np.zeros(1), False)[0] == 1.0 + 3 * 2.0**-8


@pytest.mark.parametrize("rows", [1, 4, 6])
@pytest.mark.parametrize("has_bias", [False, True])
def test_float16_rows(rows, has_bias):
    """float16 (11 bits, emin -14): subnormal terms, overflow at 65520 and ties among 64 terms."""
    rng = np.random.default_rng(rows + 10)
    L = rng.standard_normal((rows, 64)) * 2.0 ** rng.integers(-20, 12, (rows, 64))
    L = L.astype(np.float16).astype(np.float64)
    R = rng.choice([0.5, 1.0, 2.0**-12, 3.0, -1.0], (rows, 64))
    b = rng.standard_normal(rows).astype(np.float16).astype(np.float64)
    p16 = types.SimpleNamespace(kernel_args=(NAIVE, True, 11, -14, 15))
    got, _ = sample_run(L, R, b, has_bias, p16)
    want = _truth(L, R, b, has_bias, np.float16)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
