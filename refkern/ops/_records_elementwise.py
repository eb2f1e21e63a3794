"""The records of the elementwise functions (issue 26): one per op, judged by the accuracy-class yardstick
(error model "elementwise": :mod:`refkern.analysis.elementwise`, classes in :mod:`refkern.ops._accuracy`).

Each op is this record and its kernel (:mod:`refkern.kernels.elementwise`) and truth
(:mod:`refkern.truth.elementwise`); the torch callables and aten ops the audit, ``check`` and
``reference_mode`` intercept (``calls``, ``aten``: :func:`refkern.torch.dispatch._elementwise` binds them),
and torch's OpInfo names. The ops with a backward reference (``differentiable``) have it in
:mod:`refkern.kernels.elementwise_grad` (truth :mod:`refkern.truth.elementwise_grad`): their aten backward
kernels (``silu_backward``, ``gelu_backward``, ``tanh_backward``, ``sigmoid_backward``) are judged by
:func:`refkern.compare_backward`; tanh's and sigmoid's receive the forward's output, so the audit keeps the
forward's input for them (``aten_memo``), as it does for softmax. The other ops' autograd formulas are
made of ops judged as forward ops (``exp``'s ``grad * result``, ``rsqrt``'s ``pow(result, 3)`` and ``mul``)."""

from refkern.ops._record import Call, Op

_F = "torch.nn.functional."
_K = "refkern.kernels.elementwise:"
_T = "refkern.truth.elementwise:"
_IN = ("input",)


def _ew(name, torch_function, calls, *, params=_IN, aten=None, opinfo=None, backward=None, memo=False):
    node = f"{name.capitalize()}Backward0" if backward else None
    return Op(name, "elementwise", _K + name, _T + name, _IN, "elementwise", torch_function=torch_function,
              calls=tuple(Call(c, params) for c in calls), aten=aten or (name,),
              differentiable=_IN if backward else (), aten_backward=(backward,) if backward else (),
              aten_memo=((name, "input"),) if memo else (), autograd=((node, _IN),) if backward else (),
              opinfo=(name,) if opinfo is None else opinfo)  # fmt: skip


def _unary(name, **kw):
    return _ew(name, f"torch.{name}", (f"torch.{name}", f"torch.Tensor.{name}"), **kw)


RECORDS = (
    *(_unary(n) for n in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal")),
    _unary("tanh", backward="tanh_backward", memo=True),
    _unary("sigmoid", backward="sigmoid_backward", memo=True),
    *(_unary(n) for n in ("erf", "sin", "cos")),
    # pow(tensor, number) only: pow's OpInfo samples include tensor exponents, which refkern does not take yet
    _ew("pow", "torch.pow", ("torch.pow", "torch.Tensor.pow"), params=("input", "exponent"), opinfo=()),
    _ew("silu", f"{_F}silu", (f"{_F}silu",), params=("input", "inplace"), backward="silu_backward",
        opinfo=("nn.functional.silu",)),
    _ew("gelu", f"{_F}gelu", (f"{_F}gelu",), params=("input", "approximate"), backward="gelu_backward",
        opinfo=("nn.functional.gelu",)),
    _ew("softplus", f"{_F}softplus", (f"{_F}softplus",), params=("input", "beta", "threshold"),
        opinfo=("nn.functional.softplus",)),
)  # fmt: skip
