"""torch's CUDA scans of half tensors, emulated on the very inputs: the evidence that names their precision.

torch's CUDA cumsum adds in the tensor's own type (``std::plus<scalar_t>``: ATen's ``Cumsum.cu`` hands it to
``scan_dim`` of ``ScanUtils.cuh``), and c10's ``BFloat16`` and ``Half`` operators compute ``a + b`` in float32 and
round the float32 sum to the format, so every addition of the running sum is rounded twice: to float32, then to
the half format (:func:`_add`). Which additions, and in what order, ``scan_dim`` chooses from the shape alone:

* the scanned dimension the innermost of several rows (``tensor_kernel_scan_innermost_dim``): ``num_threads_x =
  2**lx`` threads per row, ``lx = clamp((9 + ceil(log2 n) - ceil(log2 rows)) // 2, 4, 9)``
  (``get_log_num_threads_x_inner_scan``); each row in tiles of ``2 num_threads_x`` values, the running total of
  the tiles before added to the tile's first value, then Sklansky's scan within the tile (level ``m``: thread
  ``t`` adds element ``a - 1`` into ``a + t mod 2**m``, ``a = (t >> m) << (m + 1) | 2**m``), the tile's last
  value the next total (:func:`_innermost`);
* another dimension (``tensor_kernel_scan_outer_dim``): one thread per inner row, the running sum left to right
  (:func:`_outer`);
* a tensor holding one row (``numel == size(dim)``): CUB's ``InclusiveScan``, whose tiles depend on the CUB
  version and the device's tuning: not emulated (the statistical test alone judges it).

**Why an emulation is evidence.** A half running sum's scale is wide enough to hide a bug of a hundred spreads
of a float32-accumulated result, so the verdict names the precision by its scale only past the breakdown point
(:mod:`refkern.analysis.noise_scan`). A result equal bit for bit to the kernel above on the very inputs is that
kernel's own output: a bug would have to reproduce each of its roundings (on 4 x 8192 bfloat16 values, about
96,000 roundings to bfloat16 and as many to float32). Seen on an NVIDIA H200 (torch 2.11, benchmarks/gpu_check.py):
torch's bfloat16 cumsum of 4 x 8192 randn values along the last dimension equals :func:`torch_cuda_cumsum`'s
bits, every element, where the float32 family left 6% of them unexplained (up to 12,500 ulp): it was called a
``mismatch``. The emulation is computed only where the verdict is about to refuse the half precision, and
compared once (:func:`matches`)."""

import numpy as np

from refkern._jit import jit
from refkern.accumulate.formats import round_to

__all__ = ["KERNELS", "log_threads_x", "torch_cuda_cumsum", "matches"]

KERNELS = {
    "innermost": "torch's CUDA scan of the innermost dimension (ScanUtils.cuh: tiles of 2 x {threads} values, "
    "Sklansky's scan within a tile, the tiles' running total carried), every addition in {fmt}",
    "outer": "torch's CUDA scan of an outer dimension (ScanUtils.cuh: one thread per inner row, left to right), "
    "every addition in {fmt}",
}


def log_threads_x(rows: int, n: int) -> int:
    """``get_log_num_threads_x_inner_scan(rows, n)`` of ATen's ScanUtils.cuh (module docstring)."""
    lx = max(0, int(n - 1).bit_length())  # ceil(log2 n): the smallest lx with 2**lx >= n
    ly = max(0, int(rows - 1).bit_length())
    return min(max(4, (9 + lx - ly) // 2), 9)


@jit(inline="always")
def _add(a, b, prec, emin, emax):
    """c10's ``scalar_t + scalar_t`` for a half format: the float32 sum of two format values, rounded to the
    format (two roundings, as the hardware does them)."""
    return round_to(np.float64(np.float32(a) + np.float32(b)), prec, emin, emax)


@jit
def _innermost(X, lx, prec, emin, emax, out):
    """tensor_kernel_scan_innermost_dim on the rows of X (R, n), float64 arrays of format values (module
    docstring). Within one Sklansky level the element read (``a - 1``) is never one written, so the threads'
    order inside a level does not matter and a loop stands for them."""
    R, n = X.shape
    nx = 1 << lx
    tile = 2 * nx
    buf = np.empty(tile)
    for r in range(R):
        total = 0.0
        for c0 in range(0, n, tile):
            for k in range(tile):
                buf[k] = X[r, c0 + k] if c0 + k < n else 0.0
            buf[0] = _add(buf[0], total, prec, emin, emax)
            for m in range(lx + 1):
                s = 1 << m
                for t in range(nx):
                    a = ((t >> m) << (m + 1)) | s
                    ti = a + (t % s)
                    buf[ti] = _add(buf[ti], buf[a - 1], prec, emin, emax)
            for k in range(min(tile, n - c0)):
                out[r, c0 + k] = buf[k]
            total = buf[tile - 1]


@jit
def _outer(X, prec, emin, emax, out):
    """tensor_kernel_scan_outer_dim on the rows of X (R, n): ``acc = acc + x`` left to right from 0."""
    R, n = X.shape
    for r in range(R):
        acc = 0.0
        for k in range(n):
            acc = _add(acc, X[r, k], prec, emin, emax)
            out[r, k] = acc


def torch_cuda_cumsum(x, dim: int, fmt):
    """(values, kernel) of torch's CUDA ``cumsum(x, dim)`` for a half format ``fmt`` (float16, bfloat16): ``x`` a
    float64 array of the format's values, ``values`` a float64 array of x's shape, ``kernel`` a key of KERNELS;
    None where torch would run CUB's one-row scan (not emulated)."""
    x = np.asarray(x, np.float64)
    if x.ndim == 0 or x.size == 0 or x.size == x.shape[dim]:
        return None
    dim = dim % x.ndim
    moved = np.moveaxis(x, dim, -1)
    X = np.ascontiguousarray(moved.reshape(-1, x.shape[dim]))
    out = np.empty(X.shape)
    prec, emin, emax = fmt.params
    if dim == x.ndim - 1:
        kernel = "innermost"
        _innermost(X, log_threads_x(X.shape[0], X.shape[1]), prec, emin, emax, out)
    else:
        kernel = "outer"
        _outer(X, prec, emin, emax, out)
    return np.moveaxis(out.reshape(moved.shape), -1, dim), kernel


def matches(actual, x, dim: int, fmt, reverse: bool = False):
    """The text naming the kernel of KERNELS whose emulation ``actual`` equals bit for bit (NaN with NaN, each
    zero's sign), or None. ``reverse``: the result is ``flip(cumsum(flip(x)))`` (cumsum's gradient in torch's
    autograd, ``reversed_cumsum``)."""
    x = np.asarray(x, np.float64)
    xs = np.flip(x, dim) if reverse else x
    got = torch_cuda_cumsum(xs, dim, fmt)
    if got is None:
        return None
    values, kernel = got
    if reverse:
        values = np.flip(values, dim)
    a = np.asarray(actual, np.float64)
    if a.size != values.size:
        return None
    a = a.reshape(values.shape)  # the verdict's arrays may be flat
    same = (a == values) & (np.signbit(a) == np.signbit(values)) | (np.isnan(a) & np.isnan(values))
    if not same.all():
        return None
    threads = 1 << log_threads_x(x.size // max(x.shape[dim], 1), x.shape[dim])
    return KERNELS[kernel].format(threads=threads, fmt=fmt.name)
