"""Backward rules of the poolings (:mod:`refkern.kernels.pool_backward`)."""

from dataclasses import dataclass

import numpy as np

from refkern._arrays import operand
from refkern.kernels._grad import Adjoint, _check_grad


@dataclass
class _PoolCall:
    """A validated pooling backward call: grad_output as float64 planes (P, OH, OW), the input's
    (P, H, W) plane size and shape, its format, whether to return tensors, and the geometry: ``spans``
    and ``dconst`` (averages) or ``idx`` (maxima: the forward's flat indices)."""

    G: np.ndarray
    H: int
    W: int
    shape: tuple
    fmt: object
    as_tensor: bool
    spans: "list | None" = None
    dconst: int = 0
    idx: "np.ndarray | None" = None


def _pool_call(op, g, a, who) -> _PoolCall:
    import refkern.ops as ops
    from refkern.kernels import pool

    nd = 2 if op.endswith("2d") else 1
    fwd = {k: v for k, v in a.items() if k != "return_indices"}
    try:  # the forward validates every argument as torch does, and gives the output's shape (and indices)
        if op.startswith("max_pool"):
            y, idx = ops.get(op).reference(**fwd, return_indices=True)
        else:
            y, idx = ops.get(op).reference(**fwd), None
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{who}: {str(exc)}") from None
    x, X, lead = pool._pool_input(op, a["input"], nd)
    _check_grad(op, g, tuple(y.shape), a["input"], "input", who)
    og = operand(g, "grad_output", who)
    P, H, W = X.shape
    oh = int(y.shape[-2]) if nd == 2 else 1  # named, not -1: a batch of 0 planes (P = 0) has no size to infer
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(P, oh, int(y.shape[-1])))
    c = _PoolCall(G, H, W, tuple(x.shape), x.fmt, x.torch or og.torch)
    if idx is not None:
        c.idx = np.asarray(idx).reshape(G.shape)
        return c
    if op.startswith("adaptive"):
        osz = G.shape[1:]
        c.spans = [[(i * size // o, -(-(i + 1) * size // o), -(-(i + 1) * size // o) - i * size // o)
                    for i in range(o)] for size, o in zip((H, W), osz)]  # fmt: skip
        return c
    k, st, pd, _, ceil_mode = pool._geometry(op, nd, a["kernel_size"], a["stride"], a["padding"], 1, a["ceil_mode"])
    k, st, pd = pool._lift(k, 1), pool._lift(st, 1), pool._lift(pd, 0)
    spans = []
    for ax, size in enumerate((H, W)):
        spans.append([])
        for o in range(G.shape[1 + ax]):  # the forward's windows and divisors (refkern.kernels.pool._avg_pool)
            start = o * st[ax] - pd[ax]
            end = min(start + k[ax], size + pd[ax])
            lo, hi = max(start, 0), min(end, size)
            spans[-1].append((lo, hi, end - start if a["count_include_pad"] else hi - lo))
    c.spans = spans
    c.dconst = int(a.get("divisor_override") or 0)
    return c


def _pool_grads(c: _PoolCall):
    from refkern.kernels.pool_backward import avg_pool_backward, max_pool_backward

    if c.idx is not None:
        return max_pool_backward(c.G, c.idx, c.H, c.W, c.fmt)
    return avg_pool_backward(c.G, c.spans, c.dconst, c.H, c.W, c.fmt)


def _pool(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _pool_call(op, g, a, who)
    return {"input": Adjoint("input", op, (), compute=lambda: deliver(_pool_grads(c)[0].reshape(c.shape), c.fmt,
                                                                       c.as_tensor))}  # fmt: skip
