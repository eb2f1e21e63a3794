"""What an argument of an op means, in one place: the reference kernels, the ground truth's gradients
and the gradients read these normalisers, never each other's private ones. Each takes the value and
the name of the op (the start of its error message) and returns the value as the numerics use it.

The ground truth of the forward ops keeps its own reading of its arguments (refkern.truth.reductions),
on purpose: it is the independent check of these, and shares no code with the fast path."""

import math
from fractions import Fraction

import numpy as np

__all__ = ["correction", "eps", "normalized_shape"]


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


def normalized_shape(value, op) -> tuple:
    """layer_norm's and rms_norm's normalized_shape as a tuple of ints (an int is a 1-tuple)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    try:
        return tuple(int(s) for s in value)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a tuple of ints; got {value!r}.") from None
