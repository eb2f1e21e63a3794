"""Bounds, thresholds, scales and reported figures of the verdict's analysis pinned by hand.

Every expected value is a literal or the docstring's formula written out in plain Python (never a
value the code under test produced), tight enough that a bound or threshold loosened 2x, an ulp
count doubled or a ratio halved fails here. Covers refkern/analysis/: bounds (the slack and the
underflow term of B, every candidate precision's two ratios), ulp, stats (the normal tail of the
Mann-Whitney test), hypotheses (the subnormal floors of the scales, the gamma cap, the per-tap and
epilogue models), verdict (the element threshold and the fit band on a public compare, the
alphas of the noise-size and dominance tests, the dominance factor sqrt 2, the envelope threshold 1),
structure (the group z, the detectable sizes, the signatures' tolerances), evaluate (n_terms),
compare (every Report figure of a float64 dot: ulps, bound and noise ratios, test ratios, scores,
condition numbers, tolerance counts, the "within the worst-case bound" note), report (the 64-ulp
note), passes (ulps at 0) and explain (the sum of two bounds)."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT16, FLOAT32, FLOAT64
from refkern.analysis import bounds, structure, verdict, verdict_envelope
from refkern.analysis.evaluate import problem
from refkern.analysis.hypotheses import (
    _gamma,
    _order_variance,
    _tapped,
    centre,
    centre_sample,
    models,
    rounding_variance,
)
from refkern.analysis.report import Report
from refkern.analysis.stats import smaller_pvalue
from refkern.analysis.ulp import max_ulp_error, ulp, ulp_error, ulp_errors

U64, U32, U16 = 2.0**-53, 2.0**-24, 2.0**-11
ETA16, ETA32 = 2.0 ** (-14 - 11), 2.0 ** (-126 - 24)  # 2**(emin - prec): a rounding's error floor, subnormal range
LAM1 = 5.586997409555929  # level(1) = sqrt(2 ln(2 * 1 / (1e-6 / 3))) = sqrt(2 ln 6e6)


def approx(want, rel=1e-12):
    """pytest.approx relative only: its default abs=1e-12 would pass any value below 1e-12 (a variance of 1e-14,
    a detectable size of 1e-15) and loosen every pin of a value below 1e-4."""
    return pytest.approx(want, rel=rel, abs=0)


def gamma(n, u):
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def level(m):
    """stats.level's docstring: 2 m exp(-lam**2 / 2) = ALPHA / PARTS = 1e-6 / 3."""
    return math.sqrt(2 * math.log(2 * max(m, 1) / (1e-6 / 3)))


# the candidates of bounds.precision_ratios: (input unit u_i, accumulation unit u_a); TF32 and bf16 inputs may
# be truncated, which doubles their unit (2**-11 for tf32's 11 bits, 2**-8 for bf16's 8)
CAND = {"fp64": (0.0, U64), "fp32": (0.0, U32), "tf32": (2 * 2.0**-11, U32), "fp16": (2.0**-11, U32),
        "bf16": (2 * 2.0**-8, U32)}  # fmt: skip


def ratios_by_hand(err, n, mag, ref, u_o):
    """bounds.precision_ratios' docstring: worst case (2 u_i + u_i^2) M + (1 + u_o) gamma_n(u_a) (1 + u_i)^2 M
    + 2 u_o |ref|; probabilistic sqrt(n) u_a M + 2 u_i M / sqrt(n) + 2 u_o |ref|; M widened by the float64 sum's
    slack 1 + (n + 1) 2**-52."""
    slack = 1 + (n + 1) * 2.0**-52
    out = {}
    for k, (ui, ua) in CAND.items():
        wc = ((2 * ui + ui * ui) + (1 + u_o) * gamma(n, ua) * (1 + ui) ** 2) * slack * mag + 2 * u_o * abs(ref)
        pr = (math.sqrt(n) * ua + 2 * ui / math.sqrt(n)) * slack * mag + 2 * u_o * abs(ref)
        out[k] = {"worst_case": err / wc, "probabilistic": err / pr}
    return out


def bound_by_hand(m, ref, n, u_a, u_o):
    """B = (1 + u_o) gamma_n(u_a) M (1 + (n + 1) 2**-52) + 2 u_o |ref| + n 2**-1074 (bounds.bound)."""
    return (1 + u_o) * gamma(n, u_a) * m * (1 + (n + 1) * 2.0**-52) + 2 * u_o * abs(ref) + n * 2.0**-1074


# ------------------------------------------------------------------------------------- bounds


def test_bound_underflow_and_slack_terms():
    # M = ref = 0 leaves the underflow term n 2**-1074 alone: 10 smallest subnormals, exactly
    assert float(bounds.bound(0.0, 0.0, 10, U32, U32)) == 10 * 2.0**-1074
    # n = 2**30 in float64: gamma_n ~ 2**-23 and the slack (n + 1) 2**-52 ~ 2**-22 of M are both visible
    n = 2**30
    assert float(bounds.bound(1.0, 0.5, n, U64, U64)) == approx(bound_by_hand(1.0, 0.5, n, U64, U64),
                                                                        rel=1e-12)  # fmt: skip
    assert float(bounds.bound(1.0, 0.5, n, U64, U64)) == approx(1.192093322943728e-07, rel=1e-12)


def test_every_candidate_ratio_by_hand():
    # n = 10, M = 4, ref = 2, error 3e-6, a float32 result: all five candidates, both ratios
    got = bounds.precision_ratios(np.array([3e-6]), 10, np.array([4.0]), np.array([2.0]), FLOAT32)
    want = ratios_by_hand(3e-6, 10, 4.0, 2.0, U32)
    for k in CAND:
        for kind in ("worst_case", "probabilistic"):
            assert got[k][kind] == approx(want[k][kind], rel=1e-12), (k, kind)
    assert got["fp16"]["worst_case"] == approx(0.0007672970607963608, rel=1e-9)
    assert got["fp64"]["probabilistic"] == approx(12.582911925884117, rel=1e-9)
    # n = 2**30, a float64 result: the fp32 family's gamma_n is infinite (n u >= 1: ratio 0); fp64's worst case
    # shows the slack (n + 1) 2**-52 of M
    got = bounds.precision_ratios(np.array([1e-3]), 2**30, np.array([1e3]), np.array([1.0]), FLOAT64)
    want = ratios_by_hand(1e-3, 2**30, 1e3, 1.0, U64)
    for k in CAND:
        for kind in ("worst_case", "probabilistic"):
            assert got[k][kind] == approx(want[k][kind], rel=1e-12), (k, kind)
    assert got["fp32"]["worst_case"] == 0.0 and got["fp64"]["worst_case"] == approx(8.38860499998509,
                                                                                             rel=1e-9)  # fmt: skip


# ---------------------------------------------------------------------------------------- ulp


def test_ulp_by_hand():
    assert ulp(1.0, FLOAT32) == 2.0**-23 and ulp(1.75, FLOAT32) == 2.0**-23  # 2**(0 - 24 + 1)
    assert ulp(3.0, FLOAT16) == 2.0**-9  # 3 in [2, 4): 2**(1 - 11 + 1)
    assert ulp(1.0, FLOAT64) == 2.0**-52
    assert ulp(0.0, FLOAT32) == 2.0**-149 and ulp(2.0**-130, FLOAT32) == 2.0**-149  # subnormals: emin's spacing
    assert ulp_error(1 + 3 * 2.0**-23, 1.0, FLOAT32) == 3.0
    assert ulp_error(1.0, 1 + 2.0**-23, FLOAT32) == -1.0
    assert ulp_errors(np.array([1 + 3 * 2.0**-23, 5 * 2.0**-149]), np.array([1.0, 0.0]), FLOAT32).tolist() == [3.0, 5.0]
    act, ref = np.array([1 + 3 * 2.0**-23, 5 * 2.0**-149, 6.0]), np.array([1.0, 0.0, 6.0])
    assert max_ulp_error(act, ref, FLOAT32) == 5.0  # at 0: the smallest subnormal's ulp


# -------------------------------------------------------------------------------------- stats


def test_mann_whitney_normal_tail_by_hand():
    # 65 * 65 = 4225 pairs > 4096: the normal approximation. U = #(x_i >= y_j) = sum_{i=8}^{64} (i - 7) = 1653;
    # z = (U + 1/2 - mn/2) / sqrt(mn (m + n + 1) / 12); p = Phi(z)
    x = np.arange(65.0)
    y = x + 8
    assert sum(1 for a in x for b in y if a >= b) == 1653
    z = (1653 + 0.5 - 65 * 65 / 2) / math.sqrt(65 * 65 * 131 / 12)
    assert smaller_pvalue(x, y) == approx(0.5 * math.erfc(-z / math.sqrt(2)), rel=1e-12)
    assert smaller_pvalue(x, y) == approx(0.016289035980633044, rel=1e-9)


# --------------------------------------------------------------------------------- hypotheses


def test_subnormal_floors_of_the_scales():
    # rounding_variance at M = c = 0: only 2 eta_s**2 + (n + 1) eta_a**2 remains (hypotheses' docstring)
    r32 = models(FLOAT32, 24, True)[0]  # fp32 accumulation and storage
    assert float(rounding_variance(r32, 10, np.array(0.0), np.array(0.0))) == 2 * ETA32**2 + 11 * ETA32**2
    r16 = models(FLOAT16, 24, True)[0]  # fp32 accumulation, fp16 storage
    assert float(rounding_variance(r16, 10, np.array(0.0), np.array(0.0))) == approx(2 * ETA16**2, rel=1e-12)
    # the epilogue model adds 2 (u_s p)**2 + 2 eta_s**2 for the rounding of the product sum
    epi = next(m for m in models(FLOAT16, 24, True) if m.epilogue)
    v = float(rounding_variance(epi, 10, np.array(0.0), np.array(0.0), np.array(0.0)))
    assert v == approx(4 * ETA16**2, rel=1e-12)
    # accumulator models: 2 eta_s**2 + 2 (n + 1) eta_a**2, fp16 accumulation stored in fp16: 24 eta16**2
    acc = next(m for m in models(FLOAT32, 24, False) if m.key == "fp16 accumulation (left-to-right)")
    assert float(_order_variance(acc, 10, np.array(0.0), np.array(0.0))) == 24 * ETA16**2


def test_gamma_of_the_scales_and_its_cap():
    assert _gamma(10, U16) == 10 * U16 / (1 - 10 * U16)
    assert _gamma(1023, U16) == 1023 / 1025  # n u = 1023/2048 < 1/2
    assert _gamma(1024, U16) == 1.0  # n u >= 1/2: capped at 1


def test_per_tap_model_by_hand():
    # torch's CPU col2im model: per tap t, p_t = fl16(sum over channels), s_t = fl16(s_{t-1} + p_t), c = fl16(s + b).
    # One channel, two taps: products 0.5 and 0.25, bias 0.125. s = 0.5, 0.75; c = 0.875; M = 0.875.
    # var = sigma_0**2 (n = 3) + 2 u16**2 sum_t (p_t**2 + s_t**2) = ... + 2 u16**2 (0.25 + 0.25 + 0.0625 + 0.5625)
    m = next(m for m in models(FLOAT16, 24, True, "conv_transpose2d") if m.taps)
    terms = (np.array([[1.0, 1.0]]), np.array([[0.5, 0.25]]), np.array([0.125]), True)
    c, var = _tapped(terms, 2, m, 3)
    assert c.tolist() == [0.875]
    ua = U32 * (1 + gamma(3, U32))
    want = ua**2 * 4 * 0.875**2 + 2 * (U16 * 0.875) ** 2 + 2 * ETA16**2 + 4 * ETA32**2 + 2 * U16**2 * 1.125
    assert float(var[0]) == approx(want, rel=1e-12)


def test_epilogue_model_counts_the_bias_in_m_once():
    # fp16 linear x = [[1, 1]], w = [[1, 1]], b = [0.5]: product p = 2, c = fl16(2.5) = 2.5, M = 2 + 0.5;
    # var = ((1 + g_3) u32)**2 4 M**2 + 2 (u16 c)**2 + 2 eta16**2 + 4 eta32**2 + 2 (u16 p)**2 + 2 eta16**2
    one = np.ones((1, 2), np.float16)
    pr = problem("linear", (one, one, np.array([0.5], np.float16)), {}, out=FLOAT16)
    epi = next(m for m in models(FLOAT16, pr.in_prec, True, "linear") if m.epilogue)
    ua = U32 * (1 + gamma(3, U32))
    want = ua**2 * 4 * 2.5**2 + 2 * (U16 * 2.5) ** 2 + 4 * ETA16**2 + 4 * ETA32**2 + 2 * (U16 * 2) ** 2
    c, var = centre(pr, epi)
    assert c.tolist() == [[2.5]] and float(var[0, 0]) == approx(want, rel=1e-13)
    c, var = centre_sample(pr.terms(np.array([0])), pr, epi)
    assert c.tolist() == [2.5] and float(var[0]) == approx(want, rel=1e-13)


# ---------------------------------------------------- verdict and Report figures, float64 dot


def _dot_sigma0():
    """dot([1, 1], [1, 1]) = 2 in float64: n = 2, M = c = 2, u = 2**-53 (eta64**2 underflows to 0):
    sigma_0**2 = ((1 + gamma_2) u)**2 3 M**2 + 2 (u c)**2, about 20 u**2."""
    return math.sqrt(((1 + gamma(2, U64)) * U64) ** 2 * 3 * 4 + 2 * (U64 * 2) ** 2)


def test_float64_dot_within_the_element_threshold():
    # 2 + 6 ulps of 2 (2**-51 = 4u): z = 24u / sigma_0 = 0.96 lam(1): rounding
    x = np.array([1.0, 1.0])
    rep = rk.compare(np.float64(2 + 6 * 2.0**-51), "dot", x, x)
    s0, err = _dot_sigma0(), 24 * U64
    z = err / s0
    assert rep.verdict == "rounding" and rep.n_terms == 2
    assert rep.thresholds == approx(
        {"alpha": 1e-6, "element": LAM1, "group": LAM1, "fit": 2 * math.log(2 * 7 / (1e-6 / 3))}, rel=1e-12
    )  # 7 alternatives
    assert rep.thresholds["fit"] == approx(35.10636035249529, rel=1e-12)
    h = rep.hypotheses["rounding"]
    assert h["sample_unexplained"] == 0 and h["explains"]
    assert h["fit"] == approx(z * z, rel=1e-12) and h["fit"] == approx(28.8, rel=1e-9)
    assert h["score"] == approx(z * z / 2, rel=1e-12)  # below the cap lam**2 / 2
    assert h["max_ratio"] == approx(z / LAM1, rel=1e-12)
    assert rep.max_ulp == 6.0
    assert rep.max_bound_ratio == approx(err / bound_by_hand(2, 2, 2, U64, U64), rel=1e-12)
    assert rep.max_bound_ratio == approx(3.0, rel=1e-9)
    assert rep.max_prob_ratio == approx(err / (math.sqrt(2) * U64 * 2 + 2 * U64 * 2), rel=1e-12)
    (w,) = rep.worst_details
    assert w["ulp"] == 6.0 and w["condition"] == 1.0
    assert w["bound_ratio"] == approx(rep.max_bound_ratio, rel=1e-15)
    assert w["test_ratio"] == approx(z / LAM1, rel=1e-12)
    want = ratios_by_hand(err, 2, 2.0, 2.0, U64)
    for k in CAND:
        for kind in ("worst_case", "probabilistic"):
            assert rep.bound_ratios[k][kind] == approx(want[k][kind], rel=1e-12), (k, kind)
    # detectable: lam sigma_0, and that over sqrt(n) u M
    assert rep.detectable["element"] == approx(LAM1 * s0, rel=1e-12)
    assert rep.detectable["element_in_scale_units"] == approx(LAM1 * s0 / (math.sqrt(2) * U64 * 2), rel=1e-12)
    assert rep.condition == {"median": 1.0, "max": 1.0}


def test_float64_dot_beyond_the_element_threshold():
    # 2 + 7 ulps: z = 28u / sigma_0 = 1.12 lam(1): mismatch; the score is capped at lam**2 / 2
    x = np.array([1.0, 1.0])
    rep = rk.compare(np.float64(2 + 7 * 2.0**-51), "dot", x, x)
    z = 28 * U64 / _dot_sigma0()
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] == 1
    h = rep.hypotheses["rounding"]
    assert h["sample_unexplained"] == 1 and not h["explains"]
    assert h["score"] == approx(LAM1**2 / 2, rel=1e-12)
    assert h["fit"] == approx(z * z, rel=1e-12)
    assert h["max_ratio"] == approx(z / LAM1, rel=1e-12)
    assert rep.worst_details[0]["test_ratio"] == approx(z / LAM1, rel=1e-12)
    assert rep.max_ulp == 7.0


def test_condition_and_tolerance_counts():
    # dot([1, 1], [1, -0.5]) = 0.5, M = 1.5: condition 3. Actual 0.5 + 3 * 2**-53 (3 ulps of 0.5).
    x, y = np.array([1.0, 1.0]), np.array([1.0, -0.5])
    a = np.float64(0.5 + 3 * 2.0**-53)
    rep = rk.compare(a, "dot", x, y, rtol=4 * 2.0**-53)  # rtol |ref| = 2 * 2**-53 < 3 * 2**-53: fails
    assert rep.verdict == "rounding" and rep.max_ulp == 3.0
    assert rep.condition == {"median": 3.0, "max": 3.0} and rep.worst_details[0]["condition"] == 3.0
    assert rep.tolerance == {"rtol": 4 * 2.0**-53, "atol": 0.0, "failing": 1, "failing_explained_by_rounding": 1}
    rep = rk.compare(a, "dot", x, y, atol=2 * 2.0**-53)  # atol = 2 * 2**-53 < 3 * 2**-53: fails
    assert rep.tolerance["failing"] == 1


@pytest.mark.parametrize("k,note", [(60, True), (120, False)])
def test_within_the_worst_case_bound_note(k, note):
    # dot of 100 ones in float64 = 100, off by k ulps (2**-46 = 128u): B = (1 + u) gamma_100 100 (1 + 101 2**-52)
    # + 200 u ~ 10200 u, so k = 60 is 0.75 B (the note) and k = 120 is 1.51 B (no note); both beyond lam sigma_0
    x = np.ones(100)
    rep = rk.compare(np.float64(100 + k * 2.0**-46), "dot", x, x)
    assert rep.verdict == "mismatch"
    assert rep.max_bound_ratio == approx(k * 2.0**-46 / bound_by_hand(100, 100, 100, U64, U64), rel=1e-12)
    assert any("within the worst-case bound" in n for n in rep.notes) == note


def test_fit_band_lets_rounding_keep_an_output_it_explains():
    # matmul [[1, 1 + 3 * 2**-22]] @ [[1, 1], [15, 15]] in float32: exact 16 + 45 * 2**-22, rounded to 16 + 6 * 2**-19;
    # every reduced precision rounds 1 + 3 * 2**-22 to 1 and gives 16, the actual output. Rounding explains each
    # element (z0 = 6 * 2**-19 / sigma_0 = 5.37 < lam(2) = 5.71), but its score sum z0**2 / 2 = 28.8 lies more than
    # the band lam_fit**2 / 2 = 18.25 above the reduced precisions' 0 (and within 2x the band): a reduced precision
    A = np.array([[1.0, 1 + 3 * 2.0**-22]], np.float32)
    B = np.array([[1.0, 1.0], [15.0, 15.0]], np.float32)
    rep = rk.compare(np.array([[16.0, 16.0]], np.float32), "matmul", A, B)
    m = 16 + 45 * 2.0**-22
    s0 = math.sqrt(((1 + gamma(2, U32)) * U32) ** 2 * 3 * m * m + 2 * (U32 * (16 + 6 * 2.0**-19)) ** 2
                   + 5 * ETA32**2)  # fmt: skip
    z0 = 6 * 2.0**-19 / s0
    fit = 2 * math.log(2 * 14 / (1e-6 / 3))  # lam_fit**2 for 14 alternatives (two of them tf32 on tensor cores)
    assert rep.thresholds["fit"] == approx(fit, rel=1e-12)
    assert rep.thresholds["element"] == approx(level(2), rel=1e-12) and z0 < level(2)
    assert rep.hypotheses["rounding"]["score"] == approx(z0 * z0, rel=1e-9)
    assert fit / 2 < z0 * z0 <= fit  # the case discriminates the band from twice the band
    assert rep.hypotheses["tf32"]["score"] == 0.0
    assert rep.verdict == "reduced-precision" and rep.precision == "tf32"
    assert rep.alternatives == ["bf16", "fp16"]


def test_breakdown_point_half_the_sample():
    # [[1, 1 + 2**-18]] @ [[1, 1, 1], [15, 15, 15]] in float32, output [16, 1000, -1000]: every reduced precision
    # rounds 1 + 2**-18 to 1 and fits the first element exactly (rounding misses it, z0 ~ 27); nothing fits the two
    # others. A model that misses 2 of the 3 sampled elements (not fewer than half) is no base for a mismatch: it is
    # measured against the rounding family. Scores: every miss costs the cap lam(3)**2 / 2 = ln(1.8e7)
    A = np.array([[1.0, 1 + 2.0**-18]], np.float32)
    B = np.array([[1.0, 1.0, 1.0], [15.0, 15.0, 15.0]], np.float32)
    rep = rk.compare(np.array([[16.0, 1000.0, -1000.0]], np.float32), "matmul", A, B)
    assert rep.verdict == "mismatch" and rep.model == "fp32 accumulation, any order"
    assert rep.hypotheses["rounding"]["sample_unexplained"] == 3 and rep.hypotheses["tf32"]["sample_unexplained"] == 2
    assert rep.hypotheses["rounding"]["score"] == approx(3 * math.log(2 * 3 / (1e-6 / 3)), rel=1e-12)
    assert rep.hypotheses["tf32"]["score"] == approx(2 * math.log(2 * 3 / (1e-6 / 3)), rel=1e-12)


def test_alphas_of_the_noise_size_and_dominance_tests(monkeypatch):
    # each of the 14 alternatives' tests of part 3 gets ALPHA / 3 / 14 (stats' docstring: Bonferroni)
    seen = {"noise": [], "margin": []}
    noise, margin = verdict._noise_size, verdict.proportion_margin

    def spy_noise(group, a_s, x_s, ok, alpha, c32=None):
        seen["noise"].append(alpha)
        assert c32 is not None  # float32 left to right, the accumulators' floor (verdict._noise_size)
        return noise(group, a_s, x_s, ok, alpha, c32)

    def spy_margin(n, alpha):
        seen["margin"].append((n, alpha))
        return margin(n, alpha)

    monkeypatch.setattr(verdict, "_noise_size", spy_noise)
    monkeypatch.setattr(verdict, "proportion_margin", spy_margin)
    A = np.array([[1.0, 1 + 3 * 2.0**-22]], np.float32)
    B = np.array([[1.0, 1.0], [15.0, 15.0]], np.float32)
    rk.compare(np.array([[16.0, 16.0]], np.float32), "matmul", A, B)
    assert seen["noise"] == [1e-6 / 3 / 14] * 2  # fp16 and bf16 accumulators
    assert seen["margin"] == [(2, 1e-6 / 3 / 14)]


def test_dominance_factor_sqrt2():
    # s dominates e when s's (1/2 + eps) quantile < e's (1/2 - eps) quantile / sqrt(2) = 0.7071
    m = models(FLOAT32, 24, False)[0]
    e = verdict.Fit(m, res=np.full(101, 1.0))
    assert verdict._dominates(verdict.Fit(m, res=np.full(101, 0.6)), e, 0.1)
    assert not verdict._dominates(verdict.Fit(m, res=np.full(101, 0.72)), e, 0.1)
    assert not verdict._dominates(verdict.Fit(m, res=np.full(101, 0.6)), e, 0.6)  # eps >= 1/2: no claim


# ----------------------------------------------------------------- envelope verdict and ulps


@pytest.mark.parametrize("k", [2, 3])
def test_envelope_threshold_one_and_its_figures(k):
    # sum([1, 2, 3]) in float32: envelope B = gamma_2 (1 + 8u) 6 + 6u + 2**-150 (u = 2**-24, pinned in
    # test_reductions_norms), 2.25 ulps of 6 (2**-21). Actual 6 + k ulps: ratio 8k u / B, 0.89 (k = 2) or 1.33
    # (beyond: a mismatch for sure). Inside it the statistical test decides: sigma**2 = 133 u**2 + 9 * 2**-300
    # (test_inside), one element: lam = sqrt(2 ln(2 / (1e-6 / 3))) = 5.587; z = 8k u / sigma = 1.39 (k = 2)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    b = 2 * U32 / (1 - 2 * U32) * (1 + 8 * U32) * 6 + 6 * U32 + 2.0**-150
    rep = rk.compare(np.float32(6 + k * 2.0**-21), "sum", x)
    r = k * 2.0**-21 / b
    lam = math.sqrt(2 * math.log(6e6))
    z = k * 2.0**-21 / math.sqrt(133 * U32**2 + 9 * 2.0**-300)
    assert rep.verdict == ("rounding" if k == 2 else "mismatch")
    assert rep.thresholds == {"alpha": 1e-6, "element": approx(lam, rel=1e-15),
                              "group": approx(lam, rel=1e-15), "test": "statistical, inside the envelope",
                              "envelope": 1.0}
    assert rep.max_ulp == float(k)
    assert rep.max_bound_ratio == approx(r, rel=1e-12) and rep.max_prob_ratio == approx(z / lam, rel=1e-12)
    assert rep.bound_ratios["rounding"]["worst_case"] == approx(r, rel=1e-12)
    (w,) = rep.worst_details
    assert w["ulp"] == float(k)
    assert w["bound_ratio"] == approx(r, rel=1e-12) and w["test_ratio"] == approx(z / lam, rel=1e-12)
    det = rep.detectable["element"]  # lam sigma in ulps of 6
    s = math.sqrt(133 * U32**2 + 9 * 2.0**-300)
    assert det["median_ulps"] == approx(lam * s / 2.0**-21, rel=1e-12)
    assert det["max_ulps"] == approx(lam * s / 2.0**-21, rel=1e-12)
    env = rep.detectable["envelope"]  # the worst-case envelope's, as before
    assert env["median_ulps"] == approx(b / 2.0**-21, rel=1e-12)
    assert env["max_ulps"] == approx(2.250000894069778, rel=1e-12)


def test_envelope_error_at_zero_in_the_smallest_subnormals_ulp():
    x = np.array([1.0, -1.0], np.float32)
    rep = rk.compare(np.float32(2.0**-149), "sum", x)
    assert rep.verdict == "rounding" and rep.max_ulp == 1.0


def _decide4(actual, hyp):
    """decide_envelope on four float32 elements, the reference 0 with rounding's window [-1, 1] each, and one
    more hypothesis ``(key, precision, centre, bound)``; the output's other elements lie in every window."""
    ref = np.zeros(4)
    return verdict_envelope.decide_envelope(np.array([actual, 0.5, -0.5, 0.0]), ref, [("rounding", None, ref, np.ones(4)), hyp],
                                   FLOAT32)  # fmt: skip


def test_envelope_evidence_windows_by_hand():
    # _evidence: with rounding's window B0 = 1 and fp16's B around its centre at distance gap from the reference,
    # an element is informative when B < gap + B0 and strong when B + B0 < gap
    def fp16(c, b):
        return ("fp16", "fp16", np.array([c, 0.0, 0.0, 0.0]), np.full(4, b))

    # B = 3, gap = 1.5: 3 >= 1.5 + 1, fp16's window holds rounding's whole: swallowed, no naming
    d = _decide4(2.0, fp16(1.5, 3.0))
    assert d.verdict == "mismatch" and any("hold rounding's own" in s["text"] for s in d.structure)
    # B = 1, gap = 2: 1 + 1 = 2 is not < 2, not disjoint: no naming; gap = 3: disjoint, fp16 named
    assert _decide4(2.5, fp16(2.0, 1.0)).verdict == "mismatch"
    assert (_decide4(3.25, fp16(3.0, 1.0)).precision) == "fp16"


def test_one_pass_note_reports_its_width_over_roundings():
    # the one-pass window is 4 wide where rounding's is 1, around the same centre: "up to 4x rounding's envelope"
    from refkern.analysis.envelope import ONE_PASS

    d = _decide4(3.0, (ONE_PASS, None, np.zeros(4), np.full(4, 4.0)))
    assert d.verdict == "mismatch"
    assert any("errors up to 4x rounding's envelope" in s["text"] for s in d.structure)


# ---------------------------------------------------------------------------------- structure


def test_group_test_z_by_hand():
    # row 0 holds residuals 1, 1, 1, 1 of variance 1 each: z = 4 / sqrt(4) = 2 > lam = 1.5; columns: 1 / sqrt(2)
    r = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    var, keep = np.ones((2, 4)), np.ones((2, 4), bool)
    c = np.arange(8.0).reshape(2, 4)
    got = structure.group_failures(r, var, keep, c, c + r, ("row", "col"), 1.5)
    assert got == [{"axis": "row", "ax": 0, "index": 0, "z": 2.0, "mean": 1.0}]
    assert structure.group_failures(r, var, keep, c, c + r, ("row", "col"), 2.0) == []


def test_detectable_sizes_by_hand():
    # sd = 2 everywhere: one element lam_el sd = 10; a whole group g along an axis: lam_grp sqrt(sum var) / size(g):
    # rows (3 elements each) 3 sqrt(12) / 3, columns (2 each) 3 sqrt(8) / 2
    d = structure.detectable(np.full((2, 3), 4.0), np.ones((2, 3)), (2, 3), ("row", "col"), 5.0, 3.0)
    assert d["element"] == 10.0 and d["element_in_scale_units"] == 10.0
    assert d["groups"]["row"] == approx(math.sqrt(12), rel=1e-15)
    assert d["groups"]["col"] == approx(3 * math.sqrt(8) / 2, rel=1e-15)


def test_signature_tolerances_are_lam_sigma():
    assert structure._ok(np.array([1.0]), np.array([1.0]), 1.0)
    assert not structure._ok(np.array([1.5]), np.array([1.0]), 1.0)
    # an offset -1.15 on channel 0 with bias 1, sd 0.1, lam 1: 0.15 from -bias, beyond lam sd: not "bias dropped"
    var = np.full((1, 2), 0.01)
    flagged = np.array([[True, False]])
    bias = np.array([1.0, 2.0])
    off = structure._offsets(np.array([[-1.15, 0.0]]), var, flagged, ("row", "channel"), bias, 1, 1.0)
    assert off["bias"] is None and off["offsets"] == [-1.15]
    off = structure._offsets(np.array([[-1.05, 0.0]]), var, flagged, ("row", "channel"), bias, 1, 1.0)
    assert off["bias"] == "dropped"
    # missing terms: residual -1.15 on three elements whose first term is 1: 0.15 > lam sd = 0.1, no fit
    L, R = np.array([[1.0, 2.0]] * 3), np.ones((3, 2))
    assert structure._missing_terms(np.full(3, -1.15), np.full(3, 0.01), L, R, "gemm", None, 1.0) is None
    mt = structure._missing_terms(np.full(3, -1.05), np.full(3, 0.01), L, R, "gemm", None, 1.0)
    assert mt["text"] == "the residuals fit input feature 0 missing from the sum"


# ----------------------------------------------------------------------------------- evaluate


def test_n_terms_by_hand():
    z = np.zeros
    assert problem("dot", (z(5), z(5)), {}).n_terms == 5
    assert problem("linear", (z((2, 3)), z((4, 3)), z(4)), {}).n_terms == 3 + 1  # K + bias
    assert problem("conv2d", (z((1, 2, 5, 5)), z((3, 2, 3, 3)), z(3)), {}).n_terms == 2 * 3 * 3 + 1
    # transposed, stride 1, kernel 2: at most 2 taps per position per axis, 2 input channels, + bias
    assert problem("conv_transpose2d", (z((1, 2, 3, 3)), z((2, 3, 2, 2)), z(3)), {}).n_terms == 2 * 2 * 2 + 1
    # stride 2, kernel 3: at most 2 taps (ceil(3 / 2)) per axis
    assert problem("conv_transpose2d", (z((1, 2, 3, 3)), z((2, 3, 3, 3))), {"stride": 2}).n_terms == 2 * 2 * 2


# ------------------------------------------------------------------------------ report, explain


def test_report_many_ulps_note_above_64():
    def rep(max_ulp):
        return Report(op="dot", device="numpy", dtype="float32", shape=(), n_terms=2, verdict="rounding",
                      precision=None, max_ulp=max_ulp, max_bound_ratio=0.5, max_prob_ratio=0.5, worst=[],
                      worst_details=[], counts={"exact": 0, "rounding": 1, "reduced-precision": 0, "mismatch": 0},
                      where={}, hypotheses={}, bound_ratios={}, condition={"median": 1.0, "max": 1.0})  # fmt: skip

    assert "many ulps are normal" in str(rep(100.0))
    assert "many ulps are normal" not in str(rep(64.0))


def test_explain_room_is_the_sum_of_two_bounds():
    # dot([1, 1], [1, 1]) = 2 in float32, B = (1 + u) gamma_2 2 (1 + 3 2**-52) + 4u ~ 8u each; 2 against
    # 2 + 3 * 2**-21 (24u): 1.5x the room 2B, beyond it
    x = np.array([1.0, 1.0], np.float32)
    room = 2 * bound_by_hand(2, 2, 2, U32, U32)
    e = rk.explain(np.float32(2.0), np.float32(2 + 3 * 2.0**-21), "dot", x, x)
    assert not e.within and e.differ == 1 and e.max_diff == 3 * 2.0**-21
    assert e.max_pair_ratio == approx(3 * 2.0**-21 / room, rel=1e-12)
    assert e.max_pair_ratio == approx(1.5, rel=1e-6)
    e = rk.explain(np.float32(2.0), np.float32(2 + 2.0**-21), "dot", x, x)
    assert e.within and e.max_pair_ratio == approx(2.0**-21 / room, rel=1e-12)
