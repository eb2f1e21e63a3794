"""The store of a half reduction, known exactly: what the element test of :mod:`refkern.analysis.inside`
(``_straddle``) needs beside the scale of :mod:`refkern.analysis.noise`.

A sum, mean, variance or standard deviation with a bfloat16 or float16 result is computed in float32
and stored once: a correct kernel returns ``RN(v)``, ``v`` within the float32 computation's scale of the
exact result, so the test asks how far the exact result lies from the values that round to the output
(not a rounding charged as noise). torch's CPU sums and means on several threads also store each
thread's partial in the result format. Those roundings are deterministic given the partials, so
:func:`thread_members` emulates them on the very inputs, one member per thread count: a partial is
rounded as its exact value is (unless that value lies within the float32 scale of a rounding boundary,
where either neighbour may come out: then both are members). Measured on torch 2.13: this split (contiguous
chunks of ``ceil(n / T)``, each partial stored in the result format, the partials added in float32)
reproduced its bf16 and fp16 sums on 1 to 32 threads, 100 of 100 cases of 3e5 and 1e6 terms; a mean's
partials are divided by n before the store (68 of 72) or after.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format, round_array

__all__ = ["GRAIN", "thread_members", "straddle", "straddle_z"]


GRAIN = 32768  #: torch's CPU parallel grain (at::internal::GRAIN_SIZE): a reduction splits into chunks of at least it


def _spacing(r, out: Format):
    """The larger spacing of the result format next to each value of ``r`` (the format's numbers): at 0 the
    smallest subnormal (``frexp(0)`` gives the exponent 0, the spacing of 1/2: a partial rounded to 0 was
    given 2**-11 in float16, 2**13 subnormal spacings, and a 10% error on a float16 mean of 1e7 values
    passed)."""
    _, e = np.frexp(np.abs(r))
    e = np.where(np.asarray(r) == 0, out.emin, np.maximum(e - 1, out.emin))
    return np.ldexp(1.0, e - out.prec + 1)


def _chunk_sq(D, E, C, s, e):
    """``max(sum_k P_k**2, sum_k Q_k**2)`` of the rows' chunks [s_j, e_j) (index arrays; prefix sums ``P``
    of at least two terms, suffix sums ``Q``), (R, chunks), from the prefix sums ``C`` and the running sums
    ``E`` of ``C`` and ``D`` of ``C**2`` (``E[k] = sum_(i<k) C_i``): three differences each, no pass over a
    chunk."""
    s, e = np.asarray(s), np.asarray(e)
    m = (e - s).astype(np.float64)
    big = e - s >= 2
    s2, e1, em1 = np.where(big, s + 2, s), np.where(big, e + 1, s), np.where(big, e - 1, s)
    cs, ce = C[:, s], C[:, e]
    with np.errstate(invalid="ignore"):
        lr = (D[:, e1] - D[:, s2]) - 2.0 * cs * (E[:, e1] - E[:, s2]) + (m - 1) * cs * cs
        rl = (D[:, em1] - D[:, s]) - 2.0 * ce * (E[:, em1] - E[:, s]) + (m - 1) * ce * ce
    return np.where(big, np.maximum(np.maximum(lr, rl), 0.0), 0.0)


AMBIGUOUS = 6  #: partials near a rounding boundary whose both roundings are enumerated (2**6 members at most)


def thread_members(X, name, out: Format, lam: float):
    """torch's CPU half sum or mean of each row of X (R, n) on ``T`` threads, ``2 <= T <= ceil(n / GRAIN)``
    (contiguous chunks of ``ceil(n / T)``, module docstring), emulated: ``(xh, err, pre)``, each
    (k, R). A chunk's float32 sum ``s_t`` lies within ``lam sigma_t`` of its exact sum ``S_t`` (``sigma_t =
    u sqrt(S_t**2)`` of its partial sums, the sum convention), so the stored partial is ``RN(S_t)`` (a mean's
    ``RN(S_t / n)``: divided before the store, 68 of 72 measured; and after, ``RN(S_t) / n``) unless ``S_t``
    is nearer a rounding boundary than that: then both roundings are members (at most :data:`AMBIGUOUS`
    such partials per thread count; beyond, one spacing more in ``pre`` each, bounded as every rounding
    is). The partials are added in float32 (their partial sums in ``pre``) and stored: the element test
    of :func:`straddle` on ``xh = sum p_t``. None below two threads."""
    R, n = X.shape
    top = -(-n // GRAIN)
    if top < 2 or name not in ("sum", "mean"):
        return None
    Xd = np.asarray(X, np.float64)
    C = np.concatenate([np.zeros((R, 1)), np.cumsum(Xd, axis=1)], axis=1)
    E = np.concatenate([np.zeros((R, 1)), np.cumsum(C, axis=1)], axis=1)
    D = np.concatenate([np.zeros((R, 1)), np.cumsum(C * C, axis=1)], axis=1)
    u2, d = FLOAT32.u**2, float(n if name == "mean" else 1)
    xh, pre = [], []
    for T in range(2, top + 1):
        c = -(-n // T)
        edges = np.unique(np.minimum(np.arange(0, n + c, c), n))
        s_, e_ = edges[:-1], edges[1:]
        S = (C[:, e_] - C[:, s_]).T  # (chunks, R)
        sd0 = lam * np.sqrt(u2 * _chunk_sq(D, E, C, s_, e_)).T
        for key in ("before", "after") if name == "mean" else ("sum",):
            f = d if key == "before" else 1.0
            v, sd = S / f, sd0 / f
            sd = sd + FLOAT64.u * np.abs(v)
            r = round_array(v.ravel(), *out.params).reshape(v.shape)
            alt = round_array((v + np.where(v >= r, 2.0, -2.0) * sd).ravel(), *out.params).reshape(v.shape)
            with np.errstate(invalid="ignore"):  # across one boundary at most; an overflowing partial has none
                alt = np.where(np.abs(alt - r) <= _spacing(r, out), alt, r)
            amb = np.flatnonzero(np.any(alt != r, axis=1))
            wide = np.zeros(R)
            if amb.size > AMBIGUOUS:  # too many to enumerate: as noise, one spacing each
                wide = np.sum(np.where(alt != r, _spacing(r, out) ** 2, 0.0), axis=0)
                amb = amb[:0]
            picks = (np.arange(1 << amb.size)[:, None] >> np.arange(amb.size)) & 1  # (combos, ambiguous)
            p = np.repeat(r[None], len(picks), axis=0)  # (combos, chunks, R)
            if amb.size:
                p[:, amb] = np.where(picks[:, :, None] == 1, alt[amb][None], r[amb][None])
            P = np.cumsum(p, axis=1)[:, 1:]  # the float32 additions of the partials
            tot, var = P[:, -1], u2 * np.sum(P * P, axis=1) + wide
            if key == "after":  # the float32 division, then the store
                tot, var = tot / n, var / float(n) ** 2 + u2 * (tot / n) ** 2
            xh.extend(tot)
            pre.extend(var)
    xh = np.stack(xh)
    return xh, 4.0 * FLOAT64.u * np.abs(xh), np.stack(pre)


def straddle(name, lay, pre, out: Format):
    """:attr:`Noise.straddle` of a reduction (sum, mean, var, std) with a half result, else None. The
    exact result to float64 is the op's own correctly rounded reference on the rows widened to float64
    (exactly: ``err = u64 |xh|``, one rounding); ``pre`` is the scale before the stores, with what may
    underflow in the working format (``(n + 4) eta_w**2``); the store itself, subnormal or not, is the
    test's interval."""
    if out.prec >= FLOAT32.prec or lay.X is None:
        return None

    def thunk():
        from refkern.ops import get

        X = np.asarray(lay.X, np.float64)
        kw = {} if name in ("sum", "mean") else {"correction": lay.n - lay.divisor}
        xh = np.asarray(lay.back(np.asarray(get(name).reference(X, dim=1, **kw), np.float64)), np.float64)
        return xh, FLOAT64.u * np.abs(xh)

    return np.asarray(pre, np.float64) + (lay.n + 4) * math.ldexp(1.0, FLOAT32.emin - FLOAT32.prec) ** 2, thunk


@jit(parallel=True, error_model="numpy")
def straddle_z(a, xh, err, pre, prec, emin, z):
    """The element test of a result stored once in the format (prec, emin) (``inside._straddle``): per
    element, the distance from the high-precision centre ``xh`` (within ``err`` of the exact result) to the
    values that round to ``a``, ``[a - h_lo, a + h_hi]`` (half the spacing to each neighbour: below a power
    of two the spacing toward zero halves; at 0 half the smallest subnormal each side), less ``err``, in
    units of ``sqrt(pre)``; 0 where equal or both NaN, inf at any other special."""
    for i in prange(a.size):
        z[i] = straddle_one(a[i], xh[i], err[i], pre[i], prec, emin)


@jit(inline="always")
def straddle_one(x, y, err, pre, prec, emin):
    """:func:`straddle_z` of one element: result ``x``, centre ``y``."""
    if x == y or (x != x and y != y):
        return 0.0
    if not (x - x == 0.0 and y - y == 0.0):
        return np.inf
    ax = abs(x)
    if ax == 0.0:
        lo = hi = 2.0 ** (emin - prec + 1) / 2.0
    else:
        m, e = math.frexp(ax)  # ax = m 2**e, m in [1/2, 1)
        sp = 2.0 ** (max(e - 1, emin) - prec + 1)
        down = sp / 2.0 if m == 0.5 and e - 1 > emin else sp  # the spacing toward zero
        lo, hi = (down / 2.0, sp / 2.0) if x > 0 else (sp / 2.0, down / 2.0)
    d = 0.0
    if y < x - lo:
        d = (x - lo) - y
    elif y > x + hi:
        d = y - (x + hi)
    d = max(d - err, 0.0)
    if d == 0.0:
        return 0.0
    zi = d / math.sqrt(pre)
    return np.inf if zi != zi else zi
