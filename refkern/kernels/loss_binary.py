"""``refkern.binary_cross_entropy`` and ``refkern.binary_cross_entropy_with_logits``: torch's semantics,
correctly rounded.

Per element, with weight ``w`` (1 without one; broadcast to the input), target ``y`` and ``C(v) = max(v, -100)``
(torch clamps each log at -100, so ``p = 0`` or ``1`` gives a finite loss):

* ``binary_cross_entropy(p, y)``: ``l = -w (y C(log p) + (1 - y) C(log(1 - p)))``, ``0 <= p <= 1``;
* ``binary_cross_entropy_with_logits(x, y, pos_weight)``: ``l = w ((1 - y) x + (1 + (pw - 1) y) log(1 + e**-x))``
  (torch's ``(1 - y) x + (1 + (pw - 1) y) (log1p(e**-|x|) + max(-x, 0))``, the same real number);

"none" gives ``l``, "sum" ``sum l``, "mean" ``sum l / n``: each result that real number rounded once. A NaN
input or target gives NaN as torch's formula does; an infinite logit the IEEE value of that formula.

Every element is ``a + b1 f1 + b2 f2`` with ``a``, ``b`` exact rationals and ``f`` a (clamped) log. Fast path:
float64 with rigorous bounds (:func:`_log_bounded`: frexp, then :func:`~refkern.kernels._transcendental.log_fast`
on the mantissa and ``k ln 2`` from ln 2 / 64 in parts; ``log(1 + e**-|x|)`` by ``exp_fast`` and ``log_fast``),
summed with ``gamma`` bounds and bracketed (float16/bfloat16/float32 results). The rest (and float64 results):
integer intervals of each log (:mod:`refkern.kernels._exact_real`) at doubling precision, exact rational
coefficients, until the interval rounds alike. A log equal to -100 exactly cannot occur (e**-100 is not
rational), and for coefficients of one sign the value is irrational unless every log term vanishes (then it
is computed exactly), so the loop ends; it refuses after ``2**15`` bits.
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import is_tensor, operand, promote
from refkern._jit import jit
from refkern.accumulate._bits import pow2
from refkern.accumulate.formats import FLOAT64
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._common import deliver
from refkern.kernels._loss_call import reduction_of
from refkern.kernels._transcendental import _C1, _C2, _C3, EXP_FAST_REL, U, exp_fast, log_fast
from refkern.kernels.loss import _bracketed, gamma

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "binary_call", "binary_values"]


@jit(inline="always")
def _log_bounded(s):
    """(L, e): |log s - L| <= e for a float64 s > 0: s = m 2**k, m in [1, 2): log m by log_fast(1, m - 1),
    k ln 2 = 64 k (C1 + C2 + C3) (64 k C1 exact: C1 has 35 bits; the other two products within u each)."""
    fr, ex = math.frexp(s)
    m, k = fr * 2.0, ex - 1
    lm, em = log_fast(1.0, m - 1.0, 0.0)
    kk = 64.0 * k
    a, b, c = kk * _C1, kk * _C2, kk * _C3
    L = (a + (b + (c + lm)))
    return L, em + U * (abs(b) + abs(c)) + 3.0 * U * (abs(a) + abs(b) + abs(c) + abs(lm)) + 2.0**-1070


@jit(inline="always")
def _term_one(kind, x):
    """(f1, e1, f2, e2) of one element: BCE: C(log p), C(log(1 - p)) (e = -1: the clamp is undecided); logits:
    log(1 + e**-x) (f2 unused). NaN where a special value decides the element."""
    f1, e1, f2, e2 = 0.0, 0.0, 0.0, 0.0
    if kind == 0:
        for j in range(2):
            s = x if j == 0 else 1.0 - x  # 1 - p: within u of itself (a relative u moves its log by u)
            if s != s:
                f, e = np.nan, 0.0
            elif s <= 0.0:
                f, e = -100.0, 0.0  # log 0 = -inf, clamped
            else:
                f, e = _log_bounded(s)
                e = e + (1.01 * U if j == 1 else 0.0)
                if f - e > -100.0:
                    pass
                elif f + e < -100.0:
                    f, e = -100.0, 0.0
                else:
                    e = -1.0
            if j == 0:
                f1, e1 = f, e
            else:
                f2, e2 = f, e
        return f1, e1, f2, e2
    if x != x or abs(x) == np.inf:
        return np.nan, 0.0, 0.0, 0.0
    ax = abs(x)
    t, et = 0.0, 2.0**-1074
    if -ax >= -2000.0:
        a, k = exp_fast(-ax)
        t = a * pow2(k) if k >= -1022 else np.ldexp(a, k)  # one correctly rounded product, as ldexp
        et = EXP_FAST_REL * t + 2.0**-1074
    L, eL = log_fast(1.0, t, et)
    return L + max(-x, 0.0), eL + U * (L + max(-x, 0.0)), 0.0, 0.0


@jit(parallel=True)
def _values(kind, P, Y, Wt, PW, g8, v, E, flags):
    """Per element the float64 value ``v = a + b1 f1 + b2 f2`` (``a, b1, b2``: BCE ``0, -w y, -w (1 - y)``;
    logits ``w (1 - y) x, w (1 + (pw - 1) y), 0``), its bound ``E = (gamma_8 (|a| + |b1 f1| + |b2 f2|) + |b1| |e1|
    + |b2| |e2|) 1.01`` and flags: 1 the clamp undecided, 2 special (v or an operand not finite)."""
    for i in prange(P.size):
        x, y, w, pw = P[i], Y[i], Wt[i], PW[i]
        f1, e1, f2, e2 = _term_one(kind, x)
        if kind == 0:
            a, b1, b2 = 0.0, -w * y, -w * (1.0 - y)
            vi = a + b1 * f1 + b2 * f2
        else:
            a, b1, b2 = w * (1.0 - y) * x, w * (1.0 + (pw - 1.0) * y), 0.0
            vi = a + b1 * f1 + 0.0
        mag = abs(a) + abs(b1 * f1) + abs(b2 * f2)
        v[i] = vi
        E[i] = (g8 * mag + abs(b1) * abs(e1) + abs(b2) * abs(e2)) * 1.01
        fl = 1 if (e1 < 0 or e2 < 0) else 0
        if not (abs(vi) < np.inf and abs(x) < np.inf and abs(y) < np.inf and abs(w) < np.inf and abs(pw) < np.inf):
            fl |= 2
        flags[i] = fl


def binary_call(op, input, target, weight=None, size_average=None, reduce=None, reduction="mean",  # noqa: A002
                pos_weight=None):  # fmt: skip
    """(x, y, w, pw) float64 arrays of the input's shape, the format, tensors out, the reduction."""
    red = reduction_of(reduction, size_average, reduce, op)
    ox, ot = operand(input, "input", op), operand(target, "target", op)
    if tuple(ot.shape) != tuple(ox.shape):
        raise ValueError(f"{op}: target must have the input's shape {tuple(ox.shape)}; got target.shape="
                         f"{tuple(ot.shape)}.")  # fmt: skip
    shape = tuple(ox.shape)
    x = np.asarray(ox.values, np.float64).reshape(shape)
    y = np.asarray(ot.values, np.float64).reshape(shape)
    fmts = [ox.fmt, ot.fmt]

    def bc(v, name):
        if v is None:
            return np.ones(shape)
        o = operand(v, name, op)
        fmts.append(o.fmt)
        try:
            return np.broadcast_to(np.asarray(o.values, np.float64).reshape(o.shape), shape)
        except ValueError:
            raise ValueError(f"{op}: {name} must broadcast to the input's shape {shape}; got {name}.shape="
                             f"{tuple(o.shape)}.") from None  # fmt: skip

    w, pw = bc(weight, "weight"), bc(pos_weight, "pos_weight")
    if op == "binary_cross_entropy":
        bad = (x < 0) | (x > 1)
        if bad.any():
            raise ValueError(f"{op}: every element of input must lie in [0, 1]; got {float(x[bad][0])!r}.")
    tensor = any(is_tensor(v) for v in (input, target, weight, pos_weight))
    return x, y, w, pw, promote(*fmts), tensor, red


def _exact_coefficients(op, x, y, w, pw):
    F = Fraction
    x, y, w, pw = F(float(x)), F(float(y)), F(float(w)), F(float(pw))
    if op == "binary_cross_entropy":
        return F(0), -w * y, -w * (1 - y)
    return w * (1 - y) * x, w * (1 + (pw - 1) * y), F(0)


def _log_iv(q: Fraction, W):
    """(lo, hi) Fractions enclosing C(log q), q > 0 rational dyadic; exact -100 where the clamp decides, exact 0
    for q = 1 (log of any other positive rational is irrational, by Lindemann)."""
    if q == 1:
        return Fraction(0), Fraction(0)
    n, e = xr.dyadic(q)
    lo, hi, _ = xr.log_interval(n, n, e, W)
    lo, hi = Fraction(lo, 1 << W), Fraction(hi, 1 << W)
    return max(lo, Fraction(-100)), max(hi, Fraction(-100))


def _softplus_iv(x: Fraction, W):
    """(lo, hi) enclosing log(1 + e**-x) = max(-x, 0) + log(1 + e**-|x|)."""
    ax = abs(x)
    base = max(-x, Fraction(0))
    if ax > (W + 8) * Fraction(7, 10):  # e**-|x| < 2**-(W+8): log(1 + t) in [0, t]
        return base, base + Fraction(1, 1 << W)
    n, e = xr.dyadic(-ax)
    t_lo, t_hi, k = xr.exp_interval(n, e, W + 8)
    s = W + 8
    T_lo, T_hi = Fraction(t_lo) * Fraction(2) ** k, Fraction(t_hi) * Fraction(2) ** k
    a = math.floor((1 + T_lo) * (1 << s))
    b = math.ceil((1 + T_hi) * (1 << s))
    lo, hi, _ = xr.log_interval(a, b, -s, W)
    return base + Fraction(lo, 1 << W), base + Fraction(hi, 1 << W)


def _element_iv(op, xi, coef, W):
    a, b1, b2 = coef
    if op == "binary_cross_entropy":
        p = Fraction(float(xi))
        ivs = [(b1, _log_iv(p, W) if p > 0 else (Fraction(-100),) * 2),
               (b2, _log_iv(1 - p, W) if p < 1 else (Fraction(-100),) * 2)]  # fmt: skip
    else:
        ivs = [(b1, _softplus_iv(Fraction(float(xi)), W))]
    lo = hi = a
    for b, (l, h) in ivs:
        if b != 0:
            lo, hi = lo + min(b * l, b * h), hi + max(b * l, b * h)
    return lo, hi


def _decide(lo, hi, fmt):
    ra, rb = round_fraction(lo, fmt), round_fraction(hi, fmt)
    return ra if ra == rb and math.copysign(1.0, ra) == math.copysign(1.0, rb) else None


def _exact(op, x, y, w, pw, idx, fmt, red):
    """The exact path: (the rounded values of the elements ``idx`` for "none", else the rounded sum or mean)."""
    coefs = [_exact_coefficients(op, x[i], y[i], w[i], pw[i]) for i in idx]
    W = 96
    if red == "none":
        out, left = {}, list(range(len(idx)))
        while left and W <= 1 << 15:
            nxt = []
            for j in left:
                r = _decide(*_element_iv(op, x[idx[j]], coefs[j], W), fmt)
                if r is None:
                    nxt.append(j)
                else:
                    out[idx[j]] = r
            left, W = nxt, W * 2
        if left:
            raise RuntimeError(f"{op}: the exact path did not converge within {1 << 15} bits.")
        return out
    while W <= 1 << 15:
        ivs = [_element_iv(op, x[i], c, W) for i, c in zip(idx, coefs)]
        lo, hi = sum((v[0] for v in ivs), Fraction(0)), sum((v[1] for v in ivs), Fraction(0))
        if red == "mean":
            lo, hi = lo / len(idx), hi / len(idx)
        v = _decide(lo, hi, fmt)
        if v is not None:
            return v
        W *= 2
    raise RuntimeError(f"{op}: the exact path did not converge within {1 << 15} bits.")


def binary_values(op, x, y, w, pw, fmt, red) -> np.ndarray:
    """The correctly rounded result, float64 values (the input's shape for "none", else 0-d)."""
    shape = x.shape
    xf, yf, wf, pwf = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (x, y, w, pw))
    n = xf.size
    v, E, flags = np.empty(n), np.empty(n), np.zeros(n, np.int8)
    if n:
        _values(0 if op == "binary_cross_entropy" else 1, xf, yf, wf, pwf, float(gamma(8)), v, E, flags)
    undecided = (flags & 1) != 0
    special = (flags & 2) != 0
    narrow = fmt.prec < FLOAT64.prec
    if red == "none":
        out, ok = _bracketed(v, np.where(undecided, np.inf, E), fmt) if narrow else (np.full(n, np.nan),
                                                                                     np.zeros(n, np.bool_))
        out = np.where(special, v, out)
        todo = np.flatnonzero(~ok & ~special)
        for i, r in (_exact(op, xf, yf, wf, pwf, [int(i) for i in todo], fmt, "none").items() if todo.size else ()):
            out[i] = r
        return out.reshape(shape)
    if special.any():
        s = v[special].sum()
        return np.asarray(s / n if red == "mean" else s, np.float64)
    if n == 0:
        return np.asarray(np.nan if red == "mean" else 0.0)
    if narrow and not undecided.any():
        tot, Et = v.sum(), E.sum() + gamma(n + 1) * np.abs(v).sum()
        if red == "mean":
            tot, Et = tot / n, Et / n + 2 * U * abs(tot / n)
        r, ok = _bracketed(np.asarray([tot]), np.asarray([Et]), fmt)
        if ok[0]:
            return np.asarray(r[0], np.float64)
    return np.asarray(_exact(op, xf, yf, wf, pwf, list(range(n)), fmt, red), np.float64)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                         reduction: str = "mean"):  # fmt: skip
    """Reference ``torch.nn.functional.binary_cross_entropy`` (module docstring)."""
    x, y, w, pw, fmt, tensor, red = binary_call("binary_cross_entropy", input, target, weight, size_average, reduce,
                                                reduction)  # fmt: skip
    return deliver(np.asarray(binary_values("binary_cross_entropy", x, y, w, pw, fmt, red), np.float64), fmt, tensor)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                                     reduction: str = "mean", pos_weight=None):  # fmt: skip
    """Reference ``torch.nn.functional.binary_cross_entropy_with_logits`` (module docstring)."""
    op = "binary_cross_entropy_with_logits"
    x, y, w, pw, fmt, tensor, red = binary_call(op, input, target, weight, size_average, reduce, reduction, pos_weight)
    return deliver(np.asarray(binary_values(op, x, y, w, pw, fmt, red), np.float64), fmt, tensor)


@jit(inline="always")
def _part(b, f, t, u):
    """(|b fc|, |b| (ef + edge)) of one log term of :func:`refkern.analysis.losses.binary_envelope`."""
    fc = f if (f != f or f > -100.0) else -100.0  # np.maximum(f, -100): NaN stays NaN
    ef = 2 * u * abs(fc) + u + 2 * u * t
    ff = f if abs(f) < np.inf else -1e300
    edge = abs(f + 100.0) if abs(ff + 100.0) <= ef * 1.01 else 0.0
    if edge != edge:  # np.nan_to_num
        edge = 0.0
    elif edge == np.inf:
        edge = 1.7976931348623157e308
    return abs(b * fc), abs(b) * (ef + edge), fc


@jit(parallel=True)
def _binary_bound(bce, x, y, w, pw, u, g8, lv, e, mag):
    """Per element of binary_cross_entropy (``bce``) or its logits form: the value ``|l|``, its envelope before the
    reduction and its terms' magnitude, as :func:`refkern.analysis.losses.binary_envelope` states them."""
    for i in prange(x.size):
        xi, yi, wi = x[i], y[i], w[i]
        if bce:
            a, b1, b2 = 0.0, -wi * yi, -wi * (1.0 - yi)
            f1 = np.log(xi) if xi > 0 else -np.inf  # NaN too, as np.where(x > 0, log x, -inf)
            f2 = np.log1p(-xi)
            t = 0.0
        else:
            a, b1, b2 = wi * (1.0 - yi) * xi, wi * (1.0 + (pw[i] - 1.0) * yi), 0.0
            t = np.exp(-abs(xi))
            f1 = np.log1p(t) + (-xi if -xi > 0.0 or xi != xi else 0.0)
            f2 = 0.0
        m1, e1, c1 = _part(b1, f1, t, u)
        m2, e2, c2 = _part(b2, f2, t, u)
        mg = abs(a) + m1 + m2
        mag[i] = mg
        e[i] = g8 * mg + e1 + e2
        lv[i] = abs(a + b1 * c1 + b2 * c2)


def binary_bound_terms(op, x, y, w, pw, u, g8):
    """(lv, e, mag) float64 arrays of :func:`_binary_bound` for the flattened operands."""
    xf, yf, wf, pwf = (np.ascontiguousarray(np.asarray(v, np.float64).reshape(-1)) for v in (x, y, w, pw))
    lv, e, mag = np.empty(xf.size), np.empty(xf.size), np.empty(xf.size)
    if xf.size:
        _binary_bound(op == "binary_cross_entropy", xf, yf, wf, pwf, float(u), float(g8), lv, e, mag)
    return lv, e, mag
