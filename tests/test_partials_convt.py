"""The order term of transposed convolutions and conv3d (refkern.analysis.partials through
ConvTOperands.as_convolution and the depth slices): the bound against partial sums formed one by one over
the gathered terms, and the verdict's power with it, on the gradients judged as a transposed convolution."""

import numpy as np
import pytest
import torch
from test_partials import _sq_partials

import refkern as rk
from refkern.analysis.evaluate import problem
from refkern.analysis.partials import gemm_partials, order_bound

F = torch.nn.functional

CASES = {
    # op, input shape, weight shape, keywords: the tap-judge form of a broadcast matmul's grad_b (4 taps, dilation
    # 64), a strided, padded, dilated conv_transpose2d with groups and output_padding, a conv_transpose3d, a conv3d
    "tap judge": ("conv_transpose1d", (1, 40, 4 * 16), (40, 6, 4), dict(padding=3 * 16, dilation=16)),
    "convt2d": ("conv_transpose2d", (2, 12, 5, 6), (12, 4, 3, 2), dict(stride=2, padding=1, output_padding=1,
                                                                       groups=2, dilation=(1, 2))),  # fmt: skip
    "convt1d": ("conv_transpose1d", (3, 8, 9), (8, 5, 4), dict(stride=3, padding=2, output_padding=1)),
    "convt3d flat": ("conv_transpose3d", (1, 6, 3, 4, 4), (6, 3, 1, 3, 3), dict(stride=(1, 2, 1), padding=(0, 1, 1))),
}
DEPTH = {  # depth taps: as conv2d over depth slices, a cell of channels (c, kz) spans taps: the order-free scale
    "convt3d": ("conv_transpose3d", (1, 6, 3, 4, 4), (6, 3, 2, 3, 3), dict(stride=(1, 2, 1), padding=1)),
    "conv3d": ("conv3d", (1, 10, 5, 5, 5), (4, 10, 3, 3, 3), dict(padding=1)),
}


def _args(case, seed=3):
    op, sx, sw, kw = {**CASES, **DEPTH}[case]
    g = torch.Generator().manual_seed(seed)
    out_ch = sw[1] * kw.get("groups", 1) if op.startswith("conv_t") else sw[0]
    return op, (torch.randn(*sx, generator=g), torch.randn(*sw, generator=g), torch.randn(out_ch, generator=g)), kw


@pytest.mark.parametrize("case", list(CASES))
def test_bound_holds_in_the_orders_backends_use(case):
    op, args, kw = _args(case)
    pr = problem(op, args, kw)
    _, mag = pr.run(want_mag=True)
    bound = gemm_partials(pr, mag)
    assert bound is not None  # these had the order-free scale only
    bound = bound.reshape(-1)
    idx = np.arange(bound.size)
    checked = order_bound(pr, mag, idx[:: max(1, idx.size // 256)]).reshape(-1)
    L, R, bias, _ = pr.terms(idx)
    c_in = L.shape[1]
    taps = int(np.prod(CASES[case][2][2:]))  # the terms come as (c, taps): c_in / groups channels, then taps
    cg = c_in // taps
    chan = np.arange(c_in)
    per_tap = [chan.reshape(cg, taps)[:, t] for t in range(taps)]  # one GEMM per tap (image), then the taps added
    n = L.shape[1]
    worst = 0.0
    for i in idx:
        t = np.concatenate([[bias[i]], L[i] * R[i]])
        real = t != 0  # absent taps (0 * 0) are no addition at all: a backend forms only the products that exist

        def run(order, t=t, real=real):
            return [np.concatenate([[0], o[real[o + 1]] + 1]) for o in order]

        for order in (np.concatenate(per_tap), np.concatenate(per_tap)[::-1]):
            assert _sq_partials(t, run([order])) <= bound[i], (case, i)
        chunks = run(per_tap)
        chunks[1:] = [c[1:] for c in chunks[1:]]  # the bias in the first tap's GEMM only
        assert _sq_partials(t, [c for c in chunks if c.size]) <= bound[i], (case, i)
        for order in (chan, chan[::-1]):  # the terms' own order: covered through the check's scaling
            assert _sq_partials(t, run([order])) <= checked[i], (case, i)
        assert bound[i] <= (n + 2) * mag.reshape(-1)[i] ** 2
        worst = max(worst, bound[i] / ((n + 2) * mag.reshape(-1)[i] ** 2))
    assert worst < 1.0


@pytest.mark.parametrize("case", list(DEPTH))
def test_depth_taps_keep_the_order_free_scale(case):
    op, args, kw = _args(case)
    pr = problem(op, args, kw)
    assert gemm_partials(pr, pr.run(want_mag=True)[1]) is None


def test_matmul_grad_b_detects_one_element_at_eight_spreads():
    # a broadcast matmul's grad_b (K = 4096 over 4 batch elements, judged as one transposed convolution): torch's
    # gradient and a sequential float32 loop are rounding; one element off by 8 times their largest error is not
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 1024, 64, generator=g), torch.randn(64, 96, generator=g)
    go = torch.randn(4, 1024, 96, generator=g)
    a.requires_grad_(), b.requires_grad_()
    torch.matmul(a, b).backward(go)
    exact = torch.matmul(a.detach().double().reshape(-1, 64).T, go.double().reshape(-1, 96))
    A2, G2 = a.detach().reshape(-1, 64), go.reshape(-1, 96)
    seq = torch.zeros(64, 96)
    for k in range(A2.shape[0]):
        seq = seq + A2[k, :, None] * G2[k, None, :]
    outs = [b.grad, seq]
    for out in outs:
        assert rk.compare_backward({"b": out}, "matmul", go, a.detach(), b.detach())["b"].verdict == "rounding"
    spread = max(float((o.double() - exact).abs().max()) for o in outs)
    bad = b.grad.double().clone()
    bad[3, 5] += 8 * spread
    rep = rk.compare_backward({"b": bad.float()}, "matmul", go, a.detach(), b.detach())["b"]
    assert rep.verdict == "mismatch"
