"""The convolution kernels' speed paths behind the exact gradients (refkern.kernels.conv.element's
float64 fast path with its error bound, the chunks of gathered patches): the bound pinned by hand,
results that a wrong bound would round the other way, and bit-identical results either way."""

from fractions import Fraction

import numpy as np
import pytest

import refkern as rk
from refkern.kernels import _conv_numba, conv

torch = pytest.importorskip("torch")


def test_fast_bound_is_four_n_u_m():
    assert conv.fast_bound.py_func(1, 1.0) == 2.0**-51  # 4 * 1 * 2**-53
    assert conv.fast_bound.py_func(577, 3.0) == 4 * 577 * 3 * 2.0**-53
    assert conv.fast_bound.py_func(25089, 2.0**-900) == 4 * 25089 * 2.0**-953


def _round(q: Fraction, prec: int) -> float:
    """Round-to-nearest-even of a nonzero rational to ``prec`` significant bits (normal range), by
    integers."""
    e = int(np.floor(np.log2(abs(float(q)))))
    ulp = Fraction(2) ** (e - prec + 1)
    k = abs(q) / ulp
    f = int(k)  # toward zero
    r = k - f
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and f % 2):
        f += 1
    return float(f * ulp) * (1 if q > 0 else -1)


def _midpoint_case(sign):
    """Products 1, 2**-24 and 1000 of 2**-54: the exact sum lies just beyond the float32 midpoint
    1 + 2**-24, so it rounds up to 1 + 2**-23; a float64 sum in order loses every 2**-54 (each under
    half an ulp of 1 + 2**-24) and lands on the midpoint itself, which rounds (to even) down to 1."""
    x = np.array([1.0, 2.0**-24] + [2.0**-27] * 1000, np.float32) * sign
    w = np.array([1.0, 1.0] + [2.0**-27] * 1000, np.float32)
    exact = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, w))
    return x, w, exact


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_sum_just_past_a_midpoint_is_rounded_by_the_exact_path(sign):
    x, w, exact = _midpoint_case(sign)
    want = _round(exact, 24)
    assert want == sign * (1 + 2.0**-23)
    k = x.size
    y = rk.conv1d(x.reshape(1, 1, k), w.reshape(1, 1, k))  # one output: the whole sum
    assert float(y.reshape(-1)[0]) == want
    # the transposed kernel (grad_input's): input channels are the terms
    yt = rk.conv_transpose1d(x.reshape(1, k, 1), w.reshape(k, 1, 1))
    assert float(yt.reshape(-1)[0]) == want
    # in-order float64 summation lands on the midpoint and rounds the other way
    s = 0.0
    for a, b in zip(x.astype(np.float64), w.astype(np.float64)):
        s += a * b
    assert float(np.float32(s)) == sign * 1.0


@pytest.mark.parametrize(
    "dtype,prec,tie,want",
    [(torch.float16, 11, 1.0, 2050.0), (torch.bfloat16, 8, 8.0, 2064.0)],
)
def test_cancellation_and_ties_in_float16_and_bfloat16(dtype, prec, tie, want):
    """2048 + tie is a midpoint of ``dtype``; 2**-40 (a product of two 2**-20) breaks it upwards,
    beside two terms of 6e4 that cancel: far below the fast path's error bound (about 3e-10 for
    m near 1.2e5), so the exact path rounds it."""
    x = torch.tensor([2.0**11, tie, 2.0**-20, 6.0e4, -6.0e4]).to(dtype)
    w = torch.tensor([1.0, 1.0, 2.0**-20, 1.0, 1.0]).to(dtype)
    exact = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x.double(), w.double()))
    assert _round(exact, prec) == want
    y = rk.conv1d(x.reshape(1, 1, -1), w.reshape(1, 1, -1))
    assert float(y.reshape(-1)[0]) == want
    yt = rk.conv_transpose1d(x.reshape(1, -1, 1), w.reshape(-1, 1, 1))
    assert float(yt.reshape(-1)[0]) == want


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fast_path_matches_the_truth_and_the_blas_engine(dtype, monkeypatch):
    """Values over 12 binades: the kernel (fast path where it decides) against the mpmath truth, and
    on a larger conv against the BLAS engine (Ozaki slices, no fast path), bit for bit; gathering
    the patches two columns at a time changes no bit."""
    g = torch.Generator().manual_seed(7)
    scale = torch.pow(2.0, torch.randint(-6, 6, (2, 6, 5, 6), generator=g).double()).float()
    x = (torch.randn(2, 6, 5, 6, generator=g) * scale).to(dtype)
    w, b = torch.randn(4, 3, 3, 2, generator=g).to(dtype), torch.randn(4, generator=g).to(dtype)
    kw = dict(padding=1, groups=2, dilation=(1, 2))
    y = rk.conv2d(x, w, b, **kw)
    assert torch.equal(y, rk.truth.conv2d(x, w, b, **kw))
    xl = torch.randn(2, 32, 12, 12, generator=g).to(dtype)
    wl = torch.randn(16, 32, 3, 3, generator=g).to(dtype)
    yl = rk.conv2d(xl, wl, padding=1)
    assert torch.equal(yl, rk.conv2d(xl, wl, padding=1, engine="blas"))
    monkeypatch.setattr(_conv_numba, "_CHUNK_BYTES", 2 * 8 * 3 * 3 * 2)  # two columns per chunk: 2, 2, 2, 1 ...
    assert torch.equal(y, rk.conv2d(x, w, b, **kw))


def test_chunked_patches_match_the_truth_and_gradients_stay_exact(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 3, 7, generator=g), torch.randn(4, 3, 3, generator=g)
    go = torch.randn(2, 4, 7, generator=g)
    monkeypatch.setattr(_conv_numba, "_CHUNK_BYTES", 8 * 9 * 2)  # two columns per chunk
    fast = rk.backward("conv1d", go, x, w, padding=1)
    truth = rk.truth.backward("conv1d", go, x, w, padding=1)
    assert all(torch.equal(fast[k], truth[k]) for k in fast)
