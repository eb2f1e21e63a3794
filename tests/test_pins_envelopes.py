"""Every constant of the envelope modules pinned by hand (refkern/analysis/envelope.py, _envelope_ops.py,
_envelope_softmax.py, _envelope_backward.py): each expected value is written out from the derivation in the
module docstrings with plain Python arithmetic, and compared with a relative tolerance and NO absolute one
(pytest.approx's default abs=1e-12 would swallow a doubled term of a bound near 1e-6), so that a term of an
envelope multiplied by 2 fails here, but for the few no input makes visible at this tolerance (an eta beside a
2**-52 term, the float64 evaluations' own 2**-52 slacks). Tiny inputs; cases are built so that the terms a plain
case cannot see (underflow, the stores of half formats, the thresholds, the rounding cells) dominate or decide."""

import math

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from refkern.analysis.envelope import ONE_PASS, envelopes

U = 2.0**-24  # float32's unit (the working precision of fp32/fp16/bf16 results)
UH = 2.0**-11  # float16's unit
UB = 2.0**-8  # bfloat16's unit
ETA_W = 2.0**-126  # float32's smallest normal
ETA_O = 2.0**-150  # half float32's smallest subnormal
ETA_H = 2.0**-25  # half float16's smallest subnormal


def close(got, want, rel=1e-12):
    """|got - want| <= rel |want| element by element: no absolute tolerance."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    ok = np.abs(got - want) <= rel * np.abs(want)
    assert ok.all(), (got.tolist(), want.tolist())


def g(k, u):
    """envelope._gamma as the module docstring states it: gamma_k (1 + 4 k u) (SLACK), infinite beyond k u = 1/8."""
    return k * u / (1 - k * u) * (1 + 4 * k * u) if k * u <= 0.125 else math.inf


def rounding(name, args, ref, out):
    hyps, n = envelopes(name, args, np.asarray(ref, np.float64), out, lazy=True)
    assert hyps[0][0] == "rounding"
    return np.asarray(hyps[0][3], np.float64), n


# ------------------------------------------------------------------ norms (envelope._norm_rows)


def _norm_row_by_hand(x, w, b, y, eps, u, um, stores, uo, eta_o, uf=2 * 2 * 0.5 * 2.0**-149):
    """The norm envelope of envelope's docstring for one centred row, u the working unit as envelopes passes it
    (u + u_m for half results), the affine steps charged ua = u + u_m (the kernel's own comment: each step may
    also be stored in the half result dtype), the statistics u_m once more."""
    n = len(x)
    ua = u + um
    mean = sum(x) / n
    m2 = sum((xi - mean) ** 2 for xi in x)
    q = sum(xi * xi for xi in x)
    A = sum(abs(xi) for xi in x) / n
    dmu = g(n, u) * A + um * abs(mean)  # the mean: gamma_n A, stored once (u_m)
    e_m2 = g(n + 3, u) * math.sqrt(q) * math.sqrt(m2) + n * (g(n, u) * A) ** 2  # Chan, Golub, LeVeque
    assert n == 2  # uf: the n = 2 squares that may underflow, twice half the working format's smallest subnormal
    var = m2 / n
    e_v = (e_m2 + uf) / n + ua * var
    z = var + eps
    e_w = e_v + ua * z
    r = 1 / math.sqrt(z)
    e_r = max(1 / math.sqrt(max(z - e_w, 0.0)) - r, r - 1 / math.sqrt(z + e_w)) + (2 * u + um) * r
    out = []
    for xi, wi, bi, yi in zip(x, w, b, y):
        d = abs(xi - mean)
        e_d = dmu + ua * (d + dmu)
        bnd = abs(wi) * (e_d * r + d * e_r + e_d * e_r) + 3 * ua * (abs(xi) + abs(mean)) * r * abs(wi)
        bnd += 2 * ua * abs(bi) + 2 * ua * abs(yi)
        out.append(bnd + stores * uo * abs(yi) + stores * eta_o)  # the stores: u_o |y| + half a subnormal each
    return out


def _ln_args(x, w, b, eps, dt):
    return {"input": np.array([x], dt), "normalized_shape": (len(x),), "weight": None if w is None else np.array(w, dt),
            "bias": None if b is None else np.array(b, dt), "eps": eps}  # fmt: skip


def test_layer_norm_envelope_by_hand():
    # x = (1, 3): mean 2, M2 = 2, var 1, eps 0 so r = 1; weight (2, 3), bias (0.5, -0.25): y = (-1.5, 2.75)
    x, w, b, y = [1.0, 3.0], [2.0, 3.0], [0.5, -0.25], [-1.5, 2.75]
    got, n = rounding("layer_norm", _ln_args(x, w, b, 0.0, np.float32), [y], FLOAT32)
    assert n == 2
    close(got[0], _norm_row_by_hand(x, w, b, y, 0.0, U, 0.0, 1, U, ETA_O))
    # float16: computed in float32, every operation also stored in float16: u = 2**-24 + 2**-11 per operation,
    # u_m = 2**-11 once more on the statistics and the affine steps, two stores of 2**-11 |y| + 2**-25
    got, _ = rounding("layer_norm", _ln_args(x, w, b, 0.0, np.float16), [y], FLOAT16)
    close(got[0], _norm_row_by_hand(x, w, b, y, 0.0, U + UH, UH, 2, UH, ETA_H))


def test_norm_envelope_underflow_and_store_terms_by_hand():
    # weight 0 and bias 0: y = 0 and every term vanishes but the stores' half subnormal: float32 2**-150, float16
    # two of 2**-25
    x = [1.0, 3.0]
    got, _ = rounding("layer_norm", _ln_args(x, [0.0, 0.0], [0.0, 0.0], 0.0, np.float32), [[0.0, 0.0]], FLOAT32)
    assert got.tolist() == [[2.0**-150, 2.0**-150]]
    got, _ = rounding("layer_norm", _ln_args(x, [0.0, 0.0], [0.0, 0.0], 0.0, np.float16), [[0.0, 0.0]], FLOAT16)
    assert got.tolist() == [[2.0**-24, 2.0**-24]]
    # squares that underflow, in float64 (x = +-2**-530: x**2 = 2**-1060, M2 = 2**-1059) with eps = 2**-1064: the
    # underflow term n 2**-1074 (2 n eta, eta half float64's smallest subnormal) dominates e_M2 and, through r's
    # interval, the bound (d e_r ~ 2**-15). Not float32 inputs: _norm_rows squares a float32 x in float32 (numba's
    # float() keeps float32), so its x**2 = 2**-150 is 0 there, which disagrees with its docstring's widening.
    t = 2.0**-530
    x = [-t, t]
    r = 1 / math.sqrt(2.0**-1060 + 2.0**-1064)
    y = [-t * r, t * r]
    got, _ = rounding("layer_norm", _ln_args(x, None, None, 2.0**-1064, np.float64), [y], FLOAT64)
    want = _norm_row_by_hand(x, [1.0, 1.0], [0.0, 0.0], y, 2.0**-1064, 2.0**-53, 0.0, 1, 2.0**-53, 2.0**-1075,
                             uf=2 * 2 * 0.5 * 2.0**-1074)  # fmt: skip
    close(got[0], want)
    assert want[0] > 2.0**-16  # the underflow's share: e_r ~ r 2**-15, d = 2**-530


def test_norm_envelope_one_pass_kernel_by_hand():
    """_norm_rows' one-pass branch (e_M2 = 3 gamma_n sum x**2), reachable through _norm_envelope only."""
    from refkern.analysis.envelope import _norm_envelope

    X = np.array([[1.0, 3.0]])
    ref = np.array([[-1.0, 1.0]])
    got = _norm_envelope(X, 1.0, 0.0, True, 0.0, None, U, 0.0, True, ref, FLOAT32, 1)
    n, mean, q, var = 2, 2.0, 10.0, 1.0
    dmu = g(2, U) * 2.0
    e_v = (3 * g(2, U) * q + 2 * 2.0**-149) / n + U * var
    e_w = e_v + U * 1.0
    e_r = max(1 / math.sqrt(1 - e_w) - 1, 1 - 1 / math.sqrt(1 + e_w)) + 2 * U
    want = []
    for xi in (1.0, 3.0):
        e_d = dmu + U * (1 + dmu)
        want.append(e_d + e_r + e_d * e_r + 3 * U * (xi + mean) + 2 * U * 1.0 + U * 1.0 + 2.0**-150)
    close(got[0], want)


# ------------------------------------------------------------------ sums, means, var, std, cumsum, pools


def test_gamma_threshold_by_hand():
    # bfloat16 sums charge u = 2**-24 + 2**-8 per addition: 26 additions (k u = 0.1016) are claimed,
    # 33 (k u = 0.129 > 1/8) are not (the second-order slack 1 + 4 k u covers the remainder only up to k u = 1/8)
    ub = U + UB
    for n, finite in ((27, True), (33, True), (34, False)):
        x = np.ones(n, np.float32)
        got, _ = rounding("sum", {"x": x, "dim": None, "keepdim": False, "dtype": None}, float(n), BFLOAT16)
        if finite and (n - 1) * ub <= 0.125:
            close(got, g(n - 1, ub) * n + 2 * (UB * n + 2.0**-134))  # two stores in bfloat16
        else:
            assert got == math.inf, n


def test_var_std_cumsum_envelopes_by_hand():
    x = np.array([1.0, 2.0, 3.0], np.float32)  # M2 = 2, ||x|| = sqrt(14), A = 2, D = n - 1 = 2
    e_m2 = g(6, U) * math.sqrt(14) * math.sqrt(2) + 3 * (g(3, U) * 2) ** 2 + 2 * 3 * 0.5 * 2.0**-149
    got, n = rounding("var", {"x": x, "dim": None, "correction": 1, "keepdim": False}, 1.0, FLOAT32)
    close(got, e_m2 / 2 + U * 1 + U * 1 + 2.0**-150)
    # std = sqrt(var) through the interval [1 - e_v, 1 + e_v], plus 2u for the sqrt (and a division)
    e_v = e_m2 / 2 + U
    got, _ = rounding("std", {"x": x, "dim": None, "correction": 1, "keepdim": False}, 1.0, FLOAT32)
    close(got, max(1 - math.sqrt(1 - e_v), math.sqrt(1 + e_v) - 1) + 2 * U + U + 2.0**-150)
    # the one-pass variance's own envelope: 3 gamma_n sum x**2 (sum x**2 = 14)
    hyps, _ = envelopes("var", {"x": x, "dim": None, "correction": 1, "keepdim": False}, np.array(1.0), FLOAT32)
    (one,) = [h for h in hyps if h[0] == ONE_PASS]
    close(one[3], (3 * g(3, U) * 14 + 3 * 2.0**-149) / 2 + U + U + 2.0**-150)
    # squares that underflow: x = (0, 2**-75): M2 = 2**-151, the underflow term 2 n eta = 2**-148 dominates
    t = 2.0**-75
    xt = np.array([0.0, t], np.float32)
    m2, A, nrm = 2 * (t / 2) ** 2, t / 2, t
    want = g(5, U) * nrm * math.sqrt(m2) + 2 * (g(2, U) * A) ** 2 + 2 * 2 * 0.5 * 2.0**-149 + U * m2 + 2.0**-150
    got, _ = rounding("var", {"x": xt, "dim": None, "correction": 1, "keepdim": False}, 0.0, FLOAT32)
    close(got, want)
    # cumsum element i: gamma_i times the prefix's sum |x|, plus the store
    got, n = rounding("cumsum", {"x": x, "dim": 0, "dtype": None}, [1.0, 3.0, 6.0], FLOAT32)
    assert n == 3
    close(got, [0 + U * 1 + 2.0**-150, g(1, U) * 3 + U * 3 + 2.0**-150, g(2, U) * 6 + U * 6 + 2.0**-150])


def test_reduced_precision_hypotheses_by_hand():
    # a float64 sum of (1, 2, 3 + 2**-30): "fp32" is the sum of the inputs rounded to float32 (6), its float32
    # envelope gamma_2(2**-24) 6, stored in float32 (2**-24 6 + 2**-150) and the reference's own float64 store
    # (2**-53 |ref| + 2**-1075)
    x = np.array([1.0, 2.0, 3.0 + 2.0**-30])
    ref = 6.0 + 2.0**-30
    hyps, _ = envelopes("sum", {"x": x, "dim": None, "keepdim": False, "dtype": None}, np.array(ref), FLOAT64)
    h = {k: (c, b) for k, _, c, b in hyps}
    assert float(h["fp32"][0]) == 6.0
    close(h["fp32"][1], g(2, U) * 6 + 2.0**-53 * ref + 2.0**-1075 + U * 6 + 2.0**-150)
    close(h["rounding"][1], g(2, 2.0**-53) * (6 + 2.0**-30) + 2.0**-53 * ref + 2.0**-1075)
    # a float16 mean's bfloat16 hypothesis: inputs (1, 2, 3) are bf16 already: centre 2, the float32 envelope with
    # the half format's u_m on every operation (u = 2**-24 + 2**-11) and two float16 stores. The division is charged
    # (u + u_m) |mean| on top of that u: 2**-24 + 2 * 2**-11 (as the code does it; the module docstring's "u |mean|
    # for the division", with u = 2**-24 + 2**-11, would be one u_m less; the norms' affine steps likewise)
    x = np.array([1.0, 2.0, 3.0], np.float16)
    hyps, _ = envelopes("mean", {"x": x, "dim": None, "keepdim": False, "dtype": None}, np.array(2.0), FLOAT16)
    h = {k: (c, b) for k, _, c, b in hyps}
    uu = U + UH
    want = g(2, uu) * 2 + (U + 2 * UH) * 2 + 2 * (UH * 2 + ETA_H)
    assert float(h["bf16"][0]) == 2.0
    close(h["bf16"][1], want)
    close(h["rounding"][1], want)


def test_pools_and_term_counts_by_hand():
    x = np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]], np.float32)
    # adaptive_avg_pool1d 5 -> 2: windows [0, 3) and [2, 5) (means 2 and 4), charged as sums of
    # n = min(ceil(5 / 2) + 1, 5) = 4 terms: gamma_3 mean|x| + u |y| (the division) + the store
    got, n = rounding("adaptive_avg_pool1d", {"input": x, "output_size": 2}, [[[2.0, 4.0]]], FLOAT32)
    assert n == 4
    close(got, [[[g(3, U) * m + 2 * U * m + 2.0**-150 for m in (2.0, 4.0)]]])
    # avg_pool1d kernel 2 (stride 2): n = 2 terms, means 1.5 and 3.5
    got, n = rounding("avg_pool1d", {"input": x[..., :4], "kernel_size": 2}, [[[1.5, 3.5]]], FLOAT32)
    assert n == 2
    close(got, [[[g(1, U) * m + 2 * U * m + 2.0**-150 for m in (1.5, 3.5)]]])
    # avg_pool2d kernel 2 over a 2 x 2 image: n = 4 terms
    x2 = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    got, n = rounding("avg_pool2d", {"input": x2, "kernel_size": 2}, [[[[2.5]]]], FLOAT32)
    assert n == 4
    close(got, [[[[g(3, U) * 2.5 + 2 * U * 2.5 + 2.0**-150]]]])
    # the terms per output element reported for the other kinds
    xs = np.zeros((2, 3), np.float32)
    assert rounding("cumsum", {"x": xs, "dim": 1, "dtype": None}, np.zeros((2, 3)), FLOAT32)[1] == 3
    assert rounding("softmax", {"input": xs, "dim": 1, "dtype": None}, np.full((2, 3), 1 / 3), FLOAT32)[1] == 3
    assert rounding("layer_norm", _ln_args([1.0, 3.0], None, None, 0.0, np.float32), [[-1.0, 1.0]], FLOAT32)[1] == 2
    args = {"input": np.array([[[1.0, 3.0]]], np.float32), "running_mean": None, "running_var": None,
            "weight": None, "bias": None, "training": True, "eps": 0.0}  # fmt: skip
    assert rounding("batch_norm", args, [[[-1.0, 1.0]]], FLOAT32)[1] == 2
    q = np.zeros((1, 1), np.float32)
    sd = {"query": q, "key": np.zeros((3, 1), np.float32), "value": np.zeros((3, 1), np.float32), "attn_mask": None,
          "dropout_p": 0.0, "is_causal": False, "scale": 1.0, "enable_gqa": False}  # fmt: skip
    assert rounding("scaled_dot_product_attention", sd, [[0.0]], FLOAT32)[1] == 3
    # F.rms_norm's default eps follows the input: float32's epsilon 2**-23 (float64's 2**-52)
    from refkern.analysis._envelope_ops import layout

    a = {"input": np.zeros((1, 2), np.float32), "normalized_shape": (2,), "weight": None, "eps": None}
    assert layout("rms_norm", a, (1, 2)).eps == 2.0**-23
    assert layout("rms_norm", dict(a, input=np.zeros((1, 2))), (1, 2)).eps == 2.0**-52


# ------------------------------------------------------------------ softmax, log_softmax, attention (forward)

SDPA = "scaled_dot_product_attention"


def _lg(s):
    return -math.log1p(-s) if s < 1 else math.inf


def _rows_by_hand(z, dl, d64, u, um, ops, rescales, eta_h=0.0, emin_h=-14):
    """One row of _envelope_softmax._Rows from envelope's docstring, in plain Python: the logit errors Delta_j
    (plus the float64 exp's 2**-52 (M - z_j + 1)), theta_j = Delta_j + 3 u (max_k (z_k + Delta_k) - z_j + Delta_j),
    the rank R_j = #{k: z_k + 2 Delta_k >= z_j - 2 Delta_j} - 1, eps_e = 2 * 20 u (exp within 20 ulps),
    lam_d = theta + L((1 + R) eps_e + (R + n - 1) u + u_m), lam_n = theta + L((1 + R') eps_e + (R' + ops) u + u_m),
    a = 6 n eta e**(2 lam_max) D, plus eta_h 2 D e**(2 lam_max) per stored term below the half format's normal range."""
    n = len(z)
    M = max(z)
    gap = [M - zj for zj in z]
    d64 = [d + 2.0**-52 * (gp + 1) for d, gp in zip(d64, gap)]
    dd = [a + b for a, b in zip(dl, d64)]
    top = max(zj + dj for zj, dj in zip(z, dd))
    theta = [dj + 3 * u * (top - zj + dj) for zj, dj in zip(z, dd)]
    R = [sum(1 for zk, dk in zip(z, dd) if zk + 2 * dk >= zj - 2 * dj) - 1 for zj, dj in zip(z, dd)]
    eps_e = 2 * 20 * u
    lam_d = [th + _lg((1 + r) * eps_e + (r + n - 1) * u + um) for th, r in zip(theta, R)]
    Rn = [r if rescales is None else min(r, rescales) for r in R]
    lam_n = [th + _lg((1 + r) * eps_e + (r + ops) * u + um) for th, r in zip(theta, Rn)]
    t = [math.exp(-gp) for gp in gap]
    D = sum(t)
    lmax = max(lam_d + lam_n)
    a = 6 * n * ETA_W * math.exp(2 * lmax) * D
    if eta_h:
        thr = 2.0**emin_h * 2 * D * math.exp(lmax)
        n_u = sum(1 for tj, ld, ln in zip(t, lam_d, lam_n) if tj * math.exp(-max(ld, ln)) < thr)
        a += eta_h * n_u * 2 * D * math.exp(2 * lmax)
    e_d = [tj * math.expm1(lj) for tj, lj in zip(t, lam_d)]
    e_n = [tj * math.expm1(lj) for tj, lj in zip(t, lam_n)]
    return {"t": t, "D": D, "ED": sum(e_d), "e_n": e_n, "a": a, "d64max": max(d64), "M": M, "gap": gap, "R": R}


def _softmax_by_hand(z, ref, out_u, eta_o, um=0.0, eta_h=0.0, log=False):
    """softmax's (log_softmax's) rounding envelope of one row of logits z around ref, float32 arithmetic."""
    n = len(z)
    rows = _rows_by_hand(z, [0.0] * n, [0.0] * n, U, um, 2, 1, eta_h)
    D, ED, a, slack = rows["D"], rows["ED"], rows["a"], 1 + (n + 64) * 2.0**-50
    out = []
    for i, r in enumerate(ref):
        o = (abs(r) + eta_o) / (1 - out_u)  # |exact| from its rounding
        if not log:
            b = (rows["e_n"][i] + o * ED + a + o * a) / (D - ED - a) * slack + 2 * math.expm1(2 * rows["d64max"]) * o
        else:
            ell = _lg((ED + a) / D) + _lg(um)  # the sum, its store
            err_l = ell + (2 * 4 * U + um) * (math.log(D) + ell) + max(ETA_W, eta_h) + U * abs(rows["M"])
            c = U * max(rows["gap"][i], abs(rows["M"]) + math.log(D) + err_l)
            b = (err_l + c + U * (o + err_l + c)) * slack + 3 * rows["d64max"]
        out.append(b + out_u * o + eta_o + out_u * abs(r) + eta_o)  # the centre's rounding, the store
    return out


def _sm(name, z, ref, out, dt):
    return rounding(name, {"input": np.array(z, dt), "dim": 0, "dtype": None}, ref, out)[0]


def test_softmax_envelopes_by_hand():
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    # [0, 0, 0]: ties rank each term below the two others (R = 2), the output's own exp rescaled once (R' = 1)
    ref = [f32(1 / 3)] * 3
    close(_sm("softmax", [0.0] * 3, ref, FLOAT32, np.float32), _softmax_by_hand([0.0] * 3, ref, U, ETA_O))
    # [0, -80]: the second weight (1.8e-35) is all underflow: a = 6 n eta e**(2 lam_max) D dominates its bound
    w1 = math.exp(-80) / (1 + math.exp(-80))
    ref = [f32(1 - w1), f32(w1)]
    want = _softmax_by_hand([0.0, -80.0], ref, U, ETA_O)
    close(_sm("softmax", [0.0, -80.0], ref, FLOAT32, np.float32), want)
    assert 12 * ETA_W < want[1] < 13 * ETA_W
    # [0, -1.5 * 2**-50]: 2 Delta apart (Delta = 2**-52 (gap + 1)) the logits do not tie: R = (0, 1)
    z = [0.0, -1.5 * 2.0**-50]
    assert _rows_by_hand(z, [0.0] * 2, [0.0] * 2, U, 0.0, 2, 1)["R"] == [0, 1]
    close(_sm("softmax", z, [0.5, 0.5], FLOAT32, np.float32), _softmax_by_hand(z, [0.5, 0.5], U, ETA_O))
    # log_softmax of [1, 1]: M = 1, so the reference's shift u |M| and c = u (|M| + log D + err_L)
    ref = [f32(-math.log(2))] * 2
    close(
        _sm("log_softmax", [1.0, 1.0], ref, FLOAT32, np.float32), _softmax_by_hand([1.0, 1.0], ref, U, ETA_O, log=True)
    )
    # float16, [0, -12]: the second term (6e-6) is stored below float16's normal range (2**-14 2 D e**lam_max): a gains
    # eta_h 2 D e**(2 lam_max), which dominates its bound with the stores' eta_h
    w1 = math.exp(-12) / (1 + math.exp(-12))
    ref = [float(np.float16(1 - w1)), float(np.float16(w1))]
    want = _softmax_by_hand([0.0, -12.0], ref, UH, ETA_H, um=UH, eta_h=ETA_H)
    close(_sm("softmax", [0.0, -12.0], ref, FLOAT16, np.float16), want)
    # and the log_softmax of [0, -12] in float16 (the sum and its log stored)
    ref = [float(np.float16(-math.log1p(math.exp(-12)))), float(np.float16(-12 - math.log1p(math.exp(-12))))]
    close(_sm("log_softmax", [0.0, -12.0], ref, FLOAT16, np.float16),
          _softmax_by_hand([0.0, -12.0], ref, UH, ETA_H, um=UH, eta_h=ETA_H, log=True))  # fmt: skip


def _attention_by_hand(q, ks, vs, mask, ref, um, out_u, eta_o, eta_h):
    """One query (E = 1, scale 1) over keys ks with values vs (Ev = 1) and a float mask, from envelope's and
    _envelope_softmax's docstrings: gamma_{E+6} on s sum|q k|, (E + 6) eta; half results: (1 + u_m)**2 on the
    product, a stored q or k that underflows, the scores stored; a float mask converted, added and stored."""
    E, S = 1, len(ks)
    G = (E + 6) * U / (1 - (E + 6) * U)
    G_h = (1 + G) * (1 + um) ** 2 - 1
    z, dl, d64 = [], [], []
    for k, m in zip(ks, mask):
        mag, zz = abs(q * k), q * k + m
        d = G_h * mag + (E + 6) * ETA_W
        if um:
            d = d + (1 + G_h) * eta_h * 1.0 * (abs(q) + abs(k)) + E * eta_h**2
            d = d + um * (mag + d) + eta_h
        if m != 0:
            d = d + (2 * U + um) * (1 + 2 * U + um) * (abs(zz) + mag + d) + eta_h
        z.append(zz)
        dl.append(d)
        d64.append(2.0**-52 * ((E + 2) * mag + abs(zz)))
    rows = _rows_by_hand(z, dl, d64, U, um, 2 + 1 + S - 1, None, eta_h)
    vmax = max(abs(v) for v in vs)
    o = (abs(ref) + eta_o) / (1 - out_u)
    num = sum(e * abs(v) for e, v in zip(rows["e_n"], vs))
    D, ED, a = rows["D"], rows["ED"], rows["a"]
    b = (num + o * ED + a * max(vmax, 1.0) + o * a) / (D - ED - a) * (1 + (S + E + 64) * 2.0**-50)
    return b + 2 * math.expm1(2 * rows["d64max"]) * vmax + out_u * o + eta_o + out_u * abs(ref) + eta_o


def test_attention_envelope_with_a_float_mask_by_hand():
    # q = [1], keys [1] and [-1], values [1] and [3], mask [0.5, 0] (a float mask on the first key): z = (1.5, -1)
    exact = (math.exp(1.5) + 3 * math.exp(-1)) / (math.exp(1.5) + math.exp(-1))
    for dt, fmt, um, uo, eo, eh in (
        (np.float32, FLOAT32, 0.0, U, ETA_O, 0.0),
        (np.float16, FLOAT16, UH, UH, ETA_H, ETA_H),
    ):
        ref = float(dt(exact))
        args = {"query": np.array([[1.0]], dt), "key": np.array([[1.0], [-1.0]], dt),
                "value": np.array([[1.0], [3.0]], dt), "attn_mask": np.array([[0.5, 0.0]], dt), "dropout_p": 0.0,
                "is_causal": False, "scale": 1.0, "enable_gqa": False}  # fmt: skip
        got = rounding(SDPA, args, [[ref]], fmt)[0]
        close(got[0, 0], _attention_by_hand(1.0, [1.0, -1.0], [1.0, 3.0], [0.5, 0.0], ref, um, uo, eo, eh))


def test_softmax_helpers_by_hand():
    from refkern.analysis import _envelope_softmax as es

    # the envelope's own float64 evaluation: 1 + (n + E + 64) 2**-50
    assert es._slack(3, 2) == 1.0 + 69 * 2.0**-50
    # gamma of the reduced-precision P @ V: k u / (1 - k u), no claim from k u = 1/2
    assert es._gamma(3, 0.125) == 0.375 / 0.625 and es._gamma(4, 0.125) == math.inf
    # the ratio N^ / D^ (envelope's docstring): (sum e'|v| + |o| E_D + a max(1, max|v|) + |o| a) / (D - E_D - a), times
    # the slack, plus 2 (e**(2 Delta64) - 1) max|v|, on a row whose D, E_D, a and Delta64 are set by hand
    rows = es._Rows(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), U, 0.0, FLOAT32, 2)
    rows.D, rows.ED, rows.a, rows.d64max = np.array([2.0]), np.array([0.05]), np.array([0.1]), np.array([2.0**-40])
    got = rows.ratio_bound(np.array([[0.01]]), np.array([[0.5]]), np.array([[3.0]]), 1.5, np.array([[3.0]]))
    want = (0.01 + 0.5 * 0.05 + 0.1 * 3 + 0.5 * 0.1) / (2 - 0.05 - 0.1) * 1.5 + 2 * math.expm1(2 * 2.0**-40) * 3
    close(got, [[want]])
    # a stored output: [fl(ref - B), fl(ref + B)] around fl(ref). ref = 1, B = 0.4 * 2**-11: both ends round to 1 in
    # float16 (its spacing is 2**-11 below 1, 2**-10 above): no distance; B = 0.6 * 2**-11 reaches 1 - 2**-11
    for B, d in ((0.4 * 2.0**-11, 0.0), (0.6 * 2.0**-11, 2.0**-11)):
        c, dist = es._stored_output(np.array([1.0]), np.array([B]), FLOAT16)
        assert (float(c[0]), float(dist[0])) == (1.0, d), B
    # the interval's ends are widened by one float64 ulp each (2**-52 relative): 1 + B with B = 2**-11 - 2**-52
    # stays at the float16 tie 1 + 2**-11 (which rounds to even, 1), one more ulp would round up to 1 + 2**-10
    one = np.array([1.0])
    c, dist, _ = es._rounded_between(one, one, np.array([1.0 + 2.0**-11 - 2.0**-52]), FLOAT16)
    assert (float(c[0]), float(dist[0])) == (1.0, 0.0)
    # a float32 value below float32's normal range may be flushed: lo taken to 0 below 2**-126, not above
    v = np.array([1.5 * 2.0**-126])
    assert float(es._rounded_between(v, v, v, BFLOAT16, 2.0**-126)[1][0]) == 0.0
    v = np.array([0.75 * 2.0**-126])
    assert float(es._rounded_between(v, v, v, BFLOAT16, 2.0**-126)[1][0]) == 0.75 * 2.0**-126


def test_named_bug_thresholds_by_hand():
    from refkern.analysis import _envelope_softmax as es

    # exp without the max subtraction overflows float32 from log(2**128 (1 - 2**-24)), less a margin of 0.01
    log_max = math.log(2 - 2.0**-23) + 127 * math.log(2)
    f = lambda m: bool(es._no_max_subtraction(np.array([m]), FLOAT32)[0])  # noqa: E731
    assert (f(log_max - 0.015), f(log_max - 0.005)) == (False, True)
    # or underflows entirely below the log of the smallest subnormal, 2**-149
    assert (f(-148.5 * math.log(2)), f(-149.5 * math.log(2))) == (False, True)
    # log(softmax) gives -inf where the reference is below the log of float32's smallest normal, 2**-126
    fn = es._log_of_softmax_namer(FLOAT32)
    bad = np.array([True])
    assert fn(np.array([-np.inf]), bad, np.array([-126.5 * math.log(2)]))
    assert not fn(np.array([-np.inf]), bad, np.array([-125.5 * math.log(2)]))


def test_rounded_p_bounds_by_hand():
    from refkern.analysis._envelope_ops import layout
    from refkern.analysis._envelope_softmax import reduced_hypotheses

    # q = [0], keys [0] and [0], values [1] and [3] (float32): w = (1/2, 1/2) lies inside its fp16/bf16 cells, so
    # the normalised hypothesis is P @ V in float32 (gamma_2 sum |p v|), the float64 centre (gamma_{S+4}(2**-53))
    # and the float32 store u (|c| + e) / (1 - u) + 2**-150
    def hyps(v):
        args = {"query": np.zeros((1, 1), np.float32), "key": np.zeros((2, 1), np.float32),
                "value": np.array(v, np.float32), "attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                "scale": 1.0, "enable_gqa": False}  # fmt: skip
        lay = layout(SDPA, args, (1, 1))
        c = 0.5 * (v[0][0] + v[1][0])
        return {h[0]: h[3]() for h in reduced_hypotheses(SDPA, lay, np.array([[c]]), FLOAT32, np.zeros((1, 1)))}

    g2, g64 = 2 * U / (1 - 2 * U), 6 * 2.0**-53 / (1 - 6 * 2.0**-53)
    e = g2 * (0.5 * 1 + 0.5 * 3) + g64 * 2
    h = hyps([[1.0], [3.0]])
    for p in ("fp16", "bf16"):
        centre, bnd = h[f"{p} P@V"]
        assert float(centre[0, 0]) == 2.0
        close(bnd[0, 0], e + U * (2 + e) / (1 - U) + 2.0**-150)
    # flash: the terms t = (1, 1) within e**+-lt of their exact value (no rounding cell crossed), P' @ V in float32
    # over the float32 sum D^ within E_D + a of D = 2 (lam_d as softmax's, ties: R = 1, lam_n with the product, the
    # division and one addition), then the reciprocal and the product 2u (|c| + e)(1 + 4u), float64's gamma_6, the store
    rows = _rows_by_hand([0.0, 0.0], [7 * ETA_W] * 2, [0.0, 0.0], U, 0.0, 2 + 1 + 2 - 1, None)
    err_n = g2 * (1 * 1 + 1 * 3) + g64 * (1 * 1 + 1 * 3)
    ee = (err_n + 2 * (rows["ED"] + rows["a"])) / (2 - rows["ED"] - rows["a"])
    ee = ee + 2 * U * (2 + ee) * (1 + 4 * U) + g64 * 2
    for p in ("fp16", "bf16"):
        centre, bnd = h[f"{p} P@V (flash)"]
        assert float(centre[0, 0]) == 2.0
        close(bnd[0, 0], ee + U * (2 + ee) / (1 - U) + 2.0**-150)
    # values 0: every term of the bound vanishes but the float32 store's half subnormal
    h = hyps([[0.0], [0.0]])
    assert all(float(b[0, 0]) == 2.0**-150 for _, b in h.values())


# ------------------------------------------------------------------ gradients (_envelope_backward)


def gb(k, u):
    """_envelope_backward's own gamma: k u / (1 - k u) (no slack factor)."""
    return k * u / (1 - k * u)


def _store_back(E, ref, second, uw, uo, eta_o, exact=False):
    """Step 5/6: E (1 + SECOND u) + u_o (2 |dx| + E) + 2 eta_o, then EVAL_SLACK = 1 + 2**-40; |dx| <= |ref| (1 + 2 u_o)
    from the reference (the norms' step 6), or |dx| itself where it is known (``exact``: softmax's step 5)."""
    dx = ref if exact else ref * (1 + 2 * uo)
    return (E * (1 + second * uw) + uo * (2 * dx + E) + 2 * eta_o) * (1 + 2.0**-40)


def test_softmax_gradient_envelopes_by_hand():
    from refkern.analysis import _envelope_backward as envb

    x = np.zeros((1, 2))
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    for fmt, uo, eta_o, um, eta_h, cast in ((FLOAT32, U, ETA_O, 0.0, 0.0, f32),
                                            (FLOAT16, UH, ETA_H, UH, ETA_H, lambda v: float(np.float16(v)))):  # fmt: skip
        for gg in ([1.0, 3.0], [0.0, 0.0]):
            g = np.array([gg])
            # softmax: y = (1/2, 1/2), D = sum g y; the forward's envelope b_f (envelope's docstring) and its centre's
            # store make eta_j; e_D = sum|g| eta + gamma_n (sum|g y| + sum|g| eta) + n eta_w + 2 (n + 2) 2**-53 (...)
            b_f = _softmax_by_hand([0.0, 0.0], [0.5, 0.5], uo, eta_o, um=um, eta_h=eta_h)[0]
            eta = b_f + uo * 0.5 + eta_o + 2.0**-52 * 0.5 + 2.0**-1074
            D = 0.5 * sum(gg)
            A1, Ge = 0.5 * sum(abs(v) for v in gg), eta * sum(abs(v) for v in gg)
            e_D = Ge + gb(2, U) * (A1 + Ge) + 2 * ETA_W + 2 * 4 * 2.0**-53 * (A1 + Ge)
            e_D = (e_D + um * abs(D) + eta_h) / (1 - um)  # D^ stored in a half format
            want = []
            for gi in gg:
                H = abs(gi - D) + e_D
                inner = e_D + 3 * U * (abs(gi) + abs(D) + e_D) + um * H + eta_h
                E = eta * H + (0.5 + eta) * inner + 2 * ETA_W
                want.append(_store_back(E, abs(0.5 * (gi - D)), 4, U, uo, eta_o, exact=True))
            ref = np.array([[0.5 * (gi - D) for gi in gg]])
            close(envb.bound("softmax", x, g, ref, fmt)[0], want)
            # log_softmax: l = -log 2, its envelope lam, exp(l^) within expm1(lam) + 20 u e**lam; G = sum g
            fwd = -math.log(2)
            b_f = _softmax_by_hand([0.0, 0.0], [cast(fwd)] * 2, uo, eta_o, um=um, eta_h=eta_h, log=True)[0]
            lam = b_f + uo * abs(fwd) + eta_o + 2.0**-52 * abs(fwd) + 2.0**-1074
            eta = 0.5 * (math.expm1(lam) + 20 * U * math.exp(lam)) + ETA_W + 2.0**-52 * 0.5 + 2.0**-1074
            G, AG = sum(gg), sum(abs(v) for v in gg)
            e_G = gb(1, U) * AG + 2 * 4 * 2.0**-53 * AG
            e_G = (e_G + um * abs(G) + eta_h) / (1 - um)
            want = []
            for gi in gg:
                E = eta * (abs(G) + e_G) + 0.5 * e_G + 2 * U * (abs(gi) + (0.5 + eta) * (abs(G) + e_G)) + ETA_W
                want.append(_store_back(E, abs(gi - 0.5 * G), 4, U, uo, eta_o, exact=True))
            ref = np.array([[gi - 0.5 * G for gi in gg]])
            close(envb.bound("log_softmax", x, g, ref, fmt)[0], want)
    # log_softmax of [0, -80], g = (1, 0): the second weight (1.8e-35) is within y (expm1(lam) + 20 u e**lam) + eta_w
    # of exp(l^), eta_w (float32's smallest normal) most of it
    x = np.array([[0.0, -80.0]])
    y1 = math.exp(-80) / (1 + math.exp(-80))
    fwd = [-math.log1p(math.exp(-80)), -80.0]
    b_f = _softmax_by_hand([0.0, -80.0], [f32(v) for v in fwd], U, ETA_O, log=True)[1]
    lam = b_f + U * 80 + ETA_O + 2.0**-52 * 80 + 2.0**-1074
    eta = y1 * (math.expm1(lam) + 20 * U * math.exp(lam)) + ETA_W + 2.0**-52 * y1 + 2.0**-1074
    e_G = gb(1, U) * 1 + 2 * 4 * 2.0**-53 * 1
    E = eta * (1 + e_G) + y1 * e_G + 2 * U * (0 + (y1 + eta) * (1 + e_G)) + ETA_W
    got = envb.bound("log_softmax", x, np.array([[1.0, 0.0]]), np.array([[-1.0 + f32(1 - y1), -f32(y1)]]), FLOAT32)
    close(got[0, 1], _store_back(E, y1, 4, U, U, ETA_O, exact=True))


def _norm_stats(x, center, u, um, eps=0.0):
    """Step 1 of the norms' derivation (the forward envelope's statistics) for one row."""
    n = len(x)
    mu = sum(x) / n if center else 0.0
    m2 = sum((v - mu) ** 2 for v in x)
    q = sum(v * v for v in x)
    A = sum(abs(v) for v in x) / n
    dmu = g(n, u) * A + um * abs(mu) if center else 0.0
    e_m2 = g(n + 3, u) * math.sqrt(q) * math.sqrt(m2) + n * (g(n, u) * A) ** 2 + 2 * n * 0.5 * 2.0**-149
    var = m2 / n
    z = var + eps
    e_w = e_m2 / n + u * var + u * z
    r = 1 / math.sqrt(z)
    e_r = max(1 / math.sqrt(z - e_w) - r, r - 1 / math.sqrt(z + e_w)) + (2 * u + um) * r
    return mu, dmu, r, e_r


def test_norm_gradient_envelopes_by_hand():
    from refkern.analysis import _envelope_backward as envb

    x = [1.0, 3.0]
    X = np.array([x])
    # grad_input of layer_norm, x = (1, 3) (mu = 2, d = -+1, r = 1), g = (2, 5), no weight: both gradients are 0
    for fmt, um, uo, eta_o, stored in ((FLOAT32, 0.0, U, ETA_O, False), (FLOAT16, UH, UH, ETA_H, True)):
        for gg in ([2.0, 5.0], [0.0, 0.0]):
            mu, dmu, r, e_r = _norm_stats(x, True, U, um)
            R1, n = r + e_r, 2
            S, Sa = sum(gg), sum(abs(v) for v in gg)
            e_S = g(n, U) * Sa + (um * Sa if stored else 0.0)  # ds and db stored once in the half format
            Ad, e_A = S / n, e_S / n
            Cn = sum(gi * (xi - mu) for gi, xi in zip(gg, x))
            gx = sum(abs(gi * xi) for gi, xi in zip(gg, x)) + abs(mu) * Sa
            e_C = g(n + 2, U) * gx + n * 2.0**-52 * sum(abs(gi * (xi - mu)) for gi, xi in zip(gg, x))
            e_C += um * gx if stored else 0.0
            Cm, Am = abs(Cn) + e_C + dmu * abs(S), abs(Ad) + e_A
            want = []
            for gi, xi in zip(gg, x):
                d, xm = abs(xi - mu), abs(xi) + abs(mu) + dmu
                E = (e_r * (abs(gi) + Am) + R1 * e_A
                     + (3 * e_r * R1**2 * (d + dmu) * Cm + r**3 * dmu * Cm + r**3 * d * (e_C + dmu * abs(S))) / n
                     + 8 * U * (R1 * (abs(gi) + Am) + R1**3 * xm * Cm / n)
                     + (n + 8) * ETA_W * (R1 + R1**3 * xm))  # fmt: skip
                # a half input: each g w rounded to its format (u_m), through gw_j, S / n and r**3 d_j Cn / n
                E += um * (R1 * (abs(gi) + Sa / n) + R1**3 * (d + dmu) * sum(abs(gk) * (abs(xk - mu) + dmu)
                                                                           for gk, xk in zip(gg, x)) / n)  # fmt: skip
                want.append(_store_back(E, 0.0, 8, U, uo, eta_o))
            got = envb.norm_bound("layer_norm", "input", X, np.array([gg]), None, 0.0, np.zeros((1, 2)),
                                  {"input": fmt}, stored_sums=stored)  # fmt: skip
            close(got[0], want)
    # squares that underflow: x = +-2**-75 (x**2 = 2**-150), eps = 2**-140, g = (1, 0): the underflow term of e_M2,
    # n 2**-149, dominates e_r (about r 2**-10) and so E
    t = 2.0**-75
    x3, gg = [-t, t], [1.0, 0.0]
    mu, dmu, r, e_r = _norm_stats(x3, True, U, 0.0, eps=2.0**-140)
    R1, n = r + e_r, 2
    e_S = g(n, U) * 1.0
    Cn = -t
    e_C = g(n + 2, U) * (t + 0.0) + n * 2.0**-52 * t
    Cm, Am = abs(Cn) + e_C + dmu * 1.0, 0.5 + e_S / n
    want = []
    for gi, xi in zip(gg, x3):
        d, xm = abs(xi - mu), abs(xi) + abs(mu) + dmu
        E = (e_r * (abs(gi) + Am) + R1 * e_S / n
             + (3 * e_r * R1**2 * (d + dmu) * Cm + r**3 * dmu * Cm + r**3 * d * (e_C + dmu * 1.0)) / n
             + 8 * U * (R1 * (abs(gi) + Am) + R1**3 * xm * Cm / n) + (n + 8) * ETA_W * (R1 + R1**3 * xm))  # fmt: skip
        want.append(_store_back(E, 0.0, 8, U, U, ETA_O))
    got = envb.norm_bound("layer_norm", "input", np.array([x3]), np.array([gg]), None, 2.0**-140, np.zeros((1, 2)),
                          {"input": FLOAT32})  # fmt: skip
    close(got[0], want)
    assert e_r > r * 2.0**-11
    # grad_weight and grad_bias over two equal rows x = (1, 3), g = (2, 5) and (1, 1): xhat = (-1, 1), T = 2 terms;
    # each term's xhat^ within e_xh = e_r D + r dmu + 3 u R1 (|x| + |mu| + dmu) (block 1) or (gamma_{2+3} + u_m) R1 ...
    # (block 2, the raw form); the sum gamma_T(u + u_m) (half_sums) or gamma_T(u) + u_m, and T (2T) eta_w
    X2, G2 = np.array([x, x]), np.array([[2.0, 5.0], [1.0, 1.0]])
    for fmt, um, uo, eta_o, half, block in ((FLOAT32, 0.0, U, ETA_O, True, 1), (FLOAT16, UH, UH, ETA_H, True, 1),
                                            (BFLOAT16, UB, UB, 2.0**-134, False, 1),
                                            (BFLOAT16, UB, UB, 2.0**-134, False, 2)):  # fmt: skip
        for Gm in (G2, 0 * G2):
            mu, dmu, r, e_r = _norm_stats(x, True, U, um)
            R1 = r + e_r
            g_T = g(2, U + um) if half else g(2, U) + um
            want_w, want_b = [], []
            for k in range(2):
                d, xm = abs(x[k] - mu), abs(x[k]) + abs(mu) + dmu
                rw = (3 * U) if block == 1 else (g(2 + 3, U) + um)
                e_xh = e_r * (d + dmu) + r * dmu + rw * R1 * xm
                ag = abs(Gm[0, k]) + abs(Gm[1, k])
                E = ag * e_xh + g_T * ag * (d * r + e_xh) + (2 if block == 1 else 4) * ETA_W
                ref = abs(Gm[0, k] + Gm[1, k]) * d
                want_w.append(_store_back(E, ref, 8, U, uo, eta_o))
                g_B = g(1, U + um) if half else g(1, U) + um
                want_b.append(_store_back(g_B * ag, ag, 8, U, uo, eta_o))
            kw = {"block": block, "half_sums": half}
            refw = (Gm[0] + Gm[1]) * np.array([-1.0, 1.0])
            got = envb.norm_bound("layer_norm", "weight", X2, Gm, None, 0.0, refw, {"input": fmt, "weight": fmt}, **kw)
            close(got, want_w)
            got = envb.norm_bound("layer_norm", "bias", X2, Gm, None, 0.0, Gm.sum(axis=0), {"input": fmt, "bias": fmt},
                                  **kw)  # fmt: skip
            close(got, want_b)


def test_batch_norm_eval_gradient_envelopes_by_hand():
    from refkern.analysis import _envelope_backward as envb

    # one channel, K = 3: x = (1, 2, 4), running mean 1, var 4, eps 0: z = 4, r = 1/2; g = (1, -1, 2)
    X, RM, RV = np.array([[1.0, 2.0, 4.0]]), np.array([1.0]), np.array([4.0])
    for fmt, um, uo, eta_o in ((FLOAT32, 0.0, U, ETA_O), (BFLOAT16, UB, UB, 2.0**-134)):
        for gg in ([1.0, -1.0, 2.0], [0.0, 0.0, 0.0]):
            G = np.array([gg])
            e_z = U * (0 + 4) * (1 + U)  # eps converted, the addition
            move = e_z / (2 * (4 - e_z) ** 1.5)  # 1/sqrt over [z - e_z, z + e_z]
            R1 = 0.5 * (1 + 2 * U + um) + move
            e_r = move + (2 * U + um) * R1
            fm = {"input": fmt, "weight": fmt, "bias": fmt}
            gd = sum(abs(gi) * abs(xi - 1) for gi, xi in zip(gg, X[0]))
            E = e_r * gd + (g(3 + 2, U) + um) * R1 * gd + 2 * 3 * ETA_W
            ref = 0.5 * sum(gi * (xi - 1) for gi, xi in zip(gg, X[0]))
            got = envb.batch_norm_eval_bound("weight", X, G, None, RM, RV, 0.0, np.array([ref]), fm)
            close(got, [_store_back(E, abs(ref), 8, U, uo, eta_o)])
            ag = sum(abs(v) for v in gg)
            got = envb.batch_norm_eval_bound("bias", X, G, None, RM, RV, 0.0, np.array([sum(gg)]), fm)
            close(got, [_store_back((g(2, U) + um) * ag, abs(sum(gg)), 8, U, uo, eta_o)])
            want = [_store_back(abs(gi) * (e_r + 2 * U * R1) + 2 * ETA_W, abs(0.5 * gi), 8, U, uo, eta_o) for gi in gg]
            got = envb.batch_norm_eval_bound("input", X, G, None, RM, RV, 0.0, 0.5 * G, fm)
            close(got[0], want)


def test_pool_mean_var_converted_gradient_envelopes_by_hand():
    from fractions import Fraction

    from refkern.analysis import _envelope_backward as envb

    # an average's element with no gradient: only the 2 k eta_w of its k = 3 divisions (or products) that underflow
    got = envb.pool_bound(np.array([0.0]), np.array([3]), np.array([0.0]), FLOAT32, exact_terms=False)
    E = 6 * ETA_W
    close(got, [(E * (1 + 2 * 5 * 2.0**-53) + U * E + 2 * ETA_O) * (1 + 2.0**-40)])
    # a maximum's element in float64 with k = 2**40 exact terms: gamma_{k-1}(2**-53) and asum's own float64 sum,
    # 2 (k + 2) 2**-53, both visible at this k
    k, u64 = 2.0**40, 2.0**-53
    E = g(k - 1, u64) * 1.0
    want = (E * (1 + 2 * (k + 2) * u64) + u64 * (2 * 1.0 * (1 + 2 * u64) + E) + 2 * 2.0**-1075) * (1 + 2.0**-40)
    close(envb.pool_bound(np.array([1.0]), np.array([k]), np.array([1.0]), FLOAT64, exact_terms=True), [want])
    # cumsum's gradient with dtype=: the forward cumsum envelope of the reversed converted grad_output (gp = (1, 2):
    # reversed prefix sums (2, 3), gamma_i of them plus the store) plus the exact distance of the two references
    ref_p, ref = np.array([[3.0, 2.0]]), np.array([[3.0 + 2.0**-20, 2.0]])
    got = envb.cumsum_converted_bound(np.array([[1.0, 2.0]]), 1, ref_p, ref, FLOAT32)
    close(got, [[g(1, U) * 3 + U * 3 + ETA_O + 2.0**-20, 0 + U * 2 + ETA_O]])
    # mean's gradient with g = 0: only eta_w (a product that underflows)
    got = envb.mean_bound(np.array([0.0]), np.array([0.0]), FLOAT32)
    close(got, [(ETA_W * (1 + 2.0**-52) + U * ETA_W + 2 * ETA_O) * (1 + 2.0**-40)])
    # converted gradient (computed in float32, converted to float64) around a zero reference: the conversion of
    # b_c = 2**-149 with |dx| <= 2 eta_c and eta_c = 2**-150
    dx = 2 * 2.0**-150
    want = ((2.0**-149 + U * dx + 2.0**-150) * (1 + u64) + 2 * u64 * dx + 2 * 2.0**-1075) * (1 + 2.0**-40)
    close(envb.converted_bound(np.array([2.0**-149]), np.array([0.0]), FLOAT32, FLOAT64), [want])
    # var's gradient, x = (-1, 1), correction 0 (K = 1), float16: mean^ within gamma_3(u) A + u_m (...) + eta_o,
    # x - mean^ within e_d (u + u_m per step), t = fl(fl(2 / dof) g) within 3 (u + u_m) K Q + eta_o
    for gv, fmt, um, uo, eta_o in ((1.0, FLOAT16, UH, UH, ETA_H), (0.0, FLOAT32, 0.0, U, ETA_O)):
        slack = 6 * 2.0**-52 * 1.0 + 2.0**-52 * 1.0
        gn = g(3, U) * 1.0
        dmu = gn + um * (0 + gn) + eta_o
        e_d = dmu + (U + um) * (1 + dmu) + eta_o
        D = 1 + e_d + slack
        e_t = 3 * (U + um) * gv + eta_o
        E = e_t * D + gv * e_d + U * (gv + e_t) * D + ETA_W
        want = _store_back(E, gv, 8, U, uo, eta_o)
        got = envb.var_bound(np.array([[-1.0, 1.0]]), np.array([gv]), Fraction(0), np.array([[-gv, gv]]), fmt,
                             False, False)  # fmt: skip
        close(got[0], [want, want])


# ------------------------------------------------------------------ the named bugs' tolerances (only to name a mismatch)


def test_one_pass_norm_namer_thresholds_by_hand():
    # layer_norm of x = (1, 3) (var 1, eps 0, ref (-1, 1)): a one-pass variance is off by up to
    # e1 = 3 gamma_n sum x**2 / n + n 2**-149 / n (q = 10); an output s ref whose implied variance 1 / s**2 is
    # within e1 of 1 is named, one 1.5 e1 away is not
    x, ref = [1.0, 3.0], np.array([[-1.0, 1.0]])
    args = _ln_args(x, None, None, 0.0, np.float32)
    hyps, _ = envelopes("layer_norm", args, ref, FLOAT32, lazy=True)
    (fn,) = [h[2] for h in hyps if h[0] == ONE_PASS]
    e1 = 3 * g(2, U) * 10 / 2 + 2 * 2 * 0.5 * 2.0**-149 / 2
    bad = np.array([[True, False]])
    for f, named in ((0.5, True), (1.5, False)):
        s = 1 / math.sqrt(1 + f * e1)
        assert fn(s * ref, bad, ref) is named, f
    # each element must lie within the rounding envelope (times max(1, s)) of s ref: (-1, 1) + delta (s = 1) is named
    # for delta below both elements' envelopes, not for delta above the larger one
    env = _norm_row_by_hand(x, [1.0, 1.0], [0.0, 0.0], [-1.0, 1.0], 0.0, U, 0.0, 1, U, ETA_O)
    lo, hi = min(env), max(env)
    assert hi < 2 * lo
    assert fn(ref + 0.9 * lo, bad, ref) is True
    assert fn(ref + 0.5 * (hi + 2 * lo), bad, ref) is False
    # a NaN row is named where the one-pass variance can fall below -eps: var + eps <= e1. x = (1, 1 + 2**-10):
    # var = 2**-22, e1 = 3 gamma_2 (1 + (1 + 2**-10)**2) / 2 + 2**-149, about 1.5 var: named with eps = 0, not with
    # var + eps = 1.5 e1
    x = [1.0, 1.0 + 2.0**-10]
    q, var = 1.0 + (1.0 + 2.0**-10) ** 2, 2.0**-22
    e1 = 3 * g(2, U) * q / 2 + 2.0**-149
    nan = np.full((1, 2), np.nan)
    for eps, named in ((0.0, True), (1.5 * e1 - var, False)):
        assert (var + eps <= e1) is named and (var + eps <= 2 * e1) is True
        a = _ln_args(x, None, None, eps, np.float32)
        r = 1 / math.sqrt(var + eps)
        yr = np.array([[-(2.0**-11) * r, 2.0**-11 * r]])
        hyps, _ = envelopes("layer_norm", a, yr, FLOAT32, lazy=True)
        (fn,) = [h[2] for h in hyps if h[0] == ONE_PASS]
        assert fn(nan, np.ones((1, 2), bool), yr) is named, eps


def test_centre_namer_tolerance_by_hand():
    # softmax over dim 1 of a 2 x 2 zero input, named bug "dim 0": refkern's softmax over dim 0 (all 1/2) with its own
    # rounding envelope (softmax's of [0, 0], its centre's rounding and the store): within it is named, 1.5 times
    # beyond is not
    x = np.zeros((2, 2), np.float32)
    hyps, _ = envelopes("softmax", {"input": x, "dim": 1, "dtype": None}, np.full((2, 2), 0.5), FLOAT32, lazy=True)
    (fn,) = [h[2] for h in hyps if h[0] == "dim 0"]
    B = _softmax_by_hand([0.0, 0.0], [0.5, 0.5], U, ETA_O)[0]
    every = np.ones((2, 2), bool)
    assert fn(np.full((2, 2), 0.5 + 0.9 * B), every, np.full((2, 2), 0.5)) is True
    assert fn(np.full((2, 2), 0.5 + 1.5 * B), every, np.full((2, 2), 0.5)) is False


def _attention_gradients_by_hand(ks, vs, dO):
    """attention_bound's derivation (its docstring, steps 1-8) for q = [1], two keys ks and values vs (E = Ev = 1),
    scale 1, grad_output dO, float32: (dq, its bound), (dk, bounds), (dv, bounds), checked against the code."""
    from refkern.analysis import _envelope_backward as envb
    from refkern.kernels.attention import attention_operands

    uu, eta = U, ETA_W

    def f64(n):
        return (n + 16) * 2.0**-52

    S, q = 2, 1.0
    z, A = [q * k for k in ks], [abs(q * k) for k in ks]
    t = [math.exp(zj - max(z)) for zj in z]
    P = [tj / sum(t) for tj in t]
    # 1-2: logits within (4 uu + gamma_E + f64) A + 2 uu |z| + eta, the exp argument 4 uu (|z| + zmax + log S + 1),
    # the weights within expm1(dl_j + max dl) + gamma_{S + 20 + 3} (1 + ...) + (S + 4) 2**-52, and eta
    zmax = max(abs(zj) for zj in z)
    dl = [(4 * uu + gb(1, uu) + f64(1)) * a + 2 * uu * abs(zj) + eta + 4 * uu * (abs(zj) + zmax + math.log(S) + 1)
          for a, zj in zip(A, z)]  # fmt: skip
    x1 = [math.expm1(d + max(dl)) for d in dl]
    eP = [p * (x + gb(S + 20 + 3, uu) * (1 + x) + (S + 4) * 2.0**-52) + eta for p, x in zip(P, x1)]
    Pm = [p + e for p, e in zip(P, eP)]
    # 3: dP_j = dO v_j, stored
    dP = [dO * v for v in vs]
    edP = [(gb(1, uu) + f64(1)) * abs(dO * v) + uu * abs(d) + 2 * eta for v, d in zip(vs, dP)]
    # 4: Delta in either form, the larger, stored once more
    Del = sum(p * d for p, d in zip(P, dP))
    eA = (sum(e * abs(d) + pm * ed for e, d, pm, ed in zip(eP, dP, Pm, edP))
          + (gb(S, uu) + f64(S)) * sum(pm * (abs(d) + ed) for pm, d, ed in zip(Pm, dP, edP)) + S * eta)  # fmt: skip
    O = sum(p * v for p, v in zip(P, vs))
    eO = sum(e * abs(v) for e, v in zip(eP, vs)) + (gb(3 * S + 8, uu) + f64(S)) * sum(
        pm * abs(v) for pm, v in zip(Pm, vs)) + (S + 2) * eta  # fmt: skip
    eB = abs(dO) * eO + (gb(1, uu) + f64(1)) * abs(dO) * (abs(O) + eO) + eta
    eD = max(eA, eB)
    eDel = eD + uu * (abs(Del) + eD)
    # 5: h = dP - Delta, dS = P h with DS_ROUNDINGS = 3
    h = [d - Del for d in dP]
    eh = [ed + eDel + uu * (abs(d) + abs(Del) + ed + eDel) + f64(S) * (abs(d) + abs(Del)) for d, ed in zip(dP, edP)]
    edS = [e * (abs(hh) + ee) + p * ee + 3 * uu * pm * (abs(hh) + ee) + eta
           for e, p, pm, hh, ee in zip(eP, P, Pm, h, eh)]  # fmt: skip
    dSm = [abs(p * hh) + e for p, hh, e in zip(P, h, edS)]

    def store(Et, ref):  # 7-8
        return (Et * (1 + 8 * uu) + U * (2 * abs(ref) * (1 + 2 * U) + Et) + 2 * ETA_O) * (1 + 2.0**-40)

    # 6: dq over n = S = 2 terms (REDUCE_EXTRA = 6), dk and dv over n = L = 1 (dv: 2 more roundings)
    dq = sum(p * hh * k for p, hh, k in zip(P, h, ks))
    Eq = sum(e * abs(k) for e, k in zip(edS, ks)) + (gb(2 + 6, uu) + f64(2)) * sum(
        m * abs(k) for m, k in zip(dSm, ks)) + (2 + 6) * eta * 2  # fmt: skip
    dk = [p * hh * q for p, hh in zip(P, h)]
    Ek = [e * abs(q) + (gb(1 + 6, uu) + f64(1)) * m * abs(q) + (1 + 6) * eta * 2 for e, m in zip(edS, dSm)]
    dv = [p * dO for p in P]
    Ev = [e * abs(dO) + (gb(1 + 2, uu) + f64(1)) * pm * abs(dO) + (1 + 2) * eta for e, pm in zip(eP, Pm)]
    at = attention_operands(np.array([[q]], np.float32), np.array([[k] for k in ks], np.float32),
                            np.array([[v] for v in vs], np.float32), scale=1.0)  # fmt: skip
    G = np.array([[[dO]]])
    got, n = envb.attention_bound(at, G, "query", np.array([[[dq]]]))
    assert n == 2
    close(got.reshape(-1), [store(Eq, dq)])
    got, n = envb.attention_bound(at, G, "key", np.array([[[d] for d in dk]]))
    assert n == 1
    close(got.reshape(-1), [store(e, d) for e, d in zip(Ek, dk)])
    got, n = envb.attention_bound(at, G, "value", np.array([[[d] for d in dv]]))
    close(got.reshape(-1), [store(e, d) for e, d in zip(Ev, dv)])


def test_attention_gradient_envelopes_by_hand():
    # keys [1] and [-1], values [1] and [3], dO = 2: z = (1, -1), P = (1, e**-2) / (1 + e**-2)
    _attention_gradients_by_hand([1.0, -1.0], [1.0, 3.0], 2.0)
    # dO = 0: every gradient is 0 and its bound is the underflow terms eta (float32's smallest normal) alone
    _attention_gradients_by_hand([1.0, -1.0], [1.0, 3.0], 0.0)
    # z = (0, -100): P_2 = 3.7e-44 is below float32's normal range, its error eP_2 = P_2 rp_2 + eta mostly eta
    _attention_gradients_by_hand([0.0, -100.0], [1.0, 3.0], 1.0)


def _pv_hyps(ks, vs):
    from refkern.analysis._envelope_ops import layout
    from refkern.analysis._envelope_softmax import reduced_hypotheses

    args = {"query": np.ones((1, 1), np.float32), "key": np.array([[k] for k in ks], np.float32),
            "value": np.array([[v] for v in vs], np.float32), "attn_mask": None, "dropout_p": 0.0,
            "is_causal": False, "scale": 1.0, "enable_gqa": False}  # fmt: skip
    lay = layout(SDPA, args, (1, 1))
    return {h[0]: h[3]() for h in reduced_hypotheses(SDPA, lay, np.zeros((1, 1)), FLOAT32, np.zeros((1, 1)))}


def test_rounded_p_intervals_by_hand():
    """The reduced-precision P hypotheses add a p-ulp only where a weight's interval straddles a rounding
    boundary of p: the intervals' widths are pinned by placing a weight between one and two widths below an
    fp16 midpoint (q = [1], keys [0] and [z1], values [0] and [1])."""
    mid = 0.75 + 2.0**-12  # between the float16 neighbours 0.75 and 0.75 + 2**-11
    # flash: the term t1 = e**z1 within e**+-lt, lt = theta + L(2 * 20 u) (exp within 20 ulps), about 41 u here:
    # t1 = mid e**(-60 u) stays in 0.75's cell (with 40 ulps it would cross the midpoint)
    z1 = float(np.float32(math.log(mid) - 60 * U))
    theta = 7 * ETA_W + 2.0**-52 * (3 * abs(z1) + abs(z1)) + 2.0**-52 * (abs(z1) + 1)  # Delta_1, float64's included
    theta += 3 * U * (2.0**-52 + 7 * ETA_W - z1 + theta)  # the argument, against max(z + Delta) = Delta_0
    lt = theta + _lg(40 * U)
    t1 = math.exp(z1)
    assert t1 * math.exp(lt) < mid < t1 * math.exp(theta + _lg(80 * U))
    h = _pv_hyps([0.0, z1], [0.0, 1.0])
    c, b = h["fp16 P@V (flash)"]
    assert float(c[0, 0]) == 0.75 / (1 + t1) and float(b[0, 0]) < 2.0**-13  # no fp16 ulp (2**-11 / 1.75) in it
    # normalised: w1 = t1 / (1 + t1) within e_w (softmax's envelope of that weight plus the float64 weight's own
    # distance); w1 placed 1.5 e_w below the midpoint
    z1 = float(np.float32(math.log(mid / (1 - mid))))
    for _ in range(3):
        d64 = [2.0**-52 * 0.0, 2.0**-52 * (3 * abs(z1) + abs(z1))]
        rows = _rows_by_hand([0.0, z1], [7 * ETA_W] * 2, d64, U, 0.0, 2, 1)
        w = math.exp(z1) / (1 + math.exp(z1))
        slk = math.expm1(2 * rows["d64max"] + 6 * 2.0**-52)
        wa = w * (1 + slk)
        D, ED, a = rows["D"], rows["ED"], rows["a"]
        e_w = (rows["e_n"][1] + wa * ED + a + wa * a) / (D - ED - a) * (1 + 66 * 2.0**-50)
        e_w += 2 * math.expm1(2 * rows["d64max"]) * wa + w * slk
        z1 = float(np.float32(math.log((mid - 1.5 * e_w) / (1 - mid + 1.5 * e_w))))
    w = math.exp(z1) / (1 + math.exp(z1))
    assert w + e_w < mid < w + 2 * e_w
    c, b = _pv_hyps([0.0, z1], [0.0, 1.0])["fp16 P@V"]
    assert float(c[0, 0]) == 0.75 and float(b[0, 0]) < 2.0**-13
    # a float32 term below float32's normal range may be flushed: t1 = e**-87 (1.5e-38, between 2**-126 and
    # 2**-125) is not, so the bfloat16 flash term keeps its value: the bound stays far below it (v1 = 1e30)
    h = _pv_hyps([0.0, -87.0], [0.0, 1e30])
    c, b = h["bf16 P@V (flash)"]
    assert float(b[0, 0]) < 1e-3 * float(c[0, 0])
