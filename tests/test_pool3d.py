"""avg_pool3d (refkern.kernels.pool3d): the forward against refkern.truth's exact window averages (rounded once,
in mpmath-free Fractions of its own), the int64 form against Python integers, the backward against
refkern.truth.backward, torch's argument checks; and the 1-d/2-d backward kernels still against their truth."""

import itertools
import math

import numpy as np
import pytest

import refkern.truth as truth
from refkern.gradients import backward
from refkern.kernels.pool3d import avg_pool3d, integer_avg_pool3d

GEOMETRIES = [  # (input shape, kwargs): torch's OpInfo shapes and arguments, ceil_mode, padding, overrides
    ((2, 3, 3, 4, 4), dict(kernel_size=(2, 2, 2))),
    ((1, 2, 4, 4, 4), dict(kernel_size=2, stride=1, padding=1, ceil_mode=True, count_include_pad=False,
                           divisor_override=2)),
    ((1, 2, 5, 5, 5), dict(kernel_size=(2, 3, 4), stride=(1, 2, 2), padding=(0, 1, 2), ceil_mode=True)),
    ((1, 7, 5, 7), dict(kernel_size=(6, 3, 4), stride=(2, 3, 2), padding=(3, 1, 0), count_include_pad=False)),
    ((1, 1, 4, 5, 4), dict(kernel_size=(2, 2, 3), stride=(2, 2, 1), divisor_override=-2)),
    ((1, 1, 6, 5, 6), dict(kernel_size=(4, 5, 6), stride=(2, 3, 2), padding=2, ceil_mode=True)),
    ((2, 2, 3, 3, 3), dict(kernel_size=3, stride=[], padding=1, divisor_override=7)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("shape, kw", GEOMETRIES)
def test_forward_is_the_exact_average_rounded_once(shape, kw, dtype):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 8, shape)).astype(dtype)
    got = avg_pool3d(x, **kw)
    want = truth.avg_pool3d(x, **kw)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_forward_decides_midpoints_and_cancellations():
    """Windows of two float32 values whose mean is a float32 midpoint (1 + 2**-24, ties to even: 1), a window
    whose float64 sum is inexact (1e30, 1, -1e30: mean 1/3 exactly rounded), and a cancelling window (+0)."""
    x = np.zeros((1, 1, 2, 1, 3), np.float32)
    x[0, 0, :, 0, 0] = [1.0, np.float32(1.0 + 2.0**-23)]  # mean 1 + 2**-24: the midpoint of 1 and 1 + 2**-23
    x[0, 0, :, 0, 1] = [np.float32(1.0 + 2.0**-23), np.float32(1.0 + 2.0**-22)]  # mean 1 + 3 * 2**-24: up
    x[0, 0, :, 0, 2] = [-2.5, 2.5]
    got = avg_pool3d(x, kernel_size=(2, 1, 1))
    assert got[0, 0, 0, 0].tolist() == [1.0, np.float32(1.0 + 2.0**-22), 0.0]
    assert not np.signbit(got[0, 0, 0, 0, 2])
    y = np.array([1e30, 1.0, -1e30, 0.0]).reshape(1, 1, 4, 1, 1)
    assert avg_pool3d(y, kernel_size=(3, 1, 1), stride=1)[0, 0, 0, 0, 0] == 1.0 / 3.0  # 1/3 rounded once


def test_nan_and_inf_follow_ieee_on_the_exact_sum():
    x = np.ones((1, 1, 2, 2, 4))
    x[0, 0, 0, 0, 0] = np.nan
    x[0, 0, 0, 0, 2] = np.inf
    got = avg_pool3d(x, kernel_size=2)[0, 0, 0, 0]
    assert np.isnan(got[0]) and got[1] == np.inf


def _int_truth(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """torch's int64 rule from Python integers: the window's sum wrapped to int64, divided with truncation."""
    k, s, p = (tuple(v) if isinstance(v, tuple) else (v,) * 3 for v in (kernel_size, stride or kernel_size, padding))
    sizes = x.shape[-3:]
    outs = []
    for a in range(3):
        o = (sizes[a] + 2 * p[a] - k[a] + (s[a] - 1 if ceil_mode else 0)) // s[a] + 1
        if ceil_mode and (o - 1) * s[a] >= sizes[a] + p[a]:
            o -= 1
        outs.append(o)
    planes = x.reshape(-1, *sizes)
    out = np.empty((planes.shape[0], *outs), np.int64)
    for q in range(planes.shape[0]):
        for o in itertools.product(*map(range, outs)):
            box = [(o[a] * s[a] - p[a], min(o[a] * s[a] - p[a] + k[a], sizes[a] + p[a])) for a in range(3)]
            inside = [range(max(b, 0), min(e, sizes[a])) for a, (b, e) in enumerate(box)]
            total = sum(int(planes[(q, *i)]) for i in itertools.product(*inside))
            total = (total + 2**63) % 2**64 - 2**63
            d = divisor_override or (math.prod(e - b for b, e in box) if count_include_pad
                                     else math.prod(len(r) for r in inside))  # fmt: skip
            quo = abs(total) // abs(d)
            out[(q, *o)] = quo if (total < 0) == (d < 0) else -quo
    return out.reshape(*x.shape[:-3], *outs)


@pytest.mark.parametrize("shape, kw", GEOMETRIES[:6])
def test_int64_is_torchs_truncating_division_of_the_wrapped_sum(shape, kw):
    rng = np.random.default_rng(1)
    x = rng.integers(-(2**62), 2**62, shape, dtype=np.int64)  # sums wrap modulo 2**64
    x.reshape(-1)[::3] = rng.integers(-50, 50, x.size)[::3]
    full = dict(stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None) | kw
    got = integer_avg_pool3d(x, **full)
    np.testing.assert_array_equal(got, _int_truth(x, **full))
    with pytest.raises(TypeError, match=r"avg_pool3d: an integer input must be int64.*input.dtype=int32"):
        integer_avg_pool3d(x.astype(np.int32), 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, kw", GEOMETRIES)
def test_backward_is_the_exact_gradient_rounded_once(shape, kw, dtype):
    rng = np.random.default_rng(len(shape) + sum(shape))
    x = rng.standard_normal(shape).astype(dtype)
    g = rng.standard_normal(truth.avg_pool3d(x, **kw).shape).astype(dtype)
    got = backward("avg_pool3d", g, input=x, **kw)["input"]
    want = truth.backward("avg_pool3d", g, input=x, **kw)["input"]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, shape, kw", [
    ("avg_pool1d", (2, 3, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d", (2, 5, 7), dict(kernel_size=(3, 2), stride=(2, 1), padding=1, divisor_override=-3)),
    ("adaptive_avg_pool1d", (2, 3, 7), dict(output_size=3)),
    ("adaptive_avg_pool2d", (1, 2, 5, 7), dict(output_size=(2, 3))),
    ("max_pool1d", (2, 3, 9), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ("max_pool2d", (1, 2, 6, 7), dict(kernel_size=(3, 2), stride=1, padding=1, ceil_mode=True)),
])  # fmt: skip
def test_the_1d_and_2d_backwards_through_the_3_axis_scatter(op, shape, kw):
    """The 1-d and 2-d poolings' backward, since it runs through the one 3-axis scatter (a 1-d pooling's plane
    of height and depth 1), against the truth's term-by-term Fractions."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::4] = 0.5  # equal maxima: the first in scan order takes the gradient
    g = rng.standard_normal(getattr(truth, op)(x, **kw).shape).astype(np.float32)
    got = backward(op, g, input=x, **kw)["input"]
    np.testing.assert_array_equal(got, truth.backward(op, g, input=x, **kw)["input"])


@pytest.mark.parametrize("shape, kw, error, match", [
    ((3, 4, 4), dict(kernel_size=2), ValueError,
     r"avg_pool3d: input must have shape \(C, D, H, W\) or \(N, C, D, H, W\); got input.shape=\(3, 4, 4\)"),
    ((1, 0, 4, 4), dict(kernel_size=2), ValueError, r"avg_pool3d: input must have nonzero C, D, H and W"),
    ((1, 4, 4, 4), dict(kernel_size=2, padding=2), ValueError, r"avg_pool3d: padding must be at most half"),
    ((1, 4, 4, 4), dict(kernel_size=(2, 2)), ValueError, r"kernel_size must be an int or a tuple of 3 ints"),
    ((1, 4, 4, 4), dict(kernel_size=2, divisor_override=0), ValueError, r"divisor_override must be nonzero"),
    ((1, 4, 4, 4), dict(kernel_size=2, divisor_override=1.5), TypeError, r"divisor_override must be an int or None"),
    ((1, 4, 4, 4), dict(kernel_size=2, ceil_mode=1), TypeError, r"ceil_mode must be a bool; got ceil_mode=1"),
    ((1, 2, 4, 4), dict(kernel_size=3), ValueError, r"avg_pool3d: the output would be empty"),
])  # fmt: skip
def test_bad_arguments_are_named(shape, kw, error, match):
    with pytest.raises(error, match=match):
        avg_pool3d(np.ones(shape, np.float32), **kw)


def test_torch_tensors_in_and_out_and_torchs_own_values():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 5, 6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
    got = avg_pool3d(x, **kw)
    want = torch.nn.functional.avg_pool3d(x, **kw)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64 and got.shape == want.shape
    # torch's float64 sum of at most 27 terms and its division: within gamma_27 of the windows' mean |x|, plus the
    # reference's own half ulp (Higham 2002, (3.4))
    scale = torch.nn.functional.avg_pool3d(x.abs(), **kw)
    assert ((got - want).abs() <= 28 * 2.0**-53 * scale + 2.0**-53 * got.abs()).all()
    ints = torch.randint(-(2**62), 2**62, (1, 2, 4, 4, 4), generator=torch.Generator().manual_seed(1))
    for k in (dict(kernel_size=2), dict(kernel_size=3, padding=1, divisor_override=-3, ceil_mode=True, stride=2)):
        assert torch.equal(integer_avg_pool3d(ints, **k), torch.nn.functional.avg_pool3d(ints, **k))
