"""The header of a message of ops: what each op is (its name, keywords and structure, its tensors'
dtypes and shapes, the parameters it reads), written compactly, read on a worker.

A header is a sequence of values in a small tagged encoding (below), then one row per op:

* first (vocabulary digest, number of definitions, number of ops), then the message's distinct
  definitions: an op's template (op, structure, and its kind unless "forward"), a tensor's
  (dtype, shape), a view of a parameter (pid, offset, shape, stride);
* the rows, each a varint count then varints: the op's template index, then per tensor a
  definition's index (embedded bits, or a view), or the number of definitions plus a parameter's
  pid (the whole parameter). An op of three tensors costs five bytes.

The encoding: one tag byte, then its payload. An int in [0, 192) is its tag alone; a word both
sides know (an op, operand, keyword or dtype name: :func:`vocabulary`) is a tag and a varint;
other ints are varints, floats their 8 bytes, strings UTF-8, tuples, lists and dicts a count and
their items; :class:`Slot` (where a tensor stood) one byte; anything else (a ``torch.dtype``
keyword, say) its pickle. A bfloat16 tensor of shape (2, 32, 1, 1) is defined in 10 bytes; the
template of a ``mean`` over dims (-1, -2) with keepdim in 23.
"""

import functools
import pickle
import struct
import sys
import zlib

__all__ = ["Slot", "strip", "fill", "HeaderWriter", "read_header", "encode", "vocabulary", "digest"]


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


# tags: [0, _SMALL) the int itself; then the kinds below
_SMALL = 192
_NONE, _FALSE, _TRUE, _INT, _NEG, _FLOAT, _WORD, _STR, _TUPLE, _LIST, _DICT, _SLOT, _PICKLE = range(_SMALL, _SMALL + 13)


@functools.cache
def _word_index() -> dict:
    return {w: i for i, w in enumerate(vocabulary())}


def _enc(obj, out: bytearray):
    t = type(obj)
    if t is int:
        if 0 <= obj < _SMALL:
            out.append(obj)
        else:
            out.append(_INT if obj >= 0 else _NEG)
            out += _varint(abs(obj))
    elif obj is None:
        out.append(_NONE)
    elif t is bool:
        out.append(_TRUE if obj else _FALSE)
    elif t is float:
        out.append(_FLOAT)
        out += struct.pack("<d", obj)
    elif t is str:
        i = _word_index().get(obj)
        if i is not None:
            out.append(_WORD)
            out += _varint(i)
        else:
            b = obj.encode()
            out.append(_STR)
            out += _varint(len(b)) + b
    elif t is tuple or t is list:
        out.append(_TUPLE if t is tuple else _LIST)
        out += _varint(len(obj))
        for v in obj:
            _enc(v, out)
    elif t is dict:
        out.append(_DICT)
        out += _varint(len(obj))
        for k, v in obj.items():
            _enc(k, out)
            _enc(v, out)
    elif obj is Slot:
        out.append(_SLOT)
    else:  # a torch.dtype keyword, a named tuple, ...: pickled whole
        b = pickle.dumps(obj, 4)
        out.append(_PICKLE)
        out += _varint(len(b)) + b


def encode(obj) -> bytes:
    """``obj`` in the header's encoding (the bytes also serve as its identity when interning)."""
    out = bytearray()
    _enc(obj, out)
    return bytes(out)


def _dec(buf, at: int):
    tag = buf[at]
    at += 1
    if tag < _SMALL:
        return tag, at
    if tag in (_INT, _NEG):
        n, at = _read_varint(buf, at)
        return (n if tag == _INT else -n), at
    if tag in (_NONE, _FALSE, _TRUE):
        return (None, False, True)[tag - _NONE], at
    if tag == _FLOAT:
        return struct.unpack_from("<d", buf, at)[0], at + 8
    if tag == _WORD:
        i, at = _read_varint(buf, at)
        return vocabulary()[i], at
    if tag in (_STR, _PICKLE):
        n, at = _read_varint(buf, at)
        raw = bytes(buf[at : at + n])
        return (raw.decode() if tag == _STR else pickle.loads(raw)), at + n
    if tag in (_TUPLE, _LIST):
        n, at = _read_varint(buf, at)
        items = []
        for _ in range(n):
            v, at = _dec(buf, at)
            items.append(v)
        return (tuple(items) if tag == _TUPLE else items), at
    if tag == _DICT:
        n, at = _read_varint(buf, at)
        d = {}
        for _ in range(n):
            k, at = _dec(buf, at)
            d[k], at = _dec(buf, at)
        return d, at
    if tag == _SLOT:
        return Slot, at
    raise ValueError(f"header: unknown tag {tag} at byte {at - 1}; the client's refkern is not this one.")


class HeaderWriter:
    """Writes a header: :meth:`first`, then :meth:`define` per definition and :meth:`row` per op;
    each returns the bytes it added (an op's own bytes are exact). :meth:`getvalue` the header."""

    def __init__(self):
        self._buf = bytearray()

    def _put(self, b: bytes) -> int:
        self._buf += b
        return len(b)

    def first(self, ndefs: int, nops: int) -> int:
        return self._put(_varint(digest()) + _varint(ndefs) + _varint(nops))

    def define(self, d) -> int:
        return self._put(encode(d))

    def row(self, items) -> int:
        return self._put(_varint(len(items)) + b"".join(_varint(i) for i in items))

    def getvalue(self) -> bytes:
        return bytes(self._buf)


def read_header(header: bytes):
    """(digest, definitions, rows) of a header, or (digest, None, nops) if the digest is not this
    side's (its vocabulary differs: the definitions cannot be read)."""
    dig, at = _read_varint(header, 0)
    ndefs, at = _read_varint(header, at)
    nops, at = _read_varint(header, at)
    if dig != digest():
        return dig, None, nops
    defs = []
    for _ in range(ndefs):
        d, at = _dec(header, at)
        defs.append(d)
    rows = []
    for _ in range(nops):
        k, at = _read_varint(header, at)
        items = []
        for _ in range(k):
            v, at = _read_varint(header, at)
            items.append(v)
        rows.append(items)
    return dig, defs, rows
