"""Two helpers the audit and the compiled-graph audit share (each module imports this one, neither the
other): the bit-for-bit comparison of two tensors, and whether a dispatch mode is the innermost one."""

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
