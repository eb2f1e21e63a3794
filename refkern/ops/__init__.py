"""One record per op, read by everything that names an op.

A record (:class:`Op`) says what refkern knows of an op: its name (torch's), the reference and the
ground truth (as ``"module:function"`` paths, imported when first asked for: reading the registry
imports no kernel, no torch and no mpmath), its tensor operands, the error model its verdict uses,
the hypotheses that verdict may weigh besides a correct rounding, its differentiable arguments (those
:func:`refkern.backward` and :func:`refkern.truth.backward` give gradients for) and where their
backward lives (:class:`Backward`: the rule, its truth, its judging, the audit's reading of the aten
backward kernels, which :mod:`refkern.gradients`, :mod:`refkern.truth.backward`,
:mod:`refkern.analysis.gradients` and :mod:`refkern.torch.dispatch_backward` look up here), the
torch callables and aten ops it stands for, how the audit's ``sample=`` shrinks it, the example a
command line needs, and its OpInfo names. ``compare``, ``check``, the audit's dispatch, ``sample=``,
the command line's choices, the tests' parametrisation and the benchmarks iterate over
:data:`REGISTRY`; an op is added by adding its record (:mod:`refkern.ops._records`) and its kernel.

``ops.get("conv2d").operands`` is ``('x', 'weight', 'bias')``; an unknown name gets one error that lists
the valid names (``ops: unknown op='conv2'; choose one of 'dot', 'matmul', ... Did you mean 'conv2d'?``).
"""

from refkern.ops._record import (
    ERROR_MODELS,
    HYPOTHESES,
    JUDGES,
    POOL_KINDS,
    REFKERN_ONLY,
    SAMPLE_KINDS,
    Backward,
    Call,
    Op,
    resolve_path,
)
from refkern.ops._records import RECORDS
from refkern.ops._records_elementwise import RECORDS as _ELEMENTWISE
from refkern.ops._records_embedding import RECORDS as _EMBEDDING
from refkern.ops._records_losses import RECORDS as _LOSSES

__all__ = ["Op", "Call", "Backward", "REGISTRY", "names", "get", "lookup", "conv_op", "resolve_path", "ERROR_MODELS",
           "JUDGES", "SAMPLE_KINDS", "HYPOTHESES", "REFKERN_ONLY", "POOL_KINDS"]  # fmt: skip

#: the families of the convolutions (their kernel slides over ``Op.spatial`` trailing dimensions) and of the
#: transposed convolutions, one record per (family, spatial) (:func:`conv_op`)
_CONV_FAMILIES = ("conv", "conv_transpose")


def _build():
    reg, nodes, kernels = {}, {}, {}
    for r in RECORDS + _ELEMENTWISE + _LOSSES + _EMBEDDING:
        if r.name in reg:
            raise RuntimeError(f"ops: two records for {r.name!r}")
        bad = [h for h in r.hypotheses if h not in HYPOTHESES]
        if r.error_model not in ERROR_MODELS or bad or (r.sample is not None and r.sample not in SAMPLE_KINDS):
            raise RuntimeError(f"ops: record {r.name!r} has an unknown error model, hypothesis or sample kind")
        if any(a not in r.aten for a, _ in r.aten_memo) or any(k not in r.aten_backward for k, _ in r.backward_outputs):
            raise RuntimeError(f"ops: record {r.name!r} keeps a memo or outputs of an aten op it does not list")
        if bool(r.differentiable) != (r.backward is not None) or (r.aten_backward and not r.backward.audit):
            raise RuntimeError(f"ops: record {r.name!r} has differentiable arguments without a backward (or the "
                               "reverse), or aten backward kernels without the audit's reading of them")  # fmt: skip
        if (r.family == "pool") != (r.pool in POOL_KINDS) or (r.family == "pool" and r.spatial < 1):
            raise RuntimeError(f"ops: record {r.name!r}: a pool needs its kind (one of POOL_KINDS) and its pooled "
                               "dimensions (spatial), and only a pool has a kind")  # fmt: skip
        if r.spatial < (r.family in _CONV_FAMILIES) or (r.spatial and r.family not in (*_CONV_FAMILIES, "pool")):
            raise RuntimeError(f"ops: record {r.name!r}: a convolution needs the dimensions its kernel slides over "
                               "(spatial), and only a convolution or a pool has them")  # fmt: skip
        if r.family in _CONV_FAMILIES and any((o.family, o.spatial) == (r.family, r.spatial) for o in reg.values()):
            raise RuntimeError(f"ops: two {r.family} records over {r.spatial} dimensions")
        if r.modules and (not r.calls or r.calls[0].params is None):
            raise RuntimeError(f"ops: record {r.name!r} names torch.nn modules without its first call's parameters")
        for node, edges in r.autograd:  # a node several ops share (ConvolutionBackward0) has one order
            if nodes.setdefault(node, edges) != edges:
                raise RuntimeError(f"ops: two orders of the inputs of autograd node {node}")
        for k in r.aten_backward:  # an aten backward kernel several ops share (convolution_backward): one reading
            if kernels.setdefault(k, r.backward.audit) != r.backward.audit:
                raise RuntimeError(f"ops: two readings of aten backward kernel {k}")
        reg[r.name] = r
    return reg


#: op name -> :class:`Op`, in a fixed order: the products and convolutions, then the others
REGISTRY = _build()


#: (transposed, spatial dimensions) -> the record of that convolution (family "conv_transpose" or "conv")
_CONVS = {(r.family == "conv_transpose", r.spatial): r for r in REGISTRY.values() if r.family in _CONV_FAMILIES}


def conv_op(transposed: bool, nd: int) -> Op | None:
    """The record of the convolution (``transposed=False``, family "conv") or transposed convolution (family
    "conv_transpose") whose kernel slides over ``nd`` trailing dimensions (its ``Op.spatial``): ``conv_op(True,
    2).name`` is ``"conv_transpose2d"``. None where none is registered (a 4-d convolution). Read where a
    convolution's gradient is another convolution, or where torch gives a convolution by its weight's
    dimensions (aten's ``convolution_backward``, an ``nn.Conv3d``), instead of writing its name."""
    return _CONVS.get((bool(transposed), nd))


def names(*, error_model: str | None = None, family: str | None = None, backward: bool | None = None) -> tuple:
    """The registered op names (those of one error model or family; with ``backward=True``, those with a
    backward), in registry order."""
    return tuple(n for n, r in REGISTRY.items() if (error_model is None or r.error_model == error_model)
                 and (family is None or r.family == family)
                 and (backward is None or (r.backward is not None) == backward))  # fmt: skip


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
