"""Backward rules of layer_norm, rms_norm, group_norm and batch_norm: every gradient of a norm from one
pass over its rows (:mod:`refkern.kernels.norm_backward`, :mod:`refkern.kernels.batch_norm_backward`)."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from refkern._arrays import is_tensor, operand
from refkern.kernels._grad import Adjoint, _check_grad


@dataclass
class _NormCall:
    """A validated norm backward call: rows (R, n) of input and grad_output (float64), the weight (n,),
    (P, n) (row r uses ``W[r % P]``) or None, eps, the formats and shapes of the arguments, whether to
    return tensors; ``regroup`` ((R, n) -> (T, C): the terms of each parameter element as a column,
    None for layer_norm's columns), ``back`` (rows to the input's shape), and the envelope's keywords
    (:func:`refkern.analysis._envelope_backward.norm_bound`). ``given``: batch_norm in eval mode,
    (running_mean, running_var) per row (the rows are channels)."""

    X: np.ndarray
    G: np.ndarray
    W: "np.ndarray | None"
    center: bool
    eps: float
    fmts: dict
    shapes: dict
    as_tensor: bool
    regroup: "Callable | None" = None
    back: "Callable | None" = None
    bound_kw: dict = field(default_factory=dict)
    given: "tuple | None" = None


def _norm_fmts(a, o, names, who):
    fmts = {"input": o.fmt}
    for k in names:
        if a.get(k) is not None:
            fmts[k] = operand(a[k], k, who).fmt
    return fmts


def _layer_norm_call(op, g, a, who) -> _NormCall:
    from refkern.kernels.norm import _param, _trailing
    from refkern.ops._args import eps as _eps

    o = operand(a["input"], "input", who)
    shape = _trailing(who, o.values, a["normalized_shape"])
    n = math.prod(shape)
    w = _param(a["weight"], "weight", who, shape)
    _param(a.get("bias"), "bias", who, shape)  # validation: its shape
    _check_grad(op, g, o.shape, a["input"], "input", who)
    og = operand(g, "grad_output", who)
    if op == "rms_norm" and a["eps"] is None:  # torch's opmath epsilon (refkern.kernels.norm.rms_norm)
        eps = 2.0**-52 if o.fmt.prec == 53 else 2.0**-23
    else:
        eps = _eps(a["eps"], who)
    fmts = _norm_fmts(a, o, ("weight", "bias"), who)
    shapes = {"input": tuple(o.shape), **{k: tuple(shape) for k in fmts if k != "input"}}
    rows = (-1, n) if n else (0, 0)
    X = np.ascontiguousarray(np.asarray(o.values, np.float64).reshape(rows))
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(rows))
    tensor = o.torch or og.torch or any(is_tensor(a.get(k)) for k in ("weight", "bias"))
    return _NormCall(X, G, None if w is None else w.reshape(-1), op == "layer_norm", eps, fmts, shapes, tensor)


def _group_norm_call(op, g, a, who) -> _NormCall:
    """group_norm: a layer_norm over each group's (C / G, spatial) elements (rows (N G, n)), its
    per-channel weight repeated over the spatial positions (row r: group r % G); grad_weight and
    grad_bias sum over (N, spatial) per channel, formed per block of spatial positions by torch."""
    from refkern.kernels.norm import _param
    from refkern.ops._args import eps as _eps

    o = operand(a["input"], "input", who)
    x = o.values
    if x.ndim < 2:
        raise ValueError(f"{who}: group_norm expects input of shape (N, C, *); got input.shape={tuple(x.shape)}.")
    nb, c = x.shape[:2]
    ng = a["num_groups"]
    if isinstance(ng, bool) or not isinstance(ng, (int, np.integer)) or ng <= 0:
        raise ValueError(f"{who}: num_groups must be a positive int; got {ng!r}.")
    if c % ng:
        raise ValueError(f"{who}: the {c} channels of input must divide into num_groups={ng} groups.")
    ng = int(ng)
    hw = math.prod(x.shape[2:])
    n = (c // ng) * hw
    w = _param(a["weight"], "weight", who, (c,))
    _param(a["bias"], "bias", who, (c,))
    _check_grad(op, g, o.shape, a["input"], "input", who)
    og = operand(g, "grad_output", who)
    eps = _eps(a["eps"], who)
    fmts = _norm_fmts(a, o, ("weight", "bias"), who)
    shapes = {"input": tuple(o.shape), **{k: (c,) for k in fmts if k != "input"}}
    rows = (nb * ng, n)
    X = np.ascontiguousarray(np.asarray(o.values, np.float64).reshape(rows))
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(rows))
    W = None if w is None else np.ascontiguousarray(np.repeat(w, hw).reshape(ng, n))

    def regroup(A):  # (N G, C/G hw) -> (N hw, C): channel c's terms in column c
        return A.reshape(nb, c, hw).transpose(0, 2, 1).reshape(nb * hw, c)

    tensor = o.torch or og.torch or any(is_tensor(a.get(k)) for k in ("weight", "bias"))
    half = o.fmt.prec < 24
    return _NormCall(X, G, W, True, eps, fmts, shapes, tensor, regroup,
                     bound_kw={"regroup": regroup, "block": hw, "stored_sums": half, "half_sums": False})  # fmt: skip


def _batch_norm_call(op, g, a, who) -> _NormCall:
    """batch_norm: the rows are channels, (C, N * spatial). Training: a layer_norm over each row with
    the batch statistics and the row's weight; grad_weight and grad_bias are the rows' own sums. Eval:
    the running statistics, ``given``."""
    from refkern.kernels.norm import _param
    from refkern.ops._args import eps as _eps

    o = operand(a["input"], "input", who)
    x = o.values
    if x.ndim < 2:
        raise ValueError(
            f"{who}: batch_norm expects input of shape (N, C) or (N, C, *); got input.shape={tuple(x.shape)}."
        )
    c = x.shape[1]
    rm = _param(a["running_mean"], "running_mean", who, (c,))
    rv = _param(a["running_var"], "running_var", who, (c,))
    w = _param(a["weight"], "weight", who, (c,))
    _param(a["bias"], "bias", who, (c,))
    training = bool(a["training"])
    per = x.size // c if c else 0
    if training and per <= 1:
        raise ValueError(
            f"{who}: batch_norm expects more than 1 value per channel when training; got input.shape={tuple(x.shape)}."
        )
    if not training and (rm is None or rv is None):
        raise ValueError(f"{who}: batch_norm needs running_mean and running_var when training=False.")
    _check_grad(op, g, o.shape, a["input"], "input", who)
    og = operand(g, "grad_output", who)
    eps = _eps(a["eps"], who)
    fmts = _norm_fmts(a, o, ("weight", "bias"), who)
    shapes = {"input": tuple(o.shape), **{k: (c,) for k in fmts if k != "input"}}
    mv = lambda v: np.ascontiguousarray(np.moveaxis(np.asarray(v, np.float64), 1, 0).reshape(c, per))  # noqa: E731
    X, G = mv(o.values), mv(og.values)
    W = None if w is None else np.ascontiguousarray(w.reshape(c, 1) * np.ones((1, per)))
    rest = (x.shape[0], *x.shape[2:])

    def back(v):
        return np.moveaxis(v.reshape((c, *rest)), 0, 1)

    def regroup(A):  # (C, N hw) -> (N hw, C)
        return A.T

    tensor = o.torch or og.torch or any(is_tensor(a.get(k)) for k in ("weight", "bias", "running_mean", "running_var"))
    half = o.fmt.prec < 24  # torch's generic kernel (non-contiguous input) computes grad_input in scalar_t
    return _NormCall(X, G, W, True, eps, fmts, shapes, tensor, regroup, back,
                     {"regroup": regroup, "half_sums": False,
                      "stored_sums": half, "half_steps": half},
                     None if training else (rm, rv))  # fmt: skip


_NORM_CALLS = {"layer_norm": _layer_norm_call, "rms_norm": _layer_norm_call, "group_norm": _group_norm_call,
               "batch_norm": _batch_norm_call}  # fmt: skip


def _norm_grads(c: _NormCall, wrt) -> dict:
    """{name: float64 gradient in its argument's shape} for the gradients asked for."""
    if c.given is not None:
        from refkern.kernels.batch_norm_backward import batch_norm_eval_backward

        got = batch_norm_eval_backward(c.X, c.G, c.W, c.given[0], c.given[1], c.eps, c.fmts, wrt)
    else:
        from refkern.kernels.norm_backward import norm_backward_rows

        got = norm_backward_rows(c.X, c.G, c.W, c.center, c.eps, c.fmts, wrt, regroup=c.regroup)
    out = {}
    for k, v in got.items():
        if k == "input" and c.back is not None:
            v = c.back(v)
        out[k] = np.asarray(v).reshape(c.shapes[k])
    return out


def _norm(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _NORM_CALLS[op](op, g, a, who)
    memo = {}

    def grads():  # every gradient asked for from one pass over the rows
        if not memo:
            memo.update({k: deliver(v, c.fmts[k], c.as_tensor) for k, v in _norm_grads(c, wrt).items()})
        return memo

    return {k: Adjoint(k, op, (), compute=lambda k=k: grads()[k]) for k in wrt}
