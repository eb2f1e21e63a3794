"""The elementwise references (refkern.kernels.elementwise) against their mpmath ground truth
(refkern.truth.elementwise): every element bit for bit, on hypothesis' values of each format (every bit
pattern alike: subnormals, huge values, specials) and on each function's own domain, plus hard cases
pinned by hand (overflow and underflow thresholds, ties, large arguments of sin and cos)."""

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import refkern
import refkern.truth as truth
from tests.strategies import FORMAT_NAMES, same, to_array, values

# (op, keyword arguments, the range where the function is not constant in every format)
CASES = [
    ("exp", {}, 750), ("exp2", {}, 1100), ("expm1", {}, 750), ("log", {}, 1e6), ("log2", {}, 1e6),
    ("log1p", {}, 1e6), ("sqrt", {}, 1e6), ("rsqrt", {}, 1e6), ("reciprocal", {}, 1e6), ("tanh", {}, 25),
    ("sigmoid", {}, 800), ("silu", {}, 800), ("gelu", {}, 70), ("gelu", {"approximate": "tanh"}, 70),
    ("erf", {}, 7), ("softplus", {}, 800), ("softplus", {"beta": 2.0, "threshold": 5.0}, 800), ("sin", {}, 1e6),
    ("cos", {}, 1e6), ("pow", {"exponent": 2.5}, 300), ("pow", {"exponent": -3.0}, 300),
    ("pow", {"exponent": 2.0}, 1e3), ("pow", {"exponent": 0.5}, 1e3), ("pow", {"exponent": -0.5}, 1e3),
    ("pow", {"exponent": 1.0 / 3.0}, 1e3),
]  # fmt: skip
IDS = [f"{op}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for op, kw, _ in CASES]


def _check(op, kw, xs, fmt):
    x = to_array(xs, fmt)
    got = getattr(refkern, op)(x, **kw)
    want = getattr(truth, op)(x, **kw)
    g = np.asarray(got.float() if hasattr(got, "float") else got, np.float64).reshape(-1)
    w = np.asarray(want.float() if hasattr(want, "float") else want, np.float64).reshape(-1)
    bad = [(xs[i], g[i], w[i]) for i in range(len(xs)) if not same(g[i], w[i])]
    assert not bad, f"{op}{kw} {fmt}: (x, reference, truth) {bad[:5]}"


def _as_float(a):
    return float(a.float()[0]) if hasattr(a, "float") else float(a[0])


def _domain(fmt, span):
    return st.floats(-span, span, allow_nan=False).map(lambda v: float(np.asarray(v).astype(np.float32))
                                                       if fmt != "float64" else v)  # fmt: skip


@pytest.mark.parametrize("op,kw,span", CASES, ids=IDS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_correctly_rounded_against_the_truth(op, kw, span, fmt, data):
    xs = data.draw(st.lists(st.one_of(values(fmt, specials=True), _domain(fmt, span)), min_size=1, max_size=12))
    if fmt in ("float16", "bfloat16"):  # a float32 value from _domain is rounded to the format on the way in
        xs = [_as_float(to_array([v], fmt)) for v in xs]
    _check(op, kw, xs, fmt)


HARD = {
    "float32": [88.72283935546875, 88.72283172607422, -103.97207641601562, -87.33654022216797, 1e5, -1e5, 3.4e38,
                1.401298464324817e-45, 1.1754943508222875e-38, 0.9999999403953552, 1.0000001192092896, 4097.0,
                -4097.0, 1e-8, -1e-8, 20.0, 20.000001907348633, -8.5, 8.5, 5.5, -5.5, 0.5, 2.0**-24],
    "float64": [709.782712893384, 709.7827128933841, -745.1332191019411, -745.1332191019412, -708.3964185322641,
                1e22, 6381956970095103 * 2.0**797, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                0.9999999999999999, 1.0000000000000002, 94906267.0, 1e-300, -1e-300, 20.0, 20.000000000000004,
                -38.5, 38.5, 6.0, -6.0, 2.0**-60, -(2.0**-61), 1e5, 1e308, -1.8961503816218355e154],
}  # fmt: skip


@pytest.mark.parametrize("op,kw,span", CASES, ids=IDS)
@pytest.mark.parametrize("fmt", ["float32", "float64"])
def test_hard_cases(op, kw, span, fmt):
    """Thresholds of overflow and underflow, the smallest subnormal, 1 +- ulp, a square that is a tie
    (4097**2 = 2**24 + 8193, 94906267**2 in float64), sin/cos of 1e22 and of the float64 closest to a
    multiple of pi/2 (Muller, Elementary Functions, 6381956970095103 * 2**797)."""
    _check(op, kw, HARD[fmt], fmt)


def test_erf_float64_tier_decides_and_is_the_truth():
    """erf's float64 tier (_ew_f64.f_erf) decides nearly every float32 element, at its edges too (4.5, where
    erf is 1 within 2**-32; the smallest subnormal), and the reference it gives is the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.standard_normal(2000) * 2, rng.uniform(-4.6, 4.6, 2000), [4.5, -4.5, 4.4999995,
                         3.92, 2.0**-149, -(2.0**-126), 1e-30]]).astype(np.float32)  # fmt: skip
    decided = [_ew_f64.f_erf(float(v), 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.999 and all(decided[-7:])
    _check("erf", {}, xs.astype(np.float64).tolist(), "float32")


def test_gelu_float64_tier_decides_and_is_the_truth():
    """gelu's float64 tier (_ew_f64.f_gelu: the series, and Laplace's continued fraction below -3, where 1 + erf
    cancels) decides nearly every float32 element, at its edges too, and the reference is the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(6)
    xs = np.concatenate([rng.standard_normal(2000) * 3, rng.uniform(-20, 8, 2000), [-3.0, -3.0000002, 6.4, 6.3999996,
                         -6.4, -14.0, -59.9, -(2.0**-126), 2.0**-149]]).astype(np.float32)  # fmt: skip
    decided = [_ew_f64.f_gelu(float(v), 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.999 and all(decided[-9:-1])
    assert not decided[-1]  # 2**-150 (1 + erf(2**-149.5)): above the midpoint by 2**-299, the exact path's to say
    _check("gelu", {}, xs.astype(np.float64).tolist(), "float32")


def test_gelu_tanh_float64_tier_decides_and_is_the_truth():
    """The tanh form's float64 tier (_ew_f64.f_gelu_tanh: x sigmoid(w), w's own rounding charged through sigmoid's
    sensitivity) decides nearly every float32 element, past w = 700 too, and the reference is the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(8)
    xs = np.concatenate([rng.standard_normal(2000) * 3, rng.uniform(-20, 20, 2000), [-3.0, 400.0, 420.0, -(2.0**-126),
                         2.0**20, -20.0]]).astype(np.float32)  # fmt: skip
    decided = [_ew_f64.f_gelu_tanh(float(v), 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.995 and all(decided[-6:])
    _check("gelu", {"approximate": "tanh"}, xs.astype(np.float64).tolist(), "float32")


@pytest.mark.parametrize("op", ["exp2", "log2"])
def test_exp2_log2_float64_tiers_decide_and_are_the_truth(op):
    """exp2's and log2's float64 tiers (_ew_f64: 2**n e**(f ln 2); log x / ln 2) decide nearly every float32
    element, subnormal results, overflow and exact powers of two included, and the reference is the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(9)
    if op == "exp2":
        edge = [-149.0, -149.5, -126.0, 127.0, 128.0, 0.5, -0.5, 3.0]
        left = [-150.0]  # 2**-150: the tie between 0 and 2**-149, the exact path's (to even: 0)
        xs = np.concatenate([rng.standard_normal(2000) * 20, rng.uniform(-160, 130, 2000), edge])
    else:
        edge = [1.0, 2.0, 0.5, 2.0**-149, 2.0**-126, 3.4e38, 1.0000001, 3.0]
        left = [0.99999994]  # log2(1 - 2**-24): log S - ln 2 cancels (S = 2 - 2**-23), left to the next tier
        xs = np.concatenate([np.exp2(rng.uniform(-149, 128, 2000)), rng.uniform(0.5, 2, 2000), edge])
    xs = xs.astype(np.float32)
    decided = [getattr(_ew_f64, "f_" + op)(float(v), 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.999 and all(decided[-len(edge):])
    _check(op, {}, np.concatenate([xs, np.float32(left)]).astype(np.float64).tolist(), "float32")


@pytest.mark.parametrize("op", ["expm1", "log1p", "softplus"])
def test_expm1_log1p_softplus_float64_tiers_are_the_truth(op):
    """expm1's, log1p's and softplus's float64 tiers (_ew_f64: Horner below 0.35 and e**x - 1 above; log_fast of
    x, or of the exact 1 + x; log1p(e**-|x|) through log_fast with exp_fast's error) decide float32 elements and
    give the truth's reference, at their edges too (0.35, overflow, -1/32, the threshold, -700)."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(11)
    if op == "expm1":
        edge = [0.35, -0.35, 0.3500001, 88.72, 88.73, -20.0, 1e-30, 2.0**-149]
        xs = np.concatenate([rng.standard_normal(1500) * 3, rng.uniform(-0.4, 0.4, 1500), rng.uniform(-110, 90, 500)])
    elif op == "log1p":
        edge = [-0.03125, -0.999999, 3.4e38, 2.0**-60, 3.0]
        xs = np.concatenate([np.abs(rng.standard_normal(1500)) * 3, rng.uniform(-1, -0.04, 1500),
                             np.exp2(rng.uniform(-60, 128, 500))])  # fmt: skip
    else:
        edge = [20.0, 20.000002, 19.999998, -700.0, -103.0, -88.0, 0.5]
        xs = np.concatenate([rng.standard_normal(1500) * 5, rng.uniform(-120, 30, 2000)])
    xs = np.concatenate([xs, edge]).astype(np.float32)
    params = (1.0, 20.0) if op == "softplus" else ()
    decided = [getattr(_ew_f64, "f_" + op)(float(v), *params, 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.999 and all(decided[-len(edge):])
    _check(op, {}, xs.astype(np.float64).tolist(), "float32")


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_cody_waite_near_multiples_of_half_pi_is_the_truth(op):
    """Below 2**20 the float64 tier reduces by Cody and Waite (_ew_f64._cody_waite, pi/2 in three parts): at the
    float32 values nearest k pi/2 (and their neighbours), where the reduced argument is smallest and the
    reduction's error matters most, the reference is the truth's."""
    rng = np.random.default_rng(13)
    k = np.concatenate([np.arange(1, 200), rng.integers(200, 667_000, 600)])
    near = (k * (math.pi / 2)).astype(np.float32)
    xs = np.concatenate([near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(0))])
    _check(op, {}, xs.astype(np.float64).tolist(), "float32")


def test_rsqrt_float64_tier_is_the_truth():
    """rsqrt's float64 tier (_ew_f64.f_rsqrt: 1 / sqrt(x), two correct roundings) over the whole positive float32
    range, subnormals and exact results (rsqrt(4) = 1/2) included, gives the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(15)
    xs = np.concatenate([np.exp2(rng.uniform(-149, 128, 3000)), [4.0, 0.25, 1e-45, 3.4e38]]).astype(np.float32)
    decided = [_ew_f64.f_rsqrt(float(v), 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.999 and all(decided[-4:])
    _check("rsqrt", {}, xs.astype(np.float64).tolist(), "float32")


@pytest.mark.parametrize("y", [2.5, -3.0, 1.0 / 3.0, 7.25])
def test_pow_float64_tier_is_the_truth(y):
    """pow's float64 tier (_ew_f64.f_pow: e**(y log x), the exponent's absolute error carried) decides float32
    elements over the whole positive range, exact results included (4**2.5 = 32), and gives the truth's."""
    from refkern.kernels import _ew_f64

    rng = np.random.default_rng(14)
    xs = np.concatenate([np.abs(rng.standard_normal(1500)) * 3, np.exp2(rng.uniform(-40, 40, 1500)),
                         [4.0, 9.0, 0.25, 1.0, 2.0, 1e-45, 3.4e38]]).astype(np.float32)  # fmt: skip
    decided = [_ew_f64.f_pow(float(v), y, 24, -126, 127)[1] for v in xs]
    assert np.mean(decided) > 0.99 and decided[-7]  # 4: 32 for y = 2.5, exact and decided
    _check("pow", {"exponent": y}, xs.astype(np.float64).tolist(), "float32")


def test_large_arguments_of_sin_and_cos_are_reduced_exactly():
    """cos(1e5) in float32 (rotary angles): the float32 value 1e5 = 100000 exactly."""
    assert float(refkern.cos(np.float32([1e5]))[0]) == pytest.approx(float(np.float32(math.cos(1e5))), abs=0)
    assert float(refkern.sin(np.array([1e22]))[0]) == pytest.approx(-0.8522008497671888, abs=0)  # Muller's table
    assert float(refkern.cos(np.array([1e22]))[0]) == pytest.approx(0.523214785395139, abs=0)  # 0.52321478539513894549...


def test_ties_round_to_even():
    """4097**2 = 16785409 lies halfway between the float32 neighbours 16785408 and 16785410: to even."""
    assert float(refkern.pow(np.float32([4097.0]), 2)[0]) == 16785408.0
    assert float(refkern.pow(np.float32([4099.0]), 2)[0]) == 16801800.0  # 16801801 = 2**24 + 24585: to even


def test_special_values_follow_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = torch.tensor([-math.inf, math.inf, math.nan, -0.0, 0.0, -1.0], dtype=torch.float64)
    pairs = [(refkern.exp, torch.exp), (refkern.log, torch.log), (refkern.log1p, torch.log1p),
             (refkern.rsqrt, torch.rsqrt), (refkern.tanh, torch.tanh), (refkern.sigmoid, torch.sigmoid),
             (refkern.silu, F.silu), (refkern.gelu, F.gelu), (refkern.erf, torch.erf), (refkern.sin, torch.sin),
             (refkern.expm1, torch.expm1), (refkern.log2, torch.log2), (refkern.softplus, F.softplus)]  # fmt: skip
    def special(v):
        return not math.isfinite(v) or v == 0

    for ours, theirs in pairs:  # where torch's result is special (-1.0: out of log's and rsqrt's domain)
        a, b = ours(x), theirs(x)
        assert all(same(float(p), float(q)) for p, q in zip(a, b) if special(float(q))), (ours.__name__, a, b)
    for y in (0.0, 0.5, -0.5, 2.0, 3.0, -1.0, -2.0, math.inf, -math.inf, 2.5):
        a, b = refkern.pow(x, y), torch.pow(x, y)
        assert all(same(float(p), float(q)) for p, q in zip(a, b) if special(float(q))), (y, a, b)


def test_results_keep_the_kind_and_dtype():
    torch = pytest.importorskip("torch")
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        y = refkern.exp(torch.ones(3, 2, dtype=dt))
        assert isinstance(y, torch.Tensor) and y.dtype == dt and y.shape == (3, 2)
    assert refkern.exp(np.ones(4, np.float32)).dtype == np.float32


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^gelu: unknown approximate='erf'; choose one of 'none', 'tanh'"):
        refkern.gelu(np.ones(2, np.float32), approximate="erf")
    with pytest.raises(TypeError, match=r"^softplus: beta must be a real number; got beta='2'"):
        refkern.softplus(np.ones(2, np.float32), beta="2")
    with pytest.raises(TypeError, match=r"^exp: expected floating-point inputs"):
        refkern.exp(np.ones(2, np.int64))


@example(x=2.0**-1074)
@given(st.floats(-50, 50, allow_nan=False) | st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=40, deadline=None)
def test_values_hold_the_exact_value(x):
    """The yardstick's exact values (hi + lo) are within 2**-95 of the truth (relative), where defined."""
    import mpmath

    from refkern.accumulate.formats import FLOAT64
    from refkern.kernels.elementwise import values

    for fn, f in (("exp", mpmath.exp), ("tanh", mpmath.tanh), ("sin", mpmath.sin)):
        hi, lo = values(fn, np.array([x]), FLOAT64)
        with mpmath.workprec(400):
            t = f(mpmath.mpf(x))
            if math.isnan(hi[0]) or not math.isfinite(float(t)) or t == 0 or abs(t) < mpmath.mpf(2) ** -900:
                continue
            assert abs((mpmath.mpf(hi[0]) + mpmath.mpf(lo[0])) - t) <= abs(t) * mpmath.mpf(2) ** -95, (fn, x)
