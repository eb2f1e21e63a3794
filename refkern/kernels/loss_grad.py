"""Backward rule of nll_loss: the gradient of ``input`` (the log-probabilities) is ``-w_t g`` at each counted
row's target class (``g`` the row's grad_output for ``reduction="none"``, the scalar's for "sum", and that
over ``D = sum w_t`` of the counted rows for "mean"), 0 elsewhere and in ignored rows: each element that
real number, rounded once to the input's dtype (exact rationals: a product of floats, over an exact sum).
aten's ``nll_loss_backward`` receives ``total_weight`` (D as the forward stored it, rounded to the
input's dtype); refkern's gradient is the derivative of the real loss, whose D is exact."""

from fractions import Fraction

import numpy as np

from refkern.accumulate.formats import FLOAT64
from refkern.accumulate.ziv import round_fraction
from refkern.kernels._common import deliver
from refkern.kernels._grad import Adjoint, grad_output
from refkern.kernels._loss_call import loss_call

__all__ = ["_nll_loss", "nll_grad_call", "nll_grad", "_mse_loss", "mse_grad_call", "mse_grad", "_bce", "bce_grad_call",
           "bce_grad"]


def nll_grad_call(g, a, who):
    """(the validated forward call, grad_output's values in the output's shape) of nll_loss's backward."""
    c = loss_call("nll_loss", **{k: v for k, v in a.items()})
    og = grad_output(g, "nll_loss", c.fmt, c.out_shape, who)
    return c, np.asarray(og.values, np.float64).reshape(-1)


def nll_grad(c, G) -> np.ndarray:
    """The gradient (R, C) in row layout (class last), float64 values rounded to the input's format."""
    R, C = c.raw.shape  # the rows as held: c.X would make a float64 copy of them
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


def mse_grad_call(g, a, who):
    """(x, t broadcast float64, grad_output's values, the format, tensors out, the reduction, n) of mse_loss's
    backward, validated (grad_output has the loss's shape and dtype)."""
    from refkern.kernels.loss_pointwise import pointwise_call

    x, t, fmt, tensor, red = pointwise_call("mse_loss", **a)
    G, torch_out = _pointwise_grad_output("mse_loss", g, fmt, x.shape, red, who)
    return x, t, G, fmt, tensor or torch_out, red


def _pointwise_grad_output(op, g, fmt, shape, red, who):
    """(grad_output's values broadcast to the input's ``shape``, whether it is a tensor) of the backward of the
    pointwise loss ``op``, validated: grad_output has the shape (``shape`` for reduction="none", else a scalar)
    and the dtype ``fmt`` of the loss."""
    og = grad_output(g, op, fmt, shape if red == "none" else (), who)
    return np.broadcast_to(np.asarray(og.values, np.float64).reshape(og.shape), shape), og.torch


def mse_grad(x, t, G, fmt, red) -> np.ndarray:
    """The gradient of mse_loss's input, ``2 (x - t) g`` (over n for a mean), each element rounded once (exact
    rationals; the input's shape: an input broadcast against target is not summed back here, as torch's
    mse_loss_backward, which returns the broadcast shape before autograd reduces it)."""
    from refkern.kernels.loss import _bracketed

    n = max(x.size, 1)
    with np.errstate(all="ignore"):
        v = 2.0 * (x - t) * G / (n if red == "mean" else 1)  # float64: within 4u of itself (a difference, a
    E = 4.2 * 2.0**-53 * np.abs(v) + 2.0**-1070  # product, a division), bracketed where the format is narrower
    if fmt.prec < FLOAT64.prec:
        out, ok = _bracketed(v.reshape(-1), E.reshape(-1), fmt)
        out, ok = out.reshape(x.shape), ok.reshape(x.shape)
    else:
        out, ok = np.empty(x.shape), np.zeros(x.shape, np.bool_)
    for i in zip(*np.nonzero(~ok)) if x.ndim else ([()] if not ok else []):
        a, b, g = float(x[i]), float(t[i]), float(G[i])
        if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(g)):
            with np.errstate(all="ignore"):
                out[i] = 2.0 * (a - b) * g / (n if red == "mean" else 1)
            continue
        q = 2 * (Fraction(a) - Fraction(b)) * Fraction(g)
        out[i] = round_fraction(q / n if red == "mean" else q, fmt)
    return out


def _mse_loss(op, g, a, wrt, who):
    """The gradients of mse_loss: the input's ``2 (x - t) g (/ n)`` and the target's ``2 (t - x) g (/ n)``, the
    same function with the operands swapped (torch's autograd computes the target's as ``mse_loss_backward(g,
    target, input)``): each real number rounded once, a zero signed as that formula's IEEE value."""
    x, t, G, fmt, tensor, red = mse_grad_call(g, a, who)
    pairs = {"input": (x, t), "target": (t, x)}
    return {k: Adjoint(k, op, (), compute=lambda p=pairs[k]: deliver(mse_grad(*p, G, fmt, red), fmt, tensor))
            for k in wrt}  # fmt: skip


#: torch's EPSILON in binary_cross_entropy's backward: 1e-12 as a float32 (measured: float64 gradients at the
#: clamp are 4e-9 relative off the float64 constant's, exactly that constant's rounding)
BCE_EPS = float(np.float32(1e-12))
_BCE_EPS = Fraction(BCE_EPS)


def bce_grad_call(g, a, who):
    """(p, y, w, grad_output broadcast, the format, tensors out, the reduction) of binary_cross_entropy's backward."""
    from refkern.kernels.loss_binary import binary_call

    p, y, w, _, fmt, tensor, red = binary_call("binary_cross_entropy", **a)
    G, torch_out = _pointwise_grad_output("binary_cross_entropy", g, fmt, p.shape, red, who)
    return p, y, w, G, fmt, tensor or torch_out, red


def bce_grad(p, y, w, G, fmt, red) -> np.ndarray:
    """The gradient of binary_cross_entropy's input, ``g w (p - y) / max(p (1 - p), eps)`` (over n for a
    mean; torch's clamp of the denominator, eps = :data:`BCE_EPS`), each element that rational rounded once."""
    n = max(p.size, 1)
    out = np.empty(p.shape)
    for i in np.ndindex(*p.shape) if p.ndim else [()]:
        vals = [float(v[i]) for v in (p, y, w, G)]
        if not all(np.isfinite(vals)):
            with np.errstate(all="ignore"):
                q = vals[0] * (1 - vals[0])
                out[i] = vals[3] * vals[2] * (vals[0] - vals[1]) / max(q, BCE_EPS) / (n if red == "mean" else 1)
            continue
        P, Y, W, Gi = (Fraction(v) for v in vals)
        q = Gi * W * (P - Y) / max(P * (1 - P), _BCE_EPS)
        out[i] = round_fraction(q / n if red == "mean" else q, fmt)
    return out


def _bce(op, g, a, wrt, who):
    """The gradients of binary_cross_entropy: the input's (:func:`bce_grad`) and the target's
    (:func:`bce_target_grad`)."""
    from refkern.kernels.loss_target import bce_target_grad

    p, y, w, G, fmt, tensor, red = bce_grad_call(g, a, who)
    fns = {"input": bce_grad, "target": bce_target_grad}
    return {k: Adjoint(k, op, (), compute=lambda f=fns[k]: deliver(f(p, y, w, G, fmt, red), fmt, tensor)) for k in wrt}
