"""Errors that the elements of a row share, for the scale tests of :mod:`refkern.analysis.inside`.

A norm's row shares its mean and ``r``, a softmax's its sum ``D``, an attention query its weights: the
elements' errors are then not independent, and a test of a sum over a row (its scale test,
:func:`~refkern.analysis.verdict._row_scale_failures`) must add what they share. :class:`RowShared`
holds it, as :mod:`refkern.analysis.noise` computes it per op.
"""

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["RowShared", "frozen", "held_dtype", "keys", "norm_sums", "welford_drift", "welford_means"]


def frozen(a, dtype=None) -> np.ndarray:
    """``a`` as a kernel's input that it never writes, in one form: C-contiguous (a copy only where it is not),
    of ``dtype`` (else its own), and a read-only view (no copy). Numba compiles a kernel once per tuple of
    argument types, and an array's type holds its layout and its writeable flag: inputs that differ in those
    alone (a broadcast view, a transposed row block, a fresh copy) would each compile the whole kernel again."""
    v = np.ascontiguousarray(a, dtype).view()
    v.flags.writeable = False
    return v


def held_dtype(*arrays) -> np.dtype:
    """The one float format a kernel that widens every element to float64 as it reads it is given ``arrays``
    in: float32 where all are float32 (no copy), else float64 (widening float16 or float32 to float64 is exact, so
    the kernel reads the same values): one compiled signature per format, not one per mix of formats."""
    return np.dtype(np.float32) if all(np.asarray(a).dtype == np.float32 for a in arrays) else np.dtype(np.float64)


class RowShared:
    """``coherent`` of :class:`Noise` where the errors several elements share are a row's: ``Var(sum_i e_i
    w_i)`` beyond ``sum_i sigma_i**2 w_i**2``, per row (:meth:`per_row`) and in all (a call). ``rows(v)``: an
    output-shaped array in row layout (``count`` rows, R, of n); ``back(v)``: the inverse. Two forms:

    * ``terms``: ``[(shared, loading)]``, a row's error ``eps_r`` of variance ``shared[r]`` moves its element
      ``i`` by ``loading_ri eps_r`` (row layout, the units of the test; ``loading`` an array or a thunk), so
      ``sum e w`` has ``shared[r] ((sum_i l_i w_i)**2 - sum_i (l_i w_i)**2)`` beyond ``sum sigma**2 w**2``,
      whose ``sigma**2`` hold that error once per element;
    * ``bounds``: ``[(B, loading)]``, a row's error bounded, not averaged, ``|eps_r| <= B[r]`` (a sequential
      Welford mean's drift): it moves ``sum e w`` by at most ``B |sum_i l_i w_i|``, which the scale tests add
      to their threshold (:meth:`bound`) instead of to the variance;
    * ``sigma`` (row layout): the row's elements may be correlated in any way, ``Var(sum_i e_i w_i) <=
      (sum_i sigma_i |w_i|)**2`` within a row (Cauchy-Schwarz).

    ``keys`` (a thunk: int64 keys in row layout, or None): elements of a row with one key may have equal
    rounding errors (equal inputs give equal outputs and errors; a product by the row's ``r`` rounds
    equal significands alike, so Hugging Face's RMSNorm, which rounds ``x r`` to the result format,
    rounds each of a bfloat16 row's 128 significands with one relative error), so their variances are
    not independent: :meth:`grouped` takes them fully correlated within a key, ``(sum_(i in g) sigma_i
    |w_i|)**2`` (Cauchy-Schwarz), more variance, asked for only where a test fails without it.

    Rows are independent. Each row is a scale test of its own (:func:`~refkern.analysis.verdict.
    _row_scale_failures`): a row shares its errors, so its residuals may follow its output only by those."""

    def __init__(self, rows, back, count, terms=(), sigma=None, bounds=(), keys=None, fused=None, members=None,
                 widen=None):  # fmt: skip
        self.rows, self.back, self.count, self.terms, self.sigma = rows, back, int(count), list(terms), sigma
        self.bounds, self.keys = list(bounds), keys
        #: where the rows are the output's last axis, a callable ``(r, vk, y) -> (rows, cols)`` giving in one
        #: pass what :meth:`stats` gives and the last axis's scale sums (:func:`norm_sums`), or None
        self.fused = fused
        #: a float32 norm's emulated statistics (:class:`~refkern.analysis.noise_norm_chains.NormMembers`): a
        #: row or the tensor whose scale test fails on the rest passes on one of them; None: none
        self.members = members
        #: ``(d1, d2)`` per row where the elements' variance holds the rest's shared variances: what the column
        #: tests add back per element, ``d1 l1**2 + d2 l2**2`` (the whole family's); None: nothing
        self.widen = widen

    def member_rows(self, stats, w, lam):
        """``(per row, tensor)`` of :meth:`~refkern.analysis.noise_norm_chains.NormMembers.rows_pass` on the
        per-row sums ``stats`` (:meth:`stats`: their raw sums where the fused pass kept them, else formed from
        the weights ``w``, output-shaped); None without members."""
        if self.members is None:
            return None
        num, vv, _, extra, bd = (np.asarray(v, np.float64) for v in stats[:5])
        raw = stats[6] if len(stats) > 6 and stats[6] is not None else None
        A1, A2 = (raw[:, 3], raw[:, 5]) if raw is not None else self.members.sums(self.rows(w))[::2]
        return self.members.rows_pass(num, vv, np.broadcast_to(extra, num.shape), np.broadcast_to(bd, num.shape), A1,
                                      A2, lam)  # fmt: skip

    def held_stats(self, a, c, var):
        """:meth:`stats` of a result whose every element passed (inside._healthy), from the values as they
        are held, without residual arrays: where :attr:`fused` can (else None)."""
        if self.fused is None:
            return None
        rows, _ = self.fused(a, c, var, held=True)
        return (*rows[:5], None, *rows[5:])

    def stats(self, r, vk, keep, y):
        """Per row ``(num, var, yw, extra, bound)`` of the scale tests with ``w = y / sigma**2`` on the kept
        elements: ``sum r w``, ``sum sigma**2 w**2``, ``sum y w``, :meth:`per_row`, :meth:`bound` (0 where
        none), and the last axis's ``(sum r w, sum sigma**2 w**2)`` per index where :attr:`fused` gives them
        (else None); where :attr:`fused` gives them, the raw (R, 7) sums last."""
        if self.fused is not None:
            rows, cols = self.fused(r, vk, y)
            return (*rows[:5], cols, *rows[5:])
        with np.errstate(all="ignore"):
            yk = np.where(keep, y, 0.0)
            w = np.where(keep & (vk > 0) & np.isfinite(vk), yk / vk, 0.0)
            rows = self.rows
            bd = self.bound(w)
            return (rows(r * w).sum(axis=1), rows(vk * w * w).sum(axis=1), rows(yk * w).sum(axis=1),
                    self.per_row(w), np.zeros(self.count) if bd is None else bd, None)  # fmt: skip

    def grouped(self, w, var, sel) -> np.ndarray | None:
        """For the rows ``sel`` (indices), the variance of ``sum e w`` that equal keys add beyond ``sum
        sigma**2 w**2`` (``var``: sigma**2, output-shaped), their errors taken fully correlated within a key;
        None without keys."""
        if self.keys is None or not len(sel):
            return None
        K = self.keys()[sel]
        with np.errstate(all="ignore"):
            a = (np.sqrt(self.rows(var)) * np.abs(self.rows(w)))[sel]
            a = np.where(np.isfinite(a), a, 0.0)
            order = np.argsort(K, axis=1, kind="stable")
            Ks, As = np.take_along_axis(K, order, 1), np.take_along_axis(a, order, 1)
            start = np.ones(Ks.shape, bool)
            start[:, 1:] = Ks[:, 1:] != Ks[:, :-1]
            g = np.cumsum(start.reshape(-1)) - 1  # a group id per (row, key)
            sums = np.bincount(g, weights=As.reshape(-1))
            row_of = np.repeat(np.arange(len(sel)), Ks.shape[1])[start.reshape(-1)]
            return np.bincount(row_of, weights=sums * sums, minlength=len(sel)) - (a * a).sum(axis=1)

    def bound(self, w) -> np.ndarray | None:
        """Per row, the most the bounded errors move ``sum e w`` (None: there are none)."""
        if not self.bounds:
            return None
        with np.errstate(all="ignore"):
            W = self.rows(w)
            return sum(np.asarray(B, np.float64) * np.abs((W * (ld() if callable(ld) else ld)).sum(axis=1))
                       for B, ld in self.bounds)  # fmt: skip

    def per_row(self, w) -> np.ndarray:
        with np.errstate(all="ignore"):
            W = self.rows(w)
            if self.sigma is not None:
                a = self.sigma * np.abs(W)
                return a.sum(axis=1) ** 2 - (a * a).sum(axis=1)
            extra = np.zeros(W.shape[0])
            for shared, loading in self.terms:
                a = W * (loading() if callable(loading) else loading)
                A = a.sum(axis=1)
                S = np.asarray(shared, np.float64)
                extra += np.where(S > 0, S * (A * A - (a * a).sum(axis=1)), 0.0)
            return extra

    def __call__(self, w) -> float:
        return float(np.sum(self.per_row(w)))


def keys(X, significand=False) -> np.ndarray:
    """:attr:`RowShared.keys` of rows X (float32 or float64): each value's bits (equal inputs), or with
    ``significand`` its significand's bits alone (a product by the row's constant rounds them alike)."""
    X = np.ascontiguousarray(X, X.dtype if X.dtype in (np.float32, np.float64) else np.float64)
    b = X.view(np.int32 if X.dtype == np.float32 else np.int64).astype(np.int64)
    if significand:
        b = b & ((1 << 23) - 1 if X.dtype == np.float32 else (1 << 52) - 1)
    return b


def norm_sums(X, mean, r, Wr, smu2, srel2, bounds, widen=None):
    """:attr:`RowShared.fused` of a norm whose rows are its output's last axis (layer_norm, rms_norm,
    group_norm: the output reshaped to (R, n)): the mean's loading ``r w`` and r's ``t = (x - mean) r w``
    formed per element as the pass reads it (no array of either), ``bounds`` the bounded errors' ``B`` per
    row on r's loading and on the mean's (None where there is none); ``widen``: :attr:`RowShared.widen`,
    added to the column sums' variances."""
    R, n = X.shape
    Bt, Bm = bounds
    # the kernels' read-only inputs in one form each (frozen): X as held (float32 or float64), the rest float64
    X = frozen(X)
    mean, r, Wr = frozen(mean, np.float64), frozen(r, np.float64), frozen(Wr, np.float64)
    d1, d2 = (frozen(np.zeros(0)), frozen(np.zeros(0))) if widen is None else (frozen(widen[0], np.float64),
                                                                              frozen(widen[1], np.float64))

    def finish(rows):
        """(num, var, yw, extra, bound, rows) per row from the seven sums of :func:`_norm_row_sums` (R, 7)."""
        num, vv, yw, A1, Q1, A2, Q2 = rows.T
        with np.errstate(all="ignore"):
            extra = np.where(smu2 > 0, smu2 * (A1 * A1 - Q1), 0.0) + np.where(srel2 > 0, srel2 * (A2 * A2 - Q2), 0.0)
            bound = (0.0 if Bt is None else Bt * np.abs(A2)) + (0.0 if Bm is None else Bm * np.abs(A1))
        return num, vv, yw, extra, np.broadcast_to(bound, (R,)).astype(np.float64), rows

    def fused(rr, vk, y, held=False):
        rows = np.empty((R, 7))
        cols = np.zeros((2, n))
        # held: (actual, centre, variance) as they are held, every finite element kept; else (residual, variance
        # where kept, centre) arrays
        p, q, var = (rr, vk, y) if held else (rr, y, vk)
        if not held:
            p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
        h = held_dtype(p, q, X)  # p, q and X are widened as read: one format for the three (exact)
        p, q, Xh = frozen(p, h).reshape(R, n), frozen(q, h).reshape(R, n), frozen(X, h)
        _norm_row_sums(p, q, frozen(var, np.float64).reshape(R, n), held, Xh, mean, r, Wr, d1, d2, rows, cols)
        return finish(rows), cols

    #: what a pass over the held values needs to form the seven sums itself (inside._healthy): the rows' X,
    #: mean, r and W, and ``finish`` of its (R, 7) sums
    fused.parts = (X, mean, r, Wr, finish)
    #: the columns' widening (d1, d2) where the elements' variance holds the rest's shared variances, else None
    fused.widen = None if widen is None else (d1, d2)
    return fused


@jit(parallel=True, error_model="numpy")
def _norm_row_sums(p, q, var, held, X, mean, r, W, d1, d2, rows, cols):
    """Per row i of the (R, n) arrays, with ``y = q`` the centres, the residual ``p`` (or, ``held``, the
    actual ``p`` less ``q``, as held: float32 or float64 widened as read), ``var`` the variances (0 where an
    element is not kept), ``w = y / var`` over the elements with a finite positive variance and finite
    values, ``l1 = r_i W_ij``, ``l2 = (x_ij - mean_i) r_i W_ij``: rows[i] = (sum res w, sum var w**2, sum y w,
    sum l1 w, sum (l1 w)**2, sum l2 w, sum (l2 w)**2); then, unless ``held`` (the fast path asks for rows
    only), per column j, cols = (sum_i res w, sum_i var' w**2), ``var' = var + d1_i l1**2 + d2_i l2**2`` where
    ``d1``, ``d2`` are given (non-empty: the whole family's shared variances for the columns). W is read at
    row ``i % W.shape[0]``, column ``j`` or 0."""
    R, n = p.shape
    sw = int(W.shape[1] > 1)
    for i in prange(R):
        acc = np.zeros(7)
        wr = W[i % W.shape[0]]
        for j in range(n):
            v = var[i, j]
            x, y = np.float64(p[i, j]), np.float64(q[i, j])
            if not (v > 0.0 and v < np.inf and x - x == 0.0 and y - y == 0.0):
                continue
            res = x - y if held else x
            w = y / v
            l1 = r[i] * wr[j * sw]
            l2 = (np.float64(X[i, j]) - mean[i]) * l1
            acc[0] += res * w
            acc[1] += v * w * w
            acc[2] += y * w
            acc[3] += l1 * w
            acc[4] += (l1 * w) ** 2
            acc[5] += l2 * w
            acc[6] += (l2 * w) ** 2
        rows[i] = acc
    if held:
        return
    wide = d1.size > 0
    for j in prange(n):
        a0 = 0.0
        a1 = 0.0
        for i in range(R):
            v = var[i, j]
            if v > 0.0 and v < np.inf:
                w = q[i, j] / v
                a0 += p[i, j] * w
                if wide:
                    l1 = r[i] * W[i % W.shape[0], j * sw]
                    l2 = (np.float64(X[i, j]) - mean[i]) * l1
                    a1 += (v + d1[i] * l1 * l1 + d2[i] * l2 * l2) * w * w
                else:
                    a1 += v * w * w
        cols[0, j] = a0
        cols[1, j] = a1


def welford_drift(X, mean) -> np.ndarray:
    """Per row of X (R, n), float32 or float64 values: the largest ``|m - mean|`` over the sequential Welford
    means of the row in X's format (``m += (x - m) / k``, and ``m += (x - m) * fl(1 / k)`` as kernels that keep
    the reciprocal do; each left to right and right to left), ``mean`` the exact one (float64, within an ulp
    of it). On rows whose values repeat their roundings drift together (:mod:`refkern.analysis.noise`'s
    sequential-Welford member): this is the realized drift of those kernels, which that member takes."""
    return welford_means(X, mean)[0]


def welford_means(X, mean):
    """``(drift, means)``: :func:`welford_drift` per row, and the four sequential Welford means themselves (R, 4),
    float64 (``/ k`` left to right, right to left, ``fl(1 / k)`` left to right, right to left)."""
    X = np.ascontiguousarray(X, X.dtype if X.dtype in (np.float32, np.float64) else np.float64)
    K = np.arange(1, X.shape[1] + 1).astype(X.dtype)  # exact: n < 2**24
    out = np.empty(X.shape[0])
    means = np.empty((X.shape[0], 4))
    _welford_drift(X, K, np.ones(1, X.dtype) / K, np.asarray(mean, np.float64), out, means)
    return out, means


@jit(parallel=True, error_model="numpy")
def _welford_drift(X, K, Q, mean, out, means):
    """:func:`welford_drift`'s four running means per row in X's format (``K[j] = j + 1``, ``Q`` its
    reciprocals rounded), one pass each way (independent chains); the means themselves in ``means`` (R, 4)."""
    R, n = X.shape
    for i in prange(R):
        a = b = c = d = K[0] - K[0]
        for j in range(n):
            xl, xr = X[i, j], X[i, n - 1 - j]
            a = a + (xl - a) / K[j]
            b = b + (xr - b) / K[j]
            c = c + (xl - c) * Q[j]
            d = d + (xr - d) * Q[j]
        m = mean[i]
        means[i, 0], means[i, 1], means[i, 2], means[i, 3] = a, b, c, d
        lr = max(abs(np.float64(a) - m), abs(np.float64(c) - m))
        out[i] = max(lr, max(abs(np.float64(b) - m), abs(np.float64(d) - m)))
