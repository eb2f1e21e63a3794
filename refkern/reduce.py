"""``refkern.dot``, and the accumulation methods every reduction names (``refkern.sum`` lives in
:mod:`refkern.kernels.reduction`)."""

import numpy as np

from refkern._arrays import format_of, operand, result, same_dtype
from refkern.accumulate.exact import exact_dot, exact_sum
from refkern.accumulate.formats import round_to
from refkern.accumulate.methods import KERNELS
from refkern.scale._dispatch import dask_in, to_dask

__all__ = ["dot", "METHODS"]

METHODS = tuple(sorted([*KERNELS, "exact"]))


def lookup_method(op: str, accumulate: str):
    if accumulate not in METHODS:
        choices = ", ".join(repr(m) for m in METHODS)
        raise ValueError(f"{op}: unknown accumulate={accumulate!r}; choose one of {choices}.")
    return KERNELS.get(accumulate)


def working_format(op, accumulate, accum_dtype, out_fmt):
    """The format the non-exact methods compute in (default: the result format)."""
    if accum_dtype is None:
        return out_fmt
    if accumulate == "exact":
        raise ValueError(
            f"{op}: accum_dtype={accum_dtype!r} does not apply to accumulate='exact', which rounds "
            "the exact sum once to the result dtype; pass accumulate='naive' (or another method) "
            "to compute in a working format."
        )
    return format_of(accum_dtype, "accum_dtype", op)


def _reduce(op, arrays, out_fmt, accumulate, accum_dtype, unit):
    """Dispatch one reduction. ``arrays`` are 1-D float32/float64 numpy arrays."""
    kernel = lookup_method(op, accumulate)
    work = working_format(op, accumulate, accum_dtype, out_fmt)
    if kernel is None:  # exact: fast kernels for float32 (all narrower inputs widen to it) and float64
        wide = np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32
        arrays = [np.ascontiguousarray(a, dtype=wide) for a in arrays]
        return exact_sum(arrays[0], out_fmt) if unit else exact_dot(arrays[0], arrays[1], out_fmt)
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in arrays]
    a = arrays[0]
    b = a if unit else arrays[1]
    value = kernel(a, b, unit, 0.0, False, *work.params)
    return round_to(value, *out_fmt.params)  # the store to the result dtype (identity if it holds the value)


def dot(x, y, *, accumulate: str = "exact", accum_dtype=None):
    """Reference dot product ``sum_i x[i] * y[i]`` (``torch.dot`` semantics).

    Parameters
    ----------
    x, y : 1-D arrays or tensors of equal length, float16, bfloat16, float32 or float64.
    accumulate : ``"exact"`` (default), ``"naive"``, ``"pairwise"``, ``"kahan"``, ``"neumaier"``
        or ``"dot2"``.
    accum_dtype : working format of the non-exact methods (default: the result dtype), e.g.
        ``"float16"`` to emulate a backend that accumulates in half precision.

    Returns
    -------
    A numpy scalar (numpy inputs) or 0-d CPU tensor (any torch input) of the inputs' dtype.
    ``x`` and ``y`` must have the same dtype, as ``torch.dot`` requires (a TypeError otherwise).

    Notes
    -----
    With ``accumulate="exact"`` the result is the exact value of the sum of all products
    rounded once, to nearest even, to the result dtype: correct at midpoints (no double
    rounding through float64), subnormal results, overflow to inf only if the exact value
    rounds beyond the largest finite number, no spurious intermediate overflow, NaN if any
    term is NaN or the terms hold both +inf and -inf (``0 * inf`` is NaN), and -0 only when
    every product is -0. Float32 products are exact in float64; float64 products are split
    exactly into two float64 (FMA), or into integer halves when they could under/overflow.
    The other methods and their error bounds: :mod:`refkern.accumulate.methods`.
    """
    if dask_in(x, y):  # lazy, the same bits for every chunking (refkern.scale.array)
        return to_dask("dot", x, y, accumulate=accumulate, accum_dtype=accum_dtype)
    op = "dot"
    a = operand(x, "x", op)
    b = operand(y, "y", op)
    if a.values.ndim != 1 or b.values.ndim != 1:
        raise ValueError(f"{op}: expected 1-D inputs; got x.shape={a.shape} and y.shape={b.shape}.")
    if a.values.shape != b.values.shape:
        raise ValueError(f"{op}: x and y must have the same length; got x.shape={a.shape} and y.shape={b.shape}.")
    same_dtype(op, {"x": a, "y": b})
    out = a.fmt
    value = _reduce(op, [a.values, b.values], out, accumulate, accum_dtype, unit=False)
    return result(value, out, a.torch or b.torch)

