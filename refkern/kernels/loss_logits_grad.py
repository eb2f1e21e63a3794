"""The gradients of binary_cross_entropy_with_logits, correctly rounded. With ``l = w ((1 - y) x + A softplus(-x))``,
``A = 1 + (pw - 1) y`` (pw the pos_weight, 1 without one), ``c = g w`` (over n for a mean):

    d l / d x = c (A sigmoid(x) - pw y)               (torch: ((pw y + 1 - y) sigmoid(x) - pw y) g w / n)
    d l / d y = c (-x + (pw - 1) softplus(-x))        (torch: (log_sigmoid(-x) - pw log_sigmoid(x)) g w / n)

each real number rounded once to the result's format. Where x, y, w, pw or g is not finite, torch's formula's
IEEE value in float64. Where the value is rational it is computed exactly (x = 0: sigmoid 1/2; A = 0; pw = 1: the
target's ``-c x``); elsewhere it is irrational (Lindemann-Weierstrass: ``e**x`` for rational x != 0, and
``log(1 + e**-x)`` for every rational x, are irrational), so it is never a rounding boundary, and Ziv's loop over
integer intervals (:mod:`refkern.kernels._exact_real`) at doubling precision ends; it refuses after ``2**15``
bits. Exact rationals per element (a Python loop, as the other binary loss gradients)."""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels.loss_binary import _softplus_iv

__all__ = ["logits_grad_call", "logits_grads", "logits_ieee", "_bce_logits"]

_MAX_BITS = 1 << 15
#: beyond this |x|, e**-|x| < 2**-2164: the interval keeps (0, 2**-2164] as a point 2**-4000 of the same sign
#: (:func:`_exp_neg_iv`)
_FAR = 1500


def logits_grad_call(g, a, who):
    """(x, y, w, pw, grad_output broadcast, the format, tensors out, the reduction) of the loss's backward."""
    from refkern.kernels.loss_binary import binary_call
    from refkern.kernels.loss_grad import _pointwise_grad_output

    x, y, w, pw, fmt, tensor, red = binary_call("binary_cross_entropy_with_logits", **a)
    G, torch_out = _pointwise_grad_output("binary_cross_entropy_with_logits", g, fmt, x.shape, red, who)
    return x, y, w, pw, G, fmt, tensor or torch_out, red


def logits_ieee(k, x, y, w, pw, G, n):
    """torch's formula for gradient ``k`` ("input" or "target") in float64 (the specials' values)."""
    with np.errstate(all="ignore"):
        if k == "input":
            t = pw * y
            s = 1.0 / (1.0 + np.exp(-x))
            v = (t + 1.0 - y) * s - t
        else:
            ls = lambda z: np.minimum(z, 0.0) - np.log1p(np.exp(-np.abs(z)))  # noqa: E731
            v = ls(-x) - ls(x) * pw
        return v * G * w / n


def _exp_neg_iv(ax: Fraction, W: int):
    """(lo, hi) Fractions enclosing e**-ax, ax >= 0, relative width about (ax + 3 W) 2**-W. Beyond :data:`_FAR`
    the value is below 2**-2164, far below half of float64's smallest subnormal even times the largest
    coefficients here (|c A| < 2**600): (0, 2**-2164] is kept as the point 2**-4000, which rounds as the real
    value does (both lie between the other terms' sum T and the first rounding boundary past T on their side:
    T is a rational with denominator at most n 2**1200, so no boundary other than T itself lies that close)."""
    if ax == 0:
        return Fraction(1), Fraction(1)
    if ax > _FAR:
        p = Fraction(1, 1 << 4000)
        return p, p
    n, e = xr.dyadic(-ax)
    lo, hi, k = xr.exp_interval(n, e, W)
    s = Fraction(2) ** k
    return lo * s, hi * s


def _sigmoid_iv(x: Fraction, W: int):
    """(lo, hi) enclosing sigmoid(x) = 1 / (1 + e**-x) (x >= 0) or e**x / (1 + e**x), each monotone in e**-|x|."""
    t_lo, t_hi = _exp_neg_iv(abs(x), W)
    if x >= 0:
        return 1 / (1 + t_hi), 1 / (1 + t_lo)
    return t_lo / (1 + t_lo), t_hi / (1 + t_hi)


def _decide(lo, hi, fmt):
    ra, rb = round_fraction(lo, fmt), round_fraction(hi, fmt)
    return ra if ra == rb and math.copysign(1.0, ra) == math.copysign(1.0, rb) else None


def _one(k, x, y, w, pw, g, n, fmt):
    """One element's gradient ``k`` rounded once (finite operands)."""
    X, Y, PW = Fraction(x), Fraction(y), Fraction(pw)
    c = Fraction(g) * Fraction(w) / n
    if k == "input":
        A = 1 + (PW - 1) * Y
        if X == 0 or A == 0 or c == 0:  # rational: sigmoid(0) = 1/2, or the sigmoid's coefficient 0
            v = c * (A * (Fraction(1, 2) if X == 0 else 0) - PW * Y)
            return round_fraction(v, fmt) if v != 0 else None
    elif PW == 1 or c == 0:
        v = -c * X
        return round_fraction(v, fmt) if v != 0 else None
    W = 96
    while W <= _MAX_BITS:
        if k == "input":
            s_lo, s_hi = _sigmoid_iv(X, W)
            ends = (c * (A * s_lo - PW * Y), c * (A * s_hi - PW * Y))
        else:
            p_lo, p_hi = _softplus_iv(X, W)
            ends = (c * (-X + (PW - 1) * p_lo), c * (-X + (PW - 1) * p_hi))
        r = _decide(min(ends), max(ends), fmt)
        if r is not None:
            return r
        W *= 2
    raise RuntimeError(f"binary_cross_entropy_with_logits: the {k}'s gradient did not converge within {_MAX_BITS} "
                       "bits.")  # fmt: skip


def _frozen(v) -> np.ndarray:
    """``v`` as float64, C-contiguous (a copy only where it is not: a broadcast operand) and read-only (a view, no
    copy): the float64 pass's operands in one form, so that its kernels compile one signature (Numba types an
    array by its layout and its writeable flag too; an operand that broadcasts is a fresh writable copy, one that
    does not a read-only view of the caller's)."""
    v = np.ascontiguousarray(v, np.float64).view()
    v.flags.writeable = False
    return v


def logits_grads(x, y, w, pw, G, fmt, red, wrt) -> dict:
    """``{k: gradient}`` for k in ``wrt`` ("input", "target"): float64 values of the input's shape, each the real
    number rounded once to ``fmt`` (module docstring); a zero (a rational value 0) as torch's formula signs it."""
    n = max(x.size, 1) if red == "mean" else 1
    shape = x.shape
    flat = [_frozen(np.broadcast_to(v, shape)).reshape(-1) for v in (x, y, w, pw, G)]
    finite = np.logical_and.reduce([np.isfinite(v) for v in flat])
    out = {}
    for k in wrt:
        v = logits_ieee(k, *flat, n)
        todo = finite
        if fmt.prec <= 24 and x.size:  # the float64 pass first (loss_logits_grad_fast)
            from refkern.kernels import loss_logits_grad_fast as fk

            fast = np.empty(x.size)
            und = np.zeros(x.size, np.bool_)
            kernel = fk.logits_input_fast if k == "input" else fk.logits_target_fast
            kernel(*flat, float(n), fmt.prec, fmt.emin, fmt.emax, fast, und)
            v = np.where(finite & ~und, fast, v)
            todo = finite & und
        for i in np.flatnonzero(todo):
            r = _one(k, *(float(a[i]) for a in flat), n, fmt)
            v[i] = math.copysign(0.0, v[i]) if r is None else r  # None: an exact zero, signed by the formula
        out[k] = v.reshape(shape)
    return out


def _bce_logits(op, g, a, wrt, who):
    """The backward rule (:class:`refkern.ops.Backward`): both gradients from one validated call."""
    from refkern.kernels._common import deliver
    from refkern.kernels._grad import Adjoint

    x, y, w, pw, G, fmt, tensor, red = logits_grad_call(g, a, who)
    memo = {}

    def grads():
        if not memo:
            memo.update({k: deliver(v, fmt, tensor) for k, v in logits_grads(x, y, w, pw, G, fmt, red, wrt).items()})
        return memo

    return {k: Adjoint(k, op, (), compute=lambda k=k: grads()[k]) for k in wrt}
