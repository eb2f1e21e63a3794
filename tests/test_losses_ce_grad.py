"""cross_entropy's input gradient (class indices with ignore_index, probability targets, weights, label smoothing,
the three reductions): refkern.backward bit for bit equal to truth.backward (mpmath intervals, its own reading of
the arguments) on hard rows, torch's CPU gradients judged with no false alarm, wrong gradients caught."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.gradients import compare_backward

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _bits(v):
    a = np.asarray(v.double() if hasattr(v, "double") else v, np.float64)
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()


def _case(dtype, prob, seed, n=4, c=5):
    """(x, target, weight): rows of equal logits (p = 1/C, rational), a -inf logit, a row of large logits (p of
    e**-40), an ignored row (class indices), probability targets from a softmax."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, 3, generator=gen, dtype=torch.float64)
    x[0, :, 0] = 1.5
    x[1, 2, 1] = -math.inf
    x[2, :, 2] = torch.arange(c, dtype=torch.float64) * 10
    x = x.to(dtype)
    if prob:
        t = torch.softmax(torch.randn(n, c, 3, generator=gen), 1).to(dtype)
    else:
        t = torch.randint(0, c, (n, 3), generator=gen)
        t[3, 1] = -100
    w = torch.rand(c, generator=gen, dtype=torch.float64).to(dtype)
    return x, t, w, gen


@pytest.mark.parametrize("smoothing", (0.0, 0.3))
@pytest.mark.parametrize("prob", (False, True))
@pytest.mark.parametrize("red", ("none", "mean", "sum"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_equals_the_truth(dtype, red, prob, smoothing):
    x, t, w, gen = _case(dtype, prob, 1)
    loss = F.cross_entropy(x, t, w, reduction=red, label_smoothing=smoothing)
    g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
    kw = dict(reduction=red, label_smoothing=smoothing)
    mine = rk.backward("cross_entropy", g, x, t, w, **kw)["input"]
    assert _bits(mine) == _bits(rk.truth.backward("cross_entropy", g, x, t, w, **kw)["input"])
    if not prob:
        assert torch.all(mine.reshape(4, 5, 3)[3, :, 1] == 0)  # the ignored row


def test_equal_logits_are_rational_by_hand():
    """Two equal logits (p = 1/2), target 0, no weight, "sum", g = 1: the gradient is (1/2 - 1, 1/2) exactly; with
    label smoothing 0.5: B = (0.5 + 0.25, 0.25), A = 1: (1/2 - 3/4, 1/2 - 1/4)."""
    x = torch.zeros(1, 2)
    t = torch.tensor([0])
    g = torch.tensor(1.0)
    assert rk.backward("cross_entropy", g, x, t, reduction="sum")["input"].tolist() == [[-0.5, 0.5]]
    got = rk.backward("cross_entropy", g, x, t, reduction="sum", label_smoothing=0.5)["input"]
    assert got.tolist() == [[-0.25, 0.25]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_gradients_are_no_false_alarm_and_bugs_are_caught(dtype):
    """torch's CPU gradients: exact or rounding over the regimes; the weights forgotten, the smoothing forgotten, the
    mean's divisor forgotten: mismatch."""
    for prob in (False, True):
        for red in ("none", "mean"):
            for smoothing in (0.0, 0.2):
                x, t, w, gen = _case(dtype, prob, 2, n=6, c=7)
                xx = x.clone().requires_grad_()
                loss = F.cross_entropy(xx, t, w, reduction=red, label_smoothing=smoothing)
                g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
                (gx,) = torch.autograd.grad(loss, xx, g)
                kw = dict(reduction=red, label_smoothing=smoothing)
                rep = compare_backward({"input": gx}, "cross_entropy", g, x, t, w, **kw)["input"]
                assert rep.verdict in ("exact", "rounding"), rep
                wrong = {"weights forgotten": dict(weight=None, label_smoothing=smoothing),
                         "smoothing forgotten": dict(weight=w, label_smoothing=0.0 if smoothing else 0.4)}  # fmt: skip
                for what, k in wrong.items():
                    x2 = x.clone().requires_grad_()
                    (bad,) = torch.autograd.grad(F.cross_entropy(x2, t, reduction=red, **k), x2, g)
                    r = compare_backward({"input": bad}, "cross_entropy", g, x, t, w, **kw)["input"]
                    assert r.verdict == "mismatch", what
                if red == "mean":
                    r = compare_backward({"input": (gx.double() * 6 * 3).to(dtype)}, "cross_entropy", g, x, t, w, **kw)
                    assert r["input"].verdict == "mismatch", "the mean's divisor forgotten"


def test_an_ignored_row_is_judged_bit_for_bit():
    """An ignored row's gradient is 0 and its envelope only the subnormal terms: ``2 eta_w + 7 eta_o`` (float32:
    9 * 2**-150; float64: 9 * 2**-1075, written out from ce_bound's docstring); a nonzero value there: mismatch."""
    from refkern.analysis.loss_ce_grad import ce_bound
    from refkern.kernels._loss_call import loss_call

    for dt, eta in ((np.float32, 2.0**-150), (np.float64, 2.0**-1075)):
        x = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, 3.0]], dt)
        c = loss_call("cross_entropy", x, np.array([1, -100]), reduction="none")
        b = ce_bound(c, np.array([0.7, 0.9]), np.zeros((2, 3)))
        assert b[1].tolist() == [9 * eta] * 3
    x = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 3.0]])
    t = torch.tensor([1, -100])
    g = torch.tensor([0.7, 0.9])
    good = rk.backward("cross_entropy", g, x, t, reduction="none")["input"]
    bad = good.clone()
    bad[1, 0] = 1e-30
    assert compare_backward({"input": bad}, "cross_entropy", g, x, t, reduction="none")["input"].verdict == "mismatch"


def test_the_record_names_the_gradient():
    import refkern.ops as ops

    r = ops.get("cross_entropy")
    assert r.differentiable == ("input", "target") and r.backward.judge.endswith("loss_ce_grad:ce_report")


@pytest.mark.parametrize("smoothing", (0.0, 0.3))
@pytest.mark.parametrize("red", ("none", "mean", "sum"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_probability_target_gradient(dtype, red, smoothing):
    """The probability target's gradient, ``-(g / D) (1 - eps) w log p``: equal to the truth bit for bit (a -inf
    logit gives torch's infinity), torch's judged exact or rounding, torch's 3% off a mismatch."""
    x, t, w, gen = _case(dtype, True, 4)
    xx, tt = x.clone().requires_grad_(), t.clone().requires_grad_()
    kw = dict(reduction=red, label_smoothing=smoothing)
    loss = F.cross_entropy(xx, tt, w, **kw)
    g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
    (gt,) = torch.autograd.grad(loss, tt, g)
    mine = rk.backward("cross_entropy", g, x, t, w, wrt="target", **kw)["target"]
    assert _bits(mine) == _bits(rk.truth.backward("cross_entropy", g, x, t, w, wrt="target", **kw)["target"])
    assert compare_backward({"target": gt}, "cross_entropy", g, x, t, w, **kw)["target"].verdict in ("exact", "rounding")
    off = (gt.double() * 1.03).to(dtype)
    assert compare_backward({"target": off}, "cross_entropy", g, x, t, w, **kw)["target"].verdict == "mismatch"


def test_class_indices_have_no_gradient():
    x, t, g = torch.randn(3, 4), torch.tensor([0, 1, 2]), torch.tensor(1.0)
    assert list(rk.backward("cross_entropy", g, x, t)) == ["input"]  # the integers are not differentiable
    with pytest.raises(TypeError, match=r"^backward: cross_entropy's target holds class indices"):
        rk.backward("cross_entropy", g, x, t, wrt="target")
