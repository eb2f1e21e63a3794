"""The non-exact methods: each meets its published error bound (asserted exactly, with
rationals), and "naive" reproduces a plain sequential loop in its format bit for bit."""

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import FORMAT_NAMES, PARAMS, exact_dot, gendot, same, to_array

import refkern as rk

# values k/8, 2 <= |k| <= 64: exact in every format, and products far from fp16's underflow
# (TwoProduct in fp16 needs e_a + e_b >= emin + p - 1 = -4) and overflow
moderate = st.integers(2, 64).flatmap(lambda k: st.sampled_from([k / 8.0, -k / 8.0]))


def _gamma(k, u):
    return k * u / (1 - k * u)


def bound(method, n, u, s, mag):
    """Error bounds (Higham 2002; Ogita, Rump and Oishi 2005) for a dot product of n terms,
    exact value s, sum of |terms| mag, unit roundoff u; all exact rationals."""
    if method == "naive":
        return _gamma(n, u) * mag
    if method == "pairwise":
        return _gamma(math.ceil(math.log2(max(n, 1))) + 1, u) * mag
    if method == "kahan":  # (2u + O(n u^2)) for the sum, + u for rounding the products
        return (3 * u + 8 * n * u * u) * mag
    if method == "neumaier":  # Sum2 of the rounded products
        return u * abs(s) + (u + _gamma(n, u) ** 2) * mag
    if method == "dot2":
        return u * abs(s) + _gamma(n, u) ** 2 * mag
    raise AssertionError(method)


def _check_bound(method, fmt, xs, ys):
    prec = PARAMS[fmt][0]
    u = Fraction(1, 2**prec)
    n = len(xs)
    got = rk.dot(to_array(xs, fmt), to_array(ys, fmt), accumulate=method)
    s = exact_dot(xs, ys)
    mag = sum((abs(Fraction(x) * Fraction(y)) for x, y in zip(xs, ys)), Fraction(0))
    err = abs(Fraction(float(got)) - s)
    b = bound(method, n, u, s, mag)
    assert err <= b, f"{method} in {fmt}: error {float(err):.3g} > bound {float(b):.3g} (n={n})"


METHODS = ["naive", "pairwise", "kahan", "neumaier", "dot2"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_bound_random(method, fmt, data):
    n = data.draw(st.integers(1, 60))
    xs = data.draw(st.lists(moderate, min_size=n, max_size=n))
    ys = data.draw(st.lists(moderate, min_size=n, max_size=n))
    _check_bound(method, fmt, xs, ys)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt,cond", [("float32", 1e8), ("float32", 1e20), ("float64", 1e20), ("float64", 1e40)])
def test_bound_ill_conditioned(method, fmt, cond):
    rng = np.random.default_rng(zlib.crc32(repr((method, fmt, cond)).encode()))
    xs, ys, _ = gendot(80, cond, fmt, rng)
    _check_bound(method, fmt, xs, ys)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_bound_many_lost_addends(method, fmt):
    """1 followed by many terms below half an ulp of 1: a plain loop loses every one of them
    (error ~ 0.75 n u, far above the compensated bounds), compensated methods must not."""
    prec = PARAMS[fmt][0]
    n = 150
    xs = [1.0] + [0.75 * 2.0**-prec] * n
    _check_bound(method, fmt, xs, [1.0] * len(xs))


def test_compensated_methods_beat_naive_on_ill_conditioned_data():
    """Not a bound: a sanity check that the methods differ where they should."""
    rng = np.random.default_rng(5)
    xs, ys, _ = gendot(100, 1e12, "float32", rng)
    x, y = to_array(xs, "float32"), to_array(ys, "float32")
    exact = float(rk.dot(x, y))
    naive = abs(float(rk.dot(x, y, accumulate="naive")) - exact)
    dot2 = abs(float(rk.dot(x, y, accumulate="dot2")) - exact)
    assert dot2 < naive


def _plain_loop(fmt, xs, ys):
    """A sequential loop in the format's own arithmetic (numpy or torch scalars)."""
    if fmt == "bfloat16":
        import torch

        s = torch.zeros((), dtype=torch.bfloat16)
        xt, yt = to_array(xs, fmt), to_array(ys, fmt)
        for i in range(len(xs)):
            s = s + xt[i] * yt[i]
        return s.item()
    t = {"float16": np.float16, "float32": np.float32, "float64": np.float64}[fmt]
    s = t(0)
    with np.errstate(over="ignore", invalid="ignore"):
        for x, y in zip(xs, ys):
            s = t(s + t(t(x) * t(y)))
    return float(s)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_naive_is_a_plain_loop(fmt, data):
    n = data.draw(st.integers(0, 40))
    vals = st.floats(-100, 100, width=16 if fmt == "float16" else 32).map(
        lambda v: float(to_array([v], fmt)[0])  # a value of fmt
    )
    xs = data.draw(st.lists(vals, min_size=n, max_size=n))
    ys = data.draw(st.lists(vals, min_size=n, max_size=n))
    got = rk.dot(to_array(xs, fmt), to_array(ys, fmt), accumulate="naive")
    assert same(got, _plain_loop(fmt, xs, ys))
    got_sum = rk.sum(to_array(xs, fmt), accumulate="naive")
    assert same(got_sum, _plain_loop(fmt, xs, [1.0] * n))


@given(st.lists(st.floats(-8, 8, width=32), min_size=1, max_size=50), st.data())
def test_accum_dtype_fp16_emulates_half_accumulation(xs, data):
    """float32 inputs, fp16 working format: products rounded once to fp16, then a half loop."""
    ys = data.draw(st.lists(st.floats(-8, 8, width=32), min_size=len(xs), max_size=len(xs)))
    x, y = np.asarray(xs, np.float32), np.asarray(ys, np.float32)
    got = rk.dot(x, y, accumulate="naive", accum_dtype="fp16")
    s = np.float16(0)
    with np.errstate(over="ignore", invalid="ignore"):
        for a, b in zip(x, y):
            s = np.float16(s + np.float16(np.float64(a) * np.float64(b)))  # one rounding of each product
    assert got.dtype == np.float32
    assert same(got, float(s))


def test_kahan_fails_where_neumaier_does_not():
    x = np.array([1e30, 1.0, -1e30], np.float32)
    assert rk.sum(x, accumulate="kahan") == 0.0
    assert rk.sum(x, accumulate="neumaier") == 1.0
    assert rk.sum(x, accumulate="dot2") == 1.0
