"""What every op wrapper does around its kernel: operands in, method and formats chosen,
results out in the operands' dtype, as numpy arrays or CPU tensors."""

import sys
from dataclasses import dataclass

import numpy as np

from refkern._arrays import Operand, operand, promote, remember, same_dtype
from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, Format, round_to
from refkern.kernels._element import METHOD_CODES
from refkern.reduce import lookup_method, working_format

__all__ = ["Plan", "plan", "finish", "deliver", "as_f64"]


@dataclass
class Plan:
    op: str
    ops: dict  # name -> Operand (None where absent)
    out: Format  # result format (torch promotion)
    work: Format  # working format of the non-exact methods (= out for exact)
    method: int  # METHOD_CODES
    narrow: bool  # all multiplied operands are float32 or narrower: products exact in float64
    tensor: bool  # any operand was a torch tensor

    @property
    def kernel_args(self):
        return (self.method, self.narrow, *self.work.params)


def plan(op: str, operands: dict, multiplied: tuple, accumulate: str, accum_dtype, out: Format | None = None) -> Plan:
    """Validate the operands' types and the method; ``operands`` maps names to inputs (None allowed).

    Every operand must have the same dtype, as torch requires of dot, matmul, linear and the
    convolutions (it raises on float32 with float64, or float16 with bfloat16).
    ``out`` overrides the result format (the analysis rounds the exact value once to the format a
    backend returned, which under autocast differs from the inputs', and operands may differ:
    autocast casts them on the way in); then mixed dtypes are accepted."""
    ops = {k: (operand(v, k, op) if v is not None else None) for k, v in operands.items()}
    lookup_method(op, accumulate)
    present = [o for o in ops.values() if o is not None]
    if out is None:
        same_dtype(op, {k: o for k, o in ops.items() if o is not None})
    out = out or promote(*(o.fmt for o in present))
    work = working_format(op, accumulate, accum_dtype, out)  # exact: the result format
    narrow = all(ops[k].fmt.prec <= FLOAT32.prec for k in multiplied)
    return Plan(op, ops, out, work, METHOD_CODES[accumulate], narrow, any(o.torch for o in present))


def as_f64(o: Operand) -> np.ndarray:
    """The operand's values widened exactly to contiguous float64."""
    return np.ascontiguousarray(o.values, dtype=np.float64)


@jit
def _round_all(x, prec, emin, emax):
    flat = x.reshape(-1)
    for i in range(flat.size):
        flat[i] = round_to(flat[i], prec, emin, emax)


def finish(p: Plan, out64: np.ndarray):
    """The kernel's float64 results in the result dtype: rounded once more only when a non-exact
    method worked in another format (the store to the result dtype), otherwise exact."""
    if p.work != p.out:
        _round_all(out64, *p.out.params)
    return deliver(out64, p.out, p.tensor)


def deliver(out64: np.ndarray, fmt: Format, tensor: bool):
    """float64 values that ``fmt`` holds exactly, as an array of that dtype (a CPU tensor when
    ``tensor``): a lossless conversion."""
    if tensor:
        torch = sys.modules["torch"]
        out64 = out64 if out64.flags.c_contiguous else out64.copy()  # (ascontiguousarray makes 0-d 1-d)
        return remember(torch.from_numpy(out64).to(getattr(torch, fmt.name)), out64, fmt)
    if fmt.name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # bfloat16 came from torch in a mixed call; keep it lossless
            return out64.astype(np.float32)
        return out64.astype(ml_dtypes.bfloat16)
    return out64.astype(fmt.name)
