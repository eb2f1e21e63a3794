"""Correctly rounded gradients of the elementwise activations: ``grad_input = grad_output * f'(x)``, the
real derivative at the input x times grad_output g, rounded once (to nearest even) to the input's dtype,
for f = tanh, sigmoid, silu and gelu (both forms): the gradients torch's ``tanh_backward``,
``sigmoid_backward``, ``silu_backward`` and ``gelu_backward`` compute.

The derivatives, written without cancellation except at the zero of silu' and gelu' (s = sigma):

=============  ===========================================================================
tanh           ``4 s(2x) s(-2x)`` (= 1 - tanh**2)
sigmoid        ``s(x) s(-x)``
silu           ``s(x) (1 + x s(-x))``
gelu           ``Phi(x) + x phi(x)``, ``Phi(x) = gelu(x) / x``, ``phi(x) = e**(-x**2/2) / sqrt(2 pi)``
gelu (tanh)    ``s(2u) (1 + 2 x u' s(-2u))``, ``u = sqrt(2/pi) (x + 0.044715 x**3)``, ``u' = sqrt(2/pi) (1 +
               3 0.044715 x**2)`` (``(1 + tanh u)/2 = s(2u)``, ``1 - tanh**2 u = 4 s(2u) s(-2u)``)
=============  ===========================================================================

Ziv's strategy, in three steps:

1. **Saturation** (exact): where ``|f'(x)| < e**-k`` with ``k = (p + emax + 1 - emin) ln 2`` for a format of
   p bits (float64: ``e**-k = 2**-2099``, float32 ``2**-278``), every g of the format (``|g| < 2**(emax+1)``)
   times it is below half the smallest subnormal, ``2**(emin - p)``: a signed zero; where ``f'(x) - 1`` is
   as small, g itself. Beyond ``|x| > L``: tanh ``L = k/2 + 1`` (``f' <= 4 e**(-2|x|)``), sigmoid ``k + 1``
   (``e**-|x|``), silu ``k + 10`` (``(1 + |x|) e**-|x|`` below, ``f' - 1 < x e**-x`` above), gelu ``sqrt(2 (k
   + 5)) + 1`` (``(|x| + 1) phi(x)``), the tanh form ``|2u| > 2200`` (``|2 x u'| <= 3 |2u|``, ``e**-2200``).
   (Before this rule read the format, fixed thresholds (400, 800, 40) rounded float64 gradients of huge g to
   zero: ``sigmoid_backward(1e300, -801)`` is ``1.35e-48``, not 0.)
2. **Ball arithmetic in float64**: each quantity a value and a radius; s, e**y and gelu from
   :func:`refkern.kernels.elementwise.values` (within ``2**-95`` relative, charged ``2**-90`` plus
   ``2**-1074`` absolute: underflow), a function at an inexact argument charged its derivative times the
   radius (``s(t + d) <= s(t) e**|d|``, ``e**(y + d) - e**y <= e**y expm1|d|``), each float64 operation
   ``2**-52 |result| + 2**-1074``; the radii's own roundings covered by ``1 + 2**-40``. The rounding is
   decided where both ends of the ball round alike.
3. **The exact path** for the rest (about ``2**-40`` of float32 elements): the same formulas in the integer
   intervals of :mod:`refkern.kernels._ew_exact`, raised in precision until they decide. At x = 0 the
   derivative is rational (1, 1/4, 1/2, 1/2, 1/2) and ``g f'(0)`` is rounded as a fraction; elsewhere
   ``f'(x)`` is transcendental (Lindemann-Weierstrass), so a finite precision decides.

The math functions (exp, expm1, log, log1p, sqrt, rsqrt, reciprocal, pow, erf, softplus, sin, cos) have their
derivatives in :mod:`refkern.kernels.math_grad` (same steps; :func:`values` and :func:`reference` pass them
on, with pow's exponent and softplus's beta and threshold as ``p``).

Non-finite g or x: torch's formulas in IEEE float64 (``silu_backward`` and ``gelu_backward`` give NaN at
``x = +-inf``: ``inf * 0``; ``tanh_backward`` and ``sigmoid_backward`` 0, from the saturated output).
"""

import math
from fractions import Fraction

import numpy as np

from refkern._arrays import operand
from refkern.accumulate.formats import round_array
from refkern.kernels import _ew_exact as xe
from refkern.kernels import elementwise as ew
from refkern.kernels import math_grad as mg
from refkern.kernels._common import deliver
from refkern.kernels._grad import Adjoint, grad_output
from refkern.kernels._grad_balls import _add, _const, _fn, _mul, _r, blank, decide

__all__ = ["gradient", "pow_gradients", "tensor_exponent", "values", "reference", "grad_fn", "grad_params"]
_KAPPA = 0.044715
_BETA = math.sqrt(2.0 / math.pi)


def _saturation(fn, fmt) -> float:
    """L of step 1 of the module docstring: beyond ``|x| > L`` (``|2u| > L`` for the tanh form), ``g f'(x)``
    rounds to g or to a signed zero for every g of the format."""
    if fn == "gelu_tanh":
        return 2200.0
    k = (fmt.prec + fmt.emax + 1 - fmt.emin) * math.log(2.0)
    return {"tanh": k / 2 + 1, "sigmoid": k + 1, "silu": k + 10}.get(fn, math.sqrt(2 * (k + 5)) + 1)
_AT_ZERO = {"tanh": Fraction(1), "sigmoid": Fraction(1, 4), "silu": Fraction(1, 2), "gelu": Fraction(1, 2),
            "gelu_tanh": Fraction(1, 2)}  # fmt: skip


def grad_fn(name, bound) -> str:
    """The kernel name of op ``name``'s derivative ("gelu_tanh" for gelu with approximate="tanh")."""
    if name != "gelu":
        return name
    a = bound.get("approximate", "none")
    if a not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh'; got approximate={a!r}.")
    return "gelu" if a == "none" else "gelu_tanh"


# ---------------------------------------------------------------- f'(x) as a ball (refkern.kernels._grad_balls)


def _ball(fn, x):
    """(value, radius) of f'(x) at finite x (step 2 of the module docstring)."""
    X = (x, np.zeros_like(x))
    with np.errstate(all="ignore"):
        if fn == "tanh":
            return _mul(_mul(_fn("sigmoid", (2 * x, X[1])), _fn("sigmoid", (-2 * x, X[1]))), (4.0, 0.0))
        if fn == "sigmoid":
            return _mul(_fn("sigmoid", X), _fn("sigmoid", (-x, X[1])))
        if fn == "silu":
            s, c = _fn("sigmoid", X), _fn("sigmoid", (-x, X[1]))
            return _mul(s, _add((1.0, 0.0), _mul(X, c)))
        if fn == "gelu":
            g = _fn("gelu", X)
            cdf = (g[0] / x, g[1] / np.abs(x) + _r(g[0] / x))  # Phi(x) = gelu(x) / x, x exact
            h = _mul(_mul(X, X), (-0.5, 0.0))
            pdf = _mul(_fn("exp", h), _const(0.5 * _BETA))  # 1 / sqrt(2 pi) = sqrt(2/pi) / 2
            return _add(cdf, _mul(X, pdf))
        x2 = _mul(X, X)
        u = _mul(_const(_BETA), _add(X, _mul(_const(_KAPPA), _mul(x2, X))))
        du = _mul(_const(_BETA), _add((1.0, 0.0), _mul(_const(3 * _KAPPA), x2)))
        s, c = _fn("sigmoid", (2 * u[0], 2 * u[1])), _fn("sigmoid", (-2 * u[0], 2 * u[1]))
        return _mul(s, _add((1.0, 0.0), _mul(_mul((2 * x, X[1]), du), c)))


# ---------------------------------------------------------------- the exact path (Python integers)


def _interval(fn, x: float, g: float, w: int):
    """An interval of ``g f'(x)`` (:mod:`refkern.kernels._ew_exact`)."""
    X, one, sig = xe.point(x), xe.point(1.0), ew._sigmoid_iv
    if fn == "tanh":
        two = xe.mul(xe.point(2.0), X, w)
        d = xe.mul(xe.point(4.0), xe.mul(sig(two, w + 8), sig(xe.neg(two), w + 8), w + 8), w + 8)
    elif fn == "sigmoid":
        d = xe.mul(sig(X, w + 8), sig(xe.neg(X), w + 8), w + 8)
    elif fn == "silu":
        d = xe.mul(sig(X, w + 16), xe.add(one, xe.mul(X, sig(xe.neg(X), w + 16), w + 16), w + 16), w + 8)
    elif fn == "gelu":
        z = xe.mul(xe.point(abs(x)), xe.const("1/sqrt(2)", w + 24), w + 24)
        phi_c = xe.add(one, xe.erf(z, w + 16), w + 16) if x > 0 else xe.erf(z, w + 16, complement=True)
        e = xe.exp(xe.neg(xe.mul(xe.point(0.5), xe.mul(X, X, w + 24), w + 24)), w + 16)
        pdf = xe.mul(xe.mul(xe.point(0.5), xe.const("sqrt(2/pi)", w + 24), w + 24), e, w + 16)
        d = xe.add(xe.mul(xe.point(0.5), phi_c, w + 16), xe.mul(X, pdf, w + 16), w + 8)
    else:  # gelu_tanh
        beta, kap = xe.const("sqrt(2/pi)", w + 24), ew._kappa(w + 24)
        x2 = xe.mul(X, X, w + 24)
        u2 = xe.mul(xe.mul(xe.point(2.0), beta, w + 24), xe.add(X, xe.mul(kap, xe.mul(x2, X, w + 24), w + 24),
                                                                   w + 24), w + 24)  # fmt: skip
        du = xe.mul(beta, xe.add(one, xe.mul(xe.mul(xe.point(3.0), kap, w + 24), x2, w + 24), w + 24), w + 24)
        inner = xe.mul(xe.mul(xe.mul(xe.point(2.0), X, w + 24), du, w + 24), sig(xe.neg(u2), w + 16), w + 16)
        d = xe.mul(sig(u2, w + 16), xe.add(one, inner, w + 16), w + 8)
    return xe.mul(xe.point(g), d, w)


def _special(fn, g, x):
    """torch's formulas in IEEE float64 at non-finite g or x (module docstring)."""
    with np.errstate(all="ignore"):
        if fn in ("tanh", "sigmoid"):
            y = np.tanh(x) if fn == "tanh" else 1.0 / (1.0 + np.exp(-x))
            return g * (1.0 - y * y) if fn == "tanh" else g * (1.0 - y) * y
        if fn == "silu":
            s = 1.0 / (1.0 + np.exp(-x))
            return g * s * (1.0 + x * (1.0 - s))
        erf = np.vectorize(math.erf, otypes=[np.float64])
        if fn == "gelu":  # 0.5 (1 + erf(x / sqrt 2)) + x e**(-x**2/2) / sqrt(2 pi): NaN at x = +-inf (inf * 0)
            d = 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * (0.5 * _BETA) * np.exp(-0.5 * x * x)
        else:  # the tanh form: 0.5 (1 + t) + 0.5 x (1 - t**2) u'
            t = np.tanh(_BETA * (x + _KAPPA * x * x * x))
            d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _BETA * (1.0 + 3 * _KAPPA * x * x)
        return g * d


def values(fn, g, x, fmt, p=()):
    """(value, radius, rounded, decided): the ball of ``g f'(x)`` at the flat float64 arrays g, x and its
    rounding to fmt where decided (steps 1-2 of the module docstring; the math functions' in
    :mod:`refkern.kernels.math_grad`, ``p`` their numbers: pow's exponent, softplus's beta and threshold)."""
    if fn in mg.FNS:
        return mg.values(fn, g, x, fmt, p)
    prec, emin, emax = fmt.params
    v, rad, out, done, fin = blank(g, x)
    with np.errstate(all="ignore"):
        special = ~fin
        out[special] = round_array(_special(fn, g[special], x[special]), prec, emin, emax)
        v[special], done[special] = out[special], True
        lim = _saturation(fn, fmt)
        arg = np.abs(_BETA * 2 * (x + _KAPPA * x * x * x)) if fn == "gelu_tanh" else np.abs(x)  # |2u| or |x|
        big = fin & ~done & (arg > lim)
        up = big & (x > 0) & (fn in ("silu", "gelu", "gelu_tanh"))  # f' -> 1: g itself
        out[up], v[up] = g[up], g[up]
        low = big & ~up  # f' -> 0 from above (tanh, sigmoid) or below (silu, gelu at -inf)
        neg = fn in ("silu", "gelu", "gelu_tanh")
        out[low] = np.where(neg, -1.0, 1.0) * np.copysign(0.0, g[low])
        done |= big
        zero = fin & ~done & (x == 0)
        for i in np.flatnonzero(zero):
            q = Fraction(float(g[i])) * _AT_ZERO[fn]
            out[i] = v[i] = xe.round_rational(q.numerator, q.denominator, prec, emin, emax)
        done |= zero
        rest = np.flatnonzero(~done)
        if rest.size:
            decide(rest, g, _ball(fn, x[rest]), fmt, v, rad, out, done)
    return v, rad, out, done


def reference(fn, g, x, fmt, p=()):
    """The correctly rounded ``g f'(x)`` (flat float64 arrays in, float64 array of fmt's values out)."""
    _, _, out, done = values(fn, g, x, fmt, p)
    prec, emin, emax = fmt.params
    for i in np.flatnonzero(~done):
        if fn in mg.FNS:
            out[i] = mg.exact(fn, float(g[i]), float(x[i]), mg.sub(fn, p, i), fmt)
        else:
            out[i] = xe.ziv(lambda w, i=i: _interval(fn, float(x[i]), float(g[i]), w), prec, emin, emax)
    return out


def _operands(name, grad_output_, a, who):
    x = operand(a["input"], "input", who)
    g = grad_output(grad_output_, name, x.fmt, x.shape, who)
    return x, g, tuple(np.ascontiguousarray(o.values, np.float64).reshape(-1) for o in (g, x))


def grad_params(name, bound, who="backward") -> tuple:
    """The numbers of a bound call besides its input, as float64 (pow's exponent, softplus's beta and
    threshold; gelu's approximate is read by :func:`grad_fn`), validated as the forward validates them."""
    out = []
    for k, v in bound.items():
        if k in ("input", "approximate") or (name == "pow" and k == "exponent" and tensor_exponent(name, bound)):
            continue
        if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0:
            raise TypeError(f"{who}: {name}'s {k} must be a number (a tensor {k} is not supported yet); got a "
                            f"{type(v).__name__} of shape {tuple(v.shape)}.")  # fmt: skip
        out.append(ew._number(v.item() if hasattr(v, "item") else v, who, k))
    return tuple(out)


def gradient(name, grad_output, a, who="backward"):
    """The gradient of op ``name`` at its bound arguments ``a`` (``input``; gelu's ``approximate``; pow's
    exponent, softplus's beta and threshold) for ``grad_output``: an array (a CPU tensor when any input is
    one) of the input's dtype."""
    fn = grad_fn(name, a)
    x, g, (gf, xf) = _operands(name, grad_output, a, who)
    out = reference(fn, gf, xf, x.fmt, grad_params(name, a, who))
    return deliver(out.reshape(x.shape), x.fmt, x.torch or g.torch)


def tensor_exponent(name, a) -> bool:
    """Whether the bound call ``a`` is pow with a tensor exponent (or a number base)."""
    return name == "pow" and (ew._is_array(a.get("exponent")) or not ew._is_array(a.get("input")))


def _elementwise(name, grad_output, a, wrt, who):
    """The :class:`Adjoint` of ``input`` (refkern.gradients' builder; pow with a tensor exponent: of ``input`` and
    ``exponent``, as asked): computed here, judged by :mod:`refkern.analysis.elementwise_grad`."""
    if tensor_exponent(name, a):
        ks = tuple(k for k in wrt if ew._is_array(a.get(k)))  # (a number base has no gradient)
        _pow_checked(a["input"], a["exponent"], who, ks)  # validated now (grad_output when computed)
        return {k: Adjoint(k, name, (), compute=lambda k=k: pow_gradients(grad_output, a["input"], a["exponent"],
                                                                         who, (k,))[k]) for k in ks}  # fmt: skip
    if name == "pow" and tuple(wrt) == ("exponent",):
        raise ValueError(f"{who}: pow's exponent is a number here; it has no gradient. Pass it as a tensor.")
    grad_fn(name, a)
    grad_params(name, a, who)
    _operands(name, grad_output, a, who)  # validated now, as torch validates the call
    if "input" not in wrt:
        return {}
    return {"input": Adjoint("input", name, (), compute=lambda: gradient(name, grad_output, a, who))}


def pow_gradients(grad_output_, input, exponent, who="backward", wrt=("input", "exponent")):  # noqa: A002
    """The gradients ``wrt`` of ``torch.pow(input, exponent)`` with a tensor exponent: ``{"input": g y x**(y - 1),
    "exponent": g x**y ln x}``, each correctly rounded to the result's dtype (torch's formulas where the real value
    is not defined: :mod:`refkern.kernels.math_grad`), the exponent broadcast against the input. Each asked-for
    argument must have the result's shape and dtype: a broadcast one's gradient is autograd's sum over the
    broadcast axes, one of another dtype a cast of it (a reduction and a second rounding, not this rule)."""
    x, y, fmt, shape, tensor = _pow_checked(input, exponent, who, wrt)
    g = grad_output(grad_output_, "pow", fmt, shape, who)
    gf = np.ascontiguousarray(g.values, np.float64).reshape(-1)
    fns = {"input": "pow", "exponent": "pow_exponent"}
    return {k: deliver(reference(fns[k], gf, x, fmt, (y,)).reshape(shape), fmt, tensor or g.torch) for k in wrt}


def _pow_checked(input, exponent, who, wrt):  # noqa: A002
    """:func:`refkern.kernels.elementwise.pow_operands`, each argument of ``wrt`` checked (:func:`pow_gradients`)."""
    x, y, fmt, shape, tensor = ew.pow_operands(input, exponent, who)
    for k, v in (("input", input), ("exponent", exponent)):
        if k not in wrt:
            continue
        o = operand(v, k, who) if ew._is_array(v) else None
        if o is None or tuple(o.shape) != tuple(shape) or o.fmt is not fmt:
            got = f"shape {tuple(o.shape)}, {o.fmt.name}" if o is not None else "a number"
            raise ValueError(f"{who}: pow's gradient of {k} takes {k} of the result's shape and dtype, {tuple(shape)} "
                             f"and {fmt.name}; got {got}. A broadcast {k}'s gradient is a sum: expand and convert "
                             "it first.")  # fmt: skip
    return x, y, fmt, shape, tensor
