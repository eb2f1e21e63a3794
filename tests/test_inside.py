"""The statistical test inside the worst-case envelope (refkern.analysis.inside, refkern.analysis.noise):
the bugs of the verdict-power issue are mismatches, torch's own kernels are not, the power is finite,
and the scale's formulas are pinned by hand."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT32
from refkern.analysis import noise as nz
from refkern.analysis import noise_attention as nz_att
from refkern.analysis.noise_rows import RowShared, keys
from refkern.analysis.noise_store import GRAIN, thread_members

torch = pytest.importorskip("torch")
F = torch.nn.functional
U = 2.0**-24  # float32's unit roundoff, the working unit of fp16/bf16/fp32 results
ETA2 = 2.0**-300  # (half float32's smallest subnormal, 2**-150) squared


def _v(rep):
    return rep.verdict


# ------------------------------------------------------------------ constants and formulas, by hand


def test_constants_by_hand():
    assert nz.RSQRT_ULPS == 2
    assert nz_att.BLOCK == 32
    assert nz_att.DOT_BLOCK == 4
    assert nz.TINY == pytest.approx(2.0**-300, abs=0)


def test_sum_scale_by_hand():
    """sum([1, 2, 3]) in float32: prefix sums 3, 6 (9 + 36 = 45), suffix sums 5, 6 (25 + 36 = 61):
    S**2 = 61; stores 2 (u 6)**2 + 2 eta**2; 3 + 4 underflow terms."""
    x = np.array([1.0, 2.0, 3.0], np.float32)
    v = nz.noise("sum", {"x": x}, np.float64(6.0), FLOAT32, 5.0).var
    assert float(v) == pytest.approx(61 * U**2 + 72 * U**2 + 9 * ETA2, abs=0)


def test_layer_norm_scale_by_hand():
    """layer_norm of the row [-1, 1], eps 0, no weight: mean 0, var 1, r 1. M2's two-pass terms
    5 sum d**4 + max(LTR, RTL) partial sums of squares = 10 + 4, Welford's running mean 2 u: 4 u**2,
    so 18 u**2; var: 18/4 + 1 = 5.5 u**2; r relative: (5.5 + 1) / 4 + (2 * 2)**2 = 17.625 u**2;
    element 0 (t = y = -1): 17.625 + 3 + 1 = 21.625 u**2, stores 2 u**2 + (2 + 6) eta**2."""
    x = np.array([[-1.0, 1.0]], np.float32)
    v = nz.noise("layer_norm", {"input": x, "normalized_shape": (2,), "eps": 0.0}, np.array([[-1.0, 1.0]]), FLOAT32,
                 5.0).var  # fmt: skip
    assert v[0, 0] == pytest.approx(23.625 * U**2 + 8 * ETA2, abs=0)


def test_tiny_float64_is_scaled():
    """A float64 sum of values near 2**-1022: the variances would underflow; the scale is computed on
    the values times 2**600 and a correct result is rounding, a doubled one a mismatch."""
    x = np.full(16, 2.0**-1020) * np.linspace(1, 2, 16)
    good = np.sum(x)
    assert _v(rk.compare(np.float64(good), "sum", x)) in ("exact", "rounding")
    assert _v(rk.compare(np.float64(good * 1.5), "sum", x)) == "mismatch"


# ------------------------------------------------------------------ the cases


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [64, 1024, 4096])
def test_norm_bugs_in_half_are_mismatches(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(8, n, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    good = F.layer_norm(x, (n,), w, b)
    assert _v(rk.compare(good, "layer_norm", x, (n,), w, b)) in ("exact", "rounding")
    for bug in ((good.float() * 1.1).to(dtype), F.layer_norm(x, (n,), w, None)):
        assert _v(rk.compare(bug, "layer_norm", x, (n,), w, b)) == "mismatch"
    # Gemma-style weights: the output uses 1 + W; bugs use W + 2 or W alone
    W = (0.1 * torch.randn(n, generator=g)).to(dtype)
    good = F.rms_norm(x, (n,), (1 + W.float()).to(dtype))
    assert _v(rk.compare(good, "rms_norm", x, (n,), (1 + W.float()).to(dtype))) in ("exact", "rounding")
    for bug in (F.rms_norm(x, (n,), (2 + W.float()).to(dtype)), F.rms_norm(x, (n,), W)):
        assert _v(rk.compare(bug, "rms_norm", x, (n,), (1 + W.float()).to(dtype))) == "mismatch"


@pytest.mark.parametrize("S", [64, 1024])
def test_attention_scale_bug_bf16(S):
    g = torch.Generator().manual_seed(S)
    q = torch.randn(1, 2, 32, 64, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, S, 64, generator=g).bfloat16() for _ in range(2))
    good = F.scaled_dot_product_attention(q, k, v)
    assert _v(rk.compare(good, "scaled_dot_product_attention", q, k, v)) in ("exact", "rounding")
    bad = (good.double() * 1.1).bfloat16()
    assert _v(rk.compare(bad, "scaled_dot_product_attention", q, k, v)) == "mismatch"


def test_attention_fp32_one_percent():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 16, 64, generator=g)
    k, v = (torch.randn(1, 1, 4096, 64, generator=g) for _ in range(2))
    good = F.scaled_dot_product_attention(q, k, v)
    rep = rk.compare(good, "scaled_dot_product_attention", q, k, v)
    assert rep.verdict in ("exact", "rounding")
    assert math.isfinite(rep.detectable["element"]["median_ulps"])
    assert _v(rk.compare(good * 1.01, "scaled_dot_product_attention", q, k, v)) == "mismatch"


def test_sums_scaled_by_one_tenth_more():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(2))
    assert _v(rk.compare(x.sum(), "sum", x)) in ("exact", "rounding")
    assert _v(rk.compare(x.sum() * 1.1, "sum", x)) == "mismatch"
    for dt in (torch.bfloat16, torch.float16):
        xd = x.to(dt)
        for op in ("sum", "var"):
            good = getattr(xd, op)()
            assert _v(rk.compare(good, op, xd)) in ("exact", "rounding")
            assert _v(rk.compare((good.double() * 1.1).to(dt), op, xd)) == "mismatch"


def test_stagnating_sequential_mean_is_named():
    """pytorch#38716: a float32 running sum of 4e7 values in [0, 1) stops growing at 2**24 (each term is
    below half its ulp, 1, from there on)."""
    x = torch.rand(40_000_000, generator=torch.Generator().manual_seed(3))
    seq = np.empty(1)
    from refkern.analysis.inside import _sequential32

    _sequential32(x.numpy().reshape(1, -1), seq)
    bad = torch.tensor(np.float32(seq[0]) / np.float32(x.numel()))
    rep = rk.compare(bad, "mean", x)
    assert rep.verdict == "mismatch"
    assert any("sequential float32 running sum" in n for n in rep.notes)
    assert _v(rk.compare(x.mean(), "mean", x)) in ("exact", "rounding")


def test_catastrophic_layer_norm_of_one_feature():
    """pytorch#188372: normalized_shape=(1,) in bfloat16 must return the bias (3); 11 is a mismatch."""
    x = torch.tensor([[1000.0], [2000.0]]).bfloat16()
    w, b = torch.tensor([1.0]).bfloat16(), torch.tensor([3.0]).bfloat16()
    assert _v(rk.compare(torch.full((2, 1), 3.0).bfloat16(), "layer_norm", x, (1,), w, b)) == "exact"
    assert _v(rk.compare(torch.full((2, 1), 11.0).bfloat16(), "layer_norm", x, (1,), w, b)) == "mismatch"


def test_offset_rows_are_never_a_bug():
    """torch's CPU layer_norm on rows of mean 300 and spread 1 (the folded form loses about 8 bits)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 1024, generator=g) + 300
    w, b = torch.randn(1024, generator=g), torch.randn(1024, generator=g)
    for dt in (torch.float32, torch.bfloat16):
        args = (x.to(dt), (1024,), w.to(dt), b.to(dt))
        assert _v(rk.compare(F.layer_norm(*args), "layer_norm", *args)) in ("exact", "rounding", "reduced-precision")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_kernels_are_no_false_alarm(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 96, generator=g).to(dtype)
    xt = x.transpose(1, 2)
    w, b = (torch.randn(96, generator=g).to(dtype) for _ in range(2))
    cases = [
        (F.layer_norm(x, (96,), w, b), "layer_norm", (x, (96,), w, b), {}),
        (F.rms_norm(x, (96,), w), "rms_norm", (x, (96,), w), {}),
        (F.softmax(x, -1), "softmax", (x, -1), {}),
        (F.log_softmax(xt, 1), "log_softmax", (xt, 1), {}),
        (xt.sum(1), "sum", (xt,), {"dim": 1}),
        (x.mean(-1), "mean", (x,), {"dim": -1}),
        (x.var(-1), "var", (x,), {"dim": -1}),
        (x.cumsum(-1), "cumsum", (x, -1), {}),
        (F.group_norm(x.reshape(4, 6, 96), 3), "group_norm", (x.reshape(4, 6, 96), 3), {}),
    ]
    for out, op, args, kw in cases:
        rep = rk.compare(out, op, *args, **kw)
        assert rep.verdict in ("exact", "rounding"), (op, str(rep))
        assert math.isfinite(rep.detectable["element"]["median_ulps"]), op


# ------------------------------------------------------------------ the GEMMs' scale test


def test_scale_test_by_hand():
    from refkern.analysis.verdict import _scale_failure

    r, v, keep, y = np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.array([True, True]), np.array([1.0, 1.0])
    (g,) = _scale_failure(r, v, keep, y, 1.0)  # T = 2 / sqrt(2) = 1.4142 > 1; s = sum r y / sum y**2 = 1
    assert g["z"] == pytest.approx(math.sqrt(2.0), rel=1e-15, abs=0)
    assert g["mean"] == pytest.approx(1.0, rel=1e-15, abs=0)
    assert g["ax"] is None and g["mask"].all()
    assert _scale_failure(r, v, keep, y, 1.5) == []  # within sqrt(2) < 1.5
    assert _scale_failure(np.array([1.0, -1.0]), v, keep, y, 0.1) == []  # no correlation with the output


def test_scale_test_weights_by_hand():
    """Unequal variances: r = s y with s = 1, y = [1, 2], sigma**2 = [1, 4]. The weights y / sigma**2 = [1, 1/2]:
    T = (1 + 1) / sqrt(1 + 4 / 4) = sqrt(2) (the weights y would give 5 / sqrt(17) = 1.21); the slope
    sum r w / sum y w = 2 / 2 = 1; with 2 more of shared variance, T = 2 / sqrt(4) = 1."""
    from refkern.analysis.verdict import _scale_failure

    r, v, keep, y = np.array([1.0, 2.0]), np.array([1.0, 4.0]), np.array([True, True]), np.array([1.0, 2.0])
    (g,) = _scale_failure(r, v, keep, y, 1.3)
    assert g["z"] == pytest.approx(math.sqrt(2.0), rel=1e-15, abs=0)
    assert g["mean"] == pytest.approx(1.0, rel=1e-15, abs=0)
    (g,) = _scale_failure(r, v, keep, y, 0.9, coherent=lambda w: 2.0)
    assert g["z"] == pytest.approx(1.0, rel=1e-15, abs=0)
    assert _scale_failure(r, v, keep, y, 1.1, coherent=lambda w: 2.0) == []


def test_bf16_matmul_scaled_by_1_05_is_a_mismatch():
    """Issue 24: a bfloat16 matmul (K = 4096, 64 x 64 outputs) scaled by 1.05 was named bf16 accumulation;
    the scale test with the weights y / sigma**2 refuses that model (T = 7.1 against lam_grp = 6.40)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 4096, generator=g).bfloat16()
    b = torch.randn(4096, 64, generator=g).bfloat16()
    rep = rk.compare(((a @ b).double() * 1.05).bfloat16(), "matmul", a, b)
    assert rep.verdict == "mismatch"
    assert any("a scale error, not accumulator noise" in t for t in rep.notes)


def test_a_scale_error_is_not_fp16_accumulation():
    """A float16 matmul over K = 4096 scaled by 1.01 was named fp16 accumulation (its noise explains each
    element); a genuine fp16 left-to-right accumulation still is."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 4096, generator=g).half(), torch.randn(4096, 64, generator=g).half()
    good = a @ b
    assert _v(rk.compare(good, "matmul", a, b)) in ("exact", "rounding")
    rep = rk.compare((good.float() * 1.01).half(), "matmul", a, b)
    assert rep.verdict == "mismatch" and "a scale error, not accumulator noise" in rep.notes[0]
    A, B = a.float().numpy(), b.float().numpy()
    acc = np.zeros((128, 64), np.float32)
    for k in range(4096):  # fp16 running sums, left to right
        acc = (acc + A[:, k : k + 1] * B[k : k + 1, :]).astype(np.float16).astype(np.float32)
    rep = rk.compare(torch.from_numpy(acc).half(), "matmul", a, b)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp16")


@pytest.mark.parametrize("K", [64, 576, 2304])
def test_compositions_of_precisions_are_named(K):
    """A custom kernel that rounds inputs and bias to fp16 and accumulates in float64 (a float32 result)
    is fp16: it was a mismatch at K <= 576 and tf32 above."""
    g = torch.Generator().manual_seed(K)
    x, W, b = torch.randn(32, K, generator=g), torch.randn(48, K, generator=g), torch.randn(48, generator=g)
    out = F.linear(x.half().double(), W.half().double(), b.half().double()).float()
    rep = rk.compare(out, "linear", x, W, b)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp16")


@pytest.mark.parametrize("K", [576, 2048])
def test_autocast_product_then_fp32_bias_is_named(K):
    """pytorch#137080: under fp16 autocast, x @ W.T is stored in fp16 and the fp32 bias added after; the model
    with the straddle rule names it (fp16, bf16 alike), and the same with the bias dropped, or the product 1%
    off, is a mismatch (the variance-only epilogue model had explained a dropped bias at K = 2048)."""
    g = torch.Generator().manual_seed(7)
    x, W, b = torch.randn(32, K, generator=g), torch.randn(48, K, generator=g), torch.randn(48, generator=g)
    for dt, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        with torch.autocast("cpu", dtype=dt):
            p = x @ W.T
        rep = rk.compare(p.float() + b, "linear", x, W, b)
        assert (rep.verdict, rep.precision) == ("reduced-precision", name)
        assert "product stored in" in rep.model
        if not (dt == torch.bfloat16 and K == 2048):  # there bf16 accumulation's own noise (pairwise, ~2% of the
            # outputs of ~45) is as large as the bias: it explains the dropped bias (5x the spread, a known limit)
            assert rk.compare(p.float(), "linear", x, W, b).verdict == "mismatch"
        assert rk.compare(p.float() * 1.01 + b, "linear", x, W, b).verdict == "mismatch"


def test_product_then_bias_straddle_by_hand():
    """The product 1 + 2**-11 - 2**-24 lies 2**-24 from fp16's midpoint between 1 and 1 + 2**-10, within lam
    sigma_a (sigma_a = (1 + gamma_1) u sqrt(2) for one term of magnitude 1): the scale widens by 2 ulp**2 =
    2**-19; 1 + 2**-12 lies 2**-12 from it: the rounding model's scale alone."""
    from refkern.accumulate.formats import FLOAT16
    from refkern.analysis.hypotheses import Model, _product_then_bias, rounding_variance

    m = Model("fp16 autocast product, fp32 bias", "fp16", "", FLOAT32, FLOAT32, (FLOAT16, 0, False), product=FLOAT16)
    p = np.array([1.0 + 2.0**-11 - 2.0**-24, 1.0 + 2.0**-12])
    mag, b = np.ones(2), np.zeros(2)
    c, var = _product_then_bias(p, mag, b, m, 1, 5.0)
    assert c.tolist() == [1.0, 1.0]
    rv = rounding_variance(m, 1, mag, c)
    assert var.tolist() == [rv[0] + 2.0 * 2.0**-20, rv[1]]


def test_tiny_float64_variance_is_scaled_without_overflow():
    """var is of degree 2: its scale is computed on values times 2**500 (results times 2**1000), not
    2**600 (2**1200 overflows): it raised OverflowError on bench_verdict's tiny float64 data."""
    x = np.random.default_rng(0).standard_normal((4, 300)) * 1e-160
    good = torch.from_numpy(x).var(-1)
    assert _v(rk.compare(good, "var", x, -1)) in ("exact", "rounding")
    assert _v(rk.compare(good * 1.1, "var", x, -1)) == "mismatch"
    x = x * 1e-150  # near 1e-310: the squares underflow; the variance is 0 exactly as float64 holds it
    assert _v(rk.compare(torch.from_numpy(x).var(-1), "var", x, -1)) in ("exact", "rounding")


def test_noise_is_not_an_output_stored_in_half():
    """Noise of 1e-4 relative on every element of a float32 softmax was named 'fp16 output': the envelope
    held for rounding, so the precision's storage was not taken from its envelope fit (no fp16 grid was
    required, and its window held the noise). A value off fp16's grid is no fp16 output."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 1000, generator=g)
    good = F.softmax(x, -1)
    noise = 1.0 + 1e-4 * torch.randn(good.shape, generator=g)
    assert _v(rk.compare(good * noise, "softmax", x, -1)) == "mismatch"
    for dt, p in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        rep = rk.compare(good.to(dt).float(), "softmax", x, -1)
        assert (rep.verdict, rep.precision) == ("reduced-precision", p)


def test_sequential_welford_drift_by_hand():
    """The float32 row [0, 0, 1] (mean 1/3, var 2/9, eps 0): its sequential Welford means drift by at most
    D = 2 / (3 2**25) (right to left, 1/2 - fl32(1/6) is a tie rounded to even: noise_rows.welford_drift);
    r**2 = 9/2, w = 1: the member's (r D)**2 on each element is 2**-49 (the float64 mean holds D to 1e-9)."""
    from refkern.analysis._envelope_ops import layout

    x = np.array([[0.0, 0.0, 1.0]], np.float32)
    args = {"input": x, "normalized_shape": (3,), "weight": None, "bias": None, "eps": 0.0}
    lay = layout("layer_norm", args, x.shape)
    ref = rk.layer_norm(x, (3,), eps=0.0)
    _, _, drift_bound, drift, _ = nz._norm(lay, "layer_norm", lay.rows(np.asarray(ref), np.float32), 2.0**-24,
                                           FLOAT32, 0.0)  # fmt: skip
    B = drift_bound()
    assert B.tolist() == pytest.approx([2.0 / (3.0 * 2.0**25)], rel=4e-9, abs=0)
    assert drift(B)[0].tolist() == pytest.approx([2.0**-49] * 3, rel=4e-9, abs=0)


def test_sequential_welford_on_quantized_offset_rows_is_rounding():
    """bf16 rows of mean 300 and spread 1 (three values: 298, 300, 302) over 4096 features: a float32
    sequential Welford mean drifts about 700 float32 ulps (its roundings are not mean-independent on that
    grid); the folded form on those statistics, rounded to bf16, is rounding and named; the same output
    x 1.1 is a mismatch."""
    g = torch.Generator().manual_seed(0)
    x = (300 + torch.randn(4, 4096, generator=g, dtype=torch.float64)).bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16()
    b = (0.1 * torch.randn(4096, generator=g)).bfloat16()
    X = x.float().numpy()
    m = np.zeros(4, np.float32)
    for i in range(4):  # sequential Welford, float32
        mk = np.float32(0.0)
        for k in range(4096):
            mk = np.float32(mk + np.float32(X[i, k] - mk) / np.float32(k + 1))
        m[i] = mk
    d = X - m[:, None]
    var = (d * d).mean(axis=1, dtype=np.float32)
    r = (1 / np.sqrt(var + np.float32(1e-5))).astype(np.float32)
    rw = r[:, None] * w.float().numpy()
    y = X * rw + (b.float().numpy() - m[:, None] * rw)  # the folded form
    out = torch.from_numpy(y.astype(np.float32)).bfloat16()
    rep = rk.compare(out, "layer_norm", x, (4096,), w, b)
    assert rep.verdict == "rounding", rep
    assert any("sequential Welford" in t for t in rep.notes)
    assert rk.compare((out.double() * 1.1).bfloat16(), "layer_norm", x, (4096,), w, b).verdict == "mismatch"


def test_row_coherent_by_hand():
    """Two rows of 3, shared variances 1 and 4, loadings 1: (A**2 - sum a**2) per row, 36 - 14 = 22 and
    4 (9 - 3) = 24."""
    rows = lambda w: np.asarray(w, np.float64).reshape(2, 3)  # noqa: E731
    coherent = RowShared(rows, lambda r: np.reshape(r, -1), 2, [(np.array([1.0, 4.0]), np.ones((2, 3)))])
    w = np.array([1.0, 2.0, 3.0, 1.0, 1.0, 1.0])
    assert coherent.per_row(w).tolist() == pytest.approx([22.0, 24.0], abs=0)
    assert coherent(w) == pytest.approx(46.0, abs=0)
    assert coherent.bound(w) is None and coherent.grouped(w, np.ones(6), np.arange(2)) is None
    assert RowShared(rows, None, 2, [(np.array([np.inf, 0.0]), np.ones((2, 3)))])(np.ones(6)) == np.inf  # no test


def test_row_bounds_and_equal_keys_by_hand():
    """A bounded shared error (B = 0.5, loadings 1, 2, 3 on row 0) moves sum e w by at most B |sum l w| =
    0.5 |1 + 4 + 9| = 7 on w = (1, 2, 3). Keys (7, 7, 9) with sigma**2 = (1, 4, 9): the first two are taken
    fully correlated, (1*1 + 2*2)**2 + (3*3)**2 - (1 + 16 + 81) = 25 + 81 - 98 = 8."""
    rows = lambda w: np.asarray(w, np.float64).reshape(1, 3)  # noqa: E731
    c = RowShared(rows, None, 1, bounds=[(np.array([0.5]), np.array([[1.0, 2.0, 3.0]]))],
                     keys=lambda: np.array([[7, 7, 9]], np.int64))  # fmt: skip
    w = np.array([1.0, 2.0, 3.0])
    assert c.bound(w).tolist() == pytest.approx([7.0], abs=0)
    assert c.grouped(w, np.array([1.0, 4.0, 9.0]), np.array([0])).tolist() == pytest.approx([8.0], abs=0)


def test_keys_by_hand():
    """The significand keys of 1.5, 3.0 and -0.75 are equal (0x400000 in float32), 1.25's is 0x200000."""
    X = np.array([[1.5, 3.0, -0.75, 1.25]], np.float32)
    assert keys(X, significand=True).tolist() == [[0x400000, 0x400000, 0x400000, 0x200000]]
    assert len(set(keys(X)[0].tolist())) == 4


def test_thread_partials_by_hand():
    """n = 65537 = 2 GRAIN + 1 allows T = 2 and 3: chunks of 32769 (sums 32769 and 32768) or of 21846
    (21846, 21846, 21845) of ones. Stored in bf16 (spacing 256 at 32768, 128 at 21846): 32768 + 32768 and
    3 x 21888 (21846 is 86 above 21760, past the midpoint), the emulated members' totals."""
    from refkern.accumulate.formats import BFLOAT16

    assert GRAIN == 32768
    X = np.ones((1, 2 * GRAIN + 1))
    xh, _, _ = thread_members(X, "sum", BFLOAT16, 7.0)
    assert xh[:, 0].tolist() == pytest.approx([65536.0, 65664.0], abs=0)


def test_partial_spacing_by_hand():
    """The spacing a thread's stored partial may move by (noise_store._spacing), float16 (prec 11, emin
    -14): 2**-10 next to 1 and 1.5, 2**-9 next to 2 (the larger side), 2**-24 for a subnormal and at 0
    (frexp(0) gives the exponent 0: 0 was given 1/2's spacing, 2**-11)."""
    from refkern.accumulate.formats import FLOAT16
    from refkern.analysis.noise_store import _spacing

    got = _spacing(np.array([1.0, 1.5, 2.0, 3 * 2.0**-24, 0.0, -0.0, 9.67e-5]), FLOAT16).tolist()
    assert got == pytest.approx([2.0**-10, 2.0**-10, 2.0**-9, 2.0**-24, 2.0**-24, 2.0**-24, 2.0**-24], abs=0)


def test_a_float16_mean_of_1e7_scaled_by_1_1_is_a_mismatch():
    """torch's CPU float16 mean of 1e7 randn values (exact 5.53e-5, a float16 subnormal; bench_verdict's
    power case, seed 0): some thread counts' stored partials round to 0, and with 0's spacing taken as 1/2's
    one member's scale was 8192 ulps, so the output times 1.1 (93 ulps, 5.7x the spread of correct kernels)
    was rounding."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, 10_000_000, generator=g, dtype=torch.float64).to(torch.float16)
    y = torch.mean(x, -1)
    assert _v(rk.compare(y, "mean", x, -1)) in ("exact", "rounding")
    assert _v(rk.compare((y.double() * 1.1).to(torch.float16), "mean", x, -1)) == "mismatch"


def test_straddle_by_hand():
    """bf16 (prec 8): a = 1 rounds [1 - 2**-9, 1 + 2**-8] (below a power of two the spacing halves). The
    exact 1 + 2**-8 + 2**-12 lies 2**-12 beyond it: z = 2**-12 / 2**-14 = 4 with sigma 2**-14; err 2**-13
    halves it (z 2), err 2**-12 covers it (z 0); -1 mirrors; a = 0 rounds [-2**-134, 2**-134]."""
    from refkern.accumulate.formats import BFLOAT16
    from refkern.analysis.noise_store import straddle_z as _straddle_z

    def z(a, xh, err, pre):
        out = np.empty(1)
        _straddle_z(np.array([a]), np.array([xh]), np.array([err]), np.array([pre]), BFLOAT16.prec, BFLOAT16.emin, out)
        return out[0]

    x = 1 + 2.0**-8 + 2.0**-12
    assert z(1.0, x, 0.0, 2.0**-28) == pytest.approx(4.0, abs=0)
    assert z(1.0, x, 2.0**-13, 2.0**-28) == pytest.approx(2.0, abs=0) and z(1.0, x, 2.0**-12, 2.0**-28) == 0.0
    assert z(-1.0, -x, 0.0, 2.0**-28) == pytest.approx(4.0, abs=0)
    assert z(1.0, 1 - 2.0**-9 - 2.0**-12, 0.0, 2.0**-28) == pytest.approx(4.0, abs=0)
    assert z(0.0, 2.0**-134, 0.0, 1.0) == 0.0 and z(0.0, 2.0**-133, 0.0, 2.0**-268) == pytest.approx(1.0, abs=0)


def test_a_softmax_scale_error_is_seen_by_the_scale_test():
    """The rows' shared errors (the sum D, its rescales) enter the scale test as coherent variance: a whole
    softmax scaled by 1 + 16 u is a mismatch although every element passes its own test (the largest at 0.53 of
    its threshold on the rest of D's orders, noise_softmax_chains)."""
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    y = torch.softmax(x, -1)
    assert rk.compare(y, "softmax", x, -1).verdict == "rounding"
    rep = rk.compare(y * (1 + 16 * 2.0**-24), "softmax", x, -1)
    assert rep.verdict == "mismatch" and rep.max_prob_ratio < 1.0
    assert any("a scale error" in n for n in rep.notes)


def test_row_bound_coherent_by_hand():
    """Rows of 2, sigma (1, 2) and (3, 4), w = (1, -1, 2, 1): per row (sum sigma |w|)**2 - sum sigma**2 w**2:
    9 - 5 = 4 and 100 - 52 = 48."""
    coherent = RowShared(lambda w: np.asarray(w).reshape(2, 2), None, 2, sigma=np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert coherent.per_row(np.array([1.0, -1.0, 2.0, 1.0])).tolist() == pytest.approx([4.0, 48.0], abs=0)
    assert coherent(np.array([1.0, -1.0, 2.0, 1.0])) == pytest.approx(52.0, abs=0)


def test_an_attention_scale_error_is_seen_by_the_scale_test():
    """A query's outputs may share errors in any way: the scale test takes them at their largest within a row,
    and still sees a whole fp32 attention scaled by 1 + 8 u far below any element's threshold."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 256, 32, generator=g) for _ in range(3))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert rk.compare(o, "scaled_dot_product_attention", q, k, v).verdict == "rounding"
    rep = rk.compare(o * (1 + 8 * 2.0**-24), "scaled_dot_product_attention", q, k, v)
    assert rep.verdict == "mismatch" and rep.max_prob_ratio < 0.5
    assert any("a scale error" in n for n in rep.notes)


def test_welford_member_only_on_quantized_rows():
    # the sequential Welford member of the norms' family needs values that repeat (its roundings then drift
    # together): at most half as many distinct values as elements in some row
    from refkern.analysis.noise import _quantized

    assert _quantized(np.array([[1.0, 1.0, 2.0, 2.0]]))  # 2 distinct of 4
    assert not _quantized(np.array([[1.0, 2.0, 3.0, 3.0]]))  # 3 of 4
    g = np.random.default_rng(0)
    x32 = (300 + g.standard_normal((4, 4096))).astype(np.float32).astype(np.float64)
    xbf = torch.from_numpy(x32).to(torch.bfloat16).double().numpy()  # three or so values per row
    assert not _quantized(x32) and _quantized(xbf)


def test_fused_norm_sums_equal_the_row_layout_sums():
    """The one-pass sums of a norm's scale tests (noise_rows.norm_sums) are the numpy sums over its rows
    with the loadings formed as arrays (RowShared.stats without ``fused``), to rounding of the order."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 40, generator=g)
    w, b = torch.randn(40, generator=g), torch.randn(40, generator=g)
    args = {"input": x, "normalized_shape": (40,), "weight": w, "bias": b, "eps": 1e-5}
    ref = np.asarray(rk.layer_norm(x, (40,), w, b), np.float64)
    n = nz.noise("layer_norm", args, ref.astype(np.float32), FLOAT32, 5.0)
    coh = n.coherent
    assert coh.fused is not None
    rng = np.random.default_rng(0)
    r = rng.standard_normal(ref.shape) * np.sqrt(n.var)
    keep = rng.random(ref.shape) > 0.1
    vk = np.where(keep, n.var, 0.0)
    r = np.where(keep, r, 0.0)
    fused = coh.stats(r, vk, keep, ref)
    coh.fused = None
    plain = coh.stats(r, vk, keep, ref)
    for f, p in zip(fused[:5], plain[:5]):
        assert np.allclose(f, p, rtol=1e-12, atol=0)
    assert fused[5].shape == (2, 40) and plain[5] is None


def test_held_norm_sums_equal_the_residual_sums():
    """On a result whose every element passes, the sums from the values as held (RowShared.held_stats, the
    fast path's) are those from the residual arrays (RowShared.stats), to rounding of the order."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, 48, generator=g)
    w = torch.randn(48, generator=g)
    out = torch.nn.functional.rms_norm(x, (48,), w, 1e-6)
    args = {"input": x, "normalized_shape": (48,), "weight": w, "eps": 1e-6}
    ref = np.asarray(rk.rms_norm(x, (48,), w, 1e-6), np.float32)
    n = nz.noise("rms_norm", args, ref, FLOAT32, 5.0)
    a, c = out.numpy(), ref
    held = n.coherent.held_stats(a, c, n.var)
    r = a.astype(np.float64) - c
    keep = np.ones(c.shape, bool)
    plain = n.coherent.stats(r, n.var, keep, c.astype(np.float64))
    for h, p in zip(held[:5], plain[:5]):
        assert np.allclose(h, p, rtol=1e-12, atol=1e-300)


def test_quick_path_row_sums_equal_the_residual_sums():
    """The quick path (inside._healthy, row by row with a norm's fused parts) forms the rows' scale sums in the
    same pass as the element and group tests: they are those from the residual arrays (RowShared.stats,
    the loadings formed as arrays), to rounding of the order, and its element and group verdicts are
    _test's."""
    from refkern.analysis.hypotheses import Model
    from refkern.analysis.inside import _healthy, _test
    from refkern.analysis.stats import level

    g = torch.Generator().manual_seed(13)
    x = torch.randn(64, 48, generator=g)
    w, b = torch.randn(48, generator=g), torch.randn(48, generator=g)
    out = torch.nn.functional.layer_norm(x, (48,), w, b, 1e-5)
    args = {"input": x, "normalized_shape": (48,), "weight": w, "bias": b, "eps": 1e-5}
    ref = np.asarray(rk.layer_norm(x, (48,), w, b, 1e-5), np.float32)
    n = nz.noise("layer_norm", args, ref, FLOAT32, 5.0)
    a, c = out.numpy(), ref
    m = Model("rounding", None, "r", FLOAT32, FLOAT32)
    lam_el, lam_grp = level(a.size), level(2 * 48 + 1)
    quick = _healthy(m, a, c, n.var, lam_el, lam_grp, (1,), 1.0, FLOAT32, n.coherent.fused.parts)
    assert quick is not None and quick.held_rows is not None
    r = a.astype(np.float64) - c
    keep = np.ones(c.shape, bool)
    plain = n.coherent.stats(r, n.var, keep, c.astype(np.float64))
    for h, p in zip(quick.held_rows, plain[:5]):
        assert np.allclose(h, p, rtol=1e-12, atol=1e-300)
    full = _test(m, a.astype(np.float64), c.astype(np.float64), n.var, np.zeros(c.shape, bool), lam_el, lam_grp,
                 ("row", "col"), (1,))  # fmt: skip
    assert full.explains and np.allclose(quick.z, full.z, rtol=1e-15, atol=0)
    bad = a.copy()
    bad[:, 5] += 0.05  # one column off: its group fails, and the quick path declines
    assert _healthy(m, bad, c, n.var, lam_el, lam_grp, (1,), 1.0, FLOAT32, n.coherent.fused.parts) is None


def test_a_precision_of_a_float32_sum_is_judged_on_its_emulated_chains():
    """A float32 sum of 2e5 randn values whose result is 3 sigma (the scalar loop's scale, u sqrt(sum P_k**2))
    from the bf16 inputs' exact sum, toward the exact result: 62 sigma from it, a bug. The bf16 hypothesis's
    scale was the worst order's while rounding's element test emulates the long chains: it was named bf16;
    judged on the bf16 inputs' own emulated chains it is a mismatch. The same inputs summed by torch after
    rounding them to bf16 stay reduced-precision (bf16), and torch's own sum is not a false alarm."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 200_000, generator=g, dtype=torch.float64).float()
    xd = x.double().numpy()[0]
    ex, c = float(xd.sum()), x.to(torch.bfloat16).double().sum().item()
    P = np.cumsum(xd)
    s = 2.0**-24 * math.sqrt(float(np.sum(P * P)))
    assert abs(c - ex) / s > 50
    bug = torch.tensor([c + 3.0 * s * math.copysign(1.0, ex - c)], dtype=torch.float64).float()
    assert _v(rk.compare(bug, "sum", x, -1)) == "mismatch"
    rep = rk.compare(x.to(torch.bfloat16).float().sum(-1), "sum", x, -1)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "bf16")
    assert _v(rk.compare(torch.sum(x, -1), "sum", x, -1)) in ("exact", "rounding")
