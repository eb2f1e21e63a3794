"""The filtering engine: one float64 GEMM on the platform's BLAS, a rigorous error bound per
element, and the exact path for the few elements that bound cannot decide.

For float16, bfloat16 and float32 factors every product is exact in float64 (at most 48
significand bits, exponents within 2**-298 .. 2**256), so ``V = A @ Bt^T`` computed by a
float64 BLAS GEMM is a float64 sum of the K exact products, in whatever order and blocking the
library picked. Every such order errs by at most ``gamma_K * T`` (Higham, *Accuracy and
Stability*, 2nd ed., eq. (3.5) and section 3.1: ``gamma_n = n u / (1 - n u)``, ``u = 2**-53``,
T the sum of |terms|; it holds for any order, any blocking and with FMA, the bias being one more
term). Where the interval ``[s - e, s + e]`` (e an upper bound of that error, computed with
directed slack, :func:`decide_one`) rounds to a single value of the result format, that value is
the correctly rounded result (rounding is monotonic); the rest, and every element whose terms
hold an inf or a NaN, go to the exact path (:func:`~refkern.kernels._element.reduce_element`,
the Numba engine's own code), so the result is bit-identical to it.

**The bound on T.** Two, per element (:func:`decide_one`'s ``m``):

* the norm product ``||a_i||_2 ||b_j||_2 + |bias_j|`` (Cauchy-Schwarz), from one float64 pass
  over each operand: free next to the GEMM, loose by ``||a|| ||b|| / T`` (pi / 2 for Gaussian
  data, more when large entries of a meet small ones of b);
* ``(|A| |B|^T)_ij + |bias_j|``, a second float64 GEMM: tight, one more GEMM. It is computed for
  a block of rows only where it is predicted to decide more elements than its cost in elements
  of the exact path (rule in :meth:`_Gemm._refine`), and always when the caller asks for the
  magnitudes (``want_mag``: the verdict needs ``sum |terms|`` anyway).

**The assumption.** The BLAS computes each element as a float64 sum of the products in some
order, with each operation rounded to nearest: no Strassen-like algorithm, no reduced precision,
no flush-to-zero that would change a normal product (a flushed subnormal partial sum is covered:
see :func:`decide_one`). :func:`self_test` checks it on the BLAS in use, and ``refkern doctor``
runs it.

**Memory.** Matmul: the float64 result (needed anyway), one byte per element for the undecided
mask, and with the tight bound one float64 block of ``rows x N`` per block of rows. Convolution:
im2col in chunks of images (:mod:`refkern.engines.filter_conv`).

On a CUDA device the GEMM runs on cuBLAS in float64 (torch's TF32 and reduced-precision switches
concern float32 and half GEMMs only; :func:`self_test` checks the device's GEMM), and so do the norms
and the decision, as torch ops (:mod:`refkern.engines.filter_device`, the same bound folded, never
deciding an element decide_one leaves undecided); the results come back once in the result format
and only the undecided elements run the exact path on the CPU.
"""

import numba
import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.engines import filter_device
from refkern.engines.filter_element import (  # the element's exact path and threads
    K_MAX,
    M_MAX,
    M_MIN,
    PARALLEL_TERMS,
    SLACK,
    _exact_pairs,
    _threads,
    bound,
    decide_one,
    threads_for,
)
from refkern.kernels._element import EXACT

__all__ = ["applies", "gemm", "device_values", "decide_one", "bound", "self_test", "SLACK",
           "M_MIN", "M_MAX", "K_MAX", "ABS_GEMM_COST", "ABS_SAMPLE", "TILE_EXACT_MIN",
           "ROW_BLOCK", "PARALLEL_TERMS", "threads_for"]  # fmt: skip

ABS_GEMM_COST = 0.1  # a block's |A||B| GEMM, in elements of the block by the exact path (bench_filter)
ABS_SAMPLE = 32  # undecided elements sampled per block to predict what the tight bound decides
TILE_EXACT_MIN = 0.35  # fraction still undecided: the whole block by the Numba kernel (bench_filter)
ROW_BLOCK = 256  # rows per block for these two rules


def applies(p) -> bool:
    """Whether the filter can compute Plan ``p``: ``exact`` on float32-or-narrower factors, a result
    format of at most 26 bits (so that the float64 value is never the answer itself)."""
    return p.method == EXACT and p.narrow and p.work.prec <= 26


@jit(parallel=True)
def _decide(V, na, nb, ia, ib, brow, bcol, k, prec, emin, emax, und, counts):
    """V[t, i, j] (the GEMM's value, no bias) := the decided result, where the bound
    m = fl(fl(na[ia[t], i] nb[ib[t], j]) + |bias|) decides it; und[t, i, j] = 1 where it does not
    (V left as it was). bias = brow[i] + bcol[j] (one of them zero). counts[t, i] = undecided."""
    nt, m, n = V.shape
    for task in prange(nt * m):
        t = task // m
        i = task % m
        ra = na[ia[t], i]
        rb = nb[ib[t]]
        c = 0
        for j in range(n):
            b = brow[i] + bcol[j]
            s = V[t, i, j] + b  # the bias: one more rounded addition, counted in K
            r = decide_one(s, ra * rb[j] + abs(b), k, prec, emin, emax)
            if r == r:
                V[t, i, j] = r
                und[t, i, j] = 0
            else:
                und[t, i, j] = 1
                c += 1
        counts[t, i] = c


@jit(parallel=True)
def _redecide(V, G, brow, bcol, k, prec, emin, emax, und, counts):
    """As :func:`_decide` on the undecided elements of one block, with m = fl(G + |bias|), G the
    float64 GEMM of |A| |B|^T (m >= (1 - gamma_K) T)."""
    nt, m, n = V.shape
    for task in prange(nt * m):
        t = task // m
        i = task % m
        c = 0
        for j in range(n):
            if und[t, i, j]:
                b = brow[i] + bcol[j]
                r = decide_one(V[t, i, j] + b, G[t, i, j] + abs(b), k, prec, emin, emax)
                if r == r:
                    V[t, i, j] = r
                    und[t, i, j] = 0
                else:
                    c += 1
        counts[t, i] = c


@jit
def _collect_every(und, counts, t, i0, i1, step, ii, jj):
    """(ii, jj) := every ``step``-th undecided element of rows i0:i1 of und[t] (the first of each
    step), until ii is full: a sample spread over the block, without storing the others."""
    c = 0
    q = 0
    for i in range(i0, i1):
        if counts[t, i] == 0:
            continue
        row = und[t, i]
        for j in range(row.size):
            if row[j]:
                if c % step == 0 and q < ii.size:
                    ii[q] = i
                    jj[q] = j
                    q += 1
                c += 1
    return q


def _norms(X):
    """fl(sqrt(fl(sum_k X[..., k]**2))) per row of a (..., K) float64 array of <= 24-bit values, any
    layout: each square is exact (<= 48 bits, >= 2**-298), numpy's sum errs by gamma_{K-1} in
    whatever order it takes, the root by u (:func:`decide_one`'s condition on m). numpy, not Numba:
    a parallel Numba kernel right after a BLAS call shares the cores with BLAS threads still
    spinning (measured: +5 ms at 512**3 on 2 cores)."""
    return np.sqrt(np.einsum("...k,...k->...", X, X))


def _device_gemm(device):
    """matmul(a, bt) -> a @ bt^T as float64 numpy: numpy's BLAS on the CPU, cuBLAS on ``device``."""
    if device is None or getattr(device, "type", "cpu") == "cpu":

        def mm_cpu(a, bt, out=None):
            with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 rows: decided exactly later
                return np.matmul(a, np.swapaxes(bt, -1, -2), out=out)

        return mm_cpu
    import torch

    # float64 GEMMs: torch's TF32 and fp16/bf16 reduced-precision-reduction switches apply to float32
    # and half GEMMs only, so the user's settings are left alone; self_test(device) checks the result

    def mm(a, bt, out=None):
        ta = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        tb = torch.from_numpy(np.ascontiguousarray(bt)).to(device)
        r = torch.matmul(ta, tb.transpose(-1, -2)).cpu().numpy()
        if out is None:
            return r
        out[...] = r
        return out

    return mm


def _all(idx, n):
    """Whether the sorted indices ``idx`` are 0 .. n - 1."""
    return idx.size == n and (n == 0 or (idx[0] == 0 and idx[-1] == n - 1))


class _Gemm:
    """One batch of ``V[t] = A[ia[t]] @ B[ib[t]]^T (+ bias)``: A (TA, M, K), B (TB, N, K) float64
    exact values in any layout (B may be a transposed view), the bias per column (bcol, N) or,
    with ``bias_rows``, per row (brow, M); the other array zeros."""

    def __init__(self, p, A, B, ia, ib, brow, bcol, has_bias, device, bias_rows=False):
        self.p, self.A, self.B, self.ia, self.ib = p, A, B, ia, ib
        self.brow, self.bcol, self.has_bias, self.bias_rows = brow, bcol, has_bias, bias_rows
        self.mm = _device_gemm(device)
        self._absb = {}
        self.n = B.shape[1] if B is not None else 0

    stats = None  # a dict to count in (benchmarks): elements, undecided_first, abs_gemm_rows, ...

    def _count(self, key, v):
        if self.stats is not None:
            self.stats[key] = self.stats.get(key, 0) + int(v)

    def abs_b(self, t):
        """|B[ib[t]]|, kept for the blocks of the same batch element."""
        if self.ib[t] not in self._absb:
            self._absb = {self.ib[t]: np.abs(self.B[self.ib[t]])}
        return self._absb[self.ib[t]]

    # the hooks a GEMM without a materialised B (the shifted-tap convolution) overrides
    def value_gemm(self, V):
        """V[t] = A[ia[t]] @ B[ib[t]]^T, float64, by the BLAS."""
        for t in range(V.shape[0]):
            self.mm(self.A[self.ia[t]], self.B[self.ib[t]], out=V[t])

    def abs_gemm(self, t, i0, i1, out=None):
        """|A[ia[t], i0:i1]| @ |B[ib[t]]|^T (sum |products| of those rows), float64, by the BLAS."""
        return self.mm(np.abs(self.A[self.ia[t], i0:i1]), self.abs_b(t), out=out)

    def mag_gemm(self, mag):
        """mag[t] = |A[ia[t]]| @ |B[ib[t]]|^T for every t (the magnitudes, all rows)."""
        for t in range(mag.shape[0]):
            self.abs_gemm(t, 0, mag.shape[1], out=mag[t])

    def norms(self):
        """(row norms of A (TA, M), of B (TB, N)), as :func:`_norms` computes them."""
        return _norms(self.A), _norms(self.B)

    def b_rows(self, t, idx):
        """Rows ``idx`` of B[ib[t]], contiguous float64 (K each). B held as a transposed view (matmul's
        B^T): gathered along the rows of B itself, then transposed (gathering columns with a stride
        of N floats cost 6 ms for 800 of 1024 at K = 1024)."""
        b = self.B[self.ib[t]]
        if _all(idx, b.shape[0]):
            return np.ascontiguousarray(b)  # all of B: one copy (none if contiguous)
        if b.flags.c_contiguous:
            return np.ascontiguousarray(b[idx])
        return np.ascontiguousarray(np.ascontiguousarray(b.T)[:, idx].T) if b.T.flags.c_contiguous else \
            np.ascontiguousarray(b[idx])  # fmt: skip

    def values(self, V, mag=None):
        """V (T, M, N) := the correctly rounded results; mag (same shape) := the magnitudes."""
        p = self.p
        k = self.A.shape[2]
        fmt = p.work.params
        nt, m, n = V.shape
        if nt == 0 or m == 0 or n == 0:
            return
        self.value_gemm(V)
        und = np.empty(V.shape, np.uint8)
        counts = np.empty((nt, m), np.int64)
        if mag is not None:  # the tight bound from the start: the magnitudes are wanted anyway
            self.mag_gemm(mag)
            und[...] = 1
            with _threads(1):
                _redecide(V, mag, self.brow, self.bcol, k, *fmt, und, counts)
            mag += np.abs(self.brow)[None, :, None] + np.abs(self.bcol)[None, None, :]
        else:
            na, nb = self.norms()
            with _threads(1):
                _decide(V, na, nb, self.ia, self.ib, self.brow, self.bcol, k, *fmt, und, counts)
        st = self.stats
        if st is not None:
            st["elements"] = st.get("elements", 0) + V.size
            st["undecided_first"] = st.get("undecided_first", 0) + int(counts.sum())
        if counts.any():
            self._refine(V, und, counts, k, fmt, tight=mag is not None)

    def _refine(self, V, und, counts, k, fmt, tight):
        """The undecided elements, per block of ROW_BLOCK rows (the rule, from benchmarks/
        bench_filter.py's cost model):

        1. The tight bound (a GEMM of |A| |B|^T over the block) only where it pays: it costs
           ABS_GEMM_COST of the block's elements by the exact path, and saves the elements it
           decides. Up to ABS_SAMPLE undecided elements are sampled, their sum |terms| formed
           directly, and decided with it: a fraction phi of them would be. The GEMM runs when
           (undecided) * phi > ABS_GEMM_COST * (block size). Where terms cancel (condition numbers
           beyond 1 / (K u)) phi is 0 and no GEMM is wasted; where only the norm bound was loose
           (||a|| ||b|| / sum |terms|, pi / 2 for Gaussian data) phi is high.
        2. More than TILE_EXACT_MIN of the block still undecided: the whole block by the Numba
           kernel, else element by element (:func:`_exact_pairs`: per element the row statistics
           of both operands and the gathers on top of the exact sum; every block's elements of a
           batch element in one call, so that B's rows are gathered once: at 1024**3 a gather per
           block read B four times, 9.7 of 94 ms of CPU). bench_filter's cost model
           measured the whole block by the Numba kernel at 0.35 of the block element by element
           (256 x 1024, K = 1024); ABS_GEMM_COST there measured 0.097 and 0.110 in two runs.
        So the engine costs at most the exact path plus its one GEMM and the O(M N) passes."""
        nt, m, n = V.shape
        for t in range(nt):
            numba_rows = []  # the blocks for the Numba kernel, in one call per batch element
            pairs = []  # the elements for the exact path, in one call per batch element (one gather of B's rows)
            for i0 in range(0, m, ROW_BLOCK):
                i1 = min(m, i0 + ROW_BLOCK)
                c = int(counts[t, i0:i1].sum())
                if c == 0:
                    continue
                size = (i1 - i0) * n
                blk = (slice(t, t + 1), slice(i0, i1))
                ii = jj = None
                if not tight and c > ABS_GEMM_COST * size:
                    q = min(ABS_SAMPLE, c)  # every (c // q)-th undecided element, without collecting all c
                    si, sj = np.empty(q, np.int64), np.empty(q, np.int64)
                    _collect_every(und, counts, t, i0, i1, c // q, si, sj)
                    if c * self._tight_fraction(V, t, si, sj, k, fmt) > ABS_GEMM_COST * size:
                        G = self.abs_gemm(t, i0, i1)[None]
                        cc = np.empty((1, i1 - i0), np.int64)
                        with _threads(1):
                            _redecide(V[blk], G, self.brow[i0:i1], self.bcol, k, *fmt, und[blk], cc)
                        counts[t, i0:i1] = cc[0]
                        c = int(cc.sum())
                        self._count("abs_gemm_rows", i1 - i0)
                        ii = jj = None
                        if c == 0:
                            continue
                if c > TILE_EXACT_MIN * size:
                    numba_rows.append(np.arange(i0, i1))
                    self._count("numba_block_elements", size)
                    continue
                if ii is None:
                    ii, jj = np.empty(c, np.int64), np.empty(c, np.int64)
                    _collect_every(und, counts, t, i0, i1, 1, ii, jj)  # all c of them: step 1
                pairs.append((ii, jj))
                self._count("exact_elements", c)
            if pairs:
                self._pairs(V, t, np.concatenate([q[0] for q in pairs]), np.concatenate([q[1] for q in pairs]), k, fmt)
            if numba_rows:
                rows = np.concatenate(numba_rows)
                V[t, rows] = self._numba_rows(t, rows)

    def exact_undecided(self, V, idx):
        """V[idx] := the exact path, idx (n, 3) the undecided (t, i, j) the device left
        (:mod:`refkern.engines.filter_device`, its tight bound already applied): element by element,
        or, where a batch element holds at least TILE_EXACT_MIN ROW_BLOCK N of them (so that a block
        of ROW_BLOCK rows may exceed the share at which :meth:`_refine` takes the Numba kernel for the
        whole block), by :meth:`_refine`'s rule."""
        nt, m, n = V.shape
        k, fmt = self.A.shape[2], self.p.work.params
        per_t = np.bincount(idx[:, 0], minlength=nt)
        if per_t.max() >= TILE_EXACT_MIN * ROW_BLOCK * n:
            und = np.zeros(V.shape, np.uint8)
            und[idx[:, 0], idx[:, 1], idx[:, 2]] = 1
            self._refine(V, und, und.sum(2, dtype=np.int64), k, fmt, tight=True)
            return
        for t in np.flatnonzero(per_t):
            sel = idx[idx[:, 0] == t]
            self._count("exact_elements", sel.shape[0])
            self._pairs(V, t, sel[:, 1], sel[:, 2], k, fmt)

    def _tight_fraction(self, V, t, ii, jj, k, fmt):
        """The fraction of the sampled undecided elements (ii, jj) of V[t] that the tight bound, sum
        |terms| formed directly, decides."""
        pick = np.arange(ii.size)
        si, sj = ii, jj
        a = np.abs(self.A[self.ia[t]][si])
        b = np.abs(self.b_rows(t, sj))
        g = np.einsum("ik,ik->i", a, b)
        bias = self.brow[si] if self.bias_rows else self.bcol[sj]
        s = V[t, si, sj] + bias
        r = np.array([decide_one(s[q], g[q] + abs(bias[q]), k, *fmt) for q in range(pick.size)])
        decided = int((r == r).sum())  # NaN: undecided
        self._count("sampled_for_tight", pick.size)
        return decided / pick.size

    def _pairs(self, V, t, ii, jj, k, fmt):
        """V[t, ii, jj] by the exact path, on gathered copies of the rows involved."""
        ua, ri = np.unique(ii, return_inverse=True)
        ub, rj = np.unique(jj, return_inverse=True)
        a = np.ascontiguousarray(self.A[self.ia[t]][ua])
        b = self.b_rows(t, ub)
        bias = self.brow[ii] if self.bias_rows else self.bcol[jj]  # (-0 + 0 would lose a -0 bias)
        out = np.empty(ii.size)
        threads = numba.get_num_threads() if ii.size * k >= PARALLEL_TERMS else 1
        with _threads(threads):
            _exact_pairs(a, b, ri.reshape(-1), rj.reshape(-1), np.ascontiguousarray(bias), self.has_bias,
                         self.p.narrow, *fmt, out)  # fmt: skip
        V[t, ii, jj] = out

    def _numba_rows(self, t, rows):
        """Rows ``rows`` of V[t] by the Numba kernel (exact, rounded once), with the bias on its axis."""
        from refkern.kernels._gemm_numba import run_numba

        zero = np.zeros(1, np.int64)
        a = self.A[self.ia[t]]
        a = np.ascontiguousarray(a if _all(rows, a.shape[0]) else a[rows])[None]
        b = self.b_rows(t, np.arange(self.n))[None]
        if self.has_bias and self.bias_rows:  # a bias per row (the convolution): rows as columns
            v = run_numba(self.p, b, a, zero, zero, np.ascontiguousarray(self.brow[rows]), (b.shape[1], rows.size))[0]
            return v.T
        bias = self.bcol if self.has_bias else None
        return run_numba(self.p, a, b, zero, zero, bias, (rows.size, b.shape[1]))[0]


def gemm(p, A3, Bt3, ia, ib, bias, out_shape, want_mag=False, device=None, stats=None):
    """:func:`refkern.engines.run_gemm` by the filter (``applies(p)`` must hold): (values,
    magnitudes or None), float64 arrays of ``out_shape``. The magnitudes are the float64 GEMM of
    |A| |B|^T plus |bias|: sum |terms| in some order, within gamma_K of it, as the Numba kernel's.
    ``stats``: a dict the engine counts its paths in (elements, undecided_first, abs_gemm_rows,
    numba_block_elements, exact_elements)."""
    nb, m, n = len(ia), A3.shape[1], Bt3.shape[1]
    k = A3.shape[2]
    V = np.empty((nb, m, n))
    mag = np.empty((nb, m, n)) if want_mag else None
    has_bias = bias is not None
    bcol = np.ascontiguousarray(bias, np.float64) if has_bias else np.zeros(n)
    if k >= K_MAX:
        raise ValueError(f"{p.op}: the filter needs K < 2**40; got K={k}.")
    if device is not None and getattr(device, "type", "cpu") != "cpu" and filter_device.supports(p.work.params):
        V, mag = device_values(p, A3, Bt3, ia, ib, bias, want_mag, device, stats)
        return V.reshape(out_shape), (mag.reshape(out_shape) if want_mag else None)
    g = _Gemm(p, A3, Bt3, np.ascontiguousarray(ia), np.ascontiguousarray(ib), np.zeros(m), bcol, has_bias, device)
    g.stats = stats
    g.values(V, mag)
    return V.reshape(out_shape), (mag.reshape(out_shape) if want_mag else None)


def device_values(p, A3, Bt3, ia, ib, bias, want_mag, device, stats=None):
    """(V, magnitudes or None), (T, M, N) float64, with the decision on ``device`` (any torch device,
    the CPU included: the tests run it there): :func:`refkern.engines.filter_device.gemm`, then the
    exact path here on the elements it left (:meth:`_Gemm.exact_undecided`)."""
    V, mag, idx = filter_device.gemm(p, A3, Bt3, ia, ib, bias, want_mag, device, stats)
    if idx.shape[0]:
        has_bias = bias is not None
        bcol = np.ascontiguousarray(bias, np.float64) if has_bias else np.zeros(Bt3.shape[1])
        g = _Gemm(p, A3, Bt3, np.ascontiguousarray(ia), np.ascontiguousarray(ib), np.zeros(A3.shape[1]), bcol,
                  has_bias, None)  # fmt: skip
        g.stats = stats
        g.exact_undecided(V, idx)
    return V, mag


# ---------------------------------------------------------------------------------- self-test


def self_test(device=None) -> tuple[bool, str]:
    """Check the filter's assumption on the BLAS in use: (ok, detail).

    1. Each element a sum of products in float64, correctly rounded operations: a GEMM whose
       exact results are known (rows of 1, 2**-30 and -1: the sums cancel to 2**-30 in every
       order, which no float32 or TF32 reduction keeps) returns them exactly.
    2. No Strassen-like scheme: a GEMM of integers whose products and sums are exact in float64
       returns the exact integers (Strassen's differences of large and small blocks would round).
    3. No flush-to-zero: a product of normal float32 values near 2**-149 * 2**-149 stays nonzero.
    4. The filter's result on random float32 GEMMs with cancellation equals the Numba engine's.
    """
    mm = _device_gemm(device)
    rng = np.random.default_rng(1)
    n = 96
    a = np.zeros((n, n))
    a[:, 0], a[:, 1], a[:, 2] = 1.0, 2.0**-30, -1.0
    a = a[:, rng.permutation(n)]
    b = np.ones((n, n))
    v = mm(a, b)
    if not (v == 2.0**-30).all():
        return False, "a float64 GEMM lost a term of 2**-30 beside 1 and -1: reduced precision"
    ai = rng.integers(-(2**20), 2**20, (256, 256)).astype(np.float64)
    bi = rng.integers(-(2**20), 2**20, (256, 256)).astype(np.float64)
    vi = mm(ai, bi)
    want = (ai.astype(np.int64) @ bi.T.astype(np.int64)).astype(np.float64)
    if not (vi == want).all():
        return False, "a float64 GEMM of integers (exact in every order) was not exact: Strassen-like or reduced"
    t = np.full((4, 8), 2.0**-140)
    if not (mm(t, t) == 8 * 2.0**-280).all():
        return False, "a float64 GEMM flushed products near 2**-280 to zero"
    from refkern.kernels._common import plan
    from refkern.kernels._gemm_numba import matmul_operands, run_numba

    x = rng.standard_normal((64, 200)).astype(np.float32)
    y = rng.standard_normal((200, 48)).astype(np.float32)
    y[:, 1::2] = -y[:, ::2] * np.float32(1 + 2.0**-20)  # cancelling columns: many undecided elements
    pl = plan("matmul", {"a": x, "b": y}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(pl)
    got = gemm(pl, A3, Bt3, ia, ib, None, shape, device=device)[0]
    ref = run_numba(pl, A3, Bt3, ia, ib, None, shape)[0]
    if not np.array_equal(got.view(np.int64), ref.view(np.int64)):
        return False, "the filter's matmul differs from the Numba engine's"
    return True, "float64 GEMM: exact where every order is, no Strassen, no flush-to-zero; filter == numba"
