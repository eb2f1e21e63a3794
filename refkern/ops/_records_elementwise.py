"""The records of the elementwise functions (issue 26): one per op, judged by the accuracy-class yardstick
(error model "elementwise": :mod:`refkern.analysis.elementwise`, classes in :mod:`refkern.ops._accuracy`).

Each op is this record and its kernel (:mod:`refkern.kernels.elementwise`) and truth
(:mod:`refkern.truth.elementwise`). Not yet here: the torch callables and aten ops the audit and
``check`` intercept (``calls``, ``aten``), OpInfo names, backward; they come with the audit's
coverage of these ops."""

from refkern.ops._record import Op

_F = "torch.nn.functional."
_K = "refkern.kernels.elementwise:"
_T = "refkern.truth.elementwise:"


def _ew(name, torch_function):
    return Op(name, "elementwise", _K + name, _T + name, ("input",), "elementwise", torch_function=torch_function)


RECORDS = (
    *(_ew(n, f"torch.{n}") for n in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
                                     "tanh", "sigmoid", "erf", "sin", "cos", "pow")),
    *(_ew(n, f"{_F}{n}") for n in ("silu", "gelu", "softplus")),
)  # fmt: skip
