"""The exact reference of an op call, with what the analysis needs beside it.

``evaluate(op, args, kwargs)`` runs the exact kernel once and returns, per output
element, the correctly rounded value, the magnitude ``M = sum|terms|`` (bias included)
and the number of terms. ``emulate=(format, truncate, round_bias)`` first rounds the inputs to a
narrower format (TF32, bfloat16, float16), to nearest even or toward zero: that is the
exact result a backend with such inputs and exact accumulation would return.
"""

import inspect
from dataclasses import dataclass

import numpy as np

from refkern.accumulate.exact import exact_dot
from refkern.accumulate.formats import Format, round_array
from refkern.kernels import conv, gemm
from refkern.kernels._common import plan

__all__ = ["OPS", "Evaluation", "evaluate", "op_name"]


@dataclass
class Evaluation:
    values: np.ndarray  # float64, the exact result rounded once to ``fmt``
    mag: np.ndarray  # float64, sum of |terms| per element (bias included)
    n_terms: int  # terms per element (bias included)
    fmt: Format  # result format
    shape: tuple
    axes: tuple  # a name per output axis
    has_bias: bool = False
    in_prec: int = 53  # precision of the multiplied inputs (an emulation coarser than this changes them)


OPS = ("dot", "matmul", "linear", "conv1d", "conv2d")


def op_name(op) -> str:
    """'conv2d' from 'conv2d' or from refkern.conv2d (house-style error otherwise)."""
    import refkern

    if isinstance(op, str) and op in OPS:
        return op
    for name in OPS:
        if op is getattr(refkern, name):
            return name
    choices = ", ".join(repr(o) for o in OPS)
    raise ValueError(f"compare: unknown op={op!r}; choose one of {choices} (or the refkern function itself).")


def _bind(name, args, kwargs):
    fn = getattr(__import__("refkern"), name)
    for bad in ("accumulate", "accum_dtype"):
        if bad in kwargs:
            raise ValueError(f"compare: {bad}= is not an argument of the op: the reference is always exact.")
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"compare: the arguments do not fit {name}: {exc}.") from None
    bound.apply_defaults()
    return bound.arguments


def _emulated(p, names, emulate):
    """Round the operands a reduced-precision backend rounds: always the multiplied ones (tensor
    cores convert their inputs), and the bias too when ``round_bias`` (a dtype cast of every
    operand, as autocast does; TF32 and fp32 epilogues add the bias unrounded)."""
    if emulate is None:
        return
    fmt, truncate, round_bias = emulate
    if round_bias and p.ops.get("bias") is not None:
        names = (*names, "bias")
    for k in names:
        o = p.ops[k]
        o.values = round_array(np.ascontiguousarray(o.values, np.float64), *fmt.params, truncate)


def _in_prec(p, names) -> int:
    return max(p.ops[k].fmt.prec for k in names)


def evaluate(op, args, kwargs, *, out: Format | None = None, emulate=None) -> Evaluation:
    name = op_name(op)
    a = _bind(name, args, kwargs)
    if name == "dot":
        p = plan("dot", {"x": a["x"], "y": a["y"]}, ("x", "y"), "exact", None, out=out)
        _emulated(p, ("x", "y"), emulate)
        x, y = (np.ascontiguousarray(p.ops[k].values, np.float64) for k in ("x", "y"))
        if x.ndim != 1 or x.shape != y.shape:
            raise ValueError(f"dot: expected 1-D inputs of equal length; got x.shape={x.shape} and y.shape={y.shape}.")
        v = np.array(exact_dot(x, y, p.out))
        return Evaluation(v, np.array(np.abs(x * y).sum()), x.size, p.out, (), (), False, _in_prec(p, ("x", "y")))
    if name in ("matmul", "linear"):
        names = ("a", "b") if name == "matmul" else ("x", "weight")
        ops = {k: a[k] for k in names} if name == "matmul" else {"x": a["x"], "weight": a["weight"], "bias": a["bias"]}
        p = plan(name, ops, names, "exact", None, out=out)
        _emulated(p, names, emulate)
        if name == "matmul":
            A3, Bt3, ia, ib, shape = gemm.matmul_operands(p)
            bias = None
        else:
            A3, Bt3, bias, shape = gemm.linear_operands(p)
            ia = ib = np.zeros(1, np.int64)
        values, mag = gemm.run_gemm(p, A3, Bt3, ia, ib, bias, shape, want_mag=True)
        n = A3.shape[2] + (bias is not None)
        if name == "matmul":
            own = (("row",) if len(p.ops["a"].shape) > 1 else ()) + (("col",) if len(p.ops["b"].shape) > 1 else ())
        else:
            own = ("out_feature",) if len(p.ops["weight"].shape) == 2 else ()
        lead = "batch" if name == "matmul" else "dim"
        axes = tuple(f"{lead}{i}" for i in range(len(shape) - len(own))) + own
        return Evaluation(values, mag, n, p.out, shape, axes, bias is not None, _in_prec(p, names))
    nd = 1 if name == "conv1d" else 2
    p = plan(name, {"x": a["x"], "weight": a["weight"], "bias": a["bias"]}, ("x", "weight"), "exact", None, out=out)
    _emulated(p, ("x", "weight"), emulate)
    c = conv.conv_operands(p, nd, a["stride"], a["padding"], a["dilation"], a["groups"], a["padding_mode"])
    values, mag = conv.run_conv(p, c, want_mag=True)
    n = int(np.prod(c.W.shape[1:])) + (c.bias is not None)
    spatial = ("position",) if nd == 1 else ("row", "col")
    axes = (("batch",) if not c.unbatched else ()) + ("channel",) + spatial
    return Evaluation(values, mag, n, p.out, values.shape, axes, c.bias is not None, _in_prec(p, ("x", "weight")))
