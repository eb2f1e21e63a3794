"""refkern.backward for softmax and log_softmax: bit for bit against truth.backward (mpmath intervals,
its own formula) on hard rows, the fast path against the exact path, within torch's float64 autograd,
no false alarm on torch's CPU gradients in fp32/fp16/bf16 by the worst-case envelope, bugs caught."""

import numpy as np
import pytest

import refkern as rk
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OPS = ("softmax", "log_softmax")
INF = float("inf")


def _bits(t):
    a = t.double().numpy()
    return a.view(np.int64).tolist()


def _hard_rows(dtype):
    """Rows that reach every path: large logits, ties, -inf, a fully masked row, an all-equal g (a softmax
    gradient of exactly 0), g summing to 0 (log_softmax's G = 0), a row of one finite entry, tiny y."""
    big = {torch.float16: 6.0e4, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e300}[dtype]
    x = torch.tensor([
        [0.5, -1.25, 3.0, 2.0, -7.5, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],                # ties: y = 1/6
        [2.0, 2.0, -INF, 2.0, 0.5, 0.5],               # ties and -inf
        [-INF] * 6,                                    # fully masked: NaN
        [big, -big, big, 3.0, 0.0, -5.0],              # large logits
        [0.0, -30.0, -60.0, -90.0, -120.0, 1.0],       # tiny y (and subnormal ones in float32)
        [-INF, -INF, 4.0, -INF, -INF, -INF],           # one finite entry
        [3.0, 1.0, 3.0, 1.0, 2.0, 2.0],                # three tied pairs
    ], dtype=torch.float64).to(dtype)  # fmt: skip
    g = torch.tensor([
        [1.0, -2.0, 0.5, 0.25, 3.0, -1.0],
        [0.5, -0.5, 1.0, -1.0, 0.125, 2.0],
        [1.0, 1.0, 7.0, 1.0, -3.0, 3.0],
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        [0.75, 0.75, 0.75, 0.75, 0.75, 0.75],          # all equal: softmax dx = 0 exactly
        [1.0, 2.0, -3.0, 0.5, -0.5, 0.0],              # sums to 0: log_softmax dx = g
        [1.0, -1.0, 2.0, 0.0, 0.5, 0.25],
        [1.0, 0.5, -1.0, 2.0, 0.25, 0.25],             # equal g in the middle pair: that group's sum is 0
    ], dtype=torch.float64).to(dtype)  # fmt: skip
    return x, g


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("op", OPS)
def test_bit_identical_to_truth_on_hard_rows(op, dtype):
    x, g = _hard_rows(dtype)
    for dim, (xx, gg) in ((1, (x, g)), (0, (x.T.contiguous(), g.T.contiguous()))):
        fast = rk.backward(op, gg, xx, dim)["input"]
        truth = rk.truth.backward(op, gg, xx, dim)["input"]
        assert fast.dtype == dtype and fast.shape == xx.shape
        assert _bits(fast) == _bits(truth), (op, dim)
    res = rk.backward(op, g, x, 1)["input"]
    assert torch.isnan(res[3]).all()  # the masked row's forward is NaN
    if op == "softmax":
        assert (res[4] == 0).all() and res[2, 2] == 0  # all-equal g, and a -inf logit
    else:
        assert torch.equal(res[5], g[5]) and res[2, 2] == g[2, 2]  # G = 0, and a -inf logit


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("op", OPS)
def test_fast_path_agrees_with_the_exact_path(op, dtype):
    from refkern.accumulate.formats import FORMATS
    from refkern.kernels.softmax_backward import softmax_backward_rows

    r = torch.Generator().manual_seed(5)
    x = (torch.randn(40, 33, generator=r) * 6).to(dtype).double().numpy()
    g = torch.randn(40, 33, generator=r).to(dtype).double().numpy()
    g[3] = g[3, 0]  # a row of equal g: undecided by the float64 pass, exact 0 for softmax
    fmt = FORMATS[str(dtype)[6:]]
    fast, n_exact = softmax_backward_rows(x, g, fmt, op == "log_softmax")
    exact, n_all = softmax_backward_rows(x, g, fmt, op == "log_softmax", force_exact=True)
    assert n_all == x.size and n_exact < x.size // 4
    assert fast.view(np.int64).tolist() == exact.view(np.int64).tolist()


@pytest.mark.parametrize("op", OPS)
def test_within_torch_float64_autograd(op):
    r = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 4, 30, generator=r, dtype=torch.float64) * 5).requires_grad_()
    for dim in (0, 1, -1):
        y = getattr(torch, op)(x, dim)
        g = torch.randn(y.shape, generator=r, dtype=torch.float64)
        (got,) = torch.autograd.grad(y, x, g)
        rep = rk.compare_backward({"input": got}, op, g, x.detach(), dim)["input"]
        assert rep.verdict in ("exact", "rounding"), str(rep)


def _torch_grad(op, x, dim, g):
    x = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(getattr(torch, op)(x, dim), x, g)
    return got


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=lambda d: str(d)[6:])
def test_no_false_alarms_on_torch_cpu_gradients(dtype):
    """torch's own CPU softmax/log_softmax backward over the last dim and another, scales from 0.1 to 30,
    rows of 8 to 1024 with masked entries: every gradient rounding or exact."""
    r = torch.Generator().manual_seed(11)
    bad, n = [], 0
    for shape in ((64, 1024), (8, 3, 257), (128, 8)):
        for scale in (0.1, 3.0, 30.0):
            x = torch.randn(shape, generator=r) * scale
            x[..., ::7] = torch.where(torch.rand(x[..., ::7].shape, generator=r) < 0.2, -INF, x[..., ::7])
            x = x.to(dtype)
            g = torch.randn(shape, generator=r).to(dtype)
            for op in OPS:
                for dim in (-1, 1):
                    got = _torch_grad(op, x, dim, g)
                    rep = rk.compare_backward({"input": got}, op, g, x, dim)["input"]
                    n += 1
                    if rep.verdict not in ("exact", "rounding"):
                        bad.append((op, shape, scale, dim, str(rep)))
    assert n == 36 and not bad, bad[:1]


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=lambda d: str(d)[6:])
def test_gradient_bugs_are_caught(dtype):
    """softmax's gradient without the -y_i D term, log_softmax's without G (as if sum g = 1), and a
    softmax gradient whose D sums over the wrong dim: mismatch."""
    r = torch.Generator().manual_seed(2)
    x = (torch.randn(16, 64, generator=r) * 2).to(dtype)
    g = torch.randn(16, 64, generator=r).to(dtype)
    y = torch.softmax(x.float(), -1)
    no_d = (y * g.float()).to(dtype)
    no_g = (g.float() - y).to(dtype)
    wrong_dim = (y * (g.float() - (g.float() * y).sum(0, keepdim=True))).to(dtype)
    assert rk.compare_backward({"input": no_d}, "softmax", g, x, -1)["input"].verdict == "mismatch"
    assert rk.compare_backward({"input": no_g}, "log_softmax", g, x, -1)["input"].verdict == "mismatch"
    assert rk.compare_backward({"input": wrong_dim}, "softmax", g, x, -1)["input"].verdict == "mismatch"
    good = _torch_grad("softmax", x, -1, g)
    assert rk.compare_backward({"input": good}, "softmax", g, x, -1)["input"].verdict in ("exact", "rounding")


def test_envelope_constants_by_hand():
    assert envb.PRODUCT_ROUNDINGS == 3
    assert envb.LOG_ROUNDINGS == 2
    assert envb.SECOND_ORDER == 4
    assert envb.F64_SUM == 2
    assert envb.EVAL_SLACK == 1.0 + 2.0**-40
    from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64

    assert envb._units(FLOAT32) == (2.0**-24, 0.0, 2.0**-126, 0.0, 2.0**-24, 2.0**-150)
    assert envb._units(FLOAT16) == (2.0**-24, 2.0**-11, 2.0**-126, 2.0**-25, 2.0**-11, 2.0**-25)
    assert envb._units(BFLOAT16) == (2.0**-24, 2.0**-8, 2.0**-126, 2.0**-134, 2.0**-8, 2.0**-134)
    assert envb._units(FLOAT64) == (2.0**-53, 0.0, 2.0**-1022, 0.0, 2.0**-53, 2.0**-1075)


def test_errors():
    x, g = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"^backward: grad_output must have the dtype of the output of softmax, float64"):
        rk.backward("softmax", g, x, 1, dtype=torch.float64)  # dtype= is supported (test_backward_softmax_dtype.py)
    with pytest.raises(IndexError, match=r"^backward: dim=2 is out of range for a 2-d input"):
        rk.backward("log_softmax", g, x, 2)
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of softmax"):
        rk.backward("softmax", torch.randn(4, 3), x, 1)
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of input must have the dtype of input"):
        rk.compare_backward({"input": g.double()}, "softmax", g, x, 1)


def test_check_judges_the_softmax_gradient():
    import refkern.torch as rkt

    x = torch.randn(4, 50)
    res = rkt.check(F.softmax, x, 1, devices=["cpu"], backward=True)
    ((row,),) = [[r for r in res.grads]]
    assert row.argument == "input" and row.report.verdict in ("exact", "rounding"), str(res)
    res = rkt.check(torch.nn.LogSoftmax(dim=-1), x.half(), devices=["cpu"], backward=True)
    assert [r.argument for r in res.grads] == ["input"] and res.grads[0].report.verdict in ("exact", "rounding")
    res = rkt.check(torch.softmax, x.half(), 1, dtype=torch.float32, devices=["cpu"], backward=True)  # judged too
    assert [r.argument for r in res.grads] == ["input"] and res.grads[0].report.verdict in ("exact", "rounding")


def test_a_nan_gradient_is_a_mismatch_that_says_so():
    """An inf or NaN where the exact gradient is finite is explained by nothing, and the report says so first."""
    g0 = torch.Generator().manual_seed(3)
    x, g = torch.randn(4, 16, generator=g0, requires_grad=True), torch.randn(4, 16, generator=g0)
    F.softmax(x, 1).backward(g)
    bad = x.grad.clone()
    bad[0, 0] = float("nan")
    rep = rk.compare_backward({"input": bad}, "softmax", g, x.detach(), 1)["input"]
    assert rep.verdict == "mismatch" and rep.notes[0].startswith("1 element inf or NaN where the exact"), rep.notes
    assert rk.compare_backward({"input": x.grad}, "softmax", g, x.detach(), 1)["input"].verdict in ("exact", "rounding")


@pytest.mark.parametrize("far", [50.0, 1e5])
def test_a_top_logit_on_a_midpoint_is_left_by_the_far_terms(far):
    """log_softmax along a column [0, -far, -far] with g = [-4, 1, 2**-24]: the top logit's gradient is
    R + G T / S, R = g_0 - G = -(1 + 2**-24) exactly a float32 midpoint, G = -3 + 2**-24 < 0 and T = 2 e**-far > 0,
    so it lies just beyond the midpoint and rounds to -(1 + 2**-23), not to the even -1. At far = 1e5 the exact
    path's interval loop never decided it (its terms below the cut-off stay one unit wide: it ran toward 2**22 bits
    for minutes); the sign of the rest decides it. refkern.truth agrees (checked at both)."""
    x = np.array([0.0, -far, -far], np.float32)
    g = np.array([-4.0, 1.0, 2.0**-24], np.float32)
    got = rk.backward("log_softmax", g, x, 0)["input"]
    assert float(got[0]) == pytest.approx(-(1 + 2.0**-23), abs=0)
    assert float(got[1]) == 1.0 and float(got[2]) == 2.0**-24
