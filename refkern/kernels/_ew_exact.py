"""The exact path of the elementwise functions: rigorous intervals on Python integers, raised in
precision until both ends round alike (Ziv's strategy), for the few elements whose double-word bound
straddles a rounding boundary of the result format.

Nothing here uses floating point, mpmath or the jitted numerics. A value is an interval
``[lo, hi] * 2**sh`` of integers that provably contains it (:data:`I`); every operation rounds its
ends outward, so the containment survives any composition. The primitives and their error accounting
(``w`` is the working precision in bits):

* ``atan(1/n) 2**w``, n >= 5: the alternating series ``sum (-1)**j / ((2j+1) n**(2j+1))`` with floors;
  each power ``p_j = floor(p_{j-1} / n**2)`` is within 1.05 of exact (errors shrink by n**2 >= 25), each
  term within 2.1, the tail below the first omitted term: within ``3 J + 2`` after J terms.
  ``pi = 16 atan(1/5) - 4 atan(1/239)`` (Machin).
* ``exp``: :func:`refkern.kernels._exact_real.exp_interval` at each end (exp is increasing).
* ``log``: :func:`refkern.kernels._exact_real.log_interval` (increasing).
* ``sqrt``: ``isqrt`` of the scaled ends, the upper one plus one.
* ``sin r``, ``cos r`` for ``|r| <= 1`` (after reduction by an interval of pi/2): Taylor series in fixed
  point, terms ``t_k = trunc(t_{k-1} r**2 / ((2k)(2k+1)))``: each within 2 of exact, the tail (terms
  decreasing and alternating) below the last term; sin is increasing on [-1, 1], cos is even and
  decreasing in |r|.
* ``erf x = 2/sqrt(pi) e**(-x**2) sum_n 2**n x**(2n+1) / (2n+1)!!`` (Abramowitz & Stegun 7.1.6): positive
  terms, each floored (within 3 of exact), stopped at a zero term with the ratio ``2 x**2 / (2n + 3)``
  below 1/2 (tail below 6); erf is increasing, so the ends come from the ends.

Elements whose value is exactly representable or an exact midpoint never reach a loop here: the
callers (:mod:`refkern.kernels.elementwise`) decide them first, and for the rest the value is
irrational (Lindemann-Weierstrass: e**a, log a, sin a, cos a, tanh a, erf a are irrational for algebraic
a != 0 (erf: by its series, for rational a != 0)) or a non-dyadic rational, so a finite precision
always decides it. :func:`ziv` raises after 2**16 bits rather than loop.
"""

import math
from fractions import Fraction
from functools import lru_cache

from refkern.kernels import _exact_real as xr

__all__ = ["I", "point", "add", "neg", "mul", "div", "exp", "log", "sqrt", "sin_cos", "erf", "pi_interval",
           "const", "ziv", "round_rational", "MAX_BITS"]  # fmt: skip

MAX_BITS = 1 << 16  #: the exact path gives up (RuntimeError) beyond this working precision


def _norm(lo, hi, sh, w):
    """Outward rounding to about ``w + 4`` significant bits."""
    b = max(abs(lo).bit_length(), abs(hi).bit_length())
    d = b - (w + 4)
    if d > 0:
        return lo >> d, -((-hi) >> d), sh + d
    return lo, hi, sh


def I(lo, hi, sh):  # noqa: E743
    return (lo, hi, sh)


def point(x) -> tuple:
    """The exact interval of a float or a dyadic Fraction."""
    n, e = xr.dyadic(Fraction(x) if not isinstance(x, float) else x)
    return n, n, e


def neg(a):
    return -a[1], -a[0], a[2]


def add(a, b, w):
    s = min(a[2], b[2])
    return _norm((a[0] << (a[2] - s)) + (b[0] << (b[2] - s)), (a[1] << (a[2] - s)) + (b[1] << (b[2] - s)), s, w)


def mul(a, b, w):
    c = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return _norm(min(c), max(c), a[2] + b[2], w)


def div(a, b, w):
    """a / b, b not containing 0."""
    if b[0] <= 0 <= b[1]:
        raise ZeroDivisionError("ew_exact.div: the divisor's interval contains 0")
    S = w + 8 + max(abs(b[0]).bit_length(), abs(b[1]).bit_length())
    los, his = [], []
    for x in (a[0], a[1]):
        for y in (b[0], b[1]):
            num = x << S
            los.append(num // y)
            his.append(-((-num) // y))
    return _norm(min(los), max(his), a[2] - b[2] - S, w)


def _floor_at(a_n, sh, W):
    """floor(a_n * 2**(sh + W))."""
    s = sh + W
    return a_n << s if s >= 0 else a_n >> -s


def _ceil_at(a_n, sh, W):
    return -_floor_at(-a_n, sh, W)


def exp(a, w):
    """e**a for an interval a with ends below 2**23 in magnitude."""
    lo = xr.exp_interval(a[0], a[2], w)
    hi = xr.exp_interval(a[1], a[2], w)
    s = min(lo[2], hi[2])
    return _norm(lo[0] << (lo[2] - s), hi[1] << (hi[2] - s), s, w)


def log(a, w):
    """log a for an interval of positive reals."""
    if a[0] <= 0:
        raise ValueError("ew_exact.log: the interval reaches 0")
    lo, hi, s = xr.log_interval(a[0], a[1], a[2], w + 8)
    return _norm(lo, hi, s, w)


def sqrt(a, w):
    lo, hi, sh = a
    if lo < 0:
        raise ValueError("ew_exact.sqrt: negative interval")
    t = 2 * (w + 8) - hi.bit_length()
    t = max(t, 0)
    if (sh - t) % 2:
        t += 1
    return _norm(math.isqrt(lo << t), math.isqrt(hi << t) + 1, (sh - t) // 2, w)


def _atan_inv(n, w):
    s, p, j = 0, (1 << w) // n, 0
    n2 = n * n
    while p:
        t = p // (2 * j + 1)
        s += -t if j % 2 else t
        p //= n2
        j += 1
    return s - 3 * j - 2, s + 3 * j + 2


@lru_cache(maxsize=32)
def pi_interval(w: int):
    """(lo, hi, -w) with lo 2**-w <= pi <= hi 2**-w (Machin's formula, module docstring)."""
    a = _atan_inv(5, w)
    b = _atan_inv(239, w)
    return 16 * a[0] - 4 * b[1], 16 * a[1] - 4 * b[0], -w


@lru_cache(maxsize=256)
def const(name: str, w: int):
    """Intervals of the constants the functions use: pi/2, 2/sqrt(pi), 1/sqrt(2), sqrt(2/pi), ln 2."""
    pi = pi_interval(w + 16)
    if name == "pi/2":
        return _norm(pi[0], pi[1], pi[2] - 1, w)
    if name == "2/sqrt(pi)":
        return div(point(2.0), sqrt(pi, w + 8), w)
    if name == "1/sqrt(2)":
        return sqrt(point(0.5), w)
    if name == "sqrt(2/pi)":
        return sqrt(div(point(2.0), pi, w + 8), w)
    if name == "ln2":
        lo, hi = xr.ln2_fixed(w + 8)
        return lo, hi, -(w + 8)
    raise KeyError(name)


def _fixed(a, W):
    """The interval a as fixed-point integers with unit 2**-W (outward)."""
    return _floor_at(a[0], a[2], W), _ceil_at(a[1], a[2], W)


def _sin_cos_fixed(R, W):
    """(sin, err_s, cos, err_c) in units 2**-W for the exact r = R 2**-W, |r| <= 1 (module docstring)."""
    one = 1 << W
    A = abs(R)
    r2 = (A * A) >> W
    s, t, k = A, A, 0
    while t:
        k += 1
        t = ((t * r2) >> W) // ((2 * k) * (2 * k + 1))
        s += -t if k % 2 else t
    c, t, j = one, one, 0
    while t:
        j += 1
        t = ((t * r2) >> W) // ((2 * j - 1) * (2 * j))
        c += -t if j % 2 else t
    return (s if R >= 0 else -s), 3 * k + 4, c, 3 * j + 4


def sin_cos(a, w, which):
    """sin or cos (``which``) of an interval a of small width (reduced by pi/2 first)."""
    x = xr.approx(a[0], a[2])
    mag = max(0, int(abs(x)).bit_length())
    W = w + 16 + mag
    p2 = const("pi/2", W + mag + 8)
    # r = a - n pi/2, as fixed point at 2**-W, n the nearest integer to a / (pi/2)
    alo, ahi = _fixed(a, W)
    plo, phi = _fixed(p2, W)
    n = (2 * alo + plo) // (2 * plo)
    np_ = sorted((n * plo, n * phi))
    rlo, rhi = alo - np_[1], ahi - np_[0]
    one = 1 << W
    if not (-one < rlo and rhi < one):
        raise ValueError("ew_exact.sin_cos: the reduced interval is not within [-1, 1]")
    q = n % 4
    want_sin = (which == "sin") == (q % 2 == 0)  # sin x = [sin r, cos r, -sin r, -cos r][q]; cos shifted by one
    sign = -1 if (q in (2, 3) if which == "sin" else q in (1, 2)) else 1
    ends = []
    for R in (rlo, rhi):
        s, es, c, ec = _sin_cos_fixed(R, W)
        ends.append((s - es, s + es) if want_sin else (c - ec, c + ec))
    if want_sin:  # sin increasing on [-1, 1]
        lo, hi = ends[0][0], ends[1][1]
    else:  # cos decreasing in |r|
        lo = min(ends[0][0], ends[1][0])
        hi = one if rlo <= 0 <= rhi else max(ends[0][1], ends[1][1])
    if sign < 0:
        lo, hi = -hi, -lo
    return _norm(lo, hi, -W, w)


def _erf_sum(X, W):
    """(s, err) with |sum_n 2**n x**(2n+1) / (2n+1)!! 2**W - s| <= err for the exact x = X 2**-W >= 0."""
    x2 = (X * X) >> W
    s, t, n = X, X, 0
    while True:
        n += 1
        t = (2 * t * x2 >> W) // (2 * n + 1)
        s += t
        if t == 0 and 4 * x2 < (2 * n + 3) << W:  # the exact term below 3, the ratio below 1/2: tail < 6
            break
    return s, 3 * n + 10


def erf(a, w, complement=False):
    """erf (or erfc with ``complement``) of an interval a of nonnegative reals (module docstring)."""
    x_hi = xr.approx(a[1], a[2])
    W = w + 16 + int(2.0 * x_hi * x_hi) + 8  # erfc loses about x**2 log2(e) bits to cancellation
    k = const("2/sqrt(pi)", W)
    ends = []
    for X, up in ((_floor_at(a[0], a[2], W), False), (_ceil_at(a[1], a[2], W), True)):
        s, es = _erf_sum(X, W)
        e = xr.exp_interval(-(X * X), -2 * W, W)  # e**(-x**2), x exact at this scale
        S = (s + es, 0) if up else (s - es, 0)
        val = mul(mul((S[0], S[0], -W), (e[1] if up else e[0],) * 2 + (e[2],), W), k, W)
        ends.append(val)
    s = min(ends[0][2], ends[1][2])
    lo, hi = ends[0][0] << (ends[0][2] - s), ends[1][1] << (ends[1][2] - s)
    if complement:
        return _norm((1 << -s) - hi if s < 0 else 1 - hi, (1 << -s) - lo if s < 0 else 1 - lo, s, w)
    return _norm(lo, hi, s, w)


def round_rational(num: int, den: int, prec: int, emin: int, emax: int) -> float:
    """num / den (den > 0) rounded once to nearest even in the format (subnormals, overflow, -0.0)."""
    if num == 0:
        return 0.0
    neg_ = num < 0
    n = -num if neg_ else num
    top = n.bit_length() - den.bit_length()  # 2**(top-1) < n / den < 2**(top+1)
    lsb = max(top - prec - 2, emin - prec - 1)
    q, r = divmod(n << -lsb if lsb < 0 else n, den << lsb if lsb > 0 else den)
    q = 2 * q + (1 if r else 0)  # a sticky bit below the quotient
    v = xr.round_dyadic(q, lsb - 1, prec, emin, emax)
    return -v if neg_ else v


def ziv(f, prec, emin, emax, w0=96):
    """The rounding of the value whose intervals ``f(w)`` gives at precision w: raised until both ends
    round alike (RuntimeError beyond :data:`MAX_BITS`)."""
    w = w0
    while w <= MAX_BITS:
        lo, hi, sh = f(w)
        r = xr.round_interval(lo, hi, sh, prec, emin, emax)
        if r is not None:
            return r
        w *= 2
    raise RuntimeError("elementwise: the exact path did not decide a rounding within 2**16 bits")
