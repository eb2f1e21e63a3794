"""A backend's result and gradients as the verdicts read them: float64 values (exact: every format refkern
judges widens losslessly), the format, the device; and the one check of a gradient's dtype.

A leaf of the analysis: :mod:`refkern.analysis.compare` dispatches to the judges of the losses and of
embedding (:mod:`refkern.analysis.losses`, :mod:`refkern.analysis.embedding`), which read their operands here,
so no judge imports compare back (tests/test_imports.py)."""

import numpy as np

from refkern._arrays import is_tensor, operand

__all__ = ["actual", "actual_grad", "actual_as"]


def actual(got, held=False):
    """(float64 values, format, device) of a backend's output, without loss; with ``held``, the values as
    :func:`~refkern._arrays.operand` holds them (float32 for fp16, bf16 and fp32 outputs, every value exact),
    with no float64 copy."""
    device = str(got.device) if is_tensor(got) else "numpy"
    o = operand(got, "actual", "compare")
    return np.asarray(o.values, None if held else np.float64).reshape(o.shape), o.fmt, device


def actual_grad(got, name, fmt, who):
    """(float64 values, device) of a backend's gradient ``got`` of argument ``name``, whose dtype must be
    ``fmt``'s (the argument's: torch returns each gradient in its argument's dtype); a TypeError otherwise."""
    device = str(got.device) if is_tensor(got) else "numpy"
    o = operand(got, f"the gradient of {name}", who)
    if o.fmt.name != fmt.name:
        raise TypeError(f"{who}: the gradient of {name} must have the dtype of {name}, {fmt.name}; got {o.fmt.name}.")
    return np.asarray(o.values, np.float64).reshape(o.shape), device


def actual_as(got, name, shape, fmt):
    """(float64 values, device) of a backend's result ``got`` of op ``name``, which must have the ``shape`` and
    format ``fmt`` the op gives for these inputs: a ValueError (the shape) or TypeError (the dtype) otherwise."""
    a64, afmt, device = actual(got)
    if a64.shape != tuple(shape):
        raise ValueError(f"compare: actual.shape={a64.shape} differs from the shape {name} gives for these inputs, "
                         f"{tuple(shape)}; pass the same arguments that produced it.")  # fmt: skip
    if afmt.name != fmt.name:
        raise TypeError(f"compare: {name} returns {fmt.name} for these inputs; got actual.dtype={afmt.name}.")
    return a64, device
