"""``refkern.backward`` and ``refkern.compare_backward``: the exact gradients of the products and
convolutions, each one *adjoint call* of an exact forward kernel.

The gradient of a sum of products with respect to one of its factors is again a sum of
products: every forward term ``l * r`` that reaches output element I puts the term
``grad_output[I] * r`` into the gradient of l's element. Each gradient element is therefore
an exact sum of products, and computing it as one forward call of an exact refkern kernel (on
rearranged operands) gives it correctly rounded, rounded once, in the argument's dtype (as torch
returns it). The adjoint calls:

* ``linear(x, W, b)``: grad_x = ``matmul(grad_output, W)``; grad_W = ``matmul(g2.T, x2)`` with the
  leading dimensions flattened (g2: (M, out), x2: (M, in)); grad_b = ``sum(g2, dim=0)``.
* ``matmul(a, b)`` (torch.matmul semantics): grad_a = ``matmul(G, B^T)`` and grad_b =
  ``matmul(A^T, G)`` per batch element; the batch dimensions over which an operand was broadcast
  are moved into the reduction dimension K, so a broadcast operand's gradient is still one
  exact sum, rounded once (torch sums rounded per-batch products).
* ``conv{n}d(x, W, b, stride s, padding (lo, hi), dilation d, groups)`` (padding_mode "zeros"): grad_x =
  ``conv_transpose{n}d(grad_output, W, stride=s, padding=lo, output_padding=lo - hi + rem,
  dilation=d, groups)`` (rem: the positions past the last window); grad_W = ``conv{n}d(X'', G'',
  stride=d, dilation=s, groups)`` with X'' the padded input as (C_in / groups, groups * N, ...)
  (batch and channels swapped) and G'' grad_output as (C_out, N, ...); grad_b = ``sum`` over the
  batch and spatial dimensions. With padding_mode "reflect", "replicate" or "circular" (the padded
  input a gather of x), grad_x is one exact sum per element over every (output, tap) pair whose
  padded position holds it: a batched ``matmul`` of gathered rows (:class:`_Fold`).
* ``cumsum(x, dim)``: grad_x = ``cumsum(flip(grad_output, dim), dim)`` flipped back; ``dot(x, y)``: grad_x =
  ``matmul(g[None], y[None, :])`` (one product per element), grad_y likewise.
* ``conv_transpose{n}d(input, W, b, stride s, padding p, output_padding a, groups, dilation d)``:
  grad_input = ``conv{n}d(G_p, W, stride=s, dilation=d, groups)`` with G_p grad_output padded by
  (p, p - a) zeros; grad_W = ``conv{n}d(G_p'', X'', stride=d, dilation=s, groups)``; grad_b = ``sum``.

:func:`compare_backward` judges a backend's gradient by :func:`refkern.compare` on the same adjoint
call, so the bounds, emulated precisions and structure tests of the forward op apply unchanged;
its Reports index the adjoint call's output (the gradient itself, or its transpose for grad_W
of a convolution).
"""

import difflib
import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from refkern._arrays import is_tensor, operand

__all__ = ["backward", "compare_backward", "adjoints", "differentiable", "Adjoint", "OPS"]

_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
_KEYWORDS = ("dtype", "correction", "keepdim")  # the keyword-only arguments of an op that change its gradient


def _identity(a):
    return a


@dataclass
class Adjoint:
    """The forward call whose exact result is one gradient: ``getattr(refkern, op)(*args, **kwargs)``,
    mapped to the gradient's layout by ``to_grad`` (and a gradient to the call's layout by
    ``from_grad``). ``judge``: None, or a function giving another exact formulation of the same
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

    def run(self):
        from refkern import ops

        if self.compute is not None:
            return self.compute()
        return self.to_grad(ops.get(self.op).reference(*self.args, **self.kwargs))


# ---------------------------------------------------------------- arrays or tensors, in their own dtype


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


# ---------------------------------------------------------------- binding the call


def _bind(op, args, kwargs, who):
    from refkern import ops

    fn = ops.get(op, who).reference
    sig = inspect.signature(fn)
    names = [p for p, v in sig.parameters.items() if v.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p, v in sig.parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p in _KEYWORDS]
    for k in kwargs:
        if k not in names and k not in keyword:
            near = difflib.get_close_matches(k, names, n=1)
            hint = f" Did you mean {near[0]}=?" if near else f" It takes {', '.join(names)}."
            raise TypeError(f"{who}: {op} has no argument {k!r}.{hint}")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{who}: {op} takes ({', '.join(names)}); {exc}.") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _check_grad(op, g, want_shape, like, like_name, who):
    og, ol = operand(g, "grad_output", who), operand(like, like_name, who)
    if og.fmt.name != ol.fmt.name:
        raise TypeError(
            f"{who}: grad_output must have the dtype of the output of {op}, {ol.fmt.name}; "
            f"got grad_output.dtype={og.fmt.name}."
        )
    if tuple(og.shape) != tuple(want_shape):
        raise ValueError(
            f"{who}: grad_output must have the shape of the output of {op}, {tuple(want_shape)}; "
            f"got grad_output.shape={tuple(og.shape)}."
        )


# ---------------------------------------------------------------- linear and matmul


def _linear(op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import linear_operands

    x, w, b = a["x"], a["weight"], a["bias"]
    _, _, _, shape = linear_operands(plan(op, {"x": x, "weight": w, "bias": b}, ("x", "weight"), "exact", None))
    _check_grad(op, g, shape, x, "x", who)
    sx, sw = _shape(x), _shape(w)
    lead, n_in = sx[:-1], sx[-1]
    m = math.prod(lead)
    out = {}
    if "x" in wrt:
        if len(sw) == 2:
            out["x"] = Adjoint("x", "matmul", (g, w))
        else:  # y[...] = sum_k x[..., k] w[k]: grad_x[..., k] = g[...] w[k], one term
            out["x"] = Adjoint("x", "matmul", (g.reshape(lead + (1,) if lead else (1,)), w.reshape((1, n_in))))
    if "weight" in wrt:
        x2 = x.reshape((m, n_in))
        if len(sw) == 2:
            out["weight"] = Adjoint("weight", "matmul", (_perm(g.reshape((m, sw[0])), (1, 0)), x2))
        else:
            out["weight"] = Adjoint("weight", "matmul", (g.reshape((m,)), x2))
    if "bias" in wrt:
        if _shape(b) == () or len(sw) == 1:
            out["bias"] = Adjoint("bias", "sum", (g,), judge=lambda: _ones_judge(g.reshape((math.prod(_shape(g)),))))
        else:
            g2 = g.reshape((m, sw[0]))
            out["bias"] = Adjoint("bias", "sum", (g2,), {"dim": 0}, judge=lambda: _ones_judge(g2))
    return out


def _swap_last(a):
    return _perm(a, (*range(a.ndim - 2), a.ndim - 1, a.ndim - 2))


def _split_batch(batch, own):
    """Batch axes (of the broadcast ``batch``) an operand with batch shape ``own`` keeps, and those
    it was broadcast over (to be summed)."""
    lead = len(batch) - len(own)
    padded = (1,) * lead + tuple(own)
    kept = [i for i in range(len(batch)) if i >= lead and padded[i] == batch[i]]
    return kept, [i for i in range(len(batch)) if i not in kept]


def _matmul(op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands

    A, B = a["a"], a["b"]
    _, _, _, _, shape = matmul_operands(plan(op, {"a": A, "b": B}, ("a", "b"), "exact", None))
    _check_grad(op, g, shape, A, "a", who)
    sa, sb = _shape(A), _shape(B)
    A2 = A.reshape((1,) + sa) if len(sa) == 1 else A
    B2 = B.reshape(sb + (1,)) if len(sb) == 1 else B
    (m, k), n = _shape(A2)[-2:], _shape(B2)[-1]
    ba, bb = _shape(A2)[:-2], _shape(B2)[:-2]
    batch = tuple(np.broadcast_shapes(ba, bb))
    nb = len(batch)
    G = g.reshape(batch + (m, n))
    out = {}
    if "a" in wrt:  # grad_a[.., i, p] = sum over (broadcast axes, j) of G[.., i, j] B[.., p, j]
        kept, red = _split_batch(batch, ba)
        r = math.prod(batch[i] for i in red)
        L = _perm(G, kept + [nb] + red + [nb + 1]).reshape(ba + (m, r * n))
        R = _perm(_bcast(B2, batch + (k, n)), kept + red + [nb + 1, nb]).reshape(ba + (r * n, k))
        if len(sa) == 1:  # a row: the product is 1-D
            L = L.reshape((r * n,))
        judge = None
        if r > 1:  # broadcast: torch sums the per-batch products; judge as taps (one per broadcast element)

            def judge(kept=kept, red=red, r=r):
                q = math.prod(ba)
                lt = _perm(G, kept + red + [nb, nb + 1]).reshape((q, r, m, n))
                rt = _perm(_bcast(B2, batch + (k, n)), kept + red + [nb + 1, nb]).reshape((q, r, n, k))
                return _tap_judge(
                    "a",
                    lt,
                    rt,
                    lambda v: _swap_last(v.reshape((q, k, m))).reshape(sa),
                    lambda v: _swap_last(v.reshape((q, m, k))).reshape((1, q * k, m)),
                )

        out["a"] = Adjoint("a", "matmul", (L, R), judge=judge)
    if "b" in wrt:  # grad_b[.., p, j] = sum over (broadcast axes, i) of A[.., i, p] G[.., i, j]
        kept, red = _split_batch(batch, bb)
        r = math.prod(batch[i] for i in red)
        L = _perm(_bcast(A2, batch + (m, k)), kept + [nb + 1] + red + [nb]).reshape(bb + (k, r * m))
        R = _perm(G, kept + red + [nb, nb + 1]).reshape(bb + (r * m, n))
        if len(sb) == 1:  # a column: the product is 1-D
            R = R.reshape((r * m,))
        judge = None
        if r > 1:

            def judge(kept=kept, red=red, r=r):
                q = math.prod(bb)
                lt = _perm(_bcast(A2, batch + (m, k)), kept + red + [nb + 1, nb]).reshape((q, r, k, m))
                rt = _perm(G, kept + red + [nb, nb + 1]).reshape((q, r, m, n))
                return _tap_judge(
                    "b",
                    lt,
                    rt,
                    lambda v: _swap_last(v.reshape((q, n, k))).reshape(sb),
                    lambda v: _swap_last(v.reshape((q, k, n))).reshape((1, q * n, k)),
                )

        out["b"] = Adjoint("b", "matmul", (L, R), judge=judge)
    return out


# ---------------------------------------------------------------- convolutions


def _conv_pads(op, nd, padding, dilation, ksize):
    from refkern.ops._args import spatial as _pair

    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * nd
        return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, ksize)]
    return [(q, q) for q in _pair(padding, "padding", op, nd, 0)]


def _bias_sum(g, unbatched):
    """grad_bias of a convolution: the sum of grad_output over every axis but the channels'. Judged as one
    reduction (:func:`_ones_judge`), or else, batched, as a :func:`_tap_judge` whose taps are the images
    (torch's half kernels sum each image's positions in fp32 and add the images in the result dtype)."""
    ch = 0 if unbatched else 1
    dims = tuple(i for i in range(g.ndim) if i != ch)
    g2 = _perm(g, (*dims, ch)).reshape((-1, _shape(g)[ch]))
    alt = None if unbatched or _shape(g)[0] < 2 else lambda: _bias_tap_judge(g)
    return Adjoint("bias", "sum", (g,), {"dim": dims}, judge=lambda: _ones_judge(g2), judge_alt=alt)


def _bias_tap_judge(g):
    """grad_bias[c] = sum_n (sum_o g[n, c, o] * 1) as a :func:`_tap_judge` over the images n (positions:
    the channels; reduced: the output positions o, against ones)."""
    n, c = _shape(g)[:2]
    o = math.prod(_shape(g)[2:])
    ones = g.new_ones((1, n, o, 1)) if is_tensor(g) else np.ones((1, n, o, 1), g.dtype)
    return _tap_judge("bias", g.reshape((1, n, c, o)), ones, lambda v: v.reshape((c,)), lambda v: v.reshape((1, 1, c)))


def _ones_judge(g2):
    """A sum over the rows of ``g2`` (R, C) (or all of a 1-D ``g2``) as ``matmul(ones(R), g2)``: the
    products by one are exact, so its value is the sum's, and the analysis is that of a reduction of
    length R (statistical, with the emulated accumulators), not the envelope of any summation."""
    r = _shape(g2)[0]
    ones = g2.new_ones((r,)) if is_tensor(g2) else np.ones(r, g2.dtype)
    return Adjoint("bias", "matmul", (ones, g2))


def _swap01(a):
    return _perm(a, (1, 0, *range(2, a.ndim)))


def _conv(nd, op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.conv import conv_padded

    x, w, b = a["x"], a["weight"], a["bias"]
    mode = a["padding_mode"]
    p = plan(op, {"x": x, "weight": w, "bias": b}, ("x", "weight"), "exact", None)
    _, _, _, groups, stride, dilation, unbatched = conv_padded(p, nd, a["stride"], a["padding"], a["dilation"],
                                                               a["groups"], mode)  # fmt: skip
    sx, sw = _shape(x), _shape(w)
    ksize, in_size = sw[2:], sx[-nd:]
    pads = _conv_pads(op, nd, a["padding"], dilation, ksize)
    span = [s + lo + hi - dl * (k - 1) - 1 for s, (lo, hi), dl, k in zip(in_size, pads, dilation, ksize)]
    o_size = tuple(q // st + 1 for q, st in zip(span, stride))
    rem = [q % st for q, st in zip(span, stride)]  # padded positions past the last window
    c_out, cin_g = sw[0], sw[1]
    n = 1 if unbatched else sx[0]
    _check_grad(op, g, ((c_out,) if unbatched else (n, c_out)) + o_size, x, "x", who)
    gb = g.reshape((1,) + _shape(g)) if unbatched else g
    spatial = tuple(range(2, 2 + nd))
    out = {}
    if "x" in wrt and mode != "zeros":
        geo = _Fold(nd, in_size, pads, mode, o_size, ksize, stride, dilation, groups, unbatched)
        out["x"] = geo.adjoint(g, w, who)
    elif "x" in wrt:
        outpad = [lo - hi + r for (lo, hi), r in zip(pads, rem)]
        crop = [max(-q, 0) for q in outpad]  # "same" with an odd total: the transposed conv is one longer
        kw = dict(stride=stride, padding=tuple(lo for lo, _ in pads), output_padding=tuple(max(q, 0) for q in outpad),
                  groups=groups, dilation=dilation)  # fmt: skip
        lead = 1 if unbatched else 2
        to_grad = _identity
        judge = None
        if any(crop):

            def to_grad(v, crop=crop, lead=lead):  # noqa: E306
                return v[(slice(None),) * lead + tuple(slice(0, s - c) for s, c in zip(_shape(v)[lead:], crop))]

            def judge(nd=nd, g=g, w=w, kw=kw, crop=crop, dilation=dilation):  # noqa: E306
                return _same_judge(nd, g, w, kw, crop, dilation)

        out["x"] = Adjoint("x", f"conv_transpose{nd}d", (g, w), kw, to_grad=to_grad, judge=judge)
    if "weight" in wrt:
        xb = x.reshape((1,) + sx) if unbatched else x
        xp = _pad(_pad(xb, pads, mode), [(0, -r) for r in rem])  # drop what no window reaches
        sp = _shape(xp)[2:]
        xs = _perm(xp.reshape((n, groups, cin_g) + sp), (2, 1, 0, *spatial[1:], 2 + nd)).reshape((cin_g, groups * n)
                                                                                                  + sp)  # fmt: skip
        out["weight"] = Adjoint("weight", f"conv{nd}d", (xs, _swap01(gb)),
                                dict(stride=dilation, dilation=stride, groups=groups), to_grad=_swap01,
                                from_grad=_swap01, judge=lambda: _weight_judge(xp, gb, ksize, o_size, stride,
                                                                               dilation, groups))  # fmt: skip
    if "bias" in wrt:
        out["bias"] = _bias_sum(g, unbatched)
    return out


class _Fold:
    """grad_x of a convolution whose padding_mode is "reflect", "replicate" or "circular".

    The padded input is a gather, ``x_p[j] = x[idx(j)]`` (per dimension, ``idx`` as ``np.pad`` with the
    mode builds it), so the gradient of input element i is the sum of the gradients of every padded
    position that holds it: ``grad_x[i] = sum_{(o, t): idx(o s + t d) = i} w[t] grad_output[o]`` (over
    the channels of the group too). That is one sum of products per element, computed here as one
    exact reduction (never as a rounded sum of rounded per-position gradients): as a batched matmul
    of two gathered operands, a row per input element whose terms are the pairs (output channel,
    (o, t)) that reach it, rows of fewer terms filled with ``-0 * +0`` (a -0 term, which changes no
    sum, not even the sign of a zero), a row that nothing reaches given one ``+0 * +0`` (the empty
    sum is +0). ``compute``: the elements that only one padded position holds
    (the interior) are that position's transposed convolution, exact, and only the border elements
    (those some dimension folds more than once) are gathered, in chunks; ``judge`` (what
    compare_backward analyses) gathers every element: N * C_in * L * K_max values per operand for
    K_max terms per row."""

    LIMIT = 1 << 27  # gathered values per operand of the judge (1 GiB of float64): beyond it, no judge

    def __init__(self, nd, in_size, pads, mode, o_size, ksize, stride, dilation, groups, unbatched):
        self.nd, self.in_size, self.pads, self.o_size = nd, tuple(in_size), pads, tuple(o_size)
        self.ksize, self.stride, self.dilation, self.groups, self.unbatched = ksize, stride, dilation, groups, unbatched
        self.pairs = []  # per dimension, per input position: the (o, t) whose padded position holds it
        self.mult = []  # per dimension, per input position: how many padded positions hold it
        self.parts = []  # per dimension, per input position: its pairs per padded position, in order
        for q in range(nd):
            lo, hi = pads[q]
            size = in_size[q]
            idx = np.pad(np.arange(size), (lo, hi), mode=_PAD_MODES[mode])
            per = [[] for _ in range(size)]
            part = [{} for _ in range(size)]
            for o in range(o_size[q]):
                for t in range(ksize[q]):
                    j = o * stride[q] + t * dilation[q]
                    per[idx[j]].append((o, t))
                    part[idx[j]].setdefault(j, []).append((o, t))
            self.pairs.append(per)
            self.parts.append([[v for _, v in sorted(d.items())] for d in part])
            self.mult.append(np.bincount(idx, minlength=size))

    def _rows(self, positions):
        """(o_index, t_index) of shape (P, M): the flat output position and flat tap of every pair of
        each spatial position (multi-indices), padded with -1 to the longest row."""
        rows = []
        for pos in positions:
            per = [self.pairs[q][pos[q]] for q in range(self.nd)]
            o = np.zeros(1, np.int64)
            t = np.zeros(1, np.int64)
            for q in range(self.nd):  # the product of the per-dimension pair lists, flat indices
                oq = np.array([p[0] for p in per[q]], np.int64)
                tq = np.array([p[1] for p in per[q]], np.int64)
                o = (o[:, None] * self.o_size[q] + oq[None, :]).reshape(-1)
                t = (t[:, None] * self.ksize[q] + tq[None, :]).reshape(-1)
            rows.append((o, t))
        m = max(1, max(len(o) for o, _ in rows))
        oi = np.full((len(rows), m), -1, np.int64)
        ti = np.full((len(rows), m), -1, np.int64)
        for r, (o, t) in enumerate(rows):
            oi[r, : len(o)] = o
            ti[r, : len(t)] = t
        return oi, ti

    def call(self, g, w, positions, rows=None):
        """(A, B) of ``matmul(A, B)`` whose (N, C_in, P, 1, 1) output is grad_x at ``positions``
        (``rows``: their :meth:`_rows`, when known)."""
        gb = g.reshape((1,) + _shape(g)) if self.unbatched else g
        n, c_out = _shape(gb)[:2]
        cin_g = _shape(w)[1]
        c_in, cout_g = cin_g * self.groups, c_out // self.groups
        oi, ti = self._rows(positions) if rows is None else rows
        o_flat, t_flat = math.prod(self.o_size), math.prod(self.ksize)
        empty = oi[:, 0] < 0  # an element no pair reaches: its gradient is the empty sum, +0
        oi[oi < 0], ti[ti < 0] = o_flat, t_flat  # the filler slot: -0 in g, +0 in w
        oi[empty, 0] = o_flat + 1  # a +0 term, so that the empty sum is +0, not -0
        g2 = _cat(_cat(gb.reshape((n, c_out, o_flat)), -0.0), 0.0)
        w2 = _cat(w.reshape((c_out, cin_g, t_flat)), 0.0)
        ch = (np.arange(c_in) // cin_g)[:, None] * cout_g + np.arange(cout_g)[None, :]  # (C_in, cout_g)
        cl = np.arange(c_in) % cin_g
        p, m = oi.shape
        a = _index(g2, (slice(None), ch[:, None, :, None], oi[None, :, None, :]))  # (N, C_in, P, cout_g, M)
        b = _index(w2, (ch[:, None, :, None], cl[:, None, None, None], ti[None, :, None, :]))  # (C_in, P, cout_g, M)
        return a.reshape((n, c_in, p, 1, cout_g * m)), b.reshape((c_in, p, cout_g * m, 1))

    def _tap_judge(self, g, w, every, who):
        """The whole gradient as a :func:`_tap_judge` whose taps are the (o, t) pairs that reach an
        element (through any padded position), its groups the (input channel, position) pairs and a
        tap's terms the output channels: torch's CPU kernels form the padded input's gradient one
        kernel tap at a time (col2im: a sum over channels per tap, rounded, the taps added in the
        result's dtype) and then add the padded positions onto x in that dtype, which is this
        structure with the taps added in one order. Taps missing from a row are ``-0 * +0`` terms;
        an element nothing reaches gets one ``+0 * +0`` (the empty sum is +0)."""
        gb = g.reshape((1,) + _shape(g)) if self.unbatched else g
        n, c_out = _shape(gb)[:2]
        cin_g = _shape(w)[1]
        c_in, cout_g = cin_g * self.groups, c_out // self.groups
        oi, ti = self._rows(every)
        p, m = oi.shape
        size = c_in * p * m * cout_g * n
        if size > self.LIMIT:
            raise NotImplementedError(
                f"{who}: the gradient of x of a convolution with a padding_mode other than 'zeros' is judged as one "
                f"gathered sum, here of {size} values (more than {self.LIMIT}); backward computes it, "
                "compare_backward does not at this size."
            )
        o_flat, t_flat = math.prod(self.o_size), math.prod(self.ksize)
        empty = oi[:, 0] < 0
        oi[oi < 0], ti[ti < 0] = o_flat, t_flat  # the filler: -0 in g, +0 in w
        oi[empty, 0] = o_flat + 1  # a +0 term: the empty sum is +0
        g2 = _cat(_cat(gb.reshape((n, c_out, o_flat)), -0.0), 0.0)
        w2 = _cat(w.reshape((c_out, cin_g, t_flat)), 0.0)
        ch = (np.arange(c_in) // cin_g)[:, None] * cout_g + np.arange(cout_g)[None, :]  # (C_in, cout_g)
        cl = np.arange(c_in) % cin_g
        lt = _index(w2, (ch[:, None, None, :], cl[:, None, None, None], ti[None, :, :, None]))  # (C_in, P, M, cout_g)
        rt = _index(g2, (slice(None), ch[:, None, None, :], oi[None, :, :, None]))  # (N, C_in, P, M, cout_g)
        lt = lt.reshape((c_in * p, m, 1, cout_g))
        rt = _perm(rt, (1, 2, 3, 4, 0)).reshape((c_in * p, m, cout_g, n))
        return _tap_judge("x", lt, rt, *self._layouts(n, c_in, p))

    def _parts_judge(self, g, w, every, who):
        """The whole gradient as a :func:`_tap_judge` whose taps are the padded positions that hold an
        element (its *parts*), each tap's terms every (output channel, (o, t)) of that position: the
        structure of a backend that forms the padded input's gradient in one rounding per element
        (oneDNN's bfloat16 kernels on the CPU) and then adds the parts onto x in the result's dtype."""
        gb = g.reshape((1,) + _shape(g)) if self.unbatched else g
        n, c_out = _shape(gb)[:2]
        cin_g = _shape(w)[1]
        c_in, cout_g = cin_g * self.groups, c_out // self.groups
        rows = []
        for pos in every:  # per element: its parts (the product of the per-dimension parts), flat (o, t)
            parts = []
            for combo in itertools.product(*(self.parts[q][pos[q]] for q in range(self.nd))):
                o = np.zeros(1, np.int64)
                t = np.zeros(1, np.int64)
                for q, lst in enumerate(combo):
                    o = (o[:, None] * self.o_size[q] + np.array([v[0] for v in lst])[None, :]).reshape(-1)
                    t = (t[:, None] * self.ksize[q] + np.array([v[1] for v in lst])[None, :]).reshape(-1)
                parts.append((o, t))
            rows.append(parts)
        nt = max(1, max(len(r) for r in rows))
        kp = max(1, max((len(o) for r in rows for o, _ in r), default=1))
        p = len(every)
        size = c_in * p * nt * cout_g * kp * n
        if size > self.LIMIT:
            raise NotImplementedError(
                f"{who}: the gradient of x of a convolution with a padding_mode other than 'zeros' is judged as one "
                f"gathered sum, here of {size} values (more than {self.LIMIT}); backward computes it, "
                "compare_backward does not at this size."
            )
        o_flat, t_flat = math.prod(self.o_size), math.prod(self.ksize)
        oi = np.full((p, nt, kp), o_flat, np.int64)  # the filler: -0 in g, +0 in w
        ti = np.full((p, nt, kp), t_flat, np.int64)
        for r, parts in enumerate(rows):
            for k, (o, t) in enumerate(parts):
                oi[r, k, : len(o)] = o
                ti[r, k, : len(t)] = t
            if not any(len(o) for o, _ in parts):
                oi[r, 0, 0] = o_flat + 1  # a +0 term: the empty sum is +0
        g2 = _cat(_cat(gb.reshape((n, c_out, o_flat)), -0.0), 0.0)
        w2 = _cat(w.reshape((c_out, cin_g, t_flat)), 0.0)
        ch = (np.arange(c_in) // cin_g)[:, None] * cout_g + np.arange(cout_g)[None, :]  # (C_in, cout_g)
        cl = np.arange(c_in) % cin_g
        lt = _index(w2, (ch[:, None, None, :, None], cl[:, None, None, None, None], ti[None, :, :, None, :]))
        rt = _index(g2, (slice(None), ch[:, None, None, :, None], oi[None, :, :, None, :]))  # (N, C_in, P, T, .)
        lt = lt.reshape((c_in * p, nt, 1, cout_g * kp))
        rt = _perm(rt, (1, 2, 3, 4, 5, 0)).reshape((c_in * p, nt, cout_g * kp, n))
        return _tap_judge("x", lt, rt, *self._layouts(n, c_in, p))

    def _layouts(self, n, c_in, p):
        """(to_grad, from_grad) between grad_x and a fold judge's (1, C_in * P * N, 1) output."""

        def to_grad(v):
            v = _perm(v.reshape((c_in, p, n)), (2, 0, 1)).reshape((n, c_in) + self.in_size)
            return v[0] if self.unbatched else v

        def from_grad(v):
            v = v.reshape((1,) + _shape(v)) if self.unbatched else v
            return _perm(v.reshape((n, c_in, p)), (1, 2, 0)).reshape((1, c_in * p * n, 1))

        return to_grad, from_grad

    def _place(self, v, n, c_in):
        """matmul's (N, C_in, P, 1, 1) output over every position as grad_x's shape."""
        v = v.reshape((n, c_in) + self.in_size)
        return v[0] if self.unbatched else v

    def adjoint(self, g, w, who):
        gb = g.reshape((1,) + _shape(g)) if self.unbatched else g
        n, c_in = _shape(gb)[0], _shape(w)[1] * self.groups
        every = list(np.ndindex(*self.in_size))

        def whole():
            return self._tap_judge(g, w, every, who)

        def compute():
            from refkern import ops

            rem = [q - (o - 1) * s - d * (k - 1) - 1 + lo + hi for q, o, s, d, k, (lo, hi)
                   in zip(self.in_size, self.o_size, self.stride, self.dilation, self.ksize, self.pads)]  # fmt: skip
            xp = ops.get(f"conv_transpose{self.nd}d").reference(
                gb, w, stride=self.stride, padding=0, output_padding=tuple(rem), dilation=self.dilation,
                groups=self.groups,
            )  # fmt: skip
            sl = tuple(slice(lo, lo + s) for (lo, _), s in zip(self.pads, self.in_size))
            out = xp[(slice(None), slice(None)) + sl]
            out = out.clone() if is_tensor(out) else np.array(out)
            border = [pos for pos in every if any(self.mult[q][pos[q]] > 1 for q in range(self.nd))]
            for start in range(0, len(border), 256):  # chunks of positions bound the gathered memory
                chunk = border[start : start + 256]
                a, b = self.call(g, w, chunk)
                v = ops.get("matmul").reference(a, b).reshape((n, c_in, len(chunk)))
                idx = tuple(np.array([pos[q] for pos in chunk]) for q in range(self.nd))
                out[(slice(None), slice(None)) + idx] = v
            return out[0] if self.unbatched else out

        adj = Adjoint("x", "matmul", (), judge=whole, compute=compute,
                      judge_alt=lambda: self._parts_judge(g, w, every, who))  # fmt: skip
        return adj


def _cat(a, fill):
    """``a`` (..., L) with one more slot, holding ``fill``, at the end of the last axis."""
    if is_tensor(a):
        import torch

        return torch.cat([a, a.new_full(a.shape[:-1] + (1,), fill)], dim=-1)
    return np.concatenate([a, np.full(a.shape[:-1] + (1,), fill, a.dtype)], axis=-1)


def _index(a, idx):
    """``a[idx]`` with numpy integer arrays among ``idx`` (advanced indexing, numpy's broadcasting)."""
    if is_tensor(a):
        import torch

        idx = tuple(torch.as_tensor(i, device=a.device) if isinstance(i, np.ndarray) else i for i in idx)
    return a[idx]


def _same_judge(nd, g, w, kw, crop, dilation):
    """grad_x of a "same" convolution with an odd total padding, as a transposed convolution of exactly
    the input's shape: where the transposed convolution would be one longer, a zero tap is put in
    front of the filters (tap 0), the padding grows by d and output_padding is d - 1 (< d: valid).
    The added products are ``0 * grad_output``: zeros, which change no finite value."""
    ext = [(1, 0) if c else (0, 0) for c in crop]
    wz = _pad(w, ext)
    kz = dict(kw)
    kz["padding"] = tuple(p + (d if c else 0) for p, d, c in zip(kw["padding"], dilation, crop))
    kz["output_padding"] = tuple((d - 1) if c else a for a, d, c in zip(kw["output_padding"], dilation, crop))
    return Adjoint("x", f"conv_transpose{nd}d", (g, wz), kz)


def _take2(a, idx, axis):
    """``a`` indexed along ``axis`` by the 2-D integer array ``idx`` (two axes in its place)."""
    if is_tensor(a):
        import torch

        return a[(slice(None),) * axis + (torch.as_tensor(idx, device=a.device),)]
    return np.take(a, idx, axis=axis)


def _patches(a, o_size, ksize, stride, dilation):
    """(N, C, *spatial) -> (N, C, O, T): the window of every output position o (O of them, flattened)
    at every tap t (T of them): ``a[n, c, o s + t d]``."""
    nd = len(ksize)
    n, c = _shape(a)[:2]
    for i in range(nd):  # (N, C, o0, t0, o1, t1, ...)
        idx = np.arange(o_size[i])[:, None] * stride[i] + np.arange(ksize[i])[None, :] * dilation[i]
        a = _take2(a, idx, 2 + 2 * i)
    a = _perm(a, (0, 1, *(2 + 2 * i for i in range(nd)), *(3 + 2 * i for i in range(nd))))
    return a.reshape((n, c, math.prod(o_size), math.prod(ksize)))


def _tap_judge(name, lt, rt, to_grad, from_grad):
    """``out[g, q, pos] = sum_t (sum_c lt[g, t, pos, c] rt[g, t, c, q])`` as one transposed convolution
    whose *taps are the t*: input channel (g, c) holds lt[g, t, :, c] at positions (T - 1 - t) P + pos,
    filter (g, c) -> q at tap t is rt[g, t, c, q]; padding (T - 1) P and dilation P make every tap
    valid at every output position. Its analysis then knows the per-tap roundings of torch's CPU
    kernels, which form such gradients one GEMM per image (or broadcast batch element) and add
    them in the result's dtype. Output: (1, G * Q, P)."""
    gr, t, p, c = _shape(lt)
    q = _shape(rt)[3]
    xc = _flip(_perm(lt, (0, 3, 1, 2)), (2,)).reshape((1, gr * c, t * p))
    wc = _perm(rt, (0, 2, 3, 1)).reshape((gr * c, q, t))
    return Adjoint(name, "conv_transpose1d", (xc, wc), dict(padding=(t - 1) * p, dilation=p, groups=gr),
                   to_grad=to_grad, from_grad=from_grad)  # fmt: skip


def _weight_judge(xp, gb, ksize, o_size, stride, dilation, groups):
    """grad_weight of a convolution, grad_W[co, ci, t] = sum_n (sum_o grad_output[n, co, o]
    x_p[n, ci, o s + t d]), as a :func:`_tap_judge` whose taps are the images."""
    n, c_in = _shape(xp)[:2]
    c_out = _shape(gb)[1]
    cin_g, cout_g = c_in // groups, c_out // groups
    o, t = math.prod(o_size), math.prod(ksize)
    lt = _perm(_patches(xp, o_size, ksize, stride, dilation).reshape((n, groups, cin_g, o, t)), (1, 0, 2, 4, 3))
    rt = _perm(gb.reshape((n, groups, cout_g, o)), (1, 0, 3, 2))
    shape = (c_out, cin_g) + tuple(ksize)
    return _tap_judge("weight", lt.reshape((groups, n, cin_g * t, o)), rt, lambda v: v.reshape(shape),
                      lambda v: v.reshape((1, c_out, cin_g * t)))  # fmt: skip


def _convt_weight_judge(x, gp, ksize, stride, dilation, groups):
    """grad_weight of a transposed convolution, grad_W[ci, co, t] = sum_n (sum_i x[n, ci, i]
    grad_output_p[n, co, i s + t d]), as a :func:`_tap_judge` whose taps are the images."""
    n, c_in = _shape(x)[:2]
    in_size = _shape(x)[2:]
    c_out = _shape(gp)[1]
    cin_g, cout_g = c_in // groups, c_out // groups
    i, t = math.prod(in_size), math.prod(ksize)
    lt = _perm(_patches(gp, in_size, ksize, stride, dilation).reshape((n, groups, cout_g, i, t)), (1, 0, 2, 4, 3))
    rt = _perm(x.reshape((n, groups, cin_g, i)), (1, 0, 3, 2))
    shape = (c_in, cout_g) + tuple(ksize)
    return _tap_judge("weight", lt.reshape((groups, n, cout_g * t, i)), rt, lambda v: v.reshape(shape),
                      lambda v: v.reshape((1, c_in, cout_g * t)))  # fmt: skip


def _conv_transpose(nd, op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.conv_transpose import convt_operands

    x, w, b = a["input"], a["weight"], a["bias"]
    p = plan(op, {"input": x, "weight": w, "bias": b}, ("input", "weight"), "exact", None)
    c = convt_operands(p, nd, a["stride"], a["padding"], a["output_padding"], a["groups"], a["dilation"])
    stride, padding, dilation = c.stride[3 - nd :], c.padding[3 - nd :], c.dilation[3 - nd :]
    groups, unbatched = c.groups, c.unbatched
    out_shape = c.out_shape[:2] + c.out_shape[5 - nd :]
    _check_grad(op, g, out_shape[1:] if unbatched else out_shape, x, "input", who)
    sx, sw = _shape(x), _shape(w)
    in_size, ksize = sx[-nd:], sw[2:]
    n = 1 if unbatched else sx[0]
    cout_g = sw[1]
    gb = g.reshape((1,) + _shape(g)) if unbatched else g
    # grad_output padded by (p, p - a): length (L - 1) s + d (k - 1) + 1, every window in it is an input position
    full = [(q - 1) * st + dl * (k - 1) + 1 for q, st, dl, k in zip(in_size, stride, dilation, ksize)]
    gp = _pad(gb, [(pq, f - o - pq) for pq, f, o in zip(padding, full, out_shape[2:])])
    spatial = tuple(range(2, 2 + nd))
    out = {}
    if "input" in wrt:
        unb = (lambda v: v[0]) if unbatched else _identity
        to_b = (lambda v: v.reshape((1,) + _shape(v))) if unbatched else _identity
        out["input"] = Adjoint("input", f"conv{nd}d", (gp, w), dict(stride=stride, dilation=dilation, groups=groups),
                               to_grad=unb, from_grad=to_b)  # fmt: skip
    if "weight" in wrt:
        sp = _shape(gp)[2:]
        gs = _perm(gp.reshape((n, groups, cout_g) + sp), (2, 1, 0, *spatial[1:], 2 + nd)).reshape((cout_g, groups * n)
                                                                                                  + sp)  # fmt: skip
        xb = x.reshape((1,) + sx) if unbatched else x
        out["weight"] = Adjoint("weight", f"conv{nd}d", (gs, _swap01(xb)),
                                dict(stride=dilation, dilation=stride, groups=groups), to_grad=_swap01,
                                from_grad=_swap01, judge=lambda: _convt_weight_judge(xb, gp, ksize, stride, dilation,
                                                                                     groups))  # fmt: skip
    if "bias" in wrt:
        out["bias"] = _bias_sum(g, unbatched)
    return out


# ---------------------------------------------------------------- softmax and log_softmax


def _rows_of(v, axis):
    """(R, n) rows along ``axis`` of the float64 array v, and the function that puts (R, n) back."""
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1))
    shape = moved.shape
    rows = moved.reshape(-1, shape[-1]) if moved.size else moved.reshape(0, shape[-1] if shape else 1)

    def back(r):
        return np.moveaxis(r.reshape(shape), -1, axis)

    return rows, back


def _softmax_call(op, g, a, who):
    """(x rows, g rows, back, format, as_tensor, computing format) of a softmax/log_softmax backward
    call, validated. With ``dtype=``, torch converts the input first (``input.to(dtype)``) and the
    forward and backward run in that dtype; autograd converts the gradient back to the input's dtype:
    the rows are the converted input, grad_output has ``dtype``, and the result format is the input's
    (the gradient at the converted input, rounded once to it); the computing format is ``dtype``'s."""
    from refkern.kernels.softmax import convert_input

    o, fmt_c, v = convert_input(a["input"], op, a.get("dtype"))
    dim = a["dim"]
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{who}: dim must be an int; got {dim!r}.")
    span = max(v.ndim, 1)
    if not -span <= dim < span:
        raise IndexError(f"{who}: dim={dim} is out of range for a {v.ndim}-d input (expected {-span}..{span - 1}).")
    og = operand(g, "grad_output", who)
    if og.fmt.name != fmt_c.name:
        raise TypeError(
            f"{who}: grad_output must have the dtype of the output of {op}, {fmt_c.name}; "
            f"got grad_output.dtype={og.fmt.name}."
        )
    if tuple(og.shape) != tuple(v.shape):
        raise ValueError(
            f"{who}: grad_output must have the shape of the output of {op}, {tuple(v.shape)}; "
            f"got grad_output.shape={tuple(og.shape)}."
        )
    gv = np.asarray(og.values, np.float64).reshape(v.shape)
    if v.ndim == 0:
        v, gv = v.reshape(1), gv.reshape(1)
    axis = int(dim) % span
    xr, back = _rows_of(v, axis)
    gr, _ = _rows_of(gv, axis)
    shape0 = np.shape(a["input"])
    return xr, gr, (lambda r: back(r).reshape(shape0)), o.fmt, o.torch or og.torch, fmt_c


def _softmax_grad(op, g, a, who):
    from refkern.kernels._common import deliver
    from refkern.kernels.softmax_backward import softmax_backward_rows

    xr, gr, back, fmt, as_tensor, _ = _softmax_call(op, g, a, who)
    out, _ = softmax_backward_rows(xr, gr, fmt, op == "log_softmax")
    return deliver(back(out), fmt, as_tensor)


def _softmax(op, g, a, wrt, who):
    _softmax_call(op, g, a, who)  # validation
    return {"input": Adjoint("input", op, (), compute=lambda: _softmax_grad(op, g, a, who))}


def _envelope_report(op, got, g, a, who):
    """compare_backward's Report for a gradient judged by :mod:`refkern.analysis._envelope_backward`
    (with ``dtype=``: the envelope of the computation in that dtype, then the conversion back,
    :func:`~refkern.analysis._envelope_backward.converted_bound`)."""
    from refkern.analysis._envelope_backward import bound, converted_bound
    from refkern.analysis.compare import _actual
    from refkern.kernels.softmax_backward import softmax_backward_rows

    xr, gr, back, fmt, _, fmt_c = _softmax_call(op, g, a, who)
    act, afmt, device = _actual(got)
    if afmt.name != fmt.name:
        raise TypeError(f"{who}: the gradient of input must have the dtype of input, {fmt.name}; got {afmt.name}.")
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward import converted, softmax_noise

    ref_rows, _ = softmax_backward_rows(xr, gr, fmt, op == "log_softmax")
    v, sc = softmax_noise(xr, gr, fmt_c, op == "log_softmax")
    if fmt_c.name == fmt.name:
        b_rows = bound(op, xr, gr, ref_rows, fmt)
    else:
        ref_c, _ = softmax_backward_rows(xr, gr, fmt_c, op == "log_softmax")
        b_rows = converted_bound(bound(op, xr, gr, ref_c, fmt_c), ref_c, fmt_c, fmt)
        v = converted(v, ref_rows * sc, fmt)
    ref = np.asarray(back(ref_rows), np.float64)
    b = np.asarray(back(b_rows), np.float64)
    axis = int(a["dim"]) % max(ref.ndim, 1)
    nz = Noise(np.asarray(back(v), np.float64), [], (axis,) if ref.ndim else (),
               np.asarray(back(sc), np.float64) if np.ndim(sc) else 1.0)  # fmt: skip
    return _envelope_finish(f"{op} backward", act.reshape(ref.shape), ref, b, fmt, device, int(xr.shape[1]), op, nz)


def _envelope_finish(label, act, ref, b, fmt, device, n_terms, op, nz=None):
    """The Report of a gradient ``act`` judged against the reference ``ref`` by the envelope ``b`` and,
    inside it, with ``nz`` (a :class:`~refkern.analysis.noise.Noise` of
    :mod:`refkern.analysis.noise_backward`), by the statistical test of :mod:`refkern.analysis.inside`."""
    from refkern.analysis.compare import _ulps, _worst
    from refkern.analysis.inside import decide_inside
    from refkern.analysis.report import VERDICTS, Report
    from refkern.analysis.verdict import decide_envelope

    d = decide_envelope(act, ref, [("rounding", None, ref, b)], fmt)
    if nz is not None:
        axes = tuple(f"dim{i}" for i in range(ref.ndim))
        d = decide_inside(act, ref, [], d, label, {}, fmt, axes, nz=nz)
    ulps = _ulps(act, ref, fmt)
    r0 = d.fits[0].ratio
    stat = nz is not None and d.z is not None
    lam = d.thresholds.get("element", 1.0) if stat else 1.0
    ratio = d.z / lam if stat else r0
    counts = dict(zip(VERDICTS, np.bincount(d.classes.reshape(-1), minlength=4).tolist()))
    eligible = d.unexplained if d.verdict == "mismatch" else d.fits[0].state != 0
    top, worst = _worst(eligible, ratio, ref.shape)
    details = [{"index": list(w), "actual": float(act.reshape(-1)[f]), "reference": float(ref.reshape(-1)[f]),
                "ulp": float(ulps.reshape(-1)[f]), "bound_ratio": float(r0.reshape(-1)[f]),
                "test_ratio": float(ratio.reshape(-1)[f]), "condition": 1.0} for w, f in zip(worst, top)]  # fmt: skip
    det = d.detectable["element"]
    notes = [f["text"] for f in d.structure]  # the verdict's findings first
    if stat:
        notes.append(
            f"the gradient of {label} judged by the statistical test inside its worst-case envelope "
            f"(refkern.analysis.noise_backward): an error of one element from {det['median_ulps']:.3g} ulp (median) "
            "is seen"
        )  # fmt: skip
    else:
        notes.append(
            f"the gradient of {label} judged by its worst-case envelope (refkern.analysis._envelope_backward): "
            f"an error below it, median {det['median_ulps']:.3g} ulp here, cannot be told from rounding"
        )
    return Report(
        op=label, device=device, dtype=fmt.name, shape=tuple(ref.shape), n_terms=n_terms,
        verdict=d.verdict, precision=d.precision, max_ulp=float(ulps.max()) if ulps.size else 0.0,
        max_bound_ratio=float(r0.max()) if r0.size else 0.0,
        max_prob_ratio=float(ratio.max()) if ratio.size else 0.0,
        worst=worst, worst_details=details, counts=counts, where={},
        hypotheses={(f.model.key + " (statistical)" if hasattr(f, "lam") else f.model.key): f.summary(1.0)
                    for f in d.fits},
        bound_ratios={f.model.key: {"worst_case": float(f.ratio.max(initial=0.0))} for f in d.fits
                      if not hasattr(f, "lam")},
        condition={"median": 1.0, "max": 1.0}, tolerance=None, notes=notes,
        model=d.model.kind if d.model is not None else None, alternatives=[], structure=d.structure,
        detectable=d.detectable, thresholds=d.thresholds,
    )  # fmt: skip


# ---------------------------------------------------------------- layer_norm, rms_norm, group_norm, batch_norm


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
    from refkern.kernels.norm import _eps, _param, _trailing

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
    from refkern.kernels.norm import _eps, _param

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
    from refkern.kernels.norm import _eps, _param

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
                     {"regroup": regroup, "input_roundings": _batch_rounds(), "half_sums": False,
                      "stored_sums": half, "half_steps": half},
                     None if training else (rm, rv))  # fmt: skip


def _batch_rounds():
    from refkern.analysis._envelope_backward import BATCH_INPUT_ROUNDINGS

    return BATCH_INPUT_ROUNDINGS


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


def _norm_report(op, name, got, g, a, who):
    """compare_backward's Report for one gradient of a norm, judged by its envelope."""
    from refkern.analysis._envelope_backward import batch_norm_eval_bound, norm_bound
    from refkern.analysis.compare import _actual

    c = _NORM_CALLS[op](op, g, a, who)
    act, afmt, device = _actual(got)
    fmt = c.fmts[name]
    if afmt.name != fmt.name:
        raise TypeError(f"{who}: the gradient of {name} must have the dtype of {name}, {fmt.name}; got {afmt.name}.")
    if c.given is not None:
        from refkern.kernels.batch_norm_backward import batch_norm_eval_backward

        ref = batch_norm_eval_backward(c.X, c.G, c.W, c.given[0], c.given[1], c.eps, c.fmts, (name,))[name]
        b = batch_norm_eval_bound(name, c.X, c.G, c.W, c.given[0], c.given[1], c.eps, ref, c.fmts)
    else:
        from refkern.kernels.norm_backward import norm_backward_rows

        ref = norm_backward_rows(c.X, c.G, c.W, c.center, c.eps, c.fmts, (name,), regroup=c.regroup)[name]
        b = norm_bound(op, name, c.X, c.G, c.W, c.eps, ref, c.fmts, **c.bound_kw)
    from refkern.analysis import noise_backward as nb
    from refkern.analysis.noise import Noise

    precs, axes, coherent = [], (), None
    if name == "input":
        v = nb.norm_input_noise(c.X, c.G, c.W, c.center, c.eps, c.fmts, c.bound_kw.get("half_steps", False), c.given)
        nd = len(c.shapes["input"])
        if op in ("layer_norm", "rms_norm") and c.X.shape[1] == c.shapes["input"][-1] and nd:
            axes = (nd - 1,)  # one normalised dimension: a group along it holds one element per row
    else:
        v, half, coherent = nb.norm_param_noise(name, c.X, c.G, c.center, c.eps, c.fmts, c.regroup, c.given)
        if half is not None:
            p = {"bfloat16": "bf16", "float16": "fp16"}[c.fmts["input"].name]
            precs = [(p, f"{p} accumulation", f"the running sums over the rows rounded to {p} (torch's CPU kernels "
                      "for half inputs)", half)]  # fmt: skip
    if name == "input" and c.back is not None:
        ref, b, v = c.back(ref), c.back(b), c.back(v)
    shape = c.shapes[name]
    R, n = c.X.shape
    n_terms = n if name == "input" else (R * n) // max(math.prod(shape), 1)
    nz = Noise(np.asarray(v, np.float64).reshape(shape), [], axes, coherent=coherent, precisions=precs)
    return _envelope_finish(f"{op} backward ({name})", np.asarray(act, np.float64).reshape(shape), ref.reshape(shape),
                            b.reshape(shape), fmt, device, int(n_terms), op, nz)  # fmt: skip


# ---------------------------------------------------------------- poolings


@dataclass
class _PoolCall:
    """A validated pooling backward call: grad_output as float64 planes (P, OH, OW), the input's
    (P, H, W) plane size and shape, its format, whether to return tensors, and the geometry: ``spans``
    and ``dconst`` (averages) or ``idx`` (maxima: the forward's flat indices)."""

    G: np.ndarray
    H: int
    W: int
    shape: tuple
    fmt: object
    as_tensor: bool
    spans: "list | None" = None
    dconst: int = 0
    idx: "np.ndarray | None" = None


def _pool_call(op, g, a, who) -> _PoolCall:
    from refkern import ops
    from refkern.kernels import pool

    nd = 2 if op.endswith("2d") else 1
    fwd = {k: v for k, v in a.items() if k != "return_indices"}
    try:  # the forward validates every argument as torch does, and gives the output's shape (and indices)
        if op.startswith("max_pool"):
            y, idx = ops.get(op).reference(**fwd, return_indices=True)
        else:
            y, idx = ops.get(op).reference(**fwd), None
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{who}: {str(exc)}") from None
    x, X, lead = pool._pool_input(op, a["input"], nd)
    _check_grad(op, g, tuple(y.shape), a["input"], "input", who)
    og = operand(g, "grad_output", who)
    P, H, W = X.shape
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(P, -1, int(y.shape[-1])))
    c = _PoolCall(G, H, W, tuple(x.shape), x.fmt, x.torch or og.torch)
    if idx is not None:
        c.idx = np.asarray(idx).reshape(G.shape)
        return c
    if op.startswith("adaptive"):
        osz = G.shape[1:]
        c.spans = [[(i * size // o, -(-(i + 1) * size // o), -(-(i + 1) * size // o) - i * size // o)
                    for i in range(o)] for size, o in zip((H, W), osz)]  # fmt: skip
        return c
    k, st, pd, _, ceil_mode = pool._geometry(op, nd, a["kernel_size"], a["stride"], a["padding"], 1, a["ceil_mode"])
    k, st, pd = pool._lift(k, 1), pool._lift(st, 1), pool._lift(pd, 0)
    spans = []
    for ax, size in enumerate((H, W)):
        spans.append([])
        for o in range(G.shape[1 + ax]):  # the forward's windows and divisors (refkern.kernels.pool._avg_pool)
            start = o * st[ax] - pd[ax]
            end = min(start + k[ax], size + pd[ax])
            lo, hi = max(start, 0), min(end, size)
            spans[-1].append((lo, hi, end - start if a["count_include_pad"] else hi - lo))
    c.spans = spans
    c.dconst = int(a.get("divisor_override") or 0)
    return c


def _pool_grads(c: _PoolCall):
    from refkern.kernels.pool_backward import avg_pool_backward, max_pool_backward

    if c.idx is not None:
        return max_pool_backward(c.G, c.idx, c.H, c.W, c.fmt)
    return avg_pool_backward(c.G, c.spans, c.dconst, c.H, c.W, c.fmt)


def _pool(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _pool_call(op, g, a, who)
    return {"input": Adjoint("input", op, (), compute=lambda: deliver(_pool_grads(c)[0].reshape(c.shape), c.fmt,
                                                                       c.as_tensor))}  # fmt: skip


def _pool_report(op, got, g, a, who):
    """compare_backward's Report for a pooling's gradient, judged by its envelope."""
    from refkern.analysis._envelope_backward import pool_bound
    from refkern.analysis.compare import _actual

    c = _pool_call(op, g, a, who)
    act, afmt, device = _actual(got)
    if afmt.name != c.fmt.name:
        raise TypeError(f"{who}: the gradient of input must have the dtype of input, {c.fmt.name}; got {afmt.name}.")
    ref, asum, cnt = _pool_grads(c)
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward import pool_noise

    b = pool_bound(asum, cnt, ref, c.fmt, exact_terms=c.idx is not None)
    nz = Noise(pool_noise(asum, cnt, ref, c.fmt, c.idx is not None).reshape(c.shape))
    n_terms = int(cnt.max()) if cnt.size else 0
    return _envelope_finish(f"{op} backward (input)", np.asarray(act, np.float64).reshape(c.shape),
                            ref.reshape(c.shape), b.reshape(c.shape), c.fmt, device, n_terms, op, nz)  # fmt: skip


# ---------------------------------------------------------------- scaled_dot_product_attention


@dataclass
class _AttnCall:
    """A validated attention backward call: the forward's normalised operands, grad_output as float64
    (B, L, Ev), the original shapes of query, key and value, whether to return tensors."""

    a: object
    G: np.ndarray
    shapes: dict
    as_tensor: bool


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
    og = operand(g, "grad_output", who)
    if og.fmt.name != at.fmt.name:
        raise TypeError(f"{who}: grad_output must have the dtype of the output of {op}, {at.fmt.name}; "
                        f"got grad_output.dtype={og.fmt.name}.")  # fmt: skip
    if tuple(og.shape) != tuple(at.out_shape):
        raise ValueError(f"{who}: grad_output must have the shape of the output of {op}, {tuple(at.out_shape)}; "
                         f"got grad_output.shape={tuple(og.shape)}.")  # fmt: skip
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(at.iq.size, *at.out_shape[-2:]))
    if not all(np.isfinite(x).all() for x in (at.Q, at.K, at.V, G)):
        raise ValueError(f"{who}: {op} backward needs finite query, key, value and grad_output; got a NaN or an "
                         "infinity. The gradient of a non-finite input has no real value to round.")  # fmt: skip
    if at.Q.shape[2] > 0 and not math.isfinite(at.scale):
        raise ValueError(f"{who}: {op} backward needs a finite scale; got scale={at.scale}.")
    shapes = {k: _shape(a[k]) for k in ("query", "key", "value")}
    return _AttnCall(at, G, shapes, at.tensor or og.torch)


def _attn_grads(c: _AttnCall, wrt) -> dict:
    """{name: float64 gradient in its argument's shape} for the names in wrt."""
    from refkern.kernels.attention_backward import attention_backward

    got, _ = attention_backward(c.a, c.G, wrt)
    return {k: v.reshape(c.shapes[k]) for k, v in got.items()}


def _attention(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _attn_call(op, g, a, who)
    memo = {}

    def grads():  # every gradient asked for from one pass over the rows
        if not memo:
            memo.update({k: deliver(v, c.a.fmt, c.as_tensor) for k, v in _attn_grads(c, wrt).items()})
        return memo

    return {k: Adjoint(k, op, (), compute=lambda k=k: grads()[k]) for k in wrt}


def _attn_report(op, name, got, g, a, who):
    """compare_backward's Report for one gradient of scaled_dot_product_attention, judged by its envelope."""
    from refkern.analysis._envelope_backward import attention_bound
    from refkern.analysis.compare import _actual

    c = _attn_call(op, g, a, who)
    act, afmt, device = _actual(got)
    if afmt.name != c.a.fmt.name:
        raise TypeError(
            f"{who}: the gradient of {name} must have the dtype of {name}, {c.a.fmt.name}; got {afmt.name}."
        )
    ref = _attn_grads(c, (name,))[name]
    stack = {"query": c.a.Q, "key": c.a.K, "value": c.a.V}[name].shape
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward import attention_noise

    b, n_terms = attention_bound(c.a, c.G, name, ref.reshape(stack))
    nz = Noise(attention_noise(c.a, c.G, name, ref.reshape(stack)).reshape(ref.shape))
    return _envelope_finish(f"{op} backward ({name})", np.asarray(act, np.float64).reshape(ref.shape), ref,
                            b.reshape(ref.shape), c.a.fmt, device, n_terms, op, nz)  # fmt: skip


# ---------------------------------------------------------------- sum, mean, var, std, cumsum, dot


@dataclass
class _RedCall:
    """A validated reduction backward call: the input's values ``x`` (float64, as given), its format ``fmt``
    (the gradient's), the forward's result format ``fmt_c`` (``dtype=``'s, else ``fmt``), the reduced
    dimensions, grad_output as float64 in the forward's output shape, whether to return tensors."""

    x: np.ndarray
    fmt: object
    fmt_c: object
    dims: tuple
    G: np.ndarray
    as_tensor: bool

    @property
    def n(self) -> int:
        return math.prod(self.x.shape[d] for d in self.dims) if self.x.ndim else 1

    def broadcast(self, v):
        """An output-shaped array back over the reduced dimensions (input-shaped, float64)."""
        kept = tuple(1 if i in self.dims else s for i, s in enumerate(self.x.shape))
        return np.broadcast_to(np.asarray(v, np.float64).reshape(kept), self.x.shape)

    def rows(self):
        """(X (R, n) rows of the reduced elements, the function putting (R, n) back in x's shape)."""
        from refkern.kernels.reduction import rows_of

        X, _ = rows_of(self.x, self.dims, False)
        keep = [i for i in range(self.x.ndim) if i not in self.dims]
        order = keep + list(self.dims)
        moved = tuple(self.x.shape[i] for i in order)

        def back(v):
            return np.transpose(np.asarray(v).reshape(moved), np.argsort(order)) if self.x.ndim else np.asarray(
                v).reshape(())  # fmt: skip

        return X, back


def _red_call(op, g, a, who) -> _RedCall:
    from refkern._arrays import format_of
    from refkern.kernels.reduction import reduced_dims

    o = operand(a["x"], "x", who)
    fmt_c = o.fmt if a.get("dtype") is None else format_of(a["dtype"], "dtype", who)
    x = np.asarray(o.values, np.float64).reshape(o.shape)
    if op == "cumsum":
        dim = a["dim"]
        if dim is None or isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"{who}: cumsum's dim must be an int; got {dim!r}.")
    dims = reduced_dims(a["dim"], x.ndim, who)
    if op == "cumsum":
        shape = x.shape
    elif a.get("keepdim", False):
        shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    og = operand(g, "grad_output", who)
    if og.fmt.name != fmt_c.name:
        raise TypeError(f"{who}: grad_output must have the dtype of the output of {op}, {fmt_c.name}; "
                        f"got grad_output.dtype={og.fmt.name}.")  # fmt: skip
    if tuple(og.shape) != tuple(shape):
        raise ValueError(f"{who}: grad_output must have the shape of the output of {op}, {tuple(shape)}; "
                         f"got grad_output.shape={tuple(og.shape)}.")  # fmt: skip
    G = np.asarray(og.values, np.float64).reshape(shape)
    return _RedCall(x, o.fmt, fmt_c, dims, G, o.torch or og.torch)


def _red_grad(op, c: _RedCall, a) -> np.ndarray:
    """The gradient of sum, mean, var or std as float64 values of the input's format, in x's shape."""
    from refkern.accumulate.formats import round_array

    if op == "sum":  # a copy of g over the reduced dimensions; with dtype=, one conversion
        v = np.array(c.broadcast(c.G))
        return round_array(v, *c.fmt.params) if c.fmt_c is not c.fmt and v.size else v
    if op == "mean":
        from refkern.kernels.reduction_backward import mean_backward_values

        return np.array(c.broadcast(mean_backward_values(c.G, c.n, c.fmt)))
    from refkern.kernels.reduction import _correction
    from refkern.kernels.reduction_backward import var_backward_rows

    X, back = c.rows()
    nodim = a["dim"] is None or c.x.ndim == 0  # torch's var_backward: dim=None (or 0-d) has its own dof <= 0 rule
    out = var_backward_rows(X, c.G.reshape(-1), _correction(a["correction"], "backward"), op == "std", nodim, c.fmt)
    return np.array(back(out))


def _reduction(op, g, a, wrt, who):
    from refkern.kernels._common import deliver

    c = _red_call(op, g, a, who)
    return {"x": Adjoint("x", op, (), compute=lambda: deliver(_red_grad(op, c, a), c.fmt, c.as_tensor))}


def _reversed_cumsum(G, axis, fmt):
    """RN(sum_{j >= i} G[..., j, ...]) along ``axis`` of the float64 array G, to ``fmt``."""
    from refkern.kernels.reduction import _cumsum_rows

    moved = np.ascontiguousarray(np.moveaxis(G, axis, -1)[..., ::-1])
    X = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out = np.empty_like(X)
    if X.size:
        _cumsum_rows(X, *fmt.params, out)
    return np.ascontiguousarray(np.moveaxis(out.reshape(moved.shape)[..., ::-1], -1, axis))


def _cumsum(op, g, a, wrt, who):
    """grad_input[i] = sum_{j >= i} grad_output[j] along dim: the forward cumsum of the flipped grad_output,
    flipped back (an adjoint call judged by compare's cumsum). With ``dtype=`` autograd converts grad_output
    to the input's dtype first (``cumsum_backward(grad.to(self.scalar_type()), dim)``): where that is exact
    the adjoint call runs on the converted grad_output; elsewhere, and for a 0-d input, the kernel rounds
    the exact sums of the given grad_output once (judged by :func:`_cumsum_report`)."""
    from refkern.accumulate.formats import round_array
    from refkern.kernels._common import deliver

    c = _red_call(op, g, a, who)
    if c.x.ndim and c.x.size:  # (compare's cumsum envelope does not take an empty input)
        axis = c.dims[0]
        gg = g
        if c.fmt_c is not c.fmt:
            conv = round_array(np.ascontiguousarray(c.G), *c.fmt.params) if c.G.size else c.G
            same = np.array_equal(conv, c.G, equal_nan=True)
            gg = deliver(np.ascontiguousarray(c.G), c.fmt, is_tensor(g)) if same else None
        if gg is not None:
            flip = lambda v: _flip(v, (axis,))  # noqa: E731
            return {"x": Adjoint("x", "cumsum", (_flip(gg, (axis,)),), {"dim": int(a["dim"])}, to_grad=flip,
                                 from_grad=flip)}  # fmt: skip
    return {"x": Adjoint("x", "cumsum", (), compute=lambda: deliver(_cumsum_values(c), c.fmt, c.as_tensor))}


def _cumsum_values(c: _RedCall):
    from refkern.accumulate.formats import round_array

    if not c.x.ndim or not c.x.size:  # torch returns grad itself: one conversion
        return round_array(np.array(c.G).reshape(-1), *c.fmt.params).reshape(c.x.shape) if c.x.size else c.G
    return _reversed_cumsum(c.G, c.dims[0], c.fmt)


def _dot(op, g, a, wrt, who):
    """dot(x, y): grad_x = g y, grad_y = g x, one product each: a K = 1 matmul (an adjoint call)."""
    ox, oy = operand(a["x"], "x", who), operand(a["y"], "y", who)
    if len(ox.shape) != 1 or len(oy.shape) != 1 or ox.shape != oy.shape:
        raise ValueError(f"{who}: dot expects 1-D x and y of one length; got x.shape={tuple(ox.shape)} and "
                         f"y.shape={tuple(oy.shape)}.")  # fmt: skip
    if ox.fmt.name != oy.fmt.name:
        raise TypeError(f"{who}: dot expects x and y of one dtype; got x.dtype={ox.fmt.name} and "
                        f"y.dtype={oy.fmt.name}.")  # fmt: skip
    _check_grad(op, g, (), a["x"], "x", who)
    n = ox.shape[0]
    g1 = g.reshape((1,)) if hasattr(g, "reshape") else np.asarray(g).reshape((1,))
    out = {}
    for k, other in (("x", a["y"]), ("y", a["x"])):
        if k in wrt:
            out[k] = Adjoint(k, "matmul", (g1, other.reshape((1, n))))
    return out


def _reduction_report(op, name, got, g, a, who):
    """compare_backward's Report for the gradient of sum, mean, var, std (and cumsum's ``compute`` cases),
    judged by its envelope: sum's and a 0-d cumsum's is 0 (a correct backend copies or converts g once:
    ``exact`` or ``mismatch``, as max_pool's forward), mean's :func:`~refkern.analysis._envelope_backward.mean_bound`
    (with ``dtype=``: computed in that dtype, then converted back, ``converted_bound``), var's and std's
    ``var_bound``, cumsum's the forward cumsum envelope of the converted grad_output around its own exact
    reference, plus the known distance between the two references."""
    from refkern.analysis import _envelope_backward as envb
    from refkern.analysis.compare import _actual

    c = _red_call(op, g, a, who)
    act, afmt, device = _actual(got)
    if afmt.name != c.fmt.name:
        raise TypeError(f"{who}: the gradient of x must have the dtype of x, {c.fmt.name}; got {afmt.name}.")
    from refkern.analysis import noise_backward as nb

    n_terms, blind, v = 1, 0, None
    if op == "sum" or (op == "cumsum" and not (c.x.ndim and c.x.size)):
        ref = _red_grad("sum", c, a) if op == "sum" else _cumsum_values(c)
        b = np.zeros(ref.shape)
    elif op == "mean":
        from refkern.kernels.reduction_backward import mean_backward_values

        n = max(c.n, 1)
        ref = _red_grad(op, c, a)
        if c.fmt_c is c.fmt:
            ref_c = mean_backward_values(c.G, n, c.fmt)
            b = c.broadcast(envb.mean_bound(np.abs(c.G) / n, ref_c, c.fmt))
            v = c.broadcast(nb.mean_noise(c.G, n, ref_c, c.fmt))
        else:
            ref_c = mean_backward_values(c.G, n, c.fmt_c)
            b = c.broadcast(envb.converted_bound(envb.mean_bound(np.abs(c.G) / n, ref_c, c.fmt_c), ref_c, c.fmt_c,
                                                 c.fmt))  # fmt: skip
            v = c.broadcast(nb.converted(nb.mean_noise(c.G, n, ref_c, c.fmt_c), ref_c, c.fmt))
    elif op == "cumsum":
        from refkern.accumulate.formats import round_array

        axis = c.dims[0]
        ref = _reversed_cumsum(c.G, axis, c.fmt)
        gp = round_array(np.ascontiguousarray(c.G), *c.fmt.params) if c.G.size else c.G  # grad.to(x.dtype)
        ref_p = _reversed_cumsum(gp, axis, c.fmt)
        b = envb.cumsum_converted_bound(gp, axis, ref_p, ref, c.fmt)
        n_terms = c.x.shape[axis]
    else:
        from refkern.kernels.reduction import _correction

        X, back = c.rows()
        nodim = a["dim"] is None or c.x.ndim == 0
        corr = _correction(a["correction"], who)
        ref = _red_grad(op, c, a)
        b = back(envb.var_bound(X, c.G.reshape(-1), corr, _to_rows(c, ref), c.fmt, op == "std", nodim))
        v = back(nb.var_noise(X, c.G.reshape(-1), corr, _to_rows(c, ref), c.fmt, op == "std"))
        n_terms = X.shape[1]
        dof = n_terms - corr
        if op == "var" and n_terms and (dof == 0 or (dof < 0 and nodim)):
            # torch's IEEE rule (NaN or an infinity) reads the sign of x - mean^ (or x == mean^): where the exact
            # x - mu lies within the stored mean's error, each of NaN, +inf, -inf is a correct backend's value
            fin = np.isfinite(X).all(axis=1, keepdims=True) & np.isfinite(c.G.reshape(-1, 1))
            d, e_d, slack = envb.centred(np.where(fin, X, 0.0), c.fmt)
            amb = back(fin & (np.abs(d) <= e_d + slack)).reshape(c.x.shape) & ~np.isfinite(act.reshape(c.x.shape))
            ref = np.where(amb, act.reshape(c.x.shape), np.asarray(ref, np.float64).reshape(c.x.shape))
            blind = int(amb.sum())
    from refkern.analysis.noise import Noise

    nz = None if v is None else Noise(np.asarray(v, np.float64).reshape(c.x.shape))
    rep = _envelope_finish(f"{op} backward (x)", act.reshape(c.x.shape), np.asarray(ref, np.float64).reshape(
        c.x.shape), np.asarray(b, np.float64).reshape(c.x.shape), c.fmt, device, int(n_terms), op, nz)  # fmt: skip
    if blind:
        why = "the sign of x - mean there depends on the rounding of the mean (torch's rule inf * g * (x - mean))"
        rep.notes.append(f"{blind} elements of a zero-dof row take the backend's NaN or infinity: {why}")
    return rep


def _to_rows(c: _RedCall, v):
    """An input-shaped array as the (R, n) rows of :meth:`_RedCall.rows`."""
    from refkern.kernels.reduction import rows_of

    return rows_of(np.asarray(v, np.float64).reshape(c.x.shape), c.dims, False)[0]


def _bind_nd(fn, nd):
    return lambda op, g, a, wrt, who: fn(nd, op, g, a, wrt, who)


_BUILDERS = {
    "linear": (_linear, ("x", "weight", "bias")),
    "matmul": (_matmul, ("a", "b")),
    **{f"conv{d}d": (_bind_nd(_conv, d), ("x", "weight", "bias")) for d in (1, 2, 3)},
    **{f"conv_transpose{d}d": (_bind_nd(_conv_transpose, d), ("input", "weight", "bias")) for d in (1, 2, 3)},
    "softmax": (_softmax, ("input",)),
    "log_softmax": (_softmax, ("input",)),
    "layer_norm": (_norm, ("input", "weight", "bias")),
    "rms_norm": (_norm, ("input", "weight")),
    "group_norm": (_norm, ("input", "weight", "bias")),
    "batch_norm": (_norm, ("input", "weight", "bias")),
    **{f"{kind}{d}d": (_pool, ("input",)) for kind in ("avg_pool", "max_pool", "adaptive_avg_pool") for d in (1, 2)},
    "scaled_dot_product_attention": (_attention, ("query", "key", "value")),
    **{k: (_reduction, ("x",)) for k in ("sum", "mean", "var", "std")},
    "cumsum": (_cumsum, ("x",)),
    "dot": (_dot, ("x", "y")),
}
ENVELOPE_OPS = ("softmax", "log_softmax")  # judged by worst-case envelopes (refkern.analysis._envelope_backward)
NORM_OPS = ("layer_norm", "rms_norm", "group_norm", "batch_norm")  # judged by the norm envelopes (same module)
POOL_OPS = tuple(f"{k}{d}d" for k in ("avg_pool", "max_pool", "adaptive_avg_pool") for d in (1, 2))  # pool_bound
REDUCTION_OPS = ("sum", "mean", "var", "std")  # judged by _reduction_report (cumsum too where no adjoint call runs)
_RANK = {"exact": 0, "rounding": 1, "reduced-precision": 2, "mismatch": 3}  # a better fit ranks lower
OPS = tuple(_BUILDERS)


def _op_name(op, who) -> str:
    from refkern import ops

    return ops.lookup(op, who, among=_BUILDERS)


def differentiable(op, args, kwargs, who="backward") -> dict:
    """``{name: value}`` of the differentiable arguments of ``op(*args, **kwargs)`` that were given
    (not None), bound by the op's signature."""
    name = _op_name(op, who)
    a = _bind(name, args, kwargs, who)
    return {k: a[k] for k in _BUILDERS[name][1] if a.get(k) is not None}


def adjoints(op, grad_output, *args, wrt=None, who="backward", **kwargs) -> dict:
    """The :class:`Adjoint` call of every gradient asked for (all differentiable arguments given,
    without ``wrt``), validated as torch validates the forward call."""
    name = _op_name(op, who)
    build, diff = _BUILDERS[name]
    for bad in ("accumulate", "accum_dtype", "engine"):
        if bad in kwargs:
            raise ValueError(f"{who}: {bad}= is not an argument of the op: the gradients are always exact.")
    a = _bind(name, args, kwargs, who)
    given = tuple(k for k in diff if a.get(k) is not None)
    if wrt is None:
        wrt = given
    elif isinstance(wrt, str):
        wrt = (wrt,)
    for k in wrt:
        if k not in diff:
            raise ValueError(f"{who}: {name} has no differentiable argument {k!r}; choose among {', '.join(diff)}.")
        if a.get(k) is None:
            raise ValueError(f"{who}: wrt names {k!r}, but {name} was called without it.")
    return build(name, grad_output, a, tuple(wrt), who)


def backward(op, grad_output, *args, wrt=None, **kwargs) -> dict:
    """Exact gradients of ``op(*args, **kwargs)`` for ``grad_output``: ``{argument name: gradient}``.

    ``op``: "linear", "matmul", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
    "avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "scaled_dot_product_attention", "sum", "mean", "var", "std", "cumsum", "dot" (or the refkern function); the
    arguments are exactly the op's (same names: ``x``/``weight``/``bias``, ``a``/``b``,
    ``input``/``weight``/``bias``, ``input``/``dim``, ``input``/``normalized_shape``/``weight``/``bias``/``eps``,
    ``x``/``dim``/``keepdim``/``dtype``/``correction``, ``x``/``y``), and
    ``grad_output`` has the op's output shape and dtype. ``wrt``: the argument
    names whose gradients to compute (default: every differentiable argument given); only those are
    computed.

    **Guarantee.** Every element of every gradient is the exact sum of its products (each forward
    term ``l * r`` reaching output I contributes ``grad_output[I] * r`` to l's gradient), summed
    over the whole batch and every broadcast dimension, rounded once, to nearest even, to the
    argument's dtype, as torch returns it. Each gradient is one *adjoint call* of an exact refkern
    kernel (:mod:`refkern.gradients`), so the guarantee is the forward kernels' own. softmax and
    log_softmax: the real-valued derivative of the definition at the given inputs, ``y_i (g_i -
    sum_j g_j y_j)`` and ``g_i - y_i sum_j g_j`` with ``y`` the exact softmax, rounded once
    (:mod:`refkern.kernels.softmax_backward`; with ``dtype=``, at the input converted to that dtype, rounded
    once to the input's dtype, as autograd converts the gradient back). layer_norm and rms_norm: with
    ``r = (var + eps)**(-1/2)`` (exact mean, biased variance; rms_norm: ``mean(x**2)``, no centring),
    ``xhat = (x - mean) r`` and ``gw = grad_output * weight``, ``grad_input = r (gw - mean(gw) - xhat
    mean(gw xhat))`` (no ``mean(gw)`` for rms_norm), ``grad_weight`` and ``grad_bias`` the sums over
    the rows of ``grad_output * xhat`` and ``grad_output``, each real-valued and rounded once to its
    argument's dtype (:mod:`refkern.kernels.norm_backward`). group_norm: the same over each (sample,
    group), grad_weight and grad_bias summed over (sample, spatial) per channel; batch_norm with
    ``training=True``: the same over each channel's (N, spatial) elements (the gradient flows through
    the batch statistics); with ``training=False``: the affine map of the running statistics, ``g w /
    sqrt(rv + eps)``, ``sum g (x - rm) / sqrt(rv + eps)``, ``sum g`` (:mod:`refkern.kernels.batch_norm_backward`).
    Poolings: each element of grad_input the exact sum of ``g_o / d_o`` over the average windows that
    hold it, or of ``g_o`` over the windows whose selected maximum it is (torch's CPU choice: the first of
    equal maxima), rounded once (:mod:`refkern.kernels.pool_backward`). scaled_dot_product_attention:
    ``query``, ``key``, ``value`` from ``P = softmax(scale q k^T + mask)`` (real exp), ``dv = P^T dO``,
    ``dS = P (dO v^T - rowsum(dO O))``, ``dq = scale dS k``, ``dk = scale dS^T q``, summed over the batches
    that read each element, rounded once (:mod:`refkern.kernels.attention_backward`; dropout_p > 0 and
    non-finite inputs are refused). Reductions: ``sum``, ``g`` over the reduced dims (exact; with ``dtype=``
    converted once); ``mean``, ``g / n``; ``var``, ``2 g (x - mean) / (n - correction)``; ``std``, ``g (x - mean) /
    ((n - correction) std)``, each real-valued with the exact mean and std, rounded once
    (:mod:`refkern.kernels.reduction_backward`; with ``dtype=``, at the converted input, rounded once to the
    input's dtype); where it has no real value (``n - correction <= 0``, std at a zero variance, NaN or
    infinite inputs) the IEEE value torch's autograd formula gives. ``cumsum``: ``sum_{j >= i} g_j`` along
    dim, one exact sum rounded once (the forward cumsum of the flipped grad_output); ``dot``: ``g y`` and
    ``g x``, one product each.

    A convolution with ``padding_mode`` "reflect", "replicate" or "circular": the gradient of ``x``
    folds the padded border back onto the input, each element one exact sum of every product that
    reaches it through any padded position (:class:`_Fold`), rounded once.

    Returns numpy arrays, or CPU tensors when any input is a tensor.
    """
    return {k: adj.run() for k, adj in adjoints(op, grad_output, *args, wrt=wrt, **kwargs).items()}


def compare_backward(actual_grads: dict, op, grad_output, *args, rtol=None, atol=None, **kwargs) -> dict:
    """Judge a backend's gradients: ``{argument name: Report}``, one per entry of ``actual_grads``.

    ``actual_grads`` maps argument names (``"x"``, ``"weight"``, ``"bias"``, ``"a"``, ``"b"``,
    ``"input"``) to the backend's gradients (e.g. ``{"weight": conv.weight.grad}``); ``op``,
    ``grad_output`` and the arguments are those of :func:`backward`. Each gradient is judged by
    :func:`refkern.compare` on its adjoint call (the forward call whose exact result it is), so the
    verdicts (``exact``, ``rounding``, ``reduced-precision`` with the precision, ``mismatch``), the
    bounds, the emulated precisions and the structure tests are those of that forward op. A
    Report indexes the adjoint call's output: the gradient itself, except grad_weight of a
    convolution, which is judged as (C_in / groups, C_out, ...) (its first two axes swapped).
    softmax and log_softmax gradients are judged by the worst-case envelope of a correct float32
    (float64) implementation that differentiates from its own stored forward
    (:mod:`refkern.analysis._envelope_backward`): ``exact``, ``rounding`` or ``mismatch``; so are the
    layer_norm, rms_norm, group_norm and batch_norm gradients (the envelope of torch's CPU kernels'
    forms, same module), and the scaled_dot_product_attention gradients (``attention_bound``: torch's math
    backend and a flash backward, every intermediate possibly stored in the dtype). sum's gradient must be
    bit-exact (a copy: ``exact`` or ``mismatch``); mean's, var's and std's are judged by ``mean_bound`` and
    ``var_bound`` (same module: ``g * fl(1 / n)`` in the working precision; torch's ``(2 / dof) * g * (x -
    mean^)`` with the stored mean's cancellation and std's stored forward); cumsum's by compare's cumsum on the
    flipped grad_output, dot's by compare's matmul (K = 1).
    """
    from refkern.analysis.compare import compare

    if not isinstance(actual_grads, dict):
        raise TypeError(
            f"compare_backward: actual_grads must be a dict of argument name to gradient; got "
            f"{type(actual_grads).__name__}."
        )
    adj = adjoints(op, grad_output, *args, wrt=tuple(actual_grads), who="compare_backward", **kwargs)
    name = _op_name(op, "compare_backward")
    bound = _bind(name, args, kwargs, "compare_backward")
    out = {}
    for k, got in actual_grads.items():
        want = _shape(bound[k])
        if _shape(got) != want:
            raise ValueError(
                f"compare_backward: the gradient of {k} must have the shape of {k}, {want}; got shape {_shape(got)}."
            )
        if name in REDUCTION_OPS or (name == "cumsum" and adj[k].compute is not None):
            out[k] = _reduction_report(name, k, got, grad_output, bound, "compare_backward")
            continue
        if adj[k].op == "scaled_dot_product_attention":
            out[k] = _attn_report(adj[k].op, k, got, grad_output, bound, "compare_backward")
            continue
        if adj[k].op in POOL_OPS:
            out[k] = _pool_report(adj[k].op, got, grad_output, bound, "compare_backward")
            continue
        if adj[k].op in NORM_OPS:
            out[k] = _norm_report(adj[k].op, k, got, grad_output, bound, "compare_backward")
            continue
        if adj[k].op in ENVELOPE_OPS:
            out[k] = _envelope_report(adj[k].op, got, grad_output, bound, "compare_backward")
            continue
        a = adj[k].judge() if adj[k].judge is not None else adj[k]
        out[k] = compare(a.from_grad(got), a.op, *a.args, rtol=rtol, atol=atol, **a.kwargs)
        if adj[k].judge_alt is not None and out[k].verdict not in ("exact", "rounding"):
            b = adj[k].judge_alt()  # the other structure of a correct backend: the better fit is the verdict
            alt = compare(b.from_grad(got), b.op, *b.args, rtol=rtol, atol=atol, **b.kwargs)
            if _RANK[alt.verdict] < _RANK[out[k].verdict]:
                out[k] = alt
    return out
