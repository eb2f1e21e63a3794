"""``refkern.nll_loss`` and ``refkern.cross_entropy``: torch's semantics, correctly rounded.

A call is read by :func:`refkern.kernels._loss_call.loss_call`: rows ``x_r`` of C classes (the class axis
moved last), per row a coefficient ``a_rc`` for every class, and a reduction. With ``w_c`` the class
weight (1 without ``weight``), ``eps`` the label smoothing and ``t_r`` the class target:

* nll_loss (``x`` log-probabilities): ``l_r = -w_{t_r} x_{r t_r}`` for a row whose target is not
  ``ignore_index``, 0 for an ignored row;
* cross_entropy, class targets: ``l_r = (1 - eps) w_t (-log p_{rt}) + (eps / C) sum_c w_c (-log p_rc)``,
  0 for an ignored row; probability targets ``P``: ``l_r = sum_c w_c (P_rc (1 - eps) + eps / C)
  (-log p_rc)``; ``-log p_rc = (M_r - x_rc) + L_r``, ``M_r`` the row's largest logit and ``L_r = log
  sum_c e**(x_rc - M_r)``;
* ``reduction``: "none" gives ``l`` in the target's shape; "sum" ``sum_r l_r``; "mean" ``sum_r l_r / D``
  with ``D = sum_r w_{t_r}`` over the rows not ignored (class targets: torch divides by the weights of
  the counted targets, for the smoothing term too) or ``D = R`` (probability targets).

Every result is that real number rounded once to the input's dtype (nearest even, subnormals, overflow
to inf). Special values as torch's formula gives them in IEEE arithmetic: a row holding NaN or +inf, or
only -inf, has NaN log-probabilities; a -inf logit that enters with a nonzero coefficient gives +inf,
with a zero one NaN (``0 * inf``, as torch's product); an ignored row is 0 whatever it holds; a mean
whose ``D`` is 0 is ``num / 0`` (NaN when the numerator is 0: every row ignored).

Method (Ziv's strategy). nll_loss is rational: "none" is one product (exact in float64 for
float16/bfloat16/float32 inputs, IEEE's correctly rounded product for float64), "sum" one exact dot
(:func:`~refkern.accumulate.exact.exact_dot`), "mean" the exact sums as integers, divided and rounded
once (:func:`~refkern.accumulate.ziv.round_fraction`). cross_entropy: a float64 pass gives ``L_r``
within ``e_r`` (:func:`~refkern.kernels._transcendental.log_fast` over the bounded ``exp_fast`` terms),
the row values and their bound ``gamma_{C+8} sum_c |a_rc| (d_rc + L_r) + sum_c |a_rc| e_r`` (every
coefficient, difference, sum and product a float64 rounding; ``gamma_k = k u (1 + 4 k u) / (1 - k u)``)
and for a sum or mean ``+ gamma_{R+2}`` of the row values' magnitudes and the divisor's; the result is
decided where both ends of that interval round alike (float16, bfloat16, float32 results). The rest,
and every float64 result, take the exact path (:mod:`refkern.kernels._loss_exact`): ``A_r = sum_c a_rc``
and ``B_r = sum_c a_rc d_rc`` as exact rationals, ``L_r`` as an integer interval
(:mod:`refkern.kernels._exact_real`), the precision doubled until the interval rounds alike. Rows whose
``L_r`` is 0 (one finite logit) or whose ``A_r`` is 0 are exact rationals; any other value is
irrational for coefficients of one sign (Lindemann-Weierstrass), so the loop ends; weights of both
signs whose log terms cancel exactly are refused after ``2**15`` bits.
"""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import pow2
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import FLOAT64, round_array
from refkern.kernels._common import deliver
from refkern.kernels._loss_call import LossCall, loss_call
from refkern.kernels._transcendental import EXP_FAST_REL, X_MIN, U, exp_fast, log_fast

__all__ = ["nll_loss", "cross_entropy", "log_sums", "row_coefficients", "gamma"]

_TINY = 2.0**-1074


@jit(parallel=True)
def _log_sums(X, M, L, eL, status):
    """Per row of X (R, C): M the largest entry, L = log sum_c e**(x_c - M) within eL (float64: each
    exp_fast term within EXP_FAST_REL (+ the two-sum's rest of x - M), its float64 sum within (k - 1) u of
    the sum, log_fast's own bound; a term below e**-2000 left out, inside n 2**-1074); status 1 for a row
    with NaN or +inf, or only -inf (NaN log-probabilities)."""
    R, n = X.shape
    for r in prange(R):
        m = -np.inf
        bad = False
        for j in range(n):
            v = X[r, j]
            if v != v or v == np.inf:
                bad = True
            elif v > m:
                m = v
        if bad or m == -np.inf:
            status[r], M[r], L[r], eL[r] = 1, np.nan, np.nan, 0.0
            continue
        c0, T, ET, k = 0.0, 0.0, 0.0, 0
        for j in range(n):
            v = X[r, j]
            if v == -np.inf:
                continue
            d, de = two_sum(v, -m)
            if d == 0.0:
                c0 += 1.0
                continue
            if d < X_MIN:
                continue
            a, e = exp_fast(d)
            p = a * pow2(e) if e >= -1022 else np.ldexp(a, e)  # one correctly rounded product, as ldexp
            T += p
            ET += (EXP_FAST_REL + 1.01 * abs(de)) * p
            k += 1
        ET = (ET + max(k - 1, 0) * U * T) * 1.01 + n * _TINY
        lv, le = log_fast(c0, T, ET)
        status[r], M[r], L[r], eL[r] = 0, m, lv, le


def log_sums(X):
    """(M, L, eL, status) of :func:`_log_sums` for the float64 rows X."""
    R = X.shape[0]
    M, L, eL = np.empty(R), np.empty(R), np.empty(R)
    status = np.zeros(R, np.int8)
    if R:
        _log_sums(np.ascontiguousarray(X, np.float64), M, L, eL, status)
    return M, L, eL, status


def gamma(k, u=U):
    """``k u (1 + 4 k u) / (1 - k u)`` (Higham's gamma_k with the second-order slack), inf beyond k u = 1/8."""
    k = np.asarray(k, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(k * u <= 0.125, k * u / (1.0 - k * u) * (1.0 + 4.0 * k * u), np.inf)


def row_coefficients(c: LossCall):
    """The coefficients of cross_entropy's rows as float64 arrays (each within a few u of the real one):
    ``("pick", p, s)`` for class targets, ``a_rc = p_r [c == t_r] + s_r w_c``; ``("dense", A)`` for
    probability targets, ``A`` (R, C)."""
    w = np.ones(c.C) if c.weight is None else c.weight
    eps = c.label_smoothing
    if c.probs is not None:
        return "dense", w[None, :] * (c.probs * (1.0 - eps) + eps / c.C)
    valid = c.valid
    wt = np.where(valid, w[np.where(valid, c.target, 0)], 0.0)
    return "pick", (1.0 - eps) * wt, np.where(valid, eps / c.C, 0.0)


def _ce_rows(c: LossCall, M, L, eL, status):
    """Float64 row values of cross_entropy, their bound, and which rows are special (module docstring)."""
    R, C = c.raw.shape
    w = np.ones(C) if c.weight is None else c.weight
    kind, *coef = row_coefficients(c)
    with np.errstate(all="ignore"):
        if kind == "dense":
            A = coef[0]
            Dm = M[:, None] - c.X
            v = (A * (Dm + L[:, None])).sum(axis=1)
            mag = (np.abs(A) * (Dm + L[:, None])).sum(axis=1)
            asum = np.abs(A).sum(axis=1)
            special = (status != 0) | np.isinf(c.X).any(axis=1)
        else:
            p, s = coef
            rows = np.arange(R)
            t = np.where(c.valid, c.target, 0)
            dt = M - c.X[rows, t]
            v = p * (dt + L)
            mag = np.abs(p) * (dt + L)
            asum = np.abs(p)
            special = c.valid & ((status != 0) | np.isinf(dt))
            if c.label_smoothing:
                Dm = M[:, None] - c.X
                sw = Dm @ w + w.sum() * L
                v = v + s * sw
                mag = mag + s * (Dm @ np.abs(w) + np.abs(w).sum() * L)
                asum = asum + s * np.abs(w).sum()
                special |= c.valid & np.isinf(c.X).any(axis=1)
            v = np.where(c.valid, v, 0.0)
            mag = np.where(c.valid, mag, 0.0)
        E = (gamma(C + 8) * mag + asum * np.where(np.isfinite(eL), eL, np.inf)) * 1.01
    return v, E, special


def _bracketed(v, E, fmt):
    """RN of every real within E of v where both ends round alike (else NaN), elementwise."""
    with np.errstate(all="ignore"):
        f = (E + 2.0 * U * np.abs(v)) * (1.0 + 2.0 * U) + 2.0**-1073
        lo = round_array(np.ascontiguousarray(v - f, np.float64), *fmt.params)
        hi = round_array(np.ascontiguousarray(v + f, np.float64), *fmt.params)
    ok = (lo == hi) & (np.signbit(lo) == np.signbit(hi)) & np.isfinite(v) & np.isfinite(E)
    return np.where(ok, lo, np.nan), ok


def _divisor(c: LossCall):
    """(D in float64, its bound) of a mean: the weights of the counted targets, or the row count."""
    if c.target is None:
        return float(c.raw.shape[0]), 0.0
    w = np.ones(c.C) if c.weight is None else c.weight
    wt = w[c.target[c.valid]]
    return float(wt.sum()), float(gamma(wt.size + 1) * np.abs(wt).sum())


def cross_entropy_values(c: LossCall, ls=None) -> np.ndarray:
    """The correctly rounded result of a cross_entropy call, float64 values in its output shape; ``ls``: the
    :func:`log_sums` of ``c.X`` when the caller has them."""
    from refkern.kernels import _loss_exact as lx

    M, L, eL, status = log_sums(c.X) if ls is None else ls
    v, E, special = _ce_rows(c, M, L, eL, status)
    fmt = c.fmt
    narrow = fmt.prec < FLOAT64.prec
    if c.reduction == "none":
        out, ok = _bracketed(v, E, fmt) if narrow else (np.full(v.shape, np.nan), np.zeros(v.shape, np.bool_))
        out = np.where(special, v, out)
        todo = np.flatnonzero(~ok & ~special)
        if todo.size:
            out[todo] = lx.rows_exact(c, todo, M, fmt)
        return out.reshape(c.sample_shape)
    if special.any():  # IEEE's sum of the special rows (inf, or NaN) absorbs every finite one
        s = v[special].sum()
        if c.reduction == "mean":
            s = s / _divisor(c)[0]
        return np.asarray(s, np.float64)
    if narrow and np.isfinite(v).all():
        tot = v.sum()
        Et = E.sum() + gamma(v.size + 2) * np.abs(v).sum()
        if c.reduction == "mean":
            D, eD = _divisor(c)
            if D != 0.0 and eD < 0.5 * abs(D):
                tot, Et = tot / D, (Et + abs(tot / D) * eD) / (abs(D) - eD) + 2.0 * U * abs(tot / D)
            else:
                Et = np.inf
        r, ok = _bracketed(np.asarray([tot]), np.asarray([Et]), fmt)
        if ok[0]:
            return np.asarray(r[0], np.float64)
    return np.asarray(lx.reduced_exact(c, M, fmt), np.float64)


def nll_values(c: LossCall) -> np.ndarray:
    """The correctly rounded result of an nll_loss call, float64 values in its output shape."""
    from refkern.kernels import _loss_exact as lx

    R = c.raw.shape[0]
    valid = c.valid
    all_valid = bool(valid.all())
    t = c.target if all_valid else np.where(valid, c.target, 0)
    xt = np.asarray(c.raw[np.arange(R), t], np.float64)  # only the targets' entries
    if c.reduction != "none" and c.weight is None and all_valid and c.raw.dtype == np.float32 and R:
        fast = _nll_reduced_fast(c, xt, xt) if np.isfinite(xt).all() else None  # unweighted: wv unread
        if fast is not None:
            return np.asarray(fast, np.float64)
    wt = np.ones(R) if c.weight is None else c.weight[t]
    if c.reduction == "none":
        with np.errstate(all="ignore"):
            prod = np.where(valid, -(wt * xt), 0.0)  # exact for float32 inputs; IEEE's rounding for float64
        out = round_array(np.ascontiguousarray(prod), *c.fmt.params) if c.fmt.prec < 53 else prod + 0.0
        return np.where(valid, out, 0.0).reshape(c.sample_shape)
    xv, wv = (xt, wt) if all_valid else (xt[valid], wt[valid])
    if not (np.isfinite(xv).all() and (c.weight is None or np.isfinite(wv).all())):
        # IEEE's sum of the products (a float64 product that overflowed takes the exact path)
        with np.errstate(all="ignore"):
            s = np.where(valid, -(wt * xt), 0.0).sum()
        return np.asarray(s / _divisor(c)[0] if c.reduction == "mean" else s, np.float64)
    fast = _nll_reduced_fast(c, wv, xv) if c.raw.dtype == np.float32 and xv.size else None
    return np.asarray(lx.nll_exact(c, wv, xv) if fast is None else fast, np.float64)


def _nll_reduced_fast(c: LossCall, wv, xv):
    """nll_loss's sum or mean of finite float32 (or narrower) log-probabilities without Fractions, or None where
    the exact path decides. The products ``w_t x_t`` are exact in float64 (24 + 24 bits), so a sum is one exact
    sum rounded once to the format (:func:`~refkern.accumulate.exact.exact_sum`); a mean is ``q = RN(S / D)``
    with ``S`` and ``D`` (the count, or the weights' sum) each correctly rounded to float64: ``q`` within
    ``(1 + u)**3 - 1 < 3.01 u`` of the real mean (u = 2**-53), and its rounding to the format is taken where
    every real within that of ``q`` rounds alike (:func:`_bracketed`'s bracket, rounded as two scalars; an
    infinite rounding, an overflow, is left to the exact path too); a zero numerator or divisor (the sign
    of a zero, num / 0) is left to the exact path."""
    from refkern.accumulate.exact import exact_sum

    terms = np.ascontiguousarray(-xv if c.weight is None else -(wv * xv), np.float64)
    if c.reduction == "sum":
        return float(exact_sum(terms, c.fmt))
    S = float(exact_sum(terms, FLOAT64))
    D = float(xv.size) if c.weight is None else float(exact_sum(np.ascontiguousarray(wv, np.float64), FLOAT64))
    if S == 0.0 or D == 0.0 or not np.isfinite(S):
        return None
    from fractions import Fraction

    from refkern.accumulate.ziv import round_fraction

    q = S / D
    f = (3.01 * U * abs(q) + 2.0 * U * abs(q)) * (1.0 + 2.0 * U) + 2.0**-1073  # as _bracketed's, one scalar
    lo, hi = (round_fraction(Fraction(v), c.fmt) for v in (q - f, q + f))  # no parallel launch for two values
    return lo if lo == hi and np.signbit(lo) == np.signbit(hi) and np.isfinite(lo) else None


def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,  # noqa: A002
             reduction: str = "mean"):  # fmt: skip
    """Reference ``torch.nn.functional.nll_loss``: the real value rounded once (module docstring).

    ``input``: log-probabilities (C,) or (N, C, d1, ...); ``target``: class indices, shape () or (N, d1,
    ...); ``weight``: (C,). A result has the input's dtype; a correct implementation differs from it by its
    own rounding: "none" a product (exact in float32), "sum" and "mean" the sum of N products in any order
    in the working precision (float32 for half inputs, torch's opmath) and one division (the yardstick,
    :mod:`refkern.analysis.losses`)."""
    c = loss_call("nll_loss", input, target, weight, size_average, ignore_index, reduce, reduction)
    return deliver(np.asarray(nll_values(c), np.float64), c.fmt, c.tensor)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100,  # noqa: A002
                  reduce=None, reduction: str = "mean", label_smoothing: float = 0.0):  # fmt: skip
    """Reference ``torch.nn.functional.cross_entropy`` (log_softmax, then nll_loss, with torch's label
    smoothing): the real value rounded once (module docstring).

    ``target`` is class indices (an integer tensor of the input's shape without the class dimension) or
    class probabilities (the input's shape). A correct implementation computes the log_softmax (within its
    envelope, :mod:`refkern.analysis.envelope`), then the weighted sums in the working precision; the
    yardstick (:mod:`refkern.analysis.losses`) propagates each of those roundings."""
    c = loss_call("cross_entropy", input, target, weight, size_average, ignore_index, reduce, reduction,
                  label_smoothing)  # fmt: skip
    return deliver(np.asarray(cross_entropy_values(c), np.float64), c.fmt, c.tensor)
