"""Backward rule of nll_loss: the gradient of ``input`` (the log-probabilities) is ``-w_t g`` at each counted
row's target class (``g`` the row's grad_output for ``reduction="none"``, the scalar's for "sum", and that
over ``D = sum w_t`` of the counted rows for "mean"), 0 elsewhere and in ignored rows: each element that
real number, rounded once to the input's dtype (exact rationals: a product of floats, over an exact sum).
aten's ``nll_loss_backward`` receives ``total_weight`` (D as the forward stored it, rounded to the
input's dtype); refkern's gradient is the derivative of the real loss, whose D is exact."""

from fractions import Fraction

import numpy as np

from refkern._arrays import operand
from refkern.accumulate.formats import FLOAT64
from refkern.accumulate.ziv import round_fraction
from refkern.kernels._common import deliver
from refkern.kernels._grad import Adjoint
from refkern.kernels._loss_call import loss_call

__all__ = ["_nll_loss", "nll_grad_call", "nll_grad"]


def nll_grad_call(g, a, who):
    """(the validated forward call, grad_output's values in the output's shape) of nll_loss's backward."""
    c = loss_call("nll_loss", **{k: v for k, v in a.items()})
    og = operand(g, "grad_output", who)
    if og.fmt.name != c.fmt.name:
        raise TypeError(f"{who}: grad_output must have the dtype of the output of nll_loss, {c.fmt.name}; "
                        f"got grad_output.dtype={og.fmt.name}.")  # fmt: skip
    if tuple(og.shape) != tuple(c.out_shape):
        raise ValueError(f"{who}: grad_output must have the shape of the output of nll_loss, {tuple(c.out_shape)}; "
                         f"got grad_output.shape={tuple(og.shape)}.")  # fmt: skip
    return c, np.asarray(og.values, np.float64).reshape(-1)


def nll_grad(c, G) -> np.ndarray:
    """The gradient (R, C) in row layout (class last), float64 values rounded to the input's format."""
    R, C = c.X.shape
    out = np.zeros((R, C))
    rows = np.flatnonzero(c.valid)
    if not rows.size:
        return out
    w = np.ones(C) if c.weight is None else c.weight
    t = c.target[rows]
    wt = w[t]
    g = G[rows] if c.reduction == "none" else np.full(rows.size, G[0])
    if c.reduction == "mean":
        D = sum((Fraction(float(v)) for v in wt), Fraction(0)) if c.weight is not None else Fraction(rows.size)
        if D == 0:  # -w g / 0: IEEE's
            with np.errstate(all="ignore"):
                out[rows, t] = -(wt * g) / 0.0
            return out
        vals = [round_fraction(-Fraction(float(a)) * Fraction(float(b)) / D, c.fmt) if np.isfinite(a * b)
                else -(a * b) / float(D) for a, b in zip(wt, g)]  # fmt: skip
        out[rows, t] = vals
        return out
    with np.errstate(all="ignore"):
        p = -(wt * g)  # exact for float32 and narrower operands; IEEE's correctly rounded product for float64
    if c.fmt.prec < FLOAT64.prec:
        from refkern.accumulate.formats import round_array

        p = round_array(np.ascontiguousarray(p), *c.fmt.params)
    out[rows, t] = p
    return out


def _back(c, rows):
    """Row layout (R, C) back to the input's shape."""
    shape = c.sample_shape
    if not shape:
        return rows.reshape(c.C)
    return np.moveaxis(rows.reshape(*shape, c.C), -1, 1)


def _nll_loss(op, g, a, wrt, who):
    c, G = nll_grad_call(g, a, who)
    return {"input": Adjoint("input", op, (), compute=lambda: deliver(np.ascontiguousarray(_back(c, nll_grad(c, G))),
                                                                      c.fmt, c.tensor))}  # fmt: skip
