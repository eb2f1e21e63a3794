"""round_to: one IEEE rounding to float16/bfloat16/float32, checked against numpy's and
torch's own conversions and against the integer rounding of refkern.truth."""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import round_fraction, same

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, round_to
from refkern.truth import round_exact

any_double = st.integers(0, 2**64 - 1).map(lambda p: float(np.array([p], np.uint64).view(np.float64)[0]))


@given(any_double)
@example(1.0 + 2.0**-24)  # tie: to even
@example(1.0 + 3 * 2.0**-24)  # tie: to even (up)
@example(3.4028235677973366e38)  # just below max + half ulp
@example(3.4028235677973367e38)  # max + half ulp: inf
@example(2.0**-150)  # half the smallest subnormal: tie to 0
@example(-(2.0**-150) * 1.5)
def test_float32_matches_numpy_cast(x):
    with np.errstate(over="ignore"):
        want = float(np.float64(x).astype(np.float32))
    assert same(round_to(x, *FLOAT32.params), want)


@given(any_double)
@example(65520.0)
@example(2.0**-25)
@example(-(2.0**-25) * 1.0000001)
def test_float16_matches_numpy_cast(x):
    with np.errstate(over="ignore"):
        want = float(np.float64(x).astype(np.float16))
    assert same(round_to(x, *FLOAT16.params), want)


@given(st.integers(0, 2**32 - 1).map(lambda p: float(np.array([p], np.uint32).view(np.float32)[0])))
def test_bfloat16_matches_torch_cast_from_float32(x):
    torch = pytest.importorskip("torch")
    want = torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).double().item()
    assert same(round_to(x, *BFLOAT16.params), want)


@pytest.mark.parametrize("fmt", [FLOAT16, BFLOAT16, FLOAT32])
@given(any_double.filter(math.isfinite))
@example(x=-0.0)
@example(x=0.0)
def test_matches_integer_rounding(fmt, x):
    if x == 0:  # a zero rounds to itself, its sign kept (round_exact signs a nonzero magnitude: -0.0 < 0 is False)
        assert same(round_to(x, *fmt.params), x)
        return
    m, e = math.frexp(x)
    man, exp = int(abs(m) * 2**53), e - 53
    want = round_exact(x < 0, man, exp, fmt)
    assert same(round_to(x, *fmt.params), want)
    assert same(want, round_fraction(__import__("fractions").Fraction(x), fmt.name)) or x == 0


def test_float64_is_identity():
    for x in (1.0 + 2.0**-52, 5e-324, -0.0, math.inf):
        assert same(round_to(x, *FLOAT64.params), x)


# round_to_vec (the branch-free form), truncate_to and round_away_to, and round_array's vector loops,
# against an oracle on exact rationals written here (directed and ties-away rounding: neither is in
# strategies.round_fraction, which rounds to nearest even).
_PARAMS = {"float16": (11, -14, 15), "bfloat16": (8, -126, 127), "tfloat32": (11, -126, 127),
           "float32": (24, -126, 127)}  # fmt: skip


def _oracle(x: float, fmt: str, mode: int) -> float:
    """``x`` rounded once to ``fmt``: mode 0 nearest even (overflow to inf), 1 toward zero (no overflow:
    the value keeps its exponent), 2 nearest with ties away (overflow to inf); specials unchanged."""
    from fractions import Fraction

    if not math.isfinite(x) or x == 0.0:
        return x
    prec, emin, emax = _PARAMS[fmt]
    q = abs(Fraction(x))
    e = math.frexp(x)[1] - 1  # 2**e <= |x| < 2**(e + 1), exactly
    quantum = Fraction(2) ** (max(e, emin) - prec + 1)
    n, rest = divmod(q, quantum)
    if mode == 0 and (rest > quantum / 2 or (rest == quantum / 2 and n % 2 == 1)):
        n += 1
    if mode == 2 and rest >= quantum / 2:
        n += 1
    v = n * quantum
    if mode != 1 and v >= Fraction(2) ** (emax + 1):
        v = math.inf
    return math.copysign(float(v), x)


_EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
          65504.0, 65519.99, 65520.0, 3.4028235677973366e38, 3.4028235677973367e38, 1024.5, 1025.5,
          1.0 + 2.0**-24, 1.0 + 3 * 2.0**-24, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8,
          2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-126, 2.0**-133, 1.5 * 2.0**-134, 2.0**-149, 2.0**-150,
          1.5 * 2.0**-150, 2.0**-160, 2.0**128, 2.0**16, 1e300]  # fmt: skip


@pytest.mark.parametrize("fmt", list(_PARAMS))
@given(any_double)
def test_round_to_vec_and_directed_modes_match_the_oracle(fmt, x):
    from refkern.accumulate.formats import round_away_to, round_to_vec, truncate_to

    p = _PARAMS[fmt]
    assert same(round_to_vec(x, *p), _oracle(x, fmt, 0))
    assert same(truncate_to(x, *p), _oracle(x, fmt, 1))
    assert same(round_away_to(x, *p), _oracle(x, fmt, 2))


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("fmt", list(_PARAMS))
def test_round_array_vector_loops_match_the_oracle(fmt, mode):
    """Every class of value through the vectorized loops (their remainders too: 2 * 35 + 4000 values), a
    2-D transposed view, each element as the oracle rounds it alone."""
    from refkern.accumulate.formats import round_array

    rng = np.random.default_rng(7)
    e = rng.integers(-160, 130, 1000)
    m = rng.integers(0, 2**24, 1000)
    ties = [((2.0**p + m % 2**p) + 0.5) * 2.0 ** (e - p) for p in (8, 11, 24)]  # exact ties at each precision
    x = np.concatenate([_EDGES, [-v for v in _EDGES], *ties, rng.standard_normal(1000)])
    got = round_array(x, *_PARAMS[fmt], mode)
    assert all(same(g, _oracle(float(v), fmt, mode)) for g, v in zip(got, x))
    y = x[: 74 * 54].reshape(74, 54).T
    assert np.array_equal(round_array(y, *_PARAMS[fmt], mode).view(np.int64),
                          np.array([[_oracle(float(v), fmt, mode) for v in r] for r in y]).view(np.int64))  # fmt: skip


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_round_array_keeps_the_shape(mode):
    """A 0-d array stays 0-d (np.ascontiguousarray alone would make it 1-d), a transposed 3-D view keeps its
    shape, an empty array its own."""
    from refkern.accumulate.formats import round_array

    p = _PARAMS["bfloat16"]
    got = round_array(np.float64(1.0 + 2.0**-8), *p, mode)
    assert got.shape == () and same(got[()], _oracle(1.0 + 2.0**-8, "bfloat16", mode))
    x = np.arange(24.0).reshape(2, 3, 4).transpose(2, 0, 1) * (1 + 2.0**-9)
    got = round_array(x, *p, mode)
    assert got.shape == (4, 2, 3)
    assert all(same(g, _oracle(float(v), "bfloat16", mode)) for g, v in zip(got.reshape(-1), x.reshape(-1)))
    assert round_array(np.empty((0, 5)), *p, mode).shape == (0, 5)
