"""Floating-point formats and rounding to them.

A format is (precision p in bits including the implicit one, emin, emax). Every value
of float16, bfloat16 and float32 is exactly a float64, so the library carries them as
float64 and *emulates* arithmetic in the narrow format by rounding each float64 result
with :func:`round_to`. For + - * of operands that already lie in the format this is
exactly the narrow format's own correctly rounded operation, because float64 has
53 >= 2p + 2 bits (Figueroa, "When is double rounding innocuous?", 1995).
"""

from dataclasses import dataclass

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import bits, from_bits, pow2

__all__ = [
    "Format",
    "FLOAT16",
    "BFLOAT16",
    "TFLOAT32",
    "FLOAT32",
    "FLOAT64",
    "FORMATS",
    "round_to",
    "truncate_to",
    "round_array",
    "round_away_to",
    "ROUNDING_MODES",
]


@dataclass(frozen=True)
class Format:
    """An IEEE 754-style binary format with subnormals."""

    name: str
    prec: int  #: significand bits, the implicit bit included
    emin: int  #: exponent of the smallest normal number
    emax: int  #: exponent of the largest finite number

    @property
    def u(self) -> float:
        """Unit roundoff of round-to-nearest, 2**-prec."""
        return 2.0**-self.prec

    @property
    def params(self) -> tuple[int, int, int]:
        """(prec, emin, emax), the form the jitted kernels take."""
        return self.prec, self.emin, self.emax

    @property
    def short(self) -> str:
        return {"float16": "fp16", "bfloat16": "bf16", "tfloat32": "tf32", "float32": "fp32", "float64": "fp64"}[
            self.name
        ]

    def __repr__(self) -> str:
        return f"Format({self.name!r})"


FLOAT16 = Format("float16", 11, -14, 15)
BFLOAT16 = Format("bfloat16", 8, -126, 127)
TFLOAT32 = Format("tfloat32", 11, -126, 127)  # NVIDIA TF32: float32's range, 10 stored bits
FLOAT32 = Format("float32", 24, -126, 127)
FLOAT64 = Format("float64", 53, -1022, 1023)
FORMATS = {f.name: f for f in (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)}

_ABS = np.int64(0x7FFFFFFFFFFFFFFF)


@jit
def round_to(x, prec, emin, emax):
    """Round the float64 ``x`` to the format (prec, emin, emax), round-to-nearest-even.

    Exact IEEE 754 rounding: subnormals below 2**emin, +-inf when the value rounded with
    an unbounded exponent reaches 2**(emax + 1), NaN and inf unchanged, the sign of a zero
    result kept. ``prec >= 53`` returns ``x`` unchanged (the format is float64 itself).
    """
    if prec >= 53 or x != x or x == 0.0:
        return x
    a = bits(x) & _ABS
    ef = a >> 52
    if ef == 2047:  # inf
        return x
    e = ef - 1023 if ef > 0 else -1023  # floor(log2|x|); subnormal float64 lie below every emin here
    if e > emax:  # |x| >= 2**(emax+1): beyond the largest finite number
        return np.inf if x > 0 else -np.inf
    q = max(e, emin) - prec + 1  # exponent of the quantum (ulp) at |x|
    sigma = from_bits((q + 1075) << 52 | (1 << 51))  # 1.5 * 2**(q+52): ulp(sigma) = 2**q
    y = (x + sigma) - sigma  # |x| < 2**(q+prec) <= 2**(q+51): one RNE rounding to a multiple of 2**q
    if abs(y) >= pow2(emax + 1):
        return np.inf if x > 0 else -np.inf
    return np.copysign(y, x)


@jit
def truncate_to(x, prec, emin, emax):
    """Round the float64 ``x`` toward zero to the format (prec, emin, emax): drop the bits below
    its last place (hardware that converts float32 to TF32 or bfloat16 by truncation does this).
    Values beyond the format's range keep their exponent; specials are unchanged."""
    if prec >= 53 or x != x or x == 0.0 or x - x != 0.0:
        return x
    e = ((bits(x) & _ABS) >> 52) - 1023
    q = max(e, emin) - prec + 1  # exponent of the last kept place
    step = from_bits((np.int64(q) + 1023) << 52) if q >= -1022 else 2.0**q
    return np.copysign(np.floor(abs(x) / step) * step, x)  # exact: division and product by 2**q


@jit
def round_away_to(x, prec, emin, emax):
    """Round the float64 ``x`` to nearest, ties away from zero, in the format (prec, emin, emax).

    NVIDIA's float32 -> TF32 conversion does this (PTX ``cvt.rna.tf32.f32``): 1024.5 becomes
    1025, where round-to-nearest-even gives 1024. Overflow gives +-inf, specials are unchanged."""
    if prec >= 53 or x != x or x == 0.0 or x - x != 0.0:
        return x
    t = truncate_to(x, prec, emin, emax)
    e = ((bits(x) & _ABS) >> 52) - 1023
    q = max(e, emin) - prec + 1
    half = 2.0**q * 0.5
    if abs(x - t) >= half:  # exact: x - t is below one quantum and a multiple of x's own ulp
        t = t + np.copysign(2.0 * half, x)
    if abs(t) >= pow2(emax + 1):
        return np.inf if x > 0 else -np.inf
    return t


NEAREST_EVEN, TOWARD_ZERO, NEAREST_AWAY = 0, 1, 2
ROUNDING_MODES = {"nearest": NEAREST_EVEN, "truncate": TOWARD_ZERO, "nearest-away": NEAREST_AWAY}


@jit(parallel=True)
def _round_array(x, prec, emin, emax, mode):
    x = np.ascontiguousarray(x)  # transposed or broadcast views: reshape needs C order
    out = np.empty_like(x)
    flat = x.reshape(-1)
    res = out.reshape(-1)
    for i in prange(flat.size):
        if mode == TOWARD_ZERO:
            res[i] = truncate_to(flat[i], prec, emin, emax)
        elif mode == NEAREST_AWAY:
            res[i] = round_away_to(flat[i], prec, emin, emax)
        else:
            res[i] = round_to(flat[i], prec, emin, emax)
    return out


def round_array(x, prec, emin, emax, mode=NEAREST_EVEN):
    """A copy of the float64 array ``x`` with every element rounded to the format: ``mode`` 0 (or
    False) to nearest even, 1 (or True) toward zero, 2 to nearest with ties away from zero."""
    return _round_array(np.asarray(x, np.float64), prec, emin, emax, np.int64(int(mode)))
