"""Ground truth of the math functions' gradients (:mod:`refkern.kernels.math_grad`): ``g f'(x)`` for exp,
exp2, expm1, log, log2, log1p, sqrt, rsqrt, reciprocal, pow (a number exponent y), erf, softplus (beta b,
threshold t), sin and cos, from mpmath's interval arithmetic, rounded once.

The derivatives are taken from each function's definition and enclosed by ``mpmath.iv`` (the forward truth's
intervals, :mod:`refkern.truth.elementwise`: exp for exp and expm1, cos for sin, sin for cos, x**(y - 1) for
pow; ``ln 2 e**(x ln 2)`` for exp2, ``1 / (x ln 2)`` for log2; ``2 / sqrt(pi) e**(-x**2)`` for erf, ``1 / (1 +
e**(-b x))`` with the exact product b x for softplus, ``1 / (2 sqrt x)`` and ``-1 / (2 x sqrt x)`` for sqrt
and rsqrt) at a precision P that doubles from 80 bits until both ends of ``g f'(x)`` round alike, every
interval widened by ``2**-(P - 16)`` relative as the forward truth widens its own (mpmath's interval functions
are not rigorous at their last bits). Rational values are fractions, rounded by
:func:`refkern.truth.reductions.round_fraction`: ``1 / x`` (log), ``1 / (1 + x)`` (log1p), ``-1 / x**2``
(reciprocal), sqrt and rsqrt where the square root is rational, pow where x**(y - 1) is (the forward truth's
test), 1 at x = 0 for exp, expm1 and sin, 1/2 for softplus at 0, and 1 where softplus's ``b x > t`` (torch's
branch, the exact product).

Read here on its own: where the real value is not defined, torch's autograd formula in IEEE float64,
rounded once (non-finite g or x; g = 0, a zero whose sign the formula gives; log and log2 at 0, log1p at -1, sqrt
and rsqrt at ``x <= 0``, reciprocal at 0, cos at 0; pow at 0, at a negative x with a non-integer y, with
``y = 0`` (torch's zeros) and where ``|(y - 1) log2 |x|| > 4400``, which overflows or underflows every
``g y x**(y - 1)``); and exp and expm1 beyond ``|x| > 1500``, where ``|g| e**|x|`` exceeds every format
(``2**-1074 e**1500 > 2**1090``) or ``|g| e**-|x|`` is below half of every subnormal (``2**1024 e**-1500 <
2**-1140``): the infinity or the zero with g's sign; exp2 likewise beyond ``|x| > 2200`` (``2**-1074 ln 2
2**2200 > 2**1125``, ``2**1024 ln 2 2**-2200 < 2**-1176``). Nothing is shared with the fast path's numerics.
"""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import operand
from refkern.kernels._common import deliver
from refkern.truth import elementwise as te
from refkern.truth.reductions import round_fraction
from refkern.truth.softmax import _round_ends

__all__ = ["backward", "value", "FNS"]

FNS = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "erf", "softplus",
       "sin", "cos")  # fmt: skip
iv = mpmath.iv


def _formula(fn, g, x, p):
    """torch's autograd formula in IEEE float64 (numpy scalars: overflow to inf, no exception). Written here
    again, not taken from :func:`refkern.kernels.math_grad.torch_formula`, on purpose: the truth reads torch's
    formulas on its own (module docstring)."""
    g, x = np.float64(g), np.float64(x)
    with np.errstate(all="ignore"):
        if fn == "exp":
            v = g * np.exp(x)
        elif fn == "expm1":
            v = g * (np.expm1(x) + 1.0)
        elif fn == "exp2":
            v = g * np.exp2(x) * np.float64(math.log(2.0))
        elif fn == "log":
            v = g / x
        elif fn == "log2":
            v = g / (x * np.float64(0.6931471805599453))
        elif fn == "log1p":
            v = g / (x + 1.0)
        elif fn == "sqrt":
            v = g / (2.0 * np.sqrt(x))
        elif fn == "rsqrt":
            v = -0.5 * g * (1.0 / np.sqrt(x)) ** 3
        elif fn == "reciprocal":
            v = -g * ((1.0 / x) * (1.0 / x))
        elif fn == "pow":
            v = np.float64(0.0) if p[0] == 0 else g * (p[0] * np.power(x, np.float64(p[0] - 1.0)))
        elif fn == "pow_exponent":  # torch's pow_backward_exponent
            y = np.float64(p[0])
            v = 0.0 * g if (x == 0 and y >= 0) else g * (np.power(x, y) * np.log(x))
        elif fn == "erf":
            v = 2.0 / np.sqrt(np.pi) * np.exp(-(x * x)) * g
        elif fn == "softplus":
            z = np.exp(x * p[0])
            v = g if x * p[0] > p[1] else g * z / (z + 1.0)
        elif fn == "sin":
            v = g * np.cos(x)
        else:
            v = g * -np.sin(x)
    return float(v)


def _outside(fn, x, p) -> bool:
    """A finite x where the real derivative is not the value (module docstring)."""
    if fn in ("log", "log2", "reciprocal", "cos"):
        return x == 0
    if fn == "log1p":
        return x == -1
    if fn in ("sqrt", "rsqrt"):
        return x <= 0
    if fn == "pow":
        y = p[0]
        if not math.isfinite(y) or y == 0 or x == 0 or (x < 0 and not float(y).is_integer()):
            return True
        return abs((y - 1) * math.log2(abs(x))) > 4400
    if fn == "pow_exponent":  # x**y ln x: x <= 0, x = 1 (ln 1 = 0), a non-finite y, saturated beyond 2**+-4300
        y = p[0]
        return x <= 0 or x == 1 or not math.isfinite(y) or abs(y * math.log2(x)) > 4400
    return False


def _rational(fn, x, p):
    """f'(x) as a Fraction where it is rational, else None."""
    X = Fraction(x)
    if fn == "log":
        return 1 / X
    if fn == "log1p":
        return 1 / (X + 1)
    if fn == "reciprocal":
        return -1 / X**2
    if fn in ("exp", "expm1", "sin") and x == 0:
        return Fraction(1)
    if fn in ("sqrt", "rsqrt"):
        r = te._rational("sqrt", x, ())
        return None if r is None else (1 / (2 * r) if fn == "sqrt" else -1 / (2 * X * r))
    if fn == "pow":
        if p[0] == 1:
            return Fraction(1)
        q = te._pow_rational(x, p[0] - 1)
        return None if q is None else Fraction(p[0]) * q
    if fn == "softplus":
        bx = X * Fraction(p[0])
        if bx > Fraction(p[1]):
            return Fraction(1)
        return Fraction(1, 2) if bx == 0 else None
    return None


def _deriv(fn, x, p):
    """An mpmath interval of f'(x) (iv.prec set by the caller)."""
    X = te._q(x)
    if fn in ("exp", "expm1"):
        return iv.exp(X)
    if fn == "exp2":
        ln2 = iv.log(iv.mpf(2))
        return ln2 * iv.exp(X * ln2)
    if fn == "log2":
        return 1 / (X * iv.log(iv.mpf(2)))
    if fn == "sqrt":
        return 1 / (2 * iv.sqrt(X))
    if fn == "rsqrt":
        return -1 / (2 * X * iv.sqrt(X))
    if fn == "pow":
        return te._q(p[0]) * te._interval("pow", x, (p[0] - 1,), iv.prec)
    if fn == "pow_exponent":
        return te._interval("pow", x, (p[0],), iv.prec) * iv.log(X)
    if fn == "erf":
        return 2 / iv.sqrt(iv.pi) * iv.exp(-(X**2))
    if fn == "softplus":
        return te._sig(te._q(Fraction(x) * Fraction(p[0])))
    if fn == "sin":
        return iv.cos(X)
    if fn == "cos":
        return -iv.sin(X)
    raise KeyError(fn)


def value(fn, g: float, x: float, fmt, p=()) -> float:
    """The correctly rounded ``g f'(x)`` in fmt (module docstring)."""
    g, x = float(g), float(x)
    if not (math.isfinite(g) and math.isfinite(x)) or g == 0 or _outside(fn, x, p):
        v = _formula(fn, g, x, p)
        return v if not math.isfinite(v) or v == 0 else round_fraction(Fraction(v), fmt)
    if (fn in ("exp", "expm1") and abs(x) > 1500) or (fn == "exp2" and abs(x) > 2200):
        return math.copysign(math.inf if x > 0 else 0.0, g)
    q = _rational(fn, x, p)
    if q is not None:
        return round_fraction(Fraction(g) * q, fmt)
    prec, saved = 80, iv.prec
    try:
        while prec <= 1 << 15:
            iv.prec = prec
            d = iv.mpf(2) ** (16 - prec)
            r = _round_ends(te._q(g) * _deriv(fn, x, p) * iv.mpf([1 - d, 1 + d]), fmt)
            if r is not None:
                return r
            prec *= 2
    finally:
        iv.prec = saved
    raise RuntimeError(f"truth.backward: {fn}'s gradient undecided at 2**15 bits for g={g!r}, x={x!r}")


def backward(name, grad_output, a, wrt=None, precision=None) -> dict:
    """``{"input": gradient}`` of op ``name`` at its bound arguments ``a`` (``input``; pow's exponent,
    softplus's beta and threshold): every element :func:`value`, in the input's dtype."""
    e, base = a.get("exponent"), a.get("input")
    if name == "pow" and (hasattr(e, "shape") or not hasattr(base, "shape")):  # a tensor exponent: both gradients
        both = pow_gradients(grad_output, base, e)
        return {k: both[k] for k in ((wrt,) if isinstance(wrt, str) else wrt or ("input", "exponent"))}
    p = tuple(float(v.item() if hasattr(v, "item") else v) for k, v in a.items() if k != "input")
    x = operand(a["input"], "input", "truth.backward")
    g = operand(grad_output, "grad_output", "truth.backward")
    xs, gs = np.asarray(x.values, np.float64).reshape(-1), np.asarray(g.values, np.float64).reshape(-1)
    out = np.array([value(name, gi, xi, x.fmt, p) for gi, xi in zip(gs.tolist(), xs.tolist())], np.float64)
    return {"input": deliver(out.reshape(x.shape), x.fmt, x.torch or g.torch)}


def pow_gradients(grad_output, input, exponent) -> dict:  # noqa: A002
    """``{"input": g y x**(y - 1), "exponent": g x**y ln x}`` of ``torch.pow(input, exponent)`` with a tensor
    exponent of the input's dtype: every element :func:`value` with its own exponent; an operand broadcast
    against the other gets the sum over the result elements that read it (:func:`_sum_value`)."""
    x = operand(input, "input", "truth.backward")
    y = operand(exponent, "exponent", "truth.backward")
    g = operand(grad_output, "grad_output", "truth.backward")
    if x.fmt is not y.fmt:
        raise ValueError(f"truth.backward: pow's input and exponent must have one dtype; got {x.fmt.name} and "
                         f"{y.fmt.name}.")  # fmt: skip
    shape = np.broadcast_shapes(tuple(x.shape), tuple(y.shape))
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"truth.backward: grad_output must have pow's result shape {tuple(shape)}; got "
                         f"grad_output.shape={tuple(g.shape)}.")  # fmt: skip
    xs, ys = (np.broadcast_to(np.asarray(o.values, np.float64).reshape(o.shape), shape).reshape(-1).tolist()
              for o in (x, y))  # fmt: skip
    gs = np.asarray(g.values, np.float64).reshape(-1).tolist()
    out = {}
    for k, fn, o in (("input", "pow", x), ("exponent", "pow_exponent", y)):
        own = tuple(o.shape)
        if own == tuple(shape):
            vals = [value(fn, gi, xi, x.fmt, (yi,)) for gi, xi, yi in zip(gs, xs, ys)]
        else:  # autograd's sum_to: result element j adds to the element of k it read
            at = np.broadcast_to(np.arange(math.prod(own)).reshape(own), shape).reshape(-1).tolist()
            terms = [[] for _ in range(math.prod(own))]
            for j, i in enumerate(at):
                terms[i].append((gs[j], xs[j], ys[j]))
            vals = [_sum_value(fn, t, x.fmt) for t in terms]
        out[k] = deliver(np.array(vals, np.float64).reshape(own), x.fmt, x.torch or g.torch)
    return out


def _sum_value(fn, terms, fmt) -> float:
    """The sum of the terms ``g f'(x)`` (``(g, x, y)``; pow's f' at exponent y) rounded once to fmt: each term the
    real value, or where :func:`value` takes torch's formula, that formula rounded to fmt (a non-finite one: the
    IEEE sum of the non-finite terms). Rational terms are summed as a Fraction; the irrational ones of equal
    ``(x, y)`` are merged (their g's summed) and enclosed by intervals, widened as :func:`value` widens them, at
    a precision doubling from 80 bits until the sum rounds alike; an exactly zero sum is +0."""
    exact, merged, ieee = Fraction(0), {}, []
    for gi, xi, yi in terms:
        if not (math.isfinite(gi) and math.isfinite(xi)) or gi == 0 or _outside(fn, xi, (yi,)):
            v = _formula(fn, gi, xi, (yi,))
            if not math.isfinite(v):
                ieee.append(v)
            elif v != 0:
                exact += Fraction(round_fraction(Fraction(v), fmt))
            continue
        q = _rational(fn, xi, (yi,))
        if q is not None:
            exact += Fraction(gi) * q
        else:
            merged[(xi, yi)] = merged.get((xi, yi), Fraction(0)) + Fraction(gi)
    if ieee:
        return math.nan if any(map(math.isnan, ieee)) or (max(ieee) > 0 > min(ieee)) else ieee[0]
    merged = {k: s for k, s in merged.items() if s != 0}
    if not merged:
        return 0.0 if exact == 0 else round_fraction(exact, fmt)
    prec, saved = 80, iv.prec
    try:
        while prec <= 1 << 15:
            iv.prec = prec
            d = iv.mpf(2) ** (16 - prec)
            total = te._q(exact)
            for (xi, yi), s in merged.items():
                total += te._q(s) * _deriv(fn, xi, (yi,)) * iv.mpf([1 - d, 1 + d])
            r = _round_ends(total * iv.mpf([1 - d, 1 + d]), fmt)
            if r is not None:
                return r
            prec *= 2
    finally:
        iv.prec = saved
    raise RuntimeError(f"truth.backward: the sum of {len(terms)} {fn} gradients undecided at 2**15 bits")
