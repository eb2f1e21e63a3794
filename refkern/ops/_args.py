"""What an argument of an op means, in one place: the reference kernels, the ground truth's gradients
and the gradients read these normalisers, never each other's private ones. Each takes the value and
the name of the op (the start of its error message) and returns the value as the numerics use it.

The convolutions' stride, padding, dilation and output_padding are read by :func:`spatial`, a reduction's
``dim`` by :func:`dims`.

The ground truth of the forward ops keeps its own reading of its arguments (refkern.truth.reductions),
on purpose: it is the independent check of these, and shares no code with the fast path."""

import math
from fractions import Fraction

import numpy as np

__all__ = ["correction", "eps", "normalized_shape", "dims", "spatial", "tuple_of", "is_int", "integer_scale"]


def correction(value, op) -> Fraction:
    """var/std's correction as an exact Fraction: None is torch's default (Bessel's, 1); any finite real,
    negative ones included (the divisor n - correction then exceeds n), as torch takes it."""
    if value is None:
        return Fraction(1)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: correction must be a number or None; got correction={value!r}.")
    c = float(value)
    if not math.isfinite(c):
        raise ValueError(f"{op}: correction must be a finite number; got correction={value!r}.")
    return Fraction(int(value)) if isinstance(value, (int, np.integer)) else Fraction(c)


def eps(value, op) -> float:
    """A norm's eps as a float: any finite real, as torch takes it (a negative eps makes ``var + eps``
    negative, and its row NaN, where the variance is below ``-eps``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{op}: eps must be a float; got eps={value!r}.")
    e = float(value)
    if not math.isfinite(e):
        raise ValueError(f"{op}: eps must be a finite number; got eps={value!r}.")
    return e


#: torch's integer types: (bits, signed)
_INTEGER_TYPES = {"uint8": (8, False), "int8": (8, True), "int16": (16, True), "int32": (32, True),
                  "int64": (64, True)}  # fmt: skip


def integer_scale(value, dtype: str, name: str, op) -> int:
    """A number (addmm's ``alpha`` or ``beta``) as torch's integer kernels of ``dtype`` take it: c10's checked
    conversion ``Scalar.to<T>()``, which refuses a value outside T's range and converts the rest as C++ does.

    * a bool is 0 or 1; an int must lie in ``[min, max]`` of T, an unsigned T also taking ``-max .. -1`` (wrapped
      modulo ``2**bits``: uint8's -1 is 255);
    * a float must be finite with ``min <= f <= max`` as real numbers (``max`` read as a double: int64's is
      ``2**63``, which converts to ``-2**63``, its value modulo ``2**64``; an unsigned T refuses every negative
      float, -0.5 included), then truncated toward zero (int8's -2.5 is -2);
    * anything else (a complex number, a string) is refused.

    Returns the integer, whose residue modulo ``2**bits`` is what the kernel multiplies by (measured against
    torch 2.13's CPU addmm: tests/test_integer_products.py). A ValueError or TypeError naming ``name`` otherwise."""
    if dtype not in _INTEGER_TYPES:
        raise TypeError(f"{op}: {name} scales integers of one of {', '.join(_INTEGER_TYPES)}; got dtype={dtype}.")
    bits, signed = _INTEGER_TYPES[dtype]
    top = 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if is_int(value):
        v, low = int(value), -(2 ** (bits - 1)) if signed else -top
        if not low <= v <= top:
            raise ValueError(f"{op}: {name} must lie in [{low}, {top}] for {dtype} operands (torch refuses it "
                             f"otherwise); got {name}={value!r}.")  # fmt: skip
        return v
    if isinstance(value, (float, np.floating)):
        f, low = float(value), float(-(2 ** (bits - 1))) if signed else 0.0
        if not low <= f <= float(top):
            raise ValueError(f"{op}: {name} must be a finite number in [{low:g}, {float(top):g}] for {dtype} operands "
                             f"(torch refuses it otherwise); got {name}={value!r}.")  # fmt: skip
        return math.trunc(f)
    raise TypeError(f"{op}: {name} must be a bool, an int or a float for {dtype} operands; got {name}={value!r}.")


def normalized_shape(value, op) -> tuple:
    """layer_norm's and rms_norm's normalized_shape as a tuple of ints (an int is a 1-tuple)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    try:
        return tuple(int(s) for s in value)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a tuple of ints; got {value!r}.") from None


def is_int(v) -> bool:
    """An int (numpy's too), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def tuple_of(nd) -> str:
    """How a message names a spatial argument's tuple."""
    return "a tuple of 1 int" if nd == 1 else f"a tuple of 1 or {nd} ints"


def spatial(v, name, op, nd, minimum):
    """An int or a tuple of 1 or ``nd`` ints, each >= minimum, as a tuple of ``nd`` ints.

    As torch's convolutions do, a one-element tuple or list is expanded to every spatial
    dimension: ``conv2d(x, w, stride=(2,))`` is ``stride=(2, 2)``.
    """
    t = (v,) * nd if is_int(v) else v
    if isinstance(t, (tuple, list)) and len(t) == 1:
        t = tuple(t) * nd
    if not isinstance(t, (tuple, list)) or len(t) != nd or not all(is_int(i) for i in t):
        raise ValueError(f"{op}: {name} must be an int or {tuple_of(nd)}; got {name}={v!r}.")
    if any(i < minimum for i in t):
        what = "positive" if minimum > 0 else "non-negative"
        raise ValueError(f"{op}: {name} must be {what}; got {name}={v!r}.")
    return tuple(int(i) for i in t)


def dims(dim, ndim: int, op: str) -> tuple:
    """torch's ``dim`` argument as a sorted tuple of non-negative axes (None, () or [] = all)."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if not dims:
        return tuple(range(ndim))
    span = max(ndim, 1)  # a 0-d tensor takes dim 0 or -1, as torch
    out = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise TypeError(f"{op}: dim must be an int or a tuple of ints; got {dim!r}.")
        if not -span <= d < span:
            raise IndexError(f"{op}: dim={d} is out of range for a {ndim}-d input (expected {-span}..{span - 1}).")
        out.append(int(d) % span)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: dim={dim!r} names a dimension twice.")
    return tuple(sorted(out)) if ndim else ()
