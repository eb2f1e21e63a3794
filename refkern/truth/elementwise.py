"""Ground truth of the elementwise functions: mpmath, rounded once on Python integers.

Each finite in-domain value is enclosed by mpmath's interval arithmetic (``mpmath.iv``: exp, expm1,
log, log1p, sqrt, sin, cos with outward rounding; tanh, sigmoid, silu, softplus, pow and the tanh form
of gelu composed from them) at a precision that doubles from 80 bits until both ends round alike
(:func:`refkern.truth.softmax._round_ends`). erf and the erf form of gelu use mpmath's ``erf``/``erfc``
(hypergeometric series and asymptotic expansions, not the fast path's series and continued fraction)
at precision P, charged ``2**-(P-24)`` relative. mpmath's interval functions are not rigorous enclosures at
their last bits (an 80-bit ``iv.exp(2.5 iv.log(1 + 2**-52))`` excluded the value, which lies 1.9 2**-104
above a float64 midpoint): every interval is widened by ``2**-(P-16)`` relative before it is rounded.
Values that are rational -- 2**n, log2 of a power of two, sigmoid(0), pow with an integer exponent or a
dyadic one whose root is exact -- are computed as fractions and rounded by
:func:`refkern.truth.reductions.round_fraction`; every other value is irrational, so the loop ends.

Special values are read here on their own (not from the fast path): IEEE 754 / C99 Annex F, and
torch's formulas where torch departs from the limits (silu(-inf) and gelu(-inf) are NaN, pow(x, 0.5)
is sqrt(x), pow(x, -0.5) is rsqrt(x)). Nothing is shared with the fast path's numerics.
"""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import operand, promote
from refkern.kernels._common import deliver
from refkern.truth.reductions import round_fraction
from refkern.truth.softmax import _round_ends

__all__ = ["exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "silu",
           "gelu", "erf", "softplus", "sin", "cos", "pow", "value"]  # fmt: skip

iv = mpmath.iv
_INF, _NAN = math.inf, math.nan


def _special(fn, x, p):
    """The result for non-finite, zero or out-of-domain x (or a known rational), else None."""
    if fn == "pow":
        return _pow_special(x, p[0])
    if x != x:
        return _NAN
    inf = math.isinf(x)
    table = {
        "exp": {_INF: _INF, -_INF: 0.0}, "exp2": {_INF: _INF, -_INF: 0.0}, "expm1": {_INF: _INF, -_INF: -1.0},
        "tanh": {_INF: 1.0, -_INF: -1.0}, "sigmoid": {_INF: 1.0, -_INF: 0.0}, "erf": {_INF: 1.0, -_INF: -1.0},
        "silu": {_INF: _INF, -_INF: _NAN}, "gelu": {_INF: _INF, -_INF: _NAN}, "gelu_tanh": {_INF: _INF, -_INF: _NAN},
        "sin": {_INF: _NAN, -_INF: _NAN}, "cos": {_INF: _NAN, -_INF: _NAN},
        "log": {_INF: _INF}, "log2": {_INF: _INF}, "log1p": {_INF: _INF}, "sqrt": {_INF: _INF},
        "rsqrt": {_INF: 0.0}, "reciprocal": {_INF: 0.0, -_INF: -0.0},
    }  # fmt: skip
    if inf and fn in table:
        return table[fn].get(x, _NAN)
    if fn in ("log", "log2", "sqrt", "rsqrt") and x < 0 or fn == "log1p" and x < -1:
        return _NAN
    if x == 0:
        zero = {"exp": 1.0, "exp2": 1.0, "cos": 1.0, "sigmoid": 0.5, "log": -_INF, "log2": -_INF,
                "rsqrt": math.copysign(_INF, x), "reciprocal": math.copysign(_INF, x)}  # fmt: skip
        return zero.get(fn, x)  # odd functions and silu/gelu keep the zero's sign
    if fn == "log1p" and x == -1:
        return -_INF
    return None


def _odd_int(y):
    return float(y).is_integer() and abs(y) < 2.0**53 and int(y) % 2 == 1


def _pow_special(x, y):
    if y == 0 or x == 1:
        return 1.0
    if x != x or y != y:
        return _NAN
    if y == 0.5 and (x <= 0 or math.isinf(x)):
        return math.sqrt(x) if x >= 0 and x != 0 else (x if x == 0 else _NAN)
    if y == -0.5 and (x <= 0 or math.isinf(x)):
        return _NAN if x < 0 else (math.copysign(_INF, x) if x == 0 else 0.0)
    if x == 0:
        if y < 0:
            return math.copysign(_INF, x) if _odd_int(y) else _INF
        return x if _odd_int(y) else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return _INF if (abs(x) > 1) == (y > 0) else 0.0
    if math.isinf(x):
        if x > 0:
            return _INF if y > 0 else 0.0
        if y > 0:
            return -_INF if _odd_int(y) else _INF
        return -0.0 if _odd_int(y) else 0.0
    if x < 0 and not float(y).is_integer():
        return _NAN
    return None


def _pow_rational(x, y):
    X, Y = Fraction(abs(x)), Fraction(y)
    t = Y.denominator.bit_length() - 1
    if abs(Y.numerator) * max(X.numerator.bit_length(), X.denominator.bit_length()) > 1 << 16:
        return None
    r = X
    for _ in range(t):
        n, d = r.numerator, r.denominator
        if math.isqrt(n) ** 2 != n or math.isqrt(d) ** 2 != d:
            return None
        r = Fraction(math.isqrt(n), math.isqrt(d))
    v = r ** abs(Y.numerator)
    v = 1 / v if Y.numerator < 0 else v
    return -v if (x < 0 and _odd_int(y)) else v


def _rational(fn, x, p):
    """The value as a Fraction where it is rational, else None."""
    if fn == "exp2" and float(x).is_integer():
        return Fraction(2) ** int(min(max(x, -4000.0), 4000.0))  # beyond +-4000: the same rounding (0 or inf)
    if fn == "log2":
        n, d = Fraction(x).numerator, Fraction(x).denominator
        if n & (n - 1) == 0 and d & (d - 1) == 0:
            return Fraction(n.bit_length() - d.bit_length())
    if fn == "reciprocal":
        return 1 / Fraction(x)
    if fn == "sqrt":
        q = Fraction(x)
        if math.isqrt(q.numerator) ** 2 == q.numerator and math.isqrt(q.denominator) ** 2 == q.denominator:
            return Fraction(math.isqrt(q.numerator), math.isqrt(q.denominator))
    if fn == "rsqrt":
        q = Fraction(x)
        if math.isqrt(q.numerator) ** 2 == q.numerator and math.isqrt(q.denominator) ** 2 == q.denominator:
            return Fraction(math.isqrt(q.denominator), math.isqrt(q.numerator))
    if fn == "pow":
        if p[0] == 0.5 or p[0] == -0.5:
            return _rational("sqrt" if p[0] > 0 else "rsqrt", x, ())
        return _pow_rational(x, p[0])
    return None


def _q(x):
    return iv.mpf(Fraction(x).numerator) / iv.mpf(Fraction(x).denominator)


def _sig(y):
    return 1 / (1 + iv.exp(-y))


def _interval(fn, x, p, prec):
    """An mpmath interval holding the value (iv.prec set by the caller)."""
    X = _q(x)
    if fn == "exp":
        return iv.exp(X)
    if fn == "exp2":
        return iv.exp(X * iv.log(2))
    if fn == "expm1":
        return iv.expm1(X)
    if fn == "log":
        return iv.log(X)
    if fn == "log2":
        return iv.log(X) / iv.log(2)
    if fn == "log1p":
        return iv.log1p(X)
    if fn in ("sqrt", "rsqrt"):
        r = iv.sqrt(X)
        return r if fn == "sqrt" else 1 / r
    if fn == "tanh":
        t = iv.expm1(2 * X)
        return t / (t + 2)
    if fn == "sigmoid":
        return _sig(X)
    if fn == "silu":
        return X * _sig(X)
    if fn == "softplus":
        y = _q(Fraction(x) * Fraction(p[0]))
        return iv.log1p(iv.exp(y)) / _q(p[0])
    if fn == "gelu_tanh":
        u = iv.sqrt(2 / iv.pi) * (X + _q(Fraction(44715, 10**6)) * X**3)
        return X * _sig(2 * u)
    if fn in ("sin", "cos"):
        return iv.sin(X) if fn == "sin" else iv.cos(X)
    if fn == "pow":
        v = iv.exp(_q(p[0]) * iv.log(abs(X)))
        return -v if (x < 0 and _odd_int(p[0])) else v
    if fn in ("erf", "gelu"):  # mpmath's own erf/erfc at this precision, within 2**-(prec-24) relative
        with mpmath.workprec(prec):
            xm = mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator
            if fn == "erf":
                v = mpmath.erf(xm)
            else:
                v = xm / 2 * mpmath.erfc(-xm / mpmath.sqrt(2))
            d = abs(v) * mpmath.mpf(2) ** (24 - prec)
            return iv.mpf([v - d, v + d])
    raise KeyError(fn)


def value(fn: str, x: float, params=(), fmt=None):
    """The correctly rounded value of ``fn`` (a name of :data:`refkern.kernels.elementwise.UNARY`, or
    "gelu_tanh") at the float x, in ``fmt`` (a :class:`~refkern.accumulate.formats.Format`)."""
    x = float(x)
    if fn == "softplus":  # torch's branch first: x where beta x > threshold
        beta, thr = params
        if x != x:
            return _NAN
        if math.isinf(x):
            if x * beta > thr:
                return x
            return _NAN if beta == 0 else (0.0 if beta > 0 else -0.0)
        if Fraction(x) * Fraction(beta) > Fraction(thr):
            return x
        if beta == 0:
            return _INF
    else:
        sp = _special(fn, x, params)
        if sp is not None:
            return round_fraction(Fraction(sp), fmt) if (math.isfinite(sp) and sp != 0) else sp
    if fn in ("gelu", "gelu_tanh") and abs(x) >= 64:  # x Phi(x) within |x| e**(-x**2/2) < 2**-2900 of x or of 0
        return x if x > 0 else -0.0  # (the tanh form: e**(2u) with 2u < -18000): x itself, or -0
    q = _rational(fn, x, params)
    if q is not None:
        return round_fraction(q, fmt) if q != 0 else 0.0
    prec = 80
    saved = iv.prec
    try:
        while prec <= 1 << 15:
            iv.prec = prec
            d = iv.mpf(2) ** (16 - prec)  # mpmath's intervals, charged 2**-(prec-16) beyond their own width
            v = _round_ends(_interval(fn, x, params, prec) * iv.mpf([1 - d, 1 + d]), fmt)
            if v is not None:
                return v
            prec *= 2
    finally:
        iv.prec = saved
    raise RuntimeError(f"truth.{fn}: no decision at 2**15 bits for x={x!r}")


def _apply(fn, input, params=()):  # noqa: A002
    o = operand(input, "input", fn)
    flat = np.asarray(o.values, np.float64).reshape(-1)
    out = np.array([value(fn, v, params, o.fmt) for v in flat.tolist()], np.float64)
    return deliver(out.reshape(o.shape), o.fmt, o.torch)


def exp(input):  # noqa: A002
    return _apply("exp", input)


def exp2(input):  # noqa: A002
    return _apply("exp2", input)


def expm1(input):  # noqa: A002
    return _apply("expm1", input)


def log(input):  # noqa: A002
    return _apply("log", input)


def log2(input):  # noqa: A002
    return _apply("log2", input)


def log1p(input):  # noqa: A002
    return _apply("log1p", input)


def sqrt(input):  # noqa: A002
    return _apply("sqrt", input)


def rsqrt(input):  # noqa: A002
    return _apply("rsqrt", input)


def reciprocal(input):  # noqa: A002
    return _apply("reciprocal", input)


def tanh(input):  # noqa: A002
    return _apply("tanh", input)


def sigmoid(input):  # noqa: A002
    return _apply("sigmoid", input)


def silu(input):  # noqa: A002
    return _apply("silu", input)


def gelu(input, approximate: str = "none"):  # noqa: A002
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: unknown approximate={approximate!r}; choose one of 'none', 'tanh'.")
    return _apply("gelu" if approximate == "none" else "gelu_tanh", input)


def erf(input):  # noqa: A002
    return _apply("erf", input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):  # noqa: A002
    return _apply("softplus", input, (float(beta), float(threshold)))


def sin(input):  # noqa: A002
    return _apply("sin", input)


def cos(input):  # noqa: A002
    return _apply("cos", input)


def _c99_pow(x, y, fmt):
    """pow(Tensor, Tensor): C99's pow for each element (torch calls it there), which differs from the
    number exponent's sqrt and rsqrt at y = +-1/2 only at x = -0 and x = -inf (C99 F.9.4.4)."""
    if (y == 0.5 or y == -0.5) and (x == 0 or x == -_INF):
        return _INF if (x == 0) == (y < 0) else 0.0
    return value("pow", x, (y,), fmt)


def pow(input, exponent):  # noqa: A001, A002
    """x**y; a tensor exponent (or a number input with one) broadcast, both operands first rounded to the result's
    format by torch's promotion (a tensor with dimensions before a 0-dim one before a number), as torch casts them."""
    arr = [hasattr(v, "shape") and hasattr(v, "dtype") for v in (input, exponent)]
    if arr[0] and not arr[1]:
        return _apply("pow", input, (float(exponent.item() if hasattr(exponent, "item") else exponent),))
    ops = [operand(v, n, "pow") if a else float(v) for v, n, a in zip((input, exponent), ("input", "exponent"), arr)]
    ranks = [(2 if len(o.shape) else 1) if a else 0 for o, a in zip(ops, arr)]
    fmt = promote(*(o.fmt for o, r in zip(ops, ranks) if r == max(ranks)))

    def cast(o, r):
        if not r:
            return np.asarray(o, np.float64)
        flat = np.asarray(o.values, np.float64).reshape(-1).tolist()
        vals = [v if (v != v or v in (_INF, -_INF) or v == 0) else round_fraction(Fraction(v), fmt) for v in flat]
        return np.asarray(vals, np.float64).reshape(o.shape)

    x, y = np.broadcast_arrays(*(cast(o, r) for o, r in zip(ops, ranks)))
    out = [_c99_pow(a, b, fmt) for a, b in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist())]
    return deliver(np.asarray(out, np.float64).reshape(x.shape), fmt, any(r and o.torch for o, r in zip(ops, ranks)))
