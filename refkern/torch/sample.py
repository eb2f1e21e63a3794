"""A deterministic sample of an op's output elements, as a smaller call of the same op.

``restrict(op, actual, args, kwargs, n)`` picks at most ``n`` output elements on an evenly spaced
sub-grid and returns the call that computes exactly those (and those elements of ``actual``): the
reference of the smaller call is the reference of the sampled elements, exactly, so the verdict on
it is exact for them; its statistics (maxima, the counts of elements beyond a bound, the per-channel
structure) are those of the sample. It holds no numerics: it selects rows, columns, channels and
strided positions, and pads with zeros where the op pads with zeros.

- linear, matmul: a sub-grid of rows and columns (and batch entries);
- conv1d/2d/3d: batch entries, output channels (whole groups when ``groups > 1``) and, along each
  spatial axis, every ``step``-th output position (the same convolution with ``stride * step`` on the
  zero-padded input);
- softmax, log_softmax, layer_norm, rms_norm: a subset of the rows (every element of a chosen row);
- batch_norm in eval mode (elementwise per channel): batch entries, channels and strided positions.
Other ops (transposed convolutions, attention, batch norm in training, pools, reductions) are judged
whole.
"""

import math

import torch
import torch.nn.functional as F

import refkern.ops as _ops

__all__ = ["restrict"]


def _even(size, k):
    """k evenly spaced indices in range(size), first and last included."""
    if k >= size:
        return torch.arange(size)
    return torch.linspace(0, size - 1, k).round().long().unique()


def _shrink(sizes, n):
    """Counts per axis, each at most its size, halved (largest first) until their product is at most n."""
    counts = list(sizes)
    while math.prod(counts) > n and max(counts) > 1:
        i = max(range(len(counts)), key=lambda j: counts[j])
        counts[i] = -(-counts[i] // 2)
    return counts


def restrict(op, actual, args, kwargs, n):
    """(actual at the sample, args, kwargs) of the smaller call, or None when ``op`` is judged whole."""
    rec = _ops.REGISTRY.get(op)
    if rec is None or rec.sample is None:
        return None
    fn = _KINDS[rec.sample]
    if rec.sample == "rows":
        return fn(actual, tuple(args), dict(kwargs), n, op)
    return fn(actual, tuple(args), dict(kwargs), n)


def _linear(actual, args, kwargs, n):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x.dim() < 1 or w.dim() != 2:
        return None
    k = x.shape[-1]
    x2, a2 = x.reshape(-1, k), actual.reshape(-1, w.shape[0])
    r, c = _shrink([x2.shape[0], w.shape[0]], n)
    rows, cols = _even(x2.shape[0], r), _even(w.shape[0], c)
    b = bias[cols] if isinstance(bias, torch.Tensor) and bias.dim() == 1 else bias
    if isinstance(bias, torch.Tensor) and bias.dim() != 1:
        return None
    return a2[rows][:, cols], (x2[rows], w[cols], b), kwargs


def _matmul(actual, args, kwargs, n):
    a, b = args
    if a.dim() < 2 or b.dim() < 2:
        return None
    same_batch = a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0]
    if a.dim() > 2 and not same_batch:
        return None
    sizes = ([a.shape[0]] if same_batch else []) + [a.shape[-2], b.shape[-1]]
    counts = _shrink(sizes, n)
    rows, cols = _even(a.shape[-2], counts[-2]), _even(b.shape[-1], counts[-1])
    if same_batch:
        bt = _even(a.shape[0], counts[0])
        a, b, actual = a[bt], b[bt], actual[bt]
    return actual[..., rows, :][..., cols], (a[..., rows, :], b[..., cols]), kwargs


def _tuple(v, nd):
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    return t * nd if len(t) == 1 else t


def _conv(actual, args, kwargs, n):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    nd = w.dim() - 2
    if kwargs.get("padding_mode", "zeros") != "zeros" or isinstance(kwargs.get("padding"), str):
        return None
    stride, pad = _tuple(kwargs.get("stride", 1), nd), _tuple(kwargs.get("padding", 0), nd)
    dil, groups = _tuple(kwargs.get("dilation", 1), nd), kwargs.get("groups", 1)
    cout = w.shape[0]
    per = cout // groups
    spatial = list(actual.shape[2:])
    budget = max(1, n // per) if groups > 1 else n  # a group brings all its output channels
    counts = _shrink([x.shape[0], groups if groups > 1 else cout, *spatial], budget)
    bt = _even(x.shape[0], counts[0])
    if groups > 1:  # whole groups: each keeps its input channels
        gs = _even(groups, counts[1])
        ocs = (gs[:, None] * per + torch.arange(per)).reshape(-1)
        cin = x.shape[1] // groups
        ics = (gs[:, None] * cin + torch.arange(cin)).reshape(-1)
        xs, ng = x[bt][:, ics], len(gs)
    else:
        ocs = _even(cout, counts[1])
        xs, ng = x[bt], 1
    steps = [-(-o // c) for o, c in zip(spatial, counts[2:])]
    flat = [q for p in reversed(pad) for q in (p, p)]  # F.pad: last axis first
    xs = F.pad(xs, flat) if any(pad) else xs
    b = bias[ocs] if isinstance(bias, torch.Tensor) else bias
    sub = actual[bt][:, ocs]
    for d, s in enumerate(steps):
        sub = sub[(slice(None),) * (2 + d) + (slice(None, None, s),)]
    kw = dict(stride=tuple(st * s for st, s in zip(stride, steps)), padding=0, dilation=dil, groups=ng)
    return sub, (xs, w[ocs], b), kw


def _batch_norm(actual, args, kwargs, n):
    """In eval mode a batch norm is elementwise per channel: batch entries, channels and strided positions."""
    if kwargs.get("training"):
        return None  # its statistics come from every element
    x, rm, rv = args
    if x.dim() < 2:
        return None
    spatial = list(x.shape[2:])
    counts = _shrink([x.shape[0], x.shape[1], *spatial], n)
    bt, ch = _even(x.shape[0], counts[0]), _even(x.shape[1], counts[1])
    sel = (slice(None), slice(None)) + tuple(slice(None, None, -(-o // c)) for o, c in zip(spatial, counts[2:]))
    xs, sub = x[bt][:, ch][sel], actual[bt][:, ch][sel]
    kw = dict(kwargs)
    for k in ("weight", "bias"):
        if isinstance(kw.get(k), torch.Tensor):
            kw[k] = kw[k][ch]
    return sub, (xs, rm[ch], rv[ch]), kw


def _rows(actual, args, kwargs, n, op):
    x = args[0]
    if op in ("softmax", "log_softmax"):
        dim = kwargs["dim"] % x.dim()
        xm, am = x.movedim(dim, -1), actual.movedim(dim, -1)
        length = xm.shape[-1]
        x2, a2 = xm.reshape(-1, length), am.reshape(-1, length)
        rows = _even(x2.shape[0], max(1, n // max(length, 1)))
        return a2[rows], (x2[rows],), {**kwargs, "dim": -1}
    shape = tuple(kwargs["normalized_shape"])
    m = math.prod(shape)
    x2, a2 = x.reshape(-1, m), actual.reshape(-1, m)
    rows = _even(x2.shape[0], max(1, n // max(m, 1)))
    return a2[rows].reshape(-1, *shape), (x2[rows].reshape(-1, *shape),), kwargs


# the registry's sample kinds (:data:`refkern.ops.SAMPLE_KINDS`) -> the function that shrinks such a call
_KINDS = {"linear": _linear, "matmul": _matmul, "conv": _conv, "batch_norm": _batch_norm, "rows": _rows}
