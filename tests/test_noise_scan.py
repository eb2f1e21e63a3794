"""A cumsum whose running sum is held in the half result format (torch's CUDA scan of float16/bfloat16 tensors,
seen on an H100: a mismatch before refkern.analysis.noise_scan): the shared errors by hand, the precision named
on an emulation of it, and a bug below the breakdown point still a mismatch."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.analysis.noise_scan import ScanShared


def test_scan_shared_by_hand():
    # one row of 3: v = u**2 (0, P1**2, P2**2); sum_i w_i e_i = d1 (w1 + w2) + d2 w2, so beyond sum sigma_i**2 w_i**2
    # (sigma_1**2 = v1, sigma_2**2 = v1 + v2) the extra variance is v1 ((w1 + w2)**2 - w1**2 - w2**2) = 2 v1 w1 w2
    v = np.array([[0.0, 3.0, 5.0]])
    coh = ScanShared(lambda w: np.asarray(w).reshape(1, 3), v)
    assert coh(np.array([7.0, 2.0, -0.5])) == pytest.approx(2 * 3.0 * 2.0 * -0.5, abs=0)
    assert coh(np.array([1.0, 0.0, 0.0])) == pytest.approx(0.0, abs=0)


def _running_sum(x):
    """cumsum along the last axis with the running sum rounded to x's dtype at every addition (in float32 first:
    the sum of two half values is exact in float32, so this is one rounding)."""
    out = torch.empty_like(x)
    acc = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for k in range(x.shape[-1]):
        acc = (acc.float() + x[..., k].float()).to(x.dtype)
        out[..., k] = acc
    return out


@pytest.mark.parametrize("dtype,p", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_a_half_running_sum_is_named(dtype, p):
    x = torch.randn(4, 4096, generator=torch.Generator().manual_seed(1)).to(dtype)
    rep = rk.compare(_running_sum(x), "cumsum", x, dim=-1)
    assert (rep.verdict, rep.precision) == ("reduced-precision", p), str(rep)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_bug_below_the_breakdown_point_is_a_mismatch(dtype):
    # torch's CPU cumsum (float32 accumulation) with 40 elements of 4 x 4096 off by 10%, inside a half running
    # sum's scale at that depth: the float32 family explains the rest, so the precision is not weighed
    x = torch.randn(4, 4096, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = torch.cumsum(x, -1).double()
    y[1, 3000:3040] *= 1.1
    rep = rk.compare(y.to(dtype), "cumsum", x, dim=-1)
    assert rep.verdict == "mismatch", str(rep)
    assert any("breakdown point" in n for n in rep.notes), rep.notes


def test_scan_var_pinned_by_hand():
    # one row 1, 1, 1, 1 (u = 2**-24): partial sums 2, 3, 4 (widened by 2 u sum|P| = 4u, 10u, 18u: binades 2, 2,
    # 4), half-ulps 2u, 2u, 4u: sigma**2 = 0, 4, 8, 24 u**2 (u P charged 4, 13, 29); the first value is stored
    from refkern.analysis.noise_scan import scan_var

    u = 2.0**-24
    assert (scan_var(np.ones((1, 4)), u)[0] / u**2).tolist() == pytest.approx([0.0, 4.0, 8.0, 24.0], abs=0)
    assert scan_var(np.zeros((2, 0)), u).shape == (2, 0)


def test_scan_var_bounds_every_addition_of_a_float32_running_sum():
    """Each addition of a float32 running sum (left to right, the scan's one order) errs by at most the
    half-ulp that scan_var charges it (its step), the error exact in float64: randn rows, offset rows (one-signed
    partial sums), rows of mixed magnitudes."""
    from refkern.analysis.noise_scan import scan_var

    rng = np.random.default_rng(3)
    X = np.stack([rng.standard_normal(2000), rng.standard_normal(2000) + 300.0,
                  rng.standard_normal(2000) * np.exp(rng.normal(0, 6, 2000))]).astype(np.float32)  # fmt: skip
    h = np.sqrt(np.diff(scan_var(X.astype(np.float64), 2.0**-24), axis=1))
    for i, row in enumerate(X):
        s, err = row[0], np.empty(len(row) - 1)
        for k in range(1, len(row)):
            s1 = np.float32(s + row[k])
            err[k - 1] = abs(float(s) + float(row[k]) - float(s1))
            s = s1
        assert np.all(err <= h[i]), (i, np.max(err / h[i]))
        assert np.mean(err <= h[i] / 2) < 0.9  # not vacuous: many additions use more than half their charge
