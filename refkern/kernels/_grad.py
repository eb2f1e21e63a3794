"""What every backward rule shares: the :class:`Adjoint` a rule returns for each gradient, the array
helpers that keep numpy arrays and torch tensors in their own dtype, and the check of grad_output.
The rules themselves sit beside their forward kernels (``refkern/kernels/<family>_grad.py``);
:mod:`refkern.gradients` is their public face."""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from refkern._arrays import is_tensor, operand

__all__ = ["Adjoint", "grad_output"]


_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _identity(a):
    return a


@dataclass
class Adjoint:
    """The forward call whose exact result is one gradient: ``op``'s reference (``refkern.ops.get(op).reference``)
    called as ``(*args, **kwargs)``, mapped to the gradient's layout by ``to_grad`` (and a gradient to the call's
    layout by ``from_grad``). ``judge``: None, or a function giving another exact formulation of the same
    gradient that :func:`compare_backward` analyses instead: where this call computes more elements
    than the gradient has (a crop), or where another form lets the analysis model how backends
    accumulate it."""

    name: str  # the argument whose gradient this is
    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    to_grad: Callable = _identity
    from_grad: Callable = _identity
    judge: "Callable[[], Adjoint] | None" = None
    compute: "Callable[[], object] | None" = None  # the same values, computed in less memory than the call
    judge_alt: "Callable[[], Adjoint] | None" = None  # a second formulation (another backend's structure)

    def run(self, reference):
        """The gradient's values: ``compute()``, or ``to_grad(reference(op)(*args, **kwargs))`` with ``reference(op)``
        the reference function of op ``op``, which the caller resolves (:func:`refkern.backward`: the registry's).
        This module, which the kernels import, does not import the registry: a record's edit recompiles no
        kernel (:mod:`refkern._jit` stamps a kernel with every module its module imports)."""
        if self.compute is not None:
            return self.compute()
        return self.to_grad(reference(self.op)(*self.args, **self.kwargs))


def _shape(a) -> tuple:
    return tuple(a.shape) if hasattr(a, "shape") else np.shape(a)


def _perm(a, axes):
    return a.permute(*axes) if is_tensor(a) else np.transpose(a, axes)


def _flip(a, axes):
    return a.flip(tuple(axes)) if is_tensor(a) else np.flip(a, tuple(axes))


def _bcast(a, shape):
    return a.expand(*shape) if is_tensor(a) else np.broadcast_to(a, shape)


def _pad(a, pads, mode="zeros"):
    """``a`` with its last ``len(pads)`` dimensions padded by ``(lo, hi)`` each (``mode`` as
    torch's padding_mode); a negative amount crops instead."""
    lead = a.ndim - len(pads)
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        sl = tuple(slice(max(-lo, 0), s - max(-hi, 0)) for (lo, hi), s in zip(pads, _shape(a)[lead:]))
        a = a[(slice(None),) * lead + sl]
        pads = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    if not any(lo or hi for lo, hi in pads):
        return a
    if mode == "zeros":
        shape = _shape(a)[:lead] + tuple(s + lo + hi for (lo, hi), s in zip(pads, _shape(a)[lead:]))
        out = a.new_zeros(shape) if is_tensor(a) else np.zeros(shape, a.dtype)
        out[(slice(None),) * lead + tuple(slice(lo, lo + s) for (lo, _), s in zip(pads, _shape(a)[lead:]))] = a
        return out
    for i, (lo, hi) in enumerate(pads):  # reflect / replicate / circular: gather along each axis
        idx = np.pad(np.arange(_shape(a)[lead + i]), (lo, hi), mode=_PAD_MODES[mode])
        if is_tensor(a):
            import torch

            a = a.index_select(lead + i, torch.as_tensor(idx, device=a.device))
        else:
            a = np.take(a, idx, axis=lead + i)
    return a


def grad_output(g, op, fmt, shape, who, shape_text=None):
    """grad_output ``g`` of op ``op``'s backward, validated (the one check every backward rule makes): its
    dtype is the output's, ``fmt``, and its shape ``shape`` (``shape_text``: how the message states it,
    where the expected shape reads better as a formula); the operand (:func:`refkern._arrays.operand`)."""
    og = operand(g, "grad_output", who)
    if og.fmt.name != fmt.name:
        raise TypeError(f"{who}: grad_output must have the dtype of the output of {op}, {fmt.name}; "
                        f"got grad_output.dtype={og.fmt.name}.")  # fmt: skip
    if shape is not None and tuple(og.shape) != tuple(shape):
        want = shape_text or f"the shape of the output of {op}, {tuple(shape)}"
        raise ValueError(f"{who}: grad_output must have {want}; got grad_output.shape={tuple(og.shape)}.")
    return og


def _check_grad(op, g, want_shape, like, like_name, who):
    """:func:`grad_output` with the output's dtype that of argument ``like``."""
    return grad_output(g, op, operand(like, like_name, who).fmt, want_shape, who)


def _ones_judge(g2):
    """A sum over the rows of ``g2`` (R, C) (or all of a 1-D ``g2``) as ``matmul(ones(R), g2)``: the
    products by one are exact, so its value is the sum's, and the analysis is that of a reduction of
    length R (statistical, with the emulated accumulators), not the envelope of any summation."""
    r = _shape(g2)[0]
    ones = g2.new_ones((r,)) if is_tensor(g2) else np.ones(r, g2.dtype)
    return Adjoint("bias", "matmul", (ones, g2))


def _tap_judge(name, lt, rt, to_grad, from_grad):
    """``out[g, q, pos] = sum_t (sum_c lt[g, t, pos, c] rt[g, t, c, q])`` as one transposed convolution
    whose *taps are the t*: input channel (g, c) holds lt[g, t, :, c] at positions (T - 1 - t) P + pos,
    filter (g, c) -> q at tap t is rt[g, t, c, q]; padding (T - 1) P and dilation P make every tap
    valid at every output position. Its analysis then knows the per-tap roundings of torch's CPU
    kernels, which form such gradients one GEMM per image (or broadcast batch element) and add
    them in the result's dtype. Output: (1, G * Q, P). Every dimension must be non-zero (dilation P and
    groups G must be positive): a caller judges an empty gradient, or one of empty sums, otherwise."""
    gr, t, p, c = _shape(lt)
    q = _shape(rt)[3]
    xc = _flip(_perm(lt, (0, 3, 1, 2)), (2,)).reshape((1, gr * c, t * p))
    wc = _perm(rt, (0, 2, 3, 1)).reshape((gr * c, q, t))
    return Adjoint(name, "conv_transpose1d", (xc, wc), dict(padding=(t - 1) * p, dilation=p, groups=gr),
                   to_grad=to_grad, from_grad=from_grad)  # fmt: skip
