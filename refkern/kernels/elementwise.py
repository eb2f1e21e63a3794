"""Correctly rounded elementwise math: exp, exp2, expm1, log, log2, log1p, sqrt, rsqrt, reciprocal,
tanh, sigmoid, silu, gelu (erf and tanh forms), erf, softplus, sin, cos and pow (a number or a tensor
exponent), with torch's signatures and special values.

Every element is the real function of the input value rounded once (to nearest, ties to even) to the
input's dtype (float16, bfloat16, float32, float64), subnormal results and overflow to +-inf included.
Ziv's strategy, in three steps (after a vectorised pass, :mod:`refkern.kernels._ew_vec`, that settles exp, exp2,
sigmoid, silu and tanh on most arguments for results of at most 24 bits):

1. for results of at most 24 bits, exp, exp2, expm1, log, log2, log1p, rsqrt, tanh, sigmoid, silu, softplus (beta =
   1), erf, gelu (both forms), sin, cos and pow (0 < x) first try a float64 evaluation with a rigorous bound
   (exp_fast, then one rounding per operation: :mod:`refkern.kernels._ew_f64`); then, or else, a jitted double-word
   evaluation with a rigorous error bound (:mod:`refkern.kernels._ew_scalar`, :mod:`refkern.kernels._ew_dd`),
   parallel over the elements;
2. the rounding decided from that bound (:func:`refkern.kernels._transcendental.decide_scaled`: every
   real within the bound rounds alike), which settles all but about ``2**-40`` of float32 elements and
   ``2**-45`` of float64 ones;
3. the rest on the exact path (:mod:`refkern.kernels._ew_exact`): integer intervals raised in precision
   until they decide; exact and midpoint results (integer and dyadic powers) are computed as rationals.

``sqrt`` and ``reciprocal`` need no bound: float64's sqrt and division are correctly rounded, and
rounding their float64 result once more to a format of ``p <= 24`` bits is innocuous, since
``53 >= 2 p + 2`` (Figueroa, "When is double rounding innocuous?", SIGNUM 1995).
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import operand, promote
from refkern._jit import jit
from refkern.accumulate.formats import round_array, round_to
from refkern.kernels import _ew_exact as xe
from refkern.kernels import _ew_f64 as f
from refkern.kernels import _ew_scalar as s
from refkern.kernels import _ew_vec, _ew_vec_erf
from refkern.kernels._common import deliver
from refkern.kernels._ew_vec import kernel_format
from refkern.kernels._transcendental import decide_scaled

__all__ = ["exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "silu",
           "gelu", "erf", "softplus", "sin", "cos", "pow", "pow_operands", "values", "rounded", "UNARY"]  # fmt: skip


@jit(inline="always")
def _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i):
    """mode 0: the rounding of the value where the bound decides it (else ``und``); mode 1: the value
    itself, ``out + lo`` (float64 pair, scale applied), for the yardstick."""
    if mode == 1:
        out[i] = math.ldexp(qh, k)
        lo[i] = math.ldexp(ql, k)
        und[i] = not ok
        return
    if not ok:
        und[i] = True
        return
    if e == 0.0 and (qh == 0.0 or qh != qh or abs(qh) == math.inf):
        out[i] = qh  # a special result, a zero with its sign
        return
    if e == 0.0 and ql == 0.0 and -1074 <= k + math.frexp(qh)[1] <= 1024:  # an exact dyadic value (ties too)
        out[i] = round_to(math.ldexp(qh, k), prec, emin, emax)
        return
    r, dec = decide_scaled(qh, ql, e, k, prec, emin, emax)
    out[i] = r
    und[i] = not dec


# one kernel per function (each compiles alone, cached): x flat float64, results into out/lo/und
@jit(parallel=True)
def _k_exp(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_exp(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_exp(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_exp2(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_exp2(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_exp2(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_expm1(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_expm1(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_expm1(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_log(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_log(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_log(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_log2(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_log2(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_log2(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_log1p(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_log1p(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_log1p(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_rsqrt(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_rsqrt(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_rsqrt(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_tanh(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_tanh(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_tanh(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_sigmoid(x, silu, prec, emin, emax, mode, out, lo, und):
    """sigmoid, or silu (``x sigmoid(x)``) where ``silu``: the float64 tier's one evaluation serves both."""
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_sigmoid(x[i], silu, prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_silu(x[i]) if silu else s.v_sigmoid(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_gelu(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_gelu(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_gelu(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_gelu_tanh(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_gelu_tanh(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_gelu_tanh(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_erf(x, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            r, dec = f.f_erf(x[i], prec, emin, emax)
            if dec:
                out[i] = r
                continue
        qh, ql, e, k, ok = s.v_erf(x[i])
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_param(x, which, p, prec, emin, emax, mode, out, lo, und):
    """The functions with parameters, in one kernel: ``which`` 0 sin, 1 cos; 2 softplus (``p = (beta,
    threshold)``); 3 pow, ``p`` the exponent of each element (``p.size == x.size``) or of all (``p.size == 1``)."""
    for i in prange(x.size):
        a = p[0]
        if p.size == x.size and p.size > 1:
            a = p[i]
        if mode == 0 and prec <= 24:  # the float64 tier first (:mod:`refkern.kernels._ew_f64`)
            if which <= 1:
                r, dec = f.f_sin_cos(x[i], which == 1, prec, emin, emax)
            elif which == 2:
                r, dec = f.f_softplus(x[i], p[0], p[1], prec, emin, emax)
            else:
                r, dec = f.f_pow(x[i], a, prec, emin, emax)
            if dec:
                out[i] = r
                continue
        if which <= 1:
            qh, ql, e, k, ok = s.v_sin_cos(x[i], which == 1)
        elif which == 2:
            qh, ql, e, k, ok = s.v_softplus(x[i], p[0], p[1])
        else:
            qh, ql, e, k, ok = s.v_pow(x[i], a)
        _store(qh, ql, e, k, ok, prec, emin, emax, mode, out, lo, und, i)


@jit(parallel=True)
def _k_sqrt(x, recip, prec, emin, emax, mode, out, lo, und):
    for i in prange(x.size):
        v = 1.0 / x[i] if recip else np.sqrt(x[i])  # correctly rounded in float64 (module docstring)
        out[i] = round_to(v, prec, emin, emax) if mode == 0 else v  # (lo: zeros, mode 1's only)


VEC = {**_ew_vec.VEC, **_ew_vec_erf.VEC}  # the vectorised first passes, by function
_K = {"exp": _k_exp, "exp2": _k_exp2, "expm1": _k_expm1, "log": _k_log, "log2": _k_log2, "log1p": _k_log1p,
      "rsqrt": _k_rsqrt, "tanh": _k_tanh, "gelu": _k_gelu,
      "gelu_tanh": _k_gelu_tanh, "erf": _k_erf}  # fmt: skip
_PARAM = {"sin": 0, "cos": 1, "softplus": 2, "pow": 3}  # _k_param's which
UNARY = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "silu",
         "gelu", "erf", "softplus", "sin", "cos", "pow")  # fmt: skip


def _launch(fn, x, fmt, params, mode):
    """(out, lo, und) of the kernel of ``fn`` ("gelu_tanh" for the tanh form) on the flat float64 x."""
    out, lo, und = np.empty(x.size), np.zeros(x.size if mode == 1 else 1), np.zeros(x.size, np.bool_)
    args = (*fmt.params, mode, out, lo, und)
    if fn in _K:
        _K[fn](x, *args)
    elif fn in ("sigmoid", "silu"):
        _k_sigmoid(x, fn == "silu", *args)
    elif fn in _PARAM:
        p = params[0] if fn == "pow" else params if fn == "softplus" else (0.0,)  # pow: a number or an array
        _k_param(x, _PARAM[fn], np.ascontiguousarray(p, np.float64).reshape(-1), *args)
    else:
        _k_sqrt(x, fn == "reciprocal", *args)
    return out, lo, und


# ---------------------------------------------------------------- the exact path (Python integers)


def _kappa(w):
    return (44715 << w) // 10**6, -((-44715 << w) // 10**6), -w


def _sigmoid_iv(y, w):
    return xe.div(xe.point(1.0), xe.add(xe.point(1.0), xe.exp(xe.neg(y), w), w), w)


def _interval(fn, x: float, params, w: int):
    """An interval of the exact value of ``fn`` at x (module docstring of :mod:`~refkern.kernels._ew_exact`)."""
    X = xe.point(x)
    one = xe.point(1.0)
    if fn == "exp":
        return xe.exp(X, w)
    if fn == "exp2":
        return xe.exp(xe.mul(X, xe.const("ln2", w + 16), w + 8), w)
    if fn == "expm1":
        return xe.add(xe.exp(X, w + 64), xe.neg(one), w)
    if fn == "log":
        return xe.log(X, w)
    if fn == "log2":
        return xe.div(xe.log(X, w + 8), xe.const("ln2", w + 8), w)
    if fn == "log1p":
        return xe.log(xe.point(Fraction(x) + 1), w)
    if fn == "rsqrt":
        return xe.div(one, xe.sqrt(X, w + 8), w)
    if fn == "tanh":
        t = xe.exp(xe.mul(xe.point(2.0), X, w), w + 64)
        return xe.div(xe.add(t, xe.neg(one), w + 32), xe.add(t, one, w + 32), w)
    if fn == "sigmoid":
        return _sigmoid_iv(X, w)
    if fn == "silu":
        return xe.mul(X, _sigmoid_iv(X, w + 8), w)
    if fn in ("sin", "cos"):
        return xe.sin_cos(X, w, fn)
    if fn == "erf":
        v = xe.erf(xe.point(abs(x)), w)
        return v if x > 0 else xe.neg(v)
    if fn == "gelu":
        z = xe.mul(xe.point(abs(x)), xe.const("1/sqrt(2)", w + 16), w + 16)
        if x > 0:
            phi = xe.add(one, xe.erf(z, w + 8), w + 8)
        else:
            phi = xe.erf(z, w + 8, complement=True)
        return xe.mul(xe.mul(X, xe.point(0.5), w + 8), phi, w)
    if fn == "gelu_tanh":
        a = xe.add(one, xe.mul(_kappa(w + 16), xe.mul(X, X, w + 16), w + 16), w + 16)
        u2 = xe.mul(xe.mul(xe.const("sqrt(2/pi)", w + 16), xe.point(2 * Fraction(x)), w + 16), a, w + 16)
        return xe.mul(X, _sigmoid_iv(u2, w + 8), w)
    if fn == "softplus":
        beta = xe.point(params[0])
        y = xe.point(Fraction(x) * Fraction(params[0]))
        return xe.div(xe.log(xe.add(one, xe.exp(y, w + 16), w + 16), w + 8), beta, w)
    if fn == "pow":
        v = xe.exp(xe.mul(xe.point(params[0]), xe.log(xe.point(abs(x)), w + 64), w + 32), w)
        return xe.neg(v) if (x < 0 and params[0] % 2 == 1) else v
    raise KeyError(fn)


def _root(q: Fraction, t: int):
    """q ** (1 / 2**t) when it is rational, else None."""
    for _ in range(t):
        n, d = q.numerator, q.denominator
        rn, rd = math.isqrt(n), math.isqrt(d)
        if rn * rn != n or rd * rd != d:
            return None
        q = Fraction(rn, rd)
    return q


def _pow_rational(x: float, y: float):
    """x ** y as an exact Fraction when it is rational and of moderate size, else None (y not 0)."""
    X = Fraction(abs(x))
    yn, yd = Fraction(y).numerator, Fraction(y).denominator  # yd a power of two
    t = yd.bit_length() - 1
    bits = max(X.numerator.bit_length(), X.denominator.bit_length())
    if abs(yn) * bits > 1 << 16:
        return None  # an integer power that large is neither representable nor a midpoint (odd m >= 3)
    r = _root(X, t) if t else X
    if r is None:
        return None
    v = r ** abs(yn)
    v = 1 / v if yn < 0 else v
    return -v if (x < 0 and yd == 1 and yn % 2) else v


def _exact(fn, x: float, params, fmt) -> float:
    """The correctly rounded value of one element the double-word bound left undecided."""
    prec, emin, emax = fmt.params
    if fn == "exp2" and float(x).is_integer():
        n = int(min(max(x, -4000.0), 4000.0))
        return xe.round_rational(1 << max(n, 0), 1 << max(-n, 0), prec, emin, emax)
    if fn == "pow":
        q = _pow_rational(x, params[0])
        if q is not None:
            return xe.round_rational(q.numerator, q.denominator, prec, emin, emax)
    return xe.ziv(lambda w: _interval(fn, x, params, w), prec, emin, emax)


def _apply(name, fn, input, params=()):  # noqa: A002
    o = operand(input, "input", name)
    return deliver(rounded(fn, o.values, o.fmt, params).reshape(o.shape), o.fmt, o.torch)


def rounded(fn: str, x: np.ndarray, fmt, params=()) -> np.ndarray:
    """The correctly rounded values of ``fn`` ("gelu_tanh" for gelu's tanh form) at the values x of the format
    ``fmt``, flat: float32 for formats of at most 24 bits where the vectorised first pass exists (it holds them
    exactly), float64 otherwise. pow's ``params[0]``: a number (torch's ``pow(Tensor, Scalar)``: y = +-1/2 as
    sqrt and rsqrt, special values included) or an array of one exponent per element (``pow(Tensor, Tensor)``,
    which calls C99's pow for every element: pow(-0, 1/2) = +0, pow(-inf, 1/2) = +inf, pow(-0, -1/2) = +inf,
    pow(-inf, -1/2) = +0)."""
    out = _rounded_all(fn, x, fmt, params)
    if fn == "pow" and np.ndim(params[0]):
        _c99_half_powers(np.asarray(x, np.float64).reshape(-1), np.asarray(params[0], np.float64).reshape(-1), out)
    return out


def _c99_half_powers(x, y, out):
    """C99's pow(-0, +-1/2) and pow(-inf, +-1/2) in place of sqrt's and rsqrt's (:func:`rounded`)."""
    y = np.broadcast_to(y, x.shape)
    neg = ((y == 0.5) | (y == -0.5)) & ((x == 0) | (x == -np.inf))
    if neg.any():
        big = (x == 0) == (y < 0)  # +inf: pow(-0, -1/2) and pow(-inf, 1/2); else +0
        out[neg] = np.where(big, np.inf, 0.0)[neg]


def _rounded_all(fn, x, fmt, params):
    if fmt.params[0] <= 24 and fn in VEC:  # the vectorised first pass on the float32 values, into float32
        x32 = np.ascontiguousarray(x, np.float32).reshape(-1)  # exact: x lies in the format
        out, und = np.empty(x32.size, np.float32), np.zeros(x32.size, np.bool_)
        VEC[fn](x32, params, kernel_format(fmt), out, und)
        idx = np.flatnonzero(und)
        if idx.size:  # the rest through the float64 tier, the double-word path and the exact path
            out[idx] = _rounded(fn, x32[idx].astype(np.float64), fmt, _at(fn, params, idx, x32.size))
        return out
    return _rounded(fn, np.ascontiguousarray(x, np.float64).reshape(-1), fmt, params)


def _at(fn, params, idx, n):
    """The parameters of the elements idx of n: pow's exponents where they are one per element."""
    if fn == "pow" and np.size(params[0]) == n and n > 1:
        return (np.asarray(params[0], np.float64).reshape(-1)[idx],)
    return params


def _rounded(fn, x, fmt, params):
    """Steps 1 to 3 of the module docstring on the flat float64 x."""
    out, _, und = _launch(fn, x, fmt, params, 0)
    y = np.asarray(params[0], np.float64).reshape(-1) if fn == "pow" else None  # pow: each element's exponent
    for i in np.flatnonzero(und):
        p = (float(y[i if y.size > 1 else 0]),) if fn == "pow" else params
        out[i] = _exact(fn, float(x[i]), p, fmt)
    return out


def values(fn: str, x: np.ndarray, fmt, params=()):
    """The unrounded values ``hi + lo`` of ``fn`` at the float64 array x (within ``2**-95`` relative where
    the bound is defined; NaN hi where the exact path alone knows the value), for the yardstick."""
    x = np.ascontiguousarray(x, np.float64).reshape(-1)
    out, lo, und = _launch(fn, x, fmt, params, 1)
    out[und] = np.nan
    return out, lo


def _number(value, name, what):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: {what} must be a real number; got {what}={value!r}.")
    return float(value)


def exp(input):  # noqa: A002
    """Reference ``torch.exp(input)``: e**x correctly rounded to the input's dtype (module docstring)."""
    return _apply("exp", "exp", input)


def exp2(input):  # noqa: A002
    """Reference ``torch.exp2(input)``: 2**x correctly rounded."""
    return _apply("exp2", "exp2", input)


def expm1(input):  # noqa: A002
    """Reference ``torch.expm1(input)``: e**x - 1 correctly rounded."""
    return _apply("expm1", "expm1", input)


def log(input):  # noqa: A002
    """Reference ``torch.log(input)``: the natural logarithm correctly rounded (log(0) = -inf, log(x < 0) = NaN)."""
    return _apply("log", "log", input)


def log2(input):  # noqa: A002
    """Reference ``torch.log2(input)``: correctly rounded; exact integers at powers of two."""
    return _apply("log2", "log2", input)


def log1p(input):  # noqa: A002
    """Reference ``torch.log1p(input)``: log(1 + x) correctly rounded."""
    return _apply("log1p", "log1p", input)


def sqrt(input):  # noqa: A002
    """Reference ``torch.sqrt(input)``: correctly rounded (sqrt(-0) = -0)."""
    return _apply("sqrt", "sqrt", input)


def rsqrt(input):  # noqa: A002
    """Reference ``torch.rsqrt(input)``: 1/sqrt(x) correctly rounded (one rounding, not two)."""
    return _apply("rsqrt", "rsqrt", input)


def reciprocal(input):  # noqa: A002
    """Reference ``torch.reciprocal(input)``: 1/x correctly rounded."""
    return _apply("reciprocal", "reciprocal", input)


def tanh(input):  # noqa: A002
    """Reference ``torch.tanh(input)``: correctly rounded."""
    return _apply("tanh", "tanh", input)


def sigmoid(input):  # noqa: A002
    """Reference ``torch.sigmoid(input)``: 1 / (1 + e**-x) correctly rounded."""
    return _apply("sigmoid", "sigmoid", input)


def silu(input):  # noqa: A002
    """Reference ``torch.nn.functional.silu(input)``: x / (1 + e**-x) correctly rounded (silu(-inf) is NaN,
    as torch's formula gives)."""
    return _apply("silu", "silu", input)


def gelu(input, approximate: str = "none"):  # noqa: A002
    """Reference ``torch.nn.functional.gelu(input, approximate=...)``: ``"none"``, x Phi(x) = x/2 (1 +
    erf(x / sqrt 2)); ``"tanh"``, x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))) with the real constants;
    each correctly rounded (gelu(-inf) is NaN, as torch's formula gives)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: unknown approximate={approximate!r}; choose one of 'none', 'tanh'.")
    return _apply("gelu", "gelu" if approximate == "none" else "gelu_tanh", input)


def erf(input):  # noqa: A002
    """Reference ``torch.erf(input)``: correctly rounded."""
    return _apply("erf", "erf", input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):  # noqa: A002
    """Reference ``torch.nn.functional.softplus(input, beta, threshold)``: x where ``beta x > threshold``
    (the exact product), else log(1 + e**(beta x)) / beta, correctly rounded; beta and threshold are taken
    as the float64 values given."""
    b = _number(beta, "softplus", "beta")
    t = _number(threshold, "softplus", "threshold")
    return _apply("softplus", "softplus", input, (b, t))


def sin(input):  # noqa: A002
    """Reference ``torch.sin(input)``: correctly rounded for every finite argument (exact reduction by pi/2)."""
    return _apply("sin", "sin", input)


def cos(input):  # noqa: A002
    """Reference ``torch.cos(input)``: correctly rounded for every finite argument (exact reduction by pi/2)."""
    return _apply("cos", "cos", input)


def _is_array(v) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype")


def pow_operands(input, exponent, name="pow"):  # noqa: A002
    """torch.pow's operands where either is a tensor of exponents or bases: (x, y, fmt, shape, tensor), x and y
    flat float64 of ``prod(shape)`` elements, both rounded to the result format fmt, as torch's TensorIterator
    casts them to its common dtype before the kernel runs. fmt by torch's promotion: a tensor with dimensions
    before a 0-dim one before a number (within the floating kinds); two of one rank, the wider format
    (float16 with bfloat16: float32)."""
    ops, ranks = [], []
    for v, what in ((input, "input"), (exponent, "exponent")):
        if _is_array(v):
            o = operand(v, what, name)
            ops.append(o)
            ranks.append(2 if len(o.shape) else 1)
        else:
            ops.append(_number(v.item() if hasattr(v, "item") else v, name, what))
            ranks.append(0)
    top = max(ranks)
    fmt = promote(*(o.fmt for o, r in zip(ops, ranks) if r == top))
    vals = [round_array(np.asarray(o.values, np.float64), *fmt.params).reshape(o.shape) if r else  # (0-d stays 0-d)
            np.asarray(o, np.float64) for o, r in zip(ops, ranks)]  # fmt: skip
    x, y = np.broadcast_arrays(*vals)
    tensor = any(r and o.torch for o, r in zip(ops, ranks))
    return np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1), fmt, x.shape, tensor


def pow(input, exponent):  # noqa: A001, A002
    """Reference ``torch.pow(input, exponent)``: x**y correctly rounded, with C99's special values (pow(x, 0) =
    1, pow(1, y) = 1, pow(negative, non-integer) = NaN) and torch's ``y = 0.5`` as sqrt, ``y = -0.5`` as rsqrt.

    A number ``exponent`` is taken as the float64 value given (torch's ``pow(Tensor, Scalar)``). A tensor
    exponent (or a number ``input`` with a tensor exponent) is broadcast against the input, and both are first
    rounded to the result's dtype by torch's promotion (:func:`pow_operands`), as torch casts them: bfloat16
    ``x ** torch.tensor(0.3)`` raises x to bfloat16's 0.30078125."""
    if _is_array(exponent) or not _is_array(input):
        x, y, fmt, shape, tensor = pow_operands(input, exponent)
        return deliver(rounded("pow", x, fmt, (y,)).reshape(shape), fmt, tensor)
    return _apply("pow", "pow", input, (_number(exponent, "pow", "exponent"),))
