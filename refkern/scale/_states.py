"""Exact partial states that merge exactly: the numerics behind refkern's Dask arrays.

A chunk's contribution to a sum (of terms, of products, of squares) is its superaccumulator
(:mod:`refkern.accumulate.superacc`): integers ``c_j`` of weight ``2**(LOW + 32 j)``. A state
keeps, per output row, only the window of chunks any row of the block uses (``lo``, ``c``: an
int64 array (rows, width)), the counts of NaN/+inf/-inf terms (``sp``) and whether every term
was -0 (``nz``, vacuously true for no term). Two states add as integers, in any order and any
grouping, so the merged state is the same for every chunking; it is rounded once, at the end,
by the same :func:`~refkern.accumulate.superacc.acc_round` that refkern's own kernels use. A
correctly rounded result is unique, so the bits equal the in-memory result's.

Nothing here imports dask: these functions take and return numpy arrays and :class:`State`.
"""

import os
from dataclasses import dataclass
from fractions import Fraction

import numba
import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.dd import EPS, dd_div
from refkern.accumulate.exact import BLOCK, _dot_range, _sum_range
from refkern.accumulate.superacc import (
    JMAX,
    JMIN,
    NCHUNKS,
    NNAN,
    NNINF,
    NPINF,
    SIZE,
    acc_init,
    acc_normalize,
    acc_round,
)
from refkern.accumulate.ziv import acc_dd, acc_fraction, decide, round_fraction, round_quotient_sqrt
from refkern.kernels.reduction import cumsum_row

__all__ = ["THREADS_VAR", "limit_threads", "State", "row_states", "merge", "merge_all", "round_states",
           "mean_states", "var_states", "cumsum_from", "gemm_tile"]  # fmt: skip

THREADS_VAR = "REFKERN_NUMBA_THREADS"  # numba threads per Dask worker (refkern.scale.cluster)
_ROWS = 1024  # rows per batch of full accumulators (1024 x 1184 bytes)
_PARALLEL_WORK = 1 << 16  # terms
_NEG_ZERO_BITS = np.int64(-0x8000000000000000)


def limit_threads():
    """In a worker refkern started, numba's threads for this thread as the cluster asked."""
    n = os.environ.get(THREADS_VAR)
    if n:
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


@dataclass
class State:
    """The exact sums of a block's rows: value ``sum_j c[r, j] 2**(LOW + 32 (lo + j))``."""

    lo: int  # chunk index of column 0 of c
    c: np.ndarray  # int64 (rows, width)
    sp: np.ndarray  # int64 (rows, 3): NaN, +inf, -inf terms
    nz: np.ndarray  # bool (rows,): every term is -0 (true for none)
    shape: tuple  # the block's result shape (keepdims)

    @property
    def rows(self) -> int:
        return self.c.shape[0]

    def nbytes(self) -> int:
        return self.c.nbytes + self.sp.nbytes + self.nz.nbytes


@jit(inline="always")
def _is_neg_zero(x):
    return bits(np.float64(x)) == _NEG_ZERO_BITS


@jit(inline="always")
def _acc_row(X, Y, kind, accs, nz, r):
    """accs[r] = the exact sum of row r of X (kind 0), of X[r] * Y[r] (kind 1), normalised;
    nz[r] = every term is -0. X, Y: (rows, n), float32 or float64, one dtype."""
    n = X.shape[1]
    acc_init(accs[r])
    scratch = np.empty(BLOCK)
    x = X[r]
    all_nz = True
    if kind == 0:
        _sum_range(x, 0, n, accs[r], scratch)
        for i in range(n):
            if not _is_neg_zero(x[i]):
                all_nz = False
                break
    else:
        y = Y[r]
        _dot_range(x, y, 0, n, accs[r], scratch)
        for i in range(n):
            a = np.float64(x[i])
            b = np.float64(y[i])
            if not ((a == 0.0 or b == 0.0) and (bits(a) < 0) != (bits(b) < 0)):
                all_nz = False
                break
    acc_normalize(accs[r])
    nz[r] = all_nz


@jit(parallel=True)
def _accs_parallel(X, Y, kind, accs, nz):
    for r in prange(X.shape[0]):
        _acc_row(X, Y, kind, accs, nz, r)


@jit
def _accs_serial(X, Y, kind, accs, nz):
    for r in range(X.shape[0]):
        _acc_row(X, Y, kind, accs, nz, r)


def _parallel(rows: int, work: int) -> bool:
    """Threads for a block only when it is large: a parallel launch costs milliseconds on a busy machine."""
    return rows >= 2 and work >= _PARALLEL_WORK


def _window(accs: np.ndarray):
    """(lo, chunks) of the columns any row uses (chunks outside [JMIN, JMAX] are zero)."""
    used = accs[:, JMAX] >= 0
    if not used.any():
        return 0, np.zeros((accs.shape[0], 0), np.int64)
    lo = int(accs[used, JMIN].min())
    hi = int(accs[used, JMAX].max())
    return lo, accs[:, lo : hi + 1].copy()


def _widen(lo, c, new_lo, new_hi):
    out = np.zeros((c.shape[0], new_hi - new_lo), np.int64)
    if c.shape[1]:
        out[:, lo - new_lo : lo - new_lo + c.shape[1]] = c
    return out


def _carry(c: np.ndarray, lo: int):
    """Carries propagated so that every column but the top one lies in [0, 2**32); a column is
    added above when the top one nears int64's range (the value never changes)."""
    if c.shape[1] == 0:
        return lo, c
    for j in range(c.shape[1] - 1):
        k = c[:, j] >> 32  # floor division by 2**32
        c[:, j] -= k << 32
        c[:, j + 1] += k
    if np.abs(c[:, -1]).max() >= 1 << 56 and lo + c.shape[1] < NCHUNKS:
        k = c[:, -1] >> 32
        c[:, -1] -= k << 32
        c = np.concatenate([c, k[:, None]], axis=1)
    return lo, c


def row_states(X: np.ndarray, shape: tuple, Y: np.ndarray | None = None) -> State:
    """The exact state of each row of X (kind sum), or of the row products X * Y (kind dot)."""
    limit_threads()
    R = X.shape[0]
    kind = 0 if Y is None else 1
    Y = X if Y is None else Y
    parts = []
    sp = np.zeros((R, 3), np.int64)
    nz = np.zeros(R, np.bool_)
    for s in range(0, max(R, 1), _ROWS):
        e = min(R, s + _ROWS)
        if e <= s:
            break
        accs = np.empty((e - s, SIZE), np.int64)
        kernel = _accs_parallel if _parallel(e - s, (e - s) * X.shape[1]) else _accs_serial
        kernel(X[s:e], Y[s:e], kind, accs, nz[s:e])
        parts.append(_window(accs))
        sp[s:e] = accs[:, NNAN : NNINF + 1]
    if not parts:
        return State(0, np.zeros((R, 0), np.int64), sp, nz, shape)
    if len(parts) == 1:
        lo, c = parts[0]
        return State(lo, c, sp, nz, shape)
    used = [(lo, c) for lo, c in parts if c.shape[1]]
    new_lo = min((lo for lo, _ in used), default=0)
    new_hi = max((lo + c.shape[1] for lo, c in used), default=0)
    c = np.concatenate([_widen(lo, c, new_lo, new_hi) for lo, c in parts])  # (an empty window widens to zeros)
    return State(new_lo, c, sp, nz, shape)


def merge(a: State, b: State) -> State:
    """a + b, exactly (integers added column by column)."""
    if a.c.shape[1] == 0:
        lo, c = b.lo, b.c.copy()
    elif b.c.shape[1] == 0:
        lo, c = a.lo, a.c.copy()
    else:
        lo = min(a.lo, b.lo)
        hi = max(a.lo + a.c.shape[1], b.lo + b.c.shape[1])
        c = _widen(a.lo, a.c, lo, hi)
        c[:, b.lo - lo : b.lo - lo + b.c.shape[1]] += b.c
    lo, c = _carry(c, lo)
    return State(lo, c, a.sp + b.sp, a.nz & b.nz, a.shape)


def merge_all(states) -> State:
    """The exact sum of a non-empty list of states."""
    it = iter(states)
    out = next(it)
    for s in it:
        out = merge(out, s)
    return out


@jit(inline="always")
def _load(acc, lo, c, sp, r):
    """acc = row r of a state (a full superaccumulator)."""
    acc_init(acc)
    w = c.shape[1]
    for k in range(w):
        acc[lo + k] = c[r, k]
    if w > 0:
        acc[JMIN] = lo
        acc[JMAX] = lo + w - 1
    acc[NNAN] = sp[r, 0]
    acc[NPINF] = sp[r, 1]
    acc[NNINF] = sp[r, 2]


@jit(inline="always")
def _round_rows_row(lo, c, sp, nz, count, prec, emin, emax, out, r):
    """out[r] = the exact sum rounded once; -0 only when every one of count > 0 terms is -0."""
    acc = np.empty(SIZE, np.int64)
    _load(acc, lo, c, sp, r)
    special = sp[r, 0] + sp[r, 1] + sp[r, 2] > 0
    v = acc_round(acc, prec, emin, emax)
    if v == 0.0 and not special and nz[r] and count > 0:
        v = -0.0
    out[r] = v


@jit(parallel=True)
def _round_rows_parallel(lo, c, sp, nz, count, prec, emin, emax, out):
    for r in prange(c.shape[0]):
        _round_rows_row(lo, c, sp, nz, count, prec, emin, emax, out, r)


@jit
def _round_rows_serial(lo, c, sp, nz, count, prec, emin, emax, out):
    for r in range(c.shape[0]):
        _round_rows_row(lo, c, sp, nz, count, prec, emin, emax, out, r)


@jit(inline="always")
def _mean_rows_row(lo, c, sp, nz, n, prec, emin, emax, out, undecided, r):
    """out[r] = RN(S / n), as refkern.mean's kernel decides it; undecided rows for the exact path."""
    acc = np.empty(SIZE, np.int64)
    tmp = np.empty(SIZE, np.int64)
    _load(acc, lo, c, sp, r)
    undecided[r] = False
    if sp[r, 0] + sp[r, 1] + sp[r, 2] > 0:
        out[r] = acc_round(acc, prec, emin, emax) / n  # NaN or +-inf, as IEEE division gives
        return
    s_h, s_l = acc_dd(acc, tmp)
    if s_h == 0.0:
        out[r] = -0.0 if nz[r] else 0.0
        return
    q_h, q_l = dd_div(s_h, s_l, np.float64(n), 0.0)
    v = decide(q_h, q_l, abs(q_h) * 2.0 * EPS, prec, emin, emax)
    out[r] = v
    undecided[r] = v != v


@jit(parallel=True)
def _mean_rows_parallel(lo, c, sp, nz, n, prec, emin, emax, out, undecided):
    for r in prange(c.shape[0]):
        _mean_rows_row(lo, c, sp, nz, n, prec, emin, emax, out, undecided, r)


@jit
def _mean_rows_serial(lo, c, sp, nz, n, prec, emin, emax, out, undecided):
    for r in range(c.shape[0]):
        _mean_rows_row(lo, c, sp, nz, n, prec, emin, emax, out, undecided, r)


def _fraction(s: State, r: int) -> Fraction:
    acc = np.empty(SIZE, np.int64)
    acc_init(acc)
    w = s.c.shape[1]
    acc[s.lo : s.lo + w] = s.c[r]
    if w:
        acc[JMIN], acc[JMAX] = s.lo, s.lo + w - 1
    return acc_fraction(acc)


def round_states(s: State, count: int, fmt) -> np.ndarray:
    """float64 values of ``fmt``: each row's exact sum rounded once (refkern.sum's rules)."""
    limit_threads()
    out = np.empty(s.rows)
    kernel = _round_rows_parallel if _parallel(s.rows, s.rows * 64) else _round_rows_serial
    kernel(s.lo, np.ascontiguousarray(s.c), s.sp, s.nz, count, *fmt.params, out)
    return out.reshape(s.shape)


def mean_states(s: State, n: int, fmt) -> np.ndarray:
    """float64 values of ``fmt``: each row's exact sum divided by n, rounded once (NaN for n = 0)."""
    limit_threads()
    out = np.empty(s.rows)
    if n == 0:
        out[:] = np.nan
        return out.reshape(s.shape)
    und = np.zeros(s.rows, np.bool_)
    kernel = _mean_rows_parallel if _parallel(s.rows, s.rows * 64) else _mean_rows_serial
    kernel(s.lo, np.ascontiguousarray(s.c), s.sp, s.nz, n, *fmt.params, out, und)
    for r in np.flatnonzero(und):
        out[r] = round_fraction(_fraction(s, r) / n, fmt)
    return out.reshape(s.shape)


def var_states(s: State, q: State, n: int, corr: Fraction, fmt, want_std: bool) -> np.ndarray:
    """var (or std) from the exact sums S of x and Q of x**2: M2 = Q - S**2 / n exactly, divided
    by n - correction, (square-rooted) and rounded once, with refkern.var's rules for NaN/inf
    terms, n = 0 and a divisor <= 0."""
    out = np.empty(s.rows)
    d = n - corr
    for r in range(s.rows):
        if n == 0 or s.sp[r].sum() + q.sp[r].sum() > 0:
            out[r] = np.nan
            continue
        S = _fraction(s, r)
        m2 = _fraction(q, r) - S * S / n
        if d <= 0:
            out[r] = np.inf if m2 > 0 else np.nan
            continue
        val = m2 / d
        if not want_std or val == 0:
            out[r] = round_fraction(val, fmt)
        else:
            out[r] = round_quotient_sqrt(Fraction(0), val, val, fmt)  # sqrt(v) = v / sqrt(v)
    return out.reshape(s.shape)


@jit(inline="always")
def _cumsum_row(X, lo, c, sp, nz, prec, emin, emax, out, r):
    """out[r, i] = (prefix of row r + sum_{j <= i} X[r, j]) exactly, rounded once per element:
    refkern.cumsum's own row scan, started from the exact prefix state. The running pair starts at
    the prefix's double-word, which errs by at most 2**-106 of it plus 2**-1075: the bound starts there."""
    acc = np.empty(SIZE, np.int64)
    tmp = np.empty(SIZE, np.int64)
    _load(acc, lo, c, sp, r)
    s, t = acc_dd(acc, tmp)
    bound = 2.0**-105 * abs(s) + 2.0**-1074
    cumsum_row(X[r], acc, tmp, np.empty(BLOCK), s, t, bound, nz[r], prec, emin, emax, out[r])


@jit(parallel=True)
def _cumsum_parallel(X, lo, c, sp, nz, prec, emin, emax, out):
    for r in prange(X.shape[0]):
        _cumsum_row(X, lo, c, sp, nz, prec, emin, emax, out, r)


@jit
def _cumsum_serial(X, lo, c, sp, nz, prec, emin, emax, out):
    for r in range(X.shape[0]):
        _cumsum_row(X, lo, c, sp, nz, prec, emin, emax, out, r)


def cumsum_from(X: np.ndarray, prefix: State, fmt) -> np.ndarray:
    """Row-wise cumulative sums of X (rows, n; float64) after the exact prefix, rounded once each."""
    limit_threads()
    out = np.empty(X.shape, np.float64)
    if X.size:
        kernel = _cumsum_parallel if _parallel(X.shape[0], X.size) else _cumsum_serial
        kernel(X, prefix.lo, np.ascontiguousarray(prefix.c), prefix.sp, prefix.nz, *fmt.params, out)
    return out


@jit(inline="always")
def _gemm_acc_row(A, Bt, start, accs, nz, first, t):
    """accs[t] += sum_k A[b, i, k] Bt[b, j, k] for the element start + t of (B, M, N), exactly;
    nz[t] &= every product is -0. A, Bt contiguous, one dtype (float32 or float64)."""
    M = A.shape[1]
    N = Bt.shape[1]
    K = A.shape[2]
    e = start + t
    b = e // (M * N)
    i = (e // N) % M
    j = e % N
    if first:
        acc_init(accs[t])
        nz[t] = True
    x = A[b, i]
    y = Bt[b, j]
    _dot_range(x, y, 0, K, accs[t], np.empty(BLOCK))
    if nz[t]:
        for k in range(K):
            p = np.float64(x[k])
            q = np.float64(y[k])
            if not ((p == 0.0 or q == 0.0) and (bits(p) < 0) != (bits(q) < 0)):
                nz[t] = False
                break


@jit(parallel=True)
def _gemm_acc_parallel(A, Bt, start, accs, nz, first):
    for r in prange(accs.shape[0]):
        _gemm_acc_row(A, Bt, start, accs, nz, first, r)


@jit
def _gemm_acc_serial(A, Bt, start, accs, nz, first):
    for r in range(accs.shape[0]):
        _gemm_acc_row(A, Bt, start, accs, nz, first, r)


@jit(inline="always")
def _round_accs_row(accs, nz, count, prec, emin, emax, out, t):
    special = accs[t, NNAN] + accs[t, NPINF] + accs[t, NNINF] > 0
    v = acc_round(accs[t], prec, emin, emax)
    if v == 0.0 and not special and nz[t] and count > 0:
        v = -0.0
    out[t] = v


@jit(parallel=True)
def _round_accs_parallel(accs, nz, count, prec, emin, emax, out):
    for r in prange(accs.shape[0]):
        _round_accs_row(accs, nz, count, prec, emin, emax, out, r)


@jit
def _round_accs_serial(accs, nz, count, prec, emin, emax, out):
    for r in range(accs.shape[0]):
        _round_accs_row(accs, nz, count, prec, emin, emax, out, r)


def gemm_tile(pairs, count: int, fmt, tile: int = 2048) -> np.ndarray:
    """The exact products of a list of (A (B, M, Kb), Bt (B, N, Kb)) pairs along K, summed over
    the list and rounded once: a (B, M, N) float64 array of ``fmt`` values."""
    limit_threads()
    B, M, _ = pairs[0][0].shape
    N = pairs[0][1].shape[1]
    total = B * M * N
    out = np.empty(total)
    for start in range(0, total, tile):
        T = min(tile, total - start)
        accs = np.empty((T, SIZE), np.int64)
        nz = np.ones(T, np.bool_)
        if not pairs:
            for t in range(T):
                acc_init(accs[t])
        for idx, (A, Bt) in enumerate(pairs):
            kernel = _gemm_acc_parallel if _parallel(T, T * A.shape[2]) else _gemm_acc_serial
            kernel(A, Bt, start, accs, nz, idx == 0)
        kernel = _round_accs_parallel if _parallel(T, T * 64) else _round_accs_serial
        kernel(accs, nz, count, *fmt.params, out[start : start + T])
    return out.reshape(B, M, N)
