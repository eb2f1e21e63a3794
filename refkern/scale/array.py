"""Dask arrays in, Dask arrays out: refkern's exact reductions and products on chunked arrays.

``refkern.sum``, ``mean``, ``var``, ``std``, ``cumsum``, ``dot`` and ``matmul`` come here when an
argument is a ``dask.array.Array``. Nothing is computed at call time and no Dask array is ever
converted with ``np.asarray``: each chunk becomes an exact state (:mod:`refkern.scale._states`),
states merge exactly in Dask's own tree reduction (``split_every`` as in ``dask.array.sum``),
and the merged state is rounded once. cumsum scans the chunk states exactly along the axis and
rounds every prefix once; matmul sums the exact states of K's chunks. The computed value is, bit
for bit, what the same function returns on the computed numpy arrays, for every chunking,
split_every, scheduler and worker count.
"""

import math
from fractions import Fraction

import numpy as np

from refkern._arrays import format_of, operand, same_dtype
from refkern.accumulate.formats import BFLOAT16, round_array
from refkern.kernels._common import deliver
from refkern.kernels.reduction import _correction, reduced_dims
from refkern.scale import INSTALL
from refkern.scale._states import (
    State,
    cumsum_from,
    gemm_tile,
    mean_states,
    merge,
    merge_all,
    round_states,
    row_states,
    var_states,
)

__all__ = ["sum", "mean", "var", "std", "cumsum", "dot", "matmul", "require"]


def require(what: str):
    """``dask.array``, or an ImportError that says in one line how to install it."""
    try:
        import dask.array as da
    except ImportError:
        raise ImportError(f"{what} needs Dask, an optional extra: {INSTALL}") from None
    return da


def _out_dtype(fmt):
    if fmt is BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(fmt.name)


def _in_format(x, name, op):
    """The format of a Dask array's dtype (validated as refkern validates numpy arrays)."""
    return operand(np.empty(0, x.dtype), name, op).fmt


def _values(block, op, fmt_in, fmt):
    """A block as exact float32/float64 values, rounded first when ``fmt`` is narrower (torch's
    ``dtype=``); float16 and bfloat16 widen to float32."""
    v = operand(block, "x", op).values
    if fmt.prec < fmt_in.prec:
        v = round_array(np.ascontiguousarray(v, np.float64), *fmt.params)
    return v


def _rows(v, dims):
    """(X, keepdims shape): the reduced axes moved last and flattened; X contiguous, dtype kept."""
    keep = [a for a in range(v.ndim) if a not in dims]
    moved = np.transpose(v, keep + list(dims))
    R = math.prod(v.shape[a] for a in keep)
    n = math.prod(v.shape[a] for a in dims)
    shape = tuple(1 if a in dims else v.shape[a] for a in range(v.ndim))
    return np.ascontiguousarray(moved).reshape(R, n), shape


def _flat(parts):
    if isinstance(parts, (list, tuple)) and not isinstance(parts, State) and not _is_pair(parts):
        out = []
        for p in parts:
            out.extend(_flat(p))
        return out
    return [parts]


def _is_pair(p):
    return isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, State) for s in p)


def _exact_only(op, accumulate, accum_dtype):
    if accumulate != "exact" or accum_dtype is not None:
        raise ValueError(
            f"{op}: only accumulate='exact' gives one result for every chunking of a Dask array; got "
            f"accumulate={accumulate!r}, accum_dtype={accum_dtype!r}. Compute the array first "
            "(x.compute()) to emulate a method in one order."
        )


def _finish(out64, dims, keepdims, fmt):
    if not keepdims:
        out64 = out64.reshape(tuple(s for a, s in enumerate(out64.shape) if a not in dims))
    return deliver(out64, fmt, False)


def _reduction(op, x, dims, keepdim, fmt, chunk, finalize, split_every):
    da = require(f"refkern.{op}")
    dtype = _out_dtype(fmt)
    out_ndim = x.ndim if keepdim else x.ndim - len(dims)

    def combine(parts, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:
            return parts
        parts = _flat(parts)
        if _is_pair(parts[0]):
            return (merge_all(p[0] for p in parts), merge_all(p[1] for p in parts))
        return merge_all(parts)

    def aggregate(parts, axis=None, keepdims=False, computing_meta=False):
        if computing_meta:
            return np.empty((0,) * out_ndim, dtype)
        return _finish(finalize(combine(parts)), dims, keepdims, fmt)

    return da.reduction(x, chunk, aggregate, axis=dims, keepdims=keepdim, dtype=dtype, split_every=split_every,
                        combine=combine, concatenate=False, meta=np.empty((0,) * out_ndim, dtype),
                        name=f"refkern-{op}")  # fmt: skip


def _zero_d(op, x, func, **kw):
    """A 0-d Dask array: the numpy function on its one block."""
    from refkern.kernels import reduction

    fmt = kw.pop("_fmt")
    return x.map_blocks(lambda b: np.asarray(getattr(reduction, func)(b, **kw)), dtype=_out_dtype(fmt),
                        meta=np.empty((), _out_dtype(fmt)))  # fmt: skip


def sum(x, dim=None, keepdim=False, *, dtype=None, accumulate="exact", accum_dtype=None, split_every=None):  # noqa: A001
    """``refkern.sum`` of a Dask array, lazily: the exact sum of each chunk's terms as a state,
    states merged exactly, rounded once (see :func:`refkern.sum` for the rules)."""
    op = "sum"
    require(f"refkern.{op}")
    _exact_only(op, accumulate, accum_dtype)
    fmt_in = _in_format(x, "x", op)
    fmt = fmt_in if dtype is None else format_of(dtype, "dtype", op)
    dims = reduced_dims(dim, x.ndim, op)
    if x.ndim == 0:
        return _zero_d(op, x, "sum", dtype=dtype, _fmt=fmt)
    n = math.prod(x.shape[a] for a in dims)

    def chunk(block, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:  # dask asks for the block type: an array, not a state
            return block
        return row_states(*_rows(_values(block, op, fmt_in, fmt), dims))

    return _reduction(op, x, dims, keepdim, fmt, chunk, lambda s: round_states(s, n, fmt), split_every)


def mean(x, dim=None, keepdim=False, *, dtype=None, split_every=None):
    """``refkern.mean`` of a Dask array, lazily: the exact merged sum divided by n, rounded once."""
    op = "mean"
    require(f"refkern.{op}")
    fmt_in = _in_format(x, "x", op)
    fmt = fmt_in if dtype is None else format_of(dtype, "dtype", op)
    dims = reduced_dims(dim, x.ndim, op)
    if x.ndim == 0:
        return _zero_d(op, x, "mean", dtype=dtype, _fmt=fmt)
    n = math.prod(x.shape[a] for a in dims)

    def chunk(block, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:  # dask asks for the block type: an array, not a state
            return block
        return row_states(*_rows(_values(block, op, fmt_in, fmt), dims))

    return _reduction(op, x, dims, keepdim, fmt, chunk, lambda s: mean_states(s, n, fmt), split_every)


def _var_std(op, x, dim, correction, keepdim, want_std, split_every):
    require(f"refkern.{op}")
    fmt = _in_format(x, "x", op)
    corr = _correction(correction, op)
    dims = reduced_dims(dim, x.ndim, op)
    if x.ndim == 0:
        return _zero_d(op, x, op, correction=correction, _fmt=fmt)
    n = math.prod(x.shape[a] for a in dims)

    def chunk(block, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:  # dask asks for the block type: an array, not a state
            return block
        X, shape = _rows(_values(block, op, fmt, fmt), dims)
        return (row_states(X, shape), row_states(X, shape, X))  # sum x, sum x*x: both exact

    return _reduction(op, x, dims, keepdim, fmt, chunk,
                      lambda sq: var_states(sq[0], sq[1], n, Fraction(corr), fmt, want_std), split_every)  # fmt: skip


def var(x, dim=None, *, correction=1, keepdim=False, split_every=None):
    """``refkern.var`` of a Dask array, lazily: exact merged sums of x and x**2, then
    M2 = sum x**2 - (sum x)**2 / n exactly, divided by n - correction, rounded once."""
    return _var_std("var", x, dim, correction, keepdim, False, split_every)


def std(x, dim=None, *, correction=1, keepdim=False, split_every=None):
    """``refkern.std`` of a Dask array: the real square root of :func:`var`'s real value, rounded once."""
    return _var_std("std", x, dim, correction, keepdim, True, split_every)


# cumsum: the states of the chunks along the axis scanned exactly; each chunk then rounds
# every prefix once, starting from the exact sum of the chunks before it.


def _moved_rows(v, axis):
    moved = np.moveaxis(v, axis, -1)
    R = math.prod(moved.shape[:-1])
    return np.ascontiguousarray(moved, np.float64).reshape(R, moved.shape[-1]), moved.shape


def _cumsum_state(block, axis, op, fmt_in, fmt):
    X, _ = _moved_rows(_values(block, op, fmt_in, fmt), axis)
    return row_states(X, (X.shape[0],))


def _zero_state(rows):
    return State(0, np.zeros((rows, 0), np.int64), np.zeros((rows, 3), np.int64), np.ones(rows, np.bool_), (rows,))


def _cumsum_block(block, prefix, axis, op, fmt_in, fmt):
    X, shape = _moved_rows(_values(block, op, fmt_in, fmt), axis)
    out = cumsum_from(X, prefix, fmt).reshape(shape)
    return deliver(np.moveaxis(out, -1, axis), fmt, False)


def cumsum(x, dim, *, dtype=None):
    """``refkern.cumsum`` of a Dask array, lazily: every prefix sum exact, rounded once, the same
    bits for every chunking (the chunk totals are scanned as exact states, never as floats)."""
    op = "cumsum"
    da = require(f"refkern.{op}")
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    if dim is None or not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"cumsum: dim must be an int; got {dim!r}.")
    fmt_in = _in_format(x, "x", op)
    fmt = fmt_in if dtype is None else format_of(dtype, "dtype", op)
    if x.ndim == 0:
        reduced_dims(dim, 0, op)
        return _zero_d(op, x, "cumsum", dim=dim, dtype=dtype, _fmt=fmt)
    (axis,) = reduced_dims(dim, x.ndim, op)
    token = tokenize(x, axis, fmt.name, fmt_in.name)
    sname, pname, name = (f"refkern-cumsum-{k}-{token}" for k in ("state", "prefix", "out"))
    ds, dp, do = {}, {}, {}
    for idx in np.ndindex(*x.numblocks):
        rows = math.prod(x.chunks[a][idx[a]] for a in range(x.ndim) if a != axis)
        ds[(sname, *idx)] = (_cumsum_state, (x.name, *idx), axis, op, fmt_in, fmt)
        if idx[axis] == 0:
            dp[(pname, *idx)] = (_zero_state, rows)
        else:
            prev = idx[:axis] + (idx[axis] - 1,) + idx[axis + 1 :]
            dp[(pname, *idx)] = (merge, (pname, *prev), (sname, *prev))  # an exact scan
        do[(name, *idx)] = (_cumsum_block, (x.name, *idx), (pname, *idx), axis, op, fmt_in, fmt)
    g = HighLevelGraph.from_collections(sname, ds, dependencies=[x])
    g = HighLevelGraph({**g.layers, pname: dp}, {**g.dependencies, pname: {sname}})
    g = HighLevelGraph({**g.layers, name: do}, {**g.dependencies, name: {pname, *x.__dask_layers__()}})
    dt = _out_dtype(fmt)
    return da.Array(g, name, chunks=x.chunks, dtype=dt, meta=np.empty((0,) * x.ndim, dt))


# dot and matmul


def _no_empty_chunks(x):
    """x without its zero-length chunks (Dask's blockwise and stack mis-shape their output when
    an operand has some; the values do not depend on the chunks)."""
    chunks = tuple(tuple(c for c in cs if c) or (0,) for cs in x.chunks)
    return x if chunks == x.chunks else x.rechunk(chunks)


def _check_pair(op, x, y, nx="x", ny="y"):
    da = require(f"refkern.{op}")
    x = x if isinstance(x, da.Array) else da.from_array(np.asarray(x))  # only numpy partners: never a dask array
    y = y if isinstance(y, da.Array) else da.from_array(np.asarray(y))
    fx, fy = operand(np.empty(0, x.dtype), nx, op), operand(np.empty(0, y.dtype), ny, op)
    same_dtype(op, {nx: fx, ny: fy})
    return da, _no_empty_chunks(x), _no_empty_chunks(y), fx.fmt


def dot(x, y, *, accumulate="exact", accum_dtype=None, split_every=None):
    """``refkern.dot`` of Dask arrays (or one Dask and one numpy array), lazily: the exact sum of
    each aligned chunk's products as a state, merged exactly, rounded once."""
    op = "dot"
    _exact_only(op, accumulate, accum_dtype)
    da, x, y, fmt = _check_pair(op, x, y)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"{op}: expected 1-D inputs; got x.shape={x.shape} and y.shape={y.shape}.")
    if x.shape != y.shape:
        raise ValueError(f"{op}: x and y must have the same length; got x.shape={x.shape} and y.shape={y.shape}.")
    n = x.shape[0]
    if n == 0:  # an empty sum, +0 (Dask cannot align two different chunkings of nothing)
        return da.zeros((), dtype=_out_dtype(fmt))
    z = da.stack([x, y.rechunk(x.chunks)]).rechunk({0: 2})

    def chunk(block, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:  # dask asks for the block type: an array, not a state
            return block
        v = operand(block, "x", op).values
        return row_states(v[0:1], (1, 1), v[1:2])

    return _reduction(op, z, (0, 1), False, fmt, chunk, lambda s: round_states(s, n, fmt), split_every)


def _matmul_block(a_blocks, b_blocks, fmt, K, op):
    a_blocks = a_blocks if isinstance(a_blocks, list) else [a_blocks]
    b_blocks = b_blocks if isinstance(b_blocks, list) else [b_blocks]
    pairs = []
    lead = a_blocks[0].shape[:-2]
    M, N = a_blocks[0].shape[-2], b_blocks[0].shape[-1]
    for A, B in zip(a_blocks, b_blocks):
        va = operand(A, "a", op).values
        vb = operand(B, "b", op).values
        Kb, nb = va.shape[-1], math.prod(lead)
        pairs.append((np.ascontiguousarray(va.reshape(nb, M, Kb)),
                      np.ascontiguousarray(np.swapaxes(vb.reshape(nb, Kb, N), 1, 2))))  # fmt: skip
    out = gemm_tile(pairs, K, fmt)
    return deliver(out.reshape(*lead, M, N), fmt, False)


def matmul(a, b, *, accumulate="exact", accum_dtype=None, engine="auto"):
    """``refkern.matmul`` of Dask arrays, lazily (torch.matmul's shapes): each output block sums
    the exact states of K's chunks and rounds once. ``engine`` does not change a bit; the
    chunks run on refkern's numba kernels."""
    op = "matmul"
    _exact_only(op, accumulate, accum_dtype)
    da, a, b, fmt = _check_pair(op, a, b, "a", "b")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"{op}: both arguments need at least 1 dimension; got a.shape={a.shape} and b.shape={b.shape}."
        )
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"{op}: inner dimensions must match; got a.shape={a.shape} and b.shape={b.shape}.")
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(
            f"{op}: batch dimensions must broadcast; got a.shape={a.shape} and b.shape={b.shape}."
        ) from None
    if a2.shape[:-2] != batch:
        a2 = da.broadcast_to(a2, batch + a2.shape[-2:])
    if b2.shape[:-2] != batch:
        b2 = da.broadcast_to(b2, batch + b2.shape[-2:])
    K = a2.shape[-1]
    bi = tuple(f"b{i}" for i in range(len(batch)))
    dt = _out_dtype(fmt)
    if K == 0:  # every element an empty sum, +0 (Dask's blockwise loses blocks of a zero-length contraction)
        chunks = da.core.broadcast_chunks(a2.chunks[:-2], b2.chunks[:-2]) + (a2.chunks[-2], b2.chunks[-1])
        out = da.zeros(batch + (a2.shape[-2], b2.shape[-1]), dtype=dt, chunks=chunks)
    else:
        out = da.blockwise(_matmul_block, (*bi, "i", "j"), a2, (*bi, "i", "k"), b2, (*bi, "k", "j"), dtype=dt,
                           concatenate=False, meta=np.empty((0,) * (len(bi) + 2), dt), fmt=fmt, K=K, op=op)  # fmt: skip
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out
