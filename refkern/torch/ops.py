"""Which refkern op a torch call computes, and with which arguments.

The registry (:mod:`refkern.ops`: each op's torch callables and signature) serves ``check`` (a
function or module), ``audit`` and ``reference_mode`` (every call a model makes). A call that
cannot be expressed exactly (attention with dropout, a sum of integers) is reported as unsupported,
never approximated. Integer and bool inputs of a floating result are converted first, as torch converts
them (:func:`_integers_to`, :func:`_pow`). ``addmm``/``baddbmm`` with any ``alpha``, ``beta`` and input are
one exact sum of products per element (:func:`_addmm`); of integers, one product modulo ``2**64``, judged to the
bit (:mod:`refkern.kernels.integer_gemm`).
"""

import math

import torch
import torch.nn.functional as F

import refkern.ops as _ops
from refkern.kernels._grad import Adjoint

__all__ = ["OpCall", "from_call", "from_module", "FUNCTIONS", "torch_function", "op_keywords", "check_keywords",
           "COMPOSITES", "composite_body", "operands", "addmm_gradients"]  # fmt: skip

# From the registry (:mod:`refkern.ops`): every torch callable an op stands for -> the name the audit
# reports (the op's, or torch's own where it differs: "mm" for matmul); and the calls whose arguments
# are refkern's op's own, in torch's positional order: callable -> (op, torch's positional parameter
# names). "input" is the op's first operand whatever refkern calls it; "_stacklevel" (F.softmax's) is
# dropped; "unbiased" (var/std's legacy form) becomes correction. The products and convolutions
# (params None) are read by :func:`from_call` itself.
FUNCTIONS = {}
_SAME = {}
_FIXED = {}  # callable -> the arguments it fixes (F.max_pool2d_with_indices: return_indices=True)
for _rec in _ops.REGISTRY.values():
    for _call in _rec.calls:
        _f = _ops.resolve_path(_call.path)
        FUNCTIONS[_f] = _call.torch_name or _rec.name
        if _call.params is not None:
            _SAME[_f] = (_rec.name, _call.params)
        if _call.fixed:
            _FIXED[_f] = dict(_call.fixed)
del _rec, _call, _f

# torch.nn module class -> (op, the first call's parameters after the input: the module's attributes of those names)
_MODULES = {_ops.resolve_path(m): (_rec.name, _rec.calls[0].params[1:]) for _rec in _ops.REGISTRY.values()
            for m in _rec.modules}  # fmt: skip

# Functions made of several audited calls (projections, attention): audit and reference_mode run
# their bodies with the mode still active (see :func:`composite_body`), so each call inside is
# judged or replaced on its own.
COMPOSITES = (F.multi_head_attention_forward,)
_BODIES = {}


def composite_body(func):
    """``func`` (one of COMPOSITES) without its entry check for torch-function overrides.

    A Python function of torch.nn.functional first asks ``has_torch_function`` and, while any
    function mode is active, hands the whole call to that mode; a mode that wants the calls made
    *inside* it must run the body with the mode active, and the check would hand it back forever.
    The body is the same code object with ``has_torch_function`` answering False in its globals
    (only the entry check reads it: the calls inside still reach the mode)."""
    import types

    body = _BODIES.get(func)
    if body is None:
        glb = dict(func.__globals__, has_torch_function=lambda *a: False)
        body = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
        _BODIES[func] = body
    return body


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class OpCall:
    """A refkern op and the arguments that reproduce a torch call (``unsupported`` says why not)."""

    def __init__(self, torch_name, op=None, args=(), kwargs=None, unsupported=None, shown=None, dtype=None,
                 scaled=None):  # fmt: skip
        self.torch_name = torch_name
        self.op = op
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.unsupported = unsupported
        # where refkern's arguments are not the call's own tensors (addmm's exact form, float64 operands on
        # the CPU): the call's tensors (their shapes, dtypes and device are reported), and its result dtype
        self.shown = None if shown is None else tuple(shown)
        self.dtype = dtype
        # addmm / baddbmm: (input, mat1, mat2, beta, alpha, their names) as torch got them: gradient_calls reads them
        self.scaled = scaled

    def gradient_names(self) -> list:
        """``[(tensor, argument)]``: the tensors :meth:`gradient_calls` gives gradients of, with torch's names for
        them (input, mat1, mat2; baddbmm's batch1, batch2), before any grad_output exists; empty for other calls."""
        if self.scaled is None:
            return []
        return [(t, n) for t, n in zip(self.scaled[:3], self.scaled[5]) if isinstance(t, torch.Tensor)
                and t.is_floating_point()]  # fmt: skip

    def gradient_calls(self, grad_output) -> list:
        """``[(tensor, argument, Adjoint)]``: for a call whose tensors reach refkern's op transformed (addmm's and
        baddbmm's: :func:`_addmm`), each floating tensor of the call with the forward call whose exact result is
        its gradient for ``grad_output`` (:func:`addmm_gradients`); empty for every other call, whose gradients
        :func:`refkern.compare_backward` judges on the op's own arguments."""
        if self.scaled is None:
            return []
        return addmm_gradients(grad_output, *self.scaled)

    def tensors(self):
        """The call's tensors, as the user gave them."""
        given = self.shown if self.shown is not None else (*self.args, *self.kwargs.values())
        return [a for a in given if isinstance(a, torch.Tensor)]

    def on_cpu(self, copy=False):
        """The same call with every tensor detached and copied to the CPU (lossless); with ``copy``,
        never sharing memory with the given tensors (a CPU tensor is cloned)."""

        def cpu(a):
            return a.detach().to("cpu", copy=copy) if isinstance(a, torch.Tensor) else a

        return tuple(cpu(a) for a in self.args), {k: cpu(v) for k, v in self.kwargs.items()}


def _get(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def from_call(func, args, kwargs) -> OpCall | None:
    """The OpCall of a torch function call, or None when ``func`` is not one refkern audits."""
    name = FUNCTIONS.get(func)
    if name is None:
        return None
    kwargs = kwargs or {}
    if func in _SAME:
        return _same(func, args, kwargs)
    family = _ops.REGISTRY[name].family if name in _ops.REGISTRY else None
    if family in ("conv", "conv_transpose"):
        keys = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        if family == "conv_transpose":  # F.conv_transpose{n}d's own order
            keys = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
        vals = {k: _get(args, kwargs, i, k) for i, k in enumerate(keys)}
        ref = {k: v for k, v in vals.items() if v is not None and k not in ("input", "weight", "bias")}
        return OpCall(name, name, (vals["input"], vals["weight"], vals["bias"]), ref)
    if name == "linear":
        return OpCall(name, "linear", (_get(args, kwargs, 0, "input"), _get(args, kwargs, 1, "weight"),
                                       _get(args, kwargs, 2, "bias")))  # fmt: skip
    if name in ("matmul", "mm", "bmm", "mv"):  # torch.mv(input, vec): matmul of a matrix and a vector
        other = _get(args, kwargs, 1, "other", _get(args, kwargs, 1, "mat2", _get(args, kwargs, 1, "vec")))
        return OpCall(name, "matmul", (_get(args, kwargs, 0, "input"), other))
    # addmm(input, mat1, mat2, beta=1, alpha=1) = beta * input + alpha * mat1 @ mat2 (baddbmm: batched)
    inp, m1 = _get(args, kwargs, 0, "input"), _get(args, kwargs, 1, "mat1", _get(args, kwargs, 1, "batch1"))
    m2 = _get(args, kwargs, 2, "mat2", _get(args, kwargs, 2, "batch2"))
    return _addmm(name, inp, m1, m2, kwargs.get("beta", 1), kwargs.get("alpha", 1))


def _addmm(name, inp, m1, m2, beta, alpha) -> OpCall:
    """addmm / baddbmm as refkern computes them: ``mat1 @ mat2`` (beta = 0, alpha = 1), ``linear`` with a
    bias per column (beta = alpha = 1, an input that broadcasts along the rows), and otherwise the exact
    form, one sum of products per element: ``[alpha mat1 | beta input] @ [mat2 ; I]`` (the identity's
    zeros are exact terms) in float64 on the CPU, rounded once to the result dtype. alpha and beta are
    first converted to the opmath type torch's kernels pass to their GEMMs (float32 for half and float32
    tensors, float64 for float64); their products with a float32 (or narrower) operand are exact in
    float64, with a float64 operand they are split into two float64 terms (Dekker's TwoProduct). beta = 0
    ignores the input and alpha = 0 the product, as torch does (a NaN there does not propagate). The
    exact form adds n terms (the input's) to each element's K products."""
    tensors = [t for t in (inp, m1, m2) if isinstance(t, torch.Tensor)]
    if len(tensors) == 3 and all(_integral(t) and t.dtype != torch.bool for t in tensors):
        # integer arithmetic, judged to the bit: [alpha mat1 | beta input] @ [mat2 ; I] modulo 2**64, alpha and
        # beta as torch converts them (refkern.kernels.integer_gemm)
        from refkern.kernels.integer_gemm import addmm_operands

        try:
            left, right = addmm_operands(name, inp, m1, m2, beta, alpha)
        except (TypeError, ValueError) as exc:
            return OpCall(name, unsupported=str(exc))
        return OpCall(name, "matmul", (left, right), shown=(inp, m1, m2), dtype=m1.dtype)
    if len(tensors) < 3 or any(t.dtype not in _FLOATS for t in tensors) or len({t.dtype for t in tensors}) > 1:
        got = ", ".join(str(getattr(t, "dtype", type(t).__name__)).removeprefix("torch.") for t in (inp, m1, m2))
        return OpCall(name, unsupported=f"{name} of {got} (refkern takes three tensors of one floating dtype)")
    scaled = (inp, m1, m2, beta, alpha, ("input", "mat1", "mat2") if name == "addmm" else ("input", "batch1", "batch2"))
    if beta == 0 and alpha == 1:
        return OpCall(name, "matmul", (m1, m2), scaled=scaled)
    n = m2.shape[-1]
    if name == "addmm" and beta == 1 and alpha == 1 and tuple(inp.shape) in ((), (1,), (n,), (1, 1), (1, n)):
        bias = inp.reshape(-1).expand(n).contiguous()  # broadcasts along the rows: a bias per column
        # mat1 @ mat2 + bias, bias a term
        return OpCall(name, "linear", (m1, m2.transpose(0, 1), bias), scaled=scaled)
    wide = m1.dtype == torch.float64
    blocks, rows = [], []  # the left operand's column blocks, the right operand's matching row blocks
    a64, b64 = m1.detach().to("cpu", torch.float64), m2.detach().to("cpu", torch.float64)
    out_shape = (*a64.shape[:-1], n)
    eye = torch.eye(n, dtype=torch.float64).expand(*out_shape[:-2], n, n)
    for scale, left, right in ((alpha, a64, b64), (beta, None, eye)):
        if scale == 0:
            continue
        if left is None:
            try:
                left = inp.detach().to("cpu", torch.float64).expand(out_shape)
            except RuntimeError:
                return OpCall(name, unsupported=f"{name} with input of shape {tuple(inp.shape)}, which does not "
                              f"broadcast to the result's {out_shape}")  # fmt: skip
        s = _opmath(scale, m1.dtype)
        pair = _times(left, s, wide)
        if pair is None:
            return OpCall(name, unsupported=f"{name} with alpha={alpha}, beta={beta}: a product with a float64 "
                          "operand beyond 2**995 or below 2**-969, whose error term float64 cannot hold")  # fmt: skip
        for part in pair:
            blocks.append(part)
            rows.append(right)
    if not blocks:  # alpha = beta = 0: every element is +0, the empty sum
        blocks, rows = [a64[..., :0]], [b64[..., :0, :]]
    left, right = torch.cat(blocks, -1).contiguous(), torch.cat(rows, -2).contiguous()
    return OpCall(name, "matmul", (left, right), shown=(inp, m1, m2), dtype=m1.dtype, scaled=scaled)


def _opmath(scale, dtype):
    """``scale`` as torch's kernels take it: converted to the opmath type (float64 for float64 tensors, float32
    for float32 and half ones), the value every product with it starts from."""
    return float(torch.tensor(float(scale), dtype=torch.float64 if dtype == torch.float64 else torch.float32))


def addmm_gradients(g, inp, mat1, mat2, beta, alpha, names=("input", "mat1", "mat2")) -> list:
    """``[(tensor, argument, Adjoint)]``: the gradients of ``addmm(input, mat1, mat2, beta=, alpha=)`` (baddbmm's
    batched alike, ``names`` its arguments' own: batch1, batch2) for ``grad_output`` ``g``, each as one forward
    ``matmul`` whose exact result, rounded once,
    is the exact gradient (the floating tensors among input, mat1, mat2):

    * mat1: ``alpha (g @ mat2^T)``, mat2: ``alpha (mat1^T @ g)``: ``alpha g`` (alpha in the opmath type) is
      one operand, exact in float64 for float32 and narrower g (24 + 24 bits), Dekker's two terms for float64
      (:func:`_times`: the operand's columns, or rows, twice); with alpha = 1 the call is matmul's own adjoint
      call, on the tensors' own dtype;
    * input: ``beta g`` summed over the dimensions the input was broadcast along (autograd's ``sum_to``): a
      matmul of ``beta g``, one row per input element and one column per element summed into it, with a
      vector of ones. For half g each ``beta g`` is two terms, torch's opmath product ``fl32(beta g)`` and its
      error (exact in float64): the sum is still exact, and the verdict's half-inputs model, which rounds each
      term once, then rounds ``fl32(beta g)`` as torch's kernel does (``fl16(fl32(beta g))``, stored before
      the sum; the rounded error terms add at most ``2**-24 sum |beta g|``). With one term the model would
      round ``beta g`` once, and miss torch's double rounding: one ulp of a term where it allows half of one
      (measured: 3 of 32 fp16/bf16 input gradients of 64-term sums, beta = 3.3, a mismatch of one element).

    torch computes ``fl(fl(g @ mat2^T) alpha)`` (derivatives.yaml's maybe_multiply: the product rounded to the
    result format, then the scale, rounded once more), and ``sum_to(fl(beta g))``; a judge of these calls
    weighs that (docs/backward.md). None where a float64 product cannot be split exactly (_times)."""
    wide = mat1.dtype == torch.float64
    gd = g.detach().to("cpu")
    a1, a2 = mat1.detach().to("cpu"), mat2.detach().to("cpu")
    out = []

    def scaled(t, s, axis, opmath=False):  # s t as float64 terms along axis; how many copies of the other side
        if s == 1.0:
            return t, 1
        parts = _times(t.to(torch.float64), s, wide)
        if parts is None:
            return None, 0
        if opmath and len(parts) == 1 and t.dtype in (torch.float16, torch.bfloat16):
            hi = parts[0].to(torch.float32).to(torch.float64)  # torch's opmath product fl32(s t), then its error:
            parts = (hi, parts[0] - hi)  # exact in float64 (s t holds 24 + 11 bits), the sum still s t exactly
        return torch.cat(parts, axis), len(parts)

    sa = _opmath(alpha, mat1.dtype)
    if mat1.is_floating_point():
        left, copies = scaled(gd, sa, -1)
        right = a2.transpose(-1, -2)
        if left is not None:
            right = torch.cat([right.to(left.dtype)] * copies, -2)
            out.append((mat1, names[1], Adjoint(names[1], "matmul", (left.contiguous(), right.contiguous()))))
    if mat2.is_floating_point():
        right, copies = scaled(gd, sa, -2)
        left = a1.transpose(-1, -2)
        if right is not None:
            left = torch.cat([left.to(right.dtype)] * copies, -1)
            out.append((mat2, names[2], Adjoint(names[2], "matmul", (left.contiguous(), right.contiguous()))))
    if isinstance(inp, torch.Tensor) and inp.is_floating_point():
        shape = tuple(gd.shape)
        own = (1,) * (len(shape) - inp.dim()) + tuple(inp.shape)
        kept = [i for i in range(len(shape)) if own[i] == shape[i]]
        red = [i for i in range(len(shape)) if i not in kept]
        rows = math.prod(own[i] for i in kept)
        terms = gd.permute(*kept, *red).reshape(rows, math.prod(shape[i] for i in red))
        left, copies = scaled(terms, _opmath(beta, mat1.dtype), -1, opmath=True)
        if left is not None:
            ones = torch.ones(left.shape[-1], dtype=left.dtype)
            out.append((inp, names[0], Adjoint(names[0], "matmul", (left.contiguous(), ones),
                                              from_grad=lambda got, rows=rows: got.reshape(rows))))  # fmt: skip
    return out


def _times(a, s, split):
    """The float64 terms whose sum is ``s * a`` exactly: ``(s * a,)`` where float64 holds the product
    (``split`` False: ``s`` a float32 value and ``a`` float32 or narrower, 24 + 24 bits; or ``s = +-1``),
    else Dekker's ``(hi, lo)`` of float64 ``a`` and ``s``; None where that split is not exact (an operand
    beyond 2**995 overflows it, a product below 2**-969 loses its error term)."""
    p = a * s
    if not split or s in (1.0, -1.0):
        return (p,)
    finite = torch.isfinite(p)
    big = torch.where(finite, a.abs(), 0).max() if a.numel() else 0
    tiny = ((p != 0) & finite & (p.abs() < 2.0**-969)).any() if a.numel() else False
    if big > 2.0**995 or abs(s) > 2.0**995 or tiny:
        return None
    c = 134217729.0  # 2**27 + 1: Veltkamp's split into two halves of 26 bits
    ah = a * c - (a * c - a)
    al = a - ah
    sh = s * c - (s * c - s)
    sl = s - sh
    lo = ((ah * sh - p) + ah * sl + al * sh) + al * sl
    return p, torch.where(finite, lo, 0.0)


def _same(func, args, kwargs) -> OpCall:
    """The OpCall of a call in ``_SAME``: torch's arguments bound by name, renamed to refkern's."""
    op, names = _SAME[func]
    torch_name = getattr(func, "__name__", op)
    if len(args) > len(names):
        return OpCall(torch_name, unsupported=f"{torch_name} with {len(args)} positional arguments (a form refkern "
                      "does not know)")  # fmt: skip
    vals = dict(zip(names, args))
    for k, v in kwargs.items():
        vals["dim" if k == "axis" else k] = v
    vals.pop("_stacklevel", None)
    vals.pop("inplace", None)  # F.silu's: where the result goes, not what it is
    if op == "pow":
        return _pow(torch_name, vals)
    rec = _ops.get(op)
    first = vals.get("input", vals.get("query"))
    given = [vals.get(k) for k in rec.operands if isinstance(vals.get(k), torch.Tensor)]
    first = next((v for v in given if v.dtype in _FLOATS), first)  # embedding's values are its weight's
    target = _integers_to(rec, vals, first)
    if target is not None:  # integer or bool operands, a floating result: converted first, as torch does
        ours = (names[0], *rec.operands)  # torch's first parameter is refkern's first operand (sum's x)
        vals = {k: v.to(target) if k in ours and _integral(v) else v for k, v in vals.items()}
        first = first.to(target)
    if not isinstance(first, torch.Tensor) or (first.dtype not in _FLOATS and not _integral(first)):
        # (integer operands of an integer result pass: compare judges integer arithmetic to the bit,
        # refkern.analysis.integers)
        got = str(first.dtype if isinstance(first, torch.Tensor) else type(first).__name__).removeprefix("torch.")
        return OpCall(torch_name, unsupported=f"{torch_name} of {got} values (refkern's ops take float16, bfloat16, "
                      "float32 and float64)")  # fmt: skip
    if op in ("var", "std"):
        if isinstance(vals.get("dim"), bool):  # torch.var(x, False): the legacy (input, unbiased) form
            vals["unbiased"] = vals.pop("dim")
        if "unbiased" in vals:
            vals["correction"] = int(bool(vals.pop("unbiased")))
    if op in ("softmax", "log_softmax") and vals.get("dim") is None:  # torch's implicit dim (deprecated)
        vals["dim"] = 0 if first.dim() in (0, 1, 3) else 1
    if op == "dot":  # torch.dot(input, tensor): refkern.dot(x, y), both operands
        y = vals.get("tensor")
        if not isinstance(y, torch.Tensor) or y.dtype != first.dtype or set(vals) != {"input", "tensor"}:
            return OpCall(torch_name, unsupported=f"{torch_name} with arguments other than two tensors of one dtype "
                          "(torch.dot(input, tensor))")  # fmt: skip
        return OpCall(torch_name, op, (vals["input"], y), {})
    vals.update(_FIXED.get(func, {}))
    if op == "scaled_dot_product_attention" and vals.get("dropout_p", 0.0):
        return OpCall(torch_name, unsupported=f"attention with dropout_p={vals['dropout_p']} (a random mask no "
                      "reference can reproduce)")  # fmt: skip
    if _ops.get(op).positional:  # every operand in torch's order (a loss's target and weight, embedding's weight)
        given = [vals.pop(k) for k in _ops.get(op).operands if k in vals]
        while given and given[-1] is None:  # an operand passed as None: the op's default
            given.pop()
        return OpCall(torch_name, op, tuple(given), vals)
    operand = vals.pop(names[0])  # positional: refkern names it x, input or query
    return OpCall(torch_name, op, (operand,), vals)


def _integral(v) -> bool:
    """Whether ``v`` is an integer or bool tensor."""
    return isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex())


def _integers_to(rec, vals, first):
    """The floating dtype torch computes a call of ``rec``'s op in when its operands (``first``, the first floating
    one or else the first) are integer or bool: a floating ``dtype=`` (``softmax(x, dim, dtype=torch.float32)``
    converts the input first), else torch's default dtype where the op promotes integer inputs to float
    (``rec.promotes_integers``: ``torch.exp`` of int64 is float32). None where the operands are floating, or the
    result is an integer (a sum of integers: integer arithmetic). torch converts before it computes, rounding an
    integer beyond the format's 2**p to nearest even as ``Tensor.to`` does, so the converted operands are the
    exact inputs of what torch computes."""
    if not _integral(first):
        return None
    dtype = vals.get("dtype")
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    return torch.get_default_dtype() if rec.promotes_integers else None


def _pow(torch_name, vals) -> OpCall:
    """The OpCall of ``torch.pow(input, exponent)``: a tensor and a tensor or a number, or a number and a tensor
    (``pow.Scalar``). Their dtype is torch's type promotion (``torch.result_type``: a float number with an integer
    tensor gives the default dtype, an integer tensor to an integer power stays an integer); integer and bool
    tensors are converted to it first, as torch's TensorIterator casts them (refkern's pow rounds the floating
    ones, :func:`refkern.kernels.elementwise.pow_operands`). A number exponent stays the keyword it is, taken as
    the float64 value given."""
    x, e = vals.get("input"), vals.get("exponent")
    kinds = (torch.Tensor, int, float)
    extra = sorted(set(vals) - {"input", "exponent"})
    if extra or not all(isinstance(v, kinds) for v in (x, e)) or not any(isinstance(v, torch.Tensor) for v in (x, e)):
        got = ", ".join(f"{k} of type {type(vals.get(k)).__name__}" for k in ("input", "exponent", *extra))
        return OpCall(torch_name, unsupported=f"{torch_name} with {got} (refkern's pow takes a tensor and a tensor or "
                      "number, or a number and a tensor)")  # fmt: skip
    dtype = torch.result_type(x, e)
    if dtype not in _FLOATS and not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
        return OpCall(torch_name, "pow", (x, e), {})  # integers to an integer power: integer arithmetic, to the bit
    if dtype not in _FLOATS:
        return OpCall(torch_name, unsupported=f"{torch_name} of {str(dtype).removeprefix('torch.')} values (refkern's "
                      "ops take float16, bfloat16, float32 and float64)")  # fmt: skip
    x, e = (v.to(dtype) if _integral(v) else v for v in (x, e))
    if isinstance(e, torch.Tensor) or not isinstance(x, torch.Tensor):
        return OpCall(torch_name, "pow", (x, e), {})
    return OpCall(torch_name, "pow", (x,), {"exponent": e})


def from_module(m, x) -> OpCall | None:
    """The OpCall of ``m(x)`` for nn.Linear, nn.Conv1d/2d/3d, nn.ConvTranspose1d/2d/3d (with its own
    ``output_padding``: ``m(x, output_size=...)`` is not this call), nn.LayerNorm, nn.RMSNorm,
    nn.GroupNorm, nn.BatchNorm1d/2d/3d (in the module's mode: batch statistics in training),
    the modules of the registry's records (``Op.modules``: nn.AvgPool1d/2d/3d, nn.MaxPool1d/2d,
    nn.AdaptiveAvgPool1d/2d), nn.Softmax and nn.LogSoftmax.
    nn.MultiheadAttention is several ops: unsupported here, audited call by call."""
    if isinstance(m, torch.nn.Linear):
        return OpCall("Linear", "linear", (x, m.weight, m.bias))
    transposed = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
    if isinstance(m, transposed):
        if m.padding_mode != "zeros":  # as torch: "Only 'zeros' padding mode is supported for ConvTranspose"
            return OpCall(type(m).__name__, unsupported=f"{type(m).__name__} with padding_mode={m.padding_mode!r}")
        nd = len(m.kernel_size)
        kw = dict(stride=m.stride, padding=m.padding, output_padding=m.output_padding, groups=m.groups,
                  dilation=m.dilation)  # fmt: skip
        return OpCall(type(m).__name__, _ops.conv_op(True, nd).name, (x, m.weight, m.bias), kw)
    if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        op = _ops.conv_op(False, len(m.kernel_size)).name
        kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups, padding_mode=m.padding_mode)
        return OpCall(type(m).__name__, op, (x, m.weight, m.bias), kw)
    name = type(m).__name__
    nn = torch.nn
    if isinstance(m, nn.LayerNorm):
        return OpCall(name, "layer_norm", (x,), dict(normalized_shape=m.normalized_shape, weight=m.weight,
                                                     bias=m.bias, eps=m.eps))  # fmt: skip
    if isinstance(m, nn.RMSNorm):
        return OpCall(name, "rms_norm", (x,), dict(normalized_shape=m.normalized_shape, weight=m.weight, eps=m.eps))
    if isinstance(m, nn.GroupNorm):
        return OpCall(name, "group_norm", (x,), dict(num_groups=m.num_groups, weight=m.weight, bias=m.bias,
                                                     eps=m.eps))  # fmt: skip
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        # as _BatchNorm.forward: batch statistics in training, or when no running statistics are kept
        batch_stats = m.training or (m.running_mean is None and m.running_var is None)
        kw = dict(weight=m.weight, bias=m.bias, training=batch_stats, momentum=m.momentum or 0.0, eps=m.eps)
        return OpCall(name, "batch_norm", (x, m.running_mean, m.running_var), kw)
    # the pools: their records' modules (a subclass too), each argument the module's attribute of its name
    known = next((_MODULES[c] for c in type(m).__mro__ if c in _MODULES), None)
    if known is not None:
        op, params = known
        return OpCall(name, op, (x,), {p: getattr(m, p) for p in params})
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        op = "softmax" if isinstance(m, nn.Softmax) else "log_softmax"
        dim = m.dim if m.dim is not None else (0 if x.dim() in (0, 1, 3) else 1)  # torch's implicit dim
        return OpCall(name, op, (x,), dict(dim=dim))
    if isinstance(m, nn.MultiheadAttention):
        return OpCall(name, unsupported="MultiheadAttention is several ops (the projections, then attention); "
                      "audit it to judge each: with refkern.torch.audit() as a: module(q, k, v)")  # fmt: skip
    return None


def _conv_padded(rec):
    """torch's convolution of record ``rec`` (``rec.torch_function``: F.conv1d, F.conv2d or F.conv3d) with every
    argument of refkern's, ``padding_mode`` included: as ``nn.Conv1d/2d/3d`` does, a mode other than "zeros" pads
    the input's ``rec.spatial`` trailing dimensions with ``F.pad`` first."""
    conv, nd = _ops.resolve_path(rec.torch_function), rec.spatial

    def fn(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):  # noqa: A002
        if padding_mode == "zeros":
            return conv(input, weight, bias, stride, padding, dilation, groups)
        ksize = weight.shape[2:]
        dil = _expand(dilation, nd)
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            pads = [((d * (k - 1)) // 2, d * (k - 1) - (d * (k - 1)) // 2) for d, k in zip(dil, ksize)]
        else:
            pads = [(p, p) for p in _expand(padding, nd)]
        flat = [q for lo_hi in reversed(pads) for q in lo_hi]  # F.pad: last dimension first
        return conv(F.pad(input, flat, mode=padding_mode), weight, bias, stride, 0, dilation, groups)

    fn.__name__ = fn.__qualname__ = rec.name
    fn.__doc__ = f"F.{rec.name}, with padding_mode as nn.Conv{nd}d applies it."
    return fn


def _expand(v, nd):
    """An int, or a tuple of 1 or nd ints, as a tuple of nd ints (torch's convolution rule)."""
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    return t * nd if len(t) == 1 else t


# op -> the torch callable computing it with every argument refkern's op takes (the registry's, the
# convolutions with padding_mode applied as nn.Conv{n}d applies it)
_TORCH_FUNCTIONS = {n: _conv_padded(r) if r.family == "conv" else _ops.resolve_path(r.torch_function)
                    for n, r in _ops.REGISTRY.items()}  # fmt: skip


def torch_function(op: str):
    """The torch callable that computes refkern's ``op`` with every argument refkern's op takes
    (``conv1d``/``conv2d``/``conv3d`` also take ``padding_mode``, which ``F.conv2d`` does not); an unknown
    name gets the registry's error listing the valid ones."""
    return _TORCH_FUNCTIONS[_ops.get(op, "torch_function").name]


def operands(op: str) -> tuple:
    """The tensor operands of ``op``, in order (a command line's shapes, a file's arrays)."""
    return _ops.get(op).operands


def op_keywords(op: str) -> tuple:
    """The arguments of refkern's ``op`` that torch's op takes too, besides its first operand (and
    besides every operand of the products and convolutions, which take them positionally). The
    keywords that say how refkern computes the reference (``accumulate``, ``accum_dtype``,
    ``return_running_stats``) are excluded: a reference for a backend is always exact."""
    return _ops.get(op).torch_keywords()


def check_keywords(op: str, names, where: str) -> None:
    """Raise a TypeError naming an argument ``op`` does not take, with the nearest valid name.

    ``where`` starts the message ("check", or the command line's "--kw")."""
    import difflib

    rec = _ops.get(op, where)
    valid = rec.torch_keywords()
    for name in names:
        if name in valid:
            continue
        if name in (rec.operands if rec.positional else rec.operands[:1]):
            place = ("first", "second", "third")[rec.operands.index(name)]
            raise TypeError(
                f"{where}: {name} is an operand of {op}, not a keyword argument; pass it as the {place} operand."
            )
        if not valid:
            raise TypeError(f"{where}: {op} takes no keyword arguments; got {name!r}. Drop it.")
        near = difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise TypeError(f"{where}: {op} takes no argument {name!r}; {hint}{op} takes {', '.join(valid)}.")
