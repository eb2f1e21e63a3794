"""The worst-case envelopes of the softmax and log_softmax gradients: how far the gradient of any
correct implementation may lie from the correctly rounded one.

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
"""

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.analysis._envelope_softmax import EXP_ULPS

__all__ = ["bound", "PRODUCT_ROUNDINGS", "LOG_ROUNDINGS", "SECOND_ORDER", "F64_SUM", "EVAL_SLACK"]

PRODUCT_ROUNDINGS = 3  #: softmax: g_i - D^, the product by y^_i, and the expanded form's second product
LOG_ROUNDINGS = 2  #: log_softmax: the product exp(l^_i) G^ and the difference g_i - t
SECOND_ORDER = 4  #: at most four roundings compound on one path: (1 + 4u) covers their products
F64_SUM = 2  #: float64 sums of the bound's own quantities: 2 (n + 2) 2**-53 of their magnitudes
EVAL_SLACK = 1.0 + 2.0**-40  #: the bound's own float64 evaluation


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
    import refkern
    from refkern.analysis.envelope import envelopes

    log = op == "log_softmax"
    R, n = x.shape
    u, u_m, eta_w, eta_h, u_o, eta_o = _units(out)
    with np.errstate(all="ignore"):
        y = np.asarray(refkern.softmax(x, -1), np.float64)  # the exact softmax, rounded to float64
        y = np.where(np.isnan(y), 0.0, y)
        fwd = refkern.log_softmax(x, -1) if log else refkern.softmax(x, -1)
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
