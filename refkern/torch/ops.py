"""Which refkern op a torch call computes, and with which arguments.

One table serves ``check`` (a function or module), ``audit`` and ``reference_mode`` (every
call a model makes). A call that cannot be expressed exactly (``addmm`` with a 2-D
``input``, or ``alpha``/``beta`` other than 1) is reported as unsupported, never approximated.
"""

import torch
import torch.nn.functional as F

__all__ = ["OpCall", "from_call", "from_module", "FUNCTIONS", "torch_function", "op_keywords", "check_keywords"]

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

    def on_cpu(self):
        """The same call with every tensor detached and copied to the CPU (lossless)."""

        def cpu(a):
            return a.detach().cpu() if isinstance(a, torch.Tensor) else a

        return tuple(cpu(a) for a in self.args), {k: cpu(v) for k, v in self.kwargs.items()}


def _get(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def from_call(func, args, kwargs) -> OpCall | None:
    """The OpCall of a torch function call, or None when ``func`` is not one refkern audits."""
    name = FUNCTIONS.get(func)
    if name is None:
        return None
    kwargs = kwargs or {}
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


def from_module(m, x) -> OpCall | None:
    """The OpCall of ``m(x)`` for nn.Linear, nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d modules
    (a transposed one with its own ``output_padding``: ``m(x, output_size=...)`` is not this call)."""
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
}


def torch_function(op: str):
    """The torch callable that computes refkern's ``op`` with every argument refkern's op takes
    (``conv1d``/``conv2d``/``conv3d`` also take ``padding_mode``, which ``F.conv2d`` does not)."""
    return _TORCH_FUNCTIONS[op]


_OPERANDS = {"dot": ("x", "y"), "matmul": ("a", "b"), "linear": ("x", "weight", "bias"),
             "conv1d": ("x", "weight", "bias"), "conv2d": ("x", "weight", "bias"), "conv3d": ("x", "weight", "bias"),
             "conv_transpose1d": ("input", "weight", "bias"), "conv_transpose2d": ("input", "weight", "bias"),
             "conv_transpose3d": ("input", "weight", "bias")}  # fmt: skip


def op_keywords(op: str) -> tuple:
    """The arguments of refkern's ``op`` that torch's op takes too, besides the operands: its
    positional-or-keyword parameters. The keyword-only ones (``accumulate``, ``accum_dtype``,
    how the reference is computed) are excluded: a reference for a backend is always exact."""
    import inspect

    import refkern

    params = inspect.signature(getattr(refkern, op)).parameters.values()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in positional and p.name not in _OPERANDS[op])


def check_keywords(op: str, names, where: str) -> None:
    """Raise a TypeError naming an argument ``op`` does not take, with the nearest valid name.

    ``where`` starts the message ("check", or the command line's "--kw")."""
    import difflib

    valid = op_keywords(op)
    for name in names:
        if name in valid:
            continue
        if name in _OPERANDS[op]:
            place = ("first", "second", "third")[_OPERANDS[op].index(name)]
            raise TypeError(
                f"{where}: {name} is an operand of {op}, not a keyword argument; pass it as the {place} operand."
            )
        if not valid:
            raise TypeError(f"{where}: {op} takes no keyword arguments; got {name!r}. Drop it.")
        near = difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise TypeError(f"{where}: {op} takes no argument {name!r}; {hint}{op} takes {', '.join(valid)}.")
