"""``refkern.avg_pool3d``: torch's 3-d average pooling, exact; and its int64 form (torch's truncating division).

Name, signature, output size, divisor and argument checks are ``torch.nn.functional.avg_pool3d``'s: input
(C, D, H, W) or (N, C, D, H, W), ``kernel_size``, ``stride`` (None or ``[]``: the kernel size) and ``padding``
an int or a triple, ``padding <= kernel_size // 2``, ``ceil_mode`` (the last window starts inside the input or
its left padding), ``count_include_pad`` (the divisor counts the padded positions inside
``[-padding, size + padding)``), ``divisor_override`` (a nonzero int, negative allowed). The windows are those
of :func:`refkern.kernels.pool.avg_spans`, per axis.

How. A window is a box ``[d0, d1) x [h0, h1) x [w0, w1)``. Its rows ``(d, h)`` are copied, window by window,
into one (P, R, W) array (R the windows' rows together: ``sum over (i_d, i_h) of (d1 - d0)(h1 - h0)``), where
window ``(i_d, i_h)`` holds the contiguous rows ``[r_i, r_i + n_i)``; there each 3-d window is a 2-d window
of :mod:`refkern.kernels.pool`'s kernel (rows ``[r_i, r_i + n_i)``, columns ``[w0, w1)``) with the same
elements, hence the same exact sum S, and the divisor ``count_d count_h * count_w`` (or ``divisor_override``):
every output is that kernel's ``RN(S / divisor)``, rounded once (its docstring has the tiers and their
proofs). A copy changes no value, so nothing is rounded on the way; the copy costs ``kd kh / (sd sh)`` times
the input's memory at most, and no numba signature besides the 2-d kernel's.
"""

import numpy as np

from refkern.kernels._common import deliver
from refkern.kernels.pool import _averages, _pool_input, avg_spans, pool_shape, shaped

__all__ = ["avg_pool3d", "integer_avg_pool3d"]

OP = "avg_pool3d"


def _rows(X, sd, sh):
    """(Y, the row spans): the rows of every (d, h) window of the (P, D, H, W) array X, copied window by
    window into one (P, R, W) array, and per window its rows ``(r, r + n, count_d * count_h)``."""
    blocks, spans, r = [], [], 0
    for d0, d1, cd in sd:
        for h0, h1, ch in sh:
            n = (d1 - d0) * (h1 - h0)
            blocks.append(X[:, d0:d1, h0:h1, :].reshape(X.shape[0], n, X.shape[3]))
            spans.append((r, r + n, cd * ch))
            r += n
    return np.ascontiguousarray(np.concatenate(blocks, axis=1)), spans


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):  # fmt: skip
    """Reference ``F.avg_pool3d`` on (C, D, H, W) or (N, C, D, H, W) input, each output rounded once.

    As :func:`refkern.avg_pool2d` in each of D, H and W (``kernel_size``, ``stride``, ``padding``: an int or
    a triple): window ``(a, b, c)`` covers the input positions of ``[t, t + k)`` per axis (``t = o s - p``,
    cut at ``size + p``), its divisor is the product of the three axes' counts (with ``count_include_pad``
    the padded positions, else the input's), or ``divisor_override``. Every output is ``RN(S / divisor)``
    for the exact sum S of the window's input elements, correctly rounded to the input's dtype (module
    docstring); NaN and inf as IEEE arithmetic on the exact sum; every zero result is +0, as torch's CPU
    kernel gives.
    """
    x, X, lead = _pool_input(OP, input, 3)
    spans, dconst = avg_spans(OP, 3, X.shape[1:], kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)  # fmt: skip
    Y, rows = _rows(X, spans[0], spans[1])
    out = _averages(Y, x.fmt, (rows, spans[2]), dconst)
    out += 0.0  # torch adds the quotient to a zeroed output: every zero result is +0
    out = out.reshape(X.shape[0], len(spans[0]), len(spans[1]), len(spans[2]))
    return deliver(shaped(out, lead, 3), x.fmt, x.torch)


def integer_avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
                       count_include_pad=True, divisor_override=None):  # fmt: skip
    """``F.avg_pool3d`` of an int64 input as torch's CPU kernel computes it: each output ``trunc(S / divisor)``,
    S the window's sum modulo ``2**64`` as a signed int64 (:mod:`refkern.kernels.integer_pool`, whose kernel
    sums the same copied rows as :func:`avg_pool3d`: a sum modulo 2**64 does not depend on the order). A
    tensor for a tensor input, else a numpy array; int64."""
    from refkern.kernels.integer_pool import _window_quotients

    is_tensor = hasattr(input, "detach")
    x = np.ascontiguousarray(input.detach().to("cpu").numpy() if is_tensor else np.asarray(input))
    if x.dtype != np.int64:  # torch 2.13's CPU kernel takes no other integer dtype
        raise TypeError(f"{OP}: an integer input must be int64 (torch's CPU {OP} takes no other integer dtype); "
                        f"got input.dtype={x.dtype}.")  # fmt: skip
    plane, lead = pool_shape(OP, tuple(x.shape), 3)
    spans, dconst = avg_spans(OP, 3, plane, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)  # fmt: skip
    Y, rows = _rows(x.reshape(-1, *plane).view(np.uint64), spans[0], spans[1])
    (h0, h1, dh), (w0, w1, dw) = (tuple(np.asarray(v, np.int64) for v in zip(*sp)) for sp in (rows, spans[2]))
    out = np.empty((Y.shape[0], h0.size, w0.size), np.int64)
    _window_quotients(Y, h0, h1, dh, w0, w1, dw, np.int64(dconst), out)
    out = shaped(out.reshape(Y.shape[0], len(spans[0]), len(spans[1]), w0.size), lead, 3)
    if is_tensor:
        import torch

        return torch.from_numpy(np.ascontiguousarray(out))
    return out
