"""Inputs in, results out: numpy arrays and torch tensors, converted without loss.

torch is never imported here: a tensor can only exist if the caller imported torch, so
it is found through ``sys.modules``. bfloat16 (torch, or numpy arrays of ml_dtypes'
bfloat16) is widened to float32, which holds every bfloat16 value exactly.
"""

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, FORMATS, Format

_ALIASES = {
    "float16": FLOAT16, "fp16": FLOAT16, "half": FLOAT16, "f16": FLOAT16,
    "bfloat16": BFLOAT16, "bf16": BFLOAT16,
    "float32": FLOAT32, "fp32": FLOAT32, "float": FLOAT32, "single": FLOAT32, "f32": FLOAT32,
    "float64": FLOAT64, "fp64": FLOAT64, "double": FLOAT64, "f64": FLOAT64,
}  # fmt: skip

_KINDS = "float16, bfloat16, float32 or float64"


@dataclass
class Operand:
    """A validated input: the values as a float32/float64 numpy array, and where they came from."""

    values: np.ndarray  # float32 (for float16/bfloat16/float32 inputs) or float64, exact copies
    fmt: Format  # the input's own format
    torch: bool  # given as a torch tensor
    shape: tuple


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def is_tensor(x) -> bool:
    t = _torch_tensor_type()
    return t is not None and isinstance(x, t)


_ONCE = threading.local()  # the conversions of the current :func:`converted_once` block, by id of the input


@contextmanager
def converted_once():
    """Within the block, each tensor is converted by :func:`operand` once, however many times it is
    asked for (compare reads an input in the reference, the envelope's layout and the noise's; a
    bfloat16 tensor of 12 million elements costs 30 ms to widen each time). The block holds every tensor
    it converted, so an id stays that tensor's; the shared values are read, never written, by every
    caller (as for a float32 tensor's, which are the tensor's own memory)."""
    outer = getattr(_ONCE, "memo", None)
    if outer is None:
        _ONCE.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _ONCE.memo = None


def remember(t, values: np.ndarray, fmt: Format):
    """Within a :func:`converted_once` block, let :func:`operand` take the tensor ``t`` a kernel just made
    from ``values`` (exact in ``fmt``) as those values, not convert it back (the reference compare reads)."""
    memo = getattr(_ONCE, "memo", None)
    if memo is not None:
        held = np.asarray(values, np.float64 if fmt is FLOAT64 else np.float32)
        memo[id(t)] = (t, Operand(held, fmt, True, tuple(t.shape)), t._version)
    return t


def operand(x, name: str, op: str) -> Operand:
    """Validate one input of ``op`` and convert it to an exact float32/float64 numpy array."""
    if is_tensor(x):
        memo = getattr(_ONCE, "memo", None)
        if memo is None:
            return _from_tensor(x, name, op)
        hit = memo.get(id(x))
        if hit is None or hit[0] is not x or hit[0]._version != hit[2]:
            hit = memo[id(x)] = (x, _from_tensor(x, name, op), x._version)
        return hit[1]
    try:
        a = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{op}: {name} must be an array or tensor of floats; got {type(x).__name__} ({exc}).") from None
    dt = a.dtype
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes' numpy bfloat16
        wide = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return Operand(wide, BFLOAT16, False, a.shape)
    if dt.kind != "f" or dt.name not in FORMATS:
        raise TypeError(f"{op}: expected floating-point inputs ({_KINDS}); got {name}.dtype={dt.name}.") from None
    fmt = FORMATS[dt.name]
    if fmt is FLOAT16:
        a = a.astype(np.float32)  # exact
    return Operand(a, fmt, False, a.shape)


def _from_tensor(x, name, op):
    torch = sys.modules["torch"]
    if x.layout != torch.strided:
        raise TypeError(f"{op}: expected a dense tensor; got {name}.layout={x.layout}. Use {name}.to_dense().")
    names = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: FLOAT32, torch.float64: FLOAT64}
    if x.dtype not in names:
        raise TypeError(f"{op}: expected floating-point inputs ({_KINDS}); got {name}.dtype={x.dtype}.")
    fmt = names[x.dtype]
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if fmt is BFLOAT16:  # exact widening by numpy (a bfloat16 is the top half of a float32's bits): torch's
        # own conversion runs on its thread pool and waited 15 ms on a 512 x 512 tensor beside numba's threads
        a = (t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif fmt is FLOAT16:
        a = t.numpy().astype(np.float32)  # exact
    else:
        a = t.numpy()
    return Operand(a, fmt, True, tuple(x.shape))


def same_dtype(op: str, ops: dict) -> None:
    """torch's rule for dot, matmul, linear and the convolutions: every operand has one dtype
    (torch raises on float32 with float64, and on float16 with bfloat16; it does not promote)."""
    names = list(ops)
    first = names[0]
    for k in names[1:]:
        if ops[k].fmt.name != ops[first].fmt.name:
            raise TypeError(
                f"{op}: {first} and {k} must have the same dtype, as torch requires (it does not promote); "
                f"got {first}.dtype={ops[first].fmt.name} and {k}.dtype={ops[k].fmt.name}. "
                f"Convert one of them first, e.g. {k}.astype({first}.dtype) or {k}.to({first}.dtype)."
            )


def promote(*fmts: Format) -> Format:
    """torch's type promotion among float formats: float16 with bfloat16 gives float32."""
    fs = set(fmts)
    if FLOAT64 in fs:
        return FLOAT64
    if FLOAT32 in fs or (FLOAT16 in fs and BFLOAT16 in fs):
        return FLOAT32
    return fs.pop()


def format_of(dtype, name: str, op: str) -> Format:
    """A format from a name ('float32', 'fp16', 'bf16', ...), a numpy dtype or a torch dtype."""
    if isinstance(dtype, Format):
        return dtype
    key = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str):
        try:
            key = np.dtype(dtype).name
        except TypeError:
            pass
    fmt = _ALIASES.get(key.lower())
    if fmt is None:
        choices = ", ".join(repr(k) for k in sorted(FORMATS))
        raise ValueError(f"{op}: unknown {name}={dtype!r}; choose one of {choices}.") from None
    return fmt


def result(value: float, fmt: Format, as_tensor: bool):
    """A float64 value that is exactly representable in ``fmt``, as a numpy scalar or 0-d tensor."""
    if as_tensor:
        torch = sys.modules["torch"]
        return torch.tensor(value, dtype=getattr(torch, fmt.name))
    if fmt is BFLOAT16:
        try:
            import ml_dtypes
        except ImportError:  # bfloat16 came from torch in a mixed call; keep it lossless
            return np.float32(value)
        return ml_dtypes.bfloat16(value)
    return np.dtype(fmt.name).type(value)
