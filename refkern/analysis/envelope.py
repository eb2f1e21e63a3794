"""Worst-case error envelopes of any correct implementation of the reductions, norms, pools, softmax and attention.

For these ops a backend's result is not one rounded sum: a mean is a sum then a division, a
layer_norm a mean, a variance, a reciprocal square root and an affine step. The hypotheses
are therefore envelopes: per output element, a bound ``B`` on ``|computed - exact|`` that holds
for EVERY correct implementation in a working precision ``u`` (unit roundoff) whose result is
stored with ``u_o``, derived to first order from the standard model ``fl(a op b) = (a op b)(1 + d)``,
``|d| <= u`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002), with
``gamma_k = k u / (1 - k u)``:

* sum of n terms, any order: ``gamma_{n-1} sum|x|`` (Higham (4.4)); cumsum element i: ``gamma_i``
  times the prefix's ``sum|x|``; mean and avg_pool: the sum's bound over the divisor, plus
  ``u |mean|`` for the division;
* M2 = sum (x - mean)^2 by the two-pass or the updating (Welford) algorithm, any order:
  ``gamma_{n+3} ||x||_2 sqrt(M2) + n (gamma_n A)^2``, A the mean of |x|: Chan, Golub and
  LeVeque (1983) bound the two-pass error by ``(n + 3) u M2 + n^2 kappa^2 u^2 M2`` and the updating
  one by ``n kappa u M2``, with ``kappa = ||x||_2 / sqrt(M2) >= 1``; the first term covers both to
  first order, the second the shift by a mean that is itself ``gamma_n A`` off (which is also
  what remains of M2 when every x is equal);
* var = M2 / D adds ``u var``; std and ``1 / sqrt(var + eps)`` are bounded by propagating the
  interval ``[w - e, w + e]`` through the square root exactly, plus ``2u`` relative for the sqrt
  and the division (or an rsqrt within 2 ulp);
* the affine step of a norm, in either of the forms torch uses, ``(x - mean) r w + b`` or
  ``x (r w) + (b - mean r w)`` (the CPU kernels fold the statistics into a scale and a shift):
  ``|w| (e_d r + |d| e_r + e_d e_r) + 3u (|x| + |mean|) r |w| + 2u |b| + 2u |y|``, where
  ``e_d = dmu + u (|d| + dmu)`` is the error of ``x - mean``, ``dmu`` the mean's and ``e_r`` r's.
* every result is stored with ``u_o |y|`` plus half the format's smallest subnormal, and the centre
  (the reference, itself rounded to the result format) is one such term from the exact value: one
  term for float32 and float64 results (computed in their own format), two for half results
  (computed in float32, then stored); M2 also carries
  ``2 n eta`` for squares that underflow (eta half the working format's smallest subnormal).

torch's CPU kernels for float16/bfloat16 results compute in float32 but round some
intermediates to the result dtype (batch_norm's batch statistics, the stages of log_softmax;
F.rms_norm is composed of half-precision ops, cumsum carries its running sum in the result):
for such results every operation, the additions of the sums included, is charged ``u + u_m``
with ``u_m = u_o`` (and the statistics of a norm ``u_m`` once more).

The first-order terms are multiplied by ``SLACK = 1 + 4 n u`` (the second-order remainder of
each gamma is below ``(n u)^2 / (1 - n u)``, which this covers while ``n u <= 1/8``; beyond it
the envelope is infinite: nothing is claimed). Reduced precisions are the same envelopes with
``u`` = 2**-8 (bf16), 2**-11 (fp16) or 2**-24 (fp32, for float64 results). The one-pass variance
``E[x^2] - E[x]^2`` is the envelope with ``e_M2 = 3 gamma_n sum x^2`` instead: its cancellation is
what a correct implementation never shows, so a result that only it explains is a mismatch
with that name.

**softmax, log_softmax, scaled_dot_product_attention.** A row has logits ``z_j`` (the input; for
attention ``z_j = s q.k_j + mask_j``), ``M = max z``, ``t_j = e**(z_j - M)`` (the largest is 1, so
``D = sum t_j >= 1``) and weights ``w_j = t_j / D``: softmax_i is ``w_i``, attention's ``o_c`` is
``sum_j w_j v_jc``, log_softmax_i is ``z_i - M - log D``. The envelope holds for every implementation
of this class (torch's CPU and CUDA kernels, the online normaliser of Milakov and Gimelshein (2018)
and FlashAttention's tiles are in it):

* (A1) the logits are formed in the working precision, in any order: ``fl(sqrt(s))`` applied to q
  and to k (torch's math backend) or ``s`` applied once (the fused kernels), a float mask converted
  and added;
* (A2) ``exp((z^_j - m) c)`` is taken against a reference ``m``, the maximum of the computed logits
  of the row or of the keys seen so far (``c`` = 1, or log2(e) for exp2, possibly with the scale
  folded in); when the reference rises from ``m`` to ``m'``, every partial sum formed so far is
  multiplied by ``exp((m - m') c)``;
* (A3) exp is within ``EXP_ULPS = 20`` ulps of the working format (torch's ``exp_u20``, the coarsest
  exp its CPU kernels use, documented as 20 ulps; its float32 emulation errs by under 6 here),
  ``exp(0) = 1`` exactly, and a result below the normal range may be flushed to 0; log is within
  ``LOG_ULPS = 4`` ulps (glibc, Sleef's u10 functions and CUDA's logf are within 1); a division is a
  reciprocal and a product (two roundings) or correctly rounded;
* (A4) every other operation obeys the standard model with the working unit ``u_a = u`` (float32's
  for fp16/bf16/fp32 results, torch's opmath; float64's for float64 results) and, where it
  underflows, errs by at most ``eta`` more: the working format's smallest normal (a flush to zero
  included);
* (A5) for fp16/bf16 results only these tensors are stored in the result format, each element once,
  with its unit ``u_m`` and, below its normal range, half its smallest subnormal ``eta_h``: q and k
  scaled (or q by s), the scores before and after a float mask is added, each exp term or each weight
  (before it enters the numerator or the denominator), log_softmax's sum and its log
  (:mod:`refkern.analysis._envelope_softmax` derives their terms and lists which torch kernel stores
  which); ``u_m = eta_h = 0`` for float32 and float64 results. No sum is accumulated in the result
  format, so no term grows with n in ``u_m``.

Relative errors are carried as growth factors: a product of factors ``(1 + d_i)**(+-1)`` with
``sum |d_i| <= S`` lies within ``e**(+-L(S))``, ``L(S) = -log(1 - S)`` (Higham's Lemma 3.1 with mixed
units; S >= 1 claims nothing: an infinite envelope), and a factor ``e**(+-lam)`` moves ``t`` by at most
``t (e**lam - 1)``. Exponentials, not first-order terms: no SLACK is needed. Per term j:

* the logit errs by ``Delta_j = gamma_{E+6} s sum_l |q_l k_jl| + (E + 6) eta`` (E - 1 additions, the
  product, q and k scaled, ``fl(sqrt(s))`` twice with two roundings each: E + 6 roundings, each may
  underflow), plus ``2 u_a (1 + 2 u_a) (|z_j| + (1 + gamma) s sum|q k|)`` for a nonzero float mask
  (converted, ``|mask| <= |z| + s sum|q k|``, and added); softmax's logits are its input: 0;
* the exp argument: the subtraction, ``c``'s rounding and the product err by ``3 u_a |z^_j - m|``;
  along a chain of references ``m_0 <= m_1 <= ... <= M^`` these telescope to ``3 u_a (M^ - z^_j) <=
  3 u_a (max_k (z_k + Delta_k) - z_j + Delta_j)`` (``ARG_ROUNDINGS``; the roundings of ``m c`` itself are a
  shift common to the row, which cancels in softmax and attention and costs log_softmax ``u_a |M|``);
  ``theta_j`` = ``Delta_j`` plus that;
* rescales: a partial sum is rescaled only when the reference rises strictly, to a larger computed
  logit (``exp(0) = 1`` and a product by 1 are exact), so one that holds term j is rescaled at most
  ``R_j <= #{k: z^_k > z^_j} <= #{k: z_k + Delta_k > z_j - Delta_j}`` times (its rank), each time by one
  exp (``eps_e = 2 EXP_ULPS u``: within EXP_ULPS ulps) and one product (``u_a``);
* the denominator's term is ``t_j (1 + a_j)``, ``|log(1 + a_j)| <= lam_j = theta_j + L((1 + R_j) eps_e +
  (R_j + n - 1) u_a + u_m)`` (its exp, its rescales, the n - 1 additions of any order or tiling, its store);
* attention's numerator term is ``t_j v_jc (1 + b_j)``, ``lam'_j = theta_j + L((1 + R_j) eps_e + (R_j + n
  + 2) u_a + u_m)``: also the product ``p v`` and the division's two roundings, which are a factor on every
  term whether the weights are normalised first (the math backend) or the sum at the end (the fused
  kernels); softmax's numerator is the output's own exp, taken against the final maximum or rescaled
  once from a partial one (rescaling stored outputs at every rise of the maximum would take n^2
  products, which no implementation does): ``lam'_i = theta_i + L((1 + R'_i) eps_e + (R'_i + 2) u_a + u_m)``,
  ``R'_i = min(R_i, 1)``;
* each of the ``UNDERFLOW_OPS = 6`` operations per term (exp, its store, the division, the product,
  the addition, the rescale) may underflow: ``a = 6 n eta e**(2 lam_max) D`` on either side, in units
  of the largest term (``eta`` in the units of the weights, after the division, is ``eta D^`` there, and
  later operations grow it by ``e**lam_max`` at most); a stored term or weight below the result
  format's normal range adds ``eta_h 2 D e**(2 lam_max)`` (A5).

With ``e_j = t_j (e**lam_j - 1)``, ``e'_j`` likewise and ``E_D = sum e_j``, ``N^/D^ - o = ((N^ - N) - o (D^
- D)) / D^`` gives

    ``|o^ - o| <= (sum_j e'_j |v_jc| + |o| E_D + a max(1, max_j |v_jc|) + |o| a) / (D - E_D - a)``

(softmax: ``v`` the unit vector, ``o = w_i``). log_softmax: ``D^ = D (1 + zeta)``, ``|zeta| <= (E_D +
a) / D``, so ``|log D^ - log D| <= ell = L((E_D + a) / D) + L(u_m)`` (the sum stored, A5); the log
adds ``eps_l (log D + ell) + eta``, ``eps_l = 2 LOG_ULPS u + u_m``, the reference's shift ``u_a |M|``;
together ``err_L``; then ``(z_i - M) - L^`` or ``z_i - (M + L^)`` (either order) adds ``c = u_a max(M -
z_i, |M| + log D + err_L)`` and ``u_a (|y| + err_L + c)``. ``|o|`` and ``|y|`` are bounded by ``(|ref| +
half a subnormal) / (1 - u_o)``. The centre, the correctly rounded reference, is itself up to ``u_o |o|
+ half a subnormal`` from the exact value, and a computed value within the envelope may round to its
neighbour: that distance is added too.

The envelope is evaluated in float64 from float64 logits ``z'``, within ``Delta64 = 2**-52 ((E + 2) s
sum|q k| + |z'| + (M - z') + 1)`` of the exact ones (the float64 products, sums, mask and exp): it is
added to every ``Delta_j``, so that the envelope bounds the distance to the exact op at ``z'``; that op's
distance to the exact one at ``z``, at most ``2 (e**(2 Delta64) - 1)`` times ``max_j |v_jc|`` (softmax:
``|o|``; log_softmax: ``3 Delta64``), is added; the float64 sums of the formula are covered by the
factor ``1 + (n + E + 64) 2**-50``.

Reduced precisions are sharp as above: the inputs (and a float mask) rounded to p, the op computed
correctly: centre refkern's op on the rounded inputs, bound the float32 envelope of that call, with
its own weights. For float32 results also "P rounded to fp16/bf16 before P @ V" and a softmax or
log_softmax output stored in fp16/bf16 (:func:`refkern.analysis._envelope_softmax.reduced_hypotheses`).
Where the weights are rounded depends on the algorithm, so there are two centres, each with the
float32 envelope of its own computation: the normalised weights ``fl_p(w_j)`` (the math backend:
softmax, then P @ V), and the terms ``fl_p(t_j)`` against the row maximum over the float32 sum of the
unrounded terms (torch's CPU flash kernel with one key tile, or FlashAttention when the first tile
holds the maximum). A flash kernel whose running maximum rises across tiles rounds ``exp(z -
m_tile)`` against ``m_tile < M``, a scale ``e**(M - m_tile)`` that is no power of 2: its rounded
terms depend on the tiling, not on the inputs alone, so no sharp centre exists for it and it is not
emulated (its output is a mismatch, or rounding where the effect is below the envelope). For half
results the rounding envelope charges those roundings (A5).

Named bugs, only to name a mismatch, never to excuse an element: refkern's op on modified
arguments, with its own rounding envelope, explaining every element (scale 1/E, 1 or the default
1/sqrt(E) instead of the one given; the causal diagonal shifted by +-1 or aligned bottom-right; the
mask ignored; a boolean mask inverted; ``q @ k`` instead of ``q @ k^T`` when S == E; softmax over
another dim of the same size); a missing max subtraction: inf/NaN exactly where the reference is
finite, in rows whose exp overflows (or all underflow) without it, in the working or the result
format; and log_softmax as log(softmax): -inf exactly where the reference is finite and below the log
of the smallest normal.
"""

import numpy as np
from numba import prange

import refkern.ops as _ops
from refkern._jit import jit
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, Format
from refkern.analysis.noise_rows import held_dtype

__all__ = ["OPS", "envelopes", "working_unit", "storage"]

OPS = _ops.names(error_model="envelope")  #: the ops judged by envelopes (the registry's)
_SOFTMAX_KINDS = ("softmax", "log_softmax", "attention")
ONE_PASS = "one-pass variance"
ONE_PASS_TEXT = ("fits a one-pass variance E[x^2] - E[x]^2, whose cancellation no correct (two-pass or Welford) "
                 "implementation shows")  # fmt: skip


def working_unit(out: Format) -> float:
    """The unit of a correct implementation: float32 arithmetic for fp32/fp16/bf16 results (torch's
    opmath type), float64 for float64 results."""
    return FLOAT64.u if out is FLOAT64 else FLOAT32.u


def storage(out: Format, precision: str | None) -> Format:
    """The format a hypothesis's results are stored in before the caller sees them as ``out``.

    The rounding hypothesis stores in ``out``. A reduced precision computes in float32 arithmetic
    (torch's opmath), so under a float64 result it stores in float32, then converts exactly: its
    results lie on float32's grid, and the verdict refuses it for any value off that grid. Without
    that, its window would not be sharp: around a centre within ``u_32 sum|x|`` of the exact result
    (the inputs' rounding) it spans a float32 envelope, ``2**29`` times the float64 one, and a float64
    result with a bug far above its own rounding would fit it."""
    return FLOAT32 if out is FLOAT64 and precision is not None else out


def _gamma(k, u):
    k = np.asarray(k, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(k * u <= 0.125, k * u / (1.0 - k * u) * (1.0 + 4.0 * k * u), np.inf)
    return g


def _underflow(n, u):
    """What underflow adds to M2 = sum (x - mean)^2: each of the n squares may lose up to eta, half the
    smallest subnormal of the working format (float32 when ``u`` is float32's or coarser, else float64),
    the absolute term of the standard model with underflow, ``fl(a b) = a b (1 + d) + e, |e| <= eta``
    (Higham 2002, section 2.1); twice that for the rounding of the sum's own subnormal terms."""
    fmt = FLOAT32 if u >= FLOAT32.u else FLOAT64
    return 2.0 * n * 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1)


def _store(y, u_o, out: Format):
    return u_o * np.abs(y) + 0.5 * 2.0 ** (out.emin - out.prec + 1)


def _stores(out: Format) -> int:
    """Roundings to the result format between a correct result and a centre that is itself rounded to
    it: the centre's own (to nearest: ``u_o |y|`` plus half a subnormal) and, for a half result computed
    in float32, the backend's store of its float32 value, another such term. A float32 or float64 result
    is computed in its own format: its last operation's rounding is inside the envelope, and the one
    term covers the centre's rounding."""
    return 2 if out.prec < FLOAT32.prec else 1


def _candidates(out: Format):
    """(key, precision name, input format or None) for the rounding hypothesis and the reduced ones:
    inputs rounded to fp16/bf16 (and to fp32 under a float64 result), then computed correctly in
    float32 arithmetic (torch's opmath for half inputs) and stored in :func:`storage`."""
    c = [("rounding", None, None)]
    if out is FLOAT64:
        c.append(("fp32", "fp32", FLOAT32))
    if out.prec > FLOAT16.prec:
        c.append(("fp16", "fp16", FLOAT16))
    if out.prec > BFLOAT16.prec:
        c.append(("bf16", "bf16", BFLOAT16))
    return c


def _rounded_args(args: dict, fmt: Format) -> dict:
    """The call's floating-point operands rounded (to nearest even) to ``fmt``, as float64 arrays."""
    from refkern._arrays import is_tensor, operand
    from refkern.accumulate.formats import round_array

    out = {}
    for k, v in args.items():
        if (is_tensor(v) and str(v.dtype) == "torch.bool") or (isinstance(v, np.ndarray) and v.dtype == np.bool_):
            out[k] = v  # a boolean mask has nothing to round
        elif is_tensor(v) or isinstance(v, np.ndarray):
            a = np.ascontiguousarray(operand(v, k, "compare").values, np.float64)
            out[k] = round_array(a, *fmt.params)
        else:
            out[k] = v
    if "dtype" in out:
        out["dtype"] = None
    return out


def _sqrt_interval(w, e):
    """(lo, hi) of sqrt over [w - e, w + e] (lo = 0 where the interval reaches 0)."""
    return np.sqrt(np.maximum(w - e, 0.0)), np.sqrt(w + e)


def _row_stats(X, center):
    """Per row of the float64 (R, n) array: mean, M2 (or sum x^2), A = mean |x|, ||x||_2, sum x^2."""
    with np.errstate(all="ignore"):
        mean = X.mean(axis=1) if center else np.zeros(X.shape[0])
        d = X - mean[:, None]
        m2 = (d * d).sum(axis=1)
        q = (X * X).sum(axis=1)
        return mean, m2, np.abs(X).mean(axis=1), np.sqrt(q), q


def _norm_envelope(X, W, B, center, eps, given, u, u_m, one_pass, ref, out, stores=0):
    """Envelope of a norm over rows of X (R, n) with weight/bias broadcast to X's shape, plus ``stores``
    times the store ``u_o |ref| + half a subnormal`` (:func:`_stores`)."""
    R, n = X.shape
    has_given = given is not None
    given = (np.zeros(R), np.zeros(R)) if given is None else given
    gm, gv = (np.broadcast_to(np.asarray(g, np.float64), (R,)).copy() for g in given)
    eta = stores * 0.5 * 2.0 ** (out.emin - out.prec + 1)
    h = held_dtype(X, ref)  # one format for both (noise_rows.held_dtype): one compiled signature of _norm_rows each
    X, ref = (np.ascontiguousarray(v, h) for v in (X, np.asarray(ref)))
    g_n, g_n3 = _gamma(n, u)[()], _gamma(n + 3, u)[()]
    if not has_given and (g_n == np.inf or (not one_pass and g_n3 == np.inf)) and R * n and np.isfinite(ref).all():
        # the statistics' error is unbounded (n u > 1/8: bfloat16 beyond 32 terms): every element's bound is
        # inf (_norm_rows: an infinite or NaN e_m2 makes every b inf or NaN, NaN becomes inf; only a special
        # reference could make the store's term NaN), held as one value broadcast rather than (R, n) of them
        return np.broadcast_to(np.inf, (R, n))
    bound = np.empty((R, n))
    _norm_rows(X, _param_rows(W, R, n), _param_rows(B, R, n), ref.reshape(R, n), bool(center), float(eps),
               has_given, gm, gv, u, u_m, bool(one_pass), g_n, g_n3, _underflow(n, u),
               stores * out.u, eta, bound)  # fmt: skip
    return bound


def _param_rows(p, R, n):
    """A norm's weight or bias as the (1 or R, 1 or n) float64 array that broadcasts to (R, n), held once
    (``_norm_rows`` reads row ``i % rows``, column ``j`` or 0), rather than a strided (R, n) view."""
    p = np.asarray(p, np.float64)
    p = p.reshape((1,) * (2 - p.ndim) + p.shape) if p.ndim < 2 else p
    rows, cols = (1 if s == 1 else t for s, t in zip(p.shape, (R, n)))
    return np.ascontiguousarray(np.broadcast_to(p, (R, n))[:rows, :cols])


@jit(parallel=True, error_model="numpy")
def _norm_rows(X, W, B, ref, center, eps, has_given, gmean, gvar, u, u_m, one_pass, g_n, g_n3, uf, su, eta, bound):
    """The norm envelope of the module docstring, one row a thread, in float64 (X and ref float32 or
    float64, each element widened as it is read; W and B (1 or R, 1 or n), read at row ``i % rows`` and
    column ``j`` or 0): the row's mean, M2, mean |x| (A) and sum x^2 (q) by two passes, then every
    element's bound; NaN becomes inf (no claim)."""
    R, n = X.shape
    ua = u + u_m  # every step of the affine part may also be stored in the result dtype (half results)
    sw, sb = int(W.shape[1] > 1), int(B.shape[1] > 1)
    for i in prange(R):
        if has_given:
            mean, var, dmu, e_v = gmean[i], gvar[i], 0.0, 0.0
        else:
            t = 0.0
            for j in range(n):  # np.float64, not float(): numba's float() keeps a float32 a float32 (whose
                t += np.float64(X[i, j])  # squares overflow beyond 1.8e19, where the envelope became inf)
            mean = t / n if center else 0.0
            m2, q, a = 0.0, 0.0, 0.0
            for j in range(n):
                x = np.float64(X[i, j])
                d = x - mean
                m2 += d * d
                q += x * x
                a += abs(x)
            A = a / n
            dmu = g_n * A + u_m * abs(mean)
            e_m2 = 3.0 * g_n * q if one_pass else g_n3 * np.sqrt(q) * np.sqrt(m2) + n * (g_n * A) ** 2
            var = m2 / n
            e_v = (e_m2 + uf) / n + ua * var
        w = var + eps
        e_w = e_v + ua * w
        s_lo, s_hi = np.sqrt(max(w - e_w, 0.0)), np.sqrt(w + e_w)
        r = 1.0 / np.sqrt(w)
        e_r = max(1.0 / s_lo - r, r - 1.0 / s_hi) + (2.0 * u + u_m) * r
        wr, br, xr, yr, out = W[i % W.shape[0]], B[i % B.shape[0]], X[i], ref[i], bound[i]
        if sw and sb:  # weight and bias per column (layer_norm): a loop the compiler vectorises
            for j in range(n):
                out[j] = _norm_element(xr[j], yr[j], wr[j], br[j], mean, dmu, ua, r, e_r, su, eta)
        else:
            for j in range(n):
                out[j] = _norm_element(xr[j], yr[j], wr[j * sw], br[j * sb], mean, dmu, ua, r, e_r, su, eta)


@jit(inline="always")
def _norm_element(x, y, w, bias, mean, dmu, ua, r, e_r, su, eta):
    """One element's bound of :func:`_norm_rows` (x and y widened to float64 here)."""
    x, y = np.float64(x), abs(np.float64(y))
    d = abs(x - mean)
    e_d = dmu + ua * (d + dmu)
    aw = abs(w)
    b = aw * (e_d * r + d * e_r + e_d * e_r) + 3.0 * ua * (abs(x) + abs(mean)) * r * aw
    b += 2.0 * ua * abs(bias) + 2.0 * ua * y
    return (b if b == b else np.inf) + su * y + eta


def envelopes(name: str, args: dict, ref: np.ndarray, out: Format, lazy: bool = False) -> tuple[list, int]:
    """The hypotheses for one call, as ``[(key, precision, centre, bound)]`` (float64 arrays of
    ref's shape), and the number of terms per element:

    * "rounding": centre the correctly rounded reference, bound the envelope in the working unit
      (plus ``u_m`` for the intermediates torch rounds to a half result dtype);
    * each reduced precision p: centre the exact op on the inputs rounded to p, bound the float32
      envelope and the store to :func:`storage` (float32 under a float64 result, whose grid the
      verdict then requires): a sharp hypothesis (inputs converted to p, then computed correctly),
      never a loose "computed somehow in p" that a bug could hide in;
    * for var and std the one-pass variance, centred on the reference with its own envelope, and for
      the norms with batch statistics its shape test (:func:`_one_pass_norm`), used only to name a
      mismatch;
    * for softmax, log_softmax and attention the named bugs, as ``(key, text, fn, None)`` (module
      docstring), which :func:`~refkern.analysis.verdict.decide_envelope` evaluates only to name a mismatch.
    Every bound includes the store to the result format. With ``lazy``, every hypothesis but the
    rounding one is ``(key, precision, None, thunk)``, ``thunk() -> (centre, bound)``: the verdict
    runs them (an exact op on rounded inputs each) only when rounding does not explain the output."""
    from refkern.analysis._envelope_ops import layout

    if name == "rms_norm" and args.get("eps") is None:  # the default follows the input's dtype: fix it
        from refkern._arrays import operand  # before the inputs are rounded (to float64 arrays) below

        args = dict(args, eps=2.0**-52 if operand(args["input"], "input", name).fmt.prec == 53 else 2.0**-23)
    lay = layout(name, args, ref.shape)
    if lay.kind != "norm":  # a norm's kernel reads a float32 reference as it is held; numpy arithmetic
        ref = np.asarray(ref, np.float64)  # on float32 stays float32 (NEP 50): every other kind widens first
    u, u_m = working_unit(out), (out.u if out.prec < FLOAT32.prec else 0.0)
    rounding = _one(lay, u + u_m, u_m, False, ref, out, store=True)
    hyps = [("rounding", None, ref, rounding)]
    for key, prec, fmt in _candidates(out)[1:]:
        hyps.append((key, prec, None, lambda p=prec, f=fmt: _reduced(name, args, ref, out, p, f)))
    if lay.kind in ("var", "std"):
        hyps.append((ONE_PASS, None, None, lambda: (ref, _one(lay, u + u_m, u_m, True, ref, out, store=True))))
    elif lay.kind == "norm" and lay.given is None and lay.center:  # rms_norm has no mean to cancel against
        hyps.append((ONE_PASS, ONE_PASS_TEXT, lambda a, bad, r: _one_pass_norm(lay, u, a, bad, r, rounding), None))
    if lay.kind in _SOFTMAX_KINDS:
        from refkern.analysis._envelope_softmax import named_bugs, reduced_hypotheses

        hyps += reduced_hypotheses(name, lay, ref, out, rounding)
        def own(lay_alt, c):  # a named bug's centre with its own rounding envelope and the store
            return _one(lay_alt, u + u_m, u_m, False, c, out) + _store(c, out.u, out)

        hyps += [(key, text, fn, None) for key, text, fn in named_bugs(name, args, lay, out, own)]
    if not lazy:
        hyps = [(k, p, *e[3]()) if e[2] is None else e for e in hyps for k, p in [e[:2]]]
    return hyps, lay.n


def _reduced(name, args, ref, out, prec, fmt):
    """(centre, bound) of the reduced precision ``prec``: refkern's op on the inputs rounded to ``fmt``,
    the float32 envelope of that call from its own terms (bf16 rounds data near 1e4 to steps of 64),
    the store to :func:`storage` and then to ``out``."""
    from refkern.analysis._envelope_ops import layout

    ref = np.asarray(ref, np.float64)
    rounded = _rounded_args(args, fmt)
    res = _ops.get(name).reference(**rounded)
    res = res[0] if isinstance(res, tuple) else res
    centre = np.asarray(res, np.float64).reshape(ref.shape)
    st = storage(out, prec)
    store = _stores(out) * _store(ref, out.u, out)
    store_p = store if st is out else store + _store(centre, st.u, st)  # to float32, then exactly to out
    u_m = out.u if out.prec < FLOAT32.prec else 0.0  # a half result: intermediates stored in it, as for rounding
    return centre, _one(layout(name, rounded, ref.shape), FLOAT32.u + u_m, u_m, False, centre, out) + store_p


def _one_pass_norm(lay, u, actual, bad, ref, rounding) -> bool:
    """Does a norm's mismatch fit the one-pass variance? Only to name a mismatch, never to excuse.

    A norm with a one-pass variance is a correct norm whose variance ``v1`` is off by up to
    ``e1 = 3 gamma_n sum x**2 / n`` (the module docstring), so each row of its output minus the bias is
    the reference's, ``(x - mean) r w``, rescaled by ``s = r1 / r`` with ``r1 = (v1 + eps)**-1/2``. Its
    envelope is unbounded wherever that interval reaches ``-eps`` (the cancellation it is named for),
    so explaining elements by it would name every bug on such data; the test is the shape instead.
    Every row holding an unexplained element must be such a rescale: ``s`` fitted by least squares,
    each element within the rounding envelope times ``max(1, s)`` (the affine step's errors scale with
    r) of ``s (ref - b) + b``, ``s > 0``, and the variance it implies, ``1 / (s r)**2 - eps``, within
    ``e1`` of the exact one; or the row is NaN where ``v + eps <= e1`` (the one-pass variance can fall
    below ``-eps``: a square root of a negative number)."""
    X, n = lay.X, lay.n
    rows = np.flatnonzero(lay.rows(bad).reshape(X.shape[0], -1).any(axis=1))
    if not rows.size:
        return False
    with np.errstate(all="ignore"):
        mean, m2, _, _, q = _row_stats(np.asarray(X[rows], np.float64), True)
        var, e1 = m2 / n, 3.0 * _gamma(n, u)[()] * q / n + _underflow(n, u) / n
        B = np.broadcast_to(lay.B, X.shape)[rows]
        Y, A = lay.rows(ref)[rows] - B, lay.rows(actual)[rows] - B
        env = lay.rows(rounding)[rows]
        s = (A * Y).sum(axis=1) / (Y * Y).sum(axis=1)
        fit = np.all(np.abs(A - s[:, None] * Y) <= env * np.maximum(1.0, s)[:, None], axis=1)
        implied = 1.0 / (s * s) * (var + lay.eps) - lay.eps  # 1 / (s r)**2 - eps with r**-2 = var + eps
        ok = fit & (s > 0) & (np.abs(implied - var) <= e1)
        nan_rows = np.all(np.isnan(A), axis=1) & ~np.any(np.isnan(Y), axis=1) & (var + lay.eps <= e1)
    return bool(np.all(ok | nan_rows))


def _one(lay, u, u_m, one_pass, ref, out, store=False):
    """The envelope of one hypothesis (``store``: plus the store of ``ref`` to ``out``)."""
    if lay.kind == "norm":
        b = _norm_envelope(lay.X, lay.W, lay.B, lay.center, lay.eps, lay.given, u, u_m, one_pass,
                           lay.ref_rows(ref), out, _stores(out) if store else 0)  # fmt: skip
        return lay.back(b)
    k = 1 if lay.kind in _SOFTMAX_KINDS else _stores(out)  # softmax's bound carries its centre's rounding itself
    return _bare(lay, u, u_m, one_pass, ref, out) + (k * _store(ref, out.u, out) if store else 0.0)


def _bare(lay, u, u_m, one_pass, ref, out):
    kind, X, n = lay.kind, lay.X, lay.n
    if kind == "max":
        return np.zeros(ref.shape)
    if kind in _SOFTMAX_KINDS:
        from refkern.analysis._envelope_softmax import bound

        return bound(lay, u, u_m, ref, out)
    with np.errstate(all="ignore"):
        if kind == "sum":
            return lay.back(_gamma(max(n - 1, 0), u) * np.abs(X).sum(axis=1))
        if kind == "mean":
            return lay.back(_gamma(max(n - 1, 0), u) * lay.absmean + (u + u_m) * np.abs(lay.rows(ref)))
        if kind == "cumsum":
            pre = np.cumsum(np.abs(X), axis=1)
            b = _gamma(np.arange(X.shape[1])[None, :], u) * pre
            return lay.back(b)
        if kind in ("var", "std"):
            mean, m2, A, norm2, q = _row_stats(X, True)
            e_m2 = 3.0 * _gamma(n, u) * q if one_pass else _gamma(n + 3, u) * norm2 * np.sqrt(m2) + n * (
                _gamma(n, u) * A) ** 2  # fmt: skip
            e_m2 = e_m2 + _underflow(n, u)
            D = lay.divisor
            v = np.where(D > 0, m2 / D, np.inf)
            e_v = e_m2 / D + u * v
            if kind == "var":
                return lay.back(np.where(np.isfinite(e_v), e_v, np.inf))
            lo, hi = _sqrt_interval(v, e_v)
            s = np.sqrt(v)
            return lay.back(np.maximum(s - lo, hi - s) + 2.0 * u * s)
        raise AssertionError(kind)  # pragma: no cover - every kind is handled above
