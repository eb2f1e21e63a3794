"""Which refkern op a torch call computes, and with which arguments.

One table serves ``check`` (a function or module), ``audit`` and ``reference_mode`` (every
call a model makes). A call that cannot be expressed exactly (``addmm`` with a 2-D
``input``, or ``alpha``/``beta`` other than 1) is reported as unsupported, never approximated.
"""

import torch
import torch.nn.functional as F

__all__ = ["OpCall", "from_call", "from_module", "FUNCTIONS"]

FUNCTIONS = {
    F.conv1d: "conv1d",
    F.conv2d: "conv2d",
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
    if name in ("conv1d", "conv2d"):
        keys = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
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
    """The OpCall of ``m(x)`` for nn.Linear, nn.Conv1d and nn.Conv2d modules."""
    if isinstance(m, torch.nn.Linear):
        return OpCall("Linear", "linear", (x, m.weight, m.bias))
    if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)):
        op = "conv1d" if isinstance(m, torch.nn.Conv1d) else "conv2d"
        kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups, padding_mode=m.padding_mode)
        return OpCall(type(m).__name__, op, (x, m.weight, m.bias), kw)
    return None
