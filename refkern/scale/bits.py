"""Tensors as their raw bits (bfloat16 and float16 included, never converted), and many tensors' bits
as one blob: back to back, or as byte planes deflated where that is smaller.

A float's top byte (sign and exponent) varies little across a tensor, its low bytes much: the
byte planes of a blob (every tensor's first bytes, then their second bytes, ..., per item size)
deflate (zlib level 1) to about 0.86 of float32 normals, 0.72 of bfloat16 ones and 0.63 after a
ReLU. A blob costs one byte saying which form it takes; :func:`unpack` gives the bytes back to back.
"""

import math
import sys
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["Bits", "to_bits", "from_bits", "tensor_at", "nbytes_of", "pack", "unpack"]

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
PLAIN, PLANES = 0, 1  # a blob's first byte


@dataclass
class Bits:
    """A tensor as its raw bits: dtype name, shape and a contiguous numpy array of unsigned integers."""

    dtype: str
    shape: tuple
    raw: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes


def to_bits(t) -> Bits:
    torch = sys.modules["torch"]
    c = t.detach().to("cpu").contiguous()
    if c.dtype == torch.bool:
        raw = c.numpy().view(np.uint8)
    else:
        raw = c.view(getattr(torch, f"uint{8 * c.element_size()}") if c.element_size() > 1 else torch.uint8).numpy()
    return Bits(str(c.dtype).removeprefix("torch."), tuple(c.shape), raw.reshape(-1).copy())


def from_bits(b: Bits):
    import torch

    raw = torch.from_numpy(b.raw.view(_UINT[b.raw.itemsize]).copy())
    dt = getattr(torch, b.dtype)
    return (raw.view(torch.bool) if dt == torch.bool else raw.view(dt)).reshape(b.shape)


def tensor_at(buf, offset: int, dtype: str, shape: tuple):
    """The tensor whose bits start at ``offset`` of ``buf`` (a copy: aligned, writable)."""
    import torch

    dt = getattr(torch, dtype)
    size = dt.itemsize
    raw = np.frombuffer(buf, np.uint8, math.prod(shape) * size, offset).view(_UINT[size]).copy()
    t = torch.from_numpy(raw)
    return (t.view(torch.bool) if dt == torch.bool else t.view(dt)).reshape(shape)


def nbytes_of(dtype: str, shape: tuple) -> int:
    import torch

    return math.prod(shape) * getattr(torch, dtype).itemsize


def _planes(arrays: list) -> bytes:
    """Per item size (ascending), the arrays' bytes as planes: every item's byte 0, then byte 1, ..."""
    out = []
    for size in sorted({a.itemsize for a in arrays}):
        group = [a.reshape(-1).view(np.uint8) for a in arrays if a.itemsize == size]
        out.append(np.ascontiguousarray(np.concatenate(group).reshape(-1, size).T).tobytes())
    return b"".join(out)


def pack(arrays: list, planes: bool = True) -> bytes:
    """The arrays' bits as one blob: byte planes deflated when ``planes`` and that is smaller, else
    back to back. Arrays of unsigned integers, each of its tensor's item size."""
    plain = b"".join(a.tobytes() for a in arrays)
    if planes and plain:
        z = zlib.compressobj(1, zlib.DEFLATED, -15)  # raw deflate (no header, no checksum), the fastest level
        packed = z.compress(_planes(arrays)) + z.flush()
        if len(packed) < len(plain):
            return bytes((PLANES,)) + packed
    return bytes((PLAIN,)) + plain


def unpack(blob: bytes, sizes: list) -> memoryview:
    """``blob``'s bits back to back, for arrays of (item size, bytes) ``sizes`` in order."""
    if blob[0] == PLAIN:
        return memoryview(blob)[1:]
    data = np.frombuffer(zlib.decompress(memoryview(blob)[1:], -15), np.uint8)
    groups, at = {}, 0
    for size in sorted({s for s, _ in sizes}):
        n = sum(b for s, b in sizes if s == size)
        groups[size] = [np.ascontiguousarray(data[at : at + n].reshape(size, -1).T).reshape(-1), 0]
        at += n
    out = []
    for size, n in sizes:
        g = groups[size]
        out.append(g[0][g[1] : g[1] + n])
        g[1] += n
    return memoryview(np.concatenate(out) if out else np.empty(0, np.uint8)).cast("B")
