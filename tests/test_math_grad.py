"""The math functions' gradients (issues 25 and 26): ``g f'(x)`` for exp, exp2, expm1, log, log2, log1p, sqrt,
rsqrt, reciprocal, pow, erf, softplus, sin and cos, each added as a record (refkern.ops) plus its derivative:
correctly rounded (refkern.backward) against the mpmath truth, bit for bit, special values included; torch's
CPU autograd formulas judged without a false alarm in every dtype; injected bugs are mismatches; the bound
written by hand; errors name the argument; the audit judges softplus_backward."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import refkern  # noqa: E402
import refkern.ops as ops  # noqa: E402
import refkern.torch as rkt  # noqa: E402
from refkern.accumulate.formats import FLOAT32  # noqa: E402
from refkern.analysis.elementwise_grad import grad_bounds  # noqa: E402
from refkern.ops._accuracy import LIBRARIES  # noqa: E402

OK = ("exact", "rounding")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CASES = [("exp", {}), ("exp2", {}), ("expm1", {}), ("log", {}), ("log2", {}), ("log1p", {}), ("sqrt", {}), ("rsqrt", {}), ("reciprocal", {}),
         ("pow", {"exponent": 2.5}), ("pow", {"exponent": 3.0}), ("pow", {"exponent": -2.0}), ("pow", {"exponent": 0.5}),
         ("pow", {"exponent": 1.0}), ("pow", {"exponent": 0.0}), ("erf", {}), ("softplus", {}),
         ("softplus", {"beta": 2.0, "threshold": 5.0}), ("sin", {}), ("cos", {})]  # fmt: skip
_ID = [f"{n}{''.join(f'-{v}' for v in kw.values())}" for n, kw in CASES]
FORWARD = {"exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log1p": torch.log1p, "sqrt": torch.sqrt,
           "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "pow": torch.pow, "erf": torch.erf,
           "softplus": F.softplus, "sin": torch.sin, "cos": torch.cos}  # fmt: skip
#: the scale of the random inputs (torch's functions at their usual arguments; rotary angles for sin and cos)
SCALE = {"exp": 8, "exp2": 12, "expm1": 8, "log1p": 2, "pow": 3, "erf": 3, "softplus": 12, "sin": 1e4, "cos": 1e4}


def _domain(name, kw, x):
    if name in ("log", "log2", "sqrt", "rsqrt") or (name == "pow" and not float(kw["exponent"]).is_integer()):
        return x.abs()
    return x.clamp(min=-0.999) if name == "log1p" else x


def _inputs(name, kw, dtype, n, seed, specials=True):
    """(x, g): random arguments of the op's usual range, and the dtype's hard values: zeros, infinities, NaN, the
    smallest and largest values, 1, -1, the saturation thresholds (|x| = 40, 1500)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dtype=torch.float64, generator=gen) * SCALE.get(name, 4)
    x = _domain(name, kw, x)
    if specials:
        fi = torch.finfo(dtype)
        hard = [0.0, -0.0, math.inf, -math.inf, math.nan, fi.tiny / 4, -fi.tiny, fi.max, -fi.max, 1.0, -1.0, 4.0,
                0.25, 40.0, -40.0, 1500.0, -1501.0, 20.0, 2.5]  # fmt: skip
        x = torch.cat([torch.tensor(hard, dtype=torch.float64), x])
    x = x.to(dtype)
    g = torch.randn(x.shape, dtype=torch.float64, generator=gen).to(dtype)
    if specials:
        g[:8] = torch.tensor([1.0, -2.0, 0.5, 0.0, math.inf, -1.0, 3.0, 1e30], dtype=torch.float64).to(dtype)
    return x, g


def _torch_grad(name, kw, x, g):
    xx = x.detach().clone().requires_grad_()
    FORWARD[name](xx, **kw).backward(g)
    return xx.grad


def _same(a, b):
    a, b = a.double(), b.double()
    return (((a == b) & (a.signbit() == b.signbit())) | (a.isnan() & b.isnan())).all().item()


def test_each_op_is_a_record_with_its_backward():
    """Adding an op's gradient is its record (differentiable, Backward) plus its derivative's code."""
    for name in FORWARD:
        r = ops.get(name)
        want = ("input", "exponent") if name == "pow" else ("input",)  # pow's tensor exponent has a gradient
        assert r.differentiable == want and r.backward is not None, name
        assert name in refkern.gradients.OPS
    assert ops.get("softplus").aten_backward == ("softplus_backward",)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name, kw", CASES, ids=_ID)
def test_reference_is_the_truth(name, kw, dtype):
    x, g = _inputs(name, kw, dtype, 40, 1)
    ref = refkern.backward(name, g, x, **kw)["input"]
    truth = refkern.truth.backward(name, g, x, **kw)["input"]
    assert ref.dtype == dtype and ref.shape == x.shape
    bad = [(float(a), float(b), float(c), float(d)) for a, b, c, d in zip(x, g, ref, truth) if not _same(c[None], d[None])]
    assert not bad, bad[:5]


def test_hard_values_by_hand():
    """Rational derivatives rounded once, f'(x) = 1 gives g, the signed zeros and infinities torch's formulas give."""
    x = torch.tensor([0.0, 3.0, -0.0, 4.0], dtype=torch.float32)
    g = torch.tensor([3.0, 1.0, 1.0, 2.0], dtype=torch.float32)
    assert refkern.backward("exp", g, x)["input"][0].item() == 3.0  # e**0 = 1
    assert refkern.backward("log", g, x)["input"][1].item() == np.float32(1 / 3)  # g / x, one rounding
    assert refkern.backward("sqrt", g, x)["input"][3].item() == 0.5  # 2 / (2 sqrt 4): a rational root
    assert refkern.backward("rsqrt", g, x)["input"][3].item() == -2 / 16  # -2 / (2 * 4 * 2)
    assert refkern.backward("reciprocal", g, x)["input"][1].item() == np.float32(-1 / 9)
    c = refkern.backward("cos", g, x)["input"]  # g * -sin(x) at +-0: 3 * -0 = -0, 1 * -(-0) = +0
    assert c[0].item() == 0.0 and c[0].signbit() and c[2].item() == 0.0 and not c[2].signbit()
    assert refkern.backward("sqrt", g, x)["input"][0].item() == math.inf  # g / (2 * 0)
    assert torch.equal(refkern.backward("pow", g, x, 0.0)["input"], torch.zeros(4))  # torch's zeros
    assert torch.equal(refkern.backward("pow", g, x, 1.0)["input"], g)  # 1 * x**0
    big = torch.tensor([1600.0, -1600.0], dtype=torch.float64)
    e = refkern.backward("exp", torch.tensor([1e-300, -1e300], dtype=torch.float64), big)["input"]
    assert e[0].item() == math.inf and e[1].item() == 0.0 and e[1].signbit()  # beyond every format
    sp = refkern.backward("softplus", torch.tensor([5.0, 5.0]), torch.tensor([20.5, 0.0]))["input"]
    assert sp.tolist() == [5.0, 2.5]  # beta x > threshold: g; sigmoid(0) = 1/2


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name, kw", CASES, ids=_ID)
def test_torch_cpu_backward_is_no_false_alarm(name, kw, dtype):
    x, g = _inputs(name, kw, dtype, 4000 if dtype != torch.float64 else 300, 2)
    rep = refkern.compare_backward({"input": _torch_grad(name, kw, x, g)}, name, g, x, **kw)["input"]
    assert rep.verdict in OK, rep


BUGS = {  # the gradient a broken kernel returns, from (x, g), in float32
    "exp: g e**x / 2 (a halved constant)": ("exp", {}, lambda x, g: g * torch.exp(x) / 2),
    "log1p: g / x (the 1 lost)": ("log1p", {}, lambda x, g: g / x),
    "exp2: g 2**x (ln 2 lost)": ("exp2", {}, lambda x, g: g * torch.exp2(x)),
    "exp2: g 2**x ln 2 with ln 2 in bfloat16": ("exp2", {}, lambda x, g: g * torch.exp2(x) * 0.69140625),
    "log2: g / x (ln 2 lost)": ("log2", {}, lambda x, g: g / x),
    "log2: g log2(e) / x with log2(e) in bfloat16": ("log2", {}, lambda x, g: g * 1.4453125 / x),
    "rsqrt: -0.5 g (x + 1e-6)**-1.5 (a stray eps)": ("rsqrt", {}, lambda x, g: -0.5 * g * (x + 1e-6) ** -1.5),
    "pow: g x**(y - 1) (the exponent factor lost)": ("pow", {"exponent": 3.0}, lambda x, g: g * x**2),
    "erf: e**(-x**2) without 2 / sqrt(pi)": ("erf", {}, lambda x, g: g * torch.exp(-x * x)),
    "sin: g cos(x) with a float32 2 pi reduction": ("sin", {}, lambda x, g: g * torch.cos(
        torch.remainder(x.double(), np.float32(2 * math.pi).item()).float())),
    "cos: g sin(x) (the sign lost)": ("cos", {}, lambda x, g: g * torch.sin(x)),
    "softplus: g sigmoid(x) where beta = 2": ("softplus", {"beta": 2.0}, lambda x, g: g * torch.sigmoid(x)),
}  # fmt: skip


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bugs_are_mismatches(bug):
    name, kw, wrong = BUGS[bug]
    x, g = _inputs(name, kw, torch.float32, 2000, 3, specials=False)
    x = x.clamp(min=1e-3) if name in ("log1p", "rsqrt") else x  # the bug's own domain
    rep = refkern.compare_backward({"input": wrong(x, g)}, name, g, x, **kw)["input"]
    assert rep.verdict == "mismatch", rep


def test_reciprocal_backward_bound_written_by_hand():
    """float32, x = 2, g = 1, torch's CPU class: t = 1/2 (IEEE, E_t = r(1/2) = 2**-25, widened by 1 + 2**-10);
    -g (t t): E = |g| (2 |t| E_t + r(1/4)) + r(-1/4) = 2**-25 (1 + 2**-10) + 2**-26 + 2**-26, widened again."""
    et = 2.0**-25 * (1 + 2.0**-10)
    want = (et + 2.0**-26 + 2.0**-26) * (1 + 2.0**-10)
    got = grad_bounds("reciprocal", np.array([1.0]), np.array([2.0]), np.array([-0.25]), FLOAT32, LIBRARIES[0])
    assert got[0] == pytest.approx(want, abs=0)


def test_log2_and_exp2_backward_bounds_written_by_hand():
    """float32, g = 1, torch's CPU class, u = 2**-24. log2 at x = 1: g / (x c), c = fl32(ln 2); x c stored, within
    rs(ln 2) = 2**-25 (ln 2 in [1/2, 1)); v = 1 / ln 2 in [1, 2): r(v) = 2**-24;
    E = |v| (u + 2**-25 / ln 2) + 2**-24, widened by 1 + 2**-10. exp2 at x = 0: t = 1, within SLEEF u10's 1 ulp
    (E_t = 2**-23, widened by 1 + 2**-10), g t stored: rs(1) = 2**-24; then (g t) c: E = ln 2 (E_t + 2**-24) +
    ln 2 u + r(ln 2), r(ln 2) = 2**-25, widened again."""
    ln2, w = math.log(2.0), 1 + 2.0**-10
    want = ((1 / ln2) * (2.0**-24 + 2.0**-25 / ln2) + 2.0**-24) * w
    got = grad_bounds("log2", np.array([1.0]), np.array([1.0]), np.array([1 / ln2]), FLOAT32, LIBRARIES[0])
    assert got[0] == pytest.approx(want, rel=1e-15)
    got = grad_bounds("exp2", np.array([1.0]), np.array([0.0]), np.array([ln2]), FLOAT32, LIBRARIES[0])
    want = (ln2 * (2.0**-23 * w + 2.0**-24) + ln2 * 2.0**-24 + 2.0**-25) * w
    assert got[0] == pytest.approx(want, rel=1e-15)


def test_errors_name_the_argument():
    x = torch.rand(4) + 1
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of exp, \(4,\)"):
        refkern.backward("exp", torch.randn(3), x)
    with pytest.raises(TypeError, match=r"^backward: grad_output must have the dtype of the output of log, float32"):
        refkern.backward("log", torch.randn(4, dtype=torch.float64), x)
    g = torch.randn(4)  # a broadcast exponent's gradient is autograd's sum (kernels/pow_backward.py), not refused
    assert tuple(refkern.backward("pow", g, x, torch.ones(1))["exponent"].shape) == (1,)
    with pytest.raises(TypeError, match=r"^backward: beta must be a real number; got beta='2'"):
        refkern.backward("softplus", torch.randn(4), x, beta="2")
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of input must have the dtype of input, "
                                        r"float32; got float64"):  # fmt: skip
        refkern.compare_backward({"input": torch.randn(4, dtype=torch.float64)}, "sin", torch.randn(4), x)


def test_audit_judges_softplus_backward():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Softplus(beta=2.0), torch.nn.Linear(16, 1))
    x = torch.randn(32, 8)
    with rkt.audit() as a:
        model(x).sum().backward()
    judged = {c.op: c.verdict for c in a.calls if c.report is not None}
    assert judged.get("softplus backward") in OK, a.report()
