"""mse_loss and l1_loss: references against the exact truth, torch's CPU results against the yardstick (no
false alarm), injected bugs, the bound written by hand."""

import numpy as np
import pytest

import refkern as rk
import refkern.truth

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPS = ("mse_loss", "l1_loss")


@pytest.mark.parametrize("dtype", DTYPES)
def test_references_equal_the_truth(dtype):
    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 1e-3, 100.0):
        x = (torch.randn(7, 5, generator=g) * scale).to(dtype)
        t = (torch.randn(5, generator=g) * torch.tensor([1, 1e-4, 300, 1, 1])).to(dtype)  # broadcast, wide exponents
        for op in OPS:
            for red in ("none", "sum", "mean"):
                got = np.asarray(getattr(rk, op)(x, t, reduction=red).double())
                assert np.array_equal(got, getattr(refkern.truth, op)(x, t, reduction=red), equal_nan=True)


def test_specials_and_empty():
    x = torch.tensor([1.0, float("inf"), 2.0])
    t = torch.tensor([0.5, float("inf"), float("nan")])
    for op in OPS:
        for red in ("none", "sum", "mean"):
            want = np.asarray(getattr(F, op)(x.double(), t.double(), reduction=red))
            got = np.asarray(getattr(rk, op)(x, t, reduction=red).double())
            assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)],
                                                                                   want[~np.isnan(want)])
        assert np.isnan(getattr(rk, op)(torch.zeros(0), torch.zeros(0)).item())  # mean of nothing: 0 / 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_is_no_false_alarm_and_bugs_are_mismatches(dtype):
    g = torch.Generator().manual_seed(1)
    x, t = (torch.randn(200, 30, generator=g).to(dtype) for _ in range(2))
    for op in OPS:
        f = getattr(F, op)
        for red in ("none", "sum", "mean"):
            rep = rk.compare(f(x, t, reduction=red), op, x, t, reduction=red)
            assert rep.verdict in ("exact", "rounding"), (op, red, str(rep))
        bad = f(x, t, reduction="none")
        bad[3, 4] = bad[3, 4] * 1.1 + 0.1  # one element off
        assert rk.compare(bad, op, x, t, reduction="none").verdict == "mismatch"
        half = f(x[:100], t[:100], reduction="sum")  # half the rows dropped
        assert rk.compare(half, op, x, t, reduction="sum").verdict == "mismatch"


def test_bound_written_by_hand():
    """mse_loss float32 sum of l = 1 and 4: (gamma_3(u) 5 + gamma_1(u) 5) * 1.01 + u 5 + eta."""
    from refkern.analysis.losses import pointwise_envelope

    x, t = np.array([1.0, 3.0]), np.array([0.0, 1.0])
    from refkern.accumulate.formats import FLOAT32

    b = pointwise_envelope("mse_loss", x, t, FLOAT32, "sum")
    u = 2.0**-24
    g1, g3 = u / (1 - u) * (1 + 4 * u), 3 * u / (1 - 3 * u) * (1 + 12 * u)
    assert float(b) == pytest.approx((g3 * 5 + g1 * 5) * 1.01 + u * 5 + 2.0**-150, abs=0)


def test_errors():
    with pytest.raises(ValueError, match=r"^mse_loss: input and target must broadcast together"):
        rk.mse_loss(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"^l1_loss: reduction must be one of"):
        rk.l1_loss(torch.zeros(3), torch.zeros(3), reduction="max")


@pytest.mark.parametrize("op", ["mse_loss", "l1_loss", "binary_cross_entropy", "nll_loss"])
def test_the_result_and_gradient_checks_are_the_shared_ones(op):
    """A loss's result and gradient are read by the checks every op makes (one message for each, word for word)."""
    x = torch.rand(4, 3) * 0.8 + 0.1
    t = torch.tensor([0, 2, 1, 1]) if op == "nll_loss" else torch.rand(4, 3)
    with pytest.raises(TypeError, match=rf"^compare: {op} returns float32 for these inputs; got actual\.dtype="
                       r"float64\.$"):  # fmt: skip
        rk.compare(torch.zeros((), dtype=torch.float64), op, x, t)
    with pytest.raises(ValueError, match=rf"^compare: actual\.shape=\(4,\) differs from the shape {op} gives for "
                       r"these inputs, \(\)"):  # fmt: skip
        rk.compare(torch.zeros(4), op, x, t)
    if op == "l1_loss":
        return
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of input must have the dtype of input, "
                       r"float32; got float64\.$"):  # fmt: skip
        rk.compare_backward({"input": torch.zeros(4, 3, dtype=torch.float64)}, op, torch.tensor(1.0), x, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_loss_gradient(dtype):
    """Reference == truth; torch's gradient exact or rounding; a gradient without the factor 2 a mismatch; the
    audit judges mse_loss_backward."""
    from refkern.torch import audit

    g0 = torch.Generator().manual_seed(3)
    x, t = (torch.randn(20, 6, generator=g0).to(dtype) for _ in range(2))
    for red in ("none", "sum", "mean"):
        xx = x.clone().requires_grad_()
        y = F.mse_loss(xx, t, reduction=red)
        g = torch.randn(y.shape, generator=g0).to(dtype)
        y.backward(g)
        ref = rk.backward("mse_loss", g, x, t, reduction=red)["input"]
        assert np.array_equal(ref.double().numpy(), refkern.truth.backward("mse_loss", g, x, t, reduction=red)["input"])
        assert rk.compare_backward({"input": xx.grad}, "mse_loss", g, x, t, reduction=red)["input"].verdict in (
            "exact", "rounding")  # fmt: skip
        half = xx.grad / 2
        assert rk.compare_backward({"input": half}, "mse_loss", g, x, t, reduction=red)["input"].verdict == "mismatch"
    xx = x.clone().requires_grad_()
    with audit() as a:
        F.mse_loss(xx, t).backward()
    assert {c.op: c.verdict for c in a.calls}.get("mse_loss backward") in ("exact", "rounding")
