"""The backward of the poolings (avg_pool1d/2d/3d, adaptive_avg_pool1d/2d, max_pool1d/2d), correctly
rounded: each element of grad_input one exact sum, rounded once to the input's dtype.

* An average's gradient spreads ``g_o / d_o`` over the input positions of window o (d_o its divisor:
  the forward's, :mod:`refkern.kernels.pool`); an input element sums the terms of every window that
  holds it (overlapping windows: several), ``grad_input = sum_o g_o / d_o``, a rational.
* A maximum's gradient goes to the element the forward selected (its returned index: torch's CPU
  choice, the first of equal maxima in scan order, the last NaN), ``grad_input = sum of g_o`` over the
  windows whose maximum it is.

Method (Ziv's strategy). A float64 pass (:func:`_scatter`) adds each plane's terms into its input
elements with TwoSum (Sum2 of Ogita, Rump and Oishi 2005), each term ``t = g / d`` within
``e_t = u |t| + TINY`` (one float64 division; 0 for a maximum's ``t = g``), so that the cascaded sum
is within ``e + u |y| + gamma_k**2 a + gamma_k e`` of the exact one (``a = sum|t|``, ``e = sum e_t``,
``k`` the element's number of terms, ``gamma_k <= 1.01 k u``; Prop. 4.5 of the paper), and
:func:`~refkern.accumulate.ziv.decide` rounds when that allows; a maximum's sum whose every TwoSum error
is zero is the exact sum itself, rounded once directly (two float32 gradients often sum to a float32
midpoint, which no bound decides). The rest (midpoints, exact zeros,
extreme magnitudes) are Fraction sums rounded once. An exactly zero sum is +0 (torch adds every term
to a zeroed gradient); a nonzero sum that rounds to zero keeps its sign. An element whose terms hold
a NaN or an infinity follows IEEE float64 arithmetic on the terms in scan order.
"""

import itertools
import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_array, round_to
from refkern.accumulate.ziv import decide, round_fraction

__all__ = ["avg_pool_backward", "max_pool_backward"]

U = 2.0**-53  #: float64's unit roundoff
TINY = 2.0**-1074  #: what a float64 division that underflows loses at most


@jit(parallel=True)
def _scatter(G, d0, d1, dd, h0, h1, dh, w0, w1, dw, dconst, idx, is_max, D, H, W, prec, emin, emax, out, asum, cnt,
             ieee):  # fmt: skip
    """Per plane p of G (P, OD, OH, OW): out[p] (P, D * H * W) = RN(sum of the terms reaching each input element)
    or NaN (undecided); asum/cnt: sum|t| and the number of terms per element; ieee: the plain float64 sum of the
    terms in scan order (for elements with a NaN or an infinity). Averages: window (l, i, j) covers the input
    positions [d0[l], d1[l]) x [h0[i], h1[i]) x [w0[j], w1[j]) with divisor dconst (nonzero) or dd[l] dh[i] dw[j]
    (a 1-d or 2-d pooling: D = 1, one window [0, 1) of count 1 along it); maxima (``is_max``): the term of
    (l, i, j) goes to the flat index idx[p, l, i, j]. Bounds: module docstring."""
    P, OD, OH, OW = G.shape
    n = D * H * W
    for p in prange(P):
        s = np.zeros(n)
        c = np.zeros(n)
        e = np.zeros(n)
        exact = np.ones(n, np.bool_)  # a maximum's sum with every TwoSum error zero: s is the exact sum
        for t in range(OD * OH * OW):
            l = t // (OH * OW)  # noqa: E741
            i = (t // OW) % OH
            j = t % OW
            g = G[p, l, i, j]
            if is_max:
                k = idx[p, l, i, j]
                s[k], q = two_sum(s[k], g)
                c[k] += q
                if q != 0.0:
                    exact[k] = False
                asum[p, k] += abs(g)
                cnt[p, k] += 1
                ieee[p, k] += g
                continue
            d = dconst if dconst != 0.0 else np.float64(dd[l] * dh[i] * dw[j])
            tt = g / d
            et = U * abs(tt) + TINY  # one division: exact when d is a power of two, charged anyway
            for z in range(d0[l], d1[l]):
                for a in range(h0[i], h1[i]):
                    for b in range(w0[j], w1[j]):
                        k = (z * H + a) * W + b
                        s[k], q = two_sum(s[k], tt)
                        c[k] += q
                        e[k] += et
                        asum[p, k] += abs(tt)
                        cnt[p, k] += 1
                        ieee[p, k] += tt
        for k in range(n):
            if cnt[p, k] == 0:  # no window reaches it (or selects it): +0, as torch's zeroed gradient
                out[p, k] = 0.0
                continue
            if is_max and exact[k] and abs(s[k]) < np.inf:  # the exact sum itself: one rounding, ties included
                out[p, k] = round_to(s[k], prec, emin, emax)
                continue
            y = s[k] + c[k]
            gam = 1.01 * cnt[p, k] * U
            err = e[k] + U * abs(y) + gam * gam * asum[p, k] + gam * e[k]
            v = np.nan
            if abs(asum[p, k]) < np.inf:
                v = decide(y, 0.0, err * (1.0 + 2.0**-40), prec, emin, emax)
            out[p, k] = v if v != 0.0 else np.nan  # an exact zero (+0) or a sign: the exact path decides


def _finish(G, fmt, terms, out, cnt, ieee):
    """The undecided elements: a NaN or an infinity among their terms (IEEE float64 sum in scan order,
    rounded), else the exact Fraction sum of ``terms(p, k)`` (pairs (g, d): g / d) rounded once; +0 for
    an exactly zero sum or no term."""
    for p, k in zip(*np.nonzero(np.isnan(out))):
        if cnt[p, k] == 0:
            out[p, k] = 0.0
            continue
        pairs = terms(p, k)
        if not all(np.isfinite(g) for g, _ in pairs):
            out[p, k] = round_array(np.array([ieee[p, k]]), *fmt.params)[0]
            continue
        q = sum((Fraction(float(g)) / d for g, d in pairs), Fraction(0))
        out[p, k] = 0.0 if q == 0 else round_fraction(q, fmt)
    return out


def _pool_backward(G, plane, fmt, spans, dconst, idx, terms):
    """The scatter of either pooling (:func:`_scatter`) and its exact finish (:func:`_finish`): grad_output G
    (P, *out) float64, the input's ``plane`` (its 1, 2 or 3 sizes: (L,), (H, W), (D, H, W)), the averages'
    ``spans`` per axis and ``dconst`` or the maxima's flat indices ``idx``; returns (grad_input, sum|t|, number
    of terms), each (P, *plane)."""
    P = G.shape[0]
    D, H, W = (1,) * (3 - len(plane)) + tuple(plane)
    out = np.full((P, D * H * W), np.nan)
    asum = np.zeros((P, D * H * W))
    cnt = np.zeros((P, D * H * W), np.int64)
    ieee = np.zeros((P, D * H * W))
    G4 = np.ascontiguousarray(G, np.float64).reshape(P, *(1,) * (4 - G.ndim), *G.shape[1:])
    one = [(0, 1, 1)]
    spans = [*[one] * (3 - len(spans)), *spans] if idx is None else [one] * 3
    (d0, d1, dd), (h0, h1, dh), (w0, w1, dw) = (tuple(np.asarray(v, np.int64) for v in zip(*sp)) for sp in spans)
    if P and G.size:
        ix = np.zeros((1, 1, 1, 1), np.int64) if idx is None else np.ascontiguousarray(idx, np.int64).reshape(G4.shape)
        _scatter(G4, d0, d1, dd, h0, h1, dh, w0, w1, dw, float(dconst), ix, idx is not None, D, H, W, *fmt.params,
                 out, asum, cnt, ieee)  # fmt: skip
        if float(dconst) != dconst:  # a divisor_override beyond float64's integers: every element exactly
            out[cnt > 0] = np.nan
    else:
        out[:] = 0.0
    _finish(G, fmt, terms, out, cnt, ieee)
    return tuple(v.reshape(P, *plane) for v in (out, asum, cnt))


def avg_pool_backward(G, spans, dconst: int, plane, fmt):
    """grad_input (P, *plane) of an average pooling with grad_output planes G (P, *out) float64, per axis of the
    ``plane`` ((L,), (H, W) or (D, H, W)) the windows ``spans = [[(lo, hi, count) per output index], ...]`` (the
    forward's, :func:`refkern.kernels.pool.avg_spans`; a 1-d pooling's may lead with its axis of height 1),
    divisor ``dconst`` (nonzero: divisor_override) or the product of the counts; returns (grad_input float64
    values of fmt, sum|t|, number of terms), each (P, *plane)."""
    spans = spans[len(spans) - len(plane) :]
    G = G.reshape(G.shape[0], *(len(sp) for sp in spans))

    def terms(p, k):
        pos = np.unravel_index(int(k), plane)
        hit = [[o for o, (lo, hi, _) in enumerate(sp) if lo <= x < hi] for sp, x in zip(spans, pos)]
        return [(G[(p, *o)], dconst or math.prod(spans[a][o[a]][2] for a in range(len(o))))
                for o in itertools.product(*hit)]  # fmt: skip

    return _pool_backward(G, plane, fmt, spans, dconst, None, terms)


def max_pool_backward(G, idx, plane, fmt):
    """grad_input (P, *plane) of a max pooling: grad_output planes G (P, *out) float64 scattered to the forward's
    flat indices ``idx`` (P, *out) in each plane ((L,) or (H, W)), every element's terms summed exactly and
    rounded once; returns (grad_input, sum|g|, number of terms), each (P, *plane)."""
    planes = {}

    def terms(p, k):  # the plane's terms grouped by the element they reach, built once per plane
        if p not in planes:
            by = {}
            for g, at in zip(G[p].ravel().tolist(), np.asarray(idx[p]).ravel().tolist()):
                by.setdefault(at, []).append((g, 1))
            planes[p] = by
        return planes[p].get(int(k), [])

    return _pool_backward(G, plane, fmt, [], 0, idx, terms)
