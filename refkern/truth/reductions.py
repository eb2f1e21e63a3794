"""Ground truth of the reductions, and what the normalizations (:mod:`refkern.truth.norms`) and poolings
(:mod:`refkern.truth.pools`) share with them: exact rationals and mpmath, rounded once.

Ops (torch's names, signatures and semantics): ``sum``, ``mean``, ``var``, ``std``, ``cumsum``,
``layer_norm``, ``rms_norm``, ``group_norm``, ``batch_norm``, ``avg_pool1d``, ``avg_pool2d``,
``max_pool1d``, ``max_pool2d``, ``adaptive_avg_pool1d``, ``adaptive_avg_pool2d``. Every output
element is the value of the op's real-valued definition on the given inputs, rounded once (to
nearest, ties to even) to the result format: subnormal results, overflow to inf only when the real
value rounds beyond the largest finite number, no intermediate overflow (the mean of float64
values near 1.6e308 is finite).

How, sharing nothing with the fast path:

* Rational values (sums, means, ``M2 = sum (x - mean)**2`` with the exact mean, variances, window
  averages, running-stat updates) are exact: a finite float is the dyadic rational
  ``n * 2**e`` of ``float.as_integer_ratio``; a set of them is summed as Python integers on the
  grid of the lowest ``e``, and divisions are :class:`fractions.Fraction`. One rational is rounded
  once by :func:`round_fraction` (integer division with a sticky bit, then
  :func:`refkern.truth.products.round_exact`).
* The normalizations divide by a square root. Every such output is
  ``y = s * sqrt(Q) + B`` with ``Q > 0`` and ``B`` exact rationals and ``s = +-1`` (``Q =
  (x - mean)**2 * w**2 / (var + eps)``, ``B = bias``; ``std``: ``Q = var``, ``B = 0``).
  :func:`round_sqrt_form` encloses ``y`` with mpmath's directed roundings (``mpf_div``,
  ``mpf_sqrt``, ``mpf_add`` toward -inf and +inf, each a rigorous bound) at precision ``p`` and
  doubles ``p`` until both ends round to the same value (Ziv's strategy). A midpoint ``m`` of
  the rounding grid can never be separated from ``y = m`` that way, so each candidate midpoint is
  decided exactly (``y == m`` iff ``m - B`` has the sign ``s`` and ``(m - B)**2 == Q``): the loop
  always ends.

Special values follow IEEE 754 applied to the definition's formula: a NaN term or ``+inf`` with
``-inf`` gives NaN, ``0 * inf`` gives NaN, ``1 / sqrt(0) = inf``, ``1 / sqrt(inf) = 0``, the
square root of a negative number is NaN. Signed zeros: an exact sum (mean, cumsum prefix, pooling
window) is -0 only when it has terms and every one is -0; an exact zero of a normalization takes
IEEE's signs along ``((x - mean) / sqrt(var + eps)) * w + b`` (``x - mean`` is -0 only for
``-0 - (+0)``; a product's zero has the sign of its factors; ``b`` absent means nothing is added;
``-0 + -0 = -0``; an exact cancellation of nonzero values is +0); a nonzero value that rounds to
zero keeps its sign.

Results: a numpy array of the result dtype (a numpy scalar for a 0-d result; float32 for
bfloat16 when ml_dtypes is missing), or a CPU tensor when any input is a tensor.
"""

import builtins
import math
import operator
import sys
from fractions import Fraction

import numpy as np
from mpmath.libmp import from_int, mpf_add, mpf_div, mpf_neg, mpf_sqrt, round_ceiling, round_floor

from refkern._arrays import format_of, operand
from refkern.accumulate.formats import Format
from refkern.truth.products import round_exact

__all__ = ["sum", "mean", "var", "std", "cumsum", "round_fraction", "round_sqrt_form"]

NAN, INF = math.nan, math.inf
_int_sum = builtins.sum  # this module's sum is the op
_ZERO = Fraction(0)
_MAX_PREC = 1 << 22  # Ziv's loop ends long before this (a midpoint is decided exactly); a guard, not a bound


# --- rounding ---------------------------------------------------------------------------------------------------------


def round_fraction(q: Fraction, fmt: Format) -> float:
    """Round the rational ``q`` once to ``fmt`` (nearest, ties to even, subnormals, overflow to inf).

    With ``t = floor(log2|q|)``, ``L = e - prec - 2`` (``e`` = bit length of the numerator minus that
    of the denominator, ``t`` is ``e`` or ``e - 1``) lies at least two bits below the last kept bit,
    so ``floor(|q| / 2**L)`` and one sticky bit (is the remainder nonzero) round exactly as ``q``.
    Zero gives +0.0; a nonzero value that rounds to zero keeps its sign.
    """
    if q == 0:
        return 0.0
    num, den = abs(q.numerator), q.denominator
    low = num.bit_length() - den.bit_length() - fmt.prec - 2
    m, r = divmod(num << -low, den) if low < 0 else divmod(num, den << low)
    return round_exact(q < 0, 2 * m + (r != 0), low - 1, fmt)


def _round_mpf(t, fmt: Format) -> float:
    sign, man, exp, _ = t
    return round_exact(bool(sign), int(man), int(exp), fmt) if man else 0.0


def _same(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _grid_value(v: float, fmt: Format) -> Fraction:
    """A rounded value as a rational; +-inf stands for +-2**(emax + 1), the next grid point."""
    return Fraction(v) if math.isfinite(v) else Fraction(2) ** (fmt.emax + 1) * (1 if v > 0 else -1)


def round_sqrt_form(s: int, q: Fraction, b: Fraction, fmt: Format) -> float:
    """Round ``y = s * sqrt(q) + b`` (``s = +-1``, ``q > 0``, ``y != 0``) once to ``fmt``.

    Ziv's loop: at precision ``p`` the enclosure ``[lo, hi]`` of ``y`` comes from mpmath's
    directed roundings (floor for ``lo``, ceiling for ``hi``; every step is a rigorous bound); when
    ``lo`` and ``hi`` round to the same value (sign of zero included) that is the correctly rounded
    ``y``, by monotonicity of rounding. Otherwise the midpoint ``m`` between their roundings is tested
    exactly: if ``y == m`` (``m - b`` has the sign ``s`` and ``(m - b)**2 == q``) the answer is ``m``
    rounded (ties to even); else ``p`` doubles. A ``y`` that is not a midpoint lies inside a rounding
    cell, so the enclosure eventually falls inside it; a ``y`` that is one is found by the test.
    """
    if q <= 0 or s not in (1, -1):
        raise ValueError(f"round_sqrt_form: expected s = +-1 and q > 0; got s={s!r}, q={q!r}.")
    qn, qd = from_int(q.numerator), from_int(q.denominator)
    bn, bd = from_int(b.numerator), from_int(b.denominator)
    tried = set()
    p = 2 * fmt.prec + 16
    while p <= _MAX_PREC:
        t_lo = mpf_sqrt(mpf_div(qn, qd, p, round_floor), p, round_floor)  # <= sqrt(q)
        t_hi = mpf_sqrt(mpf_div(qn, qd, p, round_ceiling), p, round_ceiling)  # >= sqrt(q)
        if s < 0:
            t_lo, t_hi = mpf_neg(t_hi), mpf_neg(t_lo)
        lo = mpf_add(t_lo, mpf_div(bn, bd, p, round_floor), p, round_floor)
        hi = mpf_add(t_hi, mpf_div(bn, bd, p, round_ceiling), p, round_ceiling)
        r_lo, r_hi = _round_mpf(lo, fmt), _round_mpf(hi, fmt)
        if _same(r_lo, r_hi):
            return r_lo
        m = (_grid_value(r_lo, fmt) + _grid_value(r_hi, fmt)) / 2
        if m != 0 and m not in tried:
            tried.add(m)
            d = m - b
            if d != 0 and (d > 0) == (s > 0) and d * d == q:  # y == m exactly
                return round_fraction(m, fmt)
        p *= 2
    raise RuntimeError(f"round_sqrt_form: no decision at {_MAX_PREC} bits for s={s}, q={q}, b={b}.")


# --- extended values: a Fraction (finite; Fraction(0) is +0) or a float in {nan, +inf, -inf, -0.0} -------------------


def _ext(v: float):
    if v == 0:
        return -0.0 if math.copysign(1.0, v) < 0 else _ZERO
    return Fraction(v) if math.isfinite(v) else float(v)


def _negative(v) -> bool:
    return v < 0 if isinstance(v, Fraction) else math.copysign(1.0, v) < 0


def _zero(negative: bool):
    return -0.0 if negative else _ZERO


def _neg(v):
    if isinstance(v, Fraction):
        return -v if v != 0 else -0.0
    return _ext(-v)


def _add(a, b):
    """IEEE ``a + b`` of extended values, exact."""
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return NAN
    a_inf = isinstance(a, float) and math.isinf(a)
    b_inf = isinstance(b, float) and math.isinf(b)
    if a_inf or b_inf:
        if a_inf and b_inf and a != b:
            return NAN  # inf - inf
        return a if a_inf else b
    if a == 0 and b == 0:
        return _zero(_negative(a) and _negative(b))
    return Fraction(a) + Fraction(b)  # an exact cancellation of nonzero values is +0


def _mul(a, b):
    """IEEE ``a * b`` of extended values, exact."""
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return NAN
    sign = _negative(a) != _negative(b)
    if isinstance(a, float) and math.isinf(a) or isinstance(b, float) and math.isinf(b):
        return NAN if a == 0 or b == 0 else (-INF if sign else INF)
    if a == 0 or b == 0:
        return _zero(sign)
    return a * b


def _div_count(v, n: int):
    """``v / n`` for a count ``n >= 1`` (or a nonzero divisor_override, which may be negative)."""
    if isinstance(v, Fraction):
        return v / n if v != 0 else _zero(n < 0)
    return _ext(v / n) if not math.isnan(v) else NAN  # inf / n keeps inf; -0.0 / n a signed zero


def _out(v, fmt: Format) -> float:
    return round_fraction(v, fmt) if isinstance(v, Fraction) else v


# --- exact sums and moments -------------------------------------------------------------------------------------------


def _dyadic(values: list) -> tuple[list, int]:
    """Finite floats as integers on one grid: ``values[i] == ints[i] * 2**e`` exactly."""
    pairs = [v.as_integer_ratio() for v in values]
    exps = [1 - d.bit_length() for _, d in pairs]  # the denominator is a power of two
    e = min(exps, default=0)
    return [n << (k - e) for (n, _), k in zip(pairs, exps)], e


def _scaled(m: int, e: int) -> Fraction:
    return Fraction(m << e) if e >= 0 else Fraction(m, 1 << -e)


def _specials(values: list):
    """NaN, or the inf of the values (``+inf`` with ``-inf`` is NaN), or None when all are finite."""
    pos = neg = False
    for v in values:
        if math.isnan(v):
            return NAN
        if math.isinf(v):
            pos, neg = pos or v > 0, neg or v < 0
    if pos and neg:
        return NAN
    return INF if pos else (-INF if neg else None)


def _sum(values: list):
    """Exact sum of floats as an extended value: -0 only when there are terms and all are -0."""
    special = _specials(values)
    if special is not None:
        return special
    ints, e = _dyadic(values)
    total = _scaled(_int_sum(ints), e)  # Python ints: exact
    if total == 0:
        return _zero(bool(values) and all(math.copysign(1.0, v) < 0 for v in values))
    return total


def _moments(values: list):
    """(exact mean, exact ``M2 = sum (x - mean)**2``) as extended values; M2 is NaN if a value is not finite.

    On one integer grid ``x_i = m_i * 2**e``, ``S = sum m_i``: ``x_i - mean = (n m_i - S) / n * 2**e``,
    so ``M2 = sum (n m_i - S)**2 / n**2 * 4**e`` (integers until the last division).
    """
    n = len(values)
    mean = _div_count(_sum(values), n) if n else NAN
    if _specials(values) is not None:
        return mean, NAN
    ints, e = _dyadic(values)
    s = _int_sum(ints)
    t = _int_sum((n * m - s) ** 2 for m in ints)
    return mean, _scaled(t, 2 * e) / (n * n) if n else _ZERO


def _mean_square(values: list):
    """Exact ``mean(x**2)``: NaN with a NaN (or no values), +inf with an inf."""
    if not values or any(math.isnan(v) for v in values):
        return NAN
    if any(math.isinf(v) for v in values):
        return INF
    ints, e = _dyadic(values)
    return _scaled(_int_sum(m * m for m in ints), 2 * e) / len(values)


# --- containers, dims -------------------------------------------------------------------------------------------------


def _finish(out64: np.ndarray, fmt: Format, as_tensor: bool):
    """Float64 values that ``fmt`` holds exactly, in ``fmt`` (the conversion is exact)."""
    if as_tensor:
        torch = sys.modules["torch"]
        return torch.from_numpy(np.array(out64, dtype=np.float64, order="C")).to(getattr(torch, fmt.name))
    if fmt.name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # bfloat16 came from torch in a mixed call; keep it lossless
            arr = out64.astype(np.float32)
        else:
            arr = out64.astype(ml_dtypes.bfloat16)
    else:
        arr = out64.astype(fmt.name)
    return arr[()] if arr.ndim == 0 else arr


def _f64(o) -> np.ndarray:
    return np.asarray(o.values, dtype=np.float64)


def _dims(op: str, dim, ndim: int, *, single: bool = False) -> tuple:
    """torch's dim argument: None, () or [] for all dims; an int or a tuple of ints, negative allowed."""
    n = max(ndim, 1)  # a 0-d tensor takes dim 0 or -1
    if single:
        items = [dim]
    elif dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    else:
        items = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    out = []
    for d in items:
        try:
            i = operator.index(d)
        except TypeError:
            what = "an int" if single else "None, an int or a tuple of ints"
            raise TypeError(f"{op}: dim must be {what}; got dim={dim!r}.") from None
        if not -n <= i < n:
            raise ValueError(
                f"{op}: dim {i} is out of range for {ndim} dimensions (-{n} <= dim < {n}); got dim={dim!r}."
            )
        out.append(i % n)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: each dim may appear once; got dim={dim!r}.")
    return tuple(out) if ndim else ()


def _rows(values: np.ndarray, dims: tuple, keepdim: bool):
    """The reduced elements as rows of a 2-D array, and the output shape."""
    if values.ndim == 0:
        return values.reshape(1, 1), ()
    kept = [i for i in range(values.ndim) if i not in dims]
    shape = values.shape
    r = math.prod(shape[i] for i in kept)
    k = math.prod(shape[i] for i in dims)
    rows = np.transpose(values, kept + sorted(dims)).reshape(r, k)
    out = tuple(1 if i in dims else shape[i] for i in range(values.ndim)) if keepdim else tuple(shape[i] for i in kept)
    return rows, out


def _reduce(op, x, dim, keepdim, dtype, value):
    a = operand(x, "x", op)
    fmt = a.fmt if dtype is None else format_of(dtype, "dtype", op)
    rows, shape = _rows(_f64(a), _dims(op, dim, a.values.ndim), keepdim)
    out = np.array([value(row.tolist(), fmt) for row in rows], dtype=np.float64).reshape(shape)
    return _finish(out, fmt, a.torch)


# --- reductions -------------------------------------------------------------------------------------------------------


def _sum_at_precision(values: list, fmt: Format, precision: int) -> float:
    import mpmath

    special = _specials(values)
    if special is not None:
        return special
    with mpmath.workprec(int(precision)):
        s = mpmath.mpf(0)
        for v in values:
            s += mpmath.mpf(v)
        sign, man, exp, _ = s._mpf_ if s != 0 else (0, 0, 0, 0)
    if man == 0:
        return _out(_sum(values), fmt) if all(v == 0 for v in values) else 0.0
    return round_exact(bool(sign), int(man), int(exp), fmt)


def sum(x, dim=None, keepdim: bool = False, *, dtype=None, precision: int | None = None):  # noqa: A001
    """Ground truth of ``torch.sum``: each output is the exact sum of its terms rounded once.

    ``dim``: None, () or [] reduce every dim; an int or a tuple of ints (negative allowed, each once).
    The result dtype is ``dtype`` if given, else ``x``'s, and the exact sum of ``x``'s own values is
    rounded once to it (torch converts ``x`` to a narrower ``dtype`` first; this does not). An empty
    sum is +0; -0 only when every term is -0; NaN if a term is NaN or the terms hold +inf and -inf.
    ``precision`` (bits) sums with mpmath at that working precision instead of exactly: only to show
    what too few bits do.
    """
    if precision is not None:
        return _reduce("truth.sum", x, dim, keepdim, dtype, lambda v, f: _sum_at_precision(v, f, precision))
    return _reduce("truth.sum", x, dim, keepdim, dtype, lambda v, f: _out(_sum(v), f))


def _mean(values: list):
    return _div_count(_sum(values), len(values)) if values else NAN


def mean(x, dim=None, keepdim: bool = False, *, dtype=None):
    """Ground truth of ``torch.mean``: the exact sum divided by the count, rounded once.

    Empty: NaN. An inf term gives that inf (+inf with -inf: NaN), NaN gives NaN. The mean of
    float64 values near 1.6e308 is finite (no intermediate overflow). Dims and dtype as :func:`sum`.
    """
    return _reduce("truth.mean", x, dim, keepdim, dtype, lambda v, f: _out(_mean(v), f))


def _check_correction(op, correction) -> Fraction:
    if correction is None:  # torch's default: Bessel's correction
        return Fraction(1)
    real = isinstance(correction, (int, float, np.integer, np.floating)) and not isinstance(correction, bool)
    if not real or not math.isfinite(correction):
        raise TypeError(f"{op}: correction must be a finite int or float, or None; got correction={correction!r}.")
    return Fraction(float(correction)) if not isinstance(correction, (int, np.integer)) else Fraction(int(correction))


def _variance(values: list, correction: Fraction):
    """``M2 / max(0, n - correction)`` exactly: NaN if a value is not finite, +inf for M2 > 0 over 0, NaN for 0/0."""
    _, m2 = _moments(values)
    if isinstance(m2, float):
        return NAN
    d = max(_ZERO, len(values) - correction)
    if d == 0:
        return INF if m2 > 0 else NAN
    return m2 / d


def var(x, dim=None, *, correction=1, keepdim: bool = False):
    """Ground truth of ``torch.var``: ``sum (x - mean)**2 / max(0, n - correction)``, exact, rounded once.

    The mean is exact (not rounded first). ``correction`` is an int or float (torch allows any real,
    negative ones too) or None (torch's default, 1).
    M2 > 0 with divisor 0: +inf; M2 == 0 with divisor 0 (one value and correction 1, or no values): NaN.
    A NaN or inf among the values: NaN. The result dtype is ``x``'s.
    """
    c = _check_correction("truth.var", correction)
    return _reduce("truth.var", x, dim, keepdim, None, lambda v, f: _out(_variance(v, c), f))


def _std(values, correction, fmt):
    v = _variance(values, correction)
    if isinstance(v, float) or v == 0:
        return _out(v, fmt)  # NaN, +inf, +0
    return round_sqrt_form(1, v, _ZERO, fmt)


def std(x, dim=None, *, correction=1, keepdim: bool = False):
    """Ground truth of ``torch.std``: the square root of :func:`var`'s real value, rounded once.

    Not the square root of the rounded variance: ``sqrt(M2 / max(0, n - correction))`` is rounded
    once (Ziv's loop of :func:`round_sqrt_form`). Special cases as :func:`var`.
    """
    c = _check_correction("truth.std", correction)
    return _reduce("truth.std", x, dim, keepdim, None, lambda v, f: _std(v, c, f))


def cumsum(x, dim, *, dtype=None):
    """Ground truth of ``torch.cumsum``: ``out[..., i, ...]`` is the exact sum of ``x[..., :i+1, ...]`` rounded once.

    Each prefix follows :func:`sum`'s rules (-0 only when every term of the prefix is -0). The result
    dtype is ``dtype`` if given, else ``x``'s.
    """
    op = "truth.cumsum"
    a = operand(x, "x", op)
    fmt = a.fmt if dtype is None else format_of(dtype, "dtype", op)
    values = _f64(a)
    if values.ndim == 0:
        _dims(op, dim, 0, single=True)
        return _finish(np.array(_out(_sum([float(values)]), fmt)), fmt, a.torch)
    (d,) = _dims(op, dim, values.ndim, single=True)
    moved = np.moveaxis(values, d, -1)
    rows = moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])
    out = np.empty(rows.shape)
    for i, row in enumerate(rows.tolist()):
        for j in range(len(row)):
            out[i, j] = _out(_sum(row[: j + 1]), fmt)
    return _finish(np.moveaxis(out.reshape(moved.shape), -1, d), fmt, a.torch)


