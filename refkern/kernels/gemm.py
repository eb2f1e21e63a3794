"""``refkern.matmul`` and ``refkern.linear``: torch semantics, every output element reduced
by a named method (correctly rounded with the default ``accumulate="exact"``)."""

import numpy as np
from numba import prange

import refkern.engines as engines
from refkern._arrays import is_tensor
from refkern._jit import jit
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.engines import filter as filt
from refkern.kernels._common import as_f64, finish, plan
from refkern.kernels._element import EXACT, abs_sum, reduce_element, row_stats
from refkern.scale._dispatch import dask_in, to_dask

__all__ = ["matmul", "linear", "matmul_operands", "linear_operands", "run_gemm", "run_numba"]

_IB, _JB = 8, 32  # a task computes an 8 x 32 tile: scratch set up once per 256 elements


@jit(parallel=True)
def _gemm_nt(A, Bt, ia, ib, bias, has_bias, out, mag, want_mag, method, narrow, prec, emin, emax, sta, stb):
    """out[t, i, j] = bias[j] + sum_k A[ia[t], i, k] * Bt[ib[t], j, k]; every operand contiguous
    in k. sta / stb: (max, min nonzero) |bits| of every row of A and of Bt. With want_mag,
    mag[t, i, j] = |bias[j]| + sum_k |A B^T| (float64), for the error analysis."""
    nb, m, n = out.shape
    ni = (m + _IB - 1) // _IB
    nj = (n + _JB - 1) // _JB
    for task in prange(nb * ni * nj):
        t = task // (ni * nj)
        i0 = ((task // nj) % ni) * _IB
        j0 = (task % nj) * _JB
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        scratch = np.empty(BLOCK)
        for i in range(i0, min(m, i0 + _IB)):
            ra = ia[t] * m + i
            a = A[ia[t], i]
            for j in range(j0, min(n, j0 + _JB)):
                rb = ib[t] * n + j
                bj = bias[j] if has_bias else 0.0
                b = Bt[ib[t], j]
                out[t, i, j] = reduce_element(
                    a, b, bj, has_bias, method, narrow,
                    sta[ra, 0], sta[ra, 1], stb[rb, 0], stb[rb, 1], prec, emin, emax, acc, scratch,
                )  # fmt: skip
                if want_mag:
                    mag[t, i, j] = abs_sum(a, b, bj)


def _stats(rows3):
    s = np.empty((rows3.shape[0] * rows3.shape[1], 2), np.int64)
    row_stats(rows3.reshape(rows3.shape[0] * rows3.shape[1], rows3.shape[2]), s)
    return s


def run_gemm(p, A3, Bt3, ia, ib, bias, out_shape, want_mag=False, device=None):
    """The exact GEMM on prepared operands: (values, magnitudes or None) as float64 arrays of
    out_shape, by the filtering engine where ``engines.choose`` picks it for ``engine="auto"``
    (exact, float32-or-narrower factors, large enough), else by the Numba kernel
    (:func:`run_numba`). Both give the same values; the magnitudes agree within gamma_K."""
    m, n, k = A3.shape[1], Bt3.shape[1], A3.shape[2]
    if engines.choose("auto", _acc(p), m * len(ia), n, k, device, filterable=filt.applies(p)) == "filter":
        return filt.gemm(p, A3, Bt3, ia, ib, bias, out_shape, want_mag, device)
    return run_numba(p, A3, Bt3, ia, ib, bias, out_shape, want_mag)


def _acc(p):
    return "exact" if p.method == EXACT else "other"


def run_numba(p, A3, Bt3, ia, ib, bias, out_shape, want_mag=False):
    """The Numba kernel on prepared operands: (values, magnitudes or None) as float64 arrays of out_shape."""
    nb, m, n = len(ia), A3.shape[1], Bt3.shape[1]
    out = np.empty((nb, m, n))
    mag = np.empty((nb, m, n) if want_mag else (1, 1, 1))
    has_bias = bias is not None
    b = bias if has_bias else np.zeros(1)
    _gemm_nt(A3, Bt3, ia, ib, b, has_bias, out, mag, want_mag, *p.kernel_args, _stats(A3), _stats(Bt3))
    return out.reshape(out_shape), (mag.reshape(out_shape) if want_mag else None)


def _device(*xs):
    """The device of the first tensor argument not on the CPU (None: compute on the CPU)."""
    for x in xs:
        if is_tensor(x) and x.device.type != "cpu":
            return x.device
    return None


def _run(p, engine, A3, Bt3, ia, ib, bias, shape, device, names):
    """run_gemm's values, by the engine that ``engine`` names for this GEMM; ``names``: the
    operands of A3, Bt3 and the bias."""
    m, n, k = A3.shape[1], Bt3.shape[1], A3.shape[2]
    chosen = engines.choose(engine, _acc(p), m * len(ia), n, k, device, filterable=filt.applies(p))
    if chosen != "filter":
        Bt3 = np.ascontiguousarray(Bt3)  # matmul's operands may hold B^T as a view (the filter takes it so)
    if chosen == "blas":
        from refkern.engines.blas import run_batched

        formats = tuple(p.ops[k].fmt if p.ops.get(k) is not None else None for k in names)
        return run_batched(p, A3, Bt3, ia, ib, bias, shape, formats, device)
    if chosen == "filter":
        return filt.gemm(p, A3, Bt3, ia, ib, bias, shape, device=device)[0]
    return run_numba(p, A3, Bt3, ia, ib, bias, shape)[0]


def matmul(a, b, *, accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):
    """Reference ``a @ b`` with ``torch.matmul`` semantics.

    1-D operands are promoted to a row (a) or a column (b) and the added dimension removed
    from the result (1-D @ 1-D is a 0-d dot product); batch dimensions broadcast as in torch.
    Inputs may be numpy arrays or torch tensors of float16, bfloat16, float32 or float64, both
    of one dtype (torch raises on mixed dtypes, and so does refkern); the result is a numpy
    array, or a CPU tensor if any input is one.

    With ``accumulate="exact"`` every element is the exact sum of its K products rounded once
    (to nearest even) to the result dtype; see :func:`refkern.dot` for what that includes.
    The other methods (``"naive"``, ``"pairwise"``, ``"kahan"``, ``"neumaier"``, ``"dot2"``)
    compute each element in ``accum_dtype`` (default: the result dtype) over k = 0..K-1;
    their bounds are in :mod:`refkern.accumulate.methods`.

    ``engine``: ``"numba"`` (the jitted kernels), ``"filter"`` (one float64 GEMM on the BLAS, a
    rigorous bound per element, the undecided elements exact: :mod:`refkern.engines.filter`;
    float16/bfloat16/float32 inputs, ``accumulate="exact"``), ``"blas"`` (exact Ozaki slices on
    torch's BLAS, on the device of the tensors; ``accumulate="exact"`` only) or ``"auto"`` (the
    rule in :mod:`refkern.engines`: the filter where it applies). All give bit-identical results.
    """
    if dask_in(a, b):  # lazy, the same bits for every chunking (refkern.scale.array)
        return to_dask("matmul", a, b, accumulate=accumulate, accum_dtype=accum_dtype, engine=engine)
    engines.check_engine("matmul", engine, accumulate)
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), accumulate, accum_dtype)
    A3, Bt3, ia, ib, shape = matmul_operands(p, contiguous=False)
    return finish(p, _run(p, engine, A3, Bt3, ia, ib, None, shape, _device(a, b), ("a", "b", "bias")))


def matmul_operands(p, contiguous=True):
    """torch.matmul's shapes: (A3 (Ba, M, K), B^T as Bt3 (Bb, N, K), batch maps ia, ib, result shape);
    with ``contiguous=False`` Bt3 may be a transposed view of B (no copy)."""
    op = p.op
    sa, sb = p.ops["a"].shape, p.ops["b"].shape
    if len(sa) == 0 or len(sb) == 0:
        raise ValueError(f"{op}: both arguments need at least 1 dimension; got a.shape={sa} and b.shape={sb}.")
    A, B = as_f64(p.ops["a"]), as_f64(p.ops["b"])
    A2 = A[None, :] if A.ndim == 1 else A
    B2 = B[:, None] if B.ndim == 1 else B
    if A2.shape[-1] != B2.shape[-2]:
        raise ValueError(f"{op}: inner dimensions must match; got a.shape={sa} and b.shape={sb}.")
    try:
        batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: batch dimensions must broadcast; got a.shape={sa} and b.shape={sb}.") from None
    m, k, n = A2.shape[-2], A2.shape[-1], B2.shape[-1]
    ba, bb = A2.shape[:-2], B2.shape[:-2]
    na, nb = int(np.prod(ba, dtype=np.int64)), int(np.prod(bb, dtype=np.int64))
    ia = np.broadcast_to(np.arange(na).reshape(ba), batch).reshape(-1)
    ib = np.broadcast_to(np.arange(nb).reshape(bb), batch).reshape(-1)
    A3 = np.ascontiguousarray(A2.reshape(na, m, k))
    Bt3 = np.swapaxes(B2.reshape(nb, k, n), 1, 2)
    Bt3 = np.ascontiguousarray(Bt3) if contiguous else Bt3
    shape = batch + ((m,) if A.ndim > 1 else ()) + ((n,) if B.ndim > 1 else ())
    return A3, Bt3, np.ascontiguousarray(ia), np.ascontiguousarray(ib), shape


def linear(x, weight, bias=None, *, accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):
    """Reference ``torch.nn.functional.linear``: ``y[..., o] = bias[o] + sum_k x[..., k] weight[o, k]``.

    ``x`` has shape (..., in_features), ``weight`` (out_features, in_features) (or
    (in_features,), giving shape (...)), ``bias`` (out_features,) or 0-d. The bias is a
    term of the sum: with ``accumulate="exact"`` each output is the exact value of
    ``bias + sum of products`` rounded once, which is why it generally differs from the
    result without bias plus the bias (two roundings). The other methods add the bias as
    the last term, in their working format. ``engine``: as in :func:`matmul`.
    """
    engines.check_engine("linear", engine, accumulate)
    p = plan("linear", {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), accumulate, accum_dtype)
    X, W, b, shape = linear_operands(p)
    zero = np.zeros(1, np.int64)
    return finish(p, _run(p, engine, X, W, zero, zero, b, shape, _device(x, weight, bias), ("x", "weight", "bias")))


def linear_operands(p):
    """F.linear's shapes: (X (1, M, in), W (1, out, in), bias (out,) or None, result shape)."""
    op = p.op
    sx, sw = p.ops["x"].shape, p.ops["weight"].shape
    if len(sx) == 0:
        raise ValueError(f"{op}: input must have at least 1 dimension (..., in_features); got x.shape={sx}.")
    if len(sw) not in (1, 2):
        raise ValueError(
            f"{op}: weight must have shape (out_features, in_features) or (in_features,); got weight.shape={sw}."
        )
    if sx[-1] != sw[-1]:
        raise ValueError(
            f"{op}: the last dimension of x must equal in_features; got x.shape={sx} and weight.shape={sw}."
        )
    out_features = sw[0] if len(sw) == 2 else 1
    b = None
    if p.ops["bias"] is not None:
        sb = p.ops["bias"].shape
        if sb not in ((out_features,), ()) or (len(sw) == 1 and sb != ()):
            want = f"({out_features},) or ()" if len(sw) == 2 else "()"
            raise ValueError(f"{op}: bias must have shape {want}; got bias.shape={sb}.")
        b = np.ascontiguousarray(np.broadcast_to(as_f64(p.ops["bias"]), (out_features,)))
    X = as_f64(p.ops["x"]).reshape(1, int(np.prod(sx[:-1], dtype=np.int64)), sx[-1])
    W = as_f64(p.ops["weight"]).reshape(1, out_features, sw[-1])
    shape = tuple(sx[:-1]) + ((out_features,) if len(sw) == 2 else ())
    return X, W, b, shape
