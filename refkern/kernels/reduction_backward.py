"""The backward of mean, var and std, correctly rounded: the real-valued derivative of the definition at
the given inputs, rounded once to the input's dtype.

* mean over n elements: ``grad_input = g / n``, a rational.
* var with ``dof = n - correction``: ``grad_input_j = 2 g (x_j - mu) / dof``, a rational (``mu`` the
  exact mean).
* std: ``grad_input_j = g (x_j - mu) / (dof s) = g (x_j - mu) / sqrt(dof M2)`` with ``s = sqrt(M2 / dof)``
  and ``M2 = sum (x_k - mu)**2``: an algebraic number.

Method (Ziv's strategy). A float64 pass decides almost every element. mean: ``y = fl(g / n)`` and its
remainder ``g - y n`` (exact by an FMA), so ``g / n = y + r / n`` as a double-word within ``2**-53
|r / n|``. var and std (:func:`_var_rows`): the row's exact moments (:func:`refkern.kernels._moments.moments`:
``x - c`` split exactly, ``delta = mu - c`` and ``M2`` as double-words with absolute bounds), then per
element ``d_j = (dh_j + dl_j) - delta`` and ``K = 2 g / dof`` (var) or ``K = g / sqrt(dof M2)`` (std) in
double-word arithmetic (:mod:`refkern.accumulate.dd`, each operation charged ``EPS`` of its result),
``y = K d_j`` with ``e(y) = e_K (|d| + e_d) + |K| e_d + EPS |y|``; :func:`~refkern.accumulate.ziv.decide`
rounds when the bound allows (float64 results included: the bounds are near ``2**-100`` relative). The
rest take the exact path: var's rational rounded by :func:`~refkern.accumulate.ziv.round_fraction`, std's
``(g d_j) / sqrt(dof M2)`` by :func:`~refkern.accumulate.ziv.round_quotient_sqrt`.

**Where the derivative has no real value torch's autograd defines the result**, and so does this module
(``var_backward`` and ``std_backward`` of torch's ``FunctionsManual.cpp``, ``(2 / dof) * grad * (self -
self.mean(dim, True))``, std's ``grad_var = (grad / (2 result)).masked_fill_(result == 0, 0)``):

* ``dof <= 0`` with ``dim=None`` (or a 0-d input): ``g * (nan if x_j == mu else inf)``;
* ``dof == 0`` with a ``dim``: ``2 / dof = inf``, so ``(inf g) d_j``: NaN where ``g == 0`` or ``d_j == 0``,
  else an infinity; ``dof < 0`` with a ``dim``: the finite ``2 g d_j / dof`` (torch's formula; the forward
  is +inf there);
* std where the forward is 0 (``M2 == 0``, ``dof > 0``): 0 (torch's masked_fill); where it is +inf
  (``dof <= 0``, ``M2 > 0``): ``g / inf = +-0`` fed to var's rule; where it is NaN (``dof <= 0``, ``M2 ==
  0``): NaN;
* a row holding a NaN or an infinity: the formula in IEEE float64 arithmetic, as torch evaluates it;
  a non-finite g with a finite row: IEEE products of the exact quantities' signs.

A zero result carries the sign IEEE products give torch's formula: ``sign(2 / dof) sign(g) sign(d_j)``
with ``d_j = +0`` where ``x_j`` equals the mean exactly.
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import fma
from refkern.accumulate.dd import EPS, dd_add, dd_div, dd_mul, dd_sqrt, safe
from refkern.accumulate.formats import Format, round_array
from refkern.accumulate.ziv import decide, round_fraction, round_quotient_sqrt
from refkern.kernels._moments import OK, new_workspace
from refkern.kernels._moments import moments as _moments

__all__ = ["mean_backward_values", "var_backward_rows", "TINY"]

TINY = 2.0**-1074  #: what one double-word operation near underflow may lose: charged once per operation
_FAST, _EXACT = 0, 1  # row status


@jit(parallel=True)
def _mean_values(G, n, prec, emin, emax, out):
    """out[k] = RN(G[k] / n) or NaN (undecided, a zero, or a non-finite g: the caller's). ``y = fl(g / n)``,
    ``r = fma(-y, n, g)`` is exact (the remainder of a correctly rounded quotient is a float64 when no
    underflow occurs: ``|y| >= 2**-960`` is required by decide), so ``g / n = y + r / n`` and ``fl(r / n)``
    is within ``2**-53 |r / n|`` of it."""
    for k in prange(G.size):
        g = G[k]
        y = g / n
        r = fma(-y, n, g)
        lo = r / n
        out[k] = decide(y, lo, abs(lo) * 2.0**-52 + TINY, prec, emin, emax)


def mean_backward_values(G: np.ndarray, n: int, fmt: Format) -> np.ndarray:
    """``RN(g / n)`` to ``fmt`` for every element of the float64 array G (same shape): the gradient of a
    mean over n elements before it is broadcast. A zero keeps g's sign; NaN and infinities follow IEEE
    division."""
    G = np.ascontiguousarray(G, np.float64)
    out = np.full(G.shape, np.nan)
    flat = out.reshape(-1)
    g = G.reshape(-1)
    if g.size and n > 0:
        _mean_values(g, float(n), *fmt.params, flat)
        for k in np.flatnonzero(np.isnan(flat)):
            v = float(g[k])
            if not math.isfinite(v) or v == 0.0:
                with np.errstate(all="ignore"):
                    flat[k] = round_array(np.array([v / n]), *fmt.params)[0]
            else:
                flat[k] = round_fraction(Fraction(v) / n, fmt)
    return out


@jit(parallel=True)
def _var_rows(X, G, dof_h, dof_l, want_std, prec, emin, emax, out, status):
    """Float64 pass over the finite rows of X (R, n) with one grad_output value per row, G (R,), for
    ``dof = dof_h + dof_l > 0`` exactly: out[r, j] = RN(grad_input) or NaN (undecided), status[r] = 0
    (fast) or 1 (the exact path for the whole row: a non-finite g, an extreme row, M2 too uncertain). A
    zero g gives the signed zeros ``g sign(d_j)`` where ``|d_j|`` exceeds its bound.

    Bounds (EPS per double-word operation, relative to its result; the moments' ``e_delta`` and
    ``e_m2``): var ``K = 2 g / dof`` within ``EPS |K|``; std ``w = M2 dof`` within ``e_w = e_m2 dof (1 +
    2**-50) + EPS |w|``, ``s = sqrt(w)`` within ``e_w / s + EPS s`` (``|sqrt(a) - sqrt(b)| <= |a - b| /
    sqrt(b)``), ``K = g / s`` within ``|g| e_s / (s (s - e_s)) + EPS |K|``; ``d_j = (dh_j + dl_j) - delta``
    within ``e_delta + EPS |d_j| + TINY``; ``y = K d_j`` within ``e_K (|d_j| + e_d) + (|K|) e_d + EPS |y|
    + TINY``, handed to decide times ``1 + 2**-40`` (the bound's own float64 evaluation)."""
    R, n = X.shape
    for i in prange(R):
        for j in range(n):
            out[i, j] = np.nan
        g = G[i]
        status[i] = _EXACT
        if not (abs(g) < np.inf):
            continue
        acc, tmp, scratch, dh, dl = new_workspace(n)
        st, c, d_h, d_l, e_d, m_h, m_l, e_m2, _ = _moments(X[i], True, prec, acc, tmp, scratch, dh, dl)
        if st != OK:
            continue
        if g == 0.0:  # zeros whose sign is sign(g) sign(d_j) (dof > 0), where d_j's sign is certain
            if want_std and not (m_h > 0.0 and e_m2 < 0.25 * m_h):
                continue  # std at a zero variance: torch's masked 0, the exact path's
            for j in range(n):
                z_h, z_l = dd_add(dh[j], dl[j], -d_h, -d_l)
                if abs(z_h) > e_d + EPS * abs(z_h) + TINY:
                    out[i, j] = g * z_h
            status[i] = _FAST
            continue
        if want_std:
            if not (m_h > 0.0 and e_m2 < 0.25 * m_h):
                continue
            w_h, w_l = dd_mul(m_h, m_l, dof_h, dof_l)
            e_w = e_m2 * dof_h * (1.0 + 2.0**-50) + EPS * abs(w_h)
            if not (w_h > 0.0 and e_w < 0.25 * w_h and safe(w_h)):
                continue
            s_h, s_l = dd_sqrt(w_h, w_l)
            e_s = e_w / s_h * (1.0 + 2.0**-40) + EPS * s_h
            k_h, k_l = dd_div(g, 0.0, s_h, s_l)
            e_k = abs(g) * e_s / (s_h * (s_h - e_s)) * (1.0 + 2.0**-40) + EPS * abs(k_h)
        else:
            if not safe(g) or not safe(2.0 * g):
                continue
            k_h, k_l = dd_div(2.0 * g, 0.0, dof_h, dof_l)
            e_k = EPS * abs(k_h)
        if not safe(k_h):
            continue
        ka = abs(k_h) + abs(k_l)
        for j in range(n):
            z_h, z_l = dd_add(dh[j], dl[j], -d_h, -d_l)  # x_j - c - delta, relative EPS
            if not safe(z_h):
                continue
            ez = e_d + EPS * abs(z_h) + TINY
            y_h, y_l = dd_mul(k_h, k_l, z_h, z_l)
            e = e_k * (abs(z_h) + abs(z_l) + ez) + ka * ez + EPS * abs(y_h) + TINY
            out[i, j] = decide(y_h, y_l, e * (1.0 + 2.0**-40), prec, emin, emax)
        status[i] = _FAST


def _sign_rep(q) -> float:
    """A float with the sign (and zeroness) of the Fraction q: its magnitude does not matter where used."""
    return 0.0 if q == 0 else math.copysign(1.0, q)


class _Row:
    """The exact statistics of one finite row: the mean, ``M2`` and ``d(j) = x_j - mean`` (Fractions)."""

    def __init__(self, x):
        ratios = [float(v).as_integer_ratio() for v in x]
        L = max(q for _, q in ratios)
        self.m = [p * (L // q) for p, q in ratios]
        n = len(self.m)
        s1, s2 = sum(self.m), sum(k * k for k in self.m)
        self.n, self.s1, self.L = n, s1, L
        self.m2 = Fraction(n * s2 - s1 * s1, n * L * L)

    def d(self, j: int) -> Fraction:
        return Fraction(self.n * self.m[j] - self.s1, self.n * self.L)


def _exact_row(x, g: float, dof: Fraction, want_std: bool, nodim: bool, fmt: Format, cols=None) -> list:
    """The gradient of one row (or of its elements ``cols``) by the exact path and torch's rules where no
    real value exists (module docstring); ``x`` finite."""
    row = _Row(x)
    cols = range(row.n) if cols is None else cols
    m2 = row.m2
    g_fin = math.isfinite(g)
    real_q = None  # the Fraction (or sqrt form) multiplying d_j / dof when the chain is real-valued
    qf = g  # a float standing for grad_var where it is special (its magnitude does not matter then)
    if want_std:
        if dof > 0:
            if m2 == 0:
                qf = 0.0  # masked_fill(result == 0, 0)
            elif g_fin:
                real_q = "std"
            else:
                qf = g  # inf / (2 s) = inf, nan stays nan
        else:
            qf = math.copysign(0.0, g) if (m2 > 0 and g_fin) else math.nan  # g / inf, or g / nan
    elif g_fin:
        real_q = "var"
    out = []
    for j in cols:
        d = row.d(j)
        if nodim and dof <= 0:
            with np.errstate(all="ignore"):
                q = qf if real_q is None else _sign_rep(Fraction(g))
                out.append(float(np.float64(q) * (math.nan if d == 0 else math.inf)))
            continue
        if real_q is not None and dof != 0:
            if g == 0 or d == 0:
                neg = (dof < 0) ^ (math.copysign(1.0, g) < 0) ^ (d < 0)
                out.append(-0.0 if neg else 0.0)
            elif real_q == "var":
                out.append(round_fraction(2 * Fraction(g) * d / dof, fmt))
            else:
                out.append(round_quotient_sqrt(Fraction(0), Fraction(g) * d, dof * m2, fmt))
            continue
        kf = math.inf if dof == 0 else float(_sign_rep(dof))
        q = qf if real_q is None else _sign_rep(Fraction(g))
        with np.errstate(all="ignore"):
            out.append(float(np.float64(kf) * np.float64(q) * np.float64(_sign_rep(d))))
    return out


def _ieee_rows(X, G, dof: Fraction, want_std: bool, nodim: bool, fmt: Format) -> np.ndarray:
    """Rows holding a NaN or an infinity: torch's formula in IEEE float64 arithmetic (std's forward is
    NaN on such a row, so its gradient is NaN throughout)."""
    with np.errstate(all="ignore"):
        if want_std:
            return np.full(X.shape, np.nan)
        mu = X.mean(axis=1, keepdims=True)
        if nodim and dof <= 0:
            v = G[:, None] * np.where(X == mu, np.nan, np.inf)
        else:
            k = math.inf if dof == 0 else float(Fraction(2) / dof)
            v = k * G[:, None] * (X - mu)
    return round_array(np.ascontiguousarray(v), *fmt.params)


def var_backward_rows(X: np.ndarray, G: np.ndarray, correction: Fraction, want_std: bool, nodim: bool,
                      fmt: Format) -> np.ndarray:  # fmt: skip
    """The gradient of var (std with ``want_std``) over the rows of the float64 (R, n) array X, with the
    row's grad_output value G[r] (float64 (R,)) and ``dof = n - correction``; ``nodim``: torch's
    ``dim=None`` (or 0-d input) rule where ``dof <= 0``. A float64 (R, n) array of values of ``fmt``."""
    X = np.ascontiguousarray(X, np.float64)
    G = np.ascontiguousarray(G, np.float64).reshape(-1)
    R, n = X.shape
    out = np.full((R, n), np.nan)
    if R == 0 or n == 0:
        return out
    dof = n - Fraction(correction)
    status = np.full(R, _EXACT, np.int64)
    if dof > 0:
        dof_h = float(dof)
        dof_l = float(dof - Fraction(dof_h))
        _var_rows(X, G, dof_h, dof_l, want_std, *fmt.params, out, status)
    finite = np.isfinite(X).all(axis=1)
    bad = np.flatnonzero(~finite)
    if bad.size:
        out[bad] = _ieee_rows(X[bad], G[bad], dof, want_std, nodim, fmt)
    for r in np.flatnonzero(finite):
        if status[r] == _EXACT:
            out[r] = _exact_row(X[r].tolist(), float(G[r]), dof, want_std, nodim, fmt)
            continue
        cols = np.flatnonzero(np.isnan(out[r]))
        if cols.size:
            out[r, cols] = _exact_row(X[r].tolist(), float(G[r]), dof, want_std, nodim, fmt, cols.tolist())
    return out
