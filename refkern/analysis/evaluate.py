"""An op call as the analysis sees it: one reduction ``bias + sum_k l_k r_k`` per output element.

``problem(op, args, kwargs, out=fmt)`` validates the call once and keeps its operands in the
kernels' layout. From it:

* ``run()`` is the exact reference: per element the correctly rounded value, the magnitude
  ``M = sum|terms|`` (bias included) and the number of terms;
* ``run(inputs=(fmt, mode, round_bias), method=..., work=...)`` is the same call as a
  reduced-precision backend would compute it: inputs rounded to a narrower format (to
  nearest even, toward zero, or to nearest with ties away), accumulated exactly or
  left-to-right / pairwise in a narrow format, or the error scale of a left-to-right sum
  (``ENERGY``);
* ``terms(idx)`` gathers the terms of the output elements ``idx`` (flat indices) as rows
  ``L[s]``, ``R[s]`` and ``bias[s]``, so that any such model can be evaluated on a sample
  of elements (:func:`sample_run`) without running the whole op.

``evaluate(op, args, kwargs, out=..., emulate=(fmt, truncate, round_bias))`` is the exact
evaluation as one record, kept for callers that need only that.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np
from numba import prange

import refkern.ops as _ops
from refkern._jit import jit
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.formats import Format, round_array, round_to_vec
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.engines.filter import decide_one, threads_for
from refkern.kernels import conv, conv_transpose, gemm
from refkern.kernels._common import plan
from refkern.kernels._element import EXACT, NAIVE, PAIRWISE, abs_sum, reduce_element, row_stats
from refkern.ops._bind import bind

__all__ = ["OPS", "Evaluation", "Problem", "Terms", "evaluate", "problem", "op_name", "sample_run"]

OPS = _ops.names(error_model="sum")  #: the ops whose every output element is one rounded sum of products


@dataclass
class Evaluation:
    values: np.ndarray  # float64, the exact result rounded once to ``fmt``
    mag: np.ndarray  # float64, sum of |terms| per element (bias included)
    n_terms: int  # terms per element (bias included)
    fmt: Format  # result format
    shape: tuple
    axes: tuple  # a name per output axis
    has_bias: bool = False
    in_prec: int = 53  # precision of the multiplied inputs (an emulation coarser than this changes them)
    bias_axis: int | None = None  # the output axis the bias runs along


def op_name(op) -> str:
    """'conv2d' from 'conv2d' or from refkern.conv2d (an error listing the registry's ops otherwise)."""
    return _ops.lookup(op, "compare")


def _bind(name, args, kwargs):
    return bind(name, args, kwargs, "compare", keywords=None, why="the reference is always exact")


@dataclass
class Problem:
    """A validated op call in the kernels' layout (see the module docstring)."""

    name: str
    p: object  # the kernels' Plan (result format = the analysed output's format)
    kind: str  # "dot", "gemm" or "conv"
    ops: tuple  # dot: (x, y); gemm: (A3, Bt3, ia, ib); conv: (ConvOperands,)
    bias: np.ndarray | None  # (n_bias,) float64
    shape: tuple
    axes: tuple
    n_terms: int
    in_prec: int
    bias_axis: int | None

    @property
    def fmt(self) -> Format:
        return self.p.out

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def bias_values(self) -> np.ndarray:
        """The bias term of every output element (0 without a bias), float64 of ``shape``."""
        if self.bias is None:
            return np.zeros(self.shape)
        if self.bias_axis is None:
            return np.full(self.shape, self.bias[0])
        view = [1] * len(self.shape)
        view[self.bias_axis] = -1
        return np.broadcast_to(self.bias.reshape(view), self.shape)

    def _operands(self, inputs, with_bias=True):
        """The operands, the multiplied ones (and with ``round_bias`` the bias) rounded as ``inputs`` says."""
        bias = self.bias if with_bias else None
        if inputs is None:
            if self.kind == "conv" and not with_bias:
                return (dataclasses.replace(self.ops[0], bias=None),), None
            return self.ops, bias
        fmt, mode, round_bias = inputs

        def r(a):
            return round_array(a, *fmt.params, mode)

        if round_bias and bias is not None:
            bias = r(bias)
        if self.kind == "dot":
            return (r(self.ops[0]), r(self.ops[1])), bias
        if self.kind == "gemm":
            A3, Bt3, ia, ib = self.ops
            return (r(A3), r(Bt3), ia, ib), bias
        c = self.ops[0]
        return (dataclasses.replace(c, X=r(c.X), W=r(c.W), bias=bias),), bias

    def run(self, *, inputs=None, method: int = EXACT, work: Format | None = None, want_mag: bool = False,
            with_bias: bool = True):  # fmt: skip
        """(values, mag or None), float64 arrays of ``shape``: every element reduced by ``method`` in
        ``work`` (default: the result format; EXACT rounds once to it); without the bias term if
        ``with_bias`` is False."""
        p = dataclasses.replace(self.p, method=method, work=work or self.p.out)
        ops, bias = self._operands(inputs, with_bias)
        if self.kind == "dot":
            x, y = (np.ascontiguousarray(o) for o in ops)
            v, m = sample_run(x[None], y[None], np.zeros(1), False, p)
            return v.reshape(()), (m.reshape(()) if want_mag else None)
        if self.kind == "gemm":
            return gemm.run_gemm(p, *ops, bias, self.shape, want_mag=want_mag)
        return conv.run_conv(p, ops[0], want_mag=want_mag)

    def terms(self, idx: np.ndarray) -> "Terms":
        """(L, R, bias, has_bias): the terms of the output elements with flat indices ``idx``,
        L[s] and R[s] of length K each (float64, contiguous), bias[s] their bias (or 0); the tuple
        also carries ``idx`` and this problem (:class:`Terms`).

        The last gathered rows are held (the arrays and their indices, not the tuple: no cycle through
        ``problem``): a later call for some of the same elements (the order check's 256 of the
        verdict's sample) takes copies of its rows from there, and so does :meth:`with_inputs`'
        problem, rounding them (a convolution's gather costs about 3 ns a term; the copy and the
        rounding together under 2 ns). Each call returns arrays of its own."""
        idx = np.asarray(idx, np.int64)
        rows = self._held_rows(idx)
        src = self.__dict__.get("_source")
        if rows is None and src is not None:  # with_inputs' problem: the source's rows, rounded
            base, (fmt, mode, round_bias) = src
            got = base._held_rows(idx, copy=False)  # round_array makes the copies
            if got is not None:
                L, R, b, hb = got
                rb = round_array(b, *fmt.params, mode) if round_bias and hb else b.copy()
                rows = (round_array(L, *fmt.params, mode), round_array(R, *fmt.params, mode), rb, hb)
        if rows is None:
            rows = self._terms(idx)
            self._held = (idx, rows)
        return Terms(rows, self, idx)

    def _held_rows(self, idx, copy=True):
        """Copies of the held rows of the elements ``idx`` (:meth:`terms`; without ``copy`` the held arrays
        themselves where ``idx`` is the held indices), or None where some are not held."""
        held = self.__dict__.get("_held")
        if held is None:
            return None
        hidx, (L, R, b, hb) = held
        if hidx.size == idx.size and np.array_equal(hidx, idx):
            return (L.copy(), R.copy(), b.copy(), hb) if copy else (L, R, b, hb)
        order = np.argsort(hidx, kind="stable")
        pos = np.minimum(np.searchsorted(hidx[order], idx), max(hidx.size - 1, 0))
        if hidx.size == 0 or not np.array_equal(hidx[order[pos]], idx):
            return None
        pos = order[pos]
        return L[pos], R[pos], b[pos], hb

    def with_inputs(self, inputs) -> "Problem":
        """The same problem on its operands rounded as ``inputs = (fmt, mode, round_bias)`` says:
        its ``terms(idx)`` are ``terms(idx)`` rounded element by element (gathering commutes with
        rounding each value), from this problem's held rows where it holds them (:meth:`terms`)."""
        ops, bias = self._operands(inputs)
        out = dataclasses.replace(self, ops=ops, bias=bias)
        out._source = (self, inputs)
        return out

    def operand_size(self) -> int:
        """The number of values in the multiplied operands (what :meth:`with_inputs` rounds)."""
        if self.kind in ("dot", "gemm"):
            return int(self.ops[0].size + self.ops[1].size)
        return int(self.ops[0].X.size + self.ops[0].W.size)

    def _terms(self, idx: np.ndarray):
        has_bias = self.bias is not None
        if self.kind == "dot":
            x, y = self.ops
            return x[None].copy(), y[None].copy(), np.zeros(1), False
        if self.kind == "gemm":
            A3, Bt3, ia, ib = self.ops
            m, n = A3.shape[1], Bt3.shape[1]
            t, i, j = idx // (m * n), (idx // n) % m, idx % n
            b = self.bias[j] if has_bias else np.zeros(idx.size)
            return A3[ia[t], i], Bt3[ib[t], j], np.ascontiguousarray(b), has_bias
        c = self.ops[0]
        c_out = c.out_shape[1]
        cin_g, kh, kw = c.W.shape[1], c.W.shape[2], c.W.shape[3]
        co = (idx // (c.out_shape[2] * c.out_shape[3])) % c_out
        L = np.empty((idx.size, cin_g * kh * kw))
        with threads_for(L.size):
            _gather_patches(c.X, idx, c_out, c.out_shape[2], c.out_shape[3], c_out // c.groups, cin_g, kh, kw,
                            *c.stride, *c.dilation, L)  # fmt: skip
        R = c.W.reshape(c_out, -1)[co]
        b = self.bias[co] if has_bias else np.zeros(idx.size)
        return np.ascontiguousarray(L.reshape(idx.size, -1)), np.ascontiguousarray(R), np.ascontiguousarray(b), has_bias


@jit(parallel=True)
def _gather_patches(X, idx, c_out, ho, wo, cout_g, cin_g, kh, kw, sh, sw, dh, dw, L):
    """L[s] = the input patch of output element idx[s] of a conv2d over the padded X, in the
    (ci, ky, kx) order of the kernel's terms (:func:`~refkern.kernels.conv.run_conv`)."""
    for s in prange(idx.size):
        f = idx[s]
        n, co, oy, ox = f // (c_out * ho * wo), (f // (ho * wo)) % c_out, (f // wo) % ho, f % wo
        c0 = (co // cout_g) * cin_g
        q = 0
        for ci in range(cin_g):
            for ky in range(kh):
                for kx in range(kw):
                    L[s, q] = X[n, c0 + ci, oy * sh + ky * dh, ox * sw + kx * dw]
                    q += 1


@jit(fastmath={"reassoc", "contract"})
def _dot64(a, b, bias):
    """bias + sum_k a[k] b[k] in float64, in whatever order LLVM vectorizes it: the filter's value
    (:func:`~refkern.engines.filter.decide_one` holds for any order, with or without FMA). A separate
    function, so that the flags stay on its own code (as :func:`~refkern.kernels._element.abs_sum`)."""
    s = bias
    for k in range(a.size):
        s += a[k] * b[k]
    return s


_ROWS_AT_ONCE = 4  # rows whose float32 chains _naive_f32 interleaves: 4 additions in flight (latency 3 to 4 cycles)
_ROWS_PER_TASK = 64  # rows per parallel task of the NAIVE and PAIRWISE models (each row alone: any split, same values)


@jit
def _naive_f32(L, R, bias, has_bias, out, lo, hi):
    """out[s] = :func:`~refkern.accumulate.methods.naive` of row s, lo <= s < hi, in float32 (fl(s + fl(t_k)) left
    to right, the bias last), in float32 arithmetic instead of :func:`~refkern.accumulate.formats.round_to` on float64
    (two emulated roundings per term, 8 ns; about 1 ns here). The same values: ``t_k = L R`` is exact in
    float64 (narrow inputs) and its conversion to float32 is round_to(t, 24, -126, 127) (the filter's
    :func:`~refkern.engines.filter.decide_one` reads it so too); the sum of two float32 numbers rounded to
    float64 and then to float32 is the float32 sum rounded once, since 53 >= 2 * 24 + 2 (double rounding is
    innocuous for addition: Figueroa, SIGNUM Newsl. 30(3), 1995; Roux, 2014, subnormals and overflow
    included: a float64 sum that is not exact needs operands 2**29 apart, far from float32's subnormals, and
    overflow is decided by a float64 threshold), inf, NaN and the sign of a zero sum alike (+0 + -0 = +0 in
    both). Rows in groups of :data:`_ROWS_AT_ONCE`, each its own chain in its own order."""
    K = L.shape[1]
    g = hi - (hi - lo) % _ROWS_AT_ONCE
    for s in range(lo, g, _ROWS_AT_ONCE):
        a0, a1, a2, a3 = L[s], L[s + 1], L[s + 2], L[s + 3]
        b0, b1, b2, b3 = R[s], R[s + 1], R[s + 2], R[s + 3]
        c0 = c1 = c2 = c3 = np.float32(0.0)
        for k in range(K):
            c0 = c0 + np.float32(a0[k] * b0[k])
            c1 = c1 + np.float32(a1[k] * b1[k])
            c2 = c2 + np.float32(a2[k] * b2[k])
            c3 = c3 + np.float32(a3[k] * b3[k])
        if has_bias:
            c0, c1 = c0 + np.float32(bias[s]), c1 + np.float32(bias[s + 1])
            c2, c3 = c2 + np.float32(bias[s + 2]), c3 + np.float32(bias[s + 3])
        out[s], out[s + 1], out[s + 2], out[s + 3] = np.float64(c0), np.float64(c1), np.float64(c2), np.float64(c3)
    for s in range(g, hi):
        a, b = L[s], R[s]
        c = np.float32(0.0)
        for k in range(K):
            c = c + np.float32(a[k] * b[k])
        if has_bias:
            c = c + np.float32(bias[s])
        out[s] = np.float64(c)


_LANES = 32  # rows whose sums :func:`_lanes_terms` lays out side by side: 8 vectors of 4 float64 per term
_TILE = 16  # terms per row that :func:`_lanes_terms` copies at a time (16 x 32 float64: 4 KiB of X)


@jit
def _lanes_terms(L, R, bias, has_bias, prec, emin, emax, s0, nr, X, rows):
    """X[i, j] = ``fl(t_i)`` of row ``s0 + j`` (j < nr): the product ``L R`` (float64) rounded to the format
    (prec, emin, emax), the bias as term K; the terms of :func:`~refkern.accumulate.methods.naive` and
    :func:`~refkern.accumulate.methods.pairwise` (their ``_term``, rounded by ``round_to``: the same values as
    :func:`~refkern.accumulate.formats.round_to_vec`'s), a row per column. Rounded row by row into ``rows``
    (``nr`` x n: a vector loop), then copied to X in tiles of :data:`_TILE` terms (a tile's columns stay in
    L1): 1.4 ns a term at load 9, against 1.7 to 3.4 ns for the rounding written straight into X's columns."""
    K = L.shape[1]
    for j in range(nr):
        for i in range(K):
            rows[j, i] = round_to_vec(L[s0 + j, i] * R[s0 + j, i], prec, emin, emax)
        if has_bias:
            rows[j, K] = round_to_vec(bias[s0 + j], prec, emin, emax)
    n = K + has_bias
    for i0 in range(0, n, _TILE):
        for j in range(nr):
            for i in range(i0, min(n, i0 + _TILE)):
                X[i, j] = rows[j, i]


@jit
def _naive_lanes(L, R, bias, has_bias, prec, emin, emax, out, lo, hi):
    """out[s] = :func:`~refkern.accumulate.methods.naive` of row s, lo <= s < hi, in the format (prec, emin, emax):
    the same operations in the same order (``s = fl(s + fl(t_i))`` from s = 0, the bias last), with up to
    :data:`_LANES` rows' sums as the lanes of one vector loop over the rows (:func:`_lanes_terms`'s columns)
    and :func:`~refkern.accumulate.formats.round_to_vec`: each row's chain waits on its last rounding, the
    rows' chains run side by side (a bfloat16 row of 576 terms: 0.9 ns a term with the layout, 3.7 ns
    for four rows' chains interleaved by ``round_to``)."""
    n = L.shape[1] + has_bias
    X, rows = np.empty((n, _LANES)), np.empty((_LANES, n))
    c = np.empty(_LANES)
    for s0 in range(lo, hi, _LANES):
        nr = min(_LANES, hi - s0)
        _lanes_terms(L, R, bias, has_bias, prec, emin, emax, s0, nr, X, rows)
        c[:] = 0.0
        for i in range(n):
            for j in range(_LANES):  # whole vectors; the columns past nr are never read back
                c[j] = round_to_vec(c[j] + X[i, j], prec, emin, emax)
        for j in range(nr):
            out[s0 + j] = c[j]


@jit
def _pairwise_lanes(L, R, bias, has_bias, prec, emin, emax, out, lo, hi):
    """out[s] = :func:`~refkern.accumulate.methods.pairwise` of row s, lo <= s < hi: the same balanced tree
    (level by level ``x[k] = fl(x[2k] + x[2k + 1])``, an odd last element carried up), rows as lanes as in
    :func:`_naive_lanes`; 0 for a row of no term."""
    n = L.shape[1] + has_bias
    X, Y, rows = np.empty((max(n, 1), _LANES)), np.empty(((n + 1) // 2, _LANES)), np.empty((_LANES, n))
    for s0 in range(lo, hi, _LANES):
        nr = min(_LANES, hi - s0)
        _lanes_terms(L, R, bias, has_bias, prec, emin, emax, s0, nr, X, rows)
        if n == 0:
            X[0, :] = 0.0
        m, A, B = n, X, Y
        while m > 1:  # one level from A into B (two buffers: the vector loop reads rows it never writes)
            h = m // 2
            for k in range(h):
                for j in range(_LANES):
                    B[k, j] = round_to_vec(A[2 * k, j] + A[2 * k + 1, j], prec, emin, emax)
            if m % 2:
                B[h, :] = A[m - 1]
                m = h + 1
            else:
                m = h
            A, B = B, A
        for j in range(nr):
            out[s0 + j] = A[0, j]


@jit(parallel=True)
def _sample_kernel(L, R, bias, has_bias, out, mag, method, narrow, prec, emin, emax):
    """out[s] = bias[s] + sum_k L[s, k] R[s, k] by ``method``; mag[s] = sum of |terms|. EXACT with
    products exact in float64 (``narrow``) and a result of at most 26 bits: first the filter's test
    (a float64 sum, the bound from mag, :func:`~refkern.engines.filter.decide_one`), the exact path
    where it cannot decide; the same correctly rounded value either way. NAIVE: :func:`_naive_f32` (float32)
    or :func:`_naive_lanes`, the values of :func:`~refkern.accumulate.methods.naive`; PAIRWISE:
    :func:`_pairwise_lanes`, those of :func:`~refkern.accumulate.methods.pairwise`."""
    filt = method == EXACT and narrow and prec <= 26
    rows = method == NAIVE or method == PAIRWISE  # whole rows at a time here (the loop below: mag only)
    f32 = method == NAIVE and narrow and prec == 24 and emin == -126 and emax == 127  # float32 arithmetic itself
    S = L.shape[0]
    nch = -(-S // _ROWS_PER_TASK) if rows else 0
    for c in prange(nch):
        lo, hi = c * _ROWS_PER_TASK, min(S, (c + 1) * _ROWS_PER_TASK)
        if f32:
            _naive_f32(L, R, bias, has_bias, out, lo, hi)
        elif method == NAIVE:
            _naive_lanes(L, R, bias, has_bias, prec, emin, emax, out, lo, hi)
        else:
            _pairwise_lanes(L, R, bias, has_bias, prec, emin, emax, out, lo, hi)
    for s in prange(L.shape[0]):
        b = bias[s] if has_bias else 0.0
        m = abs_sum(L[s], R[s], b)
        mag[s] = m
        if rows:
            continue
        if filt:
            r = decide_one(_dot64(L[s], R[s], b), m, L.shape[1], prec, emin, emax)
            if r == r:
                out[s] = r
                continue
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        scratch = np.empty(BLOCK)
        st = np.empty((2, 2), np.int64)
        row_stats(L[s : s + 1], st[0:1])
        row_stats(R[s : s + 1], st[1:2])
        out[s] = reduce_element(
            L[s], R[s], bias[s], has_bias, method, narrow, st[0, 0], st[0, 1], st[1, 0], st[1, 1],
            prec, emin, emax, acc, scratch,
        )  # fmt: skip


def sample_run(L, R, bias, has_bias, p, inputs=None):
    """(values, mag) of the gathered rows under the Plan ``p`` (its method and working format),
    the multiplied rows (and with ``round_bias`` the bias) rounded first as ``inputs`` says."""
    with threads_for(L.size):  # a sample is small: one thread below PARALLEL_TERMS products
        if inputs is not None:
            fmt, mode, round_bias = inputs
            L, R = round_array(L, *fmt.params, mode), round_array(R, *fmt.params, mode)
            if round_bias and has_bias:
                bias = round_array(bias, *fmt.params, mode)
        out, mag = np.empty(L.shape[0]), np.empty(L.shape[0])
        _sample_kernel(L, R, bias, has_bias, out, mag, *p.kernel_args)
    return out, mag


def problem(op, args, kwargs, *, out: Format | None = None) -> Problem:
    """Validate ``op(*args, **kwargs)`` and prepare its operands (``out``: the result format analysed)."""
    name = op_name(op)
    a = _bind(name, args, kwargs)
    if name == "dot":
        p = plan("dot", {"x": a["x"], "y": a["y"]}, ("x", "y"), "exact", None, out=out)
        x, y = (np.ascontiguousarray(p.ops[k].values, np.float64) for k in ("x", "y"))
        if x.ndim != 1 or x.shape != y.shape:
            raise ValueError(f"dot: expected 1-D inputs of equal length; got x.shape={x.shape} and y.shape={y.shape}.")
        return Problem(name, p, "dot", (x, y), None, (), (), x.size, _in_prec(p, ("x", "y")), None)
    if name in ("matmul", "linear"):
        names = ("a", "b") if name == "matmul" else ("x", "weight")
        ops = {k: a[k] for k in names} if name == "matmul" else {"x": a["x"], "weight": a["weight"], "bias": a["bias"]}
        p = plan(name, ops, names, "exact", None, out=out)
        if name == "matmul":
            A3, Bt3, ia, ib, shape = gemm.matmul_operands(p)
            bias = None
            own = (("row",) if len(p.ops["a"].shape) > 1 else ()) + (("col",) if len(p.ops["b"].shape) > 1 else ())
        else:
            A3, Bt3, bias, shape = gemm.linear_operands(p)
            ia = ib = np.zeros(1, np.int64)
            own = ("out_feature",) if len(p.ops["weight"].shape) == 2 else ()
        lead = "batch" if name == "matmul" else "dim"
        axes = tuple(f"{lead}{i}" for i in range(len(shape) - len(own))) + own
        n = A3.shape[2] + (bias is not None)
        bias_axis = len(shape) - 1 if bias is not None and own else None
        return Problem(name, p, "gemm", (A3, Bt3, ia, ib), bias, shape, axes, n, _in_prec(p, names), bias_axis)
    rec = _ops.get(name)  # a convolution: its kernel slides over the record's Op.spatial dimensions
    nd = rec.spatial
    spatial = {1: ("position",), 2: ("row", "col"), 3: ("depth", "row", "col")}[nd]
    if rec.family == "conv_transpose":
        ops = {"input": a["input"], "weight": a["weight"], "bias": a["bias"]}
        p = plan(name, ops, ("input", "weight"), "exact", None, out=out)
        c = conv_transpose.convt_operands(p, nd, a["stride"], a["padding"], a["output_padding"], a["groups"],
                                          a["dilation"])  # fmt: skip
        axes = (("batch",) if not c.unbatched else ()) + ("channel",) + spatial
        shape = c.result(np.empty(c.out_shape)).shape
        bias_axis = (0 if c.unbatched else 1) if c.bias is not None else None
        n = _convt_max_terms(c) + (c.bias is not None)
        return _ConvTProblem(name, p, "conv", (c,), c.bias, shape, axes, n, _in_prec(p, ("input", "weight")),
                             bias_axis)  # fmt: skip
    p = plan(name, {"x": a["x"], "weight": a["weight"], "bias": a["bias"]}, ("x", "weight"), "exact", None, out=out)
    c = conv.conv_operands(p, nd, a["stride"], a["padding"], a["dilation"], a["groups"], a["padding_mode"])
    n = int(np.prod(c.W.shape[1:])) + (c.bias is not None)
    axes = (("batch",) if not c.unbatched else ()) + ("channel",) + spatial
    shape = c.result(np.empty(c.out_shape)).shape
    bias_axis = (0 if c.unbatched else 1) if c.bias is not None else None
    cls = _Conv3dProblem if nd == 3 else Problem
    return cls(name, p, "conv", (c,), c.bias, shape, axes, n, _in_prec(p, ("x", "weight")), bias_axis)


class _Conv3dProblem(Problem):
    """conv3d: ``ops[0]`` is the depth-sliced conv2d (:func:`refkern.kernels.conv.conv_operands`), whose
    image ``n * D_out + z`` is depth z of image n; ``terms`` maps the 5-D output's flat indices to it."""

    def _terms(self, idx: np.ndarray):
        c = self.ops[0]
        _, c_out, ho, wo = c.out_shape
        idx = np.asarray(idx, np.int64)
        rest, t = idx % (ho * wo), idx // (ho * wo)
        z, t = t % c.depth, t // c.depth
        co, n = t % c_out, t // c_out
        return super()._terms(((n * c.depth + z) * c_out + co) * (ho * wo) + rest)


def _convt_max_terms(c) -> int:
    """The most products any output element of a transposed convolution receives: C_in / groups times,
    per spatial dimension, the most taps that reach one position (the dimensions are independent)."""
    n = c.X.shape[1] // c.groups
    for a in range(3):
        k = c.weight.shape[2 + a]
        valid = conv_transpose.valid_taps(np.arange(c.out_shape[2 + a]), c.padding[a], c.dilation[a], c.stride[a],
                                          c.X.shape[2 + a], k)  # fmt: skip
        n *= int(valid.sum(axis=1).max())
    return n


class _ConvTProblem(Problem):
    """conv_transpose1d/2d/3d: ``ops[0]`` is a :class:`~refkern.kernels.conv_transpose.ConvTOperands`.

    Seen by the analysis as the equivalent convolution (the "conv" kind): the terms of an element
    are laid out as (ci, kz, ky, kx) over every tap of the kernel, and a tap that does not reach the
    element is the term 0 * 0 (exact, so every model's value is unchanged; 0 * w would make
    inf weights NaN). ``n_terms`` is the most products one element receives, plus the bias: the
    elements with fewer terms get the bound of the longest, a little wider than their own."""

    def _operands(self, inputs, with_bias=True):
        c = self.ops[0]
        bias = self.bias if with_bias else None
        if inputs is None:
            return (dataclasses.replace(c, bias=bias),), bias
        fmt, mode, round_bias = inputs

        def r(v):
            return round_array(v, *fmt.params, mode)

        if round_bias and bias is not None:
            bias = r(bias)
        return (dataclasses.replace(c, X=r(c.X), weight=r(c.weight), bias=bias),), bias

    def run(self, *, inputs=None, method: int = EXACT, work: Format | None = None, want_mag: bool = False,
            with_bias: bool = True):  # fmt: skip
        p = dataclasses.replace(self.p, method=method, work=work or self.p.out)
        ops, _ = self._operands(inputs, with_bias)
        return conv_transpose.run_conv_transpose(p, ops[0], want_mag=want_mag)

    def operand_size(self) -> int:
        return int(self.ops[0].X.size + self.ops[0].weight.size)

    def _terms(self, idx: np.ndarray):
        c = self.ops[0]
        n, co, oz, oy, ox = np.unravel_index(idx, c.out_shape)
        c_in, cout_g = c.weight.shape[:2]
        cin_g = c_in // c.groups
        ci = (co // cout_g)[:, None] * cin_g + np.arange(cin_g)[None, :]  # (S, cin_g) absolute input channels
        masks, pos = [], []
        for a, o in enumerate((oz, oy, ox)):
            k = c.weight.shape[2 + a]
            masks.append(conv_transpose.valid_taps(o, c.padding[a], c.dilation[a], c.stride[a], c.X.shape[2 + a], k))
            r = o[:, None] + c.padding[a] - np.arange(k)[None, :] * c.dilation[a]
            pos.append(np.clip(r // c.stride[a], 0, c.X.shape[2 + a] - 1))
        S = idx.size
        m = masks[0][:, None, :, None, None] & masks[1][:, None, None, :, None] & masks[2][:, None, None, None, :]
        L = c.X[n[:, None, None, None, None], ci[:, :, None, None, None], pos[0][:, None, :, None, None],
                pos[1][:, None, None, :, None], pos[2][:, None, None, None, :]]  # fmt: skip
        kd, kh, kw = c.weight.shape[2:]
        R = c.weight[ci[:, :, None, None, None], (co % cout_g)[:, None, None, None, None],
                     np.arange(kd)[None, None, :, None, None], np.arange(kh)[None, None, None, :, None],
                     np.arange(kw)[None, None, None, None, :]]  # fmt: skip
        L = np.where(m, L, 0.0).reshape(S, -1)
        R = np.where(m, R, 0.0).reshape(S, -1)
        has_bias = self.bias is not None
        b = self.bias[co] if has_bias else np.zeros(S)
        return np.ascontiguousarray(L), np.ascontiguousarray(R), np.ascontiguousarray(b, np.float64), has_bias


class Terms(tuple):
    """(L, R, bias, has_bias) of :meth:`Problem.terms`, with the flat indices ``idx`` and the
    ``problem`` they were gathered from (so that a model can gather them again from rounded
    operands, :meth:`Problem.with_inputs`)."""

    def __new__(cls, t, problem, idx):
        self = super().__new__(cls, t)
        self.problem, self.idx = problem, idx
        return self


def _in_prec(p, names) -> int:
    return max(p.ops[k].fmt.prec for k in names)


def evaluate(op, args, kwargs, *, out: Format | None = None, emulate=None) -> Evaluation:
    """The exact evaluation of a call (with ``emulate=(fmt, mode, round_bias)``, on rounded inputs)."""
    pr = problem(op, args, kwargs, out=out)
    values, mag = pr.run(inputs=emulate, want_mag=True)
    return Evaluation(values, mag, pr.n_terms, pr.fmt, pr.shape, pr.axes, pr.bias is not None, pr.in_prec,
                      pr.bias_axis)  # fmt: skip
