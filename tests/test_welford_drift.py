"""The norms' sequential-Welford member (refkern.analysis.noise): the drift it allows is the drift of the
sequential Welford kernels, emulated on the rows (noise_rows.welford_drift), not the worst case of every
step's rounding taken with one sign, which on fp16 rows of mean 300 was 70-160x wider than any of them and
passed bugs of 8 to 32 spreads of correct kernels as rounding."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import refkern as rk
from refkern.analysis.noise_rows import welford_drift


def test_welford_drift_by_hand():
    """The float32 row [0, 0, 1] (mean 1/3): left to right both forms give fl32(1/3) = 11184811 / 2**25,
    1 / (3 2**25) above 1/3; right to left the means are 1, 1/2, then 1/2 - fl32(1/6) = 22369621 / 2**26, a
    tie on float32's grid there, rounded to the even 11184810 / 2**25: 2 / (3 2**25) below 1/3. The larger,
    2 / (3 2**25), is the drift. A constant row does not drift."""
    X = np.array([[0.0, 0.0, 1.0], [5.0, 5.0, 5.0]], np.float32)
    D = welford_drift(X, np.array([1.0 / 3.0, 5.0]))
    assert D[0] == pytest.approx(2.0 / (3.0 * 2.0**25), rel=2e-9)  # the float64 mean: 1/3 within 2**-55
    assert D[1] == 0.0


def test_column_charge_by_hand():
    """Rows [0, 0, 1] and [1, 0, 0] (mean 1/3, var 2/9, eps 0, w = 1): each drifts by D = 2 / (3 2**25) (the
    second left to right, as the first right to left), r**2 = 9/2, so (r D)**2 = 2**-49 per element; a column's
    group sums both rows' drifts, r D + r D, and each element takes r D (r D + r D) = 2**-48 (the column's sum
    of them, 2**-47, is its drift's square). The float64 mean, 1/3 within 2**-55, holds D to 1e-9 relative."""
    from refkern.accumulate.formats import FLOAT32
    from refkern.analysis import noise as nz
    from refkern.analysis._envelope_ops import layout

    x = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], np.float32)
    args = {"input": x, "normalized_shape": (3,), "weight": None, "bias": None, "eps": 0.0}
    lay = layout("layer_norm", args, x.shape)
    ref = np.asarray(rk.layer_norm(x, (3,), eps=0.0), np.float32)
    _, _, drift_bound, drift, _ = nz._norm(lay, "layer_norm", lay.rows(ref, np.float32), 2.0**-24, FLOAT32, 0.0)
    B = drift_bound()
    assert B.tolist() == pytest.approx([2.0 / (3.0 * 2.0**25)] * 2, rel=4e-9, abs=0)
    assert drift(B).ravel().tolist() == pytest.approx([2.0**-49] * 6, rel=4e-9, abs=0)
    assert drift(B, True).ravel().tolist() == pytest.approx([2.0**-48] * 6, rel=4e-9, abs=0)


def _sequential_welford_folded(x, w, b, eps):
    """A float32 kernel: the mean and M2 by one sequential Welford pass, the folded affine form."""
    X = x.float().numpy()
    R, n = X.shape
    y = np.empty_like(X)
    W, B = w.float().numpy(), b.float().numpy()
    for i in range(R):
        m, q = np.float32(0.0), np.float32(0.0)
        for k in range(n):
            d = np.float32(X[i, k] - m)
            m = np.float32(m + d / np.float32(k + 1))
            q = np.float32(q + d * np.float32(X[i, k] - m))
        r = np.float32(1.0) / np.sqrt(np.float32(q / np.float32(n)) + np.float32(eps))
        rw = (r * W).astype(np.float32)
        y[i] = X[i] * rw + (B - m * rw)
    return torch.from_numpy(y).to(x.dtype)


@pytest.mark.parametrize("n", [4096, 8192])
def test_fp16_offset_rows_bugs_of_8_spreads_are_mismatch(n):
    """fp16 rows of mean 300 and spread 1 (about 30 values each): torch's CPU layer_norm and a float32
    sequential Welford kernel are rounding; the largest error of either from the exact result (float64) is
    the spread, and one element off, one feature offset or a constant offset of 8 spreads is a mismatch
    (with the worst-case drift bound all three were rounding at 8192 features)."""
    g = torch.Generator().manual_seed(0)
    x = (300 + torch.randn(4, n, generator=g, dtype=torch.float64)).half()
    w = (1 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).half()
    b = (0.1 * torch.randn(n, generator=g, dtype=torch.float64)).half()
    exact = F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    correct = [F.layer_norm(x, (n,), w, b, 1e-5), _sequential_welford_folded(x, w, b, 1e-5)]
    for out in correct:
        assert rk.compare(out, "layer_norm", x, (n,), w, b, eps=1e-5).verdict in ("exact", "rounding")
    spread = max(float((o.double() - exact).abs().max()) for o in correct)
    good = correct[0].double()
    a = 8 * spread
    one = good.clone().reshape(-1)
    one[n + n // 2] += a
    feature = good.clone()
    feature[:, n // 3] += a
    for bad in (one.reshape(good.shape), feature, good + a):
        rep = rk.compare(bad.half(), "layer_norm", x, (n,), w, b, eps=1e-5)
        assert rep.verdict == "mismatch", rep
