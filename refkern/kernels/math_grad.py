"""Correctly rounded gradients of the math functions: ``grad_input = g f'(x)``, the real derivative at the
input x times grad_output g, rounded once (to nearest even) to the input's dtype, for f = exp, exp2, expm1,
log, log2, log1p, sqrt, rsqrt, reciprocal, pow (a number exponent y, or one per element), erf, softplus (beta b,
threshold t), sin and cos; and pow's gradient with respect to a tensor exponent, ``g x**y ln x``
("pow_exponent"). :mod:`refkern.kernels.elementwise_grad` calls :func:`values` and :func:`exact` for these names.

==========  ===================================  ==================================================
f           f'(x)                                torch's autograd formula (tools/autograd/derivatives.yaml)
==========  ===================================  ==================================================
exp, expm1  ``e**x``                             ``grad * result``, ``grad * (result + 1)``
exp2        ``ln 2 * 2**x``                      ``grad * result * M_LN2``
log         ``1 / x``                            ``grad / self``
log2        ``1 / (x ln 2)``                     ``grad / (self * 0.6931471805599453)``
log1p       ``1 / (1 + x)``                      ``grad / (self + 1)``
sqrt        ``1 / (2 sqrt x)``                   ``grad / (2 * result)``
rsqrt       ``-1 / (2 x sqrt x)``                ``-0.5 * grad * result.pow(3)``
reciprocal  ``-1 / x**2``                        ``-grad * (result * result)``
pow         ``y x**(y - 1)``                     ``grad * (exponent * self.pow(exponent - 1))``; 0 if y == 0
pow (wrt y) ``x**y ln x``                        ``grad * (result * self.log())``; 0 if x == 0, y >= 0
erf         ``2 / sqrt(pi) e**(-x**2)``          ``2 / sqrt(pi) * exp(-self.pow(2)) * grad``
softplus    ``s(b x)``; 1 where ``b x > t``      ``softplus_backward``: ``z = e**(b x)``, ``g z / (z + 1)``
sin, cos    ``cos x``, ``-sin x``                ``grad * self.cos()``, ``grad * -self.sin()``
==========  ===================================  ==================================================

Where the real value is defined the element is that value rounded once; where it is not, torch's formula
in IEEE float64, rounded once to the format (non-finite g or x; g = 0, whose exact result is a zero whose
sign the formula gives; the edges of each domain: log and log2 at 0, log1p at -1, sqrt and rsqrt at ``x <= 0``,
reciprocal at 0, pow at 0, at a negative x with a non-integer y, with y = 0 (torch's zeros) and where
``|(y - 1) log2 |x|| > 4400``, which no finite ``g y`` (``2**-2148 <= |g y| < 2**2048``) brings back from
overflow or underflow, or a non-finite y; pow's exponent gradient at ``x <= 0``, at x = 1 (``ln 1 = 0``: a zero
with g's sign), for a non-finite y and where ``|y log2 x| > 4400`` (``|ln x| >= 2**-53`` for x != 1 and ``|ln
x| <= 745``: the value is beyond ``2**4300`` or below ``2**-4390``, saturated for every finite g); cos at 0, a
signed zero). The steps, as for the activations (Ziv's strategy):

1. **Exact and saturated elements**: ``g`` itself where ``f'(x) = 1`` (exp, expm1, sin at 0; pow with
   y = 1; softplus where ``b x > t``, the exact product, and where ``40 < b x``: ``1 - s(b x) < e**-40 <
   2**-57``, closer to 1 than half an ulp of any format); a signed zero where ``|g f'(x)| < 2**1024
   2**-2164 < 2**-1075`` for every g (exp, expm1 at ``x < -1500``, ``e**-1500 < 2**-2164``; erf at
   ``x**2 > 1600``, ``e**-1600 < 2**-2308``; softplus at ``b x < -1500``; exp2 at ``x < -2200``, ``ln 2
   2**-2200 < 2**-2164``); an infinity with g's sign for exp and expm1 at ``x > 1500`` (``|g| >= 2**-1074``,
   ``e**1500 > 2**2164``) and for exp2 at ``x > 2200`` (``ln 2 2**2200 > 2**2164``).
2. **One IEEE operation**: log's ``g / x`` is one correctly rounded float64 division, and so is
   reciprocal's ``-g / (x x)`` for formats of at most 24 bits (``x x`` exact in float64: 48 bits, exponent
   at least -298); a second rounding to such a format is innocuous (``53 >= 2 p + 2``: Figueroa, "When is
   double rounding innocuous?", SIGNUM 1995).
3. **Ball arithmetic in float64** (:mod:`refkern.kernels._grad_balls`: each operation
   charged ``2**-52 |result| + 2**-1074``, a function value from :func:`refkern.kernels.elementwise.values`
   charged ``2**-90`` relative): the rounding decided where both ends of the ball round alike. The
   constant ``2 / sqrt(pi)`` is charged ``2**-50`` relative (three float64 roundings: pi, sqrt, division),
   ``ln 2`` (float64's ``math.log(2)``, one rounding) ``2**-52``.
4. **The exact path** for the rest: rational derivatives (log, log1p, reciprocal; sqrt, rsqrt and pow
   where the root is rational; softplus at 0, ``1/2``) as fractions; the others in the integer intervals
   of :mod:`refkern.kernels._ew_exact`, raised in precision until they decide (the values are irrational:
   e**x, cos x, sin x for a rational x != 0 (Lindemann-Weierstrass), x**(y - 1) where no root is rational;
   ``ln 2 * 2**x`` and ``1 / (x ln 2)`` for every rational x (ln 2 is transcendental, 2**x algebraic)).
"""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.formats import FLOAT64, round_array
from refkern.kernels import _ew_exact as xe
from refkern.kernels import elementwise as ew
from refkern.kernels._grad_balls import _const, _div, _fn, _mul, _r, blank, decide

__all__ = ["FNS", "values", "exact", "torch_formula"]

FNS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "erf", "softplus",
       "sin", "cos", "pow_exponent")  # fmt: skip
_SAT_EXP, _SAT_ERF2, _UP_SOFTPLUS, _POW_LOG2 = 1500.0, 1600.0, 40.0, 4400.0  # module docstring, step 1
_SAT_EXP2 = 2200.0  # module docstring, step 1
_C_ERF = 2.0 / math.sqrt(math.pi)  # within 2**-50 relative of 2 / sqrt(pi)
_LN2 = math.log(2.0)  # within 2**-53 relative of ln 2 (torch's M_LN2, the same double)
_LN2_LOG2 = 0.6931471805599453  # the literal of torch's log2 formula (derivatives.yaml): the same double


def sub(fn, p, idx):
    """The parameters of the elements ``idx``: pow's exponents where there is one per element (a tensor
    exponent, ``p[0]`` an array of x's size), else ``p``."""
    if fn in ("pow", "pow_exponent") and np.ndim(p[0]):
        return (np.asarray(p[0], np.float64)[idx],)
    return p


def torch_formula(fn, g, x, p):
    """torch's autograd formula (module docstring's table) in IEEE float64 at the arrays g, x."""
    with np.errstate(all="ignore"):
        if fn == "pow_exponent":  # pow_backward_exponent: 0 where x = 0 and y >= 0, else grad * (result * log x)
            y = p[0]
            return np.where((x == 0) & (y >= 0), 0.0 * g, g * (np.power(x, y) * np.log(x)))
        if fn == "exp":
            return g * np.exp(x)
        if fn == "expm1":
            return g * (np.expm1(x) + 1.0)
        if fn == "exp2":
            return g * np.exp2(x) * _LN2
        if fn == "log":
            return g / x
        if fn == "log2":
            return g / (x * _LN2_LOG2)
        if fn == "log1p":
            return g / (x + 1.0)
        if fn == "sqrt":
            return g / (2.0 * np.sqrt(x))
        if fn == "rsqrt":
            return -0.5 * g * (1.0 / np.sqrt(x)) ** 3
        if fn == "reciprocal":
            y = 1.0 / x
            return -g * (y * y)
        if fn == "pow":  # torch's pow_backward: zeros where the exponent is 0
            return np.where(np.asarray(p[0]) == 0.0, 0.0, g * (p[0] * np.power(x, p[0] - 1.0)))
        if fn == "erf":
            return _C_ERF * np.exp(-(x * x)) * g
        if fn == "softplus":
            z = np.exp(x * p[0])
            return np.where(x * p[0] > p[1], g, g * z / (z + 1.0))
        if fn == "sin":
            return g * np.cos(x)
        if fn == "cos":
            return g * -np.sin(x)
    raise KeyError(fn)


def _edge(fn, x, p):
    """Finite x where the real derivative is not the value (module docstring): torch's formula there."""
    if fn in ("log", "log2"):
        return x == 0
    if fn == "log1p":
        return x == -1.0
    if fn in ("sqrt", "rsqrt"):
        return x <= 0
    if fn == "reciprocal":
        return x == 0
    if fn in ("pow", "pow_exponent"):
        y = np.broadcast_to(np.asarray(p[0], np.float64), x.shape)
        with np.errstate(all="ignore"):
            big = np.abs((y - (fn == "pow")) * np.log2(np.abs(x))) > _POW_LOG2
            frac = ~np.isfinite(y) | (np.floor(y) != y)
        if fn == "pow_exponent":  # x**y ln x: x <= 0 (0 or NaN: torch's), x = 1 (a zero, g's sign), saturated
            return (x <= 0) | (x == 1.0) | ~np.isfinite(y) | big
        return (y == 0) | (x == 0) | ((x < 0) & frac) | ~np.isfinite(y) | big
    if fn == "cos":
        return x == 0
    return np.zeros(x.shape, np.bool_)


def _above(x, b, t):
    """softplus's ``b x > t`` with the exact product (x where it holds)."""
    with np.errstate(all="ignore"):
        bx = x * b
    out = bx > t
    near = np.flatnonzero(np.abs(bx - t) <= 2.0**-40 * abs(t) + 2.0**-1000)  # float64's product may be off
    for i in near:
        out[i] = Fraction(float(x[i])) * Fraction(b) > Fraction(t)
    return out


def _ball(fn, x, p):
    """(value, radius) of f'(x) at finite x (step 3 of the module docstring)."""
    X = (x, np.zeros_like(x))
    with np.errstate(all="ignore"):
        if fn in ("exp", "expm1"):
            return _fn("exp", X)
        if fn == "exp2":
            return _mul(_const(_LN2), _fn("exp2", X))
        if fn == "log2":
            return _div((1.0, 0.0), _mul(X, _const(_LN2)))
        if fn == "log1p":  # 1 + x as an exact pair (TwoSum): the ball (s, |e|)
            s = 1.0 + x
            bb = s - 1.0
            e = (1.0 - (s - bb)) + (x - bb)
            return _div((1.0, 0.0), (s, np.abs(e)))
        if fn == "reciprocal":
            return _div((-1.0, 0.0), _mul(X, X))
        if fn in ("sqrt", "rsqrt"):
            s = np.sqrt(x)
            root = (s, _r(s))  # IEEE sqrt: within half an ulp
            d = _mul((2.0, 0.0), root if fn == "sqrt" else _mul(X, root))
            return _div((1.0 if fn == "sqrt" else -1.0, 0.0), d)
        if fn == "pow":
            hi, lo = ew.values("pow", x, FLOAT64, (p[0] - 1.0,))
            v = np.where(np.isnan(hi), np.nan, hi)
            return _mul((p[0], 0.0), (v, np.abs(lo) + 2.0**-90 * np.abs(v) + 2.0**-1074))
        if fn == "pow_exponent":  # x**y times ln x, each a function value (2**-90 relative)
            hi, lo = ew.values("pow", x, FLOAT64, (p[0],))
            lh, ll = ew.values("log", x, FLOAT64)
            return _mul((hi, np.abs(lo) + 2.0**-90 * np.abs(hi) + 2.0**-1074),
                        (lh, np.abs(ll) + 2.0**-90 * np.abs(lh) + 2.0**-1074))  # fmt: skip
        if fn == "erf":
            x2 = _mul(X, X)
            e = _fn("exp", (-x2[0], x2[1]))
            return _mul((_C_ERF, 2.0**-50 * _C_ERF), e)
        if fn == "softplus":
            bx = _mul(X, (p[0], 0.0)) if p[0] != 1.0 else X
            return _fn("sigmoid", bx)
        if fn == "sin":
            return _fn("cos", X)
        if fn == "cos":
            v, r = _fn("sin", X)
            return -v, r
    raise KeyError(fn)


def values(fn, g, x, fmt, p):
    """(value, radius, rounded, decided): the ball of ``g f'(x)`` at the flat float64 arrays g, x and its
    rounding to fmt where decided (steps 1-3 of the module docstring); :func:`exact` decides the rest."""
    prec, emin, emax = fmt.params
    n = x.size
    v, rad, out, done, fin = blank(g, x)
    with np.errstate(all="ignore"):
        ieee = ~fin | (g == 0)
        ieee[fin] |= _edge(fn, x[fin], sub(fn, p, fin))
        out[ieee] = round_array(torch_formula(fn, g[ieee], x[ieee], sub(fn, p, ieee)), prec, emin, emax)
        v[ieee], done[ieee] = out[ieee], True
        one = np.zeros(n, np.bool_)  # f'(x) = 1: g itself
        if fn in ("exp", "expm1", "sin"):
            one = x == 0
        elif fn == "pow":
            one = np.broadcast_to(np.asarray(p[0]) == 1.0, (n,)).copy()
        elif fn == "softplus":
            one = fin & (_above(np.where(fin, x, 0.0), p[0], p[1]) | (x * p[0] > _UP_SOFTPLUS))
        one &= ~done
        out[one], v[one], done[one] = g[one], g[one], True
        zero = np.zeros(n, np.bool_)  # |g f'(x)| below half the smallest subnormal: a zero with g's sign
        if fn in ("exp", "expm1"):
            zero = x < -_SAT_EXP
            inf = ~done & (x > _SAT_EXP)
            out[inf], v[inf], done[inf] = np.copysign(np.inf, g[inf]), np.copysign(np.inf, g[inf]), True
        elif fn == "exp2":
            zero = x < -_SAT_EXP2
            inf = ~done & (x > _SAT_EXP2)
            out[inf], v[inf], done[inf] = np.copysign(np.inf, g[inf]), np.copysign(np.inf, g[inf]), True
        elif fn == "erf":
            zero = x * x > _SAT_ERF2
        elif fn == "softplus":
            zero = x * p[0] < -_SAT_EXP
        zero &= ~done
        out[zero], v[zero], done[zero] = np.copysign(0.0, g[zero]), 0.0, True
        quot = ~done & fin
        if fn == "log":  # one IEEE division (step 2)
            q = g[quot] / x[quot]
        elif fn == "reciprocal" and prec <= 24:
            q = -g[quot] / (x[quot] * x[quot])
        else:
            q = None
        if q is not None:
            out[quot] = round_array(q, prec, emin, emax)
            v[quot], rad[quot], done[quot] = q, np.abs(q) * 2.0**-53, True  # one rounding: within 2**-53 relative
        rest = np.flatnonzero(~done)
        if rest.size:
            decide(rest, g, _ball(fn, x[rest], sub(fn, p, rest)), fmt, v, rad, out, done)
    return v, rad, out, done


def _rational(fn, x: float, p):
    """f'(x) as a Fraction where it is rational (step 4 of the module docstring), else None."""
    X = Fraction(x)
    if fn == "log":
        return 1 / X
    if fn == "log1p":
        return 1 / (1 + X)
    if fn == "reciprocal":
        return -1 / (X * X)
    if fn in ("sqrt", "rsqrt"):
        r = ew._root(X, 1)
        return None if r is None else (1 / (2 * r) if fn == "sqrt" else -1 / (2 * X * r))
    if fn == "pow":
        q = ew._pow_rational(x, p[0] - 1.0)
        return None if q is None else Fraction(p[0]) * q
    if fn == "softplus" and x == 0:
        return Fraction(1, 2)
    return None


def _interval(fn, x: float, p, w: int):
    """An interval of f'(x) (:mod:`refkern.kernels._ew_exact`), for the irrational values."""
    X, one = xe.point(x), xe.point(1.0)
    if fn in ("exp", "expm1"):
        return xe.exp(X, w)
    if fn == "exp2":
        return xe.mul(xe.const("ln2", w + 8), ew._interval("exp2", x, (), w + 8), w)
    if fn == "log2":
        return xe.div(one, xe.mul(X, xe.const("ln2", w + 16), w + 8), w)
    if fn == "sqrt":
        return xe.div(one, xe.mul(xe.point(2.0), xe.sqrt(X, w + 8), w + 8), w)
    if fn == "rsqrt":
        return xe.neg(xe.div(one, xe.mul(xe.mul(xe.point(2.0), X, w + 8), xe.sqrt(X, w + 8), w + 8), w))
    if fn == "pow":
        return xe.mul(xe.point(p[0]), ew._interval("pow", x, (p[0] - 1.0,), w + 8), w)
    if fn == "pow_exponent":  # x > 0, x != 1: irrational (ln x transcendental, x**y algebraic, or both)
        return xe.mul(ew._interval("pow", x, (p[0],), w + 8), xe.log(X, w + 8), w)
    if fn == "erf":
        e = xe.exp(xe.neg(xe.mul(X, X, w + 16)), w + 8)
        return xe.mul(xe.const("2/sqrt(pi)", w + 8), e, w)
    if fn == "softplus":
        return ew._sigmoid_iv(xe.mul(xe.point(p[0]), X, w + 16), w + 8)
    if fn == "sin":
        return xe.sin_cos(X, w, "cos")
    if fn == "cos":
        return xe.neg(xe.sin_cos(X, w, "sin"))
    raise KeyError(fn)


def exact(fn, g: float, x: float, p, fmt) -> float:
    """The correctly rounded ``g f'(x)`` of one element the ball left undecided (step 4)."""
    prec, emin, emax = fmt.params
    q = _rational(fn, x, p)
    if q is not None:
        q = Fraction(g) * q
        return xe.round_rational(q.numerator, q.denominator, prec, emin, emax)
    return xe.ziv(lambda w: xe.mul(xe.point(g), _interval(fn, x, p, w + 8), w), prec, emin, emax)
