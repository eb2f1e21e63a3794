"""Ground truth of the elementwise activations' gradients (:mod:`refkern.kernels.elementwise_grad`):
``g f'(x)`` for tanh, sigmoid, silu and gelu (both forms), from mpmath, rounded once.

The derivative is differentiated here from each function's definition, written as mpmath computes it
best, not as the fast path does: tanh' = ``sech(x)**2``, sigmoid' = ``e**-|x| / (1 + e**-|x|)**2``, silu' =
``s + x s (1 - s)`` with ``1 - s = 1 / (1 + e**x)``, gelu' = ``ncdf(x) + x npdf(x)`` (mpmath's normal
distribution functions, its erfc below 0), the tanh form ``(1 + t)/2 + x (1 - t**2) u' / 2`` with ``1 + t``
and ``1 - t**2`` taken as ``2 / (1 + e**(-2u))`` and ``sech(u)**2``. Each value is computed at a working
precision P with mpmath's floating point and charged ``2**-(P - 40)`` relative (mpmath's functions are
accurate to a few ulps of P; the few roundings of the formula cost a few more), an interval rounded by
:func:`refkern.truth.softmax._round_ends` when both ends round alike; P doubles from 96 bits until they do.
At x = 0 the derivative is rational (1, 1/4, 1/2) and ``g f'(0)`` is rounded as a fraction.

Special values are read here on their own: at non-finite g or x, torch's formulas in IEEE arithmetic
(``silu_backward`` and ``gelu_backward`` NaN at ``x = +-inf``, ``tanh_backward`` and ``sigmoid_backward``
``g * 0``); where ``|x|`` is so large that ``g f'(x)`` rounds to g or to a signed zero whatever g, that
rounding: with ``k = (p + emax + 1 - emin) ln 2`` for the format's p bits (every ``|g| < 2**(emax+1)`` times
``e**-k`` is below half the smallest subnormal), tanh beyond ``k/2 + 1`` (``sech(x)**2 <= 4 e**(-2|x|)``), sigmoid
beyond ``k + 1``, silu beyond ``k + 10`` (``(1 + |x|) e**-|x|``), gelu beyond ``sqrt(2 (k + 5)) + 1``, the tanh
form where ``|2u| > 2200``.
"""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import operand
from refkern.kernels._common import deliver
from refkern.truth.reductions import round_fraction
from refkern.truth.softmax import _round_ends

__all__ = ["backward", "value"]

_ZERO = {"tanh": Fraction(1), "sigmoid": Fraction(1, 4), "silu": Fraction(1, 2), "gelu": Fraction(1, 2),
         "gelu_tanh": Fraction(1, 2)}  # fmt: skip
_KAPPA = Fraction(44715, 10**6)


def _deriv(fn, x):
    """f'(x) in mpmath at the current precision (x an mpf)."""
    if fn == "tanh":
        return mpmath.sech(x) ** 2
    if fn == "sigmoid":
        e = mpmath.exp(-abs(x))
        return e / (1 + e) ** 2
    if fn == "silu":
        s, c = 1 / (1 + mpmath.exp(-x)), 1 / (1 + mpmath.exp(x))
        return s + x * s * c
    if fn == "gelu":
        return mpmath.ncdf(x) + x * mpmath.npdf(x)
    beta = mpmath.sqrt(2 / mpmath.pi)
    k = mpmath.mpf(_KAPPA.numerator) / _KAPPA.denominator
    u = beta * (x + k * x**3)
    du = beta * (1 + 3 * k * x**2)
    return 1 / (1 + mpmath.exp(-2 * u)) + x * mpmath.sech(u) ** 2 * du / 2


def _ieee(fn, g, x):
    """torch's formula in IEEE float64 at non-finite g or x."""
    def mul(a, b):
        return a * b if not (math.isinf(a) and b == 0 or math.isinf(b) and a == 0) else math.nan

    if fn in ("tanh", "sigmoid"):
        if fn == "tanh":
            y = math.tanh(x)
        else:
            y = 1.0 if x == math.inf else 0.0 if x == -math.inf else 1 / (1 + math.exp(min(-x, 700.0)))
        return mul(g, 1 - y * y) if fn == "tanh" else mul(mul(g, 1 - y), y)
    if math.isinf(x) or math.isnan(x):
        return math.nan  # silu: g s (1 + x (1 - s)) meets inf * 0; gelu: x pdf = inf * 0
    with mpmath.workprec(80):
        return mul(g, float(_deriv(fn, mpmath.mpf(x))))


def _saturated(fn, g, x, fmt):
    """g, or a signed zero, where the docstring's saturation applies; else None."""
    if fn == "gelu_tanh":
        big = abs(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)) > 2200 if abs(x) < 1e100 else True
    else:
        k = (fmt.prec + fmt.emax + 1 - fmt.emin) * math.log(2)
        big = abs(x) > {"tanh": k / 2 + 1, "sigmoid": k + 1, "silu": k + 10, "gelu": math.sqrt(2 * (k + 5)) + 1}[fn]
    if not big:
        return None
    if x > 0 and fn in ("silu", "gelu", "gelu_tanh"):
        return g
    sign = -1.0 if fn in ("silu", "gelu", "gelu_tanh") else 1.0
    return sign * math.copysign(0.0, g)


def value(fn, g: float, x: float, fmt) -> float:
    """The correctly rounded ``g f'(x)`` in fmt (``fn``: "tanh", "sigmoid", "silu", "gelu", "gelu_tanh")."""
    g, x = float(g), float(x)
    if not (math.isfinite(g) and math.isfinite(x)):
        v = _ieee(fn, g, x)
        return v if not math.isfinite(v) else round_fraction(Fraction(v), fmt) if v else v
    s = _saturated(fn, g, x, fmt)
    if s is not None:
        return s
    if x == 0 or g == 0:
        q = Fraction(g) * (_ZERO[fn] if x == 0 else 1)
        return round_fraction(q, fmt) if q else (0.0 if x == 0 else _ieee(fn, g, x))
    prec = 96
    while prec <= 1 << 15:
        with mpmath.workprec(prec):
            v = mpmath.mpf(g) * _deriv(fn, mpmath.mpf(x))
            d = abs(v) * mpmath.mpf(2) ** (40 - prec)
        old = mpmath.iv.prec
        mpmath.iv.prec = prec
        try:
            r = _round_ends(mpmath.iv.mpf([v - d, v + d]), fmt)
        finally:
            mpmath.iv.prec = old
        if r is not None:
            return r
        prec *= 2
    raise RuntimeError("truth.elementwise_grad: no decision within 2**15 bits")


def backward(name, grad_output, a, wrt=None, precision=None) -> dict:
    """``{"input": gradient}`` of elementwise op ``name`` at its bound arguments ``a`` (``input``; gelu's
    ``approximate``): every element :func:`value`, in the input's dtype."""
    fn = name if name != "gelu" else ("gelu" if a.get("approximate", "none") == "none" else "gelu_tanh")
    x = operand(a["input"], "input", "truth.backward")
    g = operand(grad_output, "grad_output", "truth.backward")
    xs, gs = np.asarray(x.values, np.float64).reshape(-1), np.asarray(g.values, np.float64).reshape(-1)
    out = np.array([value(fn, gi, xi, x.fmt) for gi, xi in zip(gs.tolist(), xs.tolist())], np.float64)
    return {"input": deliver(out.reshape(x.shape), x.fmt, x.torch or g.torch)}
