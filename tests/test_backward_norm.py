"""refkern.backward for layer_norm and rms_norm: bit for bit against truth.backward (mpmath intervals,
the autograd formula) on hard rows, the fast path against the exact path, within torch's float64
autograd, no false alarm on torch's CPU gradients in fp32/fp16/bf16 by the worst-case envelope,
injected gradient bugs caught, refkern.torch.check judging them."""

import math
from fractions import Fraction

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis import _envelope_backward as envb
from refkern.kernels.norm_backward import norm_backward_rows, sum_over_sqrt

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_AND_32 = (torch.float32, torch.float16, torch.bfloat16)
INF = float("inf")


def _bits(t):
    return t.double().numpy().view(np.int64).tolist()


def _call(op, g, x, shape, w=None, b=None, **kw):
    args = (g, x, shape, w) + ((b,) if op == "layer_norm" else ())
    return args, kw


def _hard_cases(dtype):
    """(op, args, kwargs): zero variance, huge and tiny magnitudes, a large mean with a small spread,
    weight None, one-element rows, a 2-D normalized_shape, eps = 0, a zero rms row, NaN/inf rows."""
    big = {torch.float16: 3.0e4, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e200}[dtype]
    tiny = {torch.float16: 1e-7, torch.bfloat16: 1e-35, torch.float32: 1e-40, torch.float64: 1e-300}[dtype]
    gen = torch.Generator().manual_seed(3)

    def t(v):
        return torch.tensor(v, dtype=torch.float64).to(dtype)

    def rnd(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)

    x = t([
        [2.5, 2.5, 2.5, 2.5, 2.5],                     # zero variance
        [big, -big, 0.5 * big, 3.0, -1.0],             # huge
        [tiny, -tiny, 3 * tiny, 0.0, -2 * tiny],       # tiny (subnormal in float32): var far below eps
        [1000.0, 1000.5, 999.75, 1000.25, 1000.0],     # large mean, small spread
        [0.0, 0.0, 0.0, 0.0, 0.0],                     # a zero row
        [1.0, -1.0, 2.0, -2.0, 0.0],
    ])  # fmt: skip
    g = rnd(6, 5)
    g[4] = t([1.0, 1.0, 1.0, 1.0, 1.0])
    w, b = rnd(5), rnd(5)
    cases = []
    for op in ("layer_norm", "rms_norm"):
        cases += [
            (op, *_call(op, g, x, (5,), w, b)),
            (op, *_call(op, g, x, (5,))),  # weight None
            (op, *_call(op, g[:, :1].contiguous(), x[:, :1].contiguous(), (1,), rnd(1), rnd(1))),  # 1-element rows
            (op, *_call(op, rnd(2, 3, 4), rnd(2, 3, 4) * 3, (3, 4), rnd(3, 4), rnd(3, 4))),  # 2-D normalized_shape
            (op, *_call(op, g[:1], x[:1], (5,), w, b, eps=0.0)),  # eps = 0 on a constant row: NaN (0/0)
            (op, *_call(op, g[5:], x[5:], (5,), w, b, eps=0.0)),  # eps = 0: var + eps = 2, irrational r
        ]
    xs = x.clone()
    xs[1, 2] = INF
    xs[5, 0] = float("nan")
    cases.append(("layer_norm", *_call("layer_norm", g, xs, (5,), w, b)))
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_bit_identical_to_truth_on_hard_rows(dtype):
    for op, args, kw in _hard_cases(dtype):
        fast = rk.backward(op, *args, **kw)
        truth = rk.truth.backward(op, *args, **kw)
        assert set(fast) == set(truth)
        for k in fast:
            assert fast[k].dtype == truth[k].dtype and fast[k].shape == truth[k].shape
            assert _bits(fast[k]) == _bits(truth[k]), (op, k, kw, args[2])


def test_special_rows_follow_ieee():
    x = torch.tensor([[1.0, INF, 2.0], [1.0, 2.0, 4.0]])
    g = torch.ones(2, 3)
    out = rk.backward("layer_norm", g, x, (3,), torch.ones(3), torch.zeros(3))
    assert torch.isnan(out["input"][0]).all() and torch.isfinite(out["input"][1]).all()
    assert torch.isnan(out["weight"]).all()  # the inf row's xhat is NaN in every column
    assert torch.equal(out["bias"], torch.full((3,), 2.0))
    c = rk.backward("layer_norm", g, torch.full((2, 3), 7.0), (3,), eps=0.0)["input"]
    assert torch.isnan(c).all()  # var + eps = 0: 0 / 0


def test_cancelling_rows_in_one_square_class():
    """Rows whose var + eps differ by a rational square share one 1/sqrt(z): a grad_weight column whose
    rows cancel there is exactly 0, and otherwise one rounding of A / sqrt(z)."""
    x = torch.tensor([[1.0, -1.0, 0.0], [2.0, -2.0, 0.0]], dtype=torch.float64)  # z = 2/3 and 8/3
    g = torch.tensor([[1.0, 0.5, 0.0], [-1.0, 0.25, 3.0]], dtype=torch.float64)
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(300):
        want = float(-mpmath.mpf(3) / 4 * mpmath.sqrt(mpmath.mpf(3) / 2))
    for fn in (rk.backward, rk.truth.backward):
        gw = fn("layer_norm", g, x, (3,), torch.ones(3, dtype=torch.float64), eps=0.0, wrt="weight")["weight"]
        assert gw[0].item() == 0.0  # 1 * (1 / sqrt(2/3)) - 1 * (2 / sqrt(8/3)) = 0
        assert gw[1].item() == want  # -0.5 sqrt(3/2) - 0.25 sqrt(3/2), rounded once
    Q = Fraction
    assert sum_over_sqrt([(Q(1), Q(2, 3)), (Q(-2), Q(8, 3))], FLOAT64) == 0.0
    assert sum_over_sqrt([(Q(1), Q(2)), (Q(1), Q(3))], FLOAT64) == 1 / math.sqrt(2) + 1 / math.sqrt(3)
    assert sum_over_sqrt([(Q(3), Q(4)), (Q(0), Q(5))], FLOAT32) == 1.5


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_fast_path_agrees_with_the_exact_path(dtype):
    from refkern.accumulate.formats import FORMATS

    fmt = FORMATS[str(dtype)[6:]]
    gen = torch.Generator().manual_seed(11)
    for center in (True, False):
        x = (torch.randn(12, 24, generator=gen, dtype=torch.float64) * 5 + 30 * center).to(dtype).double().numpy()
        g = torch.randn(12, 24, generator=gen, dtype=torch.float64).to(dtype).double().numpy()
        w = torch.randn(24, generator=gen, dtype=torch.float64).to(dtype).double().numpy()
        fm = {"input": fmt, "weight": fmt, "bias": fmt}
        wrt = ("input", "weight", "bias")
        fast = norm_backward_rows(x, g, w, center, 1e-5, fm, wrt)
        slow = norm_backward_rows(x, g, w, center, 1e-5, fm, wrt, force_exact=True)
        for k in wrt:
            assert np.array_equal(fast[k], slow[k]), k


@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
def test_within_torch_float64_autograd(op):
    """torch's float64 gradients are a correct float64 implementation: within the float64 envelope
    around refkern's, for every argument combination (weight/bias present or not, 1-D and 2-D shapes)."""
    gen = torch.Generator().manual_seed(5)
    for shape, ns in (((6, 16), (16,)), ((2, 3, 4, 5), (4, 5)), ((5, 1), (1,))):
        for aff in (0, 1, 2):
            if op == "rms_norm" and aff == 2:
                continue
            x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 7).requires_grad_()
            w = torch.randn(ns, generator=gen, dtype=torch.float64).requires_grad_() if aff else None
            b = torch.randn(ns, generator=gen, dtype=torch.float64).requires_grad_() if aff == 2 else None
            g = torch.randn(shape, generator=gen, dtype=torch.float64)
            y = F.layer_norm(x, ns, w, b) if op == "layer_norm" else F.rms_norm(x, ns, w)
            y.backward(g)
            got = {"input": x.grad, **({"weight": w.grad} if w is not None else {})}
            got.update({"bias": b.grad} if b is not None else {})
            args = (x.detach(), ns, None if w is None else w.detach())
            args += (None if b is None else b.detach(),) if op == "layer_norm" else ()
            reps = rk.compare_backward(got, op, g, *args)
            ref = rk.backward(op, g, *args)
            for k, rep in reps.items():
                assert rep.verdict in ("exact", "rounding"), (op, shape, aff, k, rep)
                assert (ref[k] - got[k]).abs().max().item() <= 1e-12 * max(1.0, ref[k].abs().max().item())


def _torch_grads(op, x, ns, w, b, g):
    x = x.detach().requires_grad_()
    w = None if w is None else w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = F.layer_norm(x, ns, w, b) if op == "layer_norm" else F.rms_norm(x, ns, w)
    y.backward(g)
    got = {"input": x.grad}
    if w is not None:
        got["weight"] = w.grad
    if b is not None:
        got["bias"] = b.grad
    return got


def _cases(seeds):
    for seed in range(seeds):
        for op in ("layer_norm", "rms_norm"):
            for shape, ns in (((4, 32), (32,)), ((2, 3, 8, 6), (8, 6)), ((3, 1), (1,)), ((16, 256), (256,))):
                for aff in (0, 1, 2):
                    if not (op == "rms_norm" and aff == 2):
                        yield seed, op, shape, ns, aff


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_no_false_alarms_on_torch_cpu_gradients(dtype):
    """Seeds x ops x shapes x (no affine, weight, weight and bias) x data regimes (unit scale, x100,
    x1e-3; mean 0 or 50): every gradient torch's CPU computes is judged exact or rounding."""
    judged = 0
    for seed, op, shape, ns, aff in _cases(4):
        gen = torch.Generator().manual_seed(1000 * seed + 10 * aff + len(shape))
        scale = (1.0, 100.0, 1e-3)[seed % 3]
        x = (torch.randn(shape, generator=gen) * scale + 50.0 * (seed % 2)).to(dtype)
        w = torch.randn(ns, generator=gen).to(dtype) if aff else None
        b = torch.randn(ns, generator=gen).to(dtype) if aff == 2 else None
        g = torch.randn(shape, generator=gen).to(dtype)
        got = _torch_grads(op, x, ns, w, b, g)
        args = (x, ns, w) + ((b,) if op == "layer_norm" else ())
        for k, rep in rk.compare_backward(got, op, g, *args).items():
            # torch's CPU kernels round grad_weight's and grad_bias's running sums to a half dtype: that precision
            half = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
            reduced = rep.verdict == "reduced-precision" and k != "input" and rep.precision == half
            assert rep.verdict in ("exact", "rounding") or reduced, (seed, op, shape, aff, k, rep.verdict, rep.max_ulp)
            judged += 1
    assert judged == 4 * 4 * ((1 + 2 + 3) + (1 + 2))  # seeds x shapes x gradients per affine variant


def _buggy(op, x, w, g, bug):
    """Gradients in float64 with one injected bug, from the autograd formula."""
    x, g = x.double(), g.double()
    w = w.double()
    center = op == "layer_norm"
    mu = x.mean(-1, keepdim=True) if center else torch.zeros_like(x[..., :1])
    r = (((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5).rsqrt()
    xh = (x - mu) * r
    gw = g * w
    a = gw.mean(-1, keepdim=True) if center and bug != "no_mean" else 0.0
    rr = r * r if bug == "r_squared" else r
    gi = rr * (gw - a - xh * (gw * xh).mean(-1, keepdim=True))
    gwt = (g * (x if bug == "raw_x" else xh)).sum(0)
    return gi, gwt


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
def test_gradient_bugs_are_caught(op, dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 64, generator=gen) * 3 + 1).to(dtype)
    g = torch.randn(8, 64, generator=gen).to(dtype)
    w = torch.randn(64, generator=gen).to(dtype)
    args = (x, (64,), w) + ((None,) if op == "layer_norm" else ())
    gi, gwt = _buggy(op, x, w, g, None)
    reps = rk.compare_backward({"input": gi.to(dtype), "weight": gwt.to(dtype)}, op, g, *args, eps=1e-5)
    assert all(r.verdict in ("exact", "rounding") for r in reps.values())  # the harness itself is sound
    bugs = ("no_mean", "r_squared", "raw_x") if op == "layer_norm" else ("r_squared", "raw_x")
    for bug in bugs:
        gi, gwt = _buggy(op, x, w, g, bug)
        k = "weight" if bug == "raw_x" else "input"
        got = {"input": gi.to(dtype)} if k == "input" else {"weight": gwt.to(dtype)}
        assert rk.compare_backward(got, op, g, *args, eps=1e-5)[k].verdict == "mismatch", bug


def test_envelope_constants_by_hand():
    assert envb.INPUT_ROUNDINGS == 8
    assert envb.XHAT_ROUNDINGS == 3
    assert envb.NORM_SECOND_ORDER == 8
    assert envb.EVAL_SLACK == 1.0 + 2.0**-40
    # grad_bias of two one-element float32 rows g = 1, 2: E = gamma_1(u) * 3, gamma_k = k u / (1 - k u) (1 + 4 k u)
    u = 2.0**-24
    E = u / (1 - u) * (1 + 4 * u) * 3.0
    want = (E * (1 + 8 * u) + u * (2 * 3.0 * (1 + 2 * u) + E) + 2 * 2.0**-150) * (1.0 + 2.0**-40)
    X = np.array([[0.5], [4.0]])
    G = np.array([[1.0], [2.0]])
    fm = {"input": FLOAT32, "bias": FLOAT32}
    got = envb.norm_bound("layer_norm", "bias", X, G, None, 1e-5, np.array([3.0]), fm)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)


def test_errors():
    x, g = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^backward: normalized_shape=\[5\] must be the last dimensions"):
        rk.backward("layer_norm", g, x, (5,))
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of layer_norm"):
        rk.backward("layer_norm", torch.randn(3, 5), x, (4,))
    with pytest.raises(ValueError, match=r"^backward: rms_norm has no differentiable argument 'bias'"):
        rk.backward("rms_norm", g, x, (4,), wrt="bias")
    with pytest.raises(ValueError, match=r"^backward: wrt names 'weight', but layer_norm was called without it"):
        rk.backward("layer_norm", g, x, (4,), wrt="weight")
    with pytest.raises(ValueError, match=r"^backward: eps must be a finite number; got eps=inf"):
        rk.backward("layer_norm", g, x, (4,), eps=math.inf)  # a negative eps is torch's too: accepted
    with pytest.raises(ValueError, match=r"^backward: expected weight of shape \(4,\)"):
        rk.backward("layer_norm", g, x, (4,), torch.ones(3))
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of input must have the dtype of input"):
        rk.compare_backward({"input": g.double()}, "layer_norm", g, x, (4,))


def test_only_the_gradients_asked_for():
    x, g = torch.randn(3, 4), torch.randn(3, 4)
    w, b = torch.randn(4), torch.randn(4)
    out = rk.backward("layer_norm", g, x, (4,), w, b, wrt=("weight",))
    assert set(out) == {"weight"}
    full = rk.backward("layer_norm", g, x, (4,), w, b)
    assert torch.equal(out["weight"], full["weight"])
    assert torch.equal(full["bias"], rk.sum(g, dim=0))  # grad_bias is the exact column sum


def test_check_judges_the_norm_gradients():
    rkt = pytest.importorskip("refkern.torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen)
    w, b = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    res = rkt.check(F.layer_norm, x, (16,), w, b, devices=["cpu"], backward=True)
    assert sorted(r.argument for r in res.grads) == ["bias", "input", "weight"]
    assert all(r.report is not None and r.report.verdict in ("exact", "rounding") for r in res.grads)
    res = rkt.check(F.rms_norm, x.bfloat16(), (16,), w.bfloat16(), devices=["cpu"], backward=True)
    assert sorted(r.argument for r in res.grads) == ["input", "weight"]
    assert all(r.report is not None and r.report.verdict in ("exact", "rounding") for r in res.grads)
    res = rkt.check(torch.nn.LayerNorm(16), x, devices=["cpu"], backward=True)
    assert all(r.report is not None and r.report.verdict in ("exact", "rounding") for r in res.grads)
    assert len(res.grads) == 3
