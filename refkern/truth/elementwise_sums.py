"""Ground truth of pow's gradient of an operand broadcast against the other (autograd's ``sum_to``): for each
element i of the operand, ``G_i = sum_{j -> i} g_j f'(x_j; y_j)`` over the result elements j that read it
(``f' = y x**(y - 1)`` for the input, ``x**y ln x`` for the exponent), exact, rounded once to the dtype.

Each term is the truth's own enclosure of the derivative (:mod:`refkern.truth._backward_math`: mpmath intervals,
a fraction where it is rational), times g exactly; the intervals are added at a precision P that doubles from 80
bits until both ends of the sum round alike, each widened by ``2**-(P - 16)`` relative as the elementwise truth
widens its own. Only regular terms are taken (finite x, y and g; no term where the real derivative is not the
value, :func:`refkern.truth._backward_math._outside`): a sum with such a term is refused, naming it. Nothing is
shared with the fast path's numerics (:func:`refkern.analysis.elementwise_grad.judge_reduced`)."""

import math

import numpy as np

from refkern._arrays import operand
from refkern.kernels._common import deliver
from refkern.truth import elementwise as te
from refkern.truth._backward_math import _deriv, _outside, _rational, iv
from refkern.truth.softmax import _round_ends

__all__ = ["pow_gradient_sums"]


def _sum(terms, fn, fmt):
    """The rounding of ``sum g f'(x; y)`` over ``terms`` [(g, x, y)] (module docstring)."""
    for g, x, y in terms:
        if not all(map(math.isfinite, (g, x, y))) or _outside(fn, x, (y,)):
            raise ValueError(f"truth.pow_gradient_sums: a term with g={g!r}, x={x!r}, y={y!r} has no real derivative "
                             "(the truth of a sum takes regular terms only).")  # fmt: skip
    prec, saved = 80, iv.prec
    try:
        while prec <= 1 << 15:
            iv.prec = prec
            d = iv.mpf(2) ** (16 - prec)
            total = iv.mpf(0)
            for g, x, y in terms:
                if g == 0:
                    continue
                q = _rational(fn, x, (y,)) if fn == "pow" else None
                if q is not None:
                    total += te._q(g) * iv.mpf(q.numerator) / iv.mpf(q.denominator)
                else:
                    total += te._q(g) * _deriv(fn, x, (y,)) * iv.mpf([1 - d, 1 + d])
            r = _round_ends(total, fmt)
            if r is not None:
                return 0.0 if r == 0 else r  # an exact zero sum is +0 (torch's sum starts at +0)
            prec *= 2
    finally:
        iv.prec = saved
    raise RuntimeError("truth.pow_gradient_sums: a sum undecided at 2**15 bits")


def pow_gradient_sums(grad_output, input, exponent, wrt=("input", "exponent")) -> dict:  # noqa: A002
    """``{argument: G}`` of ``torch.pow(input, exponent)`` for tensors of one dtype that broadcast: each asked-for
    argument's gradient summed over the dimensions it was broadcast along, exact, rounded once (module docstring);
    an argument of the result's shape gets its elementwise gradient (sums of one term)."""
    x = operand(input, "input", "truth.pow_gradient_sums")
    y = operand(exponent, "exponent", "truth.pow_gradient_sums")
    g = operand(grad_output, "grad_output", "truth.pow_gradient_sums")
    if x.fmt is not y.fmt or g.fmt is not x.fmt:
        raise TypeError(f"truth.pow_gradient_sums: input, exponent and grad_output must have one dtype; got "
                        f"{x.fmt.name}, {y.fmt.name} and {g.fmt.name}.")  # fmt: skip
    xs, ys = np.broadcast_arrays(*(np.asarray(o.values, np.float64).reshape(o.shape) for o in (x, y)))
    shape = xs.shape
    gs = np.asarray(g.values, np.float64).reshape(g.shape)
    if gs.shape != shape:
        raise ValueError(f"truth.pow_gradient_sums: grad_output must have the result's shape {shape}; got {gs.shape}.")
    out = {}
    for k, fn, own in (("input", "pow", tuple(x.shape)), ("exponent", "pow_exponent", tuple(y.shape))):
        if k not in wrt:
            continue
        lead = (1,) * (len(shape) - len(own)) + own
        if not math.prod(shape):  # no result element: every sum is empty, +0
            out[k] = deliver(np.zeros(own), x.fmt, x.torch or g.torch)
            continue
        axes = [i for i in range(len(shape)) if lead[i] == 1 and shape[i] != 1]
        keep = [i for i in range(len(shape)) if i not in axes]
        order = (*keep, *axes)
        G, X, Y = (np.transpose(a, order).reshape(math.prod(lead), -1) for a in (gs, xs, ys))
        vals = [_sum(list(zip(G[i].tolist(), X[i].tolist(), Y[i].tolist())), fn, x.fmt) for i in range(G.shape[0])]
        out[k] = deliver(np.array(vals, np.float64).reshape(own), x.fmt, x.torch or g.torch)
    return out
