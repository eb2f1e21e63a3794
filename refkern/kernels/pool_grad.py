"""Backward rules of the poolings (:mod:`refkern.kernels.pool_backward`)."""

from dataclasses import dataclass

import numpy as np

from refkern._arrays import operand
from refkern.kernels._grad import Adjoint, _check_grad


@dataclass
class _PoolCall:
    """A validated pooling backward call: grad_output as float64 planes (P, *out), the input's plane (its
    spatial sizes: (L,), (H, W) or (D, H, W)) and shape, its format, whether to return tensors, and the
    geometry: ``spans`` and ``dconst`` (averages) or ``idx`` (maxima: the forward's flat indices)."""

    G: np.ndarray
    plane: tuple
    shape: tuple
    fmt: object
    as_tensor: bool
    spans: "list | None" = None
    dconst: int = 0
    idx: "np.ndarray | None" = None


def _pool_call(op, g, a, who) -> _PoolCall:
    """The validated call of pool ``op``'s backward; its kind and pooled dimensions are its record's
    (:attr:`refkern.ops.Op.pool`, :attr:`refkern.ops.Op.spatial`)."""
    import refkern.ops as ops
    from refkern.kernels import pool

    rec = ops.get(op)
    nd = rec.spatial
    fwd = {k: v for k, v in a.items() if k != "return_indices"}
    try:  # the forward validates every argument as torch does, and gives the output's shape (and indices)
        if rec.pool == "max":
            y, idx = rec.reference(**fwd, return_indices=True)
        else:
            y, idx = rec.reference(**fwd), None
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{who}: {str(exc)}") from None
    x = operand(a["input"], "input", op)
    plane = tuple(int(n) for n in x.shape[-nd:])
    _check_grad(op, g, tuple(y.shape), a["input"], "input", who)
    og = operand(g, "grad_output", who)
    P = int(np.prod(x.shape[:-nd], dtype=np.int64))
    # the output's sizes named, not -1: a batch of 0 planes (P = 0) has no size to infer
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(P, *(int(n) for n in y.shape[-nd:])))
    c = _PoolCall(G, plane, tuple(x.shape), x.fmt, x.torch or og.torch)
    if idx is not None:
        c.idx = np.asarray(idx).reshape(G.shape)
    elif rec.pool == "adaptive_avg":
        c.spans = [[(i * size // o, -(-(i + 1) * size // o), -(-(i + 1) * size // o) - i * size // o)
                    for i in range(o)] for size, o in zip(plane, G.shape[1:])]  # fmt: skip
    else:  # the forward's windows and divisors
        c.spans, c.dconst = pool.avg_spans(op, nd, pool.pool_shape(op, tuple(x.shape), nd)[0], a["kernel_size"],
                                           a["stride"], a["padding"], a["ceil_mode"], a["count_include_pad"],
                                           a.get("divisor_override"))  # fmt: skip
    return c


def _pool_grads(c: _PoolCall):
    from refkern.kernels.pool_backward import avg_pool_backward, max_pool_backward

    if c.idx is not None:
        return max_pool_backward(c.G, c.idx, c.plane, c.fmt)
    return avg_pool_backward(c.G, c.spans, c.dconst, c.plane, c.fmt)


def _pool(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _pool_call(op, g, a, who)
    return {"input": Adjoint("input", op, (), compute=lambda: deliver(_pool_grads(c)[0].reshape(c.shape), c.fmt,
                                                                       c.as_tensor))}  # fmt: skip
