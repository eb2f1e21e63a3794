"""var's and std's float32 gradient with the mean's long chains as members (noise_backward_reductions.
var_mean_chains): correct kernels (torch; the mean by a float32 scalar loop, by 8 lanes) are rounding; a bug of 8
spreads in one element, or as a constant offset, is a mismatch where the scalar loop's charged scale passed it."""

import numpy as np
import pytest
import torch

import refkern as rk
import refkern.analysis.noise_var_means as nbr
from refkern.accumulate.formats import FLOAT32
from refkern.analysis.noise_chains import rest_sq


def _mean_lanes(x, lanes):
    """The float32 mean of each row by ``lanes`` strided running sums, the lanes added left to right, / n."""
    acc = np.zeros((x.shape[0], lanes), np.float32)
    for k in range(0, x.shape[1], lanes):
        acc = (acc + x[:, k : k + lanes]).astype(np.float32)
    s = np.zeros(x.shape[0], np.float32)
    for j in range(lanes):
        s = (s + acc[:, j]).astype(np.float32)
    return (s / np.float32(x.shape[1])).astype(np.float32)


def _case(op, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, n, generator=g) + 300
    go = torch.randn(4, generator=g)
    xr = x.clone().requires_grad_()
    getattr(torch, op)(xr, -1, correction=1).backward(go)
    X = x.double().requires_grad_()
    exact = torch.autograd.grad(getattr(torch, op)(X, -1, correction=1), X, go.double())[0]
    xs = x.numpy()
    q = (go / (2 * torch.std(x, -1, correction=1))).numpy() if op == "std" else go.numpy()
    k = (q[:, None] * np.float32(2.0 / (n - 1))).astype(np.float32)
    outs = {"torch": xr.grad}
    for lanes in (1, 8):  # torch's formula on a mean of its own: (x - m) * (2 / dof) g, every op in float32
        m = _mean_lanes(xs, lanes)
        outs[f"mean by {lanes} lanes"] = torch.from_numpy((k * (xs - m[:, None]).astype(np.float32)).astype(np.float32))
    return x, go, exact, outs


def _judge(op, out, x, go):
    return rk.compare_backward({"x": out}, op, go, x, -1, correction=1)["x"]


@pytest.mark.parametrize("op", ["var", "std"])
def test_correct_kernels_rounding_bugs_mismatch(op):
    x, go, exact, outs = _case(op)
    for name, out in outs.items():
        assert _judge(op, out, x, go).verdict in ("exact", "rounding"), name
    spread = max(float((o.double() - exact).abs().max()) for o in outs.values())
    base = outs["torch"].double()
    one = base.clone()
    one[1, 7] += 8 * spread
    assert _judge(op, one.float(), x, go).verdict == "mismatch"
    assert _judge(op, (base + 8 * spread).float(), x, go).verdict == "mismatch"


def test_rest_variance_by_hand():
    # the exact mean's variance: u**2 (rest_sq / n**2 + mean**2), the orders of at most ceil(n / C) terms a chain
    x = (np.random.default_rng(1).standard_normal((3, 4096)) + 300).astype(np.float32).astype(np.float64)
    got = nbr.var_mean_chains(x)
    mean = x.sum(axis=1) / 4096
    want = FLOAT32.u**2 * (rest_sq(x) / 4096**2 + mean**2)
    assert np.array_equal(got[0], want)
    stages = list(got[1]())  # the sum's members, then the var family's
    assert len(stages) == 2
    means, smeans = (np.concatenate(a) for a in zip(*stages))
    assert means.shape[1] == 3 and smeans.shape == means.shape
    scalar = _mean_lanes(x.astype(np.float32), 1).astype(np.float64)  # the scalar loop's mean is a member, exactly
    assert np.any(np.all(np.abs(means - scalar[None, :]) <= np.sqrt(smeans) * 1e-9 + 1e-300, axis=1) |
                  np.all(means == scalar[None, :], axis=1))  # fmt: skip
    assert nbr.var_mean_chains(x[:, :3]) is None  # fewer than two chains: nothing emulated


def test_constants_pinned():
    assert nbr.FIT_SAMPLE == pytest.approx(16384, abs=0)
    assert nbr.MEMBER_ERR == pytest.approx(2.0**-50, abs=0)


def test_project_by_hand():
    lo = np.array([[-1.0, -1.0, np.nan], [2.0, 5.0, np.nan]])  # (intervals, rows): row 0 [-1, 1] or [2, 3], ...
    hi = np.array([[1.0, 1.0, np.nan], [3.0, 6.0, np.nan]])
    # row 0: 1.4 -> 1 (0.4 away; 2 is 0.6); row 1: 4.2 -> 5 (0.8 away; 1 is 3.2); row 2: no interval -> itself
    p, grow = nbr.project(np.array([1.4, 4.2, 7.0]), lo, hi)
    assert p.tolist() == [1.0, 5.0, 7.0] and grow == 2.0
    assert nbr.project(np.array([1.6]), np.array([[-1.0]]), np.array([[1.0]]))[1] == 1.0  # one interval: convex


def test_std_scaled_by_eight_spreads():
    # float32 std over 10^4 randn terms: the stored std's error within its forward's members (a float32 two-pass
    # scalar loop among them), not one draw of the scalar loop's scale: scaled by 8 spreads is a mismatch
    g = torch.Generator().manual_seed(0)
    x, go = torch.randn(4, 10_000, generator=g), torch.randn(4, generator=g)
    xr = x.clone().requires_grad_()
    torch.std(xr, -1).backward(go)
    X = x.double().requires_grad_()
    exact = torch.autograd.grad(torch.std(X, -1), X, go.double())[0]
    xs = x.numpy()
    m = _mean_lanes(xs, 1)
    q = np.zeros(4, np.float32)
    for j in range(xs.shape[1]):
        d = (xs[:, j] - m).astype(np.float32)
        q = (q + (d * d).astype(np.float32)).astype(np.float32)
    s = np.sqrt((q / np.float32(xs.shape[1] - 1)).astype(np.float32)).astype(np.float32)
    k = ((go.numpy() / (2 * s)).astype(np.float32) * np.float32(2.0 / (xs.shape[1] - 1))).astype(np.float32)
    seq = torch.from_numpy((k[:, None] * (xs - m[:, None]).astype(np.float32)).astype(np.float32))
    for out in (xr.grad, seq):
        assert _judge("std", out, x, go).verdict in ("exact", "rounding")
    spread = max(float((o.double() - exact).abs().max()) for o in (xr.grad, seq))
    bad = xr.grad.double() * (1 + 8 * spread / float(exact.abs().max()))
    assert _judge("std", bad.float(), x, go).verdict == "mismatch"
