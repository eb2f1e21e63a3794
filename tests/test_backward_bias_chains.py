"""batch_norm's float32 grad_bias as a float32 sum per channel (refkern.analysis.noise_backward.bias_chains): the
long chains emulated as members, the rest charged; correct kernels are rounding, a bug of 8 spreads is not."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.accumulate.formats import FLOAT32
from refkern.analysis.noise_backward import bias_chains
from refkern.analysis.noise_chains import rest_sq

F = torch.nn.functional


def _call(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(8, 16, n // 8, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g)
    go = torch.randn(8, 16, n // 8, generator=g)
    return x, w, b, go


def _judge(bias_grad, x, w, b, go):
    return rk.compare_backward({"bias": bias_grad}, "batch_norm", go, x, None, None, w, b, training=True)["bias"]


def _lanes(G, lanes, per_image):
    """A float32 sum of each row of G (C, N, L): per image (or over the whole row) ``lanes`` strided running sums,
    then the lanes left to right, then the images left to right: one addition, one rounding at a time."""
    rows = G if per_image else G.reshape(G.shape[0], 1, -1)
    total = torch.zeros(G.shape[0])
    for i in range(rows.shape[1]):
        acc = torch.zeros(G.shape[0], lanes)
        for k in range(0, rows.shape[2], lanes):
            acc = acc + rows[:, i, k : k + lanes]
        s = torch.zeros(G.shape[0])
        for j in range(lanes):
            s = s + acc[:, j]
        total = total + s
    return total


@pytest.mark.parametrize("n", [1024, 4096])
def test_correct_kernels_are_rounding_and_eight_spreads_are_not(n):
    x, w, b, go = _call(n)
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    F.batch_norm(args[0], None, None, args[1], args[2], training=True).backward(go)
    G = go.permute(1, 0, 2)  # (C, N, L)
    exact = go.double().sum(dim=(0, 2))
    outs = {"torch": args[2].grad, "scalar loop": _lanes(G, 1, False), "8 lanes per image": _lanes(G, 8, True),
            "16 lanes": _lanes(G, 16, False)}  # fmt: skip
    for name, out in outs.items():
        assert _judge(out, x, w, b, go).verdict in ("exact", "rounding"), name
    spread = max(float((o.double() - exact).abs().max()) for o in outs.values())
    bad = outs["torch"].double().clone()
    bad[3] += 8 * spread
    assert _judge(bad.float(), x, w, b, go).verdict == "mismatch"
    scaled = outs["torch"].double() * (1 + 8 * spread / float(exact.abs().min()))
    assert _judge(scaled.float(), x, w, b, go).verdict == "mismatch"


def test_the_rest_is_the_sums_rest():
    # the element test's variance: u**2 rest_sq of each channel's terms, plus the stores 2 (u y)**2 and (T + 2)
    # operations that may underflow by float32's eta each
    x, w, b, go = _call(1024)
    X = x.permute(1, 0, 2).reshape(16, -1).double().numpy()
    G = go.permute(1, 0, 2).reshape(16, -1).double().numpy()
    got = bias_chains(X, G, {"bias": FLOAT32, "input": FLOAT32}, lambda A: A.T)
    assert got is not None
    y = G.sum(axis=1)
    eta = 2.0 ** (FLOAT32.emin - FLOAT32.prec)
    want = FLOAT32.u**2 * rest_sq(G) + 2 * (FLOAT32.u * y) ** 2 + 2 * eta**2 + 1026 * eta**2
    assert np.array_equal(got[0], want)
    members = list(got[1]())
    assert members and all(m[0].shape[1] == 16 for m in members)
