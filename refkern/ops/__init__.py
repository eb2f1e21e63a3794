"""One record per op, read by everything that names an op.

A record (:class:`Op`) says what refkern knows of an op: its name (torch's), the reference and the
ground truth (as ``"module:function"`` paths, imported when first asked for: reading the registry
imports no kernel, no torch and no mpmath), its tensor operands, the error model its verdict uses,
the hypotheses that verdict may weigh besides a correct rounding, its differentiable arguments (those
:func:`refkern.backward` and :func:`refkern.truth.backward` give gradients for), the
torch callables and aten ops it stands for, how the audit's ``sample=`` shrinks it, the example a
command line needs, and its OpInfo names. ``compare``, ``check``, the audit's dispatch, ``sample=``,
the command line's choices, the tests' parametrisation and the benchmarks iterate over
:data:`REGISTRY`; an op is added by adding its record (:mod:`refkern.ops._records`) and its kernel.

``ops.get("conv2d").operands`` is ``('x', 'weight', 'bias')``; an unknown name gets one error that lists
the valid names (``ops: unknown op='conv2'; choose one of 'dot', 'matmul', ... Did you mean 'conv2d'?``).
"""

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Op", "Call", "REGISTRY", "names", "get", "lookup", "resolve_path"]

#: error models: "sum", one rounded sum of products per output element (the products and
#: convolutions: :mod:`refkern.analysis.evaluate`, the statistical verdict of
#: :mod:`refkern.analysis.verdict`); "envelope", an op that is more than one sum (a mean, a norm, a
#: softmax): worst-case envelopes (:mod:`refkern.analysis.envelope`) with the inside test
ERROR_MODELS = ("sum", "envelope")

#: how the audit's ``sample=`` shrinks a call (:mod:`refkern.torch.sample`); None: judged whole
SAMPLE_KINDS = ("linear", "matmul", "conv", "rows", "batch_norm")

#: the hypotheses a verdict may weigh besides a correct rounding and the inputs rounded to a narrower
#: format (which every op has):
#: "tf32": tf32 inputs (three rounding modes); "autocast": fp16/bf16 inputs, bias and output under
#: an fp32 result; "accumulators": fp16/bf16 (and fp32 under float64) accumulation, left-to-right or
#: pairwise; "epilogue": the product sum rounded to a half result before the bias is added; "taps":
#: per-tap sums in the result format (torch's col2im); "one-pass variance": E[x^2] - E[x]^2, only to
#: name a mismatch; "stored output": a float32 result stored in fp16/bf16 on the way; "P@V": attention's
#: weights rounded to fp16/bf16 before the product with V; "named bugs": mismatches with a name (no
#: maximum subtracted, log of a softmax, a mask or scale dropped)
HYPOTHESES = ("tf32", "autocast", "accumulators", "epilogue", "taps", "one-pass variance", "stored output", "P@V",
              "named bugs")  # fmt: skip


@dataclass(frozen=True)
class Call:
    """A torch callable an op stands for: ``path`` its dotted name (``"torch.Tensor.sum"``), ``params``
    torch's positional parameter names where its arguments are refkern's op's own (bound by name and
    renamed; None where the adapter reads them itself: the products and convolutions), ``torch_name``
    the name the audit reports where it differs from the op's (``"mm"`` for matmul)."""

    path: str
    params: tuple | None = None
    torch_name: str | None = None


@dataclass(frozen=True)
class Op:
    """What refkern knows of one op (module docstring); built only in :mod:`refkern.ops._records`."""

    name: str
    family: str  # "product", "conv", "conv_transpose", "reduction", "norm", "pool", "softmax", "attention"
    reference_path: str  # "refkern.kernels.conv:conv2d"
    truth_path: str  # "refkern.truth.products:conv2d"
    operands: tuple  # the tensor operands, in order (a command line's shapes, a file's arrays)
    error_model: str  # one of ERROR_MODELS
    required: int = 1  # how many operands a call needs (the rest are optional: bias, weight, mask)
    positional: bool = False  # every operand positional (torch's order); else the tensors after the first by name
    hypotheses: tuple = ()  # subset of HYPOTHESES
    differentiable: tuple = ()  # the arguments refkern.backward gives gradients for
    torch_function: str = ""  # the torch callable computing it with refkern's arguments
    calls: tuple = ()  # Call records: the torch callables it stands for
    aten: tuple = ()  # aten ops (overload packets) whose outputs it reproduces
    aten_backward: tuple = ()  # aten backward kernels whose gradients refkern.compare_backward judges
    backward_outputs: tuple = ()  # (kernel, its outputs' argument names): where not the differentiable ones
    aten_memo: tuple = ()  # (forward aten op, what its backward needs kept: "eps" or "input")
    autograd: tuple = ()  # (autograd node name, the forward arguments its inputs are, in order)
    sample: str | None = None  # one of SAMPLE_KINDS, or None
    needs: str | None = None  # "dim=-1": an argument a command line must give, with an example
    sweep: bool = False  # ``refkern sweep`` draws it against the reduction length
    opinfo: tuple = ()  # names in torch's OpInfo database (op_db)

    @property
    def reference(self):
        """The reference function (``refkern.conv2d``)."""
        return resolve_path(self.reference_path)

    @property
    def truth(self):
        """The ground-truth function (``refkern.truth.conv2d``); imports mpmath."""
        return resolve_path(self.truth_path)

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.reference)

    def torch_keywords(self) -> tuple:
        """The arguments of refkern's op that torch's op takes too, besides its first operand (and
        besides every operand of the positional ops). Excluded: the keywords that say how refkern
        computes the reference (``accumulate``, ``accum_dtype``, ``return_running_stats``)."""
        params = list(self.signature.parameters.values())
        if self.positional:
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            return tuple(p.name for p in params if p.kind in kinds and p.name not in self.operands)
        return tuple(p.name for p in params[1:] if p.name not in REFKERN_ONLY)


#: refkern's own keywords (how the reference is computed or what it returns), never torch's
REFKERN_ONLY = ("accumulate", "accum_dtype", "return_running_stats")


def resolve_path(path: str):
    """The object at ``"package.module:attribute"``, or at a dotted name (``"torch.Tensor.sum"``: the
    longest importable prefix, then attributes)."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return getattr(importlib.import_module(module), attr)
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(f"ops: no module in {path!r}")


def _build():
    from refkern.ops._records import RECORDS

    reg, nodes = {}, {}
    for r in RECORDS:
        if r.name in reg:
            raise RuntimeError(f"ops: two records for {r.name!r}")
        bad = [h for h in r.hypotheses if h not in HYPOTHESES]
        if r.error_model not in ERROR_MODELS or bad or (r.sample is not None and r.sample not in SAMPLE_KINDS):
            raise RuntimeError(f"ops: record {r.name!r} has an unknown error model, hypothesis or sample kind")
        if any(a not in r.aten for a, _ in r.aten_memo) or any(k not in r.aten_backward for k, _ in r.backward_outputs):
            raise RuntimeError(f"ops: record {r.name!r} keeps a memo or outputs of an aten op it does not list")
        for node, edges in r.autograd:  # a node several ops share (ConvolutionBackward0) has one order
            if nodes.setdefault(node, edges) != edges:
                raise RuntimeError(f"ops: two orders of the inputs of autograd node {node}")
        reg[r.name] = r
    return reg


#: op name -> :class:`Op`, in a fixed order: the products and convolutions, then the others
REGISTRY = _build()


def names(*, error_model: str | None = None, family: str | None = None) -> tuple:
    """The registered op names (those of one error model or family), in registry order."""
    return tuple(n for n, r in REGISTRY.items() if (error_model is None or r.error_model == error_model)
                 and (family is None or r.family == family))  # fmt: skip


def _unknown(op, who, choices, tail=""):
    import difflib

    near = difflib.get_close_matches(op, choices, n=1) if isinstance(op, str) else []
    hint = f" Did you mean {near[0]!r}?" if near else ""
    listed = ", ".join(repr(o) for o in choices)
    return ValueError(f"{who}: unknown op={op!r}; choose one of {listed}{tail}.{hint}")


def get(name, who: str = "ops") -> Op:
    """The record of op ``name``; a ValueError listing the valid names otherwise."""
    r = REGISTRY.get(name) if isinstance(name, str) else None
    if r is None:
        raise _unknown(name, who, tuple(REGISTRY))
    return r


def lookup(op, who: str, among=None) -> str:
    """The name of ``op``, given by name or as the reference function itself (``refkern.conv2d``),
    among the names ``among`` (default: every registered op); otherwise one ValueError, starting with
    ``who``, that lists the valid names."""
    among = tuple(REGISTRY) if among is None else tuple(among)
    if isinstance(op, str):
        if op in among:
            return op
    elif callable(op):
        for name in among:
            if REGISTRY[name].reference is op:
                return name
    raise _unknown(op, who, among, " (or the refkern function itself)") from None
