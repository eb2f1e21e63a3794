"""Ground truth of the normalizations: ``layer_norm``, ``rms_norm``, ``group_norm``, ``batch_norm``, each
output ``s * sqrt(Q) + B`` rounded once by :func:`refkern.truth.reductions.round_sqrt_form`, the exact
sums, moments and special values of :mod:`refkern.truth.reductions` (whose docstring says how)."""

import math
import operator
from fractions import Fraction

import numpy as np

from refkern._arrays import operand
from refkern.accumulate.formats import FORMATS, Format
from refkern.truth.reductions import (  # the exact sums, moments and extended values this family shares
    _ZERO,
    INF,
    NAN,
    _add,
    _div_count,
    _ext,
    _f64,
    _finish,
    _mean_square,
    _moments,
    _mul,
    _neg,
    _negative,
    _out,
    round_sqrt_form,
)

__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm"]


def _normalized(a, c, w, b, fmt: Format) -> float:
    """Round ``y = a / sqrt(c) * w + b`` once (``w`` None: no product; ``b`` None: no sum).

    ``a``, ``c``, ``w``, ``b`` are extended values; IEEE's rules for the specials: ``1 / sqrt(c)`` is
    NaN for ``c < 0``, +inf for ``c == 0``, +0 for ``c == +inf``; a product with 0 and inf is NaN.
    """
    factors = [a] if w is None else [a, w]
    if any(isinstance(v, float) and math.isnan(v) for v in (*factors, c, b) if v is not None):
        return NAN
    if _negative(c) and c != 0:
        return NAN  # sqrt of a negative number
    prod = a if w is None else _mul(a, w)
    if isinstance(c, float) and math.isinf(c):  # 1 / sqrt(inf) = +0
        term = _mul(prod, _ZERO)
    elif c == 0:  # 1 / sqrt(0) = +inf
        term = _mul(prod, INF)
    elif isinstance(prod, float) or prod == 0:  # +-inf or +-0 times a positive finite number
        term = prod
    else:
        term = None  # finite, nonzero: s * sqrt(prod**2 / c)
    if term is not None:
        return _out(term if b is None else _add(term, b), fmt)
    if isinstance(b, float) and b != 0:
        return b  # +-inf (NaN was handled)
    bias = _ZERO if b is None or b == 0 else b
    q = prod * prod / c
    s = -1 if prod < 0 else 1
    d = -bias  # y == 0 iff s * sqrt(q) == -b exactly: then +0 (an exact cancellation)
    if d != 0 and (d > 0) == (s > 0) and d * d == q:
        return 0.0
    return round_sqrt_form(s, q, bias, fmt)


def _normalize_group(xs: list, ws: list, bs: list, eps, fmt: Format) -> list:
    """``(x - mean) / sqrt(var + eps) * w + b`` over one group: exact mean, biased ``var = M2 / n``."""
    mu, m2 = _moments(xs)
    c = _add(_div_count(m2, len(xs)) if not isinstance(m2, float) else m2, eps)
    minus_mu = _neg(mu)
    return [_normalized(_add(_ext(x), minus_mu), c, w, b, fmt) for x, w, b in zip(xs, ws, bs)]


def _optional(v, name, op):
    return None if v is None else operand(v, name, op)


def _per_element(o, count: int) -> list:
    """An optional affine operand as a list of extended values (None when absent)."""
    return [None] * count if o is None else [_ext(v) for v in _f64(o).reshape(-1).tolist()]


def _check_shape(op, name, o, shape):
    if o is not None and tuple(o.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}; got {name}.shape={tuple(o.shape)}.")


def _eps(op, eps, name="eps"):
    try:
        return _ext(float(eps))
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a float; got {name}={eps!r}.") from None


def _shape_arg(op, normalized_shape) -> tuple:
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    try:
        return tuple(operator.index(v) for v in normalized_shape)
    except TypeError:
        raise TypeError(
            f"{op}: normalized_shape must be an int or a sequence of ints; got {normalized_shape!r}."
        ) from None


def _norm_operands(op, input, normalized_shape, affine: dict):  # noqa: A002
    x = operand(input, "input", op)
    ns = _shape_arg(op, normalized_shape)
    if len(ns) > len(x.shape) or tuple(x.shape[len(x.shape) - len(ns) :]) != ns:
        raise ValueError(
            f"{op}: normalized_shape must equal the trailing dimensions of input.shape; "
            f"got normalized_shape={ns} and input.shape={tuple(x.shape)}."
        )
    ops = {k: _optional(v, k, op) for k, v in affine.items()}
    for k, o in ops.items():
        _check_shape(op, k, o, ns)
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    return x, ns, ops, tensor


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    """Ground truth of ``F.layer_norm``, each element rounded once to ``input``'s dtype.

    Over the last ``len(normalized_shape)`` dims: ``y = (x - mu) / sqrt(var + eps) * weight + bias``
    with ``mu`` the exact mean, ``var`` the BIASED variance ``M2 / n`` with the exact mean, ``eps`` the
    exact float64 value of the Python float, the square root and the division real-valued. weight
    and bias (shape ``normalized_shape``, any float dtype) enter exactly. A row with a NaN or inf
    (so var is NaN): every element NaN. ``var + eps == 0`` (constant row, eps 0): ``0 / 0``, NaN,
    as torch gives.
    """
    op = "truth.layer_norm"
    x, ns, ops, tensor = _norm_operands(op, input, normalized_shape, {"weight": weight, "bias": bias})
    e = _eps(op, eps)
    k = math.prod(ns)
    ws, bs = _per_element(ops["weight"], k), _per_element(ops["bias"], k)
    rows = _f64(x).reshape(-1, k) if k else np.zeros((0, 0))
    out = np.array([_normalize_group(r, ws, bs, e, x.fmt) for r in rows.tolist()], dtype=np.float64)
    return _finish(out.reshape(x.shape), x.fmt, tensor)


# eps=None of F.rms_norm: the epsilon of torch's opmath type (float32 for half inputs), per input dtype
_FINFO_EPS = {name: Fraction(2) ** (1 - max(f.prec, 24)) for name, f in FORMATS.items()}


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):  # noqa: A002
    """Ground truth of ``F.rms_norm``: ``y = x / sqrt(mean(x**2) + eps) * weight``, rounded once.

    ``mean(x**2)`` exact over the last ``len(normalized_shape)`` dims; ``eps`` None means the
    epsilon of torch's opmath type, as its kernels take it (fp16, bf16, fp32: 2**-23; fp64: 2**-52). A NaN in
    the row: every element NaN; an inf (and no NaN): ``mean(x**2) = inf``, so the inf elements are
    NaN (``inf * 0``) and the finite ones +-0, as IEEE and torch give.
    """
    op = "truth.rms_norm"
    x, ns, ops, tensor = _norm_operands(op, input, normalized_shape, {"weight": weight})
    e = _FINFO_EPS[x.fmt.name] if eps is None else _eps(op, eps)
    k = math.prod(ns)
    ws = _per_element(ops["weight"], k)
    out = []
    for row in (_f64(x).reshape(-1, k) if k else np.zeros((0, 0))).tolist():
        c = _add(_mean_square(row), e)
        out.append([_normalized(_ext(v), c, w, None, x.fmt) for v, w in zip(row, ws)])
    return _finish(np.array(out, dtype=np.float64).reshape(x.shape), x.fmt, tensor)


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    """Ground truth of ``F.group_norm``: input ``(N, C, *)``; the exact mean and biased variance over each
    group of ``C / num_groups`` channels and every spatial position, the affine step per channel, as
    :func:`layer_norm` does per row."""
    op = "truth.group_norm"
    x = operand(input, "input", op)
    if len(x.shape) < 2:
        raise ValueError(f"{op}: input must have shape (N, C, *); got input.shape={tuple(x.shape)}.")
    n, c = x.shape[0], x.shape[1]
    g = operator.index(num_groups)
    if g <= 0 or c % g:
        raise ValueError(f"{op}: the channels must split into num_groups groups; got C={c} and num_groups={g}.")
    ops = {k: _optional(v, k, op) for k, v in (("weight", weight), ("bias", bias))}
    for k, o in ops.items():
        _check_shape(op, k, o, (c,))
    e = _eps(op, eps)
    spatial = math.prod(x.shape[2:])
    per = c // g
    ws = [w for w in _per_element(ops["weight"], c) for _ in range(spatial)]
    bs = [b for b in _per_element(ops["bias"], c) for _ in range(spatial)]
    blocks = _f64(x).reshape(n, g, per * spatial)
    out = np.empty(blocks.shape)
    for i in range(n):
        for j in range(g):
            lo = j * per * spatial
            hi = lo + per * spatial
            out[i, j] = _normalize_group(blocks[i, j].tolist(), ws[lo:hi], bs[lo:hi], e, x.fmt)
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    return _finish(out.reshape(x.shape), x.fmt, tensor)


def _running_update(old, momentum, batch, fmt: Format) -> float:
    """``(1 - momentum) * old + momentum * batch``, exact (IEEE for specials), rounded once."""
    return _out(_add(_mul(_add(Fraction(1), _neg(momentum)), old), _mul(momentum, batch)), fmt)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,  # noqa: A002
               momentum: float = 0.1, eps: float = 1e-5, *, return_running_stats: bool = False):  # fmt: skip
    """Ground truth of ``F.batch_norm`` (channel dim 1; input ``(N, C)`` or ``(N, C, *)``), rounded once.

    Eval (``training=False``): ``y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * w[c] + b[c]``,
    each element by IEEE's rules on its own (an inf running_var gives ``b``, a negative one NaN).
    Training: the exact batch mean and BIASED batch variance over ``(N, *)`` per channel normalise
    the output (a channel holding a NaN or inf is NaN); torch would store
    ``(1 - momentum) * running_mean + momentum * batch_mean`` and
    ``(1 - momentum) * running_var + momentum * M2 / (n - 1)`` (the UNBIASED variance), each real-valued
    with ``momentum`` the exact float64 value, rounded once to running_mean's / running_var's dtype.
    Inputs are never mutated. ``return_running_stats=True`` returns ``(output, new_running_mean,
    new_running_var)`` (eval mode: the running stats unchanged; None stays None). Training with one
    value per channel is a ValueError, as torch raises; an empty input (any shape) gives an empty output.
    """
    op = "truth.batch_norm"
    x = operand(input, "input", op)
    if math.prod(x.shape) == 0:  # as torch: an empty input gives an empty output, its statistics not read
        given = (running_mean, running_var, weight, bias)
        tensor = x.torch or any(type(v).__module__.startswith("torch") for v in given if v is not None)
        y = _finish(np.empty(tuple(x.shape)), x.fmt, tensor)
        return (y, running_mean, running_var) if return_running_stats else y
    if len(x.shape) < 2:
        raise ValueError(f"{op}: input must have shape (N, C) or (N, C, *); got input.shape={tuple(x.shape)}.")
    n, c = x.shape[0], x.shape[1]
    given = {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias}
    ops = {k: _optional(v, k, op) for k, v in given.items()}
    for k, o in ops.items():
        _check_shape(op, k, o, (c,))
    tensor = x.torch or any(o.torch for o in ops.values() if o is not None)
    e = _eps(op, eps)
    m = _eps(op, momentum, "momentum")
    rm, rv = _per_element(ops["running_mean"], c), _per_element(ops["running_var"], c)
    ws, bs = _per_element(ops["weight"], c), _per_element(ops["bias"], c)
    spatial = math.prod(x.shape[2:])
    chans = np.moveaxis(_f64(x).reshape(n, c, spatial), 1, 0).reshape(c, n * spatial)
    count = chans.shape[1]
    out = np.empty(chans.shape)
    new_rm, new_rv = [], []
    if training:
        if count == 1:
            raise ValueError(
                f"{op}: expected more than 1 value per channel when training; got input.shape={tuple(x.shape)}."
            )
        for j, vals in enumerate(chans.tolist()):
            mu, m2 = _moments(vals)
            unbiased = m2 if isinstance(m2, float) else _div_count(m2, count - 1) if count > 1 else NAN
            out[j] = _normalize_group(vals, [ws[j]] * count, [bs[j]] * count, e, x.fmt)
            if ops["running_mean"] is not None:
                new_rm.append(_running_update(rm[j], m, mu, ops["running_mean"].fmt))
            if ops["running_var"] is not None:
                new_rv.append(_running_update(rv[j], m, unbiased, ops["running_var"].fmt))
    else:
        if ops["running_mean"] is None or ops["running_var"] is None:
            raise ValueError(f"{op}: running_mean and running_var are required when training=False; got None.")
        for j, vals in enumerate(chans.tolist()):
            cj = _add(rv[j], e)
            minus = _neg(rm[j])
            out[j] = [_normalized(_add(_ext(v), minus), cj, ws[j], bs[j], x.fmt) for v in vals]
        new_rm = _f64(ops["running_mean"]).tolist()
        new_rv = _f64(ops["running_var"]).tolist()
    y = _finish(np.moveaxis(out.reshape(c, n, spatial), 0, 1).reshape(x.shape), x.fmt, tensor)
    if not return_running_stats:
        return y
    stats = []
    for key, vals in (("running_mean", new_rm), ("running_var", new_rv)):
        o = ops[key]
        stats.append(None if o is None else _finish(np.array(vals, dtype=np.float64), o.fmt, tensor))
    return (y, *stats)
