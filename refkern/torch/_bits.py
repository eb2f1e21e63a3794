"""Helpers the audit and the compiled-graph audit share (each module imports this one, neither the
other): the bit-for-bit comparison of two tensors, whether a dispatch mode is the innermost one, and what
torch's CUDA division by a CPU scalar computes instead of the quotient."""

import math

import torch

__all__ = []


_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _same_bits(actual, expected):
    """(number of elements, number that differ, max ulp among them, first differing flat index). Floating
    tensors of one dtype: their bit patterns compared in one pass (equal bits are equal values of one
    sign), then, among the differing elements only, NaN pairs dropped (any NaN matches any NaN) and the
    ulps measured: on a 64 x 112 x 112 activation with 3 differing elements, 1.5 ms of one thread against
    20 to 31 ms for the float comparison of every element (helper-28's measurement, load 4)."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    n = a.numel()
    if a.shape != e.shape:
        return n, n, math.inf, 0
    it = _INT.get(a.dtype) if a.dtype == e.dtype else None
    if it is None:
        return _same_values(a, e, n)
    bad = (a.view(it) != e.view(it)).nonzero().reshape(-1)
    if bad.numel():
        bad = bad[~(torch.isnan(a[bad]) & torch.isnan(e[bad]))]
    if not bad.numel():
        return n, 0, 0.0, None
    return n, int(bad.numel()), _ulps(a[bad], e[bad]), int(bad[0])


def _ulps(a, e) -> float:
    """The largest |a - e| in units of a's dtype's spacing at e (finite ratios; inf where none is)."""
    ad, ed = a.double(), e.double()
    tiny = torch.tensor(torch.finfo(a.dtype).tiny, dtype=torch.float64)
    d = (ad - ed).abs() / (torch.finfo(a.dtype).eps * torch.maximum(ed.abs(), tiny))
    d = d[torch.isfinite(d)]
    return float(d.max()) if d.numel() else math.inf


def _same_values(a, e, n):
    """:func:`_same_bits` for tensors of different dtypes, or not floating: by value (and sign)."""
    if a.is_floating_point():
        same = (a == e) & (torch.signbit(a) == torch.signbit(e)) | (torch.isnan(a) & torch.isnan(e))
    else:
        same = a == e
    bad = (~same).nonzero().reshape(-1)
    if not bad.numel():
        return n, 0, 0.0, None
    ulp = _ulps(a[bad], e[bad]) if a.is_floating_point() else math.inf
    return n, int(bad.numel()), ulp, int(bad[0])


def _top_is(mode):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is mode


def reciprocal_product(name, args, kwargs, out):
    """What torch's CUDA kernel gives for ``div(a, b)`` with ``b`` a CPU scalar (a Python number, or a 0-d
    tensor on the CPU beside a CUDA ``a``): not the quotient but ``a * (1 / b)``, the reciprocal formed once
    on the host in the op's math type (float32 for float16, bfloat16 and float32; float64 for float64),
    the product rounded to the result (ATen's BinaryDivTrueKernel.cu: "compute a * reciprocal(b) ... may
    lose one bit of precision"). ``args`` as the call gave them, ``out`` its result; None where this is not
    that case (the division is then IEEE's, defined to the bit). Seen on an H100: T5's relative position
    buckets divided by log(max_distance / max_exact) differed from the quotient in the last bit."""
    if name != "div" or len(args) < 2 or kwargs.get("rounding_mode") is not None:
        return None
    a, b = args[0], args[1]
    if not (isinstance(a, torch.Tensor) and a.device.type == "cuda" and a.is_floating_point()):
        return None
    if isinstance(b, torch.Tensor):
        if b.dim() or b.device.type != "cpu":
            return None
        b = b.item()
    if not isinstance(b, (int, float)) or not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    return times_reciprocal(a.detach().to("cpu"), b, out.dtype)


def times_reciprocal(a, b, dtype):
    """``a * (1 / b)`` as torch's CUDA division by a scalar forms it (:func:`reciprocal_product`), on the CPU
    tensor ``a``: in float64 for a float64 result, else float32, rounded to ``dtype``."""
    opmath = torch.float64 if dtype == torch.float64 else torch.float32
    inv = torch.tensor(1.0, dtype=opmath) / torch.tensor(b, dtype=opmath)
    return (a.to(opmath) * inv).to(dtype)
