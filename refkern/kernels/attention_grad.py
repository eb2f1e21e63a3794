"""Backward rule of scaled_dot_product_attention (:mod:`refkern.kernels.attention_backward`)."""

import math
from dataclasses import dataclass

import numpy as np

from refkern.kernels._grad import Adjoint, _shape, grad_output


@dataclass
class _AttnCall:
    """A validated attention backward call: the forward's normalised operands, grad_output as float64
    (B, L, Ev), the original shapes of query, key and value (and of a float attn_mask), whether to return
    tensors, the float mask's format (None without one: a boolean mask has no gradient)."""

    a: object
    G: np.ndarray
    shapes: dict
    as_tensor: bool
    mask_fmt: object = None

    def fmt(self, k):
        """The format gradient ``k`` is rounded to: the mask's for attn_mask, the query's otherwise."""
        return self.mask_fmt if k == "attn_mask" else self.a.fmt


def _attn_call(op, g, a, who) -> _AttnCall:
    from refkern.kernels.attention import attention_operands

    try:
        at = attention_operands(a["query"], a["key"], a["value"], a.get("attn_mask"), a.get("dropout_p", 0.0),
                                a.get("is_causal", False), a.get("scale"), a.get("enable_gqa", False),
                                op=who)  # fmt: skip
    except ValueError as exc:
        if "dropout_p" in str(exc):
            raise ValueError(f"{who}: {op} with dropout_p > 0 has no reference gradient: the random dropout mask "
                             f"cannot be passed in; got dropout_p={a.get('dropout_p')}. Compare with dropout_p=0.0 "
                             "(model.eval()).") from None  # fmt: skip
        raise
    og = grad_output(g, op, at.fmt, at.out_shape, who)
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(at.iq.size, *at.out_shape[-2:]))
    if not all(np.isfinite(x).all() for x in (at.Q, at.K, at.V, G)):
        raise ValueError(f"{who}: {op} backward needs finite query, key, value and grad_output; got a NaN or an "
                         "infinity. The gradient of a non-finite input has no real value to round.")  # fmt: skip
    if at.Q.shape[2] > 0 and not math.isfinite(at.scale):
        raise ValueError(f"{who}: {op} backward needs a finite scale; got scale={at.scale}.")
    shapes = {k: _shape(a[k]) for k in ("query", "key", "value")}
    mask, mask_fmt = a.get("attn_mask"), None
    if mask is not None and not at.causal and str(getattr(mask, "dtype", "")) not in ("torch.bool", "bool"):
        from refkern._arrays import operand

        shapes["attn_mask"], mask_fmt = _shape(mask), operand(mask, "attn_mask", who).fmt
    return _AttnCall(at, G, shapes, at.tensor or og.torch, mask_fmt)


def _attn_grads(c: _AttnCall, wrt) -> dict:
    """{name: float64 gradient in its argument's shape} for the names in wrt."""
    from refkern.kernels.attention_backward import attention_backward

    got, _ = attention_backward(c.a, c.G, wrt, mask_fmt=c.mask_fmt)
    return {k: v.reshape(c.shapes[k]) for k, v in got.items()}


def _attention(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _attn_call(op, g, a, who)
    memo = {}

    def grads():  # every gradient asked for from one pass over the rows
        if not memo:
            memo.update({k: deliver(v, c.fmt(k), c.as_tensor) for k, v in _attn_grads(c, wrt).items()})
        return memo

    return {k: Adjoint(k, op, (), compute=lambda k=k: grads()[k]) for k in wrt}
