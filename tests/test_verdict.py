"""The verdict as a statistical test: pinned levels and scales, the cases users reported, the
signatures of common bugs, and a fast subset of the calibration benchmark."""

import math
import os
import sys

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT16, FLOAT32, TFLOAT32
from refkern.analysis.bounds import bound, precision_ratios
from refkern.analysis.compare import _ulps
from refkern.analysis.hypotheses import models, rounding_variance
from refkern.analysis.stats import ALPHA, PARTS, level, proportion_margin
from refkern.analysis.verdict import SAMPLE, sample_indices

torch = pytest.importorskip("torch")
from torchdata import rounded, seeded  # noqa: E402

F = torch.nn.functional


# ---------------------------------------------------------------- pinned figures
# Each value below is written out by hand: loosening a level, a scale or a bound, or doubling an
# ulp count, fails here.


def test_false_alarm_budget_and_levels():
    assert ALPHA == 1e-6 and PARTS == 3
    # lam = sqrt(2 ln(2 m / (ALPHA / 3))): m = 10^4 elements -> sqrt(2 ln 6e10)
    assert level(10_000) == pytest.approx(7.045226809573771, abs=1e-12)
    assert level(1_600_000) == pytest.approx(7.732112804971528, abs=1e-12)
    assert level(14) == pytest.approx(6.040915055984083, abs=1e-12)
    assert level(1) == pytest.approx(5.586997409555929, abs=1e-12)
    assert level(10_000) == pytest.approx(math.sqrt(2 * math.log(6e10)), abs=1e-12)
    # Hoeffding: sqrt(ln(2 / alpha) / (2 n))
    assert proportion_margin(1000, 1e-6) == pytest.approx(0.08517234803187071, abs=1e-12)


def test_rounding_scale_is_pinned():
    """sigma_0**2 = ((1 + gamma_n) u)**2 (n + 1) M**2 + 2 (u c)**2 + ...: for n = 10, M = c = 1 in fp32,
    13 u**2 to first order: sigma_0 = sqrt(13) 2**-24."""
    m = models(FLOAT32, 24, True)[0]
    v = float(rounding_variance(m, 10, np.array(1.0), np.array(1.0)))
    assert v == pytest.approx(4.618532441126026e-14, rel=1e-12, abs=0)
    assert math.sqrt(v) == pytest.approx(math.sqrt(13) * 2.0**-24, rel=1e-5, abs=0)
    epi = models(FLOAT16, 11, True)[1]
    assert epi.epilogue and epi.rounding
    v1 = float(rounding_variance(epi, 10, np.array(1.0), np.array(0.5), np.array(0.25)))
    # 11 ((1+g) 2**-24)**2 + 2 (0.5 * 2**-11)**2 + 2 (0.25 * 2**-11)**2 + subnormal terms of fp16
    assert v1 == pytest.approx(11 * 2.0**-48 + 2 * (0.5 * 2.0**-11) ** 2 + 2 * (0.25 * 2.0**-11) ** 2
                               + 4 * 2.0 ** (2 * (-14 - 11)) + 11 * 2.0 ** (2 * (-126 - 24)), rel=1e-5, abs=0)


def test_accumulator_scale_and_noise_tests_are_pinned():
    """sigma**2 = 2 ((1 + gamma_n) u S)**2 + 2 (u c)**2 + ...: fp16 accumulation, n = 10, S = 3, c = 1,
    about 2 (3 u)**2 + 2 u**2 with u = 2**-11; and the exact Mann-Whitney tails."""
    from refkern.analysis.hypotheses import _order_variance
    from refkern.analysis.stats import smaller_pvalue

    m = next(m for m in models(FLOAT32, 24, False) if m.key == "fp16 accumulation (left-to-right)")
    assert float(_order_variance(m, 10, np.array(3.0), np.array(1.0))) == pytest.approx(4.810590084337673e-06,
                                                                                          rel=1e-12, abs=0)
    assert smaller_pvalue([0, 0, 0], [1, 1, 1]) == pytest.approx(1 / 20)  # 1 / C(6, 3)
    assert smaller_pvalue([0.5], [0, 1]) == pytest.approx(2 / 3)
    assert smaller_pvalue(np.zeros(100), np.ones(100)) < 1e-30  # normal approximation beyond 4096 pairs


def test_noise_size_tests_need_power():
    """An accumulator model is eligible only where its Mann-Whitney tests can reject at their level: the smallest
    p-value of samples of m and m is 1 / C(2m, m) (U = 0), 1/70 for 4 elements, 1 / 40116600 for 14."""
    from refkern.analysis.stats import min_pvalue, smaller_pvalue

    assert min_pvalue(4, 4) == 1 / 70 == smaller_pvalue([0, 0, 0, 0], [1, 1, 1, 1])
    assert min_pvalue(14, 14) == 1 / 40116600
    assert min_pvalue(3, 2) == 1 / 10 and min_pvalue(0, 5) == 1.0
    assert 0 < min_pvalue(100, 100) < 1e-30  # the normal approximation beyond 4096 pairs
    assert min_pvalue(14, 14) < ALPHA / PARTS / 13 < min_pvalue(13, 13)  # the usual level: 14 elements needed


def test_worst_case_bound_and_ratios_are_pinned():
    # (1 + u) gamma_10(u) M (1 + 11 * 2**-52) + 2 u |ref| + 10 * 2**-1074, u = 2**-24, M = ref = 1
    assert float(bound(np.array(1.0), np.array(1.0), 10, 2.0**-24, 2.0**-24)) == pytest.approx(
        7.152561281034266e-07, rel=1e-12, abs=0)
    br = precision_ratios(np.array([3e-6]), 10, np.array([4.0]), np.array([2.0]), FLOAT32)
    assert br["fp32"]["worst_case"] == pytest.approx(1.1439004090909066, rel=1e-9, abs=0)
    assert br["fp32"]["probabilistic"] == pytest.approx(3.0230832797182856, rel=1e-9, abs=0)
    assert br["tf32"]["worst_case"] == pytest.approx(0.0003836836255526612, rel=1e-9, abs=0)
    assert br["bf16"]["probabilistic"] == pytest.approx(0.0001517817067127115, rel=1e-9, abs=0)


def test_report_figures_are_pinned():
    """dot([1, 1], [1, 1]) = 2 returned as 2 + 2**-22 (one fp32 ulp): n = 2, M = 2, u = 2**-24.
    B = (1 + u) gamma_2(u) 2 (1 + 3 * 2**-52) + 2 u 2 ~ 8u = 2**-21: ratio 1/2; the noise scale
    sqrt(2) u 2 + 2 u 2: ratio 4 / (2 sqrt(2) + 4)."""
    x = np.array([1.0, 1.0], np.float32)
    rep = rk.compare(np.float32(2 + 2.0**-22), "dot", x, x)
    assert rep.max_bound_ratio == pytest.approx(0.49999995529651486, rel=1e-12, abs=0)
    assert rep.max_prob_ratio == pytest.approx(4 / (2 * math.sqrt(2) + 4), rel=1e-12, abs=0)
    assert rep.max_ulp == 1.0


def test_ulp_counts_are_pinned():
    u = _ulps(np.array([1 + 3 * 2.0**-23, 5 * 2.0**-149, 1.0]), np.array([1.0, 0.0, 1 + 2.0**-23]), FLOAT32)
    assert u.tolist() == [3.0, 5.0, 1.0]
    assert _ulps(np.array([1 + 3 * 2.0**-10]), np.array([1.0]), FLOAT16).tolist() == [3.0]


def test_sample_sizes():
    assert SAMPLE == 4096
    assert len(sample_indices(10**6, 4608)) == 256  # max(256, 2**20 // 4608): at most 2**20 terms gathered
    assert len(sample_indices(10**6, 577)) == 1817
    assert len(sample_indices(10**6, 9)) == 4096
    assert sample_indices(100, 9).tolist() == list(range(100))
    assert np.array_equal(sample_indices(10**5, 64), sample_indices(10**5, 64))  # seeded


def test_report_states_its_thresholds_and_power():
    r = seeded("pins")
    x, w, b = r(16, 100), r(24, 100), r(24)
    rep = rk.compare(F.linear(x, w, b), "linear", x, w, b)
    assert rep.thresholds["element"] == pytest.approx(level(16 * 24), abs=1e-12)
    # each group a sum and a scale test (16 rows, 24 columns), and the whole output's scale and offset tests
    assert rep.thresholds["group"] == pytest.approx(level(2 * (16 + 24) + 2), abs=1e-12)
    assert rep.thresholds["alpha"] == 1e-6
    det = rep.detectable
    # the element threshold lam * sigma_0 in units of sqrt(n) u M, sigma_0 from the partial sums of the orders
    # backends use (refkern.analysis.partials), here formed by hand: 100 products and a bias per element, blocks
    # of 4 (the power of two nearest sqrt(101) / 2), times kappa, the sampled elements' largest ratio of the other
    # orders' partial sums to that bound (pinned by hand in test_partials); the order-free scale gave
    # lam sqrt((n + 1) / n)
    from refkern.analysis.evaluate import problem
    from refkern.analysis.partials import gemm_partials, order_bound

    pr = problem("linear", (x, w, b), {})
    _, mag = pr.run(want_mag=True)
    kappa = float(np.max(order_bound(pr, mag, sample_indices(384, 101)) / gemm_partials(pr, mag)))
    assert kappa >= 1.0
    xd, wd, bd = (t.double().numpy() for t in (x, w, b))
    u, want = 2.0**-24, []
    ref = F.linear(x.double(), w.double(), b.double()).float().double().numpy()
    for i in range(16):
        for j in range(24):
            t = (xd[i] * wd[j]).reshape(25, 4)
            S, A = t.sum(axis=1), np.abs(t).sum(axis=1) + abs(bd[j])
            P = np.concatenate([[0.0], np.cumsum(S)[:-1]])
            Q = S.sum() - P - S
            M = np.abs(t).sum() + abs(bd[j])
            part = 4 * max(((np.abs(P) + A) ** 2).sum(), ((np.abs(Q) + A) ** 2).sum()) + (t * t).sum() + M * M
            part = kappa * min(part, 102 * M * M)
            ua = u * (1 + 101 * u / (1 - 101 * u))
            var = ua**2 * part + 2 * (u * ref[i, j]) ** 2 + 2 * 2.0 ** (2 * (-126 - 24)) + 102 * 2.0 ** (2 * (-126 - 24))
            want.append(level(384) * math.sqrt(var) / (math.sqrt(101) * u * M))
    assert det["element_in_scale_units"] == pytest.approx(float(np.median(want)), rel=1e-9)
    assert det["element_in_scale_units"] < 0.5 * level(384)  # mixed signs: under half the order-free threshold
    assert set(det["groups"]) == {"dim0", "out_feature"}
    # a whole row of 24 elements: sqrt(24) times finer than one element, lam_grp / lam_el aside
    ratio = det["element"] / det["groups"]["dim0"]
    assert 0.6 * math.sqrt(24) < ratio * level(82) / level(384) < 1.6 * math.sqrt(24)
    assert "detectable (median)" in str(rep)


# ------------------------------------------------------------- what users reported


@pytest.mark.parametrize("k", [72, 288, 2048])
@pytest.mark.parametrize("seed", range(3))
def test_dropped_bias_is_a_mismatch_at_every_k(k, seed):
    r = seeded("dropped-bias", k, seed)
    x, w, b = r(16, k), r(32, k), r(32)
    rep = rk.compare(F.linear(x, w), "linear", x, w, b)
    assert rep.verdict == "mismatch", str(rep)
    # every output feature whose bias stands above the noise (a tiny bias at K = 2048 may not)
    assert any(n.endswith("off by a constant -bias[out_feature]: bias dropped?") for n in rep.notes), rep.notes


@pytest.mark.parametrize("k", [72, 2048])
def test_zeroed_input_feature_is_a_mismatch(k):
    r = seeded("zeroed", k)
    x, w, b = r(16, k), r(32, k), r(32)
    x0 = x.clone()
    x0[:, 5] = 0
    rep = rk.compare(F.linear(x0, w, b), "linear", x, w, b)
    assert rep.verdict == "mismatch", str(rep)
    assert any("input feature 5 missing" in n for n in rep.notes), rep.notes


def test_conv_with_its_bias_missing():
    r = seeded("conv-no-bias")
    x, w, b = r(2, 8, 16, 16), r(16, 8, 3, 3), r(16)
    rep = rk.compare(F.conv2d(x, w, None, padding=1), "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] == rep.n_elements
    assert rep.structure[0]["kind"] == "offset" and rep.structure[0]["axis"] == "channel"
    assert rep.structure[0]["bias"] == "dropped"
    out = F.conv2d(x, w, b, padding=1)
    out[:, 5] += b[5]  # one channel's bias added twice
    rep = rk.compare(out, "conv2d", x, w, b, padding=1)
    assert "channel 5 off by a constant +bias[channel]: bias added twice?" in rep.notes, rep.notes


def test_half_linear_rounds_the_product_before_a_strided_bias():
    """torch's fp16 F.linear with a 3-D input and a non-contiguous bias runs matmul then add_:
    a correct implementation in fp16, so rounding (the issue's repro)."""
    x = torch.zeros(2, 3, 3, dtype=torch.float16)
    x[..., 0] = 1000
    x[..., 1] = 0.375
    w = torch.ones(4, 3, dtype=torch.float16)
    b = torch.full((4, 2), -1000.0, dtype=torch.float16)[:, 0]
    rep = rk.compare(F.linear(x, w, b), "linear", x, w, b)
    assert rep.verdict == "rounding", str(rep)
    assert "product rounded" in rep.model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_named(dtype):
    r = seeded("autocast", dtype)
    x, w, b = r(16, 96), r(24, 96), r(24)
    with torch.autocast("cpu", dtype=dtype):
        out = F.linear(x, w, b)
    rep = rk.compare(out.float(), "linear", x, w, b)
    want = "bf16" if dtype == torch.bfloat16 else "fp16"
    assert (rep.verdict, rep.precision) == ("reduced-precision", want), str(rep)


@pytest.mark.parametrize("order", ["naive", "pairwise"])
def test_fp16_accumulator_that_stagnates_is_named(order):
    """All-positive terms: a true fp16 accumulator loses the small ones (every error one sign)."""
    r = seeded("stagnation", order)
    x, w = r(8, 512).abs(), r(16, 512).abs()
    out = rk.linear(x, w, accumulate=order, accum_dtype="float16")
    rep = rk.compare(out, "linear", x, w)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp16"), str(rep)


def test_float32_result_handed_over_as_float64():
    r = seeded("fp32-as-fp64")
    x, w = r(8, 200).double(), r(16, 200).double()
    out = F.linear(x.float(), w.float()).double()
    rep = rk.compare(out, "linear", x, w)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp32"), str(rep)


def test_terms_past_the_end_of_k_are_found():
    """A GEMM that adds 12 terms past the end of K = 40020: inside the worst-case bound everywhere."""
    r = seeded("past-end")
    k = 40020
    x, w = r(4, k + 12), r(6, k + 12)
    out = F.linear(x, w)
    rep = rk.compare(out, "linear", x[:, :k], w[:, :k])
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] >= out.numel() // 2, str(rep)
    assert rep.max_bound_ratio < 1  # the worst-case bound alone would have passed it


def test_tf32_rounding_ties_away_is_not_a_mismatch():
    """NVIDIA converts fp32 to TF32 to nearest with ties away (1024.5 -> 1025): tied inputs."""
    r = seeded("rna")
    x, w = r(2, 4, 10, 10), r(6, 4, 3, 3)
    x = rounded(x, TFLOAT32, 1) + 2.0 ** (torch.floor(torch.log2(x.abs())) - 11) * (torch.rand(x.shape) < 0.05)
    out = F.conv2d(rounded(x, TFLOAT32, 2), rounded(w, TFLOAT32, 2), padding=1)
    rep = rk.compare(out, "conv2d", x, w, padding=1)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "tf32"), str(rep)
    assert "ties away" in rep.model


def test_whole_channel_off_below_the_element_threshold():
    """Every element of one channel off by 3 sigma: no element stands out, the channel does."""
    r = seeded("channel-offset")
    x, w, b = r(2, 16, 12, 12), r(8, 16, 3, 3), r(8)
    out = F.conv2d(x, w, b, padding=1)
    el = rk.analysis.compare.elements(out, "conv2d", x, w, b, padding=1)
    assert el["report"].verdict == "rounding"
    bad = out.clone()
    bad[:, 3] += 3 * float(np.median(el["scale"][:, 3]))
    rep = rk.compare(bad, "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch", str(rep)
    assert rep.where["channel"]["positions"] == [3]
    assert "channel 3 is off by a constant" in " ".join(rep.notes)


def test_shifted_output_is_named():
    r = seeded("shift")
    x, w, b = r(2, 4, 10, 10), r(6, 4, 3, 3), r(6)
    rep = rk.compare(torch.roll(F.conv2d(x, w, b, padding=1), 1, dims=3), "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch"
    assert any("shifted by +1 along col" in n for n in rep.notes), rep.notes


def test_missing_input_channel_and_dropped_tail_are_named():
    r = seeded("missing")
    x, w, b = r(2, 6, 8, 8), r(5, 6, 3, 3), r(5)
    x0 = x.clone()
    x0[:, 2] = 0
    rep = rk.compare(F.conv2d(x0, w, b, padding=1), "conv2d", x, w, b, padding=1)
    assert any("input channel 2" in n for n in rep.notes), rep.notes
    k = 640
    x, w = r(8, k), r(12, k)
    rep = rk.compare(F.linear(x[:, : k - 40], w[:, : k - 40]), "linear", x, w)
    assert any("the last 40 of 640 terms missing" in n for n in rep.notes), rep.notes


def test_bug_on_top_of_tf32_is_measured_against_tf32():
    r = seeded("bug-on-tf32")
    x, w = r(16, 64), r(24, 64)
    out = F.linear(rounded(x, TFLOAT32, 0), rounded(w, TFLOAT32, 0))
    out[4, 7] += 1e-4 * float(out.abs().max())
    rep = rk.compare(out, "linear", x, w)
    assert rep.verdict == "mismatch" and rep.worst[0] == (4, 7) and rep.counts["mismatch"] == 1, str(rep)
    assert rep.model.startswith("tf32")


def test_precisions_that_fit_alike_are_both_named():
    """Inside fp16's range TF32 and fp16 inputs round alike: the report names both."""
    r = seeded("indistinguishable")
    x, w = r(16, 64), r(24, 64)
    out = F.linear(x.half().float(), w.half().float())
    rep = rk.compare(out, "linear", x, w)
    assert rep.verdict == "reduced-precision"
    assert {rep.precision, *rep.alternatives} == {"tf32", "fp16"}
    assert "indistinguishable" in " ".join(rep.notes)


# ------------------------------------------- no false alarms on torch's CPU outputs


def _layouts(g):
    """torch CPU results in fp32, fp16, bf16: 3-D inputs, non-contiguous operands, channels_last."""
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for k in (9, 64, 700):
            x, w, b = (g(3, 5, k) * 2).to(dt), g(7, k).to(dt), g(7).to(dt)
            yield "linear", F.linear(x, w, b), (x, w, b), {}
            bs = torch.stack([b, b], 1)[:, 0]
            yield "linear", F.linear(x, w, bs), (x, w, bs), {}
            wt = w.t().contiguous().t()
            yield "linear", F.linear(x[:, ::2], wt, b), (x[:, ::2], wt, b), {}
            yield "matmul", torch.matmul(x, w.t()), (x, w.t()), {}
        xc, wc, bc = g(2, 6, 9, 9).to(dt), g(4, 6, 3, 3).to(dt), g(4).to(dt)
        yield "conv2d", F.conv2d(xc, wc, bc, padding=1), (xc, wc, bc), {"padding": 1}
        xl = xc.to(memory_format=torch.channels_last)
        yield "conv2d", F.conv2d(xl, wc, bc, stride=2), (xl, wc, bc), {"stride": 2}
        yield "conv2d", F.conv2d(xc, wc[:, :3], bc, groups=2, dilation=2), (xc, wc[:, :3], bc), \
            {"groups": 2, "dilation": 2}


def test_no_false_alarms_on_every_dtype_and_layout():
    g = seeded("layouts")
    bad = []
    n = 0
    for op, out, args, kw in _layouts(g):
        rep = rk.compare(out, op, *args, **kw)
        n += 1
        if rep.verdict not in ("exact", "rounding"):
            bad.append((op, out.dtype, tuple(args[0].shape), str(rep)))
    assert n == 45 and not bad, bad[:2]


# --------------------------------------------------- fast subset of the calibration


def test_calibration_subset():
    """benchmarks/bench_verdict.py on two K and two data regimes: the rates the issue demands."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    try:
        import bench_verdict as bv
    finally:
        sys.path.pop(0)
    rows = bv.run(quick=True, ks=(27, 288), ops=("linear", "conv2d"), data=("randn", "positive"), log=lambda *a: None)
    s = bv.summarise(rows)
    print({k: v for k, v in s.items() if not isinstance(v, list)})
    assert s["false_alarms"] == 0, s["false_alarm_cases"]
    assert s["caught"] == s["bugs_ge_10x"] > 40, s["missed"]
    assert s["below_noise_named_a_precision"] == 0, s["below_noise_named"]
    assert s["named_rate"] >= 0.98, s["misnamed"]


# ------------------------------------------------------------------ reading the results


def test_error_over_noise_comes_before_ulps():
    """Near-zero outputs carry huge ulp counts under 'rounding': the tables and the Report show the
    error over the noise scale first, and say in one line what ulps mean there."""
    import refkern.torch as rkt
    from refkern.analysis.report import COLUMNS_NOTE

    r = seeded("columns")
    x, w = r(8, 64), r(8, 64)
    x[:, 32:] = x[:, :32]
    w[:, 32:] = -w[:, :32]  # every output cancels to (nearly) zero
    res = rkt.check(F.linear, x, w, devices=["cpu"])
    text = str(res)
    head = text.splitlines()[1].split()
    assert head.index("error/noise") < head.index("bound") < head.index("ulp")
    assert text.splitlines()[3] == f"  ({COLUMNS_NOTE})"  # under the table, before any pair sentence
    rep = res.rows[0].report
    assert rep.verdict in ("exact", "rounding")
    line = str(rep).splitlines()[2]
    assert line.startswith("  max error") and line.index("noise scale") < line.index("ulp")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_conv_transpose_rounds_per_tap_as_torch_does(dtype):
    """torch's CPU fp16/bf16 conv_transpose rounds each tap's channel sum, and the running sum over
    taps, to the result dtype (col2im): a correct computation in that dtype, so rounding."""
    r = seeded("convt-half", dtype)
    x, w, b = r(2, 6, 5, 6).to(dtype), r(6, 4, 3, 3).to(dtype), r(4).to(dtype)
    for kw in ({"stride": 2, "padding": 1, "output_padding": 1}, {"stride": 1, "dilation": 2}):
        out = F.conv_transpose2d(x, w, b, **kw)
        rep = rk.compare(out, "conv_transpose2d", x, w, b, **kw)
        assert rep.verdict in ("exact", "rounding"), str(rep)
    bad = out.clone()
    bad[:, 1] = F.conv_transpose2d(x, w, None, **kw)[:, 1]  # channel 1 without its bias
    assert rk.compare(bad, "conv_transpose2d", x, w, b, **kw).verdict == "mismatch"


def _envelope_decision(actual, centre_p):
    """decide_envelope on four float32 elements: the reference 0 with rounding's window [-1, 1] each,
    and an fp16 hypothesis whose first centre is ``centre_p`` (the others 0), with windows of 1; the
    output's other elements lie in both windows."""
    from refkern.accumulate.formats import FLOAT32
    from refkern.analysis.verdict_envelope import decide_envelope

    ref, one = np.zeros(4), np.ones(4)
    hyps = [("rounding", None, ref, one), ("fp16", "fp16", np.array([centre_p, 0.0, 0.0, 0.0]), one)]
    return decide_envelope(np.array([actual, 0.5, -0.5, 0.0]), ref, hyps, FLOAT32)


def test_a_precision_is_named_only_where_its_window_and_roundings_are_disjoint():
    # windows [-1, 1] and [0.5, 2.5] overlap: an element at 1.625 is what a bug just beyond rounding gives too
    d = _envelope_decision(1.625, 1.5)
    assert (d.verdict, d.precision) == ("mismatch", None)
    assert any("cannot be told apart" in s["text"] for s in d.structure)
    # [-1, 1] and [2, 4] are disjoint (1 + 1 < 3): fp16 predicted the element leaves rounding's window, and where
    d = _envelope_decision(3.25, 3.0)
    assert (d.verdict, d.precision) == ("reduced-precision", "fp16")
    # at the edge, 1 + 1 = 2: not disjoint, a bug at 2.5 is only 1.5 windows from the reference
    assert _envelope_decision(2.5, 2.0).verdict == "mismatch"
