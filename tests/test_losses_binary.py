"""binary_cross_entropy and binary_cross_entropy_with_logits: references against the mpmath truth (the clamp
at -100, p = 0 and 1, huge logits), torch's CPU results against the yardstick, injected bugs, the bound by
hand, errors."""

import numpy as np
import pytest

import refkern as rk
from refkern.truth import losses as truth

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
BCE, LOGITS = "binary_cross_entropy", "binary_cross_entropy_with_logits"


def _data(dtype, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, 4, generator=g) * 4).to(dtype)
    p = torch.sigmoid(x.float()).to(dtype)
    y = torch.rand(n, 4, generator=g).to(dtype)
    p[0, 0], p[0, 1], x[1, 0], x[1, 1] = 0.0, 1.0, 80.0, -80.0  # log 0 clamped to -100; e**-80 below every ulp
    if dtype != torch.float16:
        p[0, 2] = 1e-30  # log p = -69: unclamped
    w = torch.rand(4, generator=g).to(dtype)
    pw = (torch.rand(4, generator=g) * 3).to(dtype)
    return x, p, y, w, pw


@pytest.mark.parametrize("dtype", DTYPES)
def test_references_equal_the_truth(dtype):
    x, p, y, w, pw = _data(dtype)
    for red in ("none", "sum", "mean"):
        got = np.asarray(rk.binary_cross_entropy(p, y, weight=w.expand(6, 4), reduction=red).double())
        assert np.array_equal(got, truth.binary_cross_entropy(p, y, weight=w.expand(6, 4), reduction=red))
        got = np.asarray(rk.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw, reduction=red).double())
        assert np.array_equal(got, truth.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw, reduction=red))


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_is_no_false_alarm_and_bugs_are_mismatches(dtype):
    x, p, y, w, pw = _data(dtype, n=100, seed=1)
    y = (y > 0.5).to(dtype)
    W = w.expand(100, 4)
    for red in ("none", "sum", "mean"):
        rep = rk.compare(F.binary_cross_entropy(p, y, weight=W, reduction=red), BCE, p, y, weight=W, reduction=red)
        assert rep.verdict in ("exact", "rounding"), str(rep)
        got = F.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw, reduction=red)
        rep = rk.compare(got, LOGITS, x, y, weight=w, pos_weight=pw, reduction=red)
        assert rep.verdict in ("exact", "rounding"), str(rep)
        no_pw = F.binary_cross_entropy_with_logits(x, y, weight=w, reduction=red)  # pos_weight ignored
        assert rk.compare(no_pw, LOGITS, x, y, weight=w, pos_weight=pw, reduction=red).verdict == "mismatch"
        no_w = F.binary_cross_entropy(p, y, reduction=red)  # weight ignored
        assert rk.compare(no_w, BCE, p, y, weight=W, reduction=red).verdict == "mismatch"


def test_bound_written_by_hand():
    """One float32 element, p = 1/2, y = 1, w = 1: f1 = log(1/2); l = ln 2; gamma_8(u) ln2 + (2u ln2 + u) (the log),
    times 1.01, plus u ln 2 + eta (the centre)."""
    from refkern.accumulate.formats import FLOAT32
    from refkern.analysis.losses import binary_envelope

    one = np.ones(1)
    b = binary_envelope(BCE, 0.5 * one, one, one, one, FLOAT32, "none")
    u, ln2 = 2.0**-24, np.log(2.0)
    g8 = 8 * u / (1 - 8 * u) * (1 + 32 * u)
    want = (g8 * ln2 + (2 * u * ln2 + u)) * 1.01 + u * ln2 + 2.0**-150
    assert float(b[0]) == pytest.approx(want, abs=0)


def test_errors():
    with pytest.raises(ValueError, match=r"^binary_cross_entropy: every element of input must lie in \[0, 1\]"):
        rk.binary_cross_entropy(torch.tensor([0.5, 1.5]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^binary_cross_entropy_with_logits: target must have the input's shape"):
        rk.binary_cross_entropy_with_logits(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"^binary_cross_entropy_with_logits: pos_weight must broadcast"):
        rk.binary_cross_entropy_with_logits(torch.zeros(3), torch.zeros(3), pos_weight=torch.ones(2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bce_gradient(dtype):
    """Reference == truth (p = 0 and 1 hit the clamp 1e-12); torch's gradient exact or rounding; the weight
    dropped a mismatch; the audit judges binary_cross_entropy_backward."""
    from refkern.torch import audit

    _, p, y, w, _ = _data(dtype, n=20, seed=4)
    W = w.expand(20, 4)
    for red in ("none", "sum", "mean"):
        pp = p.clone().requires_grad_()
        loss = F.binary_cross_entropy(pp, y, weight=W, reduction=red)
        g = torch.randn(loss.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
        loss.backward(g)
        ref = rk.backward(BCE, g, p, y, weight=W, reduction=red)["input"]
        assert np.array_equal(ref.double().numpy(), truth.bce_backward(g, dict(input=p, target=y, weight=W,
                                                                                reduction=red), ("input",))["input"])
        rep = rk.compare_backward({"input": pp.grad}, BCE, g, p, y, weight=W, reduction=red)["input"]
        assert rep.verdict in ("exact", "rounding"), str(rep)
        pq = p.clone().requires_grad_()
        F.binary_cross_entropy(pq, y, reduction=red).backward(g)
        assert rk.compare_backward({"input": pq.grad}, BCE, g, p, y, weight=W, reduction=red)["input"].verdict == \
            "mismatch"  # fmt: skip
    pp = p.clone().requires_grad_()
    with audit() as a:
        F.binary_cross_entropy(pp, y).backward()
    assert {c.op: c.verdict for c in a.calls}.get("binary_cross_entropy backward") in ("exact", "rounding")
