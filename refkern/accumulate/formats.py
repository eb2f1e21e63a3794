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
    "round_to_vec",
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
_EXP = np.int64(0x7FF0000000000000)  # the exponent field of a float64
_SIGN = np.int64(-0x8000000000000000)  # its sign bit


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
def round_to_vec(x, prec, emin, emax):
    """:func:`round_to`, the same value for every float64 ``x``, with no branch on the value:
    selects only, so that LLVM vectorizes a loop of it (an array rounded, a left-to-right sum of
    many rows run with the rows as the vector lanes). :func:`round_to` keeps its branches: in one
    chain of dependent roundings their prediction keeps the checks off the critical path (a
    left-to-right bfloat16 sum, four rows interleaved: 3.7 ns a term with :func:`round_to`, 4.3 ns
    with this; with the rows as vector lanes 0.9 ns with this, 1.5 ns with :func:`round_to`).

    The same sigma as :func:`round_to`'s, ``1.5 * 2**(q + 52)`` with ``q = max(e, emin) - prec +
    1``, formed in floating point: ``2**max(e, emin)`` is ``x``'s bits with the sign and
    significand cleared (2**e for a normal x; 0 for a zero or a float64 subnormal, below every emin
    here; inf for inf and NaN) raised to ``2**emin``, and sigma that times ``1.5 * 2**(53 - prec)``,
    an exact float64 product where ``emax + 53 - prec <= 1022`` (every format here). Then the same
    ``(x + sigma) - sigma``, and inf, NaN, overflow and the zero's sign as :func:`round_to` has them
    (bit-identical on 17M values of every class: ``tests/test_formats.py``)."""
    if prec >= 53:
        return x
    big = pow2(emax + 1)
    top = max(from_bits(bits(x) & _EXP), pow2(emin))  # 2**max(e, emin)
    sigma = top * (1.5 * pow2(53 - prec))  # 1.5 * 2**(q + 52), exact
    y = (x + sigma) - sigma  # one RNE rounding to a multiple of 2**q
    r = np.copysign(y, x)  # the sign of a zero result kept
    r = np.copysign(np.inf, x) if (abs(x) >= big or abs(y) >= big) else r  # beyond the largest finite number
    return x if x != x else r  # NaN unchanged


@jit
def _dropped(b, prec, emin):
    """The number of low bits of the float64 pattern ``b`` below the format's last place at its
    value: ``q - (e - 52)`` with ``q = max(e, emin) - prec + 1`` (e = -1023 for a zero or a float64
    subnormal: below every emin here), at most 63."""
    e = ((b >> 52) & 0x7FF) - 1023
    return min(max(e, emin) - e + 53 - prec, 63)


@jit
def truncate_to(x, prec, emin, emax):
    """Round the float64 ``x`` toward zero to the format (prec, emin, emax): drop the bits below
    its last place (hardware that converts float32 to TF32 or bfloat16 by truncation does this).
    Values beyond the format's range keep their exponent; specials are unchanged.

    The ``n`` bits of ``x``'s pattern below the last place (:func:`_dropped`) cleared: ``n <= 52``
    clears significand bits only; ``n >= 53`` means ``|x| < 2**q`` and leaves the signed zero.
    Selects only (as :func:`round_to_vec`)."""
    if prec >= 53:
        return x
    b = bits(x)
    n = _dropped(b, prec, emin)
    r = from_bits(b & (np.int64(-1) << n)) if n <= 52 else from_bits(b & _SIGN)
    return x if (b & _EXP) == _EXP else r  # inf and NaN unchanged


@jit
def round_away_to(x, prec, emin, emax):
    """Round the float64 ``x`` to nearest, ties away from zero, in the format (prec, emin, emax).

    NVIDIA's float32 -> TF32 conversion does this (PTX ``cvt.rna.tf32.f32``): 1024.5 becomes
    1025, where round-to-nearest-even gives 1024. Overflow gives +-inf, specials are unchanged.

    Half a quantum added to the magnitude's bits, then the ``n`` bits below the last place
    cleared (:func:`truncate_to`): a carry out of the significand is the next binade's first
    value, exactly. ``n == 53`` (``2**e <= |x| < 2**q``, ``q = e + 1``): at least half a quantum,
    so ``2**q``; ``n > 53``: below half of it, so the signed zero. Selects only (as :func:`round_to_vec`)."""
    if prec >= 53:
        return x
    b = bits(x)
    n = _dropped(b, prec, emin)
    k = min(n, 52)
    up = from_bits((b + (np.int64(1) << (k - 1))) & (np.int64(-1) << k))  # n <= 52: half a quantum up, truncated
    up = from_bits((b & _SIGN) | ((b & _EXP) + (np.int64(1) << 52))) if n == 53 else up  # 2**(e + 1), signed
    r = up if n <= 53 else from_bits(b & _SIGN)
    r = np.copysign(np.inf, x) if abs(r) >= pow2(emax + 1) else r
    return x if (b & _EXP) == _EXP else r  # inf and NaN unchanged


NEAREST_EVEN, TOWARD_ZERO, NEAREST_AWAY = 0, 1, 2
ROUNDING_MODES = {"nearest": NEAREST_EVEN, "truncate": TOWARD_ZERO, "nearest-away": NEAREST_AWAY}


@jit(parallel=True)
def _round_array(x, prec, emin, emax, mode, out):
    """out[i] = x[i] rounded (flat, C-contiguous arrays of one size); the mode chosen once, outside
    the loops, so that each loop is one branch-free body that LLVM vectorizes."""
    if mode == TOWARD_ZERO:
        for i in prange(x.size):
            out[i] = truncate_to(x[i], prec, emin, emax)
    elif mode == NEAREST_AWAY:
        for i in prange(x.size):
            out[i] = round_away_to(x[i], prec, emin, emax)
    else:
        for i in prange(x.size):
            out[i] = round_to_vec(x[i], prec, emin, emax)


def round_array(x, prec, emin, emax, mode=NEAREST_EVEN):
    """A copy of the float64 array ``x`` with every element rounded to the format: ``mode`` 0 (or
    False) to nearest even, 1 (or True) toward zero, 2 to nearest with ties away from zero."""
    x = np.asarray(x, np.float64)
    out = np.empty(x.shape)  # x's shape, 0-d included (ascontiguousarray returns at least 1-d)
    flat = np.ascontiguousarray(x).reshape(-1)  # transposed or broadcast views: a C-order copy
    _round_array(flat, prec, emin, emax, np.int64(int(mode)), out.reshape(-1))
    return out
