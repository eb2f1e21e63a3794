"""``avg_pool1d``/``avg_pool2d`` of integers as torch's CPU computes them: int64 only (torch 2.13's CPU kernels
refuse uint8, int8, int16, int32 and bool: ``"avg_pool2d" not implemented for 'Int'``), in int64 arithmetic.

torch's kernel (aten/src/ATen/native/cpu/AvgPoolKernel.cpp, ``acc_t = opmath_type<int64_t> = int64_t``) sums the
window in int64, wrapping modulo ``2**64`` in two's complement, and divides the sum by the divisor with C++'s
integer division, which truncates toward zero: ``out = trunc(S / d)`` with ``S`` the window's exact sum reduced
to ``[-2**63, 2**63)`` modulo ``2**64`` and ``d`` the window's count (``count_include_pad``, ``ceil_mode``: the
float kernel's windows, :func:`refkern.kernels.pool.avg_spans`) or ``divisor_override`` (negative allowed).
Measured against torch 2.13 CPU (tests/test_integer_pools.py): windows (-7, 3) give -2 (floor would give -3),
``divisor_override=-3`` of (-7, 3) gives 1, two 2**62 give -2**62 (their sum wraps to -2**63), four give 0.

The sum modulo ``2**64`` does not depend on the order of the additions (a ring), so this result is defined to
the bit; the kernel sums in uint64 (wrapping by definition) and divides the signed value exactly. The one
quotient int64 cannot hold, ``-2**63 / -1`` (``divisor_override=-1``), traps in torch's kernel (SIGFPE); here
it wraps to ``-2**63``."""

import numpy as np

from refkern._jit import jit
from refkern.kernels.pool import avg_spans, pool_shape, shaped

__all__ = ["avg_pool1d", "avg_pool2d"]


@jit
def _window_quotients(X, h0, h1, dh, w0, w1, dw, dconst, out):
    """out[p, i, j] = trunc(S / d): S the sum of X[p, h0[i]:h1[i], w0[j]:w1[j]] modulo 2**64 as a signed int64,
    d = dconst if nonzero, else dh[i] * dw[j]."""
    for p in range(X.shape[0]):
        for i in range(h0.size):
            for j in range(w0.size):
                s = np.uint64(0)
                for h in range(h0[i], h1[i]):
                    for w in range(w0[j], w1[j]):
                        s += X[p, h, w]
                v = np.int64(s)
                d = dconst if dconst != 0 else dh[i] * dw[j]
                q = v // d  # floor; truncation differs where the division is inexact and the signs differ
                if q * d != v and (v < 0) != (d < 0):
                    q += 1
                out[p, i, j] = q


def _avg_pool(op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    is_tensor = hasattr(input, "detach")
    dt = str(input.dtype).removeprefix("torch.") if is_tensor else np.asarray(input).dtype.name
    if dt != "int64":
        raise TypeError(f"{op}: an integer input must be int64 (torch's CPU {op} takes no other integer dtype); "
                        f"got input.dtype={dt}.")  # fmt: skip
    x = input.detach().to("cpu").numpy() if is_tensor else np.asarray(input)
    plane, lead = pool_shape(op, tuple(x.shape), nd)
    spans, dconst = avg_spans(op, nd, plane, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)  # fmt: skip
    (h0, h1, dh), (w0, w1, dw) = (tuple(np.asarray(v, np.int64) for v in zip(*sp)) for sp in spans)
    X = np.ascontiguousarray(x.reshape(-1, *plane)).view(np.uint64)
    out = np.empty((X.shape[0], h0.size, w0.size), np.int64)
    _window_quotients(X, h0, h1, dh, w0, w1, dw, np.int64(dconst), out)
    out = shaped(out, lead, nd)
    if is_tensor:
        import torch

        return torch.from_numpy(np.ascontiguousarray(out))
    return out


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):  # noqa: A002
    """``F.avg_pool1d`` of an int64 input: each output ``trunc(S / divisor)``, S the window's sum modulo ``2**64``
    (module docstring); the windows and divisors of :func:`refkern.kernels.pool.avg_pool1d`. A tensor for a
    tensor input, else a numpy array; int64."""
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):  # fmt: skip
    """``F.avg_pool2d`` of an int64 input: as :func:`avg_pool1d` in H and W, the divisor the product of the two
    axes' counts or ``divisor_override`` (a nonzero int, negative allowed)."""
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip
