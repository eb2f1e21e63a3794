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


# ---------------------------------------------------------------- the fast path (loss_ce_grad_fast) and its fallback
HALF = (torch.float32, torch.float16, torch.bfloat16)  # the formats of at most 24 bits: the float64 pass first


def _fast_counts(monkeypatch):
    """Record (rows sent, elements left undecided, elements) of each call of the float64 pass."""
    import refkern.kernels.loss_ce_grad_fast as fast

    seen, kernel = [], fast.ce_rows_fast

    def spy(X, ok, *args):
        kernel(X, ok, *args)
        seen.append((int(ok.sum()), int(args[-1].sum()), args[-1].size))

    monkeypatch.setattr(fast, "ce_rows_fast", spy)
    return seen


def _truth_equal(g, x, t, w=None, **kw):
    kw["wrt"] = "input"
    mine = rk.backward("cross_entropy", g, x, t, w, **kw)["input"]
    assert _bits(mine) == _bits(rk.truth.backward("cross_entropy", g, x, t, w, **kw)["input"])
    return mine


def test_a_tie_of_the_half_formats_goes_to_the_exact_path(monkeypatch):
    """Four equal logits (p = 1/4), target 0 of weight 1 + 2**-7, "sum", g = 1: the target's element is
    ``-(3/4)(1 + 2**-7) = -0.110000011b``, nine bits, a midpoint of bfloat16 (ties to even: -0.1100001b =
    -0.7578125); in float32 it is representable. The smallest bfloat16 subnormal as g with two equal logits gives
    ``+-2**-134``, half of it: a tie to 0 (signs of the real values kept)."""
    seen = _fast_counts(monkeypatch)
    x, t = torch.zeros(1, 4, dtype=torch.bfloat16), torch.tensor([0])
    w = torch.tensor([1 + 2**-7, 1.0, 1.0, 1.0], dtype=torch.bfloat16)
    got = _truth_equal(torch.tensor(1.0, dtype=torch.bfloat16), x, t, w, reduction="sum")
    assert got[0, 0].item() == -0.7578125 and got[0, 1].item() == (1 + 2**-7) / 4
    assert seen[-1][1] >= 1  # the tie left undecided by the bound
    got = _truth_equal(torch.tensor(1.0), x.float(), t, w.float(), reduction="sum")
    assert got[0, 0].item() == -0.75 * (1 + 2**-7)
    g = torch.tensor(2.0**-133, dtype=torch.bfloat16)
    got = _truth_equal(g, torch.zeros(1, 2, dtype=torch.bfloat16), t, reduction="sum")
    assert _bits(got) == _bits(torch.tensor([[-0.0, 0.0]]))
    assert seen[-1][1] == 2


@pytest.mark.parametrize("dtype", HALF)
def test_adversarial_rows_equal_the_truth(dtype, monkeypatch):
    """Huge and tiny logit spreads (1e6, e**-2000 and below: the exponentials that underflow float64), -inf logits (p = 0
    exactly: ``-s B_j``, or a zero signed by torch's formula), a row of one finite logit, rows holding NaN, +inf
    or only -inf (torch's IEEE values), an ignored row, a zero and a negative weight, g = 0 in a row, label
    smoothing, every reduction: bit for bit the truth's."""
    seen = _fast_counts(monkeypatch)
    gen = torch.Generator().manual_seed(7)
    big = 1e6 if dtype == torch.float32 else 6e4  # (bfloat16 at 1e6: the truth's interval loop does not converge)
    x = torch.randn(10, 9, generator=gen, dtype=torch.float64)
    x[0] *= big
    x[1] *= 3000.0 if dtype != torch.float16 else 300.0
    x[2, :4] = -math.inf
    x[3, :8] = -math.inf
    x[4, 2], x[5, 3], x[6] = math.nan, math.inf, -math.inf
    x[7] = 2.0**-140
    x = x.to(dtype)
    t = torch.randint(0, 9, (10,), generator=gen)
    t[2], t[3], t[8] = 1, 8, -100
    w = torch.rand(9, generator=gen, dtype=torch.float64).to(dtype)
    w[4], w[5] = 0.0, -0.5
    for red in ("none", "mean", "sum"):
        for smoothing in (0.0, 0.25):
            kw = dict(reduction=red, label_smoothing=smoothing)
            loss = F.cross_entropy(x.double(), t, w.double(), **kw)
            g = torch.randn(tuple(loss.shape), generator=gen, dtype=torch.float64).to(dtype)
            if red == "none":
                g[9] = 0.0
            _truth_equal(g, x, t, w, **kw)
            _truth_equal(g, x, torch.softmax(x.double().nan_to_num(0.0, 0.0, 0.0), 1).to(dtype), w, **kw)
    assert all(n > 0 for n, _, _ in seen)  # the float64 pass took part every time


@pytest.mark.parametrize("dtype", HALF)
def test_the_float64_pass_decides_almost_every_element(dtype, monkeypatch):
    """A language model's rows, 64 x 2000 logits of scale 3 with class targets and smoothing 0.1: the bound (about
    10u relative where no term cancels) leaves about 2**-40 of the elements to the exact path, so none here; the
    result equals the exact path's row by row (:func:`refkern.kernels.loss_ce_grad._row`, integer intervals)."""
    from refkern.kernels._loss_call import loss_call
    from refkern.kernels.loss_ce_grad import _row, ce_coefficients

    seen = _fast_counts(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 2000, generator=gen) * 3.0).to(dtype)
    t = torch.randint(0, 2000, (64,), generator=gen)
    g = torch.tensor(1.0, dtype=dtype)
    got = rk.backward("cross_entropy", g, x, t, label_smoothing=0.1)["input"]
    assert seen == [(64, 0, 64 * 2000)]
    c = loss_call("cross_entropy", x, t, label_smoothing=0.1)
    D, B = ce_coefficients(c)
    for r in (0, 31, 63):  # the exact path on whole rows (2000 exponentials each)
        assert _bits(got[r]) == _bits(torch.tensor(_row(c.X[r], 1.0, D, B(r), c.fmt)))
