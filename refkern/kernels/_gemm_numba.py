"""The GEMM's prepared operands (torch.matmul's and F.linear's shapes) and its Numba kernel: what
the wrappers (:mod:`refkern.kernels.gemm`) and the engines (their fallback and self-test) share.
Imports no engine: the engines call it, and the wrappers call the engines."""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.kernels._common import as_f64
from refkern.kernels._element import abs_sum, reduce_element, row_stats

__all__ = ["matmul_operands", "linear_operands", "run_numba"]


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


def run_numba(p, A3, Bt3, ia, ib, bias, out_shape, want_mag=False):
    """The Numba kernel on prepared operands: (values, magnitudes or None) as float64 arrays of out_shape."""
    nb, m, n = len(ia), A3.shape[1], Bt3.shape[1]
    out = np.empty((nb, m, n))
    mag = np.empty((nb, m, n) if want_mag else (1, 1, 1))
    has_bias = bias is not None
    b = bias if has_bias else np.zeros(1)
    _gemm_nt(A3, Bt3, ia, ib, b, has_bias, out, mag, want_mag, *p.kernel_args, _stats(A3), _stats(Bt3))
    return out.reshape(out_shape), (mag.reshape(out_shape) if want_mag else None)


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
    # writable copies always (a few integers): a read-only view where nothing broadcasts would be a kernel
    # signature of its own, one more compilation of _gemm_nt and of the engines' kernels
    ia = np.array(np.broadcast_to(np.arange(na).reshape(ba), batch).reshape(-1), np.int64)
    ib = np.array(np.broadcast_to(np.arange(nb).reshape(bb), batch).reshape(-1), np.int64)
    A3 = np.ascontiguousarray(A2.reshape(na, m, k))
    Bt3 = np.swapaxes(B2.reshape(nb, k, n), 1, 2)
    Bt3 = np.ascontiguousarray(Bt3) if contiguous else Bt3
    shape = batch + ((m,) if A.ndim > 1 else ()) + ((n,) if B.ndim > 1 else ())
    return A3, Bt3, np.ascontiguousarray(ia), np.ascontiguousarray(ib), shape


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
        b = np.array(np.broadcast_to(as_f64(p.ops["bias"]), (out_features,)))  # writable, as ia and ib
    X = as_f64(p.ops["x"]).reshape(1, int(np.prod(sx[:-1], dtype=np.int64)), sx[-1])
    W = as_f64(p.ops["weight"]).reshape(1, out_features, sw[-1])
    shape = tuple(sx[:-1]) + ((out_features,) if len(sw) == 2 else ())
    return X, W, b, shape
