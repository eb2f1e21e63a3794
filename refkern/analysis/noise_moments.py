"""The rows' moments behind the scales of :mod:`refkern.analysis.noise` (whose module docstring derives them):
M2, the mean and the first-order variances of M2 (two-pass and Welford) and of the mean, per row, in one jitted
pass (:func:`_m2_rows`), and var's and std's scale per row from them (:func:`_var_rows`)."""

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["_m2_rows", "_moments", "_var_rows"]


@jit(parallel=True, error_model="numpy")
def _m2_rows(X, center, u, inv, out_m2, out_mean, out_s2, out_smu2):
    """Per row of X (R, n), float32 or float64 (widened as read): M2 = sum (x - mean)**2 (``center`` False:
    sum x**2), the mean, and the first-order variances of M2 (two-pass and Welford, module docstring) and
    of the mean. ``inv[k] = 1 / (k + 1)``. Welford's k-th running mean is ``m_k = P_k / k`` (P the prefix
    sums) and the steps after it telescope to ``mean - m_k``: both in closed form, no chain of divisions."""
    R, n = X.shape
    for i in prange(R):
        t = 0.0
        lp, sp, spp = 0.0, 0.0, 0.0
        for j in range(n):
            t += np.float64(X[i, j])
            if j >= 1:
                lp += t * t  # left-to-right partial sums of x
            if j <= n - 3:
                sp += t
                spp += t * t
        mean = t / n if center else 0.0
        rp = t * t + (n - 2) * t * t - 2.0 * t * sp + spp if n > 2 else (t * t if n == 2 else 0.0)
        psx = max(lp, rp)
        smu2 = u * u * (psx / (n * n) + mean * mean) if center else 0.0
        m2, d4, lq, sq, sqq = 0.0, 0.0, 0.0, 0.0, 0.0
        P, g, w = 0.0, 0.0, 0.0
        for j in range(n):
            x = np.float64(X[i, j])
            d = x - mean
            q = d * d
            m2 += q
            d4 += q * q
            if j >= 1:
                lq += m2 * m2
            if j <= n - 3:
                sq += m2
                sqq += m2 * m2
            if center and j >= 1:  # e_k in m_k (k = j), u (|m_k| + 2 |step_k|), reaches M2 as 2 k |mean - m_k|
                mk = P * inv[j - 1]
                c = 2.0 * j * abs(mean - mk) * u * (abs(mk) + 2.0 * abs(g))
                w += c * c
                g = (x - mk) * inv[j]  # the next step, (x_(k+1) - m_k) / (k + 1)
            P += x
        rq = m2 * m2 + (n - 2) * m2 * m2 - 2.0 * m2 * sq + sqq if n > 2 else (m2 * m2 if n == 2 else 0.0)
        s2 = u * u * (5.0 * d4 + max(lq, max(rq, 0.0)))
        if center and n > 1:
            emu = u * (np.sqrt(psx) / n + abs(mean))
            s2 += w + (n * emu * emu) ** 2  # the mean's error at second order (module docstring)
        out_m2[i], out_mean[i], out_s2[i], out_smu2[i] = m2, mean, s2, smu2


def _moments(X, center, u):
    R = X.shape[0]
    m2, mean, s2, smu2 = (np.empty(R) for _ in range(4))
    X = np.asarray(X)
    _m2_rows(np.ascontiguousarray(X, X.dtype if X.dtype in (np.float32, np.float64) else np.float64), bool(center),
             float(u), 1.0 / np.arange(1.0, X.shape[1] + 1.0), m2, mean, s2, smu2)  # fmt: skip
    return m2, mean, s2, smu2


def _var_rows(lay, u, lam, eta2, moments=None):
    """sigma**2 of var (or std) per row; ``eta2``: what the n squares may lose to underflow, 2 n eta of the
    working format in the units of the squares (one bounded term: every square may lose it alike).
    ``moments``: ``(M2, sigma**2 of M2)`` per row where the caller has them (the rest of
    :func:`_var_chains`), else the whole family's (:func:`_m2_rows`)."""
    if moments is None:
        m2, _, s2, _ = _moments(lay.X, True, u)
    else:
        m2, s2 = moments
    D = lay.divisor
    s2 = s2 + (lay.n * eta2) ** 2
    with np.errstate(all="ignore"):
        var = np.where(D > 0, m2 / D, np.inf)
        sv2 = np.where(D > 0, s2 / (D * D), np.inf) + (u * var) ** 2
        if lay.kind == "var":
            return sv2
        sd = np.sqrt(sv2)
        std = np.sqrt(var)  # [var - lam sd, var + lam sd] through the square root, the wider side, over lam
        step = np.maximum(std - np.sqrt(np.maximum(var - lam * sd, 0.0)), np.sqrt(var + lam * sd) - std) / lam
        return step**2 + (u * std) ** 2
