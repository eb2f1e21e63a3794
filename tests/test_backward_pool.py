"""refkern.backward for avg_pool1d/2d, max_pool1d/2d and adaptive_avg_pool1d/2d: bit for bit against
truth.backward (Fractions and mpmath from the definitions) on hard cases, within torch's float64
autograd, no false alarm on torch's CPU gradients in fp32/fp16/bf16 (ties in max pooling included),
injected gradient bugs caught, the envelope's constants by hand, errors, refkern.torch.check."""

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT32
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_AND_32 = (torch.float32, torch.float16, torch.bfloat16)
FNS = {"avg_pool1d": F.avg_pool1d, "avg_pool2d": F.avg_pool2d, "max_pool1d": F.max_pool1d,
       "max_pool2d": F.max_pool2d, "adaptive_avg_pool1d": F.adaptive_avg_pool1d,
       "adaptive_avg_pool2d": F.adaptive_avg_pool2d}  # fmt: skip


def _bits(t):
    a = t.double().numpy()
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()  # NaNs alike whatever their sign


def _cases(x2, x1):
    """(op, input, kwargs): overlapping windows, padding with and without counting it, ceil_mode, a
    divisor_override (negative too), dilation, adaptive windows that overlap and that repeat."""
    return [
        ("avg_pool2d", x2, dict(kernel_size=3, stride=2, padding=1)),
        ("avg_pool2d", x2, dict(kernel_size=(3, 2), stride=1, padding=(1, 0), count_include_pad=False, ceil_mode=True)),
        ("avg_pool2d", x2, dict(kernel_size=3, stride=2, divisor_override=-5)),
        ("avg_pool1d", x1, dict(kernel_size=4, stride=1, padding=2)),
        ("avg_pool1d", x1, dict(kernel_size=3, stride=2, ceil_mode=True, count_include_pad=False)),
        ("max_pool2d", x2, dict(kernel_size=3, stride=1, padding=1)),
        ("max_pool2d", x2, dict(kernel_size=2, stride=2, dilation=2, ceil_mode=True)),
        ("max_pool1d", x1, dict(kernel_size=3, stride=1, padding=1)),
        ("adaptive_avg_pool2d", x2, dict(output_size=(4, 5))),
        ("adaptive_avg_pool1d", x1, dict(output_size=4)),
        ("adaptive_avg_pool2d", x2, dict(output_size=(12, None))),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_bit_identical_to_truth_on_hard_cases(dtype):
    """Inputs on a coarse grid (ties for max: the first in scan order), grad_output with +-inf, NaN,
    -0, huge and tiny values, and sums that land on midpoints (g / 4 of neighbouring values)."""
    big = {torch.float16: 6e4, torch.bfloat16: 3e38, torch.float32: 3e38, torch.float64: 1e308}[dtype]
    tiny = {torch.float16: 6e-8, torch.bfloat16: 1e-40, torch.float32: 1e-45, torch.float64: 5e-324}[dtype]
    gen = torch.Generator().manual_seed(2)
    x2 = torch.round(torch.randn(1, 2, 7, 6, generator=gen) * 2).to(dtype) / 2
    x1 = torch.round(torch.randn(2, 9, generator=gen) * 2).to(dtype) / 2
    for op, x, kw in _cases(x2, x1):
        shape = FNS[op](x.float(), **kw).shape
        for variant in range(3):
            g = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
            if variant == 1:
                g.view(-1)[0], g.view(-1)[1], g.view(-1)[2] = big, big, -0.0
                g.view(-1)[3], g.view(-1)[4] = tiny, -tiny
            if variant == 2:
                g.view(-1)[0], g.view(-1)[-1], g.view(-1)[5] = float("inf"), float("-inf"), float("nan")
            fast = rk.backward(op, g, x, **kw)["input"]
            truth = rk.truth.backward(op, g, x, **kw)["input"]
            assert fast.dtype == truth.dtype == dtype and fast.shape == x.shape
            assert _bits(fast) == _bits(truth), (op, kw, variant)


def test_max_pool_ties_go_to_the_first_maximum():
    x = torch.tensor([[[1.0, 3.0, 3.0, 2.0, 3.0]]])
    g = torch.tensor([[[1.0, 2.0, 4.0]]])
    got = rk.backward("max_pool1d", g, x, kernel_size=3, stride=1)["input"]
    xl = x.clone().requires_grad_()
    F.max_pool1d(xl, 3, 1).backward(g)
    assert got.tolist() == xl.grad.tolist() == [[[0.0, 3.0, 4.0, 0.0, 0.0]]]  # windows 0, 1 pick x[1]; 2 picks x[2]


def test_a_sum_of_overlapping_windows_is_rounded_once():
    """avg_pool1d k = 3, s = 1: x[2] lies in three windows, its gradient (g0 + g1 + g2) / 3, rounded once
    (three float32 quotients rounded and added would differ)."""
    g = torch.tensor([[1.0, 2.0**-24, 2.0**-24]], dtype=torch.float32)
    got = rk.backward("avg_pool1d", g, torch.zeros(1, 5), kernel_size=3, stride=1)["input"]
    from fractions import Fraction

    from refkern.accumulate.formats import FLOAT32 as F32
    from refkern.accumulate.ziv import round_fraction

    want = round_fraction((Fraction(1) + Fraction(2) ** -23) / 3, F32)
    assert got[0, 2].item() == want


def test_within_torch_float64_autograd():
    gen = torch.Generator().manual_seed(5)
    x2, x1 = torch.randn(2, 3, 9, 8, generator=gen, dtype=torch.float64), torch.randn(2, 3, 11, generator=gen,
                                                                                       dtype=torch.float64)  # fmt: skip
    for op, x, kw in _cases(x2, x1):
        xl = x.clone().requires_grad_()
        y = FNS[op](xl, **kw)
        g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        y.backward(g)
        rep = rk.compare_backward({"input": xl.grad}, op, g, x, **kw)["input"]
        assert rep.verdict in ("exact", "rounding"), (op, kw)
        ref = rk.backward(op, g, x, **kw)["input"]
        assert (ref - xl.grad).abs().max().item() <= 1e-14 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_no_false_alarms_on_torch_cpu_gradients(dtype):
    """Two seeds (one on a coarse grid: ties) x every case of _cases: every gradient judged exact or rounding."""
    judged = 0
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        x2, x1 = torch.randn(2, 3, 9, 8, generator=gen).to(dtype), torch.randn(2, 3, 11, generator=gen).to(dtype)
        if seed:
            x2, x1 = torch.round(x2 * 2) / 2, torch.round(x1 * 2) / 2
        for op, x, kw in _cases(x2, x1):
            xl = x.detach().clone().requires_grad_()
            y = FNS[op](xl, **kw)
            g = (torch.randn(y.shape, generator=gen) * (1.0, 1e3)[seed]).to(dtype)
            y.backward(g)
            rep = rk.compare_backward({"input": xl.grad}, op, g, x, **kw)["input"]
            assert rep.verdict in ("exact", "rounding"), (seed, op, kw, rep.max_bound_ratio, rep.max_ulp)
            judged += 1
    assert judged == 2 * 11


def _buggy(op, x, g, kw, bug):
    """A float64 gradient with one injected bug (torch's float64 autograd on a wrong forward, or a
    wrong scatter)."""
    xd = x.double().requires_grad_()
    gd = g.double()
    kw = dict(kw)
    if bug == "divisor_without_pad":  # count_include_pad ignored
        kw["count_include_pad"] = not kw.get("count_include_pad", True)
    if bug == "floor_windows":  # adaptive windows ending at floor((i + 1) L / out)
        L, o = x.shape[-1], kw["output_size"]
        w = [(i * L // o, (i + 1) * L // o) for i in range(o)]
        y = torch.stack([xd[..., a : max(b, a + 1)].mean(-1) for a, b in w], -1)
        y.backward(gd)
        return xd.grad
    if bug == "last_tie":  # of equal maxima the last one
        y = FNS[op](xd.flip(-1), **kw).flip(-1)  # stride 1, no padding: the same windows, scanned backwards
        y.backward(gd)
        return xd.grad
    FNS[op](xd, **kw).backward(gd)
    out = xd.grad
    if bug == "no_overlap_sum":  # '=' for '+=': an element keeps the last window's term only
        k, s = kw["kernel_size"], kw.get("stride") or kw["kernel_size"]
        out = torch.zeros_like(xd)
        L = x.shape[-1]
        for o in range((L - k) // s + 1):
            out[..., o * s : o * s + k] = (gd[..., o] / k)[..., None]
    return out


BUGS = [
    ("avg_pool1d", dict(kernel_size=3, stride=1, padding=1), "divisor_without_pad"),
    ("avg_pool1d", dict(kernel_size=3, stride=1), "no_overlap_sum"),
    ("adaptive_avg_pool1d", dict(output_size=4), "floor_windows"),
    ("max_pool1d", dict(kernel_size=3, stride=1), "last_tie"),
]


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("op,kw,bug", BUGS, ids=[b[2] for b in BUGS])
def test_gradient_bugs_are_caught(op, kw, bug, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 11, generator=gen).to(dtype)
    if bug == "last_tie":
        x = torch.round(x).clamp(-1, 1)  # many equal maxima
    g = torch.randn(FNS[op](x.float(), **kw).shape, generator=gen).to(dtype)
    ok = _buggy(op, x, g, kw, None).to(dtype)
    assert rk.compare_backward({"input": ok}, op, g, x, **kw)["input"].verdict in ("exact", "rounding")
    bad = _buggy(op, x, g, kw, bug).to(dtype)
    assert rk.compare_backward({"input": bad}, op, g, x, **kw)["input"].verdict == "mismatch", bug


def test_envelope_constants_by_hand():
    assert envb.POOL_TERM_ROUNDINGS == 2

    def gamma(k, uu):  # refkern.analysis.envelope._gamma
        return k * uu / (1 - k * uu) * (1 + 4 * k * uu)

    u = 2.0**-24
    # an average's element in float32 with k = 3 terms, sum|t| = 1.5, ref 0.5: gamma_4(u) 1.5 + 6 eta_w
    E = gamma(4, u) * 1.5 + 6 * 2.0**-126
    want = (E * (1 + 2 * 5 * 2.0**-53) + u * (2 * 0.5 * (1 + 2 * u) + E) + 2 * 2.0**-150) * (1 + 2.0**-40)
    got = envb.pool_bound(np.array([1.5]), np.array([3]), np.array([0.5]), FLOAT32, exact_terms=False)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)
    # a maximum's element in bfloat16, k = 2 exact terms, sum|g| = 3: gamma_1(2**-24 + 2**-8) 3
    ub = 2.0**-8
    E = gamma(1, u + ub) * 3.0
    want = (E * (1 + 2 * 4 * 2.0**-53) + ub * (2 * 3.0 * (1 + 2 * ub) + E) + 2 * 2.0**-134) * (1 + 2.0**-40)
    got = envb.pool_bound(np.array([3.0]), np.array([2]), np.array([3.0]), BFLOAT16, exact_terms=True)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)


def test_errors():
    x = torch.randn(1, 2, 6)
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of avg_pool1d"):
        rk.backward("avg_pool1d", torch.randn(1, 2, 5), x, kernel_size=2)
    with pytest.raises(ValueError, match=r"^backward: avg_pool1d: padding must be at most half of kernel_size"):
        rk.backward("avg_pool1d", torch.randn(1, 2, 3), x, kernel_size=2, padding=2)
    with pytest.raises(ValueError, match=r"^backward: max_pool2d has no differentiable argument 'kernel_size'"):
        rk.backward("max_pool2d", torch.randn(1, 1, 1), torch.randn(1, 2, 2), 2, wrt="kernel_size")
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of input must have the dtype of input"):
        rk.compare_backward({"input": x.double()}, "avg_pool1d", torch.randn(1, 2, 3), x, kernel_size=2)


def test_check_judges_pooling_gradients():
    rkt = pytest.importorskip("refkern.torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 8, generator=gen)
    for fn, args in ((F.max_pool2d, (3, 1, 1)), (F.avg_pool2d, (3, 2, 1)), (F.adaptive_avg_pool2d, ((3, 5),))):
        res = rkt.check(fn, x.bfloat16(), *args, devices=["cpu"], backward=True)
        assert [r.argument for r in res.grads] == ["input"], fn
        assert res.grads[0].report is not None and res.grads[0].report.verdict in ("exact", "rounding"), fn
    res = rkt.check(torch.nn.MaxPool1d(2), torch.randn(2, 3, 8, generator=gen), devices=["cpu"], backward=True)
    assert res.grads[0].report.verdict in ("exact", "rounding")


POOLS_WITH_KERNELS = [n for n in rk.ops.names(family="pool") if rk.ops.get(n).aten_backward]


def test_every_pool_backward_kernel_has_one_reading():
    """A pool's aten backward kernel is read from its record (issue 25): every pool's record names one function
    of the audit, ``dispatch_backward.pool``, which writes no pool's name, kind or dimension (once a function per
    pool, ``avg_pool3d = avg_pool2d`` an alias)."""
    import ast
    import inspect

    from refkern.torch import dispatch_backward

    assert POOLS_WITH_KERNELS == ["avg_pool2d", "avg_pool3d", "max_pool2d", "adaptive_avg_pool2d"]
    assert {rk.ops.get(n).backward.audit for n in POOLS_WITH_KERNELS} == {"refkern.torch.dispatch_backward:pool"}
    assert not [n for n in rk.ops.names(family="pool") if hasattr(dispatch_backward, n)]
    (tree,) = ast.parse(inspect.getsource(dispatch_backward.pool)).body
    for node in (n for stmt in tree.body[1:] for n in ast.walk(stmt)):  # after the docstring
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        assert not any(w in text for w in ("_pool", "1d", "2d", "3d")), text  # a kind ("adaptive_avg") may be read


@pytest.mark.parametrize("name", POOLS_WITH_KERNELS)
def test_the_audit_judges_each_pools_backward_kernel(name):
    """torch's CPU backward kernel of each pool with one, inside the audit: judged as the record's op at the
    arguments of the forward (a window, stride, padding and ceil_mode; the adaptive pool's output size from
    grad_output), exact or rounding in float32; the same kernel's output broken at every 7th element by 2**-8 is a
    mismatch (the reading judges, it does not wave through)."""
    from audit_models import BrokenKernel, backward_audit

    r = rk.ops.get(name)
    nd = r.spatial
    kw = dict(output_size=(3,) * nd) if r.pool == "adaptive_avg" else dict(kernel_size=3, stride=2, padding=1,
                                                                             ceil_mode=True)  # fmt: skip
    module = rk.ops.resolve_path(r.modules[0])(**kw)
    x = torch.randn(2, 3, *(7,) * nd, generator=torch.Generator().manual_seed(nd), requires_grad=True)
    (kernel,) = r.aten_backward
    op = getattr(torch.ops.aten, kernel).default
    a, _ = backward_audit(module, x)
    (c,) = [c for c in a.calls if c.phase == "backward" and c.aten == str(op)]
    assert c.op == f"{name} backward" and c.report is not None and c.report.verdict in ("exact", "rounding")
    a, (bad,) = backward_audit(module, x, BrokenKernel(op))
    (c,) = [c for c in a.calls if c.phase == "backward" and c.aten == str(op)]
    assert bad.broken == [0] and c.report.verdict == "mismatch"
