"""The gradients of mse_loss and binary_cross_entropy with respect to their target (torch differentiates a
floating target): refkern.backward bit for bit equal to truth.backward (mpmath intervals / Fractions, no shared
numerics), torch's CPU gradients judged with no false alarm, a wrong formula caught, the envelope's constants
written out by hand, and OpInfo's samples of both ops with every gradient judged."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT32, FLOAT64
from refkern.analysis.loss_targets import target_bound
from refkern.gradients import compare_backward

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
REDUCTIONS = ("none", "mean", "sum")


def _bits(v):
    a = np.asarray(v.double() if hasattr(v, "double") else v, np.float64)
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()


def _probabilities(dtype, n, seed):
    """Probabilities of every regime: uniform, near 1/2 (logit near 0: the log's argument near 1), tiny (down to
    e**-30) and near 1, and the special ones: 0, 1, exactly 1/2, one ulp either side of 1/2."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    parts = [u, 0.5 + (u - 0.5) * 1e-3, torch.exp(-30 * u), 1 - torch.exp(-12 * u)]
    p = torch.cat(parts).to(dtype).clamp(0, 1)
    half = torch.tensor(0.5, dtype=dtype)
    special = torch.stack([torch.tensor(0.0, dtype=dtype), torch.tensor(1.0, dtype=dtype), half,
                           torch.nextafter(half, torch.tensor(1.0, dtype=dtype)) if dtype in (torch.float32, torch.float64)
                           else half + torch.finfo(dtype).eps / 2,
                           torch.nextafter(half, torch.tensor(0.0, dtype=dtype)) if dtype in (torch.float32, torch.float64)
                           else half - torch.finfo(dtype).eps / 4])  # fmt: skip
    return torch.cat([p, special]), gen


@pytest.mark.parametrize("red", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bce_target_gradient_equals_the_truth(dtype, red):
    p, gen = _probabilities(dtype, 12, 1)
    n = p.numel()
    y = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    w[3] = 0.0  # a zero weight: a signed zero
    shape = () if red != "none" else (n,)
    g = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    mine = rk.backward("binary_cross_entropy", g, p, y, w, reduction=red, wrt="target")["target"]
    truth = rk.truth.backward("binary_cross_entropy", g, p, y, w, reduction=red, wrt="target")["target"]
    assert _bits(mine) == _bits(truth)
    assert math.isinf(float(mine[n - 5])) and math.isinf(float(mine[n - 4]))  # p = 0, 1: torch's infinities


@pytest.mark.parametrize("dtype", DTYPES)
def test_bce_target_of_subnormal_probabilities_equals_the_truth(dtype):
    tiny = torch.finfo(dtype).tiny
    p = torch.tensor([tiny, tiny / 4, tiny * 3 / 8, 1e-40, 3e-45], dtype=torch.float64).to(dtype)
    p = p[p > 0]
    y, g = torch.zeros_like(p), torch.linspace(-2, 3, p.numel(), dtype=torch.float64).to(dtype)
    mine = rk.backward("binary_cross_entropy", g, p, y, reduction="none", wrt="target")["target"]
    assert _bits(mine) == _bits(rk.truth.backward("binary_cross_entropy", g, p, y, reduction="none", wrt="target")["target"])


@pytest.mark.parametrize("red", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_target_gradient_equals_the_truth_and_is_the_input_negated(dtype, red):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64).to(dtype)
    t = torch.randn(7, 5, generator=gen, dtype=torch.float64).to(dtype)
    t[0] = x[0]  # zero differences
    g = torch.randn(() if red != "none" else (7, 5), generator=gen, dtype=torch.float64).to(dtype)
    mine = rk.backward("mse_loss", g, x, t, reduction=red)
    truth = rk.truth.backward("mse_loss", g, x, t, reduction=red)
    assert _bits(mine["target"]) == _bits(truth["target"])
    assert _bits(mine["input"]) == _bits(truth["input"])
    nz = mine["input"] != 0
    assert torch.equal(mine["target"][nz], -mine["input"][nz])


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_target_gradients_are_no_false_alarm_and_bugs_are_caught(dtype):
    """torch's CPU gradients of both targets: exact or rounding (every regime of p, with weights, 3 reductions);
    the target's gradient with log(1 - p) forgotten, the mean's 1/n forgotten, or the sign lost: mismatch."""
    p, gen = _probabilities(dtype, 400, 3)
    p = p[:-5]  # the specials apart: torch's infinities are bit for bit
    n = p.numel()
    y = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    w = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    for red in REDUCTIONS:
        pp, yy = p.clone().requires_grad_(), y.clone().requires_grad_()
        loss = F.binary_cross_entropy(pp, yy, w, reduction=red)
        g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
        (gy,) = torch.autograd.grad(loss, (yy,), g)
        rep = compare_backward({"target": gy}, "binary_cross_entropy", g, p, y, w, reduction=red)["target"]
        assert rep.verdict in ("exact", "rounding"), rep
        d = n if red == "mean" else 1
        bugs = {"log(1 - p) forgotten": -torch.log(p.double()) * g.double() * w.double() / d,
                "1/n forgotten": -torch.logit(p.double()) * g.double() * w.double() * (2 if d == 1 else 1),
                "sign": torch.logit(p.double()) * g.double() * w.double() / d}  # fmt: skip
        for what, bad in bugs.items():
            r = compare_backward({"target": bad.to(dtype)}, "binary_cross_entropy", g, p, y, w, reduction=red)
            assert r["target"].verdict == "mismatch", what
        x, t = torch.randn(n, generator=gen).to(dtype).requires_grad_(), torch.randn(n, generator=gen).to(dtype)
        t.requires_grad_()
        loss = F.mse_loss(x, t, reduction=red)
        (gt,) = torch.autograd.grad(loss, (t,), g)
        rep = compare_backward({"target": gt}, "mse_loss", g, x.detach(), t.detach(), reduction=red)["target"]
        assert rep.verdict in ("exact", "rounding") and rep.op == "mse_loss backward (target)", rep
        wrong = compare_backward({"target": -gt}, "mse_loss", g, x.detach(), t.detach(), reduction=red)["target"]
        assert wrong.verdict == "mismatch"


def test_target_bound_by_hand():
    """target_bound's constants written out (gamma_3(u) = 3 u / (1 - 3 u) (1 + 12 u), kernels.loss.gamma's):
    float32 (u = u_o = 2**-24), c = 1 and ref = 1: ``(2.01 u + 2 u + gamma_3(u)) 1.01 + 4 2**-150``; bfloat16
    (u_o = 2**-8, its logit stored: one more u_o), c = 2, ref = 0.5: ``(2 2.01 2**-8 + 0.5 (2 2**-24 + 2**-8 +
    gamma_3(2**-8))) 1.01 + 4 2**-134``; float64 as float32 with u = 2**-53."""
    u = 2.0**-24
    want = (2.01 * u + 2 * u + 3 * u / (1 - 3 * u) * (1 + 12 * u)) * 1.01 + 4 * 2.0**-150
    assert float(target_bound(np.array(1.0), np.array(1.0), FLOAT32)) == pytest.approx(want, rel=1e-15)
    ub = 2.0**-8
    want = (2 * 2.01 * ub + 0.5 * (2 * u + ub + 3 * ub / (1 - 3 * ub) * (1 + 12 * ub))) * 1.01 + 4 * 2.0**-134
    assert float(target_bound(np.array(0.5), np.array(2.0), BFLOAT16)) == pytest.approx(want, rel=1e-15)
    u = 2.0**-53
    want = (2.01 * u + 2 * u + 3 * u / (1 - 3 * u) * (1 + 12 * u)) * 1.01 + 4 * 2.0**-1075
    assert float(target_bound(np.array(1.0), np.array(1.0), FLOAT64)) == pytest.approx(want, rel=1e-15)
    assert float(target_bound(np.array(np.nan), np.array(1.0), FLOAT32)) == math.inf


def test_the_records_name_the_target_differentiable():
    import refkern.ops as ops

    for name in ("mse_loss", "binary_cross_entropy"):
        assert ops.get(name).differentiable == ("input", "target")
        assert ops.get(name).backward.judge.startswith("refkern.analysis.loss_targets:")
