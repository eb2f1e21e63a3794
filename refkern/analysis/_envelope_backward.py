"""The worst-case envelopes of the softmax and log_softmax gradients (and below, of the norms', the
poolings', attention's and the reductions': :func:`mean_bound`, :func:`var_bound`): how far the gradient
of any correct implementation may lie from the correctly rounded one.

**What a correct backward computes.** Not the exact gradient of the exact forward: a backend keeps the
forward's output, rounded and with the forward's own error, and differentiates from it. torch's CPU
kernels (and every GPU one we know) compute, per row, in the working precision (unit ``u``: float32 for
float16/bfloat16/float32 results, torch's opmath, float64 for float64):

* softmax: ``dx_i = y^_i (g_i - D^)``, ``D^ = sum_j g_j y^_j``, with ``y^`` the stored softmax output
  (or ``y^_i g_i - y^_i D^``, with or without fused multiply-adds);
* log_softmax: ``dx_i = g_i - exp(l^_i) G^``, ``G^ = sum_j g_j``, with ``l^`` the stored log_softmax.

The class covered: any order of each sum, fused or unfused products, ``D^`` (or ``G^``) and
``g_i - D^`` stored in a half result format (unit ``u_m``; 0 for float32/float64 results), operations
that underflow in the working format (each adds at most ``eta_w``, its smallest normal: flush to zero
included), and a forward whose stored output lies anywhere within its own worst-case envelope
(:mod:`refkern.analysis.envelope`).

**Derivation** (``gamma_k = k u / (1 - k u)``, infinite from ``k u >= 1/2``: no bound is claimed;
``y`` the exact softmax, ``dx`` the exact gradient; every factor ``(1 + d)``, ``|d| <= u``, of a
rounding is charged to the quantity it rounds):

1. The stored forward. With ``B_f`` the forward envelope around its correctly rounded reference (which
   is within ``u_o |y| + eta_o`` of the real value: ``u_o`` the result format's unit, ``eta_o`` half its
   smallest subnormal), ``|y^_j - y_j| <= eta_j = B_f,j + u_o |y_j| + eta_o`` (softmax). For
   log_softmax, ``|l^_j - l_j| <= lam_j = B_l,j + u_o |l_j| + eta_o`` and ``exp`` within
   ``EXP_ULPS u`` (:mod:`refkern.analysis._envelope_softmax`), so ``|exp(l^_j) - y_j| <= eta_j = y_j
   (expm1(lam_j) + EXP_ULPS u e**lam_j) + eta_w``; a -inf logit has ``y_j = 0`` exactly in every correct
   forward: ``eta_j = 0``.
2. softmax. ``|D^ - D| <= e_D = sum_j |g_j| eta_j + gamma_n (sum_j |g_j y_j| + sum_j |g_j| eta_j) +
   n eta_w`` (n products and n - 1 additions, each product's operand off by eta_j), plus
   ``u_m (|D| + e_D) + eta_h`` where D^ is stored (``eta_h``: half the smallest subnormal of a half
   result format). Then ``h = g_i - D^`` is within ``e_D + u (|g_i| + |D| + e_D)`` of ``g_i - D``, plus
   ``u_m H + eta_h`` stored (``H = |g_i - D| + e_D``), and ``y^_i h`` (one more rounding; the fused and
   the expanded forms round at most twice more, each by ``u`` of ``Y (|g_i| + |D| + e_D)``,
   ``Y = |y_i| + eta_i``) is within
   ``E_i = eta_i H + Y (e_D + PRODUCT_ROUNDINGS u (|g_i| + |D| + e_D) + u_m H + eta_h) + 2 eta_w``
   of ``dx_i``, PRODUCT_ROUNDINGS = 3 (the difference, the product, and the expanded form's extra one).
3. log_softmax. ``|G^ - G| <= e_G = gamma_{n-1} sum_j |g_j| + u_m (|G| + e_G) + eta_h``;
   ``t = exp(l^_i) G^`` is within ``eta_i (|G| + e_G) + |y_i| e_G + u Y (|G| + e_G) + eta_w`` of
   ``y_i G``; ``g_i - t`` adds ``u (|g_i| + Y (|G| + e_G))``: ``E_i = eta_i (|G| + e_G) + |y_i| e_G +
   LOG_ROUNDINGS u (|g_i| + Y (|G| + e_G)) + eta_w``, LOG_ROUNDINGS = 2 (the product, the difference).
4. The second-order products of these first-order terms (``u eta``, ``u e_D``) are covered by the
   factor ``(1 + SECOND_ORDER u)``, SECOND_ORDER = 4 (at most four roundings compound on one path).
5. The store and the centre. The backend stores ``fl_o(v)``, ``|v - dx_i| <= E_i``: within
   ``E_i + u_o (|dx_i| + E_i) + eta_o`` of dx_i; the reference is ``RN(dx_i)``, within
   ``u_o |dx_i| + eta_o``. So ``|actual - reference| <= E_i (1 + SECOND_ORDER u) + u_o (2 |dx_i| + E_i) +
   2 eta_o``.
6. The bound itself is evaluated in float64 from float64 values of the exact quantities: y and l
   correctly rounded to float64 (``2**-53`` relative, ``2**-1075`` absolute), D and G summed in float64
   (``gamma_{n+1}`` in float64 of their magnitudes). Each is charged where it enters (``eta_j`` grows by
   ``2**-52 |y_j| + 2**-1074``, ``e_D`` and ``e_G`` by ``F64_SUM (n + 2) 2**-53`` of their magnitudes,
   F64_SUM = 2), and the final float64 evaluation (a few dozen roundings of ``2**-53``) by the factor
   ``EVAL_SLACK = 1 + 2**-40``.

**layer_norm and rms_norm** (:func:`norm_bound`). A row of n elements (the normalised dimensions),
``mu`` the mean (0 for rms_norm), ``d_j = x_j - mu``, ``z = var + eps``, ``r = z**(-1/2)``, ``gw = g w``,
``S = sum_k gw_k``, ``Ad = S / n`` (0 for rms_norm) and ``Cn = sum_k gw_k d_k``; the exact gradient is

    grad_input_j = r (gw_j - Ad) - r**3 d_j Cn / n,   grad_weight = sum_rows g xhat,   grad_bias = sum_rows g.

What a correct backward computes: torch's CPU layer_norm kernel keeps the forward's ``mean^`` and
``rstd^`` and forms ``ds = sum gw x`` and ``db = sum gw`` from the *raw* x, then
``b = (db mean^ - ds) rstd^**3 / n``, ``c = -b mean^ - db rstd^ / n``, ``dx = rstd^ gw + b x + c``, and
``grad_weight += g (x rstd^ - mean^ rstd^)``; its F.rms_norm is composed of float32 ops (the half input
upcast first, the result cast back), whose autograd gives ``gw r - x r**3 sum(gw x) / n`` with
``r = rsqrt(mean(x**2) + eps)`` recomputed. The class covered: either form (centred or raw x), any order
of each sum, fused or unfused products, in the working precision ``u`` (float32, torch's opmath, for
float16/bfloat16/float32 inputs; float64 for float64), with, for half inputs, the stored statistics
charged ``u_m`` (the input format's unit) once more: torch's CPU layer_norm returns ``mean^`` and
``rstd^`` in the input's dtype unless the weight is float32 (``torch.native_layer_norm`` on bfloat16
input and weight gives bfloat16 statistics), and the backward reads them so. Its sums (ds, db, the
grad_weight and grad_bias buffers) and every product are float32 (opmath), as are the composite
rms_norm's (the input is upcast first); only each result is stored in the half format (step 6).
``ua = u`` below; ``eta_w`` (the working format's smallest normal) for each product that underflows.

1. The statistics, as the forward envelope (:func:`refkern.analysis.envelope._norm_rows`) bounds them:
   ``|mean^ - mu| <= dmu = gamma_n A + u_m |mu|`` (A the mean of |x|; 0 for rms_norm) and
   ``|rstd^ - r| <= e_r``: ``e_M2 = gamma_{n+3} ||x||_2 sqrt(M2) + n (gamma_n A)^2`` plus the squares'
   underflow, ``e_v = e_M2 / n + ua var``, ``e_w = e_v + ua z``, the interval through the square root,
   plus ``(2u + u_m) r`` (the rsqrt and the store).
2. The sums: ``|db^ - S| <= e_S = gamma_n(ua) sum|gw|`` (n products by w and n - 1 additions) and,
   for ``Cn`` formed either as ``sum gw (x - mean^)`` or as ``db mean^ - ds``, against the ``Cn`` of the
   stored mean, ``e_C = gamma_{n+2}(ua) (sum|gw x| + |mu| sum|gw|)``; the stored mean moves Cn by
   ``dmu |S|`` more. Bounds on magnitudes are inflated by their own errors (``R1 = r + e_r``,
   ``D_j = |d_j| + dmu``, ``Cm = |Cn| + e_C + dmu |S|``, ``Am = |Ad| + e_S / n``), so that every cross
   term of a perturbed product is covered: ``|a'b' - ab| <= e_a |b'| + |a| e_b`` with ``|b'|`` inflated,
   and ``|r'**3 - r**3| <= 3 e_r R1**2``.
3. grad_input, before the store:
   ``E_j = e_r (|gw_j| + Am) + R1 e_S / n + (3 e_r R1**2 D_j Cm + r**3 dmu Cm + r**3 |d_j| (e_C + dmu |S|)) / n
   + INPUT_ROUNDINGS ua (R1 (|gw_j| + Am) + R1**3 (|x_j| + |mu| + dmu) Cm / n)
   + (n + INPUT_ROUNDINGS) eta_w (R1 + R1**3 (|x_j| + |mu| + dmu))``.
   INPUT_ROUNDINGS = 8: torch's form rounds ``rstd^ gw_j`` twice (the product g w, the product by
   rstd), ``b`` up to five times on the path to ``b x`` (``db mean^ - ds`` is in e_C; rstd**3 two, the
   product, the division, the product by x), ``c`` up to seven on ``|b mean^| + |db rstd^ / n|`` (b's
   five, the product by mean^, the subtraction), and the two additions of ``dx`` one each on the
   whole: at most seven compound on any term, and the uncentred ``b x + c`` is charged on
   ``|x_j| + |mu|`` instead of ``|d_j|``; the composite rms_norm has fewer (g w, * r, r**3 as
   rsqrt's cube: two, * sum, / n, * 2x, the branches' addition). batch_norm's grad_input for half
   inputs is charged ``ua + u_m`` per rounding (and eta_m, the half format's, for its underflow), with
   its two per-channel sums stored in the half format (``u_m`` more on e_S and e_C): torch's generic
   kernel, which serves non-contiguous inputs, forms ``k = dotp rstd^2 / n`` and ``grad_mean = sum g / n``
   as scalar_t and every operation of ``(g - grad_mean - (x - mean) k) rstd w`` in it (measured: a strided
   bf16 input at 1.41 times the float32-step envelope).
4. grad_weight_k and grad_bias_k sum over the rows in the result's buffer: torch's CPU layer_norm kernel
   for half inputs rounds the running sums to the half format (measured: float32 sums give bfloat16
   grad_bias errors of hundreds of ulp the float32 model does not explain), so every addition of
   these two sums, and the product ``g xhat^``, is charged ``uc = u + u_m``. Per row: the stored
   ``xhat^ = (x - mean^) rstd^`` (or ``x rstd^ - mean^ rstd^``) is within
   ``e_xh = e_r D + r dmu + XHAT_ROUNDINGS ua R1 (|x| + |mu| + dmu)`` of xhat, XHAT_ROUNDINGS = 3
   (two products and a difference); ``g xhat^`` adds ``uc |g| (|xhat| + e_xh)`` and the sum over the R
   rows ``gamma_R(uc) sum|g| (|xhat| + e_xh)`` (one more for the product: gamma_R covers R - 1
   additions and it) and ``R eta_w``: ``E = sum_rows |g| e_xh + gamma_R(uc) sum_rows |g| (|xhat| + e_xh)
   + R eta_w``.
5. grad_bias_k: ``E = gamma_{R-1}(uc) sum_rows |g|``.
6. The store and the centre, as for softmax (step 5): ``|actual - reference| <= E (1 + NORM_SECOND_ORDER
   ua) + u_o (2 |ref| (1 + 2 u_o) + E) + 2 eta_o`` (``|dx| <= |ref| (1 + 2 u_o)`` away from
   subnormals, where eta_o covers it), NORM_SECOND_ORDER = 8 (at most eight roundings compound on one
   path). The bound is evaluated in float64 from float64 values of the exact quantities (each within
   a few units of 2**-53 of its magnitude, ``2**-40`` of the bound at most): ``EVAL_SLACK``. Rows with a
   NaN or an infinity get 0 (the reference follows IEEE arithmetic there: only the same value fits).
"""

import math

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.analysis._envelope_softmax import EXP_ULPS

__all__ = [
    "bound",
    "norm_bound",
    "PRODUCT_ROUNDINGS",
    "LOG_ROUNDINGS",
    "SECOND_ORDER",
    "F64_SUM",
    "EVAL_SLACK",
    "INPUT_ROUNDINGS",
    "XHAT_ROUNDINGS",
    "NORM_SECOND_ORDER",
    "BLOCK_ROUNDINGS",
    "BATCH_INPUT_ROUNDINGS",
    "EVAL_INPUT_ROUNDINGS",
    "batch_norm_eval_bound",
    "pool_bound",
    "converted_bound",
    "POOL_TERM_ROUNDINGS",
    "attention_bound",
    "SCALE_ROUNDINGS",
    "LOGIT_ROUNDINGS",
    "SHIFT_ROUNDINGS",
    "FLASH_O_ROUNDINGS",
    "DS_ROUNDINGS",
    "REDUCE_EXTRA",
    "ATTN_SECOND_ORDER",
    "mean_bound",
    "var_bound",
    "centred",
    "cumsum_converted_bound",
    "MEAN_ROUNDINGS",
    "VAR_K_ROUNDINGS",
]

PRODUCT_ROUNDINGS = 3  #: softmax: g_i - D^, the product by y^_i, and the expanded form's second product
LOG_ROUNDINGS = 2  #: log_softmax: the product exp(l^_i) G^ and the difference g_i - t
SECOND_ORDER = 4  #: at most four roundings compound on one path: (1 + 4u) covers their products
F64_SUM = 2  #: float64 sums of the bound's own quantities: 2 (n + 2) 2**-53 of their magnitudes
EVAL_SLACK = 1.0 + 2.0**-40  #: the bound's own float64 evaluation
INPUT_ROUNDINGS = 8  #: norm grad_input: at most seven roundings compound on one term of torch's form, plus one
XHAT_ROUNDINGS = 3  #: norm xhat^: the products x rstd^ and mean^ rstd^ (or x - mean^ and the product), the difference
NORM_SECOND_ORDER = 8  #: norms: at most eight roundings compound on one path: (1 + 8 ua) covers their products
BLOCK_ROUNDINGS = 3  #: group_norm's raw block form beyond its sums: db mean^, ds - db mean^, the product by rstd^
POOL_TERM_ROUNDINGS = 2  #: an average's gradient term g / d: one division, or a reciprocal and a product
EVAL_INPUT_ROUNDINGS = 2  #: batch_norm eval grad_input: g invstd^ w, two products in either order
BATCH_INPUT_ROUNDINGS = 9  #: batch_norm grad_input: eight roundings compound on the (x - mean^) k term, plus one


def _gamma(k, u):
    return k * u / (1 - k * u) if k * u < 0.5 else np.inf


def _units(out: Format):
    """(u, u_m, eta_w, eta_h, u_o, eta_o) of a result format (module docstring)."""
    u = FLOAT64.u if out is FLOAT64 else FLOAT32.u
    work = FLOAT64 if out is FLOAT64 else FLOAT32
    half = out.prec < FLOAT32.prec
    u_m = out.u if half else 0.0
    eta_h = 2.0 ** (out.emin - out.prec) if half else 0.0
    return u, u_m, 2.0**work.emin, eta_h, out.u, 2.0 ** (out.emin - out.prec)


def bound(op: str, x: np.ndarray, g: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of each element of the gradient of ``op`` ("softmax" or "log_softmax") along the
    last axis of the float64 (R, n) arrays ``x`` (logits) and ``g`` (grad_output), around ``ref``
    (the correctly rounded gradient, float64 (R, n)), for results in ``out`` (module docstring).
    Rows whose forward or ``g`` is not finite get 0 (the reference is NaN there: only NaN fits)."""
    from refkern import ops
    from refkern.analysis.envelope import envelopes

    log = op == "log_softmax"
    R, n = x.shape
    u, u_m, eta_w, eta_h, u_o, eta_o = _units(out)
    with np.errstate(all="ignore"):
        y = np.asarray(ops.get("softmax").reference(x, -1), np.float64)  # the exact softmax, rounded to float64
        y = np.where(np.isnan(y), 0.0, y)
        fwd = ops.get("log_softmax" if log else "softmax").reference(x, -1)
        fwd_out = np.asarray(fwd, np.float64)
        from refkern.accumulate.formats import round_array

        ref_f = round_array(np.ascontiguousarray(fwd_out), *out.params) if out is not FLOAT64 else fwd_out
        hyps, _ = envelopes(op, {"input": x.astype(np.float32) if out is not FLOAT64 else x, "dim": -1,
                                 "dtype": None}, ref_f, out)  # fmt: skip
        b_f = np.asarray(hyps[0][3], np.float64)
        b_f = np.where(np.isnan(b_f), 0.0, b_f)
        finite = np.isfinite(x)
        sum_slack = F64_SUM * (n + 2) * 2.0**-53
        if log:
            lam = b_f + u_o * np.abs(fwd_out) + eta_o + 2.0**-52 * np.abs(fwd_out) + 2.0**-1074
            eta = np.where(finite, y * (np.expm1(lam) + EXP_ULPS * u * np.exp(lam)) + eta_w, 0.0)
            eta = np.where(finite & np.isnan(eta), np.inf, eta)
            eta = eta + np.where(finite, 2.0**-52 * y + 2.0**-1074, 0.0)
            G = g.sum(axis=1, keepdims=True)
            AG = np.abs(g).sum(axis=1, keepdims=True)
            e_G = _gamma(n - 1, u) * AG + sum_slack * AG
            e_G = (e_G + u_m * np.abs(G) + eta_h) / (1 - u_m)
            Y = y + eta
            E = eta * (np.abs(G) + e_G) + y * e_G + LOG_ROUNDINGS * u * (np.abs(g) + Y * (np.abs(G) + e_G)) + eta_w
            dx = g - y * G
        else:
            eta = np.where(finite, b_f + u_o * y + eta_o + 2.0**-52 * y + 2.0**-1074, 0.0)
            D = (g * y).sum(axis=1, keepdims=True)
            A1 = np.abs(g * y).sum(axis=1, keepdims=True)
            Ge = (np.abs(g) * eta).sum(axis=1, keepdims=True)
            e_D = Ge + _gamma(n, u) * (A1 + Ge) + n * eta_w + sum_slack * (A1 + Ge)
            e_D = (e_D + u_m * np.abs(D) + eta_h) / (1 - u_m)
            H = np.abs(g - D) + e_D
            Y = y + eta
            inner = e_D + PRODUCT_ROUNDINGS * u * (np.abs(g) + np.abs(D) + e_D) + u_m * H + eta_h
            E = eta * H + Y * inner + 2.0 * eta_w
            dx = y * (g - D)
        B = E * (1 + SECOND_ORDER * u) + u_o * (2.0 * np.abs(dx) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        bad = ~np.isfinite(ref) | ~np.isfinite(g).all(axis=1, keepdims=True)
        return np.where(bad, 0.0, B)


def norm_bound(op: str, name: str, X: np.ndarray, G: np.ndarray, W, eps: float, ref: np.ndarray,
               fmts: dict, *, regroup=None, block: int = 1, input_roundings: int = INPUT_ROUNDINGS,
               stored_sums: bool = False, half_sums: bool = True, half_steps: bool = False) -> np.ndarray:  # fmt: skip
    """The envelope (module docstring, layer_norm and rms_norm; group_norm and batch_norm in training
    with the keywords below) of the gradient ``name`` ("input", "weight", "bias") of ``op`` over the
    rows of the float64 (R, n) arrays X and G, weight W (n,), (R, n) (a weight per element) or None,
    around ``ref`` (the correctly rounded gradient: (R, n) for input, (C,) otherwise), for results in
    ``fmts[name]``; the working precision follows the input's format ``fmts["input"]``.

    ``regroup`` maps an (R, n) array to (T, C): column c holds the T terms of parameter element c
    (None: the columns of X). ``block``: the parameter sums may be formed per block of that many terms
    of one row in the raw form ``(sum g x - mean^ sum g) rstd^`` (group_norm's ds, db per (sample,
    channel): :data:`GROUP_NORM` below); ``input_roundings``: the roundings that compound on one term of
    grad_input; ``stored_sums``: the per-channel sums behind grad_input are stored once in the half
    input format (one ``u_m`` more on e_S and e_C); ``half_sums``: grad_weight's and grad_bias's sums may
    round every addition to the half result format (``uc = ua + u_m`` each, layer_norm's step 4), else
    they run in the working precision (``ua`` each) and only their stored parts and result are rounded
    to the half format: ``u_m`` once on each term's block (ds and db) and once on the result (group_norm,
    batch_norm: torch's CPU kernels accumulate them in opmath); ``half_steps``: each of grad_input's
    ``input_roundings`` may round to the half input format (``ua + u_m`` each, and its underflow ``eta_m``:
    torch's generic batch_norm backward, which serves non-contiguous inputs, computes k = dotp rstd^2 / n,
    grad_mean = sum g / n and every operation of ``(g - grad_mean - (x - mean) k) rstd w`` in scalar_t)."""
    from refkern.analysis.envelope import _gamma, _underflow

    fin = fmts["input"]
    out = fmts[name]
    R, n = X.shape
    u = FLOAT64.u if fin is FLOAT64 else FLOAT32.u
    u_m = fin.u if fin.prec < FLOAT32.prec else 0.0
    ua = u  # the backward's own operations are in the working format (module docstring)
    eta_w = 2.0 ** (FLOAT64 if fin is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    center = op != "rms_norm"
    w = np.ones(n) if W is None else np.asarray(W, np.float64)
    if w.ndim == 2:  # (P, n): row r uses w[r % P]
        w = w[np.arange(R) % w.shape[0]]
    with np.errstate(all="ignore"):
        mu = X.mean(axis=1, keepdims=True) if center else np.zeros((R, 1))
        d = X - mu
        m2 = (d * d).sum(axis=1, keepdims=True)
        q = (X * X).sum(axis=1, keepdims=True)
        A = np.abs(X).mean(axis=1, keepdims=True)
        g_n = _gamma(n, ua)[()]
        dmu = (g_n * A + u_m * np.abs(mu)) if center else np.zeros((R, 1))
        e_m2 = _gamma(n + 3, ua)[()] * np.sqrt(q) * np.sqrt(m2) + n * (g_n * A) ** 2 + _underflow(n, u)
        var = m2 / n
        e_v = e_m2 / n + ua * var
        z = var + eps
        e_w = e_v + ua * z
        r = 1.0 / np.sqrt(z)
        s_lo, s_hi = np.sqrt(np.maximum(z - e_w, 0.0)), np.sqrt(z + e_w)
        e_r = np.maximum(1.0 / s_lo - r, r - 1.0 / s_hi) + (2.0 * u + u_m) * r
        R1 = r + e_r
        D = np.abs(d) + dmu
        xm = np.abs(X) + np.abs(mu) + dmu  # the uncentred forms' magnitude
        if name == "input":
            ui, eta_i = (ua + u_m, eta_w + 2.0 ** (fin.emin - fin.prec)) if half_steps else (ua, eta_w)
            gw = G * w
            S = gw.sum(axis=1, keepdims=True)
            Sa = np.abs(gw).sum(axis=1, keepdims=True)
            e_S = g_n * Sa + (u_m * Sa if stored_sums else 0.0)
            Ad = S / n if center else np.zeros((R, 1))
            e_A = e_S / n if center else np.zeros((R, 1))
            Cn = (gw * d).sum(axis=1, keepdims=True)
            e_C = _gamma(n + 2, ua)[()] * ((np.abs(gw) * np.abs(X)).sum(axis=1, keepdims=True) + np.abs(mu) * Sa)
            e_C = e_C + n * 2.0**-52 * (np.abs(gw) * np.abs(d)).sum(axis=1, keepdims=True)  # Cn's float64 sum
            if stored_sums:  # ds and db stored once in the half format: u_m of their magnitudes
                e_C = e_C + u_m * ((np.abs(gw) * np.abs(X)).sum(axis=1, keepdims=True) + np.abs(mu) * Sa)
            Cm = np.abs(Cn) + e_C + dmu * np.abs(S)
            Am = np.abs(Ad) + e_A
            E = (e_r * (np.abs(gw) + Am) + R1 * e_A
                 + (3.0 * e_r * R1**2 * D * Cm + r**3 * dmu * Cm + r**3 * np.abs(d) * (e_C + dmu * np.abs(S))) / n
                 + input_roundings * ui * (R1 * (np.abs(gw) + Am) + R1**3 * xm * Cm / n)
                 + (n * eta_w + input_roundings * eta_i) * (R1 + R1**3 * xm))  # fmt: skip
            refm = np.abs(ref).reshape(R, n)
            bad = ~(np.isfinite(X).all(axis=1, keepdims=True) & np.isfinite(G).all(axis=1, keepdims=True))
            bad = bad & np.ones((1, n), bool)
        else:
            rg = (lambda a: a) if regroup is None else regroup
            T = rg(np.zeros((R, n))).shape[0]  # terms per parameter element
            if name == "weight":
                xh = np.abs(d) * r
                if block == 1:
                    e_xh = e_r * D + r * dmu + XHAT_ROUNDINGS * ua * R1 * xm
                else:  # the raw block form: ds, db, db mean^, their difference, the product by rstd^; ds, db stored
                    e_xh = e_r * D + r * dmu + (_gamma(block + BLOCK_ROUNDINGS, ua)[()] + u_m) * R1 * xm
                ag = np.abs(G)
                g_T = _gamma(T, u + u_m)[()] if half_sums else _gamma(T, ua)[()] + u_m
                E = (rg(ag * e_xh).sum(axis=0) + g_T * rg(ag * (xh + e_xh)).sum(axis=0)
                     + (T if block == 1 else 2 * T) * eta_w)  # fmt: skip
            else:
                g_T = _gamma(max(T - 1, 0), u + u_m)[()] if half_sums else _gamma(max(T - 1, 0), ua)[()] + u_m
                E = g_T * rg(np.abs(G)).sum(axis=0)
            refm = np.abs(ref).reshape(-1)
            ok = np.isfinite(X) & np.isfinite(G)
            bad = ~rg(ok).all(axis=0) | ~np.isfinite(refm)
        B = E * (1.0 + NORM_SECOND_ORDER * ua) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(bad | ~np.isfinite(refm), 0.0, B)


def batch_norm_eval_bound(name: str, X: np.ndarray, G: np.ndarray, W, RM, RV, eps: float, ref: np.ndarray,
                          fmts: dict) -> np.ndarray:  # fmt: skip
    """The envelope of the gradient ``name`` of batch_norm in eval mode (the running statistics given:
    an affine map per channel) over the channels as rows of the float64 (C, K) arrays X and G, W (C, K)
    or None, RM and RV (C,), around ``ref`` ((C, K) for input, (C,) otherwise), for results in
    ``fmts[name]``; the working precision ``ua`` follows the input's format (module docstring's
    conventions: ``u_m`` the half input format's unit, ``eta_w`` the working format's smallest normal).

    What a correct backward computes (torch's CPU kernel: ``invstd = 1 / sqrt(rv + eps)``, ``dx = dy
    invstd w``, ``grad_weight = invstd sum (x - rm) dy``, ``grad_bias = sum dy``, in opmath), with
    ``z = rv + eps``, ``r = z**(-1/2)``, ``d = x - rm``:

    1. ``invstd^``: z rounded twice (eps converted to the working format, then the addition): within
       ``e_z = ua (eps + |z|) (1 + ua)``; ``1/sqrt`` on ``[z - e_z, z + e_z]`` moves by at most ``e_z / (2
       (z - e_z)**1.5)`` (the mean value theorem: ``|d z**-1/2 / dz| = z**-1.5 / 2``, largest at the lower
       end; infinite when ``e_z >= z``), then the square root and the division (or an rsqrt within 2 ua)
       and a store in the half format: ``e_r = e_z / (2 (z - e_z)**1.5) + (2 ua + u_m) R1``, ``R1 = r (1 +
       2 ua + u_m) + e_z / (2 (z - e_z)**1.5)`` (r's magnitude inflated by the same errors).
    2. grad_input: ``E = |g w| (e_r + EVAL_INPUT_ROUNDINGS ua R1) + EVAL_INPUT_ROUNDINGS eta_w``,
       EVAL_INPUT_ROUNDINGS = 2 (the two products, in either order).
    3. grad_weight: each term rounds ``x - rm``, the product by g, (or by invstd first), the K - 1
       additions and the final product by invstd: K + 2 roundings on one path in the working precision
       (torch's CPU kernel accumulates ``dotp`` in opmath), and one store of a partial sum in a half
       format (``u_m``): ``E = e_r sum|g d| + (gamma_{K+2}(ua) + u_m) R1 sum|g d| + 2 K eta_w`` (two
       products per term may underflow).
    4. grad_bias: ``E = (gamma_{K-1}(ua) + u_m) sum|g|``.
    5. The store and the centre as the norms' step 6, with NORM_SECOND_ORDER and EVAL_SLACK: every
       quantity above is formed in float64 without cancellation (``d`` and ``z`` within 2**-53 of their
       magnitudes), so a few units of 2**-53 relative cover its own evaluation. Channels with a NaN or an
       infinity, or ``z <= 0``, get 0 (the reference follows IEEE arithmetic there)."""
    from refkern.analysis.envelope import _gamma

    fin = fmts["input"]
    out = fmts[name]
    C, K = X.shape
    ua = FLOAT64.u if fin is FLOAT64 else FLOAT32.u
    u_m = fin.u if fin.prec < FLOAT32.prec else 0.0
    eta_w = 2.0 ** (FLOAT64 if fin is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    w = np.ones((C, K)) if W is None else np.asarray(W, np.float64)
    with np.errstate(all="ignore"):
        z = (np.asarray(RV, np.float64) + eps)[:, None]
        e_z = ua * (eps + np.abs(z)) * (1.0 + ua)
        lo = z - e_z
        move = np.where(lo > 0, e_z / (2.0 * lo**1.5), np.inf)
        r = 1.0 / np.sqrt(z)
        R1 = r * (1.0 + 2.0 * ua + u_m) + move
        e_r = move + (2.0 * ua + u_m) * R1
        if name == "input":
            gw = np.abs(G * w)
            E = gw * (e_r + EVAL_INPUT_ROUNDINGS * ua * R1) + EVAL_INPUT_ROUNDINGS * eta_w
            refm = np.abs(ref).reshape(C, K)
            ok = np.isfinite(X).all(axis=1) & np.isfinite(G).all(axis=1) & np.isfinite(w).all(axis=1)
            bad = ~(ok[:, None] & (z > 0) & np.isfinite(np.asarray(RM, np.float64))[:, None]) | np.zeros((1, K), bool)
        else:
            if name == "weight":
                gd = (np.abs(G) * np.abs(X - np.asarray(RM, np.float64)[:, None])).sum(axis=1, keepdims=True)
                E = e_r * gd + (_gamma(K + 2, ua)[()] + u_m) * R1 * gd + 2 * K * eta_w
            else:
                E = (_gamma(max(K - 1, 0), ua)[()] + u_m) * np.abs(G).sum(axis=1, keepdims=True)
            E = E.reshape(C)
            refm = np.abs(ref).reshape(C)
            ok = np.isfinite(X).all(axis=1) & np.isfinite(G).all(axis=1)
            bad = ~(ok & (z.reshape(C) > 0) & np.isfinite(np.asarray(RM, np.float64)))
            if name == "bias":
                bad = ~np.isfinite(G).all(axis=1)
        B = E * (1.0 + NORM_SECOND_ORDER * ua) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(bad | ~np.isfinite(refm), 0.0, B)


def pool_bound(asum: np.ndarray, cnt: np.ndarray, ref: np.ndarray, out: Format, exact_terms: bool) -> np.ndarray:
    """The envelope of a pooling's grad_input around ``ref`` (its correctly rounded value), from each
    element's ``asum = sum|t|`` over its ``cnt = k`` terms (:mod:`refkern.kernels.pool_backward`), for
    results in ``out``; ``exact_terms``: a maximum's terms ``t = g`` (no rounding), else an average's
    ``t = g / d``.

    What a correct backward computes: every term, then their sum in any order, in the working precision
    ``ua`` (float32 for float16/bfloat16/float32 results, float64 for float64), each operation possibly
    also stored in a half result format (torch's CPU kernels add ``g / d`` into the gradient tensor
    itself: ``uc = ua + u_m`` per operation, ``u_m`` the half format's unit, 0 otherwise).

    1. An average: a term rounds at most POOL_TERM_ROUNDINGS = 2 times (``g / d``, or ``1 / d`` then the
       product), and the k - 1 additions once each: at most k + 1 roundings on one path, ``E =
       gamma_{k+1}(uc) asum + 2 k eta_w`` (``eta_w``: the working format's smallest normal, once per
       division or product that underflows; additions of subnormals are exact).
    2. A maximum: the terms are exact, ``E = gamma_{k-1}(uc) asum`` (no term rounds: one term gives 0).
    3. The store and the centre as the norms' step 6: ``|actual - ref| <= E (1 + F64_SUM (k + 2) 2**-53) +
       u_o (2 |ref| (1 + 2 u_o) + E) + 2 eta_o``, the first factor for asum's own float64 sum (the terms
       within 2**-53 each, k - 1 additions), then EVAL_SLACK. Elements whose reference is not finite
       get 0 (IEEE arithmetic there: only the same value fits)."""
    from refkern.analysis.envelope import _gamma

    ua = FLOAT64.u if out is FLOAT64 else FLOAT32.u
    u_m = out.u if out.prec < FLOAT32.prec else 0.0
    uc = ua + u_m
    eta_w = 2.0 ** (FLOAT64 if out is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    k = np.asarray(cnt, np.float64)
    with np.errstate(all="ignore"):
        if exact_terms:
            E = _gamma(np.maximum(k - 1, 0), uc) * asum
        else:
            E = _gamma(k + 1, uc) * asum + 2.0 * k * eta_w
        E = np.where(k == 0, 0.0, E)
        refm = np.abs(ref)
        B = E * (1.0 + F64_SUM * (k + 2) * 2.0**-53) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(~np.isfinite(ref), 0.0, B)


def converted_bound(b_c: np.ndarray, ref_c: np.ndarray, fmt_c: Format, fmt: Format) -> np.ndarray:
    """The envelope of a gradient computed in the format ``fmt_c`` (softmax's ``dtype=``) and converted to
    the input's format ``fmt`` (autograd's conversion back), around the reference rounded once to ``fmt``.

    ``b_c`` bounds ``|v - ref_c|`` for the backend's ``fmt_c`` result v around ``ref_c = RN_c(dx)``, and
    ``|ref_c - dx| <= u_c |dx| + eta_c``, so ``|v - dx| <= b_c + u_c |dx| + eta_c``; the conversion adds
    ``u |v| + eta`` (``u``, ``eta``: the unit and half the smallest subnormal of fmt; 0 when it widens,
    which is exact, and the bound still holds), the reference ``RN(dx)`` is within ``u |dx| + eta``:
    ``|actual - ref| <= (b_c + u_c |dx| + eta_c) (1 + u) + 2 u |dx| + 2 eta``, with ``|dx| <= |ref_c| (1 +
    2 u_c) + 2 eta_c``; then EVAL_SLACK. Where ``b_c`` is 0 (no real value: IEEE rows), 0."""
    u_c, eta_c = fmt_c.u, 2.0 ** (fmt_c.emin - fmt_c.prec)
    u, eta = fmt.u, 2.0 ** (fmt.emin - fmt.prec)
    with np.errstate(all="ignore"):
        dx = np.abs(ref_c) * (1.0 + 2.0 * u_c) + 2.0 * eta_c
        B = ((b_c + u_c * dx + eta_c) * (1.0 + u) + 2.0 * u * dx + 2.0 * eta) * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(b_c == 0, 0.0, B)


# ---------------------------------------------------------------- scaled_dot_product_attention

SCALE_ROUNDINGS = 4  #: attention logits: q and k each scaled by sqrt(s) (a float32 scalar, then the store)
LOGIT_ROUNDINGS = 2  #: attention logits: the mask's addition and the stored logit
SHIFT_ROUNDINGS = 4  #: the exp argument: z - max, or z - lse with lse's own rounding and log's error
FLASH_O_ROUNDINGS = 3  #: a flash forward's output: per key an exp, a product, an addition, a rescale (3 S + 8)
DS_ROUNDINGS = 3  #: dS = P (dP - Delta) stored: the product, the store, the expanded form's second product
REDUCE_EXTRA = 6  #: dq, dk beyond their sums: k' and q' stored, sqrt(s) twice as float32, two products
ATTN_SECOND_ORDER = 8  #: at most eight roundings compound on one path: (1 + 8 uu) covers their products


def attention_bound(at, G: np.ndarray, name: str, ref: np.ndarray):
    """(envelope, n_terms): the envelope of each element of the gradient ``name`` ("query", "key",
    "value") of ``scaled_dot_product_attention`` around ``ref`` (its correctly rounded value, shaped as
    the operand's 3-D stack: at.Q, at.K or at.V), for a call normalised as ``at``
    (:class:`refkern.kernels.attention.Attention`) with grad_output G (B, L, Ev) float64.

    **What a correct backward computes.** torch's math backend: ``q' = q sqrt(s)``, ``k' = k sqrt(s)``
    (sqrt(s) a float32 scalar, each product stored in the dtype), ``z = q' k'^T + m`` (a matmul, the
    logits stored), ``P = softmax(z)`` stored, ``O = P v``; autograd: ``dv = P^T dO``, ``dP = dO v^T``,
    ``dS = P (dP - sum_k P_k dP_k)`` (softmax's backward, opmath), ``dq = (dS k') sqrt(s)``, ``dk`` likewise,
    the broadcast and GQA copies summed. A flash backward (torch's CPU kernel) recomputes ``P =
    exp(z - lse)`` from the stored logsumexp and forms ``Delta = rowsum(dO O^)`` from the stored output.
    The class covered: either form, every sum in any order, with every operation rounded in the working
    precision and every intermediate possibly stored in the dtype: one unit ``uu`` for every rounding,
    the dtype's (float16/bfloat16/float32 results: at least float32's, the working precision; float64:
    2**-53), ``eta`` (the dtype's smallest normal: flush to zero included) for each quantity that may
    underflow, ``gamma_k = k uu / (1 - k uu)`` (infinite from ``k uu >= 1/2``: no bound is claimed).

    **Derivation** (each error charged against magnitudes inflated by their own bounds, so that the cross
    terms of perturbed products are covered: ``|a'b' - ab| <= e_a |b'| + |a| e_b``):

    1. Logits. ``A_ij = |s| sum_l |q_il k_jl|``. The scalings round q and k (uu each) and sqrt(s) as
       float32 (uu each): SCALE_ROUNDINGS = 4; the dot product ``gamma_E``; the mask's addition and the
       store LOGIT_ROUNDINGS = 2 of ``|z|``: ``ez_ij = (4 uu + gamma_E) A_ij + 2 uu |z_ij| + eta``.
    2. Weights. ``P_j = e**z_j / sum_k e**z_k``: perturbing every logit by ``|d_k| <= dl_k`` moves P_j by
       the factor ``e**d_j / sum_k P_k e**d_k``, within ``expm1(dl_j + max_k dl_k)`` relative. The exp
       argument (``z - max`` or ``z - lse``) rounds up to SHIFT_ROUNDINGS = 4 times on magnitudes below
       ``zmax + log S + 1`` (zmax = max |z| of the row; lse and log's error included): ``dl_j = ez_j + 4
       uu (|z_j| + zmax + log S + 1)``. The exp (EXP_ULPS), the sum (S - 1 additions), the reciprocal or
       division, the product and the store: ``rp_j = expm1(dl_j + max dl) + gamma_{S + EXP_ULPS + 3}
       (1 + expm1(...))``; ``eP_j = P_j rp_j + eta`` (0 where the logit is -inf: P = 0 exactly).
    3. ``dP_j = dO . v_j``: ``edP_j = gamma_Ev sum_c |dO_c v_jc| + uu |dP_j| + (Ev + 1) eta`` (stored).
    4. Delta, the larger of two forms. (a) ``sum_j P^_j dP^_j``: ``sum_j (eP_j |dP_j| + (P_j + eP_j)
       edP_j) + gamma_S sum_j (P_j + eP_j)(|dP_j| + edP_j) + S eta``. (b) ``sum_c dO_c O^_c`` with the
       stored forward output within ``eO_c = sum_j eP_j |v_jc| + gamma_{3S+8} sum_j (P_j + eP_j) |v_jc| +
       (S + 2) eta`` (a flash forward: per key an exp, a product, an addition, and a rescale of the
       running sum by a rounded factor, FLASH_O_ROUNDINGS = 3 per key, 8 for the final division, the
       stores): ``sum_c |dO_c| eO_c + gamma_Ev sum_c |dO_c| (|O_c| + eO_c) + Ev eta``. Stored once more:
       ``eDel = max + uu (|Delta| + max)``.
    5. ``h_j = dP_j - Delta`` within ``eh_j = edP_j + eDel + uu (|dP_j| + |Delta| + edP_j + eDel)``;
       ``dS_j`` within ``edS_j = eP_j (|h_j| + eh_j) + P_j eh_j + DS_ROUNDINGS uu (P_j + eP_j)(|h_j| + eh_j)
       + eta``, DS_ROUNDINGS = 3.
    6. The gradients, n terms each (every output batch reading the element times S, or times L):
       ``dq_ie``: ``|s| (sum edS |k| + gamma_{n+6} sum (|dS| + edS) |k|) + (n + 6) eta``, REDUCE_EXTRA = 6
       (k' stored, sqrt(s) as float32 twice, the products by sqrt(s), the broadcast partials' stores);
       ``dk`` the same with q; ``dv_jc``: ``sum eP |dO| + gamma_{n+2} sum (P + eP) |dO| + (n + 2) eta``.
    7. The store and the centre, as softmax's step 5: ``E (1 + ATTN_SECOND_ORDER uu) + u_o (2 |ref| (1 +
       2 u_o) + E) + 2 eta_o``, ATTN_SECOND_ORDER = 8.
    8. The bound is evaluated in float64 from float64 values of the exact quantities (P by a float64
       softmax within ``(S + 4) 2**-52`` relative, the sums within ``(n + 16) 2**-52`` of their magnitudes):
       each magnitude-based term carries that slack, and the whole EVAL_SLACK. Elements a NaN row
       reaches get 0 (the reference is NaN there)."""
    from refkern.analysis._envelope_softmax import EXP_ULPS

    fmt = at.fmt
    uu = FLOAT64.u if fmt is FLOAT64 else max(fmt.u, FLOAT32.u)
    eta = 2.0**fmt.emin
    u_o, eta_o = fmt.u, 2.0 ** (fmt.emin - fmt.prec)
    B = at.iq.size
    L, E = at.Q.shape[1], at.Q.shape[2]
    S, Ev = at.K.shape[1], at.V.shape[2]

    def f64(n):
        return (n + 16) * 2.0**-52

    with np.errstate(all="ignore"):
        Qg, Kg, Vg = at.Q[at.iq], at.K[at.ik], at.V[at.iv]
        s = abs(at.scale) if E else 0.0
        z = at.scale * (Qg @ Kg.transpose(0, 2, 1)) if E else np.zeros((B, L, S))
        A = s * (np.abs(Qg) @ np.abs(Kg).transpose(0, 2, 1)) if E else np.zeros((B, L, S))
        if at.causal:
            m = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, 0.0)[None]
        elif at.has_mask:
            m = np.broadcast_to(at.mask[at.im], (B, L, S))
        else:
            m = np.zeros((1, 1, 1))
        z = z + m
        fin = np.isfinite(z)
        nanrow = (np.isnan(z) | (z == np.inf)).any(axis=2)
        zf = np.where(fin, z, -np.inf)
        M = zf.max(axis=2, keepdims=True)
        Mf = np.where(np.isfinite(M), M, 0.0)
        p = np.where(fin, np.exp(zf - Mf), 0.0)
        Psum = p.sum(axis=2, keepdims=True)
        P = np.where(Psum > 0, p / np.where(Psum > 0, Psum, 1.0), 0.0)
        ez = (SCALE_ROUNDINGS * uu + _gamma(E, uu) + f64(E)) * A + LOGIT_ROUNDINGS * uu * np.abs(zf) + eta
        zmax = np.where(fin, np.abs(z), 0.0).max(axis=2, keepdims=True)
        dl = np.where(fin, ez + SHIFT_ROUNDINGS * uu * (np.abs(np.where(fin, z, 0.0)) + zmax + math.log(max(S, 1)) + 1),
                      0.0)  # fmt: skip
        dlm = dl.max(axis=2, keepdims=True)
        x1 = np.expm1(dl + dlm)
        rp = x1 + _gamma(S + EXP_ULPS + 3, uu) * (1.0 + x1) + (S + 4) * 2.0**-52
        eP = np.where(fin, P * rp + eta, 0.0)
        Pm = P + eP
        dP = G @ Vg.transpose(0, 2, 1)
        Adp = np.abs(G) @ np.abs(Vg).transpose(0, 2, 1)
        edP = (_gamma(Ev, uu) + f64(Ev)) * Adp + uu * np.abs(dP) + (Ev + 1) * eta
        dPm = np.abs(dP) + edP
        Del = (P * dP).sum(axis=2, keepdims=True)
        eA = (eP * np.abs(dP) + Pm * edP).sum(axis=2, keepdims=True) + (_gamma(S, uu) + f64(S)) * (Pm * dPm).sum(
            axis=2, keepdims=True) + S * eta  # fmt: skip
        O = P @ Vg
        eO = eP @ np.abs(Vg) + (_gamma(FLASH_O_ROUNDINGS * S + 8, uu) + f64(S)) * (Pm @ np.abs(Vg)) + (S + 2) * eta
        eB = (np.abs(G) * eO).sum(axis=2, keepdims=True) + (_gamma(Ev, uu) + f64(Ev)) * (
            np.abs(G) * (np.abs(O) + eO)).sum(axis=2, keepdims=True) + Ev * eta  # fmt: skip
        eD = np.maximum(eA, eB)
        eDel = eD + uu * (np.abs(Del) + eD)
        h = dP - Del
        eh = edP + eDel + uu * (np.abs(dP) + np.abs(Del) + edP + eDel) + f64(S) * (np.abs(dP) + np.abs(Del))
        edS = np.where(fin, eP * (np.abs(h) + eh) + P * eh + DS_ROUNDINGS * uu * Pm * (np.abs(h) + eh) + eta, 0.0)
        dSm = np.where(fin, np.abs(P * h) + edS, 0.0)
        idx = {"query": at.iq, "key": at.ik, "value": at.iv}[name]
        X = {"query": at.Q, "key": at.K, "value": at.V}[name]
        Eb = np.zeros(X.shape)
        Mg = np.zeros(X.shape)
        nb = np.bincount(idx, minlength=X.shape[0])
        bad = np.zeros(X.shape, bool)
        for b in range(B):
            t = idx[b]
            if name == "query":
                Eb[t] += s * (edS[b] @ np.abs(Kg[b]))
                Mg[t] += s * (dSm[b] @ np.abs(Kg[b]))
                bad[t] |= nanrow[b][:, None]
            elif name == "key":
                Eb[t] += s * (edS[b].T @ np.abs(Qg[b]))
                Mg[t] += s * (dSm[b].T @ np.abs(Qg[b]))
                bad[t] |= nanrow[b].any()
            else:
                Eb[t] += eP[b].T @ np.abs(G[b])
                Mg[t] += Pm[b].T @ np.abs(G[b])
                bad[t] |= nanrow[b].any()
        n = nb.max(initial=1) * (S if name == "query" else L)
        extra = REDUCE_EXTRA if name != "value" else 2
        Etot = Eb + (_gamma(n + extra, uu) + f64(n)) * Mg + (n + extra) * eta * (1.0 + (s if name != "value" else 0.0))
        ra = np.abs(ref)
        Bd = Etot * (1 + ATTN_SECOND_ORDER * uu) + u_o * (2.0 * ra * (1 + 2 * u_o) + Etot) + 2.0 * eta_o
        Bd = Bd * EVAL_SLACK
        Bd = np.where(np.isnan(Bd), np.inf, Bd)
        Bd = np.where(bad | ~np.isfinite(ref), 0.0, Bd)
    return Bd, int(n)


# ---------------------------------------------------------------- mean, var, std, cumsum

MEAN_ROUNDINGS = 3  #: mean's g / n: n converted to the working format, the reciprocal (or the division), the product
VAR_K_ROUNDINGS = 3  #: var's (2 / dof) g: 2 / dof in float64, its conversion to the working format, the product


def mean_bound(t: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of the gradient of a mean, ``g / n`` per element of grad_output, around ``ref`` (its
    correctly rounded value), from ``t = |g| / n`` (float64), for results in ``out``.

    **What a correct backward computes** (torch: ``sum_backward(grad) / n``; CUDA divides by a scalar as
    ``a * (1 / b)``; half formats compute in float32, torch's opmath, and round once to the result): in the
    working precision ``ua`` (float32 for float16/bfloat16/float32 results, float64 for float64) either
    ``fl(g / fl(n))`` or ``fl(g * fl(1 / fl(n)))``, then one store to the result format. ``fl(n)`` rounds
    once (n above 2**24 in float32), the reciprocal or the division once, the product once:
    MEAN_ROUNDINGS = 3 relative roundings, ``|v - g / n| <= gamma_3(ua) |g / n| + eta_w`` (``eta_w``: the
    working format's smallest normal, for a product that underflows; the reciprocal of an integer
    below 2**63 does not).

    The store and the centre as the norms' step 6: ``|actual - ref| <= E (1 + 2**-52) + u_o (2 |ref| (1 + 2
    u_o) + E) + 2 eta_o`` (``t`` is within 2**-53 of ``|g / n|``), then EVAL_SLACK. Elements whose reference
    is not finite get 0 (IEEE arithmetic there: only the same value fits)."""
    from refkern.analysis.envelope import _gamma

    u, _, eta_w, _, u_o, eta_o = _units(out)
    with np.errstate(all="ignore"):
        E = _gamma(MEAN_ROUNDINGS, u) * np.asarray(t, np.float64) + eta_w
        refm = np.abs(ref)
        B = E * (1.0 + 2.0**-52) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = np.where(np.isnan(B), np.inf, B * EVAL_SLACK)
        return np.where(np.isfinite(ref), B, 0.0)


def _forward_std(X: np.ndarray, corr, out: Format) -> np.ndarray:
    """The correctly rounded std of each row of the float64 (R, n) array X in ``out`` (the forward's value,
    the centre of its envelope), float64 (R,)."""
    from refkern.kernels.reduction import _exact_var, _row_var

    res = np.empty(X.shape[0])
    status = np.zeros(X.shape[0], np.int64)
    c_h = float(corr)
    _row_var(np.ascontiguousarray(X), c_h, float(corr - type(corr)(c_h)), True, *out.params, res, status)
    for r in np.flatnonzero(status == 2):
        res[r] = _exact_var(X[r], corr, out, True)
    return res


def centred(X: np.ndarray, out: Format):
    """(d, e_d, slack) for the finite float64 rows (R, n) of X: ``d = x - mu`` in float64, the bound ``e_d``
    on a correct backend's stored ``x - mean^`` around the exact ``x - mu`` (:func:`var_bound`, step 1), and
    the float64 evaluation's own error on d (step 5)."""
    from refkern.analysis.envelope import _gamma

    R, n = X.shape
    u, u_m, _, _, _, eta_o = _units(out)
    with np.errstate(all="ignore"):
        mu = X.mean(axis=1, keepdims=True) if n else np.zeros((R, 1))
        A = np.abs(X).mean(axis=1, keepdims=True) if n else np.zeros((R, 1))
        d = X - mu
        slack = (n + 4) * 2.0**-52 * (A + np.abs(mu)) + 2.0**-52 * np.abs(d)
        g_n = _gamma(n + 1, u)[()] * A
        dmu = g_n + u_m * (np.abs(mu) + g_n) + eta_o
        e_d = dmu + (u + u_m) * (np.abs(d) + dmu) + eta_o
    return d, e_d, slack


def var_bound(X: np.ndarray, G: np.ndarray, corr, ref: np.ndarray, out: Format, want_std: bool,
              nodim: bool) -> np.ndarray:  # fmt: skip
    """The envelope of the gradient of var (std with ``want_std``) over the rows of the float64 (R, n)
    array X, one grad_output value per row G (R,), ``dof = n - corr``, around ``ref`` (R, n) (the correctly
    rounded gradient), for results in ``out``.

    **What a correct backward computes.** torch's autograd (``var_backward``, ``std_backward``): ``(2 / dof)
    * grad * (self - self.mean(dim, True))``, each a tensor op that stores its result in the dtype; std
    first forms ``grad_var = grad / (2 result)`` from its own *stored* forward output. The class covered:
    the three factors multiplied in any order, ``2 / dof`` evaluated in float64 and converted to the
    working format, every operation in the working precision ``ua`` (float32, torch's opmath, for half
    and float32 results; float64 for float64) and every intermediate possibly stored in the result format
    (``uc = ua + u_m``, ``u_m`` the half format's unit, 0 otherwise; ``eta_o`` absolute, half its smallest
    subnormal), the mean by any correct implementation.

    **Derivation** (``mu`` the mean, ``d = x - mu``, ``A = mean |x|``, ``K = 2 / |dof|``; every error charged
    against magnitudes inflated by their own bounds, so the cross terms of perturbed products are covered):

    1. The stored mean: ``|mean^ - mu| <= dmu = gamma_{n+1}(ua) A + u_m (|mu| + gamma_{n+1}(ua) A) + eta_o``
       (n - 1 additions, n converted, the division; the store of that value). ``x - mean^``, computed and
       stored: within ``e_d = dmu + uc (|d| + dmu) + eta_o`` of d. This is the cancellation every correct
       backend shows on offset data (an absolute error ``ua |mu|`` per element), ``D = |d| + e_d``.
    2. The factor multiplying d. var: ``q = g``, exact. std: the forward's stored ``s^`` is within ``e_s =
       B_f + u_o s + eta_o`` of ``s = sqrt(M2 / dof)`` (``B_f`` its forward envelope around the correctly
       rounded std, :mod:`refkern.analysis.envelope`); ``q = g / (2 s)``: ``2 s^`` is exact, the quotient
       rounds once and is stored (``uc``): within ``e_q = |g| e_s / (2 s (s - e_s)) + uc |g| / (2 (s - e_s)) +
       eta_o`` (infinite where ``s <= e_s``: no bound is claimed); ``Q = |q| + e_q``.
    3. ``t = fl(fl(2 / dof) q)``, stored: within ``e_t = K e_q + VAR_K_ROUNDINGS uc K Q + eta_o``,
       VAR_K_ROUNDINGS = 3 (2 / dof in float64, its conversion, the product).
    4. ``t d^``: within ``E = e_t D + K Q e_d + ua (K Q + e_t) D + eta_w`` of ``K q d``, the exact gradient
       (the product's rounding in the working format; another order of the three factors rounds the same
       number of times on the same magnitudes).
    5. The store and the centre as the norms' step 6: ``E (1 + NORM_SECOND_ORDER ua) + u_o (2 |ref| (1 + 2
       u_o) + E) + 2 eta_o``. The bound is evaluated in float64: mu, d (within ``(n + 4) 2**-52 (A + |mu|)
       + 2**-52 |d|``, added to D) and s (the correctly rounded float64 std: ``2**-52 s`` added to e_s),
       then EVAL_SLACK.

    Rows with a NaN or an infinity (in x or g), ``dof <= 0`` (except var with a ``dim`` and ``dof < 0``,
    torch's finite formula), std rows with ``M2 = 0`` and non-finite references get 0: torch's rule is an
    IEEE value (:mod:`refkern.kernels.reduction_backward`), only the same value fits."""
    from refkern.analysis.envelope import envelopes

    R, n = X.shape
    u, u_m, eta_w, _, u_o, eta_o = _units(out)
    uc = u + u_m
    dof = n - float(corr)
    with np.errstate(all="ignore"):
        fin = np.isfinite(X).all(axis=1) & np.isfinite(G)
        Xf = np.where(fin[:, None], X, 0.0)
        d, e_d, slack = centred(Xf, out)
        D = np.abs(d) + e_d + slack
        K = 2.0 / abs(dof) if dof != 0 else np.inf
        Ga = np.abs(G)[:, None]
        bad = ~fin[:, None] | np.zeros((1, n), bool)
        if dof <= 0 and (nodim or want_std or dof == 0):
            bad = bad | True
        if want_std and dof > 0 and R and n:
            s64 = _forward_std(Xf, corr, FLOAT64)[:, None]
            s_o = _forward_std(Xf, corr, out)
            hyps, _ = envelopes("std", {"x": Xf, "dim": 1, "correction": float(corr), "keepdim": False}, s_o, out,
                                lazy=True)  # fmt: skip
            b_f = np.asarray(hyps[0][3], np.float64).reshape(R, 1)
            e_s = b_f + u_o * s64 + eta_o + 2.0**-52 * s64
            lo = s64 - e_s
            e_q = np.where(lo > 0, Ga * e_s / (2.0 * s64 * lo) + uc * Ga / (2.0 * lo) + eta_o, np.inf)
            Q = Ga / (2.0 * s64) + e_q
            bad = bad | (s64 == 0)
        else:
            e_q = 0.0
            Q = Ga
        KQ = K * Q
        e_t = K * e_q + VAR_K_ROUNDINGS * uc * KQ + eta_o
        E = e_t * D + KQ * e_d + u * (KQ + e_t) * D + eta_w
        refm = np.abs(ref)
        B = E * (1.0 + NORM_SECOND_ORDER * u) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = np.where(np.isnan(B), np.inf, B * EVAL_SLACK)
        return np.where(bad | ~np.isfinite(ref), 0.0, B)


def cumsum_converted_bound(gp: np.ndarray, axis: int, ref_p: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of cumsum's gradient with ``dtype=`` where grad_output is not representable in the
    input's format ``out``: autograd converts it first (``grad.to(self.scalar_type())``, the float64 values
    ``gp``) and takes the reversed cumsum of that in ``out``. A correct backend lies within the forward cumsum
    envelope (:mod:`refkern.analysis.envelope`, its "rounding" hypothesis) of ``ref_p``, the correctly rounded
    reversed cumsum of gp; the reference ``ref`` (that of the given grad_output) is a known distance
    ``|ref_p - ref|`` away, both exact: their sum. Elements where either reference is not finite get 0."""
    from refkern.analysis.envelope import envelopes

    fl = np.ascontiguousarray(np.flip(gp, axis))
    hyps, _ = envelopes("cumsum", {"x": fl, "dim": axis, "dtype": None}, np.ascontiguousarray(np.flip(ref_p, axis)),
                        out, lazy=True)  # fmt: skip
    with np.errstate(all="ignore"):
        b = np.flip(np.asarray(hyps[0][3], np.float64), axis) + np.abs(ref_p - ref)
        b = np.where(np.isnan(b), np.inf, b)
        return np.where(np.isfinite(ref) & np.isfinite(ref_p), b, 0.0)
