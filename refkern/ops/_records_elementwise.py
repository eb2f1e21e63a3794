"""The records of the elementwise functions (issue 26): one per op, judged by the accuracy-class yardstick
(error model "elementwise": :mod:`refkern.analysis.elementwise`, classes in :mod:`refkern.ops._accuracy`).

Each op is this record and its kernel (:mod:`refkern.kernels.elementwise`) and truth
(:mod:`refkern.truth.elementwise`); the torch callables and aten ops the audit, ``check`` and
``reference_mode`` intercept (``calls``, ``aten``: :func:`refkern.torch.dispatch._elementwise` binds them),
and torch's OpInfo names. The ops with a backward reference (``differentiable``: every one) have it
in :mod:`refkern.kernels.elementwise_grad` and :mod:`refkern.kernels.math_grad` (truth
:mod:`refkern.truth.elementwise_grad`, judged by :mod:`refkern.analysis.elementwise_grad`): their aten backward
kernels (``silu_backward``, ``gelu_backward``, ``tanh_backward``, ``sigmoid_backward``, ``softplus_backward``)
are judged by :func:`refkern.compare_backward` in the audit; tanh's and sigmoid's receive the forward's
output, so the audit keeps the forward's input for them (``aten_memo``), as it does for softmax. The other
ops' autograd formulas are made of other ops (``exp``'s ``grad * result``, ``rsqrt``'s ``pow(result, 3)`` and
``mul``), so their gradients are judged by :func:`refkern.compare_backward` and ``check(backward=True)``, and
in the audit as those ops."""

from refkern.ops._record import Backward, Call, Op

_F = "torch.nn.functional."
_K = "refkern.kernels.elementwise:"
_T = "refkern.truth.elementwise:"
_IN = ("input",)


#: the backward of every differentiable elementwise op: the rule g f'(x) correctly rounded
#: (:mod:`refkern.kernels.elementwise_grad`), its truth (:mod:`refkern.truth.elementwise_grad`), its judging by
#: the backward formula's accuracy (:mod:`refkern.analysis.elementwise_grad`), the audit's reading of its aten
#: backward kernel (where it has one)
_GRAD = Backward("refkern.kernels.elementwise_grad:_elementwise", "refkern.truth.elementwise_grad:backward",
                 "refkern.analysis.elementwise_grad:judge", "refkern.torch.dispatch_backward:elementwise")  # fmt: skip

_NO_KERNEL = Backward(_GRAD.rule, _GRAD.truth, _GRAD.judge)  # no aten backward kernel: autograd composes it
#: the math functions' truth: :mod:`refkern.truth._backward_math` (their rule: :mod:`refkern.kernels.math_grad`)
_MATH_TRUTH = "refkern.truth._backward_math:backward"


def _ew(name, torch_function, calls, *, params=_IN, aten=None, opinfo=None, backward=None, memo=False, grad=False,
        diff=_IN, promotes=False, broadcast=None):
    """``backward``: the aten backward kernel of the op (which the audit judges), ``grad``: the op has a
    backward rule without one (autograd composes its gradient of other ops), ``broadcast``: the gradient of an
    operand broadcast against the other (:class:`refkern.ops.Backward`)."""
    node = f"{name.capitalize()}Backward0" if backward else None
    grad = grad or backward is not None
    return Op(name, "elementwise", _K + name, _T + name, _IN, "elementwise", torch_function=torch_function,
              calls=tuple(Call(c, params) for c in calls), aten=aten or (name,),
              differentiable=diff if grad else (), aten_backward=(backward,) if backward else (),
              aten_memo=((name, "input"),) if memo else (), autograd=((node, _IN),) if backward else (),
              opinfo=(name,) if opinfo is None else opinfo, promotes_integers=promotes,
              backward=_grad(name, backward, broadcast) if grad else None)  # fmt: skip


def _grad(name, kernel, broadcast=None):
    b = _GRAD if kernel else _NO_KERNEL
    if name in ("tanh", "sigmoid", "silu", "gelu"):  # the activations: refkern.truth.elementwise_grad
        return b
    return Backward(b.rule, _MATH_TRUTH, b.judge, b.audit, broadcast)


def _unary(name, **kw):
    """A function of one tensor, which torch computes in its default float dtype for integer and bool inputs."""
    return _ew(name, f"torch.{name}", (f"torch.{name}", f"torch.Tensor.{name}"), promotes=True, **kw)


RECORDS = (
    *(_unary(n, grad=True) for n in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal")),
    _unary("tanh", backward="tanh_backward", memo=True),
    _unary("sigmoid", backward="sigmoid_backward", memo=True),
    *(_unary(n, grad=True) for n in ("erf", "sin", "cos")),
    # a tensor exponent is differentiable (a number exponent has no gradient); integer and bool operands follow
    # torch.result_type (refkern.torch.ops._pow), not the unary functions' promotion
    _ew("pow", "torch.pow", ("torch.pow", "torch.Tensor.pow"), params=("input", "exponent"), grad=True,
        diff=("input", "exponent"), broadcast="refkern.kernels.pow_backward:pow_reduced"),
    _ew("silu", f"{_F}silu", (f"{_F}silu",), params=("input", "inplace"), backward="silu_backward",
        opinfo=("nn.functional.silu",)),
    _ew("gelu", f"{_F}gelu", (f"{_F}gelu",), params=("input", "approximate"), backward="gelu_backward",
        opinfo=("nn.functional.gelu",)),
    _ew("softplus", f"{_F}softplus", (f"{_F}softplus",), params=("input", "beta", "threshold"),
        backward="softplus_backward", opinfo=("nn.functional.softplus",)),
)  # fmt: skip
