"""refkern.backward for sum, mean, var, std, cumsum and dot: bit for bit against truth.backward (Fractions
and mpmath from the definitions) on hard cases, within torch's float64 autograd, no false alarm on torch's
CPU gradients in fp32/fp16/bf16, injected gradient bugs caught, the envelopes' constants by hand, errors,
refkern.torch.check."""

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT16, FLOAT32
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_AND_32 = (torch.float32, torch.float16, torch.bfloat16)
BIG = {torch.float16: 3e4, torch.bfloat16: 1e38, torch.float32: 1e38, torch.float64: 1e307}
TINY = {torch.float16: 6e-8, torch.bfloat16: 1e-40, torch.float32: 1e-45, torch.float64: 5e-324}

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")


def _bits(t):
    a = t.double().numpy()
    nan = np.isnan(a)
    return nan.tolist(), np.where(nan, 0.0, a).view(np.int64).tolist()  # NaNs alike whatever their sign


def _autograd(op, x, g, **kw):
    xl = x.clone().requires_grad_()
    getattr(torch, op)(xl, **kw).backward(g)
    return xl.grad


def _grad_output(op, x, gen, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = getattr(torch, op)(x.detach().double(), **{k: v for k, v in kw.items() if k != "dtype"})
    dt = kw.get("dtype") or x.dtype
    return torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dt)


def _hard_inputs(dtype, gen):
    """Rows with cancellation (an offset far above the spread), huge and tiny (subnormal) values, zero
    variance, a row on a coarse grid (midpoints), an infinity and a NaN."""
    big, tiny = BIG[dtype], TINY[dtype]
    off = torch.randn(5, generator=gen, dtype=torch.float64) * 2.0**-6 + 64
    return torch.stack([
        off,
        torch.tensor([big, -big, big / 2, 0.0, -big / 4]),
        torch.tensor([tiny, 3 * tiny, -tiny, 0.0, 2 * tiny]),
        torch.tensor([1.5, 1.5, 1.5, 1.5, 1.5]),
        torch.round(torch.randn(5, generator=gen, dtype=torch.float64) * 4) / 4,
        torch.tensor([1.0, math.inf, 2.0, 0.0, -1.0]),
        torch.tensor([1.0, 2.0, math.nan, 0.0, -1.0]),
    ]).to(dtype)  # fmt: skip


CASES = [
    ("sum", dict(dim=1)), ("sum", dict()), ("sum", dict(dim=(0, 1), keepdim=True)),
    ("mean", dict(dim=1)), ("mean", dict()), ("mean", dict(dim=-1, keepdim=True)),
    ("cumsum", dict(dim=1)), ("cumsum", dict(dim=0)),
    ("var", dict(dim=1)), ("var", dict(dim=1, correction=0)), ("var", dict(dim=1, correction=5)),
    ("var", dict(dim=1, correction=7)), ("var", dict(dim=0, correction=2.5)), ("var", dict(correction=40)),
    ("std", dict(dim=1)), ("std", dict(dim=1, correction=0)), ("std", dict(dim=1, correction=5)),
    ("std", dict(dim=1, correction=7)), ("std", dict(dim=0, correction=2.5)), ("std", dict(correction=40)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_bit_identical_to_truth_on_hard_cases(dtype):
    """grad_output plain, with +-0 (zero signs), and with +-inf and NaN; correction 0, 1, n, > n (each
    dof <= 0 rule of torch, with and without dim) and fractional."""
    gen = torch.Generator().manual_seed(11)
    x = _hard_inputs(dtype, gen)
    for op, kw in CASES:
        for variant in range(3):
            g = _grad_output(op, x, gen, **kw)
            if variant == 1 and g.numel() > 2:
                g.view(-1)[0], g.view(-1)[1] = 0.0, -0.0
            if variant == 2 and g.numel() > 2:
                g.view(-1)[0], g.view(-1)[-1] = math.inf, math.nan
            fast = rk.backward(op, g, x, **kw)["x"]
            truth = rk.truth.backward(op, g, x, **kw)["x"]
            assert fast.dtype == truth.dtype == dtype and fast.shape == x.shape
            assert _bits(fast) == _bits(truth), (op, kw, variant)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_dot_bit_identical_to_truth(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.tensor([BIG[dtype], TINY[dtype], -0.0, math.inf, 1.0, -2.5, 3.0], dtype=dtype)
    for gv in (1.75, -TINY[dtype], 0.0, math.nan):
        g = torch.tensor(gv, dtype=dtype)
        fast = rk.backward("dot", g, x, y)
        truth = rk.truth.backward("dot", g, x, y)
        assert set(fast) == {"x", "y"}
        assert all(_bits(fast[k]) == _bits(truth[k]) for k in fast), gv


def test_dtype_argument_rounds_once_to_the_input_dtype():
    """With dtype=, grad_output has that dtype and the gradient is the real derivative rounded once to x's
    dtype (mean: g / n, not fl_16(fl_64(g / n)) ...; cumsum: the exact sums of the float64 grad_output)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, generator=gen).half()
    for op, kw in (("sum", dict(dim=1, dtype=torch.float64)), ("mean", dict(dim=1, dtype=torch.float64)),
                   ("cumsum", dict(dim=1, dtype=torch.float64)), ("mean", dict(dtype=torch.float32)),
                   ("cumsum", dict(dim=0, dtype=torch.bfloat16))):  # fmt: skip
        g = _grad_output(op, x, gen, **kw)
        fast = rk.backward(op, g, x, **kw)["x"]
        assert fast.dtype == torch.float16
        assert _bits(fast) == _bits(rk.truth.backward(op, g, x, **kw)["x"]), (op, kw)
    for xx, op, kw in ((x, "cumsum", dict(dim=1, dtype=torch.float32)), (x, "mean", dict(dim=1, dtype=torch.float32)),
                       (x.float(), "mean", dict(dim=0, dtype=torch.float16)),
                       (x.float(), "sum", dict(dim=1, dtype=torch.float16))):  # fmt: skip
        g = _grad_output(op, xx, gen, **kw)  # torch's autograd with dtype=, judged
        rep = rk.compare_backward({"x": _autograd(op, xx, g, **kw)}, op, g, xx, **kw)["x"]
        assert rep.verdict in ("exact", "rounding"), (op, kw, rep.verdict)
    g = torch.tensor([1.0 / 3.0 + 2.0**-40], dtype=torch.float64)  # g / 1 = g: one rounding of g, exactly
    assert rk.backward("mean", g, torch.ones(1, 1).half(), dim=1, dtype=torch.float64)["x"].item() == float(
        torch.tensor(1.0 / 3.0 + 2.0**-40).half())  # fmt: skip
    m = 2.0**-11 + 2.0**-12  # g = 3 (1 + 2**-11 + 2**-12), n = 3: the quotient 1 + 2**-11 + 2**-12 is above the
    g = torch.tensor([3 * (1 + m)], dtype=torch.float64)  # midpoint 1 + 2**-11 of float16: rounds up, once
    assert rk.backward("mean", g, torch.ones(1, 3).half(), dim=1, dtype=torch.float64)["x"][0, 0].item() == 1 + 2.0**-10


def test_zero_dims_empty_and_numpy_inputs():
    x0 = torch.tensor(2.5)
    assert rk.backward("var", torch.tensor(1.0), x0)["x"].isnan().item()  # dof = 0 at a 0-d input: NaN, as torch
    assert rk.backward("var", torch.tensor(1.0), x0, correction=0)["x"].item() == 0.0
    assert rk.backward("cumsum", torch.tensor(-3.0), x0, 0)["x"].item() == -3.0
    for op in ("sum", "mean", "var", "std"):
        e = rk.backward(op, torch.zeros(2), torch.zeros(2, 0), dim=1)["x"]
        assert e.shape == (2, 0)
    xn = np.array([[1.0, 2.0, 4.0]], np.float32)
    out = rk.backward("std", np.array([2.0], np.float32), xn, dim=1)["x"]
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.tolist() == rk.backward("std", torch.tensor([2.0]), torch.from_numpy(xn), dim=1)["x"].tolist()


def test_torch_rules_where_there_is_no_real_derivative():
    """dof <= 0: with dim=None ``g * (nan if x == mean else inf)``; with a dim, dof == 0 gives inf * g * (x -
    mean) and dof < 0 torch's finite 2 g (x - mean) / dof (var) or signed zeros (std); std at a zero
    variance: 0 (masked_fill); the signs of zero results follow IEEE products."""
    x = torch.tensor([[1.0, 2.0, 2.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    g = torch.tensor([-1.5, 2.0], dtype=torch.float64)

    def alike(a, b):  # the same NaNs, infinities and zero signs; finite values within torch's roundings
        sa, sb = torch.signbit(a) & ~a.isnan(), torch.signbit(b) & ~b.isnan()
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(sa, sb) and torch.allclose(a, b, equal_nan=True)

    for op in ("var", "std"):
        for kw in (dict(dim=1, correction=3), dict(dim=1, correction=4), dict(dim=1, correction=1), dict(dim=1)):
            assert alike(rk.backward(op, g, x, **kw)["x"], _autograd(op, x, g, **kw)), (op, kw)
        for c in (6, 7):
            g0 = torch.tensor(-1.5, dtype=torch.float64)
            assert alike(rk.backward(op, g0, x, correction=c)["x"], _autograd(op, x, g0, correction=c))
    assert rk.backward("var", g, x, dim=1, correction=4)["x"].tolist() == [[-2.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert _bits(rk.backward("std", g, x, dim=1, correction=4)["x"]) == _bits(torch.tensor(  # std = inf: g / inf = -0;
        [[-0.0, 0.0, 0.0], [math.nan] * 3], dtype=torch.float64))  # a constant row's std is NaN (0 / -1): NaN  # fmt: skip


def _contiguous_and_not(x):
    """x itself, a transposed view and a strided slice (non-contiguous inputs)."""
    return [x, x.transpose(0, -1), x[..., ::2]]


COMBOS = [
    ("sum", dict(dim=1)), ("sum", dict(dim=(0, -1), keepdim=True)), ("sum", dict(dim=1, dtype=torch.float32)),
    ("mean", dict(dim=-1)), ("mean", dict(dim=(0, 2), keepdim=True)), ("mean", dict()),
    ("mean", dict(dim=1, dtype=torch.float32)),
    ("var", dict(dim=1)), ("var", dict(dim=(0, 2), correction=0, keepdim=True)), ("var", dict(correction=2)),
    ("var", dict(dim=-1, correction=0.5)),
    ("std", dict(dim=1)), ("std", dict(dim=(0, 2), correction=0, keepdim=True)), ("std", dict(correction=2)),
    ("std", dict(dim=-1, correction=0.5)),
    ("cumsum", dict(dim=1)), ("cumsum", dict(dim=-1)), ("cumsum", dict(dim=0, dtype=torch.float32)),
]  # fmt: skip


def test_consistent_with_torch_autograd_in_float64():
    """torch's float64 gradients are correct implementations: rounding (or exact) against the exact
    reference, over dims, keepdim, correction, dtype= and non-contiguous inputs."""
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(4, 5, 6, generator=gen, dtype=torch.float64) + 3
    for x in _contiguous_and_not(base):
        for op, kw in COMBOS:
            if "dtype" in kw:  # float64 input, float32 computation: the conversion back to float64 is exact
                x_in = x.float().double()
            else:
                x_in = x
            g = _grad_output(op, x_in, gen, **kw)
            got = _autograd(op, x_in, g, **kw)
            rep = rk.compare_backward({"x": got}, op, g, x_in, **kw)["x"]
            assert rep.verdict in ("exact", "rounding"), (op, kw, tuple(x.shape), rep.verdict)
            assert rep.max_bound_ratio <= 1.0
            if "dtype" not in kw:
                assert torch.allclose(rk.backward(op, g, x_in, **kw)["x"], got, rtol=1e-9, atol=1e-12)


def _data(shape, regime, dtype, gen):
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    if regime == "offset":
        z = z + 100
    elif regime == "offset_big":
        z = z * 0.01 + 1000
    elif regime == "lognormal":
        z = torch.exp(3 * z) * torch.sign(torch.randn(shape, generator=gen, dtype=torch.float64))
    return z.to(dtype)


NO_ALARM = [
    ((3, 5, 7), [dict(dim=1), dict(dim=(0, 2), keepdim=True), dict(), dict(dim=-1, correction=0)]),
    ((3, 2048), [dict(dim=1)]),
    ((2, 3), [dict(dim=1, correction=0), dict(dim=0)]),
]


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_no_false_alarm_on_torch_cpu_gradients(dtype):
    """torch's CPU autograd in fp32/fp16/bf16 (opmath float32, intermediates stored in the dtype) over
    shapes, dims, offset data (var/std's cancellation in x - mean), a long row and a wide dynamic range:
    every gradient exact or rounding, within its envelope."""
    gen = torch.Generator().manual_seed(5)
    n = 0
    for regime in ("normal", "offset", "offset_big", "lognormal"):
        for shape, kws in NO_ALARM:
            x = _data(shape, regime, dtype, gen)
            for xx in (x, x.transpose(0, -1)):
                for op in ("sum", "mean", "var", "std", "cumsum"):
                    for kw in kws:
                        if op in ("sum", "mean"):
                            kw = {k: v for k, v in kw.items() if k != "correction"}
                        if op == "cumsum":
                            kw = {"dim": kw["dim"] if isinstance(kw.get("dim"), int) else 0}
                        g = _grad_output(op, xx, gen, **kw)
                        rep = rk.compare_backward({"x": _autograd(op, xx, g, **kw)}, op, g, xx, **kw)["x"]
                        assert rep.verdict in ("exact", "rounding"), (regime, shape, op, kw, rep.verdict)
                        if op == "sum":
                            assert rep.verdict == "exact"
                        n += 1
    assert n == 4 * 2 * 5 * 7  # 280 gradients per dtype


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_dot_no_false_alarm(dtype):
    gen = torch.Generator().manual_seed(8)
    x, y = torch.randn(50, generator=gen).to(dtype), torch.randn(50, generator=gen).to(dtype)
    xl, yl = x.clone().requires_grad_(), y.clone().requires_grad_()
    g = torch.randn((), generator=gen).to(dtype)
    torch.dot(xl, yl).backward(g)
    reps = rk.compare_backward({"x": xl.grad, "y": yl.grad}, "dot", g, x, y)
    assert all(r.verdict in ("exact", "rounding") for r in reps.values())
    bad = xl.grad.clone()
    bad[3] = 0.0  # a dropped term
    assert rk.compare_backward({"x": bad}, "dot", g, x, y)["x"].verdict == "mismatch"
    assert rk.compare_backward({"y": -yl.grad}, "dot", g, x, y)["y"].verdict == "mismatch"


def _bugs(op, x, g, kw):
    """Wrong gradients of op, each from a plausible slip."""
    xd, gd = x.double(), g.double()
    dims = kw.get("dim")
    if op == "mean":
        yield "no 1/n", gd.unsqueeze(dims).expand_as(xd)
    if op in ("var", "std"):
        n = xd.shape[1]
        c = kw.get("correction", 1)
        mu = xd.mean(dim=1, keepdim=True)
        s = xd.std(dim=1, keepdim=True, correction=c)
        if op == "var":
            yield "n instead of n - correction", 2 * gd[:, None] * (xd - mu) / n
            yield "a dropped term (no factor 2)", gd[:, None] * (xd - mu) / (n - c)
        else:
            yield "mean not subtracted", gd[:, None] * xd / ((n - c) * s)
            yield "n instead of n - correction", gd[:, None] * (xd - mu) / (n * s)
    if op == "cumsum":
        yield "forward cumsum instead of reversed", torch.cumsum(gd, dim=1)
        yield "a dropped term (exclusive sum)", torch.flip(torch.cumsum(torch.flip(gd, (1,)), 1), (1,)) - gd
    if op == "sum":
        wrong = gd.unsqueeze(1).expand_as(xd).clone()
        wrong[0, 2] = 0.0
        yield "a dropped element", wrong


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_injected_bugs_are_mismatches(dtype):
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(6, 6, generator=gen, dtype=torch.float64) + 1).to(dtype)  # n - 1 and n: 17% apart
    caught = []
    for op, kw in (("mean", dict(dim=1)), ("var", dict(dim=1)), ("var", dict(dim=1, correction=0)),
                   ("std", dict(dim=1)), ("cumsum", dict(dim=1)), ("sum", dict(dim=1))):  # fmt: skip
        g = _grad_output(op, x, gen, **kw)
        for name, wrong in _bugs(op, x, g, kw):
            if op == "var" and kw.get("correction") == 0 and name.startswith("n instead"):
                continue  # the same gradient there
            rep = rk.compare_backward({"x": wrong.to(dtype)}, op, g, x, **kw)["x"]
            assert rep.verdict == "mismatch", (op, kw, name, rep.verdict)
            caught.append(name)
    assert len(caught) == 9


def test_sum_gradient_is_judged_bit_exact():
    """A correct backend copies g: anything else is a mismatch (max_pool's "not bit-exact" decision)."""
    x = torch.randn(3, 4)
    g = torch.randn(3)
    got = _autograd("sum", x, g, dim=1)
    assert rk.compare_backward({"x": got}, "sum", g, x, dim=1)["x"].verdict == "exact"
    off = got.clone()
    off[1, 1] = torch.nextafter(off[1, 1], torch.tensor(math.inf))  # one ulp
    rep = rk.compare_backward({"x": off}, "sum", g, x, dim=1)["x"]
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] == 1


def test_constants_by_hand():
    assert envb.MEAN_ROUNDINGS == 3 and envb.VAR_K_ROUNDINGS == 3
    assert envb.NORM_SECOND_ORDER == 8 and envb.EVAL_SLACK == 1.0 + 2.0**-40


def _gamma(k, u):  # refkern.analysis.envelope._gamma, written out
    return k * u / (1 - k * u) * (1 + 4 * k * u)


def test_mean_bound_by_hand():
    u, eta_w, eta_o = 2.0**-24, 2.0**-126, 2.0**-150  # float32: unit, smallest normal, half the smallest subnormal
    E = _gamma(3, u) * 1.0 + eta_w
    want = (E * (1 + 2.0**-52) + u * (2.0 * 1.0 * (1 + 2 * u) + E) + 2 * eta_o) * (1 + 2.0**-40)
    got = envb.mean_bound(np.array([1.0]), np.array([1.0]), FLOAT32)
    assert got[0] == pytest.approx(want, rel=1e-15, abs=0)
    u16, uf, eta16 = 2.0**-11, 2.0**-24, 2.0**-25  # float16: computed in float32, stored once
    E = _gamma(3, uf) * 0.5 + eta_w
    want = (E * (1 + 2.0**-52) + u16 * (2.0 * 0.5 * (1 + 2 * u16) + E) + 2 * eta16) * (1 + 2.0**-40)
    assert envb.mean_bound(np.array([0.5]), np.array([0.5]), FLOAT16)[0] == pytest.approx(want, rel=1e-15, abs=0)
    assert envb.mean_bound(np.array([math.inf]), np.array([math.inf]), FLOAT32)[0] == 0.0


def test_var_bound_by_hand():
    """x = (-1, 1) in float32, correction 0 (dof 2, K = 1), g = 1: mu = 0, A = 1, d = +-1, ref = +-1."""
    u, eta_w, eta_o = 2.0**-24, 2.0**-126, 2.0**-150
    slack = 6 * 2.0**-52 * 1.0 + 2.0**-52 * 1.0
    dmu = _gamma(3, u) * 1.0 + 0.0 + eta_o
    e_d = dmu + u * (1.0 + dmu) + eta_o
    D = 1.0 + e_d + slack
    e_t = 3 * u * 1.0 + eta_o
    E = e_t * D + 1.0 * e_d + u * (1.0 + e_t) * D + eta_w
    want = (E * (1 + 8 * u) + u * (2.0 * 1.0 * (1 + 2 * u) + E) + 2 * eta_o) * (1 + 2.0**-40)
    got = envb.var_bound(np.array([[-1.0, 1.0]]), np.array([1.0]), Fraction(0), np.array([[-1.0, 1.0]]), FLOAT32,
                         False, False)  # fmt: skip
    assert got[0, 0] == pytest.approx(want, rel=1e-14, abs=0) and got[0, 1] == pytest.approx(want, rel=1e-14, abs=0)
    # std on the same row: s = 1, its forward envelope b_f, q = g / 2, K = 1
    from refkern.analysis.envelope import envelopes

    hyps, _ = envelopes("std", {"x": np.array([[-1.0, 1.0]]), "dim": 1, "correction": 0.0, "keepdim": False},
                        np.array([1.0]), FLOAT32, lazy=True)  # fmt: skip
    b_f = float(np.asarray(hyps[0][3]).reshape(-1)[0])
    e_s = b_f + u * 1.0 + eta_o + 2.0**-52
    lo = 1.0 - e_s
    e_q = 1.0 * e_s / (2.0 * lo) + u / (2.0 * lo) + eta_o
    Q = 0.5 + e_q
    e_t = e_q + 3 * u * Q + eta_o
    E = e_t * D + Q * e_d + u * (Q + e_t) * D + eta_w
    want = (E * (1 + 8 * u) + u * (2.0 * 0.5 * (1 + 2 * u) + E) + 2 * eta_o) * (1 + 2.0**-40)
    got = envb.var_bound(np.array([[-1.0, 1.0]]), np.array([1.0]), Fraction(0), np.array([[-0.5, 0.5]]), FLOAT32,
                         True, False)  # fmt: skip
    assert got[0, 0] == pytest.approx(want, rel=1e-14, abs=0)
    # no real value (dof <= 0 with dim=None): only the same value fits
    assert envb.var_bound(np.array([[-1.0, 1.0]]), np.array([1.0]), Fraction(2), np.array([[-1.0, 1.0]]),
                          FLOAT32, False, True).tolist() == [[0.0, 0.0]]  # fmt: skip


def test_cumsum_converted_bound_is_the_forward_envelope_plus_the_reference_distance():
    from refkern.analysis.envelope import envelopes

    gp = np.array([[1.0, 2.0**-12, 3.0, -1.0]])
    ref_p = np.array([[3.0 + 2.0**-12, 2.0 + 2.0**-12, 2.0, -1.0]])
    ref = ref_p + np.array([[2.0**-10, 0.0, 0.0, 0.0]])
    got = envb.cumsum_converted_bound(gp, 1, ref_p, ref, FLOAT16)
    hyps, _ = envelopes("cumsum", {"x": gp[:, ::-1].copy(), "dim": 1, "dtype": None}, ref_p[:, ::-1].copy(), FLOAT16,
                        lazy=True)  # fmt: skip
    want = np.asarray(hyps[0][3])[:, ::-1] + np.abs(ref_p - ref)
    assert np.array_equal(got, want) and got[0, 0] > want[0, 1]


def test_errors_name_the_argument():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of mean, \(3,\)"):
        rk.backward("mean", torch.randn(4), x, dim=1)
    with pytest.raises(TypeError, match=r"^backward: grad_output must have the dtype of the output of sum, float64"):
        rk.backward("sum", torch.randn(3), x, dim=1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^backward: var has no differentiable argument 'dim'"):
        rk.backward("var", torch.randn(3), x, dim=1, wrt="dim")
    with pytest.raises(ValueError, match=r"^backward: dot has no differentiable argument 'z'"):
        rk.backward("dot", torch.tensor(1.0), x[0], x[1], wrt="z")
    with pytest.raises(IndexError, match=r"^backward: dim=2 is out of range"):
        rk.backward("std", torch.randn(3), x, dim=2)
    with pytest.raises(TypeError, match=r"^backward: cumsum's dim must be an int; got None"):
        rk.backward("cumsum", x, x, None)
    with pytest.raises(ValueError, match=r"^backward: dot expects 1-D x and y of one length"):
        rk.backward("dot", torch.tensor(1.0), x[0], x[1, :3])
    with pytest.raises(ValueError, match=r"^backward: accumulate= is not an argument"):
        rk.backward("sum", torch.randn(3), x, dim=1, accumulate="naive")
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of x must have the dtype of x, float32"):
        rk.compare_backward({"x": x.double()}, "var", torch.randn(3), x, dim=1)
    with pytest.raises(ValueError, match=r"^compare_backward: the gradient of x must have the shape of x"):
        rk.compare_backward({"x": x[:2]}, "mean", torch.randn(3), x, dim=1)


def test_check_backward_dispatches_the_reductions():
    import refkern.torch as rkt

    x = torch.randn(4, 6) + 5
    for fn, kw in ((torch.var, dict(dim=1, correction=0)), (torch.mean, dict(dim=0)), (torch.cumsum, dict(dim=1))):
        res = rkt.check(fn, x, devices=["cpu"], backward=True, **kw)
        assert [(r.argument, r.report.verdict in ("exact", "rounding")) for r in res.grads] == [("x", True)]
    for fn in (torch.dot, torch.Tensor.dot):  # known to the op table: no op= needed
        res = rkt.check(fn, x[0], x[1], devices=["cpu"], backward=True)
        assert [r.argument for r in res.grads] == ["x", "y"]
        assert all(r.report.verdict in ("exact", "rounding") for r in res.grads)
    with pytest.raises(ValueError, match=r"^check: dot with arguments other than two tensors of one dtype"):
        rkt.check(torch.dot, x[0], x[1].double(), devices=["cpu"])  # torch refuses mixed dtypes: so does the table


def test_bias_gradient_is_judged_as_the_sum():
    """A linear's or conv2d's grad_bias is a sum over the batch (and positions), judged by the sum's own test (its
    terms' actual signs, the float32 orders emulated), not by the GEMM test of matmul(ones, g), whose scale sqrt(n)
    u sum |g| let a float32 conv2d grad_bias offset by 8x the spread of correct kernels pass as rounding (60x that
    spread on random-sign terms) and named a bfloat16 linear grad_bias scaled by 8x reduced-precision bf16.
    The spread here: the float32 sums left to right and torch's, against the float64 sum rounded."""
    gen = torch.Generator().manual_seed(11)
    x, w, b = torch.randn(4, 8, 8, 8, generator=gen), torch.randn(16, 8, 3, 3, generator=gen), torch.randn(16)
    g = torch.randn(4, 16, 8, 8, generator=gen)
    bs = b.clone().requires_grad_()
    torch.nn.functional.conv2d(x, w, bs, padding=1).backward(g)
    exact = g.double().sum((0, 2, 3))
    seq = torch.from_numpy(np.cumsum(g.permute(1, 0, 2, 3).reshape(16, -1).numpy(), axis=1, dtype=np.float32)[:, -1])
    spread = max(float((bs.grad.double() - exact).abs().max()), float((seq.double() - exact).abs().max()))
    for got in (bs.grad, seq):
        rep = rk.compare_backward({"bias": got}, "conv2d", g, x, w, b, padding=1)["bias"]
        assert rep.verdict in ("exact", "rounding"), rep
    bad = (bs.grad.double() + 8 * spread).float()
    assert rk.compare_backward({"bias": bad}, "conv2d", g, x, w, b, padding=1)["bias"].verdict == "mismatch"
    xl, wl = torch.randn(128, 128, generator=gen).bfloat16(), torch.randn(64, 128, generator=gen).bfloat16()
    bl, gl = torch.randn(64, generator=gen).bfloat16(), torch.randn(128, 64, generator=gen).bfloat16()
    exact = gl.double().sum(0)
    assert rk.compare_backward({"bias": exact.bfloat16()}, "linear", gl, xl, wl, bl)["bias"].verdict == "exact"
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs())) - 7)
    scaled = (exact * (1 + 8 * float((ulp / 2).max() / exact.abs().max()))).bfloat16()  # 8x the spread (half an ulp)
    rep = rk.compare_backward({"bias": scaled}, "linear", gl, xl, wl, bl)["bias"]
    assert rep.verdict == "mismatch", rep
