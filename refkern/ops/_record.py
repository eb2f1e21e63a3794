"""The record of one op (:class:`Op`), the torch callables it stands for (:class:`Call`) and the words
its fields take. :mod:`refkern.ops` and its records (:mod:`refkern.ops._records`) both import this
module, which imports neither of them."""

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Op", "Call", "Backward", "ERROR_MODELS", "JUDGES", "SAMPLE_KINDS", "HYPOTHESES", "REFKERN_ONLY",
           "POOL_KINDS", "resolve_path"]  # fmt: skip

#: error models: "sum", one rounded sum of products per output element (the products and
#: convolutions: :mod:`refkern.analysis.evaluate`, the statistical verdict of
#: :mod:`refkern.analysis.verdict`); "envelope", an op that is more than one sum (a mean, a norm, a
#: softmax): worst-case envelopes (:mod:`refkern.analysis.envelope`) with the inside test; "elementwise",
#: one function per element, judged against its math library's documented accuracy
#: (:mod:`refkern.analysis.elementwise`); "loss", a composition (log_softmax, then weighted sums and a
#: division) judged by the envelope of torch's composition (:mod:`refkern.analysis.losses`); "gather", values
#: selected, judged bit for bit (embedding's lookup: :mod:`refkern.analysis.embedding`)
ERROR_MODELS = ("sum", "envelope", "elementwise", "loss", "gather")

#: the error models whose calls :func:`refkern.compare` hands whole to their own judge, as ``"module:function"``
#: paths (imported when first asked for), each called as ``judge(actual, name, args, kwargs, rtol, atol, arrays)``
#: and returning (Report, the per-element arrays or None: :func:`refkern.analysis.compare.elements` asks for
#: them with ``arrays``); "sum" and "envelope" are compare's own (the statistical verdict, the envelopes). A new
#: error model is its entry here and its judging module.
JUDGES = {"elementwise": "refkern.analysis.elementwise:compare_call", "loss": "refkern.analysis.losses:compare_call",
          "gather": "refkern.analysis.embedding:compare_call"}  # fmt: skip

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

#: what a pool (family "pool", :attr:`Op.pool`) computes over each window of its ``Op.spatial`` trailing
#: dimensions: "avg", the mean of a window of ``kernel_size`` taps (``stride``, ``padding``, ``ceil_mode``,
#: ``count_include_pad``, ``divisor_override``); "max", its maximum (with ``dilation``; the first of equal maxima);
#: "adaptive_avg", the mean of output i's window ``[floor(i L / O), ceil((i + 1) L / O))`` along each pooled
#: dimension of length L for ``output_size`` O
POOL_KINDS = ("avg", "max", "adaptive_avg")


@dataclass(frozen=True)
class Call:
    """A torch callable an op stands for: ``path`` its dotted name (``"torch.Tensor.sum"``), ``params``
    torch's positional parameter names where its arguments are refkern's op's own (bound by name and
    renamed; None where the adapter reads them itself: the products and convolutions), ``torch_name``
    the name the audit reports where it differs from the op's (``"mm"`` for matmul), ``fixed`` the arguments the
    callable gives refkern's op besides its own."""

    path: str
    params: tuple | None = None
    torch_name: str | None = None
    #: (argument, value) pairs the callable fixes, given to refkern's op with the call's own arguments
    #: (``F.max_pool2d_with_indices`` is ``F.max_pool2d`` with ``return_indices=True``)
    fixed: tuple = ()


@dataclass(frozen=True)
class Backward:
    """Where an op's backward lives, as ``"module:function"`` paths (imported when first asked for), each
    called with the op's name and its call bound by :func:`refkern.ops._bind.bind` (``bound``):

    * ``rule``: the kernel side, ``rule(name, grad_output, bound, wrt, who) -> {argument: Adjoint}``
      (:class:`refkern.kernels._grad.Adjoint`: the exact gradient, computed or as an adjoint call), read by
      :func:`refkern.backward` and :func:`refkern.compare_backward`;
    * ``truth``: the ground truth, ``truth(name, grad_output, bound, wrt, precision) -> {argument: gradient}``,
      read by :func:`refkern.truth.backward`;
    * ``judge``: the judging of one gradient, ``judge(name, argument, adjoint, got, grad_output, bound, who,
      rtol, atol) -> Report``, read by :func:`refkern.compare_backward`;
    * ``audit``: the torch adapter's reading of the op's aten backward kernels (``Op.aten_backward``),
      ``audit(kernel, b, memo, present, name) -> BackwardCall`` (:mod:`refkern.torch.dispatch_backward`);
      None where the op has no aten backward kernel (autograd composes its gradient of other ops);
    * ``broadcast``: the exact gradient of a differentiable operand broadcast against the others (autograd's
      ``sum_to`` of the elementwise gradients), ``broadcast(grad_output, bound, argument, who) -> gradient``, read
      by :func:`refkern.backward` for the operands whose shape is not the result's (the truth's ``truth`` takes
      them itself); None where the rule takes every operand (pow's: :mod:`refkern.kernels.pow_backward`)."""

    rule: str
    truth: str
    judge: str
    audit: str | None = None
    broadcast: str | None = None


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
    aten_unjudged: tuple = ()  # (label, why): its aten ops' outputs after the first, which no reference reproduces
    autograd: tuple = ()  # (autograd node name, the forward arguments its inputs are, in order)
    sample: str | None = None  # one of SAMPLE_KINDS, or None
    #: the torch.nn module classes (dotted paths) whose forward is this op's first call (``calls[0]``, which names
    #: its parameters) on the input, each of the call's other arguments the module's attribute of the same name
    #: (``nn.AvgPool2d``: ``F.avg_pool2d(input, self.kernel_size, self.stride, ...)``), read by
    #: :func:`refkern.torch.ops.from_module`
    modules: tuple = ()
    #: a pool's kind (one of :data:`POOL_KINDS`; None for the other families), read where a pool's geometry is
    #: built (its backward rule, its envelope, the audit's reading of its aten backward kernel)
    pool: str | None = None
    #: the trailing dimensions a pool's windows or a convolution's kernel slide over (avg_pool3d: 3; 0 for the
    #: other families): an input has them after its (N, C) or (C) dimensions
    spatial: int = 0
    needs: str | None = None  # "dim=-1": an argument a command line must give, with an example
    sweep: bool = False  # ``refkern sweep`` draws it against the reduction length
    opinfo: tuple = ()  # names in torch's OpInfo database (op_db)
    #: torch computes integer and bool inputs in its default float dtype (TensorIterator's
    #: ``promote_integer_inputs_to_float``: ``torch.exp`` of int64 is float32); else integer inputs give an integer
    #: result (a sum, a product: integer arithmetic) unless a floating ``dtype=`` converts them first
    promotes_integers: bool = False
    #: the exact integer kernel (``"module:function"``) where torch's integer arithmetic is not the float64
    #: reference read back (:mod:`refkern.analysis.integers`): a product's sums beyond 2**53 (modulo 2**64),
    #: avg_pool's truncating division; called with the op's integer arguments, it returns int64 values whose
    #: residues modulo 2**bits are torch's result. None: the float64 reference, exact below 2**53
    integer_reference: str | None = None
    backward: Backward | None = None  # where its backward lives: with the differentiable arguments, always

    @property
    def reference(self):
        """The reference function (``refkern.conv2d``)."""
        return resolve_path(self.reference_path)

    @property
    def truth(self):
        """The ground-truth function (``refkern.truth.conv2d``); imports mpmath."""
        return resolve_path(self.truth_path)

    @property
    def judge(self):
        """The function :func:`refkern.compare` hands this op's calls to (:data:`JUDGES`), or None where compare
        judges them itself (the error models "sum" and "envelope")."""
        path = JUDGES.get(self.error_model)
        return None if path is None else resolve_path(path)

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
