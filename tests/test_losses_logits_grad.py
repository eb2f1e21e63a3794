"""binary_cross_entropy_with_logits' gradients (input and target, with and without pos_weight): refkern.backward
bit for bit equal to truth.backward (mpmath intervals, no shared numerics) on hard cases, torch's CPU gradients
judged with no false alarm, wrong formulas caught, the envelope's constants written out by hand."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT32
from refkern.analysis.loss_logits import logits_bound
from refkern.gradients import compare_backward

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
OP = "binary_cross_entropy_with_logits"


def _bits(v):
    a = np.asarray(v.double() if hasattr(v, "double") else v, np.float64)
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()


def _case(dtype, n, seed, pos_weight):
    """Logits of every regime (0; tiny; moderate; beyond float32's exp overflow, -95; large, 30; and a NaN and an
    infinity), targets with 0 and 1 among them, weights, and pos_weight with 0 and 1 among its values."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * 6).to(dtype)
    x[:6] = torch.tensor([0.0, -95.0, 30.0, 1e-3, -7.5, 2.0**-20])
    y = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    y[6:9] = torch.tensor([0.0, 1.0, 0.5])
    w = torch.rand(n, generator=gen, dtype=torch.float64).to(dtype)
    pw = None
    if pos_weight:
        pw = (torch.rand(n, generator=gen, dtype=torch.float64) * 3).to(dtype)
        pw[1:3] = torch.tensor([0.0, 1.0])
    return x, y, w, pw, gen


@pytest.mark.parametrize("pos_weight", (False, True))
@pytest.mark.parametrize("red", ("none", "mean", "sum"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_equal_the_truth(dtype, red, pos_weight):
    x, y, w, pw, gen = _case(dtype, 24, 1, pos_weight)
    if red == "none":
        x[-2:] = torch.tensor([math.nan, math.inf])
    g = torch.randn(tuple(x.shape) if red == "none" else (), generator=gen, dtype=torch.float64).to(dtype)
    mine = rk.backward(OP, g, x, y, w, reduction=red, pos_weight=pw)
    truth = rk.truth.backward(OP, g, x, y, w, reduction=red, pos_weight=pw)
    for k in ("input", "target"):
        assert _bits(mine[k]) == _bits(truth[k]), k


def test_rational_values_are_exact():
    """x = 0 (sigmoid 1/2), pos_weight = 1 (the target's -x g w), A = 1 + (pw - 1) y = 0: rational values, by hand."""
    x = torch.tensor([0.0, 0.0, 3.0, 2.0])
    y = torch.tensor([0.25, 1.0, 1.0, 0.5])
    pw = torch.tensor([1.0, 3.0, 0.0, 1.0])  # element 2: A = 1 + (0 - 1) 1 = 0
    g = torch.tensor(1.0)
    r = rk.backward(OP, g, x, y, reduction="sum", pos_weight=pw)
    # input: A s - pw y: (1)(1/2) - 1/4; (1 + 2)(1/2) - 3; A = 0: -0 * 1 = -0 (a zero); (1)(s(2)) - 1/2 (irrational)
    assert r["input"][:2].tolist() == [0.25, -1.5] and r["input"][2] == 0.0
    # target: -x + (pw - 1) softplus(-x): pw = 1 gives -x exactly
    assert r["target"][0].item() == 0.0 and r["target"][3].item() == -2.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_gradients_are_no_false_alarm_and_bugs_are_caught(dtype):
    """torch's CPU gradients: exact or rounding; a forgotten weight, pos_weight or 1/n, and a sign: mismatch."""
    for pos_weight in (False, True):
        x, y, w, pw, gen = _case(dtype, 600, 2, pos_weight)
        for red in ("none", "mean"):
            xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
            loss = F.binary_cross_entropy_with_logits(xx, yy, w, reduction=red, pos_weight=pw)
            g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
            gx, gy = torch.autograd.grad(loss, (xx, yy), g)
            reps = compare_backward({"input": gx, "target": gy}, OP, g, x, y, w, reduction=red, pos_weight=pw)
            for k, rep in reps.items():
                assert rep.verdict in ("exact", "rounding"), (k, rep)
            d = x.numel() if red == "mean" else 1
            X, Y, W, G = x.double(), y.double(), w.double(), g.double()
            PW = pw.double() if pos_weight else torch.ones_like(X)
            s = torch.sigmoid(X)
            bugs = {"input": [(s - Y) * G / d,  # weight forgotten
                              ((PW * Y + 1 - Y) * s - PW * Y) * G * W * (2 if d == 1 else 1)],  # 1/n forgotten
                    "target": [X * G * W / d,  # sign
                               (-X * G * W / d) if pos_weight else (-X * G / d)]}  # pos_weight or weight forgotten
            for k, wrong in bugs.items():
                for b in wrong:
                    r = compare_backward({k: b.to(dtype)}, OP, g, x, y, w, reduction=red, pos_weight=pw)[k]
                    assert r.verdict == "mismatch", (k, red, pos_weight)


def test_bound_by_hand():
    """logits_bound's terms written out, float32 (u = u_o = 2**-24, eta 2**-150, gamma_3 = 3 u / (1 - 3 u) (1 + 12 u)):
    the input's at x = 0 (s = 1/2), y = 1/4, g = w = n = 1, no pos_weight: ``(4 u s + eta + u |s - y| + eta)
    (1 + gamma_3) + gamma_3 |ref| + 3 eta``, times 1.01; the target's without pos_weight: ``gamma_3 |ref| + 3 eta``;
    bfloat16's input (u_o = 2**-8, its sigmoid stored once more)."""
    u, eta = 2.0**-24, 2.0**-150
    g3 = 3 * u / (1 - 3 * u) * (1 + 12 * u)
    one = np.array([1.0])
    got = logits_bound("input", np.array([0.25]), np.array([0.0]), np.array([0.25]), one, one, one, 1, FLOAT32, False)
    want = ((4 * u * 0.5 + eta + u * 0.25 + eta) * (1 + g3) + g3 * 0.25 + 3 * eta) * 1.01
    assert got[0] == pytest.approx(want, rel=1e-14)
    got = logits_bound("target", np.array([-3.0]), np.array([3.0]), one, one, one, one, 1, FLOAT32, False)
    assert got[0] == pytest.approx((g3 * 3.0 + 3 * eta) * 1.01, rel=1e-14)
    ub, etab = 2.0**-8, 2.0**-134
    g3b = 3 * ub / (1 - 3 * ub) * (1 + 12 * ub)
    got = logits_bound("input", np.array([0.25]), np.array([0.0]), np.array([0.25]), one, one, one, 1, BFLOAT16, False)
    es = 4 * u * 0.5 + eta + ub * 0.5 + etab
    want = ((es + ub * 0.25 + etab) * (1 + g3b) + g3b * 0.25 + 3 * etab) * 1.01
    assert got[0] == pytest.approx(want, rel=1e-14)


def test_the_record_names_both_gradients():
    import refkern.ops as ops

    r = ops.get(OP)
    assert r.differentiable == ("input", "target") and r.backward.judge.endswith("loss_logits:logits_report")


# ---------------------------------------------------------------- the input gradient's float64 pass and its fallback
def _fast_counts(monkeypatch):
    """Record (elements, elements left undecided) of each call of the float64 pass."""
    import refkern.kernels.loss_logits_grad_fast as fast

    seen = []

    def spy_on(kernel):
        def spy(*args):
            kernel(*args)
            seen.append((args[-1].size, int(args[-1].sum())))

        return spy

    for name in ("logits_input_fast", "logits_target_fast"):
        monkeypatch.setattr(fast, name, spy_on(getattr(fast, name)))
    return seen


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_input_gradient_fast_path_equals_the_truth(dtype, monkeypatch):
    """Ties and exact values (x = 0: ``c (A / 2 - pw y)``, rational; with y = 1, pw = 1 + 2**-7 (bfloat16's 8 bits),
    w = 1, "sum": ``(1 + 2**-7) / 2 - (1 + 2**-7) = -0.1000000 1b``, a midpoint of bfloat16), logits beyond 700
    (the exact element's) and near it, g = 0 (exact zeros), zero and negative weights, every reduction: bit for bit
    the truth's; random logits of scale 6 leave no element to the exact path."""
    seen = _fast_counts(monkeypatch)
    x, y, w, pw, gen = _case(dtype, 40, 11, True)
    x[10:14] = torch.tensor([720.0, -720.0, 690.0, -690.0]).to(dtype) if dtype != torch.float16 else x[10:14]
    x[14:16], y[14:16], pw[14:16], w[14:16] = 0.0, 1.0, 1 + 2**-7, 1.0
    w[16], w[17] = 0.0, -0.75
    for red in ("none", "mean", "sum"):
        loss = F.binary_cross_entropy_with_logits(x.double(), y.double(), w.double(), reduction=red,
                                                  pos_weight=pw.double())  # fmt: skip
        g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
        if red == "none":
            g[14], g[15], g[18] = 1.0, 1.0, 0.0
        kw = dict(reduction=red, pos_weight=pw, wrt="input")
        mine = rk.backward(OP, g, x, y, w, **kw)["input"]
        assert _bits(mine) == _bits(rk.truth.backward(OP, g, x, y, w, **kw)["input"])
        if red == "none" and dtype == torch.bfloat16:
            assert mine[14].item() == -0.50390625  # -0.10000001b rounded to even: -0.1000001b
    assert len(seen) == 3 and all(u >= 1 for _, u in seen)  # the tie (and the logits past 700) left to the exact path
    seen.clear()
    z = (torch.randn(20000, generator=gen) * 6).to(dtype)
    t = torch.rand(20000, generator=gen).to(dtype)
    got = rk.backward(OP, torch.tensor(1.0, dtype=dtype), z, t, wrt="input")["input"]
    assert seen == [(20000, 0)]
    g1 = torch.tensor(1.0, dtype=dtype)
    assert _bits(rk.backward(OP, g1, z[:300], t[:300], wrt="input")["input"]) == _bits(
        rk.truth.backward(OP, g1, z[:300], t[:300], wrt="input")["input"])  # fmt: skip
    assert got.shape == z.shape


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_target_gradient_fast_path_equals_the_truth(dtype, monkeypatch):
    """The target's gradient ``c (-x + (pw - 1) softplus(-x))`` through the float64 pass: pw = 1 (``-c x``,
    rational: exact where representable, a tie left to the exact element), pw = 0, logits past 100 (the exact
    element's), g = 0, zero and negative weights, every reduction: bit for bit the truth's; random logits of scale 6
    leave no element to the exact path."""
    seen = _fast_counts(monkeypatch)
    x, y, w, pw, gen = _case(dtype, 40, 12, True)
    x[10:12] = torch.tensor([150.0, -150.0]).to(dtype)
    w[16], w[17] = 0.0, -0.75
    for red in ("none", "mean", "sum"):
        loss = F.binary_cross_entropy_with_logits(x.double(), y.double(), w.double(), reduction=red,
                                                  pos_weight=pw.double())  # fmt: skip
        g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
        if red == "none":
            g[18] = 0.0
        kw = dict(reduction=red, pos_weight=pw, wrt="target")
        mine = rk.backward(OP, g, x, y, w, **kw)["target"]
        assert _bits(mine) == _bits(rk.truth.backward(OP, g, x, y, w, **kw)["target"])
    assert len(seen) == 3 and all(u >= 2 for _, u in seen)  # at least the logits past 100
    seen.clear()
    z = (torch.randn(20000, generator=gen) * 6).to(dtype)
    t = torch.rand(20000, generator=gen).to(dtype)
    q = (torch.rand(20000, generator=gen) * 3).to(dtype)
    g1 = torch.tensor(1.0, dtype=dtype)
    rk.backward(OP, g1, z, t, pos_weight=q, wrt="target")
    assert seen == [(20000, 0)]
    assert _bits(rk.backward(OP, g1, z[:300], t[:300], pos_weight=q[:300], wrt="target")["target"]) == _bits(
        rk.truth.backward(OP, g1, z[:300], t[:300], pos_weight=q[:300], wrt="target")["target"])  # fmt: skip
