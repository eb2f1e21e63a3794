"""The quick path of :mod:`refkern.analysis.inside`: the element and group tests of the standard model on a
result it explains, in one pass over the values as they are held (float32 or float64, widened per element),
keeping no residual array; :func:`~refkern.analysis.inside._test` says what fails where this declines."""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.analysis.noise_rows import frozen, held_dtype
from refkern.analysis.passes import chunks, ulps_at
from refkern.analysis.statfit import StatFit
from refkern.analysis.verdict import z_one

__all__ = ["_healthy"]


def _healthy(model, a, c, var, lam_el, lam_grp, only, scale, out, parts=None):
    """:func:`~refkern.analysis.inside._test` of the standard model on a result it explains, in one pass that
    keeps no residual array (:func:`_healthy_pass`): a :class:`~refkern.analysis.statfit.StatFit` with no failure,
    and the largest ``lam sigma`` in ulps of the result (:func:`~refkern.analysis.inside._power`'s, which that
    pass computes on the way); None where an element or a group fails, and the caller runs ``_test`` to say
    which. ``a`` and ``c`` as they are held (float32 or
    float64, widened per element). Where the one group axis is the last (rows of its length, at least one
    per chunk), the pass goes row by row (:func:`_healthy_rows`); with ``parts`` (a norm's
    :attr:`~refkern.analysis.noise_rows.RowShared.fused` parts, ``scale`` 1) it also forms the rows' scale
    sums on the way, held as ``held_rows`` (what :meth:`~refkern.analysis.noise_rows.RowShared.held_stats`
    gives); ``parts`` may end with the columns' widening ``(d1, d2)`` (:attr:`~refkern.analysis.noise_rows.
    RowShared.widen`)."""
    shape = np.shape(c)
    # the kernels' read-only inputs in one form each (noise_rows.frozen: C-contiguous, read-only), a and c (and
    # the rows' X) in one format, float32 or float64 (held_dtype: each is widened as read, so widening is exact)
    # parts: (X, mean, r, W, finish), and the columns' widening (d1, d2) where the fused sums have one
    X, mean, r, W, finish, d1, d2 = (*parts, None, None)[:7] if parts is not None else (None,) * 7
    d1, d2 = (np.zeros(0), np.zeros(0)) if d1 is None else (d1, d2)
    h = held_dtype(a, c, *(() if X is None else (X,)))
    af, cf = (frozen(v, h).reshape(-1) for v in (a, c))
    sc = frozen(np.broadcast_to(np.asarray(scale, np.float64), shape) if np.ndim(scale) else
                np.asarray([scale], np.float64)).reshape(-1)  # fmt: skip
    n = cf.size
    strides = [int(np.prod(shape[ax + 1 :], dtype=np.int64)) for ax in only]
    lens = [shape[ax] for ax in only]
    nch = chunks(n)
    gs = np.zeros((nch, len(only), max(lens, default=1)))
    gv, ws, wv = np.zeros_like(gs), np.zeros_like(gs), np.zeros_like(gs)
    z, peak = np.empty(n), np.zeros(nch)
    vf = frozen(var, np.float64).reshape(-1)
    held_rows = None
    if len(only) == 1 and strides[0] == 1 and lens[0] and n // lens[0] >= nch:
        R = n // lens[0]
        if parts is None or sc.size != 1 or sc[0] != 1.0:  # no row sums: placeholders of the same types
            if d1.size:
                return None  # the columns' widening needs the rows' loadings: _test forms them
            X, mean, r, W, finish = np.zeros((1, 1), h), np.zeros(1), np.zeros(1), np.zeros((1, 1)), None
            d1 = d2 = np.zeros(0)
        X, mean, r, W = frozen(X, h), frozen(mean, np.float64), frozen(r, np.float64), frozen(W, np.float64)
        rows = np.empty((R if finish is not None else 0, 7))
        nfail = _healthy_rows(af, cf, vf, sc, lam_el, out.prec, out.emin, lens[0], finish is not None, X, mean, r, W,
                              frozen(d1, np.float64), frozen(d2, np.float64), z, gs[:, 0], gv[:, 0], ws[:, 0],
                              wv[:, 0], peak, rows)  # fmt: skip
        held_rows = finish(rows) if finish is not None else None
    else:
        if d1.size:
            return None  # the columns' widening needs the rows' loadings: _test forms them
        nfail = _healthy_pass(af, cf, vf, sc, lam_el, out.prec, out.emin, np.asarray(strides, np.int64),
                              np.asarray(lens, np.int64), z, gs, gv, ws, wv, peak)  # fmt: skip
    if nfail:
        return None
    fails = np.zeros(n, np.bool_)  # none (pages of zeros, never written)
    g, v, gw, vw = gs.sum(axis=0), gv.sum(axis=0), ws.sum(axis=0), wv.sum(axis=0)
    with np.errstate(all="ignore"):
        if np.any((g != 0) & ~(np.abs(g) <= lam_grp * np.sqrt(v))):
            return None
        if np.any((gw != 0) & ~(np.abs(gw) <= lam_grp * np.sqrt(vw))):  # the groups' scale tests
            return None

    f = StatFit(model, c, var, z.reshape(shape), fails.reshape(shape), [], lam_el)
    f.peak = float(peak.max(initial=0.0))
    f.held_rows = held_rows
    return f


@jit(parallel=True, error_model="numpy")
def _healthy_rows(a, c, var, sc, lam, prec, emin, n, stats, X, mean, r, W, d1, d2, z, gs, gv, ws, wv, peak, rows):
    """:func:`_healthy_pass` where the one group axis is the last (its length ``n``), row by row: per chunk of
    rows the same per-element figures, the group sums indexed by the column (no counters); with ``stats`` also
    each row's seven scale sums of :func:`~refkern.analysis.noise_rows._norm_row_sums` (``held``: the same
    float64 operations in the same order, per row), from the rows' X, mean, r and W (read at row ``i %
    W.shape[0]``, column ``j`` or 0); ``d1``, ``d2`` (non-empty, with ``stats``): the columns' sums take each
    element's variance widened by ``d1_i l1**2 + d2_i l2**2`` (:attr:`~refkern.analysis.noise_rows.RowShared.
    widen`: the whole family's shared variances, where the element test's are the rest's)."""
    R = a.size // n
    nch = gs.shape[0]
    one = sc.size == 1
    sw = int(W.shape[1] > 1)
    wide = d1.size > 0
    nfail = 0
    for ch in prange(nch):
        best = 0.0
        bad_here = 0
        g_s, g_v, w_s, w_v = gs[ch], gv[ch], ws[ch], wv[ch]
        for i in range(ch * R // nch, (ch + 1) * R // nch):
            base = i * n
            acc = np.zeros(7)
            wr = W[i % W.shape[0]]
            for j in range(n):
                e = base + j
                s = sc[0] if one else sc[e]
                x, y0, v = np.float64(a[e]), np.float64(c[e]), var[e]
                x, y = x * s, y0 * s
                sv = np.sqrt(v)
                zi = z_one(x, y, sv)
                z[e] = zi
                bad = zi > lam
                bad_here += bad
                fin = x - x == 0.0 and y - y == 0.0
                pos = v > 0.0 and v < np.inf
                w = y / v if pos else 0.0  # the scale tests' weight (_axis_scale_failures)
                l1, l2, vg = 0.0, 0.0, v
                if stats:
                    l1 = r[i] * wr[j * sw]
                    l2 = (np.float64(X[i, j]) - mean[i]) * l1
                    if wide:
                        vg = v + d1[i] * l1 * l1 + d2[i] * l2 * l2
                if not bad and fin:
                    g_s[j] += x - y
                    g_v[j] += vg
                    w_s[j] += (x - y) * w
                    w_v[j] += vg * w * w
                if stats and fin and pos:  # _norm_row_sums(held=True) of this element
                    res = x - y
                    w2 = w
                    acc[0] += res * w2
                    acc[1] += v * w2 * w2
                    acc[2] += y * w2
                    acc[3] += l1 * w2
                    acc[4] += (l1 * w2) ** 2
                    acc[5] += l2 * w2
                    acc[6] += (l2 * w2) ** 2
                if y0 - y0 == 0.0:
                    best = max(best, ulps_at(y0, y0, lam * sv / s, True, prec, emin)[0])
            if stats:
                rows[i] = acc
        peak[ch] = best
        nfail += bad_here
    return nfail


@jit(parallel=True, error_model="numpy")
def _healthy_pass(a, c, var, sc, lam, prec, emin, strides, lens, z, gs, gv, ws, wv, peak):
    """Per element, as :func:`~refkern.analysis.verdict._element_test` with ``a`` and ``c`` scaled by ``sc``
    (one value, or one per element: powers of two, exact): ``z`` and the count of ``z > lam``; the kept
    elements' residuals and variances summed per index along each group axis (its stride and length; the index kept as a
    counter, no division per element), and those of the groups' scale tests (``r w`` and ``sigma**2 w**2``, ``w
    = y / sigma**2``), per chunk; and per chunk the largest ``lam sqrt(var) / sc`` in ulps
    of the result format (prec, emin) at the finite ``c`` (:func:`_power_max`). Returns the number of
    failing elements."""
    n = a.size
    nch = gs.shape[0]
    nax = strides.size
    one = sc.size == 1
    nfail = 0
    for ch in prange(nch):
        best = 0.0
        bad_here = 0
        start = ch * n // nch
        gi, sub = np.empty(nax, np.int64), np.empty(nax, np.int64)
        for t in range(nax):
            gi[t] = (start // strides[t]) % lens[t]
            sub[t] = start % strides[t]
        for i in range(start, (ch + 1) * n // nch):
            s = sc[0] if one else sc[i]
            x, y0, v = np.float64(a[i]), np.float64(c[i]), var[i]
            x, y = x * s, y0 * s
            sv = np.sqrt(v)
            zi = z_one(x, y, sv)
            z[i] = zi
            bad = zi > lam
            bad_here += bad
            if not bad and x - x == 0.0 and y - y == 0.0:
                w = y / v if v > 0.0 and v < np.inf else 0.0  # the scale tests' weight (_axis_scale_failures)
                for t in range(nax):
                    gs[ch, t, gi[t]] += x - y
                    gv[ch, t, gi[t]] += v
                    ws[ch, t, gi[t]] += (x - y) * w
                    wv[ch, t, gi[t]] += v * w * w
            for t in range(nax):
                sub[t] += 1
                if sub[t] == strides[t]:
                    sub[t] = 0
                    gi[t] = gi[t] + 1 if gi[t] + 1 < lens[t] else 0
            if y0 - y0 == 0.0:
                best = max(best, ulps_at(y0, y0, lam * sv / s, True, prec, emin)[0])
        peak[ch] = best
        nfail += bad_here
    return nfail
