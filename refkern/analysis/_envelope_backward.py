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
   rsqrt's cube: two, * sum, / n, * 2x, the branches' addition). For their half inputs each ``gw_k`` may
   be rounded to the input's format first (Hugging Face's RMSNorm multiplies ``weight * h.to(dtype)``, whose
   autograd forms ``g w`` in bfloat16: measured, 104 ulp on a bfloat16 row where F.rms_norm is exact):
   ``|delta_k| <= u_m`` moves dx_j by ``r gw_j delta_j - r sum_k gw_k delta_k / n - r**3 d_j sum_k gw_k d_k
   delta_k / n``, charged ``u_m (R1 (|gw_j| + sum|gw| / n) + R1**3 D_j sum_k |gw_k| D_k / n)`` (the mean's
   term 0 for rms_norm), the noise model's ``u + u_m`` on ``gw_k`` (:mod:`refkern.analysis.noise_backward`;
   measured: 1.68 times the envelope without it, 0.48 with it). batch_norm's grad_input for half inputs
   is charged ``ua + u_m`` per rounding (and eta_m, the half format's, for its underflow), with its two
   per-channel sums stored in the half format (``u_m`` more on e_S and e_C): torch's generic
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

from refkern.analysis._envelope_backward_attention import (
    ATTN_SECOND_ORDER,
    DS_ROUNDINGS,
    FLASH_O_ROUNDINGS,
    LOGIT_ROUNDINGS,
    REDUCE_EXTRA,
    SCALE_ROUNDINGS,
    SHIFT_ROUNDINGS,
    attention_bound,
)
from refkern.analysis._envelope_backward_ops import (
    BATCH_INPUT_ROUNDINGS,
    BLOCK_ROUNDINGS,
    EVAL_INPUT_ROUNDINGS,
    EVAL_SLACK,
    F64_SUM,
    INPUT_ROUNDINGS,
    LOG_ROUNDINGS,
    NORM_SECOND_ORDER,
    POOL_TERM_ROUNDINGS,
    PRODUCT_ROUNDINGS,
    SECOND_ORDER,
    XHAT_ROUNDINGS,
    _units,  # noqa: F401 - the units of a result format, which the tests read here
    batch_norm_eval_bound,
    bound,
    converted_bound,
    norm_bound,
    pool_bound,
)
from refkern.analysis._envelope_backward_reductions import (
    MEAN_ROUNDINGS,
    VAR_K_ROUNDINGS,
    centred,
    cumsum_converted_bound,
    mean_bound,
    var_bound,
)

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
