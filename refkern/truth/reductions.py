"""Ground truth of the reductions, normalizations and poolings: exact rationals and mpmath, rounded once.

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
from refkern.accumulate.formats import FORMATS, Format
from refkern.truth.products import round_exact

__all__ = [
    "sum", "mean", "var", "std", "cumsum",
    "layer_norm", "rms_norm", "group_norm", "batch_norm",
    "avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "round_fraction", "round_sqrt_form",
]  # fmt: skip

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


# --- normalizations ---------------------------------------------------------------------------------------------------


def _normalized(a, c, w, b, fmt: Format) -> float:
    """Round ``y = a / sqrt(c) * w + b`` once (``w`` None: no product; ``b`` None: no sum).

    ``a``, ``c``, ``w``, ``b`` are extended values; IEEE's rules for the specials: ``1 / sqrt(c)`` is
    NaN for ``c < 0``, +inf for ``c == 0``, +0 for ``c == +inf``; a product with 0 and inf is NaN.
    """
    factors = [a] if w is None else [a, w]
    if any(isinstance(v, float) and math.isnan(v) for v in (*factors, c, b) if v is not None):
        return NAN
    if _negative(c) and c != 0:
        return NAN  # sqrt of a negative number
    prod = a if w is None else _mul(a, w)
    if isinstance(c, float) and math.isinf(c):  # 1 / sqrt(inf) = +0
        term = _mul(prod, _ZERO)
    elif c == 0:  # 1 / sqrt(0) = +inf
        term = _mul(prod, INF)
    elif isinstance(prod, float) or prod == 0:  # +-inf or +-0 times a positive finite number
        term = prod
    else:
        term = None  # finite, nonzero: s * sqrt(prod**2 / c)
    if term is not None:
        return _out(term if b is None else _add(term, b), fmt)
    if isinstance(b, float) and b != 0:
        return b  # +-inf (NaN was handled)
    bias = _ZERO if b is None or b == 0 else b
    q = prod * prod / c
    s = -1 if prod < 0 else 1
    d = -bias  # y == 0 iff s * sqrt(q) == -b exactly: then +0 (an exact cancellation)
    if d != 0 and (d > 0) == (s > 0) and d * d == q:
        return 0.0
    return round_sqrt_form(s, q, bias, fmt)


def _normalize_group(xs: list, ws: list, bs: list, eps, fmt: Format) -> list:
    """``(x - mean) / sqrt(var + eps) * w + b`` over one group: exact mean, biased ``var = M2 / n``."""
    mu, m2 = _moments(xs)
    c = _add(_div_count(m2, len(xs)) if not isinstance(m2, float) else m2, eps)
    minus_mu = _neg(mu)
    return [_normalized(_add(_ext(x), minus_mu), c, w, b, fmt) for x, w, b in zip(xs, ws, bs)]


def _optional(v, name, op):
    return None if v is None else operand(v, name, op)


def _per_element(o, count: int) -> list:
    """An optional affine operand as a list of extended values (None when absent)."""
    return [None] * count if o is None else [_ext(v) for v in _f64(o).reshape(-1).tolist()]


def _check_shape(op, name, o, shape):
    if o is not None and tuple(o.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}; got {name}.shape={tuple(o.shape)}.")


def _eps(op, eps, name="eps"):
    try:
        return _ext(float(eps))
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a float; got {name}={eps!r}.") from None


def _shape_arg(op, normalized_shape) -> tuple:
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    try:
        return tuple(operator.index(v) for v in normalized_shape)
    except TypeError:
        raise TypeError(
            f"{op}: normalized_shape must be an int or a sequence of ints; got {normalized_shape!r}."
        ) from None


def _norm_operands(op, input, normalized_shape, affine: dict):  # noqa: A002
    x = operand(input, "input", op)
    ns = _shape_arg(op, normalized_shape)
    if len(ns) > len(x.shape) or tuple(x.shape[len(x.shape) - len(ns) :]) != ns:
        raise ValueError(
            f"{op}: normalized_shape must equal the trailing dimensions of input.shape; "
            f"got normalized_shape={ns} and input.shape={tuple(x.shape)}."
        )
    ops = {k: _optional(v, k, op) for k, v in affine.items()}
    for k, o in ops.items():
        _check_shape(op, k, o, ns)
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    return x, ns, ops, tensor


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    """Ground truth of ``F.layer_norm``, each element rounded once to ``input``'s dtype.

    Over the last ``len(normalized_shape)`` dims: ``y = (x - mu) / sqrt(var + eps) * weight + bias``
    with ``mu`` the exact mean, ``var`` the BIASED variance ``M2 / n`` with the exact mean, ``eps`` the
    exact float64 value of the Python float, the square root and the division real-valued. weight
    and bias (shape ``normalized_shape``, any float dtype) enter exactly. A row with a NaN or inf
    (so var is NaN): every element NaN. ``var + eps == 0`` (constant row, eps 0): ``0 / 0``, NaN,
    as torch gives.
    """
    op = "truth.layer_norm"
    x, ns, ops, tensor = _norm_operands(op, input, normalized_shape, {"weight": weight, "bias": bias})
    e = _eps(op, eps)
    k = math.prod(ns)
    ws, bs = _per_element(ops["weight"], k), _per_element(ops["bias"], k)
    rows = _f64(x).reshape(-1, k) if k else np.zeros((0, 0))
    out = np.array([_normalize_group(r, ws, bs, e, x.fmt) for r in rows.tolist()], dtype=np.float64)
    return _finish(out.reshape(x.shape), x.fmt, tensor)


# eps=None of F.rms_norm: the epsilon of torch's opmath type (float32 for half inputs), per input dtype
_FINFO_EPS = {name: Fraction(2) ** (1 - max(f.prec, 24)) for name, f in FORMATS.items()}


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):  # noqa: A002
    """Ground truth of ``F.rms_norm``: ``y = x / sqrt(mean(x**2) + eps) * weight``, rounded once.

    ``mean(x**2)`` exact over the last ``len(normalized_shape)`` dims; ``eps`` None means the
    epsilon of torch's opmath type, as its kernels take it (fp16, bf16, fp32: 2**-23; fp64: 2**-52). A NaN in
    the row: every element NaN; an inf (and no NaN): ``mean(x**2) = inf``, so the inf elements are
    NaN (``inf * 0``) and the finite ones +-0, as IEEE and torch give.
    """
    op = "truth.rms_norm"
    x, ns, ops, tensor = _norm_operands(op, input, normalized_shape, {"weight": weight})
    e = _FINFO_EPS[x.fmt.name] if eps is None else _eps(op, eps)
    k = math.prod(ns)
    ws = _per_element(ops["weight"], k)
    out = []
    for row in (_f64(x).reshape(-1, k) if k else np.zeros((0, 0))).tolist():
        c = _add(_mean_square(row), e)
        out.append([_normalized(_ext(v), c, w, None, x.fmt) for v, w in zip(row, ws)])
    return _finish(np.array(out, dtype=np.float64).reshape(x.shape), x.fmt, tensor)


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    """Ground truth of ``F.group_norm``: input ``(N, C, *)``; the exact mean and biased variance over each
    group of ``C / num_groups`` channels and every spatial position, the affine step per channel, as
    :func:`layer_norm` does per row."""
    op = "truth.group_norm"
    x = operand(input, "input", op)
    if len(x.shape) < 2:
        raise ValueError(f"{op}: input must have shape (N, C, *); got input.shape={tuple(x.shape)}.")
    n, c = x.shape[0], x.shape[1]
    g = operator.index(num_groups)
    if g <= 0 or c % g:
        raise ValueError(f"{op}: the channels must split into num_groups groups; got C={c} and num_groups={g}.")
    ops = {k: _optional(v, k, op) for k, v in (("weight", weight), ("bias", bias))}
    for k, o in ops.items():
        _check_shape(op, k, o, (c,))
    e = _eps(op, eps)
    spatial = math.prod(x.shape[2:])
    per = c // g
    ws = [w for w in _per_element(ops["weight"], c) for _ in range(spatial)]
    bs = [b for b in _per_element(ops["bias"], c) for _ in range(spatial)]
    blocks = _f64(x).reshape(n, g, per * spatial)
    out = np.empty(blocks.shape)
    for i in range(n):
        for j in range(g):
            lo = j * per * spatial
            hi = lo + per * spatial
            out[i, j] = _normalize_group(blocks[i, j].tolist(), ws[lo:hi], bs[lo:hi], e, x.fmt)
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    return _finish(out.reshape(x.shape), x.fmt, tensor)


def _running_update(old, momentum, batch, fmt: Format) -> float:
    """``(1 - momentum) * old + momentum * batch``, exact (IEEE for specials), rounded once."""
    return _out(_add(_mul(_add(Fraction(1), _neg(momentum)), old), _mul(momentum, batch)), fmt)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,  # noqa: A002
               momentum: float = 0.1, eps: float = 1e-5, *, return_running_stats: bool = False):  # fmt: skip
    """Ground truth of ``F.batch_norm`` (channel dim 1; input ``(N, C)`` or ``(N, C, *)``), rounded once.

    Eval (``training=False``): ``y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * w[c] + b[c]``,
    each element by IEEE's rules on its own (an inf running_var gives ``b``, a negative one NaN).
    Training: the exact batch mean and BIASED batch variance over ``(N, *)`` per channel normalise
    the output (a channel holding a NaN or inf is NaN); torch would store
    ``(1 - momentum) * running_mean + momentum * batch_mean`` and
    ``(1 - momentum) * running_var + momentum * M2 / (n - 1)`` (the UNBIASED variance), each real-valued
    with ``momentum`` the exact float64 value, rounded once to running_mean's / running_var's dtype.
    Inputs are never mutated. ``return_running_stats=True`` returns ``(output, new_running_mean,
    new_running_var)`` (eval mode: the running stats unchanged; None stays None). Training with one
    value per channel is a ValueError, as torch raises; an empty input (any shape) gives an empty output.
    """
    op = "truth.batch_norm"
    x = operand(input, "input", op)
    if math.prod(x.shape) == 0:  # as torch: an empty input gives an empty output, its statistics not read
        given = (running_mean, running_var, weight, bias)
        tensor = x.torch or any(type(v).__module__.startswith("torch") for v in given if v is not None)
        y = _finish(np.empty(tuple(x.shape)), x.fmt, tensor)
        return (y, running_mean, running_var) if return_running_stats else y
    if len(x.shape) < 2:
        raise ValueError(f"{op}: input must have shape (N, C) or (N, C, *); got input.shape={tuple(x.shape)}.")
    n, c = x.shape[0], x.shape[1]
    given = {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias}
    ops = {k: _optional(v, k, op) for k, v in given.items()}
    for k, o in ops.items():
        _check_shape(op, k, o, (c,))
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    e = _eps(op, eps)
    m = _eps(op, momentum, "momentum")
    rm, rv = _per_element(ops["running_mean"], c), _per_element(ops["running_var"], c)
    ws, bs = _per_element(ops["weight"], c), _per_element(ops["bias"], c)
    spatial = math.prod(x.shape[2:])
    chans = np.moveaxis(_f64(x).reshape(n, c, spatial), 1, 0).reshape(c, n * spatial)
    count = chans.shape[1]
    out = np.empty(chans.shape)
    new_rm, new_rv = [], []
    if training:
        if count == 1:
            raise ValueError(
                f"{op}: expected more than 1 value per channel when training; got input.shape={tuple(x.shape)}."
            )
        for j, vals in enumerate(chans.tolist()):
            mu, m2 = _moments(vals)
            unbiased = m2 if isinstance(m2, float) else _div_count(m2, count - 1) if count > 1 else NAN
            out[j] = _normalize_group(vals, [ws[j]] * count, [bs[j]] * count, e, x.fmt)
            if ops["running_mean"] is not None:
                new_rm.append(_running_update(rm[j], m, mu, ops["running_mean"].fmt))
            if ops["running_var"] is not None:
                new_rv.append(_running_update(rv[j], m, unbiased, ops["running_var"].fmt))
    else:
        if ops["running_mean"] is None or ops["running_var"] is None:
            raise ValueError(f"{op}: running_mean and running_var are required when training=False; got None.")
        for j, vals in enumerate(chans.tolist()):
            cj = _add(rv[j], e)
            minus = _neg(rm[j])
            out[j] = [_normalized(_add(_ext(v), minus), cj, ws[j], bs[j], x.fmt) for v in vals]
        new_rm = _f64(ops["running_mean"]).tolist()
        new_rv = _f64(ops["running_var"]).tolist()
    y = _finish(np.moveaxis(out.reshape(c, n, spatial), 0, 1).reshape(x.shape), x.fmt, tensor)
    if not return_running_stats:
        return y
    stats = []
    for key, vals in (("running_mean", new_rm), ("running_var", new_rv)):
        o = ops[key]
        stats.append(None if o is None else _finish(np.array(vals, dtype=np.float64), o.fmt, tensor))
    return (y, *stats)


# --- pooling ----------------------------------------------------------------------------------------------------------


def _pool_input(op: str, input, nd: int):  # noqa: A002
    """(operand, values as (N, C, *spatial) float64, unbatched?)."""
    x = operand(input, "input", op)
    shape = tuple(x.shape)
    if len(shape) not in (nd + 1, nd + 2) or 0 in shape[len(shape) - nd - 1 :]:
        names = "(C, L) or (N, C, L)" if nd == 1 else "(C, H, W) or (N, C, H, W)"
        raise ValueError(
            f"{op}: input must have shape {names}, C and the spatial sizes nonzero; got input.shape={shape}."
        )
    v = _f64(x)
    unbatched = len(shape) == nd + 1
    return x, (v[None] if unbatched else v), unbatched


def _ints(op: str, name: str, value, nd: int, minimum: int) -> tuple:
    """An int or a sequence of ``nd`` ints (one int is repeated), each ``>= minimum``."""
    try:
        t = tuple(operator.index(v) for v in (value if isinstance(value, (tuple, list)) else (value,)))
    except TypeError:
        t = ()
    if len(t) == 1:
        t = t * nd
    if len(t) != nd or any(v < minimum for v in t):
        raise ValueError(f"{op}: {name} must be an int or {nd} ints, each >= {minimum}; got {name}={value!r}.")
    return t


def _stride(op, stride, kernel, nd):
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        return kernel  # torch's default
    return _ints(op, "stride", stride, nd, 1)


def _out_size(op: str, size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape: with ceil_mode the last window must start inside the input or
    the left padding."""
    if p > k // 2:
        raise ValueError(f"{op}: padding must be at most half of kernel_size; got padding={p} and kernel_size={k}.")
    o = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    if o < 1:
        raise ValueError(
            f"{op}: the output would be empty; got input size {size}, kernel_size={k}, stride={s}, "
            f"padding={p}, dilation={d}."
        )
    return o


def _pooled(x, v, unbatched, out_spatial, value):
    """Apply ``value(plane, index)`` for every (n, c) plane and output index; then the result."""
    import itertools

    nn, c = v.shape[:2]
    out = np.empty((nn, c, *out_spatial))
    for i, j in itertools.product(range(nn), range(c)):
        plane = v[i, j]
        for idx in itertools.product(*(range(o) for o in out_spatial)):
            out[(i, j, *idx)] = value(plane, idx)
    return _finish(out[0] if unbatched else out, x.fmt, x.torch)


def _avg_pool(op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    x, v, unbatched = _pool_input(op, input, nd)
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    s = _stride(op, stride, k, nd)
    p = _ints(op, "padding", padding, nd, 0)
    if divisor_override is not None:
        divisor_override = operator.index(divisor_override)
        if divisor_override == 0:
            raise ValueError(f"{op}: divisor_override must be nonzero; got divisor_override=0.")
    sizes = v.shape[2:]
    osz = [_out_size(op, sizes[a], k[a], s[a], p[a], 1, ceil_mode) for a in range(nd)]
    spans = []  # per dim and output index: (first, last + 1 inside the input, count inside the padded input)
    for a in range(nd):
        dim = []
        for o in range(osz[a]):
            start = o * s[a] - p[a]
            end = min(start + k[a], sizes[a] + p[a])  # never past the padded input (ceil_mode's extra window)
            dim.append((max(start, 0), min(end, sizes[a]), end - start))
        spans.append(dim)

    def value(plane, idx):
        box = [spans[a][idx[a]] for a in range(nd)]
        window = plane[tuple(slice(lo, hi) for lo, hi, _ in box)].reshape(-1).tolist()
        if divisor_override is not None:
            divisor = divisor_override
        elif count_include_pad:
            divisor = math.prod(n for _, _, n in box)
        else:
            divisor = math.prod(hi - lo for lo, hi, _ in box)
        return _out(_div_count(_sum(window), divisor), x.fmt)

    return _pooled(x, v, unbatched, osz, value)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True):  # fmt: skip
    """Ground truth of ``F.avg_pool1d``: each output the exact window sum over the divisor, rounded once.

    Input ``(C, L)`` or ``(N, C, L)``. torch's output size (``ceil_mode``: the last window starts inside
    the input or the left padding) and divisor (``count_include_pad`` counts the padded zeros inside
    ``[-padding, L + padding)``, never the positions past it that ceil_mode's last window reaches).
    The sum is over the input elements of the window (padding adds nothing, so an all -0 window is -0);
    NaN and inf as :func:`sum`.
    """
    return _avg_pool("truth.avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override: int | None = None):  # fmt: skip
    """Ground truth of ``F.avg_pool2d`` (input ``(C, H, W)`` or ``(N, C, H, W)``): as :func:`avg_pool1d`
    per dim; the divisor is the product over both dims, or ``divisor_override`` when given."""
    return _avg_pool("truth.avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def _max_pool(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: A002
    import itertools

    x, v, unbatched = _pool_input(op, input, nd)
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    s = _stride(op, stride, k, nd)
    p = _ints(op, "padding", padding, nd, 0)
    d = _ints(op, "dilation", dilation, nd, 1)
    sizes = v.shape[2:]
    osz = [_out_size(op, sizes[a], k[a], s[a], p[a], d[a], ceil_mode) for a in range(nd)]
    taps = [
        [[t for t in (o * s[a] - p[a] + j * d[a] for j in range(k[a])) if 0 <= t < sizes[a]] for o in range(osz[a])]
        for a in range(nd)
    ]  # the input positions of each window; padding is -inf, never chosen

    def value(plane, idx):
        best = -INF
        for pos in itertools.product(*(taps[a][idx[a]] for a in range(nd))):
            val = float(plane[pos])
            if math.isnan(val):
                return NAN
            if val > best:  # the first of equal values wins (-0 before +0 stays -0), as torch scans
                best = val
        return best

    return _pooled(x, v, unbatched, osz, value)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):  # noqa: A002
    """Ground truth of ``F.max_pool1d`` (input ``(C, L)`` or ``(N, C, L)``): the exact maximum of each window.

    A NaN in the window gives NaN; padding is -inf (a window wholly in the padding gives -inf); of
    equal maxima (+0 and -0) the first in scan order is returned, as torch's CPU kernel does.
    Output size as :func:`avg_pool1d`, with the dilated kernel ``dilation * (kernel_size - 1) + 1``.
    """
    return _max_pool("truth.max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):  # noqa: A002
    """Ground truth of ``F.max_pool2d`` (input ``(C, H, W)`` or ``(N, C, H, W)``), as :func:`max_pool1d`;
    the scan order is row-major over the window."""
    return _max_pool("truth.max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode)


def _adaptive(op, nd, input, output_size):  # noqa: A002
    x, v, unbatched = _pool_input(op, input, nd)
    sizes = v.shape[2:]
    given = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    if len(given) == 1:
        given = tuple(given) * nd
    if len(given) != nd:
        raise ValueError(f"{op}: output_size must be an int or {nd} ints (or None); got output_size={output_size!r}.")
    osz = []
    for a, o in enumerate(given):
        o = sizes[a] if o is None else operator.index(o)
        if o < 1:
            raise ValueError(f"{op}: output_size must be positive (or None); got output_size={output_size!r}.")
        osz.append(o)
    # torch's windows: start = floor(i * L / out), end = ceil((i + 1) * L / out)
    spans = [[(i * sizes[a] // osz[a], -(-(i + 1) * sizes[a] // osz[a])) for i in range(osz[a])] for a in range(nd)]

    def value(plane, idx):
        box = [spans[a][idx[a]] for a in range(nd)]
        window = plane[tuple(slice(lo, hi) for lo, hi in box)].reshape(-1).tolist()
        return _out(_div_count(_sum(window), len(window)), x.fmt)

    return _pooled(x, v, unbatched, osz, value)


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    """Ground truth of ``F.adaptive_avg_pool1d``: output ``i`` averages ``x[floor(i L / out) : ceil((i + 1) L / out)]``
    exactly, rounded once. ``output_size`` None keeps the size."""
    return _adaptive("truth.adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Ground truth of ``F.adaptive_avg_pool2d``: :func:`adaptive_avg_pool1d`'s windows in both dims; an
    entry None keeps that size."""
    return _adaptive("truth.adaptive_avg_pool2d", 2, input, output_size)
