"""refkern.backward for softmax / log_softmax with dtype=: the gradient at the input converted to dtype,
rounded once to the input's dtype (autograd converts it back); bit for bit against truth.backward,
within torch's float64 autograd, no false alarm on torch's CPU gradients, a bug caught, the
conversion's envelope by hand."""

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT16, FLOAT32
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _bits(t):
    a = t.double().numpy()
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()


@pytest.mark.parametrize("din", DTYPES, ids=lambda d: str(d)[6:])
def test_bit_identical_to_truth(din):
    """Every dtype= from every input dtype: rows with a dominant logit, equal logits (rational), -inf,
    values that the narrowing conversion merges, and NaN."""
    gen = torch.Generator().manual_seed(4)
    x = torch.tensor([[1.0, 2.0, 3.0, 0.5], [30.0, -30.0, 0.0, 1.0], [1.25, 1.25, 1.25, 1.25],
                      [0.0, float("-inf"), 1.0 + 2.0**-12, 1.0], [1.0, float("nan"), 0.0, 0.0]], dtype=torch.float64)  # fmt: skip
    x = x.to(din)
    for dd in DTYPES:
        g = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dd)
        for op in ("softmax", "log_softmax"):
            fast = rk.backward(op, g, x, -1, dtype=dd)["input"]
            truth = rk.truth.backward(op, g, x, -1, dtype=dd)["input"]
            assert fast.dtype == truth.dtype == din
            assert _bits(fast) == _bits(truth), (op, din, dd)


def test_within_torch_float64_autograd():
    gen = torch.Generator().manual_seed(1)
    for din in (torch.float32, torch.float16):
        x = (torch.randn(3, 10, generator=gen) * 4).to(din)
        for op, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
            xl = x.clone().requires_grad_()
            y = fn(xl, 1, dtype=torch.float64)
            g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
            y.backward(g)
            rep = rk.compare_backward({"input": xl.grad}, op, g, x, 1, dtype=torch.float64)["input"]
            assert rep.verdict in ("exact", "rounding")


def test_no_false_alarms_on_torch_cpu_gradients():
    """Input dtypes x dtype= x the two ops, on data of three spreads: every gradient exact or rounding."""
    n = 0
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        for din in DTYPES:
            for dd in DTYPES:
                for op, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
                    x = (torch.randn(4, 16, generator=gen) * (1.0, 20.0)[seed]).to(din)
                    xl = x.clone().requires_grad_()
                    y = fn(xl, -1, dtype=dd)
                    g = torch.randn(y.shape, generator=gen).to(dd)
                    y.backward(g)
                    rep = rk.compare_backward({"input": xl.grad}, op, g, x, -1, dtype=dd)["input"]
                    assert rep.verdict in ("exact", "rounding"), (seed, op, din, dd, rep.max_bound_ratio)
                    n += 1
    assert n == 2 * 4 * 4 * 2


@pytest.mark.parametrize("din,dd", [(torch.float16, torch.float32), (torch.float32, torch.float16),
                                    (torch.bfloat16, torch.float64)], ids=str)  # fmt: skip
def test_a_dropped_term_is_caught(din, dd):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 32, generator=gen) * 2).to(din)
    g = torch.randn(6, 32, generator=gen).to(dd)
    y = torch.softmax(x.to(dd).double(), -1)
    good = (y * (g.double() - (g.double() * y).sum(-1, keepdim=True))).to(din)
    assert rk.compare_backward({"input": good}, "softmax", g, x, -1, dtype=dd)["input"].verdict in ("exact", "rounding")
    bad = (y * g.double()).to(din)  # the sum(g y) term dropped
    assert rk.compare_backward({"input": bad}, "softmax", g, x, -1, dtype=dd)["input"].verdict == "mismatch"


def test_converted_bound_by_hand():
    # computed in float32 (b_c = 2**-20 around ref_c = 0.75), converted to float16:
    # dx <= 0.75 (1 + 2**-23) + 2**-149; ((b_c + 2**-24 dx + 2**-150)(1 + 2**-11) + 2**-10 dx + 2**-24) (1 + 2**-40)
    dx = 0.75 * (1 + 2.0**-23) + 2.0**-149
    want = ((2.0**-20 + 2.0**-24 * dx + 2.0**-150) * (1 + 2.0**-11) + 2 * 2.0**-11 * dx + 2 * 2.0**-25) * (1 + 2.0**-40)
    got = envb.converted_bound(np.array([2.0**-20]), np.array([0.75]), FLOAT32, FLOAT16)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)
    assert envb.converted_bound(np.array([0.0]), np.array([0.75]), FLOAT32, FLOAT16)[0] == 0.0


def test_errors():
    x = torch.randn(2, 3)
    with pytest.raises(
        TypeError, match=r"^backward: grad_output must have the dtype of the output of softmax, float64"
    ):
        rk.backward("softmax", torch.randn(2, 3), x, -1, dtype=torch.float64)
