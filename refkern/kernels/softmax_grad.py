"""Backward rule of softmax and log_softmax: the real-valued derivative at the given inputs, rounded
once (:mod:`refkern.kernels.softmax_backward`)."""

import numpy as np

from refkern.kernels._grad import Adjoint, grad_output


def _rows_of(v, axis):
    """(R, n) rows along ``axis`` of the float64 array v, and the function that puts (R, n) back."""
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1))
    shape = moved.shape
    rows = moved.reshape(-1, shape[-1]) if moved.size else moved.reshape(0, shape[-1] if shape else 1)

    def back(r):
        return np.moveaxis(r.reshape(shape), -1, axis)

    return rows, back


def _softmax_call(op, g, a, who):
    """(x rows, g rows, back, format, as_tensor, computing format) of a softmax/log_softmax backward
    call, validated. With ``dtype=``, torch converts the input first (``input.to(dtype)``) and the
    forward and backward run in that dtype; autograd converts the gradient back to the input's dtype:
    the rows are the converted input, grad_output has ``dtype``, and the result format is the input's
    (the gradient at the converted input, rounded once to it); the computing format is ``dtype``'s."""
    from refkern.kernels.softmax import convert_input

    o, fmt_c, v = convert_input(a["input"], op, a.get("dtype"))
    dim = a["dim"]
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{who}: dim must be an int; got {dim!r}.")
    span = max(v.ndim, 1)
    if not -span <= dim < span:
        raise IndexError(f"{who}: dim={dim} is out of range for a {v.ndim}-d input (expected {-span}..{span - 1}).")
    og = grad_output(g, op, fmt_c, v.shape, who)
    gv = np.asarray(og.values, np.float64).reshape(v.shape)
    if v.ndim == 0:
        v, gv = v.reshape(1), gv.reshape(1)
    axis = int(dim) % span
    xr, back = _rows_of(v, axis)
    gr, _ = _rows_of(gv, axis)
    shape0 = np.shape(a["input"])
    return xr, gr, (lambda r: back(r).reshape(shape0)), o.fmt, o.torch or og.torch, fmt_c


def _softmax_grad(op, g, a, who):
    from refkern.kernels._common import deliver
    from refkern.kernels.softmax_backward import softmax_backward_rows

    xr, gr, back, fmt, as_tensor, _ = _softmax_call(op, g, a, who)
    out, _ = softmax_backward_rows(xr, gr, fmt, op == "log_softmax")
    return deliver(back(out), fmt, as_tensor)


def _softmax(op, g, a, wrt, who):
    _softmax_call(op, g, a, who)  # validation
    return {"input": Adjoint("input", op, (), compute=lambda: _softmax_grad(op, g, a, who))}
