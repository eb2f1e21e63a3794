"""Backward rules of the convolutions and transposed convolutions: each gradient one adjoint call of
an exact convolution (or, with a non-zero padding mode, a batched matmul of gathered rows:
:class:`_Fold`); :mod:`refkern.gradients` derives them."""

import itertools
import math

import numpy as np

import refkern.ops as _ops
from refkern._arrays import is_tensor
from refkern.kernels._grad import (
    _PAD_MODES,
    Adjoint,
    _check_grad,
    _identity,
    _ones_judge,
    _pad,
    _perm,
    _shape,
    _tap_judge,
)


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

        out["x"] = Adjoint("x", _ops.conv_op(True, nd).name, (g, w), kw, to_grad=to_grad, judge=judge)
    if "weight" in wrt:
        xb = x.reshape((1,) + sx) if unbatched else x
        xp = _pad(_pad(xb, pads, mode), [(0, -r) for r in rem])  # drop what no window reaches
        sp = _shape(xp)[2:]
        xs = _perm(xp.reshape((n, groups, cin_g) + sp), (2, 1, 0, *spatial[1:], 2 + nd)).reshape((cin_g, groups * n)
                                                                                                  + sp)  # fmt: skip
        out["weight"] = Adjoint("weight", op, (xs, _swap01(gb)),
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

    def _check_size(self, size, who):
        """NotImplementedError where the judge would gather more than :attr:`LIMIT` values."""
        if size > self.LIMIT:
            raise NotImplementedError(
                f"{who}: the gradient of x of a convolution with a padding_mode other than 'zeros' is judged as one "
                f"gathered sum, here of {size} values (more than {self.LIMIT}); backward computes it, "
                "compare_backward does not at this size."
            )

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
        self._check_size(c_in * p * m * cout_g * n, who)
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
        self._check_size(c_in * p * nt * cout_g * kp * n, who)
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
            rem = [q - (o - 1) * s - d * (k - 1) - 1 + lo + hi for q, o, s, d, k, (lo, hi)
                   in zip(self.in_size, self.o_size, self.stride, self.dilation, self.ksize, self.pads)]  # fmt: skip
            xp = _ops.conv_op(True, self.nd).reference(
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
                v = _ops.get("matmul").reference(a, b).reshape((n, c_in, len(chunk)))
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
    return Adjoint("x", _ops.conv_op(True, nd).name, (g, wz), kz)


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


def _weight_judge(patched, other, ksize, size, stride, dilation, groups):
    """grad_weight as a :func:`_tap_judge` whose taps are the images: of a convolution (``patched`` the padded
    input x_p, ``other`` grad_output, ``size`` the output's: grad_W[co, ci, t] = sum_n (sum_o grad_output[n, co,
    o] x_p[n, ci, o s + t d])), or of a transposed convolution (``patched`` the padded grad_output, ``other``
    the input x, ``size`` the input's: grad_W[ci, co, t] = sum_n (sum_i x[n, ci, i] grad_output_p[n, co, i s + t
    d]))."""
    n, c_p = _shape(patched)[:2]
    c_o = _shape(other)[1]
    p_g, o_g = c_p // groups, c_o // groups
    o, t = math.prod(size), math.prod(ksize)
    lt = _perm(_patches(patched, size, ksize, stride, dilation).reshape((n, groups, p_g, o, t)), (1, 0, 2, 4, 3))
    rt = _perm(other.reshape((n, groups, o_g, o)), (1, 0, 3, 2))
    shape = (c_o, p_g) + tuple(ksize)
    return _tap_judge("weight", lt.reshape((groups, n, p_g * t, o)), rt, lambda v: v.reshape(shape),
                      lambda v: v.reshape((1, c_o, p_g * t)))  # fmt: skip


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
        out["input"] = Adjoint("input", _ops.conv_op(False, nd).name, (gp, w),
                               dict(stride=stride, dilation=dilation, groups=groups), to_grad=unb,
                               from_grad=to_b)  # fmt: skip
    if "weight" in wrt:
        sp = _shape(gp)[2:]
        gs = _perm(gp.reshape((n, groups, cout_g) + sp), (2, 1, 0, *spatial[1:], 2 + nd)).reshape((cout_g, groups * n)
                                                                                                  + sp)  # fmt: skip
        xb = x.reshape((1,) + sx) if unbatched else x
        out["weight"] = Adjoint("weight", _ops.conv_op(False, nd).name, (gs, _swap01(xb)),
                                dict(stride=dilation, dilation=stride, groups=groups), to_grad=_swap01,
                                from_grad=_swap01, judge=lambda: _weight_judge(gp, xb, ksize, _shape(xb)[2:], stride,
                                                                               dilation, groups))  # fmt: skip
    if "bias" in wrt:
        out["bias"] = _bias_sum(g, unbatched)
    return out


def conv_rule(op, g, a, wrt, who):
    """The backward rule conv1d, conv2d and conv3d name (:class:`refkern.ops.Backward`), over the record's
    ``Op.spatial`` dimensions: grad_x is the transposed convolution of those dimensions (:func:`refkern.ops.conv_op`),
    grad_weight the convolution itself."""
    return _conv(_ops.get(op).spatial, op, g, a, wrt, who)


def conv_transpose_rule(op, g, a, wrt, who):
    """The backward rule of conv_transpose1d, 2d and 3d, over the record's ``Op.spatial`` dimensions: grad_input
    and grad_weight are convolutions of those dimensions."""
    return _conv_transpose(_ops.get(op).spatial, op, g, a, wrt, who)
