"""An average pooling's gradient scale from its terms' partial sums (noise_backward_reductions.avg_pool_partials):
by hand on a small case, and the verdict's power with it (the order-free (k + 1) A**2 let 17-20 spreads pass)."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.analysis.noise_backward_reductions import avg_pool_partials
from refkern.kernels import pool

F = torch.nn.functional


def test_partials_by_hand():
    # avg_pool1d, kernel 2, stride 1, no padding, input of 3: outputs 0 (inputs 0, 1) and 1 (inputs 1, 2), divisor 2;
    # input 1 gets t = (g0 / 2, g1 / 2) = (1, -3): one partial sum, the total -2, both ways: 4, plus 1 + 9 = 14
    G = np.array([[2.0, -6.0]])
    spans, dconst = pool.avg_spans("avg_pool1d", 1, (1, 3), 2, 1, 0, False, True, None)
    sq = avg_pool_partials(G, spans, dconst, (3,))
    assert sq.tolist() == [[1.0, 14.0, 9.0]]  # inputs 0 and 2: one term each, its square only


def _emulated(x, go, k):
    """A float32 scatter of g / k**2 window by window in the outputs' row-major order (torch's CPU loop)."""
    gi = torch.zeros(x.shape)
    h, w = x.shape[-2:]
    for oy in range(go.shape[-2]):
        for ox in range(go.shape[-1]):
            y0, x0 = oy - k // 2, ox - k // 2
            ys, ye, xs, xe = max(y0, 0), min(y0 + k, h), max(x0, 0), min(x0 + k, w)
            gi[:, :, ys:ye, xs:xe] += go[:, :, oy : oy + 1, ox : ox + 1].float() / (k * k)
    return gi


@pytest.mark.parametrize("k", [3, 8])
def test_correct_rounding_bugs_mismatch(k):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 32, 32, generator=g)
    kw = dict(kernel_size=k, stride=1, padding=k // 2)
    xr = x.clone().requires_grad_()
    out = F.avg_pool2d(xr, **kw)
    go = torch.randn(out.shape, generator=g)
    out.backward(go)
    X = x.double().requires_grad_()
    exact = torch.autograd.grad(F.avg_pool2d(X, **kw), X, go.double())[0]
    outs = [xr.grad, _emulated(x, go, k)]
    for o in outs:
        assert rk.compare_backward({"input": o}, "avg_pool2d", go, x, **kw)["input"].verdict in ("exact", "rounding")
    spread = max(float((o.double() - exact).abs().max()) for o in outs)
    base = xr.grad.double()
    one = base.clone()
    one[1, 2, 5, 7] += 8 * spread
    scaled = base * (1 + 8 * spread / float(exact.abs().max()))
    for bad in (one, scaled):
        assert rk.compare_backward({"input": bad.float()}, "avg_pool2d", go, x, **kw)["input"].verdict == "mismatch"
