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
def test_matches_integer_rounding(fmt, x):
    m, e = math.frexp(x)
    man, exp = int(abs(m) * 2**53), e - 53
    want = round_exact(x < 0, man, exp, fmt)
    assert same(round_to(x, *fmt.params), want)
    assert same(want, round_fraction(__import__("fractions").Fraction(x), fmt.name)) or x == 0


def test_float64_is_identity():
    for x in (1.0 + 2.0**-52, 5e-324, -0.0, math.inf):
        assert same(round_to(x, *FLOAT64.params), x)
