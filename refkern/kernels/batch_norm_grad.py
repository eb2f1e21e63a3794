"""batch_norm's backward rule (:class:`refkern.ops.Backward`): the norms' rule
(:func:`refkern.kernels.norm_grad._norm`), and the gradients of an input with no element."""

import numpy as np

__all__ = ["batch_norm_rule", "empty_input"]


def empty_input(a) -> bool:
    """Whether batch_norm's bound call ``a`` has an input with no element (any shape: torch accepts it, its
    output empty, its statistics unread)."""
    from refkern.kernels._grad import _shape

    return 0 in _shape(a["input"])


def batch_norm_rule(op, g, a, wrt, who):
    """batch_norm's backward rule: :func:`refkern.kernels.norm_grad._norm`'s, and for an input with no element
    (:func:`empty_input`) the gradients no term reaches: the input's empty, the weight's and bias's ``+0`` (empty
    sums). Each is the adjoint call ``sum`` over an empty last axis of zeros shaped as the argument (an exact
    refkern call whose result is that gradient: +0 in the argument's dtype), so
    :func:`refkern.compare_backward` judges it as any adjoint call."""
    from refkern._arrays import is_tensor
    from refkern.kernels._grad import Adjoint, _check_grad, _shape
    from refkern.kernels.norm_grad import _norm

    if not empty_input(a):
        return _norm(op, g, a, wrt, who)
    _check_grad(op, g, _shape(a["input"]), a["input"], "input", who)
    out = {}
    for k in wrt:
        v = a[k]
        shape = (*_shape(v), 0)
        z = v.new_zeros(shape) if is_tensor(v) else np.zeros(shape, np.asarray(v).dtype)
        out[k] = Adjoint(k, "sum", (z,), {"dim": -1})
    return out
