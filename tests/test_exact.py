"""accumulate="exact" is correctly rounded: bit-identical to the mpmath ground truth and to
exact rationals, on random, adversarial, ill-conditioned and special inputs."""

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import FORMAT_NAMES, exact_dot, gendot, round_fraction, same, to_array, values, vectors

import refkern as rk
from refkern import truth


def _check_dot(xs, ys, fmt):
    x, y = to_array(xs, fmt), to_array(ys, fmt)
    got = rk.dot(x, y)
    want = truth.dot(x, y)
    assert same(got, want), f"{fmt}: exact {float(got)!r} != truth {float(want)!r}"
    return got


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_dot_matches_truth_any_bits(fmt, data):
    xs = data.draw(vectors(fmt, specials=True))
    ys = data.draw(st.lists(values(fmt, specials=True), min_size=len(xs), max_size=len(xs)))
    _check_dot(xs, ys, fmt)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_sum_matches_truth_any_bits(fmt, data):
    xs = data.draw(vectors(fmt, specials=True, max_size=60))
    x = to_array(xs, fmt)
    assert same(rk.sum(x), truth.sum(x))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_dot_matches_fractions_finite(fmt, data):
    """Finite inputs: the exact rational dot product rounded once (a third implementation)."""
    xs = data.draw(vectors(fmt, max_size=30))
    ys = data.draw(st.lists(values(fmt), min_size=len(xs), max_size=len(xs)))
    got = rk.dot(to_array(xs, fmt), to_array(ys, fmt))
    want = round_fraction(exact_dot(xs, ys), fmt)
    if want == 0:  # the sign of an exact zero follows the all-terms-are--0 rule, tested below
        assert float(got) == 0
    else:
        assert same(got, want)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(
    mant=st.lists(st.integers(-(2**7), 2**7), min_size=2, max_size=200),
    shifts=st.lists(st.integers(-60, 60), min_size=2, max_size=200),
)
def test_cancelling_blocks_match_truth(fmt, mant, shifts):
    """Terms that cancel to small results across many binades, longer than one bin covers."""
    n = min(len(mant), len(shifts))
    lim = {"float16": 6, "bfloat16": 60, "float32": 60, "float64": 60}[fmt]
    xs = [m * 2.0 ** max(-lim, min(lim, s)) for m, s in zip(mant[:n], shifts[:n])]
    xs = xs + [-v for v in xs[: n // 2]]  # cancel half of them exactly
    ys = [1.0] * len(xs)
    _check_dot(xs, ys, fmt)


# GenDot (format, condition number, length): fp16's range caps its condition numbers, and
# bf16's 8 bits need more than 20 terms to reach 1e40
_GENDOT = [
    *[(f, c, n) for f in ("float32", "float64") for c in (1e3, 1e10, 1e20, 1e40) for n in (20, 101)],
    *[("bfloat16", c, n) for c in (1e3, 1e10, 1e20) for n in (20, 101)],
    ("bfloat16", 1e40, 101),
    *[("float16", c, n) for c in (1e3, 1e6) for n in (20, 101)],
]


@pytest.mark.parametrize("fmt,cond,n", _GENDOT)
def test_ill_conditioned_gendot(fmt, cond, n):
    rng = np.random.default_rng(zlib.crc32(repr((fmt, cond, n)).encode()))
    xs, ys, achieved = gendot(n, cond, fmt, rng)
    assert achieved > cond / 1e3, f"GenDot produced condition {achieved:.3g} for {cond:.3g}"
    got = _check_dot(xs, ys, fmt)
    want = round_fraction(exact_dot(xs, ys), fmt)
    assert same(got, want) or (want == 0 and float(got) == 0)


@pytest.mark.parametrize(
    "fmt,xs,ys,want",
    [
        # massive cancellation, no spurious overflow
        ("float32", [1e30, 1.0, -1e30], [1, 1, 1], 1.0),
        ("float32", [3e38, 3e38, -3e38], [1, 1, 1], float(np.float32(3e38))),
        ("float64", [1e200, -1e200, 1.0], [1e200, 1e200, 1.0], 1.0),  # products overflow float64
        # double rounding: 1 + 2**-24 + 2**-60 lies above the float32 midpoint 1 + 2**-24
        ("float32", [1.0, 2.0**-24, 2.0**-60], [1, 1, 1], 1.0 + 2.0**-23),
        ("float16", [1.0, 2.0**-11, 2.0**-24], [1, 1, 1], 1.0 + 2.0**-10),
        ("bfloat16", [1.0, 2.0**-8, 2.0**-40], [1, 1, 1], 1.0 + 2.0**-7),
        # exact midpoints: ties to even
        ("float32", [1.0, 2.0**-24], [1, 1], 1.0),
        ("float32", [1.0 + 2.0**-23, 2.0**-24], [1, 1], 1.0 + 2.0**-22),
        # overflow: beyond max + half an ulp rounds to inf, just below does not
        ("float32", [2.0**127, 2.0**127 * (1 - 2.0**-24)], [1, 1], math.inf),
        ("float32", [2.0**127, 2.0**127 * (1 - 2.0**-23)], [1, 1], float(np.finfo(np.float32).max)),
        ("float16", [65504.0, 16.0], [1, 1], math.inf),  # 65520 = max + half ulp: tie rounds to inf
        ("float16", [65504.0, 8.0], [1, 1], 65504.0),
        # subnormal results and underflow of products
        ("float32", [2.0**-149, 2.0**-149, 2.0**-150], [1, 1, 1], 2.0**-148),
        ("float64", [2.0**-600, 2.0**-537], [2.0**-500, 2.0**-537], 2.0**-1074),  # 2**-1100 + 2**-1074
        ("float64", [5e-324], [0.5], 0.0),  # 2**-1075: tie to even zero
        ("float64", [5e-324], [0.75], 5e-324),
        ("float64", [-(2.0**-1000)], [2.0**-100], -0.0),  # nonzero negative underflows to -0
        # IEEE specials
        ("float32", [math.inf, 1.0], [1, 1], math.inf),
        ("float32", [math.inf, -math.inf], [1, 1], math.nan),
        ("float32", [0.0, 1.0], [math.inf, 1.0], math.nan),  # 0 * inf
        ("float64", [math.nan, 1.0], [1.0, 1.0], math.nan),
        ("float64", [1e308, 1e308], [10.0, -10.0], 0.0),  # no inf - inf from finite inputs
        # signed zeros: -0 only if every term is -0
        ("float64", [-0.0, -0.0], [1.0, 1.0], -0.0),
        ("float64", [0.0, -0.0], [-1.0, -1.0], 0.0),
        ("float64", [1.0, -1.0], [1.0, 1.0], 0.0),
        ("float32", [], [], 0.0),
    ],
)
def test_pinned_cases(fmt, xs, ys, want):
    got = _check_dot(xs, ys, fmt)
    assert same(got, want), f"got {float(got)!r}, want {want!r}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [2047, 2048, 2049, 6151])
def test_block_boundaries(dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    assert same(rk.dot(x, y), truth.dot(x, y))
    assert same(rk.sum(x), truth.sum(x))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocks_that_need_the_slow_paths(dtype):
    """Blocks with terms below the fixed bins, subnormals, huge values and specials mixed in
    with ordinary blocks: each takes another exact path."""
    rng = np.random.default_rng(7)
    n = 5 * 2048
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    x[10] = 2.0**-100 if dtype == "float32" else 2.0**-200  # far below the block's other terms
    lo = np.finfo(dtype).smallest_subnormal
    x[2048 + 5] = lo
    y[2048 + 5] = 0.75
    x[4096 + 1] = np.finfo(dtype).max / 2
    y[4096 + 1] = 1.5
    x[4096 + 2] = -np.finfo(dtype).max / 2
    y[4096 + 2] = 1.5
    assert same(rk.dot(x, y), truth.dot(x, y))
    x[6144 + 3] = np.inf
    assert same(rk.dot(x, y), truth.dot(x, y))
    y[6144 + 3] = 0.0
    assert math.isnan(float(rk.dot(x, y)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_long_parallel_matches_truth(dtype):
    """The multi-threaded path (n >= 2**16), with a wide exponent spread."""
    rng = np.random.default_rng(11)
    n = 150_000
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    assert same(rk.dot(x, y), truth.dot(x, y))
    assert same(rk.sum(x), truth.sum(x))


def test_exact_is_independent_of_order():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(5000).astype(np.float32) * np.float32(1e4)
    y = rng.standard_normal(5000).astype(np.float32)
    p = rng.permutation(5000)
    assert same(rk.dot(x, y), rk.dot(x[p], y[p]))


@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=50))
@example([2.0**1000 / 2**1000, 1.0, -1.0])
def test_sum_of_float32_equals_fraction(xs):
    x = np.asarray(xs, np.float32)
    want = round_fraction(sum((Fraction(float(v)) for v in x), Fraction(0)), "float32")
    got = rk.sum(x)
    assert same(got, want) or (want == 0 and got == 0)
