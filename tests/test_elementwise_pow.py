"""pow with a tensor exponent (issue 26: tensor ** tensor, and a number base with a tensor exponent): the reference
(refkern.kernels.elementwise.pow) against its mpmath truth (refkern.truth.elementwise.pow) bit for bit, each element
with its own exponent; torch's promotion and its cast of both operands to the result's dtype; C99's special values
(torch calls C99's pow there, not sqrt); the yardstick: torch's CPU pow(Tensor, Tensor) never a false alarm, a
wrong exponent a mismatch."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refkern
import refkern.truth as truth
from tests.strategies import FORMAT_NAMES, same, to_array, values

torch = pytest.importorskip("torch")

_BASES = st.floats(2.0**-30, 300.0) | st.floats(-300.0, -(2.0**-30))
_EXPONENTS = st.floats(-40.0, 40.0) | st.integers(-60, 60).map(float) | st.integers(-80, 80).map(lambda k: k / 4.0)


def _pairs(fmt):
    return st.lists(st.tuples(st.one_of(values(fmt, specials=True), _BASES),
                              st.one_of(values(fmt, specials=True), _EXPONENTS)), min_size=1, max_size=10)  # fmt: skip


def _flat(a):
    return np.asarray(a.double() if hasattr(a, "double") else a, np.float64).reshape(-1)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_each_element_its_own_exponent_is_the_truth(fmt, data):
    pairs = data.draw(_pairs(fmt))
    x = to_array([p[0] for p in pairs], fmt, "torch")  # (rounded to the format on the way in)
    y = to_array([p[1] for p in pairs], fmt, "torch")
    got, want = _flat(refkern.pow(x, y)), _flat(truth.pow(x, y))
    bad = [(float(x[i]), float(y[i]), got[i], want[i]) for i in range(len(pairs)) if not same(got[i], want[i])]
    assert not bad, f"pow {fmt}: (x, y, reference, truth) {bad[:5]}"


def test_promotion_and_the_cast_of_both_operands_by_hand():
    x = torch.tensor([2.0, 3.0, 0.5], dtype=torch.bfloat16)
    # a 0-dim float32 exponent: the result is bfloat16 and 0.3 is cast to bfloat16's 0.30078125 first
    got = refkern.pow(x, torch.tensor(0.3))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, refkern.pow(x, 0.30078125))
    assert torch.equal(got, truth.pow(x, torch.tensor(0.3)))
    # two tensors with dimensions, float16 and bfloat16: float32
    y = torch.tensor([1.5, -2.0, 3.0], dtype=torch.float16)
    assert refkern.pow(x, y).dtype == torch.float32 == torch.pow(x, y).dtype
    assert _flat(refkern.pow(x, y))[1:].tolist() == [float(np.float32(1 / 9)), 0.125]  # 3**-2, 0.5**3
    # a number base, float16 exponents: 2**-24 is float16's smallest subnormal, 2**15 its largest power of two,
    # 2**16 = 65536 beyond 65504 rounds to inf; broadcast against a column
    e = torch.tensor([[-24.0, 15.0, 16.0], [-25.0, 0.0, -0.0]], dtype=torch.float16)
    got = refkern.pow(2.0, e)
    assert got.dtype == torch.float16 and got.shape == (2, 3)
    assert _flat(got).tolist() == [2.0**-24, 32768.0, math.inf, 0.0, 1.0, 1.0]  # 2**-25: a tie, to even (0)
    zero_d = refkern.pow(torch.tensor(3.0), torch.tensor(0.5))  # two 0-dim tensors: a 0-dim result
    assert zero_d.shape == () and float(zero_d) == float(np.float32(3**0.5))
    assert refkern.compare(torch.pow(torch.tensor(3.6171), torch.tensor(0.7)), "pow", torch.tensor(3.6171),
                           torch.tensor(0.7)).shape == ()  # fmt: skip
    col = refkern.pow(torch.tensor([[4.0], [9.0]]), torch.tensor([0.5, -0.5, 1.5]))
    assert _flat(col).tolist() == [2.0, 0.5, 8.0, 3.0, float(np.float32(1 / 3)), 27.0]


def test_c99_special_values_with_a_tensor_exponent():
    """torch's pow(Tensor, Tensor) calls C99's pow: pow(-0, 1/2) = +0, pow(-inf, 1/2) = +inf, pow(-0, -1/2) = +inf,
    pow(-inf, -1/2) = +0 (F.9.4.4); with a number exponent torch takes sqrt and rsqrt (-0, NaN, -inf, NaN)."""
    x = torch.tensor([-0.0, -math.inf, -0.0, -math.inf, -1.0, 0.0, math.nan, 1.0])
    y = torch.tensor([0.5, 0.5, -0.5, -0.5, math.inf, -3.0, 0.0, math.nan])
    want = [0.0, math.inf, math.inf, 0.0, 1.0, math.inf, 1.0, 1.0]
    for got in (refkern.pow(x, y), truth.pow(x, y), torch.pow(x, y)):
        assert all(same(a, b) for a, b in zip(_flat(got), want)), _flat(got)
    assert [str(v) for v in _flat(refkern.pow(x[:2], 0.5))] == ["-0.0", "nan"]
    assert [str(v) for v in _flat(refkern.pow(x[2:4], -0.5))] == ["-inf", "nan"]
    # a negative base to an even integer beyond 2**63 (numba's floor wrapped there: these were NaN)
    big = torch.tensor([-2.0, -0.5, -1.1371966616514506e-19])
    assert _flat(refkern.pow(big, 1e20)).tolist() == [math.inf, 0.0, 0.0]
    assert _flat(refkern.pow(big, torch.tensor([1e20, 1e20, 3.0051152180693134e28]))).tolist() == [math.inf, 0.0, 0.0]


def _wide(dtype, n, rng):
    """Bases over the whole format (random bit patterns: subnormals, huge, specials) and ordinary ones; exponents
    of ordinary size, integers (negative bases), halves, and random bit patterns."""
    bits = rng.integers(0, 2**16 if dtype in (torch.float16, torch.bfloat16) else 2**32, n // 3)
    if dtype in (torch.float16, torch.bfloat16):
        raw = torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(dtype).double().numpy()
    else:
        raw = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    x = np.concatenate([raw, rng.uniform(0, 8, n - raw.size) * rng.choice([1e-3, 1, 10], n - raw.size)])
    y = np.concatenate([rng.uniform(-12, 12, n // 2), rng.integers(-9, 10, n // 4), rng.integers(-20, 20, n // 8) / 2])
    y = np.concatenate([y, np.resize(raw[::-1], n - y.size)])
    rng.shuffle(y)
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_torch_pow_tensor_tensor_is_no_false_alarm_and_a_wrong_exponent_is_a_mismatch(dtype):
    x, y = _wide(dtype, 6000, np.random.default_rng(7))
    rep = refkern.compare(torch.pow(x, y), "pow", x, y)
    assert rep.verdict in ("exact", "rounding"), str(rep)
    g = torch.Generator().manual_seed(1)
    xs, ys = (torch.rand(64, 64, generator=g) * 4).to(dtype), (torch.randn(64, 64, generator=g) * 3).to(dtype)
    bad = torch.pow(xs.double(), ys.double() * (1 + 2.0**-6)).to(dtype)  # the exponent 1.6% too large
    assert refkern.compare(bad, "pow", xs, ys).verdict == "mismatch"
    assert refkern.compare(torch.pow(2.5, ys), "pow", 2.5, ys).verdict in ("exact", "rounding")


def test_a_0_dim_exponent_is_torch_pow_tensor_tensor():
    """``x.pow(torch.tensor(2.0))`` runs torch's tensor-tensor kernel (SLEEF's powf: 71 of these 4096 float32
    results differ from x * x, by 0.554 ulp), not pow(Tensor, Scalar)'s x * x: judged by the library's pow, it is
    rounding (read as the number 2.0 it was a mismatch, 1.107x the bound of one rounding)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 64, generator=g) * 4
    out = torch.pow(x, torch.tensor(2.0))
    assert int((out != x * x).sum()) > 0
    rep = refkern.compare(out, "pow", x, torch.tensor(2.0))
    assert rep.verdict == "rounding", str(rep)


def test_errors():
    with pytest.raises(TypeError, match=r"^pow: expected floating-point inputs"):
        refkern.pow(np.ones(2, np.float32), np.ones(2, np.int64))
    with pytest.raises(TypeError, match=r"^pow: exponent must be a real number"):
        refkern.pow(np.ones(2, np.float32), "2")
    with pytest.raises(ValueError, match=r"shape mismatch|broadcast"):
        refkern.pow(np.ones(2, np.float32), np.ones(3, np.float32))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_both_gradients_of_a_tensor_exponent_are_the_truth(fmt, data):
    from refkern.kernels.elementwise_grad import pow_gradients
    from refkern.truth._backward_math import pow_gradients as truth_gradients

    pairs = data.draw(_pairs(fmt))
    gs = data.draw(st.lists(st.one_of(values(fmt, specials=True), st.floats(-4.0, 4.0)), min_size=len(pairs),
                            max_size=len(pairs)))  # fmt: skip
    x, y, g = (to_array(v, fmt, "torch") for v in ([p[0] for p in pairs], [p[1] for p in pairs], gs))
    got, want = pow_gradients(g, x, y), truth_gradients(g, x, y)
    for k in ("input", "exponent"):
        a, b = _flat(got[k]), _flat(want[k])
        bad = [(float(x[i]), float(y[i]), float(g[i]), a[i], b[i]) for i in range(len(pairs)) if not same(a[i], b[i])]
        assert not bad, f"pow's {k} gradient {fmt}: (x, y, g, reference, truth) {bad[:5]}"


def test_gradients_by_hand():
    from refkern.kernels.elementwise_grad import pow_gradients

    x = torch.tensor([4.0, 2.0, 1.0, 1.0, 0.0, 0.0, 2.0])
    y = torch.tensor([0.5, 3.0, 2.5, 2.5, 2.0, -1.0, 0.0])
    g = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 3.0])
    got = pow_gradients(g, x, y)
    # d/dx: 0.5 / sqrt(4) = 0.25; 3 * 2**2 = 12; 2.5 (x = 1); -2.5; 2 * 0 = 0; torch's -1 * 0**-2 = -inf; y = 0: 0
    assert [str(v) for v in _flat(got["input"])] == ["0.25", "12.0", "2.5", "-2.5", "0.0", "-inf", "0.0"]
    # d/dy: x**y ln x. 4**0.5 ln 4 = 2.772588722239781 -> float32 2.7725887298583984; 8 ln 2 = 5.545177444479562 ->
    # 5.545177459716797; ln 1 = 0: a zero with g's sign; x = 0, y >= 0: torch's 0; x = 0, y < 0: inf * -inf = -inf;
    # 2**0 ln 2 = 0.6931471805599453 -> 0.6931471824645996, times 3: 2.0794415416798357 -> 2.0794415473937990
    assert _flat(got["exponent"]).tolist() == [2.7725887298583984, 5.545177459716797, 0.0, -0.0, 0.0, -math.inf,
                                               2.079441547393799]  # fmt: skip
    assert math.copysign(1.0, _flat(got["exponent"])[3]) == -1.0
    with pytest.raises(ValueError, match=r"^backward: pow's gradient of exponent takes exponent of the result's shape"):
        pow_gradients(torch.ones(2, 3), torch.ones(2, 3), torch.ones(3))


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_torch_tensor_exponent_gradients_are_judged_and_bugs_are_mismatches(dtype):
    """compare_backward judges both of torch's gradients of pow(Tensor, Tensor) by its formulas (the input's:
    ``g * (y * x.pow(y - 1))``, y - 1 a stored op; the exponent's: ``g * (result * x.log())``), never a false
    alarm; an exponent gradient 1% off, or an input gradient that forgot the - 1, is a mismatch."""
    rng = np.random.default_rng(11)
    n = 3000
    x = np.concatenate([rng.uniform(0, 8, n) * rng.choice([1e-3, 1, 10], n), -rng.uniform(0.1, 4, n // 3), [0.0] * 8,
                        [1.0] * 4])  # fmt: skip
    y = np.concatenate([rng.uniform(-6, 6, n), rng.integers(-5, 6, n // 3), [2.0, 0.0, -1.0, 0.5, 3.0, 1.0, -0.5, 0.0],
                        [2.5, -2.5, 0.0, 7.0]])  # fmt: skip
    x, y = torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)
    g = torch.from_numpy(rng.standard_normal(x.numel())).to(dtype)
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    torch.pow(xr, yr).backward(g)
    reps = refkern.compare_backward({"input": xr.grad, "exponent": yr.grad}, "pow", g, x, y)
    for k, rep in reps.items():
        assert rep.verdict in ("exact", "rounding"), (k, str(rep))
    bad = yr.grad.clone()
    bad[:n] *= 1.01
    assert refkern.compare_backward({"exponent": bad}, "pow", g, x, y)["exponent"].verdict == "mismatch"
    forgot = (g.double() * (y.double() * torch.pow(x.double(), y.double()))).to(dtype)
    assert refkern.compare_backward({"input": forgot}, "pow", g, x, y)["input"].verdict == "mismatch"
    assert set(refkern.backward("pow", g, x, y)) == {"input", "exponent"}
    assert set(refkern.backward("pow", g, x, 2.5)) == {"input"}  # a number exponent has no gradient
    # a 0-dim exponent: the input's gradient is elementwise (the exponent's would be a sum over the broadcast)
    e = y[:1].reshape(())
    xr = x.clone().requires_grad_()
    torch.pow(xr, e).backward(g)
    rep = refkern.compare_backward({"input": xr.grad}, "pow", g, x, e)["input"]
    assert rep.verdict in ("exact", "rounding"), str(rep)
    # the 0-dim exponent's gradient, a sum over every element (autograd's sum_to), is judged too
    # (refkern.analysis.elementwise_grad.judge_reduced; tests/test_pow_broadcast_grad.py)
    er = e.clone().requires_grad_()
    torch.pow(x, er).backward(g)
    rep = refkern.compare_backward({"exponent": er.grad}, "pow", g, x, e)["exponent"]
    assert rep.verdict in ("exact", "rounding"), str(rep)
