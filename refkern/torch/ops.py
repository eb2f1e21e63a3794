"""Which refkern op a torch call computes, and with which arguments.

One table serves ``check`` (a function or module), ``audit`` and ``reference_mode`` (every
call a model makes). A call that cannot be expressed exactly (``addmm`` with a 2-D
``input``, or ``alpha``/``beta`` other than 1, attention with dropout, a sum of integers) is
reported as unsupported, never approximated.
"""

import torch
import torch.nn.functional as F

from refkern._operands import OPERANDS, POSITIONAL

__all__ = ["OpCall", "from_call", "from_module", "FUNCTIONS", "torch_function", "op_keywords", "check_keywords",
           "COMPOSITES", "composite_body", "operands"]  # fmt: skip

FUNCTIONS = {
    F.conv1d: "conv1d",
    F.conv2d: "conv2d",
    F.conv3d: "conv3d",
    F.conv_transpose1d: "conv_transpose1d",
    F.conv_transpose2d: "conv_transpose2d",
    F.conv_transpose3d: "conv_transpose3d",
    F.linear: "linear",
    torch.matmul: "matmul",
    torch.Tensor.matmul: "matmul",
    torch.Tensor.__matmul__: "matmul",
    torch.mm: "mm",
    torch.Tensor.mm: "mm",
    torch.bmm: "bmm",
    torch.Tensor.bmm: "bmm",
    torch.addmm: "addmm",
    torch.Tensor.addmm: "addmm",
    torch.baddbmm: "baddbmm",
    torch.Tensor.baddbmm: "baddbmm",
}

# Calls whose arguments are refkern's op's own, in torch's positional order: callable -> (op,
# torch's positional parameter names). "input" is the op's first operand whatever refkern calls it;
# "_stacklevel" (F.softmax's) is dropped; "unbiased" (var/std's legacy form) becomes correction.
_SAME = {
    torch.sum: ("sum", ("input", "dim", "keepdim")),
    torch.Tensor.sum: ("sum", ("input", "dim", "keepdim")),
    torch.mean: ("mean", ("input", "dim", "keepdim")),
    torch.Tensor.mean: ("mean", ("input", "dim", "keepdim")),
    torch.var: ("var", ("input", "dim", "unbiased", "keepdim")),
    torch.Tensor.var: ("var", ("input", "dim", "unbiased", "keepdim")),
    torch.std: ("std", ("input", "dim", "unbiased", "keepdim")),
    torch.Tensor.std: ("std", ("input", "dim", "unbiased", "keepdim")),
    torch.cumsum: ("cumsum", ("input", "dim")),
    torch.Tensor.cumsum: ("cumsum", ("input", "dim")),
    torch.dot: ("dot", ("input", "tensor")),
    torch.Tensor.dot: ("dot", ("input", "tensor")),
    F.layer_norm: ("layer_norm", ("input", "normalized_shape", "weight", "bias", "eps")),
    F.rms_norm: ("rms_norm", ("input", "normalized_shape", "weight", "eps")),
    F.group_norm: ("group_norm", ("input", "num_groups", "weight", "bias", "eps")),
    F.batch_norm: ("batch_norm", ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
                                  "eps")),
    F.avg_pool1d: ("avg_pool1d", ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")),
    F.avg_pool2d: ("avg_pool2d", ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                                  "divisor_override")),
    F.max_pool1d: ("max_pool1d", ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices")),
    F.max_pool2d: ("max_pool2d", ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices")),
    F.max_pool1d_with_indices: ("max_pool1d", ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                               "return_indices")),
    F.max_pool2d_with_indices: ("max_pool2d", ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                               "return_indices")),
    F.adaptive_avg_pool1d: ("adaptive_avg_pool1d", ("input", "output_size")),
    F.adaptive_avg_pool2d: ("adaptive_avg_pool2d", ("input", "output_size")),
    F.softmax: ("softmax", ("input", "dim", "_stacklevel", "dtype")),
    torch.softmax: ("softmax", ("input", "dim", "dtype")),
    torch.Tensor.softmax: ("softmax", ("input", "dim", "dtype")),
    F.log_softmax: ("log_softmax", ("input", "dim", "_stacklevel", "dtype")),
    torch.log_softmax: ("log_softmax", ("input", "dim", "dtype")),
    torch.Tensor.log_softmax: ("log_softmax", ("input", "dim", "dtype")),
    F.scaled_dot_product_attention: ("scaled_dot_product_attention", ("query", "key", "value", "attn_mask",
                                                                     "dropout_p", "is_causal", "scale")),
}  # fmt: skip
FUNCTIONS.update({f: op for f, (op, _) in _SAME.items()})

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

    def __init__(self, torch_name, op=None, args=(), kwargs=None, unsupported=None):
        self.torch_name = torch_name
        self.op = op
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.unsupported = unsupported

    def tensors(self):
        return [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor)]

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
    if name in ("conv1d", "conv2d", "conv3d") or name.startswith("conv_transpose"):
        keys = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        if name.startswith("conv_transpose"):  # F.conv_transpose{n}d's own order
            keys = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
        vals = {k: _get(args, kwargs, i, k) for i, k in enumerate(keys)}
        ref = {k: v for k, v in vals.items() if v is not None and k not in ("input", "weight", "bias")}
        return OpCall(name, name, (vals["input"], vals["weight"], vals["bias"]), ref)
    if name == "linear":
        return OpCall(name, "linear", (_get(args, kwargs, 0, "input"), _get(args, kwargs, 1, "weight"),
                                       _get(args, kwargs, 2, "bias")))  # fmt: skip
    if name in ("matmul", "mm", "bmm"):
        other = _get(args, kwargs, 1, "other", _get(args, kwargs, 1, "mat2"))
        return OpCall(name, "matmul", (_get(args, kwargs, 0, "input"), other))
    # addmm(input, mat1, mat2, beta=1, alpha=1) = beta * input + alpha * mat1 @ mat2 (baddbmm: batched)
    inp, m1 = _get(args, kwargs, 0, "input"), _get(args, kwargs, 1, "mat1", _get(args, kwargs, 1, "batch1"))
    m2 = _get(args, kwargs, 2, "mat2", _get(args, kwargs, 2, "batch2"))
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if alpha != 1:
        return OpCall(name, unsupported=f"{name} with alpha={alpha} is not a plain sum of products")
    if beta == 0:
        return OpCall(name, "matmul", (m1, m2))
    if beta != 1:
        return OpCall(name, unsupported=f"{name} with beta={beta} scales its input before adding it")
    n = m2.shape[-1]
    if name == "baddbmm":
        return OpCall(name, unsupported="baddbmm adds a batched input; only beta=0 is analysed")
    if tuple(inp.shape) in ((), (1,), (n,), (1, 1), (1, n)):  # broadcasts along the rows: a bias per column
        bias = inp.reshape(-1).expand(n).contiguous()
        return OpCall(name, "linear", (m1, m2.transpose(0, 1), bias))  # mat1 @ mat2 + bias, bias a term
    return OpCall(name, unsupported=f"addmm with input of shape {tuple(inp.shape)} is not a bias per column")


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
    first = vals.get("input", vals.get("query"))
    if not isinstance(first, torch.Tensor) or first.dtype not in _FLOATS:
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
    if func in (F.max_pool1d_with_indices, F.max_pool2d_with_indices):
        vals["return_indices"] = True
    if op == "scaled_dot_product_attention" and vals.get("dropout_p", 0.0):
        return OpCall(torch_name, unsupported=f"attention with dropout_p={vals['dropout_p']} (a random mask no "
                      "reference can reproduce)")  # fmt: skip
    operand = vals.pop(names[0])  # positional: refkern names it x, input or query
    return OpCall(torch_name, op, (operand,), vals)


def from_module(m, x) -> OpCall | None:
    """The OpCall of ``m(x)`` for nn.Linear, nn.Conv1d/2d/3d, nn.ConvTranspose1d/2d/3d (with its own
    ``output_padding``: ``m(x, output_size=...)`` is not this call), nn.LayerNorm, nn.RMSNorm,
    nn.GroupNorm, nn.BatchNorm1d/2d/3d (in the module's mode: batch statistics in training),
    nn.AvgPool1d/2d, nn.MaxPool1d/2d, nn.AdaptiveAvgPool1d/2d, nn.Softmax and nn.LogSoftmax.
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
        return OpCall(type(m).__name__, f"conv_transpose{nd}d", (x, m.weight, m.bias), kw)
    if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
        op = f"conv{len(m.kernel_size)}d"
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
    if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d)):
        nd = 1 if isinstance(m, nn.AvgPool1d) else 2
        kw = dict(kernel_size=m.kernel_size, stride=m.stride, padding=m.padding, ceil_mode=m.ceil_mode,
                  count_include_pad=m.count_include_pad)  # fmt: skip
        if nd == 2:
            kw["divisor_override"] = m.divisor_override
        return OpCall(name, f"avg_pool{nd}d", (x,), kw)
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        nd = 1 if isinstance(m, nn.MaxPool1d) else 2
        kw = dict(kernel_size=m.kernel_size, stride=m.stride, padding=m.padding, dilation=m.dilation,
                  ceil_mode=m.ceil_mode, return_indices=m.return_indices)  # fmt: skip
        return OpCall(name, f"max_pool{nd}d", (x,), kw)
    if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
        nd = 1 if isinstance(m, nn.AdaptiveAvgPool1d) else 2
        return OpCall(name, f"adaptive_avg_pool{nd}d", (x,), dict(output_size=m.output_size))
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        op = "softmax" if isinstance(m, nn.Softmax) else "log_softmax"
        dim = m.dim if m.dim is not None else (0 if x.dim() in (0, 1, 3) else 1)  # torch's implicit dim
        return OpCall(name, op, (x,), dict(dim=dim))
    if isinstance(m, nn.MultiheadAttention):
        return OpCall(name, unsupported="MultiheadAttention is several ops (the projections, then attention); "
                      "audit it to judge each: with refkern.torch.audit() as a: module(q, k, v)")  # fmt: skip
    return None


def _conv_padded(nd):
    """torch's conv{nd}d with every argument of refkern's, ``padding_mode`` included: as
    ``nn.Conv{nd}d`` does, a mode other than "zeros" pads the input with ``F.pad`` first."""
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]

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

    fn.__name__ = fn.__qualname__ = f"conv{nd}d"
    fn.__doc__ = f"F.conv{nd}d, with padding_mode as nn.Conv{nd}d applies it."
    return fn


def _expand(v, nd):
    """An int, or a tuple of 1 or nd ints, as a tuple of nd ints (torch's convolution rule)."""
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    return t * nd if len(t) == 1 else t


_TORCH_FUNCTIONS = {
    "dot": torch.dot,
    "matmul": torch.matmul,
    "linear": F.linear,
    "conv1d": _conv_padded(1),
    "conv2d": _conv_padded(2),
    "conv3d": _conv_padded(3),
    "conv_transpose1d": F.conv_transpose1d,
    "conv_transpose2d": F.conv_transpose2d,
    "conv_transpose3d": F.conv_transpose3d,
    "sum": torch.sum,
    "mean": torch.mean,
    "var": torch.var,
    "std": torch.std,
    "cumsum": torch.cumsum,
    "layer_norm": F.layer_norm,
    "rms_norm": F.rms_norm,
    "group_norm": F.group_norm,
    "batch_norm": F.batch_norm,
    "avg_pool1d": F.avg_pool1d,
    "avg_pool2d": F.avg_pool2d,
    "max_pool1d": F.max_pool1d,
    "max_pool2d": F.max_pool2d,
    "adaptive_avg_pool1d": F.adaptive_avg_pool1d,
    "adaptive_avg_pool2d": F.adaptive_avg_pool2d,
    "softmax": F.softmax,
    "log_softmax": F.log_softmax,
    "scaled_dot_product_attention": F.scaled_dot_product_attention,
}


def torch_function(op: str):
    """The torch callable that computes refkern's ``op`` with every argument refkern's op takes
    (``conv1d``/``conv2d``/``conv3d`` also take ``padding_mode``, which ``F.conv2d`` does not)."""
    return _TORCH_FUNCTIONS[op]


# refkern's own keywords (how the reference is computed or what it returns), never torch's.
_REFKERN_ONLY = ("accumulate", "accum_dtype", "return_running_stats")


def operands(op: str) -> tuple:
    """The tensor operands of ``op``, in order (a command line's shapes, a file's arrays)."""
    return OPERANDS[op]


def op_keywords(op: str) -> tuple:
    """The arguments of refkern's ``op`` that torch's op takes too, besides its first operand (and
    besides every operand of the products and convolutions, which take them positionally). The
    keywords that say how refkern computes the reference (``accumulate``, ``accum_dtype``,
    ``return_running_stats``) are excluded: a reference for a backend is always exact."""
    import inspect

    import refkern

    params = list(inspect.signature(getattr(refkern, op)).parameters.values())
    if op in POSITIONAL:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(p.name for p in params if p.kind in positional and p.name not in OPERANDS[op])
    return tuple(p.name for p in params[1:] if p.name not in _REFKERN_ONLY)


def check_keywords(op: str, names, where: str) -> None:
    """Raise a TypeError naming an argument ``op`` does not take, with the nearest valid name.

    ``where`` starts the message ("check", or the command line's "--kw")."""
    import difflib

    valid = op_keywords(op)
    for name in names:
        if name in valid:
            continue
        if name in (OPERANDS[op] if op in POSITIONAL else OPERANDS[op][:1]):
            place = ("first", "second", "third")[operands(op).index(name)]
            raise TypeError(
                f"{where}: {name} is an operand of {op}, not a keyword argument; pass it as the {place} operand."
            )
        if not valid:
            raise TypeError(f"{where}: {op} takes no keyword arguments; got {name!r}. Drop it.")
        near = difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise TypeError(f"{where}: {op} takes no argument {name!r}; {hint}{op} takes {', '.join(valid)}.")
