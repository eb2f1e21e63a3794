"""What the ground truth's gradients share (:func:`refkern.truth.backward`): operands as float64 arrays,
exact square roots of rationals, one rounding of a float64 value."""

import math
from fractions import Fraction

import numpy as np

from refkern._arrays import operand


def _values(v, name, op):
    o = operand(v, name, op)
    return np.asarray(o.values, np.float64).reshape(o.shape), o


def _square(q):
    p, t = math.isqrt(q.numerator), math.isqrt(q.denominator)
    return p * p == q.numerator and t * t == q.denominator


def _sqrtq(q):
    return Fraction(math.isqrt(q.numerator), math.isqrt(q.denominator))


def _round_float_to(t: float, fmt) -> float:
    """A float64 value (NaN and infinities included) rounded once to fmt."""
    from refkern.truth.softmax import _round_float

    return _round_float(float(t), fmt)
