"""Ground truth of integer results: Python ints, exact at every step, reduced to the result's format only at the
end (:func:`wrap`). The independent check of :mod:`refkern.kernels.integer_gemm` and
:mod:`refkern.kernels.integer_pool`: no numba, no uint64, no shared windows (the pools' geometry is the truth's
own reading, :mod:`refkern.truth.pools`).

* the products: :func:`matmul` (torch.matmul's shapes: numpy's matmul of Python-int objects), :func:`dot`,
  :func:`linear`, :func:`addmm` (``beta input + alpha (mat1 @ mat2)``, batched for baddbmm), exact integers;
* the averages: :func:`avg_pool1d`, :func:`avg_pool2d` of int64, torch's rule: the window's exact sum reduced
  to int64 (two's complement, modulo ``2**64``), then divided with truncation toward zero.

addmm's ``alpha`` and ``beta`` are read by the registry's normaliser (:func:`refkern.ops._args.integer_scale`:
what the arguments mean is the registry's, as for every truth)."""

import math

import numpy as np

from refkern.ops._args import integer_scale
from refkern.truth.pools import _ints, _out_size, _stride

__all__ = ["wrap", "matmul", "dot", "linear", "addmm", "avg_pool1d", "avg_pool2d"]


def _ints_of(v) -> np.ndarray:
    """An integer tensor or array as a numpy array of Python ints, of its shape."""
    a = v.detach().cpu() if hasattr(v, "detach") else np.asarray(v)
    flat = a.reshape(-1).tolist()
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(tuple(a.shape))


def wrap(values, dtype) -> np.ndarray:
    """Python ints reduced to the residues of ``dtype`` (a torch or numpy integer dtype, or its name): two's
    complement ``[-2**(bits-1), 2**(bits-1))`` for the signed ones, ``[0, 2**bits)`` for the unsigned."""
    name = str(dtype).removeprefix("torch.")
    bits = int("".join(c for c in name if c.isdigit()))
    signed = not name.startswith("u")

    def one(v):
        r = int(v) % (1 << bits)
        return r - (1 << bits) if signed and r >= 1 << (bits - 1) else r

    return np.vectorize(one, otypes=[object])(np.asarray(values, dtype=object))


def matmul(a, b) -> np.ndarray:
    """The exact integers of ``torch.matmul(a, b)`` (1-D operands promoted, batch dimensions broadcast)."""
    return np.matmul(_ints_of(a), _ints_of(b))


def dot(x, y) -> np.ndarray:
    """The exact integer ``sum x[i] y[i]``."""
    return np.array(sum((p * q for p, q in zip(_ints_of(x).tolist(), _ints_of(y).tolist())), 0), dtype=object)


def linear(x, weight, bias=None) -> np.ndarray:
    """The exact integers of ``x @ weight^T + bias``."""
    w = _ints_of(weight)
    out = np.matmul(_ints_of(x), w.T if w.ndim == 2 else w)
    return out if bias is None else out + _ints_of(bias)


def addmm(input, mat1, mat2, beta=1, alpha=1) -> np.ndarray:  # noqa: A002
    """The exact integers of ``beta input + alpha (mat1 @ mat2)`` (torch.addmm; baddbmm's batched operands
    alike), alpha and beta as torch converts them for the operands' dtype; a zero scale drops its term."""
    dtype = str(mat1.dtype).removeprefix("torch.")
    sa = integer_scale(alpha, dtype, "alpha", "truth.addmm")
    sb = integer_scale(beta, dtype, "beta", "truth.addmm")
    prod = np.matmul(_ints_of(mat1), _ints_of(mat2))
    out = prod * sa if sa else np.zeros(prod.shape, dtype=object)
    return out + _ints_of(input) * sb if sb else out


def _trunc_div(s: int, d: int) -> int:
    """``s / d`` truncated toward zero (C's integer division)."""
    q = abs(s) // abs(d)
    return q if (s < 0) == (d < 0) else -q


def _avg_pool(op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    x = _ints_of(input)
    if x.ndim not in (nd + 1, nd + 2):
        raise ValueError(f"{op}: input must have {nd + 1} or {nd + 2} dimensions; got input.shape={x.shape}.")
    v = x.reshape(-1, *x.shape[-nd:])
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    s = _stride(op, stride, k, nd)
    p = _ints(op, "padding", padding, nd, 0)
    sizes = v.shape[1:]
    boxes = []  # per dim: (first, last + 1 inside the input, count inside the padded input)
    for a in range(nd):
        dim = []
        for o in range(_out_size(op, sizes[a], k[a], s[a], p[a], 1, ceil_mode)):
            start = o * s[a] - p[a]
            end = min(start + k[a], sizes[a] + p[a])
            dim.append((max(start, 0), min(end, sizes[a]), end - start))
        boxes.append(dim)
    out = np.empty((v.shape[0], *(len(b) for b in boxes)), dtype=object)
    for idx in np.ndindex(*out.shape):
        box = [boxes[a][idx[1 + a]] for a in range(nd)]
        window = v[(idx[0], *(slice(lo, hi) for lo, hi, _ in box))]
        total = int(wrap(sum(window.reshape(-1).tolist(), 0), "int64"))  # torch's int64 sum, wrapped
        if divisor_override is not None:
            d = int(divisor_override)
        elif count_include_pad:
            d = math.prod(n for _, _, n in box)
        else:
            d = math.prod(hi - lo for lo, hi, _ in box)
        out[idx] = _trunc_div(total, d)
    return out.reshape(*x.shape[:-nd], *out.shape[1:])


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):  # noqa: A002
    """torch's ``F.avg_pool1d`` of int64 as Python ints (module docstring)."""
    return _avg_pool("truth.avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):  # fmt: skip
    """torch's ``F.avg_pool2d`` of int64 as Python ints (module docstring)."""
    return _avg_pool("truth.avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip
