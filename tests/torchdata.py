"""Seeded torch inputs and inputs rounded to a narrower format, shared by the analysis tests."""

import zlib

import torch

from refkern.accumulate.formats import round_array


def seeded(*key):
    """randn(*shape) from a generator seeded by ``key``: the same key, the same data, in any test order."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return lambda *shape: torch.randn(*shape, generator=g)


def rounded(t, fmt, mode=0):
    """``t`` with every element rounded to ``fmt`` (mode 0 nearest even, 1 truncated, 2 ties away)."""
    return torch.from_numpy(round_array(t.double().numpy(), *fmt.params, mode)).to(t.dtype)
