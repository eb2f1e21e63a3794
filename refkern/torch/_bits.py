"""Helpers the audit and the compiled-graph audit share (each module imports this one, neither the
other): the bit-for-bit comparison of two tensors, whether a dispatch mode is the innermost one, and what
torch's CUDA division by a CPU scalar computes instead of the quotient."""

import math

import torch

__all__ = []


def _same_bits(actual, expected):
    """(number of elements, number that differ, max ulp among them, first differing flat index)."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    n = a.numel()
    if a.shape != e.shape:
        return n, n, math.inf, 0
    if a.is_floating_point():
        same = (a == e) & (torch.signbit(a) == torch.signbit(e)) | (torch.isnan(a) & torch.isnan(e))
    else:
        same = a == e
    bad = (~same).nonzero()
    if not bad.numel():
        return n, 0, 0.0, None
    ulp = math.inf
    if a.is_floating_point():
        ad, ed = a.double(), e.double()
        spacing = torch.finfo(a.dtype).eps * torch.maximum(ed.abs(), torch.tensor(torch.finfo(a.dtype).tiny)).double()
        with torch.no_grad():
            d = ((ad - ed).abs() / spacing)[~same]
        d = d[torch.isfinite(d)]
        ulp = float(d.max()) if d.numel() else math.inf
    return n, int(bad.numel()), ulp, int(bad[0, 0])


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
