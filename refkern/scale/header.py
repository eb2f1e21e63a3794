"""The header of a message of ops: what each op is (its name, keywords and structure, its tensors'
dtypes and shapes, the parameters it reads), written compactly, read on a worker.

A header is a varint (the length of its pickles), the pickles, then one row per op:

* the pickles, one public ``pickle.Pickler`` (protocol 2: no frames) writing several objects in
  turn, its memo kept from one to the next (a repeated object is a two-byte reference): first
  (vocabulary digest, number of definitions, number of ops, :data:`Slot`), then the message's
  distinct definitions: an op's template (op, structure, and its kind unless "forward"), a
  tensor's (dtype, shape), a view of a parameter (pid, offset, shape, stride). The words both
  sides know (op, operand, keyword and dtype names) are persistent references of three bytes, and
  so are the small negative ints (a ``dim=-1``), never text or five-byte ints;
* the rows, each a varint count then varints: the op's template index, then per tensor a
  definition's index (embedded bits, or a view), or the number of definitions plus a parameter's
  pid (the whole parameter). An op of three tensors costs five bytes.
"""

import functools
import io
import pickle
import sys
import zlib

__all__ = ["Slot", "strip", "fill", "HeaderWriter", "read_header", "vocabulary", "digest", "PROTOCOL"]

PROTOCOL = 2  # the oldest with the binary opcodes; no frames (protocol 4 frames each object, 11 bytes)
_NEG = 128  # ints in [-_NEG, 0) are persistent references


class Slot:
    """Where a tensor stood in a shipped op's arguments (the class itself marks it, never an instance)."""


# the words both sides know (a compression dictionary: a word missing costs bytes, never correctness):
# the registry's op, operand and parameter names, and the keywords the products, convolutions and pools take
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
_KEYWORDS = ("stride", "padding", "dilation", "groups", "output_padding", "kernel_size", "ceil_mode",
             "count_include_pad", "divisor_override", "return_indices", "output_size", "dim", "keepdim",
             "correction", "unbiased", "eps", "normalized_shape", "num_groups", "scale", "is_causal",
             "dtype")  # fmt: skip


@functools.cache
def vocabulary() -> tuple:
    from refkern import ops

    words = set(_KEYWORDS)
    for name, r in ops.REGISTRY.items():
        words.update((name, *r.operands, *r.differentiable))
        for c in r.calls:
            words.update(c.params or ())
    return ("forward", "backward", *_DTYPES, *sorted(words - set(_DTYPES)))


@functools.cache
def digest() -> int:
    return zlib.crc32("\0".join(vocabulary()).encode())


def strip(obj, tensors: list):
    """``obj`` with every tensor replaced by :class:`Slot`, the tensors appended in order."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return Slot
    if isinstance(obj, (list, tuple)):
        items = [strip(v, tensors) for v in obj]
        return items if isinstance(obj, list) else tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, dict):
        return {k: strip(v, tensors) for k, v in obj.items()}
    return obj


def fill(obj, tensors):
    """:func:`strip` undone: each :class:`Slot` replaced by the next of ``tensors`` (an iterator)."""
    if obj is Slot:
        return next(tensors)
    if isinstance(obj, (list, tuple)):
        items = [fill(v, tensors) for v in obj]
        return items if isinstance(obj, list) else tuple(items) if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, dict):
        return {k: fill(v, tensors) for k, v in obj.items()}
    return obj


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf, at: int):
    n, shift = 0, 0
    while True:
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, at
        shift += 7


class _Pickler(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, PROTOCOL)
        self._words = {w: i for i, w in enumerate(vocabulary())}

    def persistent_id(self, obj):
        if type(obj) is str:
            return self._words.get(obj)
        if type(obj) is int and -_NEG <= obj < 0:
            return len(self._words) - 1 - obj  # past the words
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        words = vocabulary()
        return words[pid] if pid < len(words) else len(words) - 1 - pid


class HeaderWriter:
    """Writes a header: :meth:`first`, then :meth:`define` per definition and :meth:`row` per op;
    each returns the bytes it added (an op's own bytes are exact). :meth:`getvalue` the header."""

    def __init__(self):
        self._buf = io.BytesIO()
        self._pickler = _Pickler(self._buf)
        self._rows = bytearray()

    def _dump(self, obj) -> int:
        at = self._buf.tell()
        self._pickler.dump(obj)
        return self._buf.tell() - at

    def first(self, ndefs: int, nops: int) -> int:
        return self._dump((digest(), ndefs, nops, Slot))  # Slot memoized here: two bytes a tensor after

    def define(self, d) -> int:
        return self._dump(d)

    def row(self, items) -> int:
        row = _varint(len(items)) + b"".join(_varint(i) for i in items)
        self._rows += row
        return len(row)

    def prefix(self) -> int:
        return len(_varint(self._buf.tell()))

    def getvalue(self) -> bytes:
        pickles = self._buf.getvalue()
        return _varint(len(pickles)) + pickles + bytes(self._rows)


def read_header(header: bytes):
    """(digest, definitions, rows) of a header, or (digest, None, nops) if the digest is not this
    side's (its vocabulary differs: the definitions cannot be read)."""
    n, at = _read_varint(header, 0)
    up = _Unpickler(io.BytesIO(memoryview(header)[at : at + n]))
    dig, ndefs, nops, _ = up.load()
    if dig != digest():
        return dig, None, nops
    defs = [up.load() for _ in range(ndefs)]
    rows, at = [], at + n
    for _ in range(nops):
        k, at = _read_varint(header, at)
        items = []
        for _ in range(k):
            v, at = _read_varint(header, at)
            items.append(v)
        rows.append(items)
    return dig, defs, rows
