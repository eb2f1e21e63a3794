"""Backward rules of sum, mean, var, std and cumsum (:mod:`refkern.kernels.reduction_backward`; cumsum:
the forward cumsum of the flipped grad_output)."""

import math
from dataclasses import dataclass

import numpy as np

from refkern._arrays import is_tensor, operand
from refkern.kernels._grad import Adjoint, _flip, grad_output


@dataclass
class _RedCall:
    """A validated reduction backward call: the input's values ``x`` (float64, as given), its format ``fmt``
    (the gradient's), the forward's result format ``fmt_c`` (``dtype=``'s, else ``fmt``), the reduced
    dimensions, grad_output as float64 in the forward's output shape, whether to return tensors."""

    x: np.ndarray
    fmt: object
    fmt_c: object
    dims: tuple
    G: np.ndarray
    as_tensor: bool

    @property
    def n(self) -> int:
        return math.prod(self.x.shape[d] for d in self.dims) if self.x.ndim else 1

    def broadcast(self, v):
        """An output-shaped array back over the reduced dimensions (input-shaped, float64)."""
        kept = tuple(1 if i in self.dims else s for i, s in enumerate(self.x.shape))
        return np.broadcast_to(np.asarray(v, np.float64).reshape(kept), self.x.shape)

    def rows(self):
        """(X (R, n) rows of the reduced elements, the function putting (R, n) back in x's shape)."""
        from refkern.kernels.reduction import rows_of

        X, _ = rows_of(self.x, self.dims, False)
        keep = [i for i in range(self.x.ndim) if i not in self.dims]
        order = keep + list(self.dims)
        moved = tuple(self.x.shape[i] for i in order)

        def back(v):
            return np.transpose(np.asarray(v).reshape(moved), np.argsort(order)) if self.x.ndim else np.asarray(
                v).reshape(())  # fmt: skip

        return X, back


def _red_call(op, g, a, who) -> _RedCall:
    from refkern._arrays import format_of
    from refkern.ops._args import dims as reduced_dims

    o = operand(a["x"], "x", who)
    fmt_c = o.fmt if a.get("dtype") is None else format_of(a["dtype"], "dtype", who)
    x = np.asarray(o.values, np.float64).reshape(o.shape)
    if op == "cumsum":
        dim = a["dim"]
        if dim is None or isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"{who}: cumsum's dim must be an int; got {dim!r}.")
    dims = reduced_dims(a["dim"], x.ndim, who)
    if op == "cumsum":
        shape = x.shape
    elif a.get("keepdim", False):
        shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    og = grad_output(g, op, fmt_c, shape, who)
    G = np.asarray(og.values, np.float64).reshape(shape)
    return _RedCall(x, o.fmt, fmt_c, dims, G, o.torch or og.torch)


def _red_grad(op, c: _RedCall, a) -> np.ndarray:
    """The gradient of sum, mean, var or std as float64 values of the input's format, in x's shape."""
    from refkern.accumulate.formats import round_array

    if op == "sum":  # a copy of g over the reduced dimensions; with dtype=, one conversion
        v = np.array(c.broadcast(c.G))
        return round_array(v, *c.fmt.params) if c.fmt_c is not c.fmt and v.size else v
    if op == "mean":
        from refkern.kernels.reduction_backward import mean_backward_values

        return np.array(c.broadcast(mean_backward_values(c.G, c.n, c.fmt)))
    from refkern.kernels.reduction_backward import var_backward_rows
    from refkern.ops._args import correction as _correction

    X, back = c.rows()
    nodim = a["dim"] is None or c.x.ndim == 0  # torch's var_backward: dim=None (or 0-d) has its own dof <= 0 rule
    out = var_backward_rows(X, c.G.reshape(-1), _correction(a["correction"], "backward"), op == "std", nodim, c.fmt)
    return np.array(back(out))


def _reduction(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _red_call(op, g, a, who)
    return {"x": Adjoint("x", op, (), compute=lambda: deliver(_red_grad(op, c, a), c.fmt, c.as_tensor))}


def _reversed_cumsum(G, axis, fmt):
    """RN(sum_{j >= i} G[..., j, ...]) along ``axis`` of the float64 array G, to ``fmt``."""
    from refkern.kernels.reduction import _cumsum_rows

    moved = np.ascontiguousarray(np.moveaxis(G, axis, -1)[..., ::-1])
    X = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out = np.empty_like(X)
    if X.size:
        _cumsum_rows(X, *fmt.params, out)
    return np.ascontiguousarray(np.moveaxis(out.reshape(moved.shape)[..., ::-1], -1, axis))


def _cumsum(op, g, a, wrt, who):
    """grad_input[i] = sum_{j >= i} grad_output[j] along dim: the forward cumsum of the flipped grad_output,
    flipped back (an adjoint call judged by compare's cumsum). With ``dtype=`` autograd converts grad_output
    to the input's dtype first (``cumsum_backward(grad.to(self.scalar_type()), dim)``): where that is exact
    the adjoint call runs on the converted grad_output; elsewhere, and for a 0-d input, the kernel rounds
    the exact sums of the given grad_output once (judged by :func:`_cumsum_report`)."""
    from refkern.accumulate.formats import round_array
    from refkern.kernels._common import deliver

    c = _red_call(op, g, a, who)
    if c.x.ndim and c.x.size:  # (compare's cumsum envelope does not take an empty input)
        axis = c.dims[0]
        gg = g
        if c.fmt_c is not c.fmt:
            conv = round_array(np.ascontiguousarray(c.G), *c.fmt.params) if c.G.size else c.G
            same = np.array_equal(conv, c.G, equal_nan=True)
            gg = deliver(np.ascontiguousarray(c.G), c.fmt, is_tensor(g)) if same else None
        if gg is not None:
            flip = lambda v: _flip(v, (axis,))  # noqa: E731
            return {"x": Adjoint("x", "cumsum", (_flip(gg, (axis,)),), {"dim": int(a["dim"])}, to_grad=flip,
                                 from_grad=flip)}  # fmt: skip
    return {"x": Adjoint("x", "cumsum", (), compute=lambda: deliver(_cumsum_values(c), c.fmt, c.as_tensor))}


def _cumsum_values(c: _RedCall):
    from refkern.accumulate.formats import round_array

    if not c.x.ndim or not c.x.size:  # torch returns grad itself: one conversion
        return round_array(np.array(c.G).reshape(-1), *c.fmt.params).reshape(c.x.shape) if c.x.size else c.G
    return _reversed_cumsum(c.G, c.dims[0], c.fmt)


def _to_rows(c: _RedCall, v):
    """An input-shaped array as the (R, n) rows of :meth:`_RedCall.rows`."""
    from refkern.kernels.reduction import rows_of

    return rows_of(np.asarray(v, np.float64).reshape(c.x.shape), c.dims, False)[0]
