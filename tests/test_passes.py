"""The one-pass summaries of refkern.analysis.passes against plain numpy / Python on the same values:
exact medians (odd and even counts, bins straddled, specials), top-k order and ties, and the
largest error in ulps, on arrays long enough to be cut into several chunks."""

import math

import numpy as np
import pytest

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from refkern.analysis import passes
from refkern.analysis.ulp import max_ulp_error, ulp_error


def _ulps_at(y, b, fmt):
    """The definition, element by element: b / 2^(max(floor(log2|y|), emin) - prec + 1), with
    floor(log2|y|) taken as -1 at 0 and at specials, inf where b is not finite."""
    if not b < math.inf:
        return math.inf
    e = math.frexp(y)[1] - 1 if math.isfinite(y) and y != 0 else -1
    return b / math.ldexp(1.0, max(e, fmt.emin) - fmt.prec + 1)


def _values(rng, n, fmt):
    kind = rng.integers(0, 6, n)
    y = rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))
    y[kind == 0] = 0.0
    y[kind == 1] = np.exp2(fmt.emin - 3.0) * rng.random((kind == 1).sum())  # below the format's normal range
    y[rng.random(n) < 0.01] = np.inf
    y[rng.random(n) < 0.01] = np.nan
    b = np.abs(y) * 2.0**-fmt.prec * rng.random(n) * 50
    b[kind == 2] = 0.0
    b[rng.random(n) < 0.02] = np.inf
    b[rng.random(n) < 0.01] = 5e-324  # a subnormal bound
    b[rng.random(n) < 0.01] = 1e300  # in ulps beyond float64: inf
    return y, b


@pytest.mark.parametrize("fmt", [FLOAT16, BFLOAT16, FLOAT32, FLOAT64], ids=lambda f: f.name)
@pytest.mark.parametrize("n", [1, 2, 7, 40_000, 40_001])
def test_median_and_max_of_bound_in_ulps_are_exact(fmt, n):
    rng = np.random.default_rng(n + fmt.prec)
    y, b = _values(rng, n, fmt)
    want = np.array([_ulps_at(float(p), float(q), fmt) for p, q in zip(y, b)])
    med, top = passes.median_max_bound_ulps(y, b, fmt.prec, fmt.emin)
    assert med == np.median(want) or (np.isnan(med) and np.isnan(np.median(want)))
    assert top == want.max()


def test_median_between_two_bins_and_of_constant_values():
    # the two middle values of an even count in different bins (one octave apart): their mean
    y = np.ones(40_000)
    b = np.where(np.arange(40_000) < 20_000, 2.0**-30, 2.0**-29)
    med, top = passes.median_max_bound_ulps(y, b, 24, -126)
    assert (med, top) == ((2.0**-7 + 2.0**-6) / 2, 2.0**-6)  # ulp(1) in float32 is 2^-23
    med, top = passes.median_max_bound_ulps(np.ones(50_001), np.full(50_001, 3.0 * 2.0**-23), 24, -126)
    assert (med, top) == (3.0, 3.0)
    assert passes.median_max_bound_ulps(np.empty(0), np.empty(0), 24, -126) == (0.0, 0.0)


@pytest.mark.parametrize("n", [5, 70_000])
def test_top_k_matches_a_sort_with_ties_in_index_order(n):
    rng = np.random.default_rng(n)
    key = rng.integers(0, 50, n).astype(np.float64)  # many ties
    key[rng.random(n) < 0.001] = np.nan  # NaN counts as inf
    eligible = rng.random(n) < 0.7
    got = passes.top_k(eligible, key, 10)
    k = np.where(np.isnan(key), np.inf, key)
    idx = np.flatnonzero(eligible)
    want = idx[np.lexsort((idx, -k[idx]))][:10]
    np.testing.assert_array_equal(got, want)
    assert passes.top_k(np.zeros(n, bool), key, 10).size == 0


@pytest.mark.parametrize("fmt", [FLOAT16, BFLOAT16, FLOAT32, FLOAT64], ids=lambda f: f.name)
def test_max_ulp_error_over_chunks(fmt):
    rng = np.random.default_rng(fmt.prec)
    n = 50_000
    ref, _ = _values(rng, n, fmt)
    with np.errstate(invalid="ignore"):
        act = ref + rng.standard_normal(n) * np.abs(ref) * 2.0**-fmt.prec * 3
    act[rng.random(n) < 0.05] = 0.0
    want = max(abs(ulp_error(p, q, fmt)) for p, q in zip(act, ref))
    assert max_ulp_error(act, ref, fmt) == want
    ok = ~np.isnan(ref) & np.isfinite(ref)
    assert max_ulp_error(act[ok], ref[ok], fmt) == max(abs(ulp_error(p, q, fmt)) for p, q in zip(act[ok], ref[ok]))


def test_chunks_cut_long_arrays_only():
    assert passes.chunks(10) == 1
    assert passes.chunks(2**14 - 1) == 1
    assert passes.chunks(2**40) >= 4  # 4 per thread


def _fit_case(rng, n, fmt, constant_bound=False):
    ref, b = _values(rng, n, fmt)
    ref = np.where(np.isnan(ref), np.nan, ref)
    act = ref.copy()
    moved = rng.random(n) < 0.4
    with np.errstate(invalid="ignore"):
        act[moved] = ref[moved] + rng.standard_normal(moved.sum()) * np.abs(ref[moved]) * 2.0**-fmt.prec * 4
    act[rng.random(n) < 0.005] = np.nan
    act[rng.random(n) < 0.005] = -np.inf
    if constant_bound:
        ref, b = np.ones(n), np.full(n, 2.0**-20)
        act = ref + np.where(rng.random(n) < 0.5, 2.0**-21, 0.0)
    return act, ref, b


@pytest.mark.parametrize("fmt", [BFLOAT16, FLOAT32, FLOAT64], ids=lambda f: f.name)
@pytest.mark.parametrize("constant_bound", [False, True], ids=["varied", "ties"])
def test_envelope_pass_summaries_match_their_definitions(fmt, constant_bound):
    """The fit of the rounding envelope, in one pass, against numpy on the same arrays: the ratio and
    state of every element, their counts, the ten worst, the largest ratio, the median and largest
    bound in ulps (ties overflow the sampled bracket: the two-pass fallback) and the largest error."""
    from refkern.analysis.verdict_envelope import _envelope_fits

    rng = np.random.default_rng(7 + fmt.prec)
    n = 50_001
    act, ref, b = _fit_case(rng, n, fmt, constant_bound)
    (f,) = _envelope_fits(act, fmt, [("rounding", None, ref, b)], ulps=True)
    with np.errstate(all="ignore"):
        same = (act == ref) | (np.isnan(act) & np.isnan(ref))
        r = np.abs(act - ref) / b
        r = np.where(np.isnan(r), np.inf, r)
        r = np.where(same, 0.0, r)
    state = np.where(same, 0, np.where(r > 1.0, 3, np.where(b < np.inf, 1, 2)))
    np.testing.assert_array_equal(f.state, state)
    np.testing.assert_array_equal(f.ratio, r)
    assert f.counts == tuple(int((state == k).sum()) for k in range(4))
    assert f.blind == int((~(b < np.inf) & np.isfinite(ref)).sum())  # an inf or NaN centre is no blind spot
    idx = np.flatnonzero(~same)
    np.testing.assert_array_equal(f.top, idx[np.lexsort((idx, -r[idx]))][:10])
    assert f.max_ratio == r.max()
    want = np.array([_ulps_at(float(p), float(q), fmt) for p, q in zip(ref, b)])
    assert (f.median_ulps, f.max_ulps) == (np.median(want), want.max())
    assert f.max_error_ulps == max_ulp_error(act, ref, fmt)


def test_compare_counts_from_the_pass_are_the_classes_counts():
    """compare reads its element counts off the rounding pass; they are the counts of decide_envelope's
    classes for every verdict (exact, rounding, reduced precision, mismatch)."""
    import torch

    import refkern as rk
    from refkern.analysis.compare import _actual, _reference_as
    from refkern.analysis.envelope import envelopes
    from refkern.analysis.report import VERDICTS
    from refkern.analysis.verdict_envelope import decide_envelope

    torch.manual_seed(1)
    x, w, b = torch.randn(20, 50), torch.randn(50), torch.randn(50)
    y = torch.nn.functional.layer_norm(x, (50,), w, b)
    bug = y.clone()
    bug[3, 4] += 0.1
    bf16 = torch.nn.functional.layer_norm(*(t.bfloat16().float() for t in (x,)), (50,), w.bfloat16().float(),
                                          b.bfloat16().float())  # fmt: skip
    seen = set()
    for out in (y, rk.layer_norm(x, (50,), w, b), bug, bf16):
        rep = rk.compare(out, "layer_norm", x, (50,), w, b)
        act, fmt, _ = _actual(out)
        ref, bound = _reference_as("layer_norm", (x, (50,), w, b), {}, fmt)
        d = decide_envelope(act, ref, envelopes("layer_norm", bound, ref, fmt, lazy=True)[0], fmt)
        assert rep.counts == {v: int(np.count_nonzero(d.classes == i)) for i, v in enumerate(VERDICTS)}
        seen.add(rep.verdict)
    assert seen == set(VERDICTS)


def test_ulps_at_is_the_exact_quotient_at_every_ulp_exponent():
    """ulps_at (two products by powers of two built from bits) against Python's exact quotient
    ``v / 2^k``, rounded once, at every ulp exponent of float64 and float32 results: k from the
    smallest subnormal's (-1074, the bound's quotient past 2^1022) to the largest, with bounds that
    overflow in ulps, subnormal bounds, 0, NaN and the error at y = 0 and at specials."""
    rng = np.random.default_rng(3)
    for fmt in (FLOAT64, FLOAT32):
        for e in range(fmt.emin - 3, 1024 - (fmt.prec != 53) * 896):
            y = math.ldexp(1.0 + rng.random(), e) * (-1) ** e
            for b in (0.0, 5e-324, math.ldexp(rng.random(), e - 40), 1e300, math.inf, math.nan):
                for x in (y, y + abs(y) * 2.0**-40, math.inf):
                    v, d = passes.ulps_at(x, y, b, x == y, fmt.prec, fmt.emin)
                    assert v == (math.inf if not b < math.inf else _ulps_at(y, b, fmt)), (fmt.name, e, b)
                    want = 0.0 if x == y else math.inf if math.isinf(x) else ulp_error(x, y, fmt)
                    assert d == want, (fmt.name, e, x)
    for y, same in ((0.0, True), (math.nan, True), (math.inf, False)):  # at 0: the bound in [1/2, 1)'s ulp,
        v, d = passes.ulps_at(1e-320 if y == 0 else 0.0, y, 2.0**-60, same, FLOAT32.prec, FLOAT32.emin)
        assert v == 2.0**-60 / 2.0**-24  # the error in the smallest subnormal's (ulp.py's rule)
        assert d == (1e-320 / 2.0**-149 if y == 0 else 0.0 if same else math.inf)


@pytest.mark.parametrize("fmt", [BFLOAT16, FLOAT32], ids=lambda f: f.name)
def test_envelope_pass_reads_float32_as_float64(fmt):
    """compare hands the pass an fp16/bf16/fp32 result and its reference as float32 (no float64
    copies): every figure of the fit is the one of the same values widened to float64 first."""
    from refkern.analysis.verdict_envelope import _envelope_fits

    rng = np.random.default_rng(11)
    act, ref, b = _fit_case(rng, 50_001, fmt)
    act32, ref32 = act.astype(np.float32), ref.astype(np.float32)
    (f32,) = _envelope_fits(act32, fmt, [("rounding", None, ref32, b)], ulps=True)
    (f64,) = _envelope_fits(act32.astype(np.float64), fmt, [("rounding", None, ref32.astype(np.float64), b)], ulps=True)
    np.testing.assert_array_equal(f32.state, f64.state)
    np.testing.assert_array_equal(f32.ratio, f64.ratio)
    for k in ("counts", "blind", "max_ratio", "median_ulps", "max_ulps", "max_error_ulps"):
        assert getattr(f32, k) == getattr(f64, k), k
    np.testing.assert_array_equal(f32.top, f64.top)
    np.testing.assert_array_equal(f32.ratio_at(f32.top), f64.ratio_at(f64.top))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_compare_on_held_float32_is_elements_report(dtype):
    """compare() keeps a norm's output and reference in float32, elements() widens both to float64
    first: the two Reports agree on every figure, for a correct output and a bug."""
    import torch

    import refkern as rk

    torch.manual_seed(2)
    dt = getattr(torch, dtype)
    x, w, b = (torch.randn(*s).to(dt) for s in ((6, 40, 64), (64,), (64,)))
    y = torch.nn.functional.layer_norm(x, (64,), w, b)
    bug = y.clone()
    bug[1, 2, 3] += 0.25
    for out in (y, bug):
        a, e = (
            rk.compare(out, "layer_norm", x, (64,), w, b),
            rk.analysis.compare.elements(out, "layer_norm", x, (64,), w, b)["report"],
        )
        for k in ("verdict", "precision", "counts", "max_ulp", "max_bound_ratio", "worst", "detectable", "notes"):
            assert getattr(a, k) == getattr(e, k), (dtype, k)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 16_384, 16_385, 100_000, 100_001])
def test_median_is_numpys(n):
    """passes.median against np.median: odd and even counts, heavy ties, infinities, a NaN anywhere, and
    data whose sampled bracket misses (the fallback)."""
    rng = np.random.default_rng(n)
    cases = [rng.standard_normal(n), np.round(rng.standard_normal(n)), rng.lognormal(0, 5, n)]
    if n:
        with_inf = rng.standard_normal(n)
        with_inf[rng.random(n) < 0.3] = np.inf
        with_nan = rng.standard_normal(n)
        with_nan[rng.integers(n)] = np.nan
        skewed = np.sort(rng.standard_normal(n))  # the sample's bracket holds the middle: structured data too
        cases += [with_inf, with_nan, skewed, np.concatenate([np.zeros(n // 2), np.ones(n - n // 2)])]
    for v in cases:
        got, want = passes.median(v), float(np.median(v)) if n else float("nan")
        assert got == want or (math.isnan(got) and math.isnan(want)), (n, got, want)
