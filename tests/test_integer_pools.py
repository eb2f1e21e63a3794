"""avg_pool1d/avg_pool2d of int64 (refkern.kernels.integer_pool) against the Python-int truth
(refkern.truth.integers), and the truth's rule against torch's CPU itself: the window's int64 sum (wrapping modulo
2**64) divided with truncation toward zero; judged to the bit by compare."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import refkern as rk
from refkern.kernels import integer_pool as ip
from refkern.truth import integers as ti


def test_negative_sums_truncate_toward_zero_as_torch_does():
    x = torch.tensor([[[-7, 3, -5, 4, 9, -1]]])
    # windows (-7, 3) (-5, 4) (9, -1): sums -4, -1, 8 over 2: truncation -2, 0, 4 (floor would give -2, -1, 4)
    assert F.avg_pool1d(x, 2).tolist() == [[[-2, 0, 4]]]
    assert ip.avg_pool1d(x, 2).tolist() == [[[-2, 0, 4]]] == ti.avg_pool1d(x, 2).tolist()
    # sums -7 + 3 = -4 over -3: 1 (trunc of 1.33); -1 over -3: 0; 8 over -3: -2
    assert F.avg_pool2d(x[None], (1, 2), divisor_override=-3).tolist() == [[[[1, 0, -2]]]]
    assert ip.avg_pool2d(x[None], (1, 2), divisor_override=-3).tolist() == [[[[1, 0, -2]]]]


def test_the_int64_sum_wraps_before_the_division():
    big = torch.tensor([[[2**62, 2**62, 2**62, 2**62]]])
    # 2**62 + 2**62 = 2**63 wraps to -2**63, halved: -2**62; four of them sum to 2**64, which wraps to 0
    assert F.avg_pool1d(big, 2).tolist() == [[[-(2**62), -(2**62)]]]
    assert F.avg_pool1d(big, 4).tolist() == [[[0]]]
    for k, want in ((2, [[[-(2**62), -(2**62)]]]), (4, [[[0]]])):
        assert ip.avg_pool1d(big, k).tolist() == want == ti.avg_pool1d(big, k).tolist()
        assert rk.compare(F.avg_pool1d(big, k), "avg_pool1d", big, k).verdict == "exact"


_GEOMETRY = [dict(kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=i)
             for k, s, p, c, i in itertools.product((1, 2, 3), (None, 1, 2), (0, 1), (False, True), (True, False))
             if p <= k // 2]  # fmt: skip


@pytest.mark.parametrize("kw", _GEOMETRY, ids=repr)
def test_avg_pool1d_equals_the_truth_and_torch(kw):
    g = torch.Generator().manual_seed(len(repr(kw)))
    for hi in (50, 2**62):  # small values (negative sums), then sums that wrap
        x = torch.randint(-hi, hi, (2, 3, 7), generator=g)
        got = F.avg_pool1d(x, **kw)
        want = ti.avg_pool1d(x, **kw)
        assert got.tolist() == want.tolist()
        assert ip.avg_pool1d(x, **kw).tolist() == want.tolist()
        assert ip.avg_pool1d(x.numpy(), **kw).tolist() == want.tolist()  # numpy in, numpy out
        assert rk.compare(got, "avg_pool1d", x, **kw).verdict == "exact"


@pytest.mark.parametrize("divisor_override", [None, 1, 3, -2, -7])
@pytest.mark.parametrize("kw", _GEOMETRY[::5], ids=repr)
def test_avg_pool2d_equals_the_truth_and_torch(kw, divisor_override):
    g = torch.Generator().manual_seed(len(repr(kw)))
    for hi in (50, 2**62):
        x = torch.randint(-hi, hi, (2, 5, 6), generator=g)
        got = F.avg_pool2d(x, **kw, divisor_override=divisor_override)
        want = ti.avg_pool2d(x, **kw, divisor_override=divisor_override)
        assert got.tolist() == want.tolist()
        assert ip.avg_pool2d(x, **kw, divisor_override=divisor_override).tolist() == want.tolist()
        rep = rk.compare(got, "avg_pool2d", x, **kw, divisor_override=divisor_override)
        assert rep.verdict == "exact"
        off = got.clone()
        off.view(-1)[-1] -= 1
        assert rk.compare(off, "avg_pool2d", x, **kw, divisor_override=divisor_override).verdict == "mismatch"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.bool], ids=str)
def test_integer_dtypes_torch_refuses_are_refused_by_name(dtype):
    x = torch.ones(1, 2, 4, dtype=dtype)
    with pytest.raises(RuntimeError, match="not implemented"):
        F.avg_pool1d(x, 2)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(TypeError, match=rf"^avg_pool1d: an integer input must be int64 .* got input\.dtype={name}\.$"):
        ip.avg_pool1d(x, 2)
    with pytest.raises(TypeError, match=rf"^avg_pool2d: an integer input must be int64 .* got input\.dtype={name}\.$"):
        ip.avg_pool2d(x.numpy() if dtype != torch.bool else x, 2)
    with pytest.raises(TypeError, match=r"^compare: an integer result .* argument 0 of avg_pool1d is float64"):
        rk.compare(torch.zeros(1, 2, 2, dtype=torch.int64), "avg_pool1d", torch.zeros(1, 2, 4, dtype=torch.float64), 2)


def test_shapes_and_arguments_are_checked_as_for_floats():
    x = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^avg_pool2d: input must have shape \(C, H, W\) or \(N, C, H, W\)"):
        ip.avg_pool2d(x, 2)
    with pytest.raises(ValueError, match=r"^avg_pool2d: divisor_override must be nonzero"):
        ip.avg_pool2d(x[None], 1, divisor_override=0)
    assert np.asarray(ip.avg_pool1d(np.zeros((0, 3, 4), np.int64), 2)).shape == (0, 3, 2)
