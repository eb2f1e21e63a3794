"""sum/mean/var/std/cumsum and the norms: bit for bit against the mpmath truth, torch parity,
the verdict on torch's own outputs and on injected bugs, and the constants pinned by hand."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern import truth
from refkern.accumulate import dd, ziv
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from refkern.kernels import norm

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _same(a, b):
    a = np.asarray(a.float().numpy() if hasattr(a, "numpy") and a.dtype == torch.bfloat16 else a, np.float64)
    b = np.asarray(b.float().numpy() if hasattr(b, "numpy") and b.dtype == torch.bfloat16 else b, np.float64)
    eq = (a == b) | (np.isnan(a) & np.isnan(b))
    return bool(np.all(eq & (np.signbit(a) == np.signbit(b)) | np.isnan(a)))


def _data(kind, shape, dtype, g):
    if kind == "randn":
        x = torch.randn(shape, generator=g, dtype=torch.float64)
    elif kind == "offset":  # mean far above the spread: the cancellation a one-pass variance loses
        x = 1e3 + torch.randn(shape, generator=g, dtype=torch.float64) * 1e-2
    elif kind == "wide":  # exponents over a wide range
        x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp(torch.randn(shape, generator=g) * 6)
    else:  # few distinct values: ties and exact results
        x = torch.round(torch.randn(shape, generator=g, dtype=torch.float64) * 2) / 2
    return x.clamp(-6e4, 6e4).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["randn", "offset", "wide", "halves"])
def test_bit_identical_to_truth(dtype, kind):
    g = torch.Generator().manual_seed(hash((str(dtype), kind)) % 2**31)
    x = _data(kind, (3, 4, 7), dtype, g)
    w, b = _data("randn", (7,), dtype, g), _data("randn", (7,), dtype, g)
    for dim in (None, 1, (0, 2), -1):
        assert _same(rk.sum(x, dim), truth.sum(x, dim))
        assert _same(rk.mean(x, dim), truth.mean(x, dim))
        assert _same(rk.var(x, dim), truth.var(x, dim))
        assert _same(rk.std(x, dim, correction=0), truth.std(x, dim, correction=0))
    assert _same(rk.cumsum(x, 1), truth.cumsum(x, 1))
    assert _same(rk.layer_norm(x, (7,), w, b), truth.layer_norm(x, (7,), w, b))
    assert _same(rk.layer_norm(x, (4, 7), eps=0.0), truth.layer_norm(x, (4, 7), eps=0.0))
    assert _same(rk.rms_norm(x, (7,), w), truth.rms_norm(x, (7,), w))
    x4 = x.reshape(3, 4, 7, 1)
    assert _same(rk.group_norm(x4, 2, w[:4], b[:4]), truth.group_norm(x4, 2, w[:4], b[:4]))
    rm, rv = _data("randn", (4,), dtype, g), _data("randn", (4,), dtype, g).abs()
    assert _same(rk.batch_norm(x4, rm, rv, w[:4], b[:4]), truth.batch_norm(x4, rm, rv, w[:4], b[:4]))
    got = rk.batch_norm(x4, rm, rv, w[:4], b[:4], training=True, momentum=0.3, return_running_stats=True)
    want = truth.batch_norm(x4, rm, rv, w[:4], b[:4], training=True, momentum=0.3, return_running_stats=True)
    assert all(_same(a, c) for a, c in zip(got, want))


def test_hard_cases_by_hand():
    # a tie: the mean of 1 and 1 + 2**-52 is 1 + 2**-53, exactly halfway: to even, 1.0
    assert rk.mean(np.array([1.0, 1.0 + 2.0**-52])) == 1.0
    # mean of values near the top of float64: finite (the sum itself overflows float64)
    assert rk.mean(np.array([1.6e308, 1.6e308])) == 1.6e308
    # float32 rows near 1e25 normalise to +-1 (x^2 overflows float32, not the real definition)
    y = rk.layer_norm(np.array([[1e25, -1e25]], np.float32), (2,), eps=0.0)
    assert y.tolist() == [[1.0, -1.0]]
    # zero variance with eps=0: 0/0, NaN as torch; eps > 0: exactly 0
    assert np.isnan(rk.layer_norm(np.full((1, 4), 3.0), (4,), eps=0.0)).all()
    assert (rk.layer_norm(np.full((1, 4), 3.0), (4,)) == 0).all()
    # var/std of one element: NaN; divisor 0 with M2 > 0: inf (torch)
    assert math.isnan(float(rk.var(np.array([2.0]))))
    assert float(rk.var(np.array([1.0, 2.0]), correction=2)) == math.inf
    # a layer_norm row with an inf is NaN throughout, as torch
    assert np.isnan(rk.layer_norm(np.array([[np.inf, 1.0, 2.0]]), (3,))).all()
    # cumsum never drifts: each prefix is exact, rounded once
    x = np.array([1.0, 1e16, -1e16, 1.0], np.float64)
    assert rk.cumsum(x, 0).tolist() == [1.0, 1e16, 1.0, 2.0]


def test_fallback_is_exact_and_rare():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96))
    w, b = rng.standard_normal(96), rng.standard_normal(96)
    X = np.ascontiguousarray(x)
    out = np.empty_like(X)
    status = np.zeros(64, np.int64)
    norm._normalize(X, w.reshape(1, -1), b.reshape(1, -1), True, True, True, False, np.zeros(1), np.zeros(1), 1e-5,
                    *FLOAT64.params, out, status)  # fmt: skip
    undecided = int(np.isnan(out).sum())
    assert undecided <= 64 * 96 // 100  # the fast path decides almost every float64 element
    full = norm.normalize(X, w.reshape(1, -1), b.reshape(1, -1), True, FLOAT64, 1e-5)
    want = truth.layer_norm(x, (96,), w, b)
    assert np.array_equal(full, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_no_false_alarm_on_torch_cpu(dtype):
    g = torch.Generator().manual_seed(7)
    for kind in ("randn", "offset", "wide"):
        x = _data(kind, (6, 32, 48), dtype, g)
        w, b = _data("randn", (48,), dtype, g), _data("randn", (48,), dtype, g)
        xt = x.transpose(0, 1)  # a non-contiguous layout
        calls = [
            (F.layer_norm(x, (48,), w, b), "layer_norm", (x, (48,), w, b), {}),
            (F.layer_norm(xt, (48,), w, b), "layer_norm", (xt, (48,), w, b), {}),
            (F.rms_norm(x, (48,), w), "rms_norm", (x, (48,), w), {}),
            (F.group_norm(x, 2, w[:32], b[:32]), "group_norm", (x, 2, w[:32], b[:32]), {}),
            (x.sum(1), "sum", (x, 1), {}),
            (x.mean((0, 2)), "mean", (x, (0, 2)), {}),
            (xt.var(-1), "var", (xt, -1), {}),
            (x.std(0, correction=0), "std", (x, 0), {"correction": 0}),
            (x.cumsum(2), "cumsum", (x, 2), {}),
        ]
        rm, rv = torch.zeros(32, dtype=dtype), torch.ones(32, dtype=dtype)
        calls.append((F.batch_norm(x, rm, rv, w[:32], b[:32]), "batch_norm", (x, rm, rv, w[:32], b[:32]), {}))
        if dtype != torch.float16:  # torch's CPU batch_norm in training mode has no float16 kernel
            rm2, rv2 = rm.clone(), rv.clone()
            y = F.batch_norm(x, rm2, rv2, w[:32], b[:32], training=True)
            calls.append((y, "batch_norm", (x, rm, rv, w[:32], b[:32]), {"training": True}))
        for out, op, args, kw in calls:
            rep = rk.compare(out, op, *args, **kw)
            assert rep.verdict in ("exact", "rounding"), (kind, op, rep.verdict, rep.max_bound_ratio)


def test_bugs_are_caught_and_named():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=g) + 300.0
    w, b = torch.randn(256, generator=g), torch.randn(256, generator=g)
    mu = x.mean(-1, keepdim=True)
    one_pass = (x - mu) / torch.sqrt((x * x).mean(-1, keepdim=True) - mu * mu + 1e-5) * w + b
    rep = rk.compare(one_pass, "layer_norm", x, (256,), w, b)
    assert rep.verdict == "mismatch"
    assert any("one-pass variance" in n for n in rep.notes)
    z = x - 300.0
    rep = rk.compare(F.layer_norm(z, (256,), w, b, eps=1e-3), "layer_norm", z, (256,), w, b)  # wrong eps
    assert rep.verdict == "mismatch"
    rep = rk.compare(F.layer_norm(z, (256,), w, None), "layer_norm", z, (256,), w, b)  # bias dropped
    assert rep.verdict == "mismatch"
    rep = rk.compare(z.sum(1) + 1e-3, "sum", z, 1)  # below the worst-case envelope, far above rounding's
    assert rep.verdict == "mismatch"  # scale (the statistical test inside the envelope sees it)
    assert rep.detectable["envelope"]["median_ulps"] > 1e-3 / 2.0**-19
    rep = rk.compare(z.sum(1) + 2e-6, "sum", z, 1)  # below the statistical threshold: not seen, and the
    assert rep.verdict == "rounding"  # report says how large a bug must be to show
    assert rep.detectable["element"]["median_ulps"] > 2e-6 / 2.0**-19
    # inputs converted to bfloat16 first: named, not called a bug
    rep = rk.compare(F.layer_norm(z.bfloat16().float(), (256,), w.bfloat16().float(), b.bfloat16().float()),
                     "layer_norm", z, (256,), w, b)  # fmt: skip
    assert (rep.verdict, rep.precision) == ("reduced-precision", "bf16")


def test_float64_results_are_sharp_about_float32():
    # a float32 computation handed over as float64 lies on float32's grid: named
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 7, dtype=torch.float64, generator=g)
    rep = rk.compare(x.float().sum(-1).double(), "sum", x, -1)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp32")
    rep = rk.compare(F.layer_norm(x.float(), (7,)).double(), "layer_norm", x, (7,))
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp32")
    # a float64 result with a bug 1e-12 relative: far above float64's rounding, far below float32's
    # envelope; its values are off float32's grid, so the fp32 hypothesis cannot excuse it
    y = x.sum(-1)
    y[3] *= 1 + 1e-12
    rep = rk.compare(y, "sum", x, -1)
    assert rep.verdict == "mismatch"
    y = F.layer_norm(x, (7,))
    y[1, 2] *= 1 + 1e-9
    assert rk.compare(y, "layer_norm", x, (7,)).verdict == "mismatch"
    # the fp32 hypothesis of a float64 sum of [1, 2, 3]: float32 envelope, then float32's store
    # u_32 |c| + 2**-150, then float64's u_64 |c| + 2**-1075: gamma_2(u_32) (1 + 8 u_32) 6 + (u_32 + u_64) 6
    from refkern.analysis.envelope import envelopes, storage

    assert storage(FLOAT64, "fp32") is FLOAT32 and storage(FLOAT64, None) is FLOAT64
    assert storage(FLOAT32, "bf16") is FLOAT32 and storage(FLOAT16, "bf16") is FLOAT16
    a = np.array([1.0, 2.0, 3.0])
    hyps, _ = envelopes("sum", {"x": a, "dim": None, "keepdim": False, "dtype": None}, np.array(6.0), FLOAT64)
    assert [h[0] for h in hyps] == ["rounding", "fp32", "fp16", "bf16"]
    u = 2.0**-24
    want = 2 * u / (1 - 2 * u) * (1 + 8 * u) * 6 + (u + 2.0**-53) * 6 + 2.0**-150 + 2.0**-1075
    assert hyps[1][3] == pytest.approx(want, rel=1e-15, abs=0)


def test_a_window_that_holds_anything_names_nothing():
    # data near 1e4 with spread 1: fp16 and bf16 round every row to one value, whose variance is 0 and
    # whose layer_norm is undetermined in float32 (any value passes the fp16 envelope there). A
    # garbage output must stay a mismatch, named neither a precision nor the one-pass variance
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, 12, generator=g) + 1e4
    garbage = torch.randn(8, 16, 12, generator=g)
    rep = rk.compare(garbage, "layer_norm", x, (12,))
    assert rep.verdict == "mismatch" and rep.precision is None
    assert not any("one-pass" in n for n in rep.notes)
    assert any(
        n.startswith("fp16 inputs would explain it, but only through windows that hold rounding") for n in rep.notes
    )
    y = F.layer_norm(x, (12,))
    y[0, 0, 0] += 0.5
    assert rk.compare(y, "layer_norm", x, (12,)).verdict == "mismatch"
    # where the rounded inputs leave every row constant, fp16 and bf16 give the same: both are said
    rep = rk.compare(F.layer_norm(x.bfloat16().float(), (12,)), "layer_norm", x, (12,))
    assert (rep.verdict, rep.precision, rep.alternatives) == ("reduced-precision", "fp16", ["bf16"])


def test_running_stats_with_inf_and_nan_follow_torch():
    g = torch.Generator().manual_seed(2)
    for special, old in ((np.inf, 0.0), (-np.inf, 0.0), (np.nan, 0.0), (None, np.inf), ("both", 0.0)):
        x = torch.randn(4, 3, 5, generator=g)
        if special == "both":
            x[0, 1, 2], x[1, 1, 0] = np.inf, -np.inf
        elif special is not None:
            x[0, 1, 2] = special
        rm, rv = torch.zeros(3), torch.ones(3)
        rm[1] = old
        _, m, v = rk.batch_norm(x, rm, rv, training=True, return_running_stats=True)
        F.batch_norm(x, rm, rv, training=True)  # torch updates rm, rv in place
        assert torch.equal(m.isnan(), rm.isnan()) and torch.equal(v.isnan(), rv.isnan())
        assert m[1].item() == rm[1].item() or m[1].isnan()
        assert v[1].item() == rv[1].item() or v[1].isnan()
        assert torch.allclose(m[[0, 2]], rm[[0, 2]]) and torch.allclose(v[[0, 2]], rv[[0, 2]])


def test_worst_elements_in_one_pass():
    from refkern.analysis.compare import _worst

    rng = np.random.default_rng(0)
    for n, frac in ((0, 0.5), (5, 1.0), (1000, 0.3), (100_000, 0.01)):
        key = rng.standard_normal(n)
        key[rng.random(n) < 0.05] = np.nan  # NaN counts as inf
        key[: n // 3] = np.round(key[: n // 3])  # ties: the lower index first
        eligible = rng.random(n) < frac
        top, worst = _worst(eligible, key, (n,))
        k = np.where(eligible, np.nan_to_num(key, nan=np.inf), -np.inf)
        want = np.flatnonzero(eligible)[np.argsort(-k[eligible], kind="stable")][:10]
        assert top.tolist() == want.tolist() and worst == [(int(i),) for i in want]


def test_constants_pinned_by_hand():
    # double-word: 2**-100 charged per operation (JMP 2017's largest bound is 9.8 u^2 = 9.8 * 2**-106)
    assert dd.EPS == 7.888609052210118e-31 and dd.EPS >= 9.8 * 2.0**-106
    assert (dd.SAFE_LO, dd.SAFE_HI) == (2.0**-900, 2.0**900)
    # decide, float32 targets: the bracket is d = 2 err + 8u|yl| + 4u|yh| (u = 2**-53) wide each side, so a
    # value 2**-49 above the midpoint of 1 and 1 + 2**-23 is decided, one 2**-52 above is not (4u = 2**-51)
    m = 1.0 + 2.0**-24
    assert ziv.decide(m, 2.0**-49, 2.0**-90, *FLOAT32.params) == 1.0 + 2.0**-23
    assert math.isnan(ziv.decide(m, 2.0**-52, 2.0**-90, *FLOAT32.params))
    assert math.isnan(ziv.decide(m, 2.0**-49, 2.0**-50, *FLOAT32.params))  # 2 err reaches the midpoint
    # float64 targets: no 4u|yh| term; 1 + 2**-53 (a midpoint) plus 2**-100 is decided with err 2**-106
    assert ziv.decide(1.0, 2.0**-53 + 2.0**-100, 2.0**-106, *FLOAT64.params) == 1.0 + 2.0**-52
    assert math.isnan(ziv.decide(1.0, 2.0**-53 + 2.0**-100, 2.0**-100, *FLOAT64.params))
    # envelopes: sum of [1, 2, 3] in float32 = gamma_2 (1 + 8u) * 6 + u * 6 + 2**-150, u = 2**-24
    from refkern.analysis.envelope import envelopes

    x = np.array([1.0, 2.0, 3.0], np.float32)
    hyps, n = envelopes("sum", {"x": x, "dim": None, "keepdim": False, "dtype": None}, np.array(6.0), FLOAT32)
    u = 2.0**-24
    assert n == 3
    assert hyps[0][3] == pytest.approx(2 * u / (1 - 2 * u) * (1 + 8 * u) * 6 + u * 6 + 2.0**-150, rel=1e-15, abs=0)
    # mean of the same: gamma_2 (1 + 8u) * 2 + u * 2 (division) + u * 2 (store) + 2**-150
    hyps, _ = envelopes("mean", {"x": x, "dim": None, "keepdim": False, "dtype": None}, np.array(2.0), FLOAT32)
    assert hyps[0][3] == pytest.approx(2 * u / (1 - 2 * u) * (1 + 8 * u) * 2 + 2 * u * 2 + 2.0**-150, rel=1e-15, abs=0)
    # var of [1, 2, 3] (M2 = 2, ||x|| = sqrt(14), A = 2): (gamma_6 sqrt(14) sqrt(2) + 3 (gamma_3 2)^2) / 2
    #   + u * 1 + u * 1 (store) + 2**-150
    hyps, _ = envelopes("var", {"x": x, "dim": None, "correction": 1, "keepdim": False}, np.array(1.0), FLOAT32)

    def g(k):
        return k * u / (1 - k * u) * (1 + 4 * k * u)

    want = (g(6) * math.sqrt(14) * math.sqrt(2) + 3 * (g(3) * 2) ** 2) / 2 + u + u + 2.0**-150
    assert hyps[0][3] == pytest.approx(want, rel=1e-14, abs=0)
    # a float16 result: torch's working unit stays float32; the store is float16's
    xh = x.astype(np.float16)
    hyps, _ = envelopes("sum", {"x": xh, "dim": None, "keepdim": False, "dtype": None}, np.array(6.0), FLOAT16)
    uh = u + 2.0**-11  # half results: each addition may also be stored in float16; the result stored in
    # float16 and the reference rounded to it: two terms 2**-11 * 6 + 2**-25
    want = 2 * uh / (1 - 2 * uh) * (1 + 8 * uh) * 6 + 2 * (2.0**-11 * 6 + 2.0**-25)
    assert hyps[0][3] == pytest.approx(want, rel=1e-12, abs=0)
    assert [h[0] for h in hyps] == ["rounding", "bf16"]
    assert BFLOAT16.prec == 8


def test_bad_arguments_say_what_and_where():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="normalized_shape=\\[4\\] must be the last dimensions"):
        rk.layer_norm(x, (4,))
    with pytest.raises(ValueError, match="num_groups=2"):
        rk.group_norm(np.zeros((1, 3, 2)), 2)
    with pytest.raises(IndexError, match="dim=2 is out of range"):
        rk.sum(x, 2)
    with pytest.raises(ValueError, match="names a dimension twice"):
        rk.mean(x, (0, -2))
    with pytest.raises(ValueError, match="expected weight of shape \\(3,\\)"):
        rk.layer_norm(x, (3,), np.ones(4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        rk.batch_norm(np.zeros((1, 3)), None, None, training=True)


@pytest.mark.parametrize("shape,dim", [((3, 0), 1), ((0, 4), 0), ((0, 4), 1), ((2, 0, 3), 2)])
def test_compare_on_an_empty_cumsum(shape, dim):
    """An empty cumsum (no rows, or rows of no element) has nothing to judge: exact, not a reshape error."""
    x = np.zeros(shape, np.float32)
    rep = rk.compare(np.cumsum(x, axis=dim), "cumsum", x, dim)
    assert (rep.verdict, rep.shape, sum(rep.counts.values())) == ("exact", shape, 0)


# ------------------------------------------------------------ intermediate overflow is no excuse


def _rows_near(scale, shape=(4, 64), seed=0):
    g = np.random.default_rng(seed)
    return (scale * (1 + g.standard_normal(shape) * 1e-3)).astype(np.float32)


def test_float32_norm_of_huge_rows_has_a_finite_envelope():
    """A float32 layer_norm of rows near 1e25 has a finite answer, and so has its envelope: the envelope is
    evaluated in float64 (its squares, near 1e50, overflowed float32 when a float32 element was widened by
    numba's float(), which keeps a float32). With eps = 0 the op and every term of its envelope are invariant
    under scaling the row by a power of two, so the envelope of x * 2**70 is the envelope of x."""
    from refkern.analysis.envelope import envelopes

    x = _rows_near(1e4)
    big = (x.astype(np.float64) * 2.0**70).astype(np.float32)  # exact: a power of two, in float32's range
    assert np.all(np.abs(big) > 1e24)
    env = []
    for v in (x, big):
        ref = rk.layer_norm(v, (64,), eps=0.0)
        assert np.array_equal(ref, truth.layer_norm(v, (64,), eps=0.0))
        hyps, _ = envelopes("layer_norm", {"input": v, "normalized_shape": (64,), "weight": None, "bias": None,
                                           "eps": 0.0}, ref, FLOAT32)  # fmt: skip
        env.append(hyps[0][3])
    assert np.all(np.isfinite(env[1]))
    np.testing.assert_allclose(env[1], env[0], rtol=1e-12)


def test_nan_from_an_overflowing_backend_is_a_mismatch_not_a_precision():
    """torch's float32 layer_norm of rows near 1e25 returns NaN (its squares overflow); fp16 inputs overflow
    too (1e25 > 65504) and give NaN alike, but that names why, not a precision: mismatch, with the note."""
    x = torch.from_numpy(_rows_near(1e25))
    out = F.layer_norm(x, (64,))
    assert torch.isnan(out).all()  # torch 2.13's CPU kernel; the verdict below needs any NaN
    rep = rk.compare(out, "layer_norm", x, (64,))
    assert rep.verdict == "mismatch", str(rep)
    assert any(n.startswith("256 elements inf or NaN where the exact result is finite") and "fp16 inputs" in n
               for n in rep.notes), rep.notes  # fmt: skip
    good = F.layer_norm(x.double(), (64,)).float()  # the same op in float64, rounded: correct
    assert rk.compare(good, "layer_norm", x, (64,)).verdict in ("exact", "rounding")
    # the statistical family alike: fp16 inputs beyond 65504 give NaN products
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g) * 1e5, torch.randn(16, 4, generator=g)
    rep = rk.compare((a.half() @ b.half()).float(), "matmul", a, b)
    assert rep.verdict == "mismatch", str(rep)
    assert any("inf or NaN where the exact result is finite" in n and "fp16 inputs" in n for n in rep.notes)
    one = a @ b
    one[2, 1] = float("inf")
    rep = rk.compare(one, "matmul", a, b)
    assert rep.verdict == "mismatch" and rep.notes[0].startswith("1 element inf or NaN"), rep.notes


def test_an_infinite_reference_is_no_blind_spot():
    """The variance of float32 rows near 1e25 is near 1e44: inf in float32, so the reference and its bound are
    inf. Any other value is beyond that bound, so the report claims no blind spot there; a finite value is
    caught."""
    x = torch.from_numpy(_rows_near(1e25))
    out = x.var(1)
    assert torch.isinf(out).all()
    rep = rk.compare(out, "var", x, 1)
    assert rep.verdict == "exact" and not any("no envelope holds" in n for n in rep.notes), rep.notes
    assert rk.compare(torch.full_like(out, 3e38), "var", x, 1).verdict == "mismatch"
