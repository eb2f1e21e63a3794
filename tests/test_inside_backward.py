"""The statistical test inside the gradients' worst-case envelopes (refkern.analysis.noise_backward):
the scales pinned by hand, no false alarm on torch's CPU gradients and on emulated float32 kernels,
and the bugs of issue 24 (a gradient scaled by 1.1 in bfloat16, a dropped term) caught."""

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT32
from refkern.analysis import noise_backward as nb
from refkern.analysis import noise_backward_attention as nba
from refkern.analysis import noise_backward_reductions as nbr

torch = pytest.importorskip("torch")
F = torch.nn.functional

U = 2.0**-24  # float32's unit roundoff: the working unit of fp32, fp16 and bf16 results
ETA2 = 2.0**-300  # (2**-150)**2: float32's eta (half its smallest subnormal), squared


def test_mean_scale_by_hand():
    """g / n: MEAN_ROUNDINGS = 3 roundings of 0.75, the reference's and the store's (2), one eta_w and the
    two etas of the stores."""
    v = nbr.mean_noise(np.array([3.0]), 4, np.array([0.75]), FLOAT32)
    assert v[0] == pytest.approx(5 * (0.75 * U) ** 2 + 3 * ETA2, abs=0)


def test_pool_scale_by_hand():
    """An average's element of 3 terms with sum |t| = 2: (k + 1) (u A)**2, the stores, 2 k eta_w."""
    v = nbr.pool_noise(np.array([2.0]), np.array([3.0]), np.array([1.0]), FLOAT32, False)
    assert v[0] == pytest.approx(4 * (2 * U) ** 2 + 2 * U**2 + 8 * ETA2, abs=0)
    v = nbr.pool_noise(np.array([2.0]), np.array([3.0]), np.array([1.0]), FLOAT32, True)  # a maximum's exact terms
    assert v[0] == pytest.approx(2 * (2 * U) ** 2 + 2 * U**2 + 8 * ETA2, abs=0)


def test_softmax_scale_by_hand():
    """x = [0, 0], g = [1, -1]: y = 1/2, D = 0, dx = +-1/2. Per element nu = (2 B u)**2 + 2 u**2 + u_o**2 with
    B = 2 (the exp at 0, EXP_SCALE_BINADES) = 19 u**2; the shared sS = sum y**2 beta**2 + u**2 S**2 / D**2 =
    8 u**2 + u**2; D's vD = u**2 sum (g y)**2 = u**2 / 2; own = nu (h**2 - 2 h g y + sum (g y)**2) = 19 / 2 u**2;
    relative: own + g**2 sS + vD + u**2 h**2 + u**2 (g**2 + h**2) = 22 u**2, times y**2 = 1/4; the stores
    2 (u / 2)**2 and (n + 4 + 2) eta**2."""
    v, sc = nb.softmax_noise(np.array([[0.0, 0.0]]), np.array([[1.0, -1.0]]), FLOAT32, False)
    assert sc == 1.0
    assert v[0, 0] == pytest.approx(22 * U**2 / 4 + U**2 / 2 + 8 * ETA2, abs=0)
    assert v[0, 1] == pytest.approx(v[0, 0], abs=0)


def test_norm_bias_scale_by_hand():
    """grad_bias over 2 rows: the column sums' partial sums (S**2 = 16 and 36), the stores of 4 and 6,
    T + 2 = 4 etas; a bfloat16 input adds the half running sums' member, u_m**2 S**2 (u_m = 2**-8)."""
    X = np.array([[1.0, 2.0], [3.0, 5.0]])
    G = np.array([[1.0, 2.0], [3.0, 4.0]])
    v, half, coherent = nb.norm_param_noise("bias", X, G, True, 1e-5, {"input": FLOAT32, "bias": FLOAT32})
    assert half is None and coherent(np.ones(2)) == 0.0
    assert v.tolist() == pytest.approx([16 * U**2 + 32 * U**2 + 6 * ETA2, 36 * U**2 + 72 * U**2 + 6 * ETA2], abs=0)
    v, half, _ = nb.norm_param_noise("bias", X, G, True, 1e-5, {"input": BFLOAT16, "bias": BFLOAT16})
    eta_b2 = 2.0 ** (2 * (BFLOAT16.emin - BFLOAT16.prec))
    assert v[0] == pytest.approx(16 * U**2 + 2 * (4 * 2.0**-8) ** 2 + 2 * eta_b2 + 4 * ETA2, abs=0)
    assert half()[0] == pytest.approx(v[0] + 16 * 2.0**-16, abs=0)


def _ln(dtype, R, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(R, n, generator=gen).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(n, generator=gen)).to(dtype).requires_grad_()
    g = torch.randn(R, n, generator=gen).to(dtype)
    F.layer_norm(x, (n,), w, b, 1e-5).backward(g)
    return x, w, b, g


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_layer_norm_gradients_scaled_by_1_1_are_mismatches(dtype):
    """Issue 24: a layer_norm gradient 10% off was `rounding` in bfloat16 (an infinite envelope). torch's own
    gradients are rounding (grad_weight and grad_bias: or the half precision its CPU kernel sums them in,
    named); each scaled by 1.1 is a mismatch, the half sums' model refusing it by the scale test."""
    x, w, b, g = _ln(dtype, 64, 768)
    args = dict(input=x.detach(), normalized_shape=(768,), weight=w.detach(), bias=b.detach(), eps=1e-5)
    got = {"input": x.grad, "weight": w.grad, "bias": b.grad}
    half = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
    for k, rep in rk.compare_backward(got, "layer_norm", g, **args).items():
        assert rep.verdict == "rounding" or (rep.verdict, rep.precision) == ("reduced-precision", half), (k, rep)
        assert np.isfinite(rep.detectable["element"]["median_ulps"])
        assert rep.detectable["element"]["median_ulps"] < 100
    bad = {k: (v.double() * 1.1).to(dtype) for k, v in got.items()}
    reps = rk.compare_backward(bad, "layer_norm", g, **args)
    assert {k: r.verdict for k, r in reps.items()} == dict.fromkeys(got, "mismatch")
    if dtype == torch.bfloat16:  # each element within the bf16 sums' scale: the scale test refuses it
        assert any("a scale error" in t for t in reps["bias"].notes)


def test_torch_half_grad_bias_is_named_its_precision():
    """torch's CPU layer_norm sums grad_bias over the rows in bfloat16: the float32 model refuses it by
    hundreds of sigma at 64 rows, the bf16 accumulation explains it, and the Report names it."""
    x, w, b, g = _ln(torch.bfloat16, 64, 768)
    rep = rk.compare_backward({"bias": b.grad}, "layer_norm", g, x.detach(), (768,), w.detach(), b.detach(), 1e-5)
    rep = rep["bias"]
    assert (rep.verdict, rep.precision) == ("reduced-precision", "bf16")
    assert rep.hypotheses["rounding (statistical)"]["max_ratio"] > 100
    assert rep.hypotheses["bf16 accumulation (statistical)"]["explains"]


def _emulated_ln_input(x, g, w, eps, order):
    """A float32 layer_norm grad_input (torch's raw form), its sums in ``order``: "pairwise" (numpy's) or
    "sequential" (a running float32 sum, a CPU scalar loop)."""
    X, G, W = (np.asarray(t, np.float32) for t in (x, g, w))
    n = X.shape[1]

    def s(v):
        if order == "pairwise":
            return v.sum(axis=1, dtype=np.float32)
        return np.cumsum(v, axis=1, dtype=np.float32)[:, -1]

    mean = s(X) / np.float32(n)
    var = s((X - mean[:, None]) ** 2) / np.float32(n)
    r = (np.float32(1) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    gw = G * W
    db, ds = s(gw), s(gw * X)
    bb = (db * mean - ds) * r**3 / np.float32(n)
    c = -bb * mean - db * r / np.float32(n)
    return (r[:, None] * gw + bb[:, None] * X + c[:, None]).astype(np.float32)


@pytest.mark.parametrize("order", ["pairwise", "sequential"])
def test_emulated_float32_kernels_are_rounding(order):
    """Correct float32 kernels other than torch's (its raw form, pairwise or sequential sums) at 4096
    features: rounding; the same with the mean term of grad_input dropped: a mismatch."""
    gen = torch.Generator().manual_seed(3)
    R, n = 32, 4096
    x = torch.randn(R, n, generator=gen)
    w = 1 + 0.1 * torch.randn(n, generator=gen)
    g = torch.randn(R, n, generator=gen)
    got = _emulated_ln_input(x.numpy(), g.numpy(), w.numpy(), 1e-5, order)
    args = (g, x, (n,), w, None, 1e-5)
    rep = rk.compare_backward({"input": torch.from_numpy(got)}, "layer_norm", *args)["input"]
    assert rep.verdict == "rounding", rep
    assert rep.max_prob_ratio < 0.5  # z / lam: the scale is not too tight for these orders
    ref = rk.backward("layer_norm", *args, wrt="input")["input"].double().numpy()
    r = 1 / np.sqrt(x.double().var(dim=1, unbiased=False).numpy() + 1e-5)
    drop = (ref + r[:, None] * (g.double() * w.double()).mean(dim=1, keepdim=True).numpy()).astype(np.float32)
    rep = rk.compare_backward({"input": torch.from_numpy(drop)}, "layer_norm", *args)["input"]
    assert rep.verdict == "mismatch"


def test_softmax_gradient_bugs_in_bfloat16_at_4096_keys():
    """bfloat16 softmax over 4096 keys: torch's gradient is rounding, scaled by 1.1 a mismatch, and a
    gradient that drops D (y g instead of y (g - D)) a mismatch."""
    gen = torch.Generator().manual_seed(4)
    x = (3 * torch.randn(8, 4096, generator=gen)).bfloat16().requires_grad_()
    y = F.softmax(x, -1)
    g = torch.randn(8, 4096, generator=gen).bfloat16()
    y.backward(g)

    def judge(v):
        return rk.compare_backward({"input": v}, "softmax", g, x.detach(), -1)["input"]

    assert judge(x.grad).verdict == "rounding"
    assert judge((x.grad.double() * 1.1).bfloat16()).verdict == "mismatch"
    assert judge((y.detach().double() * g.double()).bfloat16()).verdict == "mismatch"


def test_std_gradient_with_subnormal_intermediates_is_rounding():
    """float16 std over 2048 log-normal values: torch forms (2 / dof) g / (2 s) in float16, below its normals
    (about 1e-6): each such store loses up to half a subnormal, ~5% of these gradients; rounding."""
    gen = torch.Generator().manual_seed(5)
    worst = 0.0
    for _ in range(3):
        z = torch.randn((3, 2048), generator=gen, dtype=torch.float64)
        x = (torch.exp(3 * z) * torch.sign(torch.randn((3, 2048), generator=gen, dtype=torch.float64))).half()
        x.requires_grad_()
        y = x.std(dim=1)
        g = torch.randn(y.shape, generator=gen).half()
        y.backward(g)
        rep = rk.compare_backward({"x": x.grad}, "std", g, x.detach(), dim=1)["x"]
        assert rep.verdict in ("exact", "rounding")
        worst = max(worst, rep.max_ulp)
    assert worst > 30  # the subnormal stores' size: what the scale had to take


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_attention_gradients_scaled_are_mismatches(dtype):
    """Attention's three gradients (64 queries and keys, causal): torch's math backward is rounding with
    room to spare (z / lam < 0.5); scaled by 1.1 (bfloat16, one ulp is 0.4-0.8%) or 1.01 (float32) each is
    a mismatch (in bfloat16 inside the worst-case envelope, which let it pass)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 64, 32, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn(o.shape, generator=gen).to(dtype)
    o.backward(g)
    args = dict(query=q.detach(), key=k.detach(), value=v.detach(), is_causal=True)
    got = {"query": q.grad, "key": k.grad, "value": v.grad}
    for name, rep in rk.compare_backward(got, "scaled_dot_product_attention", g, **args).items():
        assert rep.verdict == "rounding" and rep.max_prob_ratio < 0.5, (name, rep)
    f = 1.1 if dtype == torch.bfloat16 else 1.01
    bad = {n: (t.double() * f).to(dtype) for n, t in got.items()}
    reps = rk.compare_backward(bad, "scaled_dot_product_attention", g, **args)
    assert {n: r.verdict for n, r in reps.items()} == dict.fromkeys(got, "mismatch")
    if dtype == torch.bfloat16:  # inside the worst-case envelope: the statistical test saw it
        assert all(r.max_bound_ratio < 1 for r in reps.values())


def test_hugging_face_rms_norm_gradient_in_float16_is_rounding():
    """Hugging Face's RMSNorm (w * h.to(dtype)) at 8192 features in float16: its backward forms g w in float16
    (a rounding of u_m each, in the family); seeds 0, 2 and 4 were a mismatch (one element 1 ulp off at ~10
    sigma) when the scale charged g w only float32's unit. Scaled by 1.1 it stays a mismatch."""
    eps = torch.finfo(torch.float32).eps

    def hf(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    for seed in (0, 2, 4):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 8192, generator=g).half()
        w = (1 + 0.1 * torch.randn(8192, generator=g)).half()
        dy = torch.randn(4, 8192, generator=g).half()
        xs = x.clone().requires_grad_()
        hf(xs, w).backward(dy)
        rep = rk.compare_backward({"input": xs.grad}, "rms_norm", dy, x, (8192,), w, eps=eps)["input"]
        assert rep.verdict == "rounding", (seed, rep)
        bad = (xs.grad.double() * 1.1).half()
        assert rk.compare_backward({"input": bad}, "rms_norm", dy, x, (8192,), w, eps=eps)["input"].verdict == "mismatch"


# ------------------------------------------------------------- issue 24: the gradients' misses (helper-39)


def test_var_members_by_hand():
    """A bfloat16 row 298, 300, 302, 304 (mean 301, a midpoint of bf16's spacing 2 there), g = 1, correction 1:
    the stored mean is 300 or 302 (the two roundings of 301 -+ lam sigma), so the members' centres are K (x - 300)
    and K (x - 302), K = 2 / 3, besides the exact mean's K (x - 301); each fitted to the actual row, exactly its own
    centre where it is that centre. The shared error's bound: VAR_K_ROUNDINGS = 3 roundings of u + u_p; std adds
    2 s, s^ stored and g / (2 s^) (u + u_p + (u + u_p)); the centres' relative error 8 roundings of 2**-53."""
    assert nbr.MEMBER_ERR == pytest.approx(2.0**-50, abs=0)
    X = np.array([[298.0, 300.0, 302.0, 304.0]])
    G = np.array([1.0])
    K = 2.0 / 3.0
    want = {300.0: K * (X - 300.0), 302.0: K * (X - 302.0), 301.0: K * (X - 301.0)}
    for m, c in want.items():
        xh, err, pre = next(nbr.var_members(X, G, 1, BFLOAT16, False, c))  # the first batch: the exact mean's
        assert xh.shape == (3, 1, 4)
        hit = [i for i in range(3) if np.array_equal(xh[i], c)]
        assert hit, m
        assert err[hit[0]] == pytest.approx(2.0**-50 * np.abs(c), abs=0)
    uc = U + 2.0**-8
    assert nbr._var_parts(X, G, 1, BFLOAT16, False)[-1][0][0] == pytest.approx(3 * uc, abs=0)
    hard, sub = nbr._var_parts(X, G, 1, BFLOAT16, True)[-1]
    assert hard[0] == pytest.approx(3 * uc + U + 2.0**-8 + uc, abs=0) and sub[0] > 0


def test_var_bf16_offset_rows_stored_mean_is_a_member():
    """bfloat16 var over rows of mean 300 (torch's x - x.mean(): the mean stored in bf16, its rounding a centre,
    not noise of u |mean| = 1.2 relative): torch's gradient is rounding; scaled by 1.1 (28x the spread of correct
    kernels) and by 1.06 (16x) it is a mismatch (both were rounding)."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 4096, generator=gen, dtype=torch.float64) + 300).bfloat16()
    g = torch.randn(4, 1, generator=gen).bfloat16()
    xs = x.clone().requires_grad_()
    torch.var(xs, -1, keepdim=True).backward(g)
    assert rk.compare_backward({"x": xs.grad}, "var", g, x, -1, keepdim=True)["x"].verdict in ("exact", "rounding")
    for f in (1.1, 1.06):
        bad = (xs.grad.double() * f).bfloat16()
        assert rk.compare_backward({"x": bad}, "var", g, x, -1, keepdim=True)["x"].verdict == "mismatch", f


def test_std_float32_one_element_off_is_seen():
    """float32 std over 10^4 randn terms: the stored std's error is shared by the row, fitted per row and no longer
    charged to every element (a 29 u relative scale at 10^4 terms), so one element off by 1e-5 relative (about
    160 ulps, under the 153-ulp threshold it had) is a mismatch; torch's gradient is rounding."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 10_000, generator=gen)
    g = torch.randn(4, generator=gen)
    xs = x.clone().requires_grad_()
    torch.std(xs, -1).backward(g)
    assert rk.compare_backward({"x": xs.grad}, "std", g, x, -1)["x"].verdict in ("exact", "rounding")
    i = int(torch.argmax(xs.grad[1].abs()))
    bad = xs.grad.clone()
    bad[1, i] = (bad[1, i].double() * (1 + 1e-5)).float()
    assert rk.compare_backward({"x": bad}, "std", g, x, -1)["x"].verdict == "mismatch"


def _bn16(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 32, 32, generator=gen).half()
    w = (1 + 0.1 * torch.randn(4, generator=gen)).half()
    b = (0.1 * torch.randn(4, generator=gen)).half()
    g = torch.randn(x.shape, generator=gen).half()
    ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
    F.batch_norm(x, torch.zeros(4).half(), torch.ones(4).half(), ws, bs, training=True).backward(g)
    args = (g, x, torch.zeros(4).half(), torch.ones(4).half(), w, b)
    return args, {"weight": ws.grad, "bias": bs.grad}


def test_bias_straddle_by_hand():
    """batch_norm's grad_bias in float16, two channels of three terms 1, 2, 3 and -1, 0, 4: each channel's sum
    stored once, sigma**2 before the store u**2 max over the orders of the partial sums' squares (the n - 1
    additions': left to right 3, 6 and -1, 3; right to left 5, 6 and 4, 3: 61 and 25) + (n + 4) eta_w**2; centres 6
    and 3 within 2 n 2**-53 sum |g|. group_norm's columns of several blocks have none."""
    from refkern.accumulate.formats import FLOAT16

    X = np.zeros((2, 3))
    G = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]])
    fm = {"input": FLOAT16, "weight": FLOAT16, "bias": FLOAT16}
    pre, thunk = nb.bias_straddle(X, G, fm, lambda A: A.T)
    assert pre.tolist() == [pytest.approx(61 * U * U + 7 * ETA2, abs=0), pytest.approx(25 * U * U + 7 * ETA2, abs=0)]
    xh, err = thunk()
    assert xh.tolist() == [6.0, 3.0]
    assert err.tolist() == [pytest.approx(6 * 2.0**-53 * 6, abs=0), pytest.approx(6 * 2.0**-53 * 5, abs=0)]
    assert nb.bias_straddle(X, G, fm, lambda A: A.reshape(3, 2)) is None  # a column of two rows' terms
    assert nb.bias_straddle(X, G, {**fm, "bias": FLOAT32}, lambda A: A.T) is None


def test_batch_norm_float16_parameter_gradients_seen_to_the_ulp():
    """float16 batch_norm, 4 channels of 2048: torch's grad_weight and grad_bias are rounding; grad_bias scaled by
    1 + 2**-9 (2 ulps: 8x the spread of correct kernels) is a mismatch (it was rounding: the half statistics and the
    result's store charged as noise)."""
    args, got = _bn16()
    reps = rk.compare_backward(got, "batch_norm", *args, training=True)
    assert all(r.verdict in ("exact", "rounding") for r in reps.values()), reps
    bias = (got["bias"].double() * (1 + 2.0**-9)).half()
    assert rk.compare_backward({"bias": bias}, "batch_norm", *args, training=True)["bias"].verdict == "mismatch"


@pytest.mark.xfail(strict=True, reason="the half grad_weight is also tested on the whole family's scale "
                   "(gradients._with_family): torch's bf16 CPU batch_norm backward is none of weight_members' "
                   "emulations on an OpInfo sample, and that scale passes one element 4 ulps off")  # fmt: skip
def test_batch_norm_float16_weight_gradient_one_element_off_by_4_ulps():
    args, got = _bn16()
    w = got["weight"].clone()
    i = int(torch.argmax(w.abs()))
    w[i] = (w[i].double() + 4 * 2.0 ** (int(np.floor(np.log2(abs(float(w[i]))))) - 10)).half()
    assert rk.compare_backward({"weight": w}, "batch_norm", *args, training=True)["weight"].verdict == "mismatch"


def test_attention_shared_by_hand():
    """AttentionShared.per_row on one head of one query, one key, one column (s = 1): q = 2, A = 3, dS = 5,
    sh = 7, P = 11, vDel = 13, uq = 1/2, weight 1: M = 2, so 3 M**2 + 7 (5 M)**2 + 13 (11 M)**2 + (uq (q dS))**2 =
    12 + 700 + 6292 + 25."""
    one = np.ones((1, 1))
    parts = [(0, 2 * one, 3 * one, 5 * one, np.array([7.0]), 11 * one, np.array([13.0]), 0.5)]
    sh = nba.AttentionShared(parts, (1, 1, 1), "key", 1.0)
    assert sh.per_row(np.ones((1, 1, 1))).tolist() == [pytest.approx(7029.0, abs=0)]
    assert sh(np.ones((1, 1, 1))) == pytest.approx(7029.0, abs=0)
    assert sh.count == 1 and sh.rows(np.zeros((1, 1, 1))).shape == (1, 1)


def test_attention_bf16_key_gradient_scaled_is_seen():
    """bfloat16 attention (2 heads, 16 queries, 64 keys): torch's key gradient is rounding; scaled by 1.03 (8x the
    spread of correct kernels) it is a mismatch, by the scale test on the errors the heads share (AttentionShared),
    where every element's test passed it."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 16, 64, generator=gen).bfloat16()
    k, v = (torch.randn(1, 2, 64, 64, generator=gen).bfloat16() for _ in range(2))
    ks = k.clone().requires_grad_()
    o = F.scaled_dot_product_attention(q, ks, v)
    g = torch.randn(o.shape, generator=gen).bfloat16()
    o.backward(g)
    args = dict(query=q, key=k, value=v)
    assert rk.compare_backward({"key": ks.grad}, "scaled_dot_product_attention", g, **args)["key"].verdict in (
        "exact", "rounding")  # fmt: skip
    bad = (ks.grad.double() * 1.03).bfloat16()
    assert rk.compare_backward({"key": bad}, "scaled_dot_product_attention", g, **args)["key"].verdict == "mismatch"
