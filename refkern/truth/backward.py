"""Ground truth of :func:`refkern.backward`: the gradients from the forward definition, summed with
mpmath exactly, rounded once.

Nothing here goes through the adjoint calls of :mod:`refkern.gradients`. Each op walks its own
forward definition, term by term: a term ``l * r`` of output element I (l an element of one
argument, r of another, or r = 1 for a bias) puts the pair ``(grad_output[I], r)`` into the term
list of l's gradient element (and ``(grad_output[I], l)`` into r's). Every list is then summed
exactly by :func:`refkern.truth.products._exact_sum_of_products` (mpmath at a derived exact
precision) and rounded once to the argument's format. Small sizes only: Python loops.
"""

import itertools
import math
from fractions import Fraction

import numpy as np

import refkern.ops as _ops
from refkern._arrays import operand
from refkern.truth.products import _exact_sum_of_products
from refkern.truth.softmax import _decide, _ivq, iv

__all__ = ["backward"]



def _values(v, name, op):
    o = operand(v, name, op)
    return np.asarray(o.values, np.float64).reshape(o.shape), o


class _Grads:
    """Term lists of every gradient element, keyed by argument name and index."""

    def __init__(self, shapes: dict, wrt):
        self.terms = {k: {} for k in wrt}
        self.shapes = shapes

    def add(self, name, idx, g, r):
        t = self.terms.get(name)
        if t is not None:
            t.setdefault(idx, []).append((float(g), float(r)))

    def finish(self, fmt, as_tensor, precision):
        from refkern.kernels._common import deliver

        out = {}
        for k, terms in self.terms.items():
            shape = self.shapes[k]
            v = np.empty(shape)
            for idx in np.ndindex(*shape):
                v[idx] = _exact_sum_of_products(terms.get(idx, []), fmt, precision)
            out[k] = deliver(v, fmt, as_tensor)
        return out


def _linear(op, G, a, grads):
    x, w = a["x"], a["weight"]
    lead, n_in = x.shape[:-1], x.shape[-1]
    w2 = w if w.ndim == 2 else w[None, :]
    bias = a.get("bias")
    for m in np.ndindex(*lead):
        for o in range(w2.shape[0]):  # y[m, o] = bias[o] + sum_k x[m, k] w[o, k]
            oi = m + ((o,) if w.ndim == 2 else ())
            g = G[oi]
            for k in range(n_in):
                grads.add("x", m + (k,), g, w2[o, k])
                grads.add("weight", (o, k) if w.ndim == 2 else (k,), g, x[m + (k,)])
            if bias is not None:
                grads.add("bias", (o,) if bias.ndim == 1 else (), g, 1.0)


def _matmul(op, G, a, grads):
    A, B = a["a"], a["b"]
    A2 = A[None, :] if A.ndim == 1 else A
    B2 = B[:, None] if B.ndim == 1 else B
    batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])
    (m, k), n = A2.shape[-2:], B2.shape[-1]
    G2 = G.reshape(batch + (m, n))

    def own(idx, shape):  # the element of a (broadcast) operand that batch index idx reads
        lead = len(idx) - len(shape)
        return tuple(0 if s == 1 else i for i, s in zip(idx[lead:], shape))

    for t in np.ndindex(*batch):
        ta, tb = own(t, A2.shape[:-2]), own(t, B2.shape[:-2])
        for i, j, p in itertools.product(range(m), range(n), range(k)):  # C[t, i, j] = sum_p A[t, i, p] B[t, p, j]
            g = G2[t + (i, j)]
            grads.add("a", (ta + (i, p)) if A.ndim > 1 else (p,), g, B2[tb + (p, j)])
            grads.add("b", (tb + (p, j)) if B.ndim > 1 else (p,), g, A2[ta + (i, p)])


def _conv_geometry(op, nd, a, xshape, wshape):
    from refkern.ops._args import spatial as _pair

    stride = _pair(a["stride"], "stride", op, nd, 1)
    dilation = _pair(a["dilation"], "dilation", op, nd, 1)
    ksize = wshape[2:]
    p = a["padding"]
    if p == "valid":
        pads = [(0, 0)] * nd
    elif p == "same":
        pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, ksize)]
    else:
        pads = [(q, q) for q in _pair(p, "padding", op, nd, 0)]
    return stride, dilation, pads


def _source(j, lo, size, mode):
    """The input position that padded position j (padding lo on the left) holds, None for a zero."""
    i = j - lo
    if 0 <= i < size:
        return i
    if mode == "zeros":
        return None
    if mode == "replicate":
        return min(max(i, 0), size - 1)
    if mode == "circular":
        return i % size
    return -i if i < 0 else 2 * (size - 1) - i  # reflect


def _conv(nd, op, G, a, grads):
    x, w = a["x"], a["weight"]
    unbatched = x.ndim == nd + 1
    if unbatched:
        x, G = x[None], G[None]
    stride, dilation, pads = _conv_geometry(op, nd, a, x.shape, w.shape)
    mode = a["padding_mode"]
    groups = a["groups"]
    n_img, c_in = x.shape[:2]
    c_out, cin_g = w.shape[:2]
    cout_g = c_out // groups
    lift = (lambda idx: idx[1:]) if unbatched else (lambda idx: idx)
    bias = a.get("bias")
    for n, co in itertools.product(range(n_img), range(c_out)):
        gr = co // cout_g
        for o in np.ndindex(*G.shape[2:]):  # y[n, co, o] = bias[co] + sum_{ci, t} w[co, ci, t] x_p[n, ci', o s + t d]
            g = G[(n, co) + o]
            if bias is not None:
                grads.add("bias", (co,), g, 1.0)
            for ci in range(cin_g):
                cc = gr * cin_g + ci
                for t in np.ndindex(*w.shape[2:]):
                    src = [_source(o[i] * stride[i] + t[i] * dilation[i], pads[i][0], x.shape[2 + i], mode)
                           for i in range(nd)]  # fmt: skip
                    if any(s is None for s in src):  # a padded zero: a 0 term of grad_weight, none of grad_x
                        grads.add("weight", (co, ci) + t, g, 0.0)
                        continue
                    xi = (n, cc) + tuple(src)
                    grads.add("weight", (co, ci) + t, g, x[xi])
                    grads.add("x", lift(xi), g, w[(co, ci) + t])


def _conv_transpose(nd, op, G, a, grads):
    from refkern.ops._args import spatial as _pair

    x, w = a["input"], a["weight"]
    unbatched = x.ndim == nd + 1
    if unbatched:
        x, G = x[None], G[None]
    stride = _pair(a["stride"], "stride", op, nd, 1)
    dilation = _pair(a["dilation"], "dilation", op, nd, 1)
    padding = _pair(a["padding"], "padding", op, nd, 0)
    groups = a["groups"]
    n_img, c_in = x.shape[:2]
    cout_g = w.shape[1]
    cin_g = c_in // groups
    osz = G.shape[2:]
    lift = (lambda idx: idx[1:]) if unbatched else (lambda idx: idx)
    for n, ci in itertools.product(range(n_img), range(c_in)):  # torch's scatter definition
        gr = ci // cin_g
        for i in np.ndindex(*x.shape[2:]):
            for t in np.ndindex(*w.shape[2:]):
                o = tuple(i[q] * stride[q] - padding[q] + t[q] * dilation[q] for q in range(nd))
                if not all(0 <= o[q] < osz[q] for q in range(nd)):
                    continue
                for co in range(cout_g):
                    g = G[(n, gr * cout_g + co) + o]
                    grads.add("input", lift((n, ci) + i), g, w[(ci, co) + t])
                    grads.add("weight", (ci, co) + t, g, x[(n, ci) + i])
    if a.get("bias") is not None:
        for idx in np.ndindex(*G.shape):
            grads.add("bias", (idx[1],), G[idx], 1.0)


def _softmax_backward_row(x: list, g: list, fmt, log: bool) -> list:
    """One row of the softmax (log_softmax) gradient from the definition: ``dx_i = y_i sum_j y_j (g_i -
    g_j)`` (``= y_i (g_i - sum_j g_j y_j)``, since the y_j sum to 1), ``dx_i = g_i - y_i sum_j g_j``, on
    mpmath intervals (Ziv's loop of :mod:`refkern.truth.softmax`). A NaN forward or a non-finite g:
    NaN throughout; a -inf logit: ``y_i = 0``. The rational results are decided as exact rationals:
    equal finite logits (``y = 1/c``), a softmax gradient whose ``sum_{j: x_j = a} (g_i - g_j)`` is 0
    for every distinct logit a (the exp terms of distinct rational logits are linearly independent
    over the rationals, Lindemann-Weierstrass: the gradient is 0 exactly then, and irrational
    otherwise), a log_softmax gradient with ``sum_j g_j = 0``."""
    from refkern.truth.softmax import _decide, _ivq, iv

    n = len(x)
    if (
        any(v != v or v == math.inf for v in x)
        or all(v == -math.inf for v in x)
        or not all(math.isfinite(v) for v in g)
    ):
        return [math.nan] * n
    M = Fraction(max(v for v in x if v != -math.inf))
    d = [Fraction(v) - M if v != -math.inf else None for v in x]
    gq = [Fraction(v) for v in g]
    fin = [j for j in range(n) if d[j] is not None]
    total = sum(gq, Fraction(0))
    levels = sorted({d[j] for j in fin})
    out = []
    for i in range(n):
        if d[i] is None:
            out.append(float(g[i]) if log else 0.0)
            continue
        if len(levels) == 1:
            c = len(fin)
            if log:
                q = gq[i] - total / c
            else:
                q = sum((gq[i] - gq[j] for j in fin), Fraction(0)) / (c * c)
            out.append(_decide(fmt, lambda q=q: _ivq(q)))
            continue
        if log and total == 0:
            out.append(float(g[i]))
            continue
        if not log and all(sum((gq[i] - gq[j] for j in fin if d[j] == a), Fraction(0)) == 0 for a in levels):
            out.append(0.0)
            continue

        def make(i=i):
            E = {j: (iv.exp(_ivq(d[j])) if d[j] != 0 else iv.mpf(1)) for j in fin}
            S = iv.mpf(0)
            for j in fin:
                S += E[j]
            yi = E[i] / S
            if log:
                return _ivq(gq[i]) - _ivq(total) * yi
            acc = iv.mpf(0)
            for j in fin:
                acc += E[j] * _ivq(gq[i] - gq[j])
            return yi * acc / S

        out.append(_decide(fmt, make))
    return out


def _softmax_backward(name, G, og, a, wrt):
    from refkern.kernels._common import deliver

    x, ox = _values(a["input"], "input", "truth.backward")
    if a.get("dtype") is not None:  # torch's input.to(dtype) first: the gradient at the converted input
        from refkern._arrays import format_of
        from refkern.truth.softmax import _convert

        x = _convert(x.reshape(-1), ox.fmt, format_of(a["dtype"], "dtype", "truth.backward")).reshape(x.shape)
    dim = a["dim"] % max(x.ndim, 1)
    xs = np.moveaxis(x.reshape(x.shape or (1,)), dim, -1)
    gs = np.moveaxis(G.reshape(x.shape or (1,)), dim, -1)
    rows = [_softmax_backward_row(list(map(float, xr)), list(map(float, gr)), ox.fmt, name == "log_softmax")
            for xr, gr in zip(xs.reshape(-1, xs.shape[-1]), gs.reshape(-1, gs.shape[-1]))]  # fmt: skip
    v = np.moveaxis(np.array(rows, np.float64).reshape(xs.shape), -1, dim).reshape(x.shape)
    return {"input": deliver(v, ox.fmt, og.torch or ox.torch)}


def _norm_backward(name, G, og, a, wrt):
    """layer_norm / rms_norm gradients: their rows (the normalised dimensions flattened) to
    :func:`_norm_rows`; grad_weight and grad_bias sum over the rows, column by column."""
    from refkern.ops._args import eps as _eps
    from refkern.ops._args import normalized_shape as _shape_arg

    x, ox = _values(a["input"], "input", "truth.backward")
    shape = _shape_arg(a["normalized_shape"], "truth.backward")
    n = math.prod(shape)
    if name == "rms_norm" and a["eps"] is None:
        eps = 2.0**-52 if ox.fmt.prec == 53 else 2.0**-23
    else:
        eps = _eps(a["eps"], "truth.backward")
    X = x.reshape(-1, n)
    R = X.shape[0]
    wv = a.get("weight")
    W = np.ones(n) if wv is None else _values(wv, "weight", "truth.backward")[0].reshape(n)
    terms = [[(r, c) for r in range(R)] for c in range(n)]
    out = _norm_rows(X, G.reshape(-1, n), np.tile(W, (R, 1)), name == "layer_norm", eps, ox, a, wrt, terms)
    return _deliver_norm(out, {"input": x.shape, "weight": shape, "bias": shape}, og, ox, a)


def _group_norm_backward(name, G, og, a, wrt):
    """group_norm: rows of (C / G, spatial) per (sample, group), the weight of each element's channel;
    grad_weight and grad_bias of channel c sum over every (sample, spatial position) of c."""
    from refkern.ops._args import eps as _eps

    x, ox = _values(a["input"], "input", "truth.backward")
    nb, c = x.shape[:2]
    ng = int(a["num_groups"])
    hw = math.prod(x.shape[2:])
    cg = c // ng
    X = x.reshape(nb * ng, cg * hw)
    wv = a.get("weight")
    W = np.ones(c) if wv is None else _values(wv, "weight", "truth.backward")[0].reshape(c)
    Wr = np.array([[W[(r % ng) * cg + j // hw] for j in range(cg * hw)] for r in range(nb * ng)]).reshape(X.shape)
    # element (m, ch, s) of the input is row m * ng + ch // cg, column (ch % cg) * hw + s
    terms = [[(m * ng + ch // cg, (ch % cg) * hw + t) for m in range(nb) for t in range(hw)] for ch in range(c)]
    out = _norm_rows(X, G.reshape(X.shape), Wr, True, _eps(a["eps"], "truth.backward"), ox, a, wrt, terms)
    return _deliver_norm(out, {"input": x.shape, "weight": (c,), "bias": (c,)}, og, ox, a)


def _batch_norm_backward(name, G, og, a, wrt):
    """batch_norm: training, a norm over each channel's (N, spatial) elements with its own weight;
    eval (the running statistics given), the affine map ``g w / sqrt(rv + eps)`` per element."""
    from refkern.ops._args import eps as _eps

    x, ox = _values(a["input"], "input", "truth.backward")
    nb, c = x.shape[:2]
    hw = math.prod(x.shape[2:])
    eps = _eps(a["eps"], "truth.backward")
    # channel rows (C, N hw): element (m, ch, s) is row ch, column m hw + s
    X = x.reshape(nb, c, hw).transpose(1, 0, 2).reshape(c, nb * hw)
    Gc = G.reshape(nb, c, hw).transpose(1, 0, 2).reshape(c, nb * hw)
    wv = a.get("weight")
    W = np.ones(c) if wv is None else _values(wv, "weight", "truth.backward")[0].reshape(c)
    Wr = np.repeat(W, nb * hw).reshape(X.shape)
    if a["training"]:
        terms = [[(ch, k) for k in range(nb * hw)] for ch in range(c)]
        out = _norm_rows(X, Gc, Wr, True, eps, ox, a, wrt, terms)
    else:
        rm = _values(a["running_mean"], "running_mean", "truth.backward")[0].reshape(c)
        rv = _values(a["running_var"], "running_var", "truth.backward")[0].reshape(c)
        out = _batch_eval_rows(X, Gc, Wr, rm, rv, eps, ox, a, wrt)
    if "input" in out:
        out["input"] = out["input"].reshape(c, nb, hw).transpose(1, 0, 2)
    return _deliver_norm(out, {"input": x.shape, "weight": (c,), "bias": (c,)}, og, ox, a)


def _deliver_norm(out, shapes, og, ox, a):
    from refkern.kernels._common import deliver

    fmts = _param_fmts(ox, a)
    return {k: deliver(np.ascontiguousarray(v).reshape(shapes[k]), fmts[k], og.torch or ox.torch)
            for k, v in out.items()}  # fmt: skip


def _param_fmts(ox, a):
    fmts = {"input": ox.fmt}
    for k in ("weight", "bias"):
        if a.get(k) is not None:
            fmts[k] = _values(a[k], k, "truth.backward")[1].fmt
    return fmts


def _wrt(a, wrt):
    wrt = tuple(k for k in ("input", "weight", "bias") if a.get(k) is not None) if wrt is None else wrt
    return (wrt,) if isinstance(wrt, str) else wrt


def _square(q):
    p, t = math.isqrt(q.numerator), math.isqrt(q.denominator)
    return p * p == q.numerator and t * t == q.denominator


def _sqrtq(q):
    return Fraction(math.isqrt(q.numerator), math.isqrt(q.denominator))


def _over_sqrt(pairs, fmt):
    """RN(sum t / sqrt(z)) over the pairs (t, z) of Fractions (z > 0): pairs whose z differ by a
    rational square share one 1/sqrt and may cancel (grouped first, with Fractions); all groups
    square: a rational; else Ziv's loop on mpmath intervals."""
    from refkern.truth.softmax import _decide, _ivq, iv

    by_z = {}
    for t, z in pairs:
        for z0 in by_z:
            if _square(z / z0):
                by_z[z0] += t / _sqrtq(z / z0)
                break
        else:
            by_z[z] = t
    by_z = {z: t for z, t in by_z.items() if t != 0}
    if not by_z:
        return 0.0
    if all(_square(z) for z in by_z):
        q = sum((t / _sqrtq(z) for z, t in by_z.items()), Fraction(0))
        return 0.0 if q == 0 else _decide(fmt, lambda: _ivq(q))

    def make():
        acc = iv.mpf(0)
        for z, t in by_z.items():
            acc += _ivq(t) / iv.sqrt(_ivq(z))
        return acc

    return _decide(fmt, make, 256)


def _norm_rows(X, Gr, Wr, center, eps, ox, a, wrt, terms):
    """Gradients of a norm over the rows of X (R, n), grad_output Gr, the weight Wr (R, n) of every
    element, from the autograd formula on mpmath intervals, with mpmath's own square root: per row ``r
    = 1 / sqrt(var + eps)``, ``xhat = (x - mean) r``, ``gw = g w``, ``grad_input = r (gw - mean(gw) - xhat
    mean(gw xhat))`` (no ``mean(gw)`` for rms_norm); grad_weight[c] and grad_bias[c] the sums of ``g
    xhat`` and ``g`` over the elements ``terms[c]`` ((row, column) pairs); Ziv's loop rounds once.
    Rational results are found first with Fractions (the loop would not end on a midpoint): a zero
    numerator, ``var + eps`` the square of a rational, a grad_weight whose terms cancel within each
    group of ``var + eps`` equal up to a rational square factor (distinct groups: independent square
    roots). A row with a NaN or an infinity (or ``var + eps = 0``): float64 IEEE arithmetic on the same
    formula (and every parameter sum then too)."""
    from refkern.truth.softmax import _decide, _ivq, iv

    R, n = X.shape
    fmts = _param_fmts(ox, a)
    wrt = _wrt(a, wrt)
    Q = lambda v: Fraction(float(v))  # noqa: E731
    stats = []  # per row: None (IEEE row) or (xs - mean, z)
    for r in range(R):
        if not (np.isfinite(X[r]).all() and np.isfinite(Gr[r]).all() and np.isfinite(Wr[r]).all()):
            stats.append(None)
            continue
        xs = [Q(v) for v in X[r]]
        mu = sum(xs, Fraction(0)) / n if center else Fraction(0)
        d = [v - mu for v in xs]
        z = sum((t * t for t in d), Fraction(0)) / n + Q(eps)
        stats.append((d, z) if z > 0 else None)
    ieee = None
    if any(s is None for s in stats):
        with np.errstate(all="ignore"):
            mu = X.mean(axis=1, keepdims=True) if center else 0.0
            rr = 1.0 / np.sqrt(((X - mu) ** 2).mean(axis=1, keepdims=True) + eps)
            xh = (X - mu) * rr
            gw = Gr * Wr
            m1 = gw.mean(axis=1, keepdims=True) if center else 0.0
            ieee = (rr * (gw - m1 - xh * (gw * xh).mean(axis=1, keepdims=True)), xh)
    out = {}
    if "input" in wrt:
        v = np.empty((R, n))
        for r in range(R):
            if stats[r] is None:
                v[r] = [_round_float_to(t, ox.fmt) for t in ieee[0][r]]
                continue
            d, z = stats[r]
            gw = [Q(Gr[r, j]) * Q(Wr[r, j]) for j in range(n)]
            A = sum(gw, Fraction(0)) / n if center else Fraction(0)
            C = sum((p * q for p, q in zip(gw, d)), Fraction(0)) / n
            for j in range(n):
                P = gw[j] - A - d[j] * C / z
                if P == 0:
                    v[r, j] = 0.0
                    continue
                if _square(z):
                    q = P / _sqrtq(z)
                    v[r, j] = _decide(ox.fmt, lambda q=q: _ivq(q))
                    continue

                def make(r=r, j=j, d=d, z=z, gw=gw):
                    rr = 1 / iv.sqrt(_ivq(z))
                    xh = [_ivq(t) * rr for t in d]
                    gi = [_ivq(t) for t in gw]
                    m1 = iv.mpf(0)
                    m2 = iv.mpf(0)
                    for k in range(n):
                        m1 += gi[k]
                        m2 += gi[k] * xh[k]
                    m1 = m1 / n if center else iv.mpf(0)
                    return rr * (gi[j] - m1 - xh[j] * (m2 / n))

                v[r, j] = _decide(ox.fmt, make, 256)
        out["input"] = v
    for k in ("weight", "bias"):
        if k not in wrt:
            continue
        fmt = fmts[k]
        v = np.empty(len(terms))
        for c, els in enumerate(terms):
            if ieee is not None:
                with np.errstate(all="ignore"):
                    rs, js = np.array([e[0] for e in els], np.intp), np.array([e[1] for e in els], np.intp)
                    t = (Gr[rs, js] * ieee[1][rs, js]).sum() if k == "weight" else Gr[rs, js].sum()
                v[c] = _round_float_to(float(t), fmt)
                continue
            if k == "bias":
                q = sum((Q(Gr[r, j]) for r, j in els), Fraction(0))
                v[c] = _decide(fmt, lambda q=q: _ivq(q))
                continue
            v[c] = _over_sqrt([(Q(Gr[r, j]) * stats[r][0][j], stats[r][1]) for r, j in els], fmt)
        out[k] = v
    return out


def _batch_eval_rows(X, Gc, Wr, rm, rv, eps, ox, a, wrt):
    """batch_norm in eval mode over the channels as rows: ``grad_input = g w / sqrt(rv + eps)``,
    ``grad_weight = sum g (x - rm) / sqrt(rv + eps)``, ``grad_bias = sum g``, each one rational over one
    square root (or a rational), rounded once. A channel with a NaN or an infinity (or ``rv + eps <=
    0``): float64 IEEE arithmetic on torch's formula; grad_bias stays the exact sum where g is finite."""
    C, K = X.shape
    fmts = _param_fmts(ox, a)
    wrt = _wrt(a, wrt)
    Q = lambda v: Fraction(float(v))  # noqa: E731
    out = {k: np.empty((C, K) if k == "input" else C) for k in wrt}
    for c in range(C):
        z = Q(rv[c]) + Q(eps) if math.isfinite(rv[c]) else None
        real = (z is not None and z > 0 and math.isfinite(rm[c]) and np.isfinite(X[c]).all()
                and np.isfinite(Gc[c]).all() and np.isfinite(Wr[c]).all())  # fmt: skip
        with np.errstate(all="ignore"):
            inv = 1.0 / np.sqrt(rv[c] + eps)
        for k in wrt:
            if k == "bias":
                if np.isfinite(Gc[c]).all():
                    out[k][c] = _over_sqrt([(sum((Q(t) for t in Gc[c]), Fraction(0)), Fraction(1))], fmts[k])
                else:
                    with np.errstate(all="ignore"):
                        out[k][c] = _round_float_to(float(Gc[c].sum()), fmts[k])
            elif k == "weight":
                if real:
                    P = sum((Q(g) * (Q(x) - Q(rm[c])) for g, x in zip(Gc[c], X[c])), Fraction(0))
                    out[k][c] = _over_sqrt([(P, z)], fmts[k])
                else:
                    with np.errstate(all="ignore"):
                        out[k][c] = _round_float_to(float((Gc[c] * (X[c] - rm[c])).sum() * inv), fmts[k])
            else:
                for j in range(K):
                    if real:
                        P = Q(Gc[c, j]) * Q(Wr[c, j])
                        out[k][c, j] = (_over_sqrt([(P, z)], ox.fmt) if P != 0
                                        else math.copysign(0.0, Gc[c, j]) * math.copysign(1.0, Wr[c, j]))  # fmt: skip
                    else:
                        with np.errstate(all="ignore"):
                            out[k][c, j] = _round_float_to(float(Gc[c, j] * inv * Wr[c, j]), ox.fmt)
    return out


def _pool_backward(name, G, og, a, wrt):
    """Pooling gradients from the definitions, term by term: an average's window o (torch's: start
    ``o s - p``, end ``min(start + k, L + p)``, divisor its count with or without the padded positions,
    or divisor_override; adaptive: ``floor(o L / O)`` to ``ceil((o + 1) L / O)``) puts ``g_o / d_o`` on
    each input position inside it; a maximum's window puts ``g_o`` on its first maximum in row-major
    tap order (the running maximum starts at -inf and is replaced by a larger value or a NaN; the first
    tap inside the input when nothing replaces it). Each element's terms are summed as Fractions and
    rounded once (mpmath); +0 for a zero sum; terms with a NaN or an infinity: IEEE float64 in output
    order."""
    from refkern.kernels._common import deliver
    from refkern.truth.softmax import _decide, _ivq

    x, ox = _values(a["input"], "input", "truth.backward")
    nd = 2 if name.endswith("2d") else 1
    H, W = (x.shape[-2], x.shape[-1]) if nd == 2 else (1, x.shape[-1])
    X = x.reshape(-1, H, W)
    OW = G.shape[-1]
    OH = G.shape[-2] if nd == 2 else 1
    Gp = G.reshape(-1, OH, OW)

    def pair(v, default, one):  # an int or tuple as (H, W) values, a 1-d one lifted with ``one``
        v = default if v is None or (isinstance(v, (tuple, list)) and len(v) == 0) else v
        t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd
        t = t * (nd // len(t))
        return (one, *t) if nd == 1 else t

    terms = {}  # (plane, h, w) -> [(g, d)]

    def put(p, h, w, g, d):
        terms.setdefault((p, h, w), []).append((float(g), d))

    if name.startswith("adaptive"):
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    hs, he = i * H // OH, -(-(i + 1) * H // OH)
                    ws, we = j * W // OW, -(-(j + 1) * W // OW)
                    for h in range(hs, he):
                        for w in range(ws, we):
                            put(p, h, w, Gp[p, i, j], (he - hs) * (we - ws))
    elif name.startswith("avg_pool"):
        k = pair(a["kernel_size"], None, 1)
        st = pair(a["stride"], a["kernel_size"], 1)
        pd = pair(a["padding"], 0, 0)
        over = a.get("divisor_override")
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    sh, sw = i * st[0] - pd[0], j * st[1] - pd[1]
                    eh, ew = min(sh + k[0], H + pd[0]), min(sw + k[1], W + pd[1])
                    if a["count_include_pad"]:
                        cnt = (eh - sh) * (ew - sw)
                    else:
                        cnt = (min(eh, H) - max(sh, 0)) * (min(ew, W) - max(sw, 0))
                    for h in range(max(sh, 0), min(eh, H)):
                        for w in range(max(sw, 0), min(ew, W)):
                            put(p, h, w, Gp[p, i, j], over or cnt)
    else:
        k = pair(a["kernel_size"], None, 1)
        st = pair(a["stride"], a["kernel_size"], 1)
        pd = pair(a["padding"], 0, 0)
        dl = pair(a["dilation"], 1, 1)
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    taps = [(i * st[0] - pd[0] + u * dl[0], j * st[1] - pd[1] + v * dl[1])
                            for u in range(k[0]) for v in range(k[1])]  # fmt: skip
                    taps = [(h, w) for h, w in taps if 0 <= h < H and 0 <= w < W]
                    best, at = -math.inf, taps[0]
                    for h, w in taps:
                        v = X[p, h, w]
                        if v > best or v != v:
                            best, at = v, (h, w)
                    put(p, *at, Gp[p, i, j], 1)
    out = np.zeros(X.shape)
    for (p, h, w), ts in terms.items():
        if not all(math.isfinite(g) for g, _ in ts):
            acc = 0.0
            with np.errstate(all="ignore"):
                for g, d in ts:
                    acc = float(np.float64(acc) + np.float64(g) / np.float64(d))
            out[p, h, w] = _round_float_to(acc, ox.fmt)
            continue
        q = sum((Fraction(g) / d for g, d in ts), Fraction(0))
        out[p, h, w] = 0.0 if q == 0 else _decide(ox.fmt, lambda q=q: _ivq(q))
    return {"input": deliver(out.reshape(x.shape), ox.fmt, og.torch or ox.torch)}


def _attention_backward(name, G, og, a, wrt):
    """scaled_dot_product_attention: every gradient element from the definition (module docstring of
    :mod:`refkern.kernels.attention_backward`) on mpmath intervals, Ziv's loop. Per row: exact logits
    (:func:`refkern.truth.softmax._logit`), ``dP_j = dO_i . v_j`` as a Fraction, ``P = exp(z - max) /
    sum``, ``dS_j = P_j (dP_j - sum_k P_k dP_k)``. Rational values exactly: a row of equal finite logits
    (``P = 1/c``), a ``dS_j`` that vanishes (``sum_{k: z_k = t} (dP_j - dP_k) = 0`` for every distinct
    logit t: Lindemann-Weierstrass), after merging the terms of rows with equal logits (``value``). An
    element the loop leaves undecided at 128 bits may be a rational sum of irrational terms (``sum_j dS_ij =
    0``: a dq element is 0 when its key column is constant over the row's keys; dk, dv terms of rows whose
    logits are permutations of one another): the terms are grouped by their rows' multiset of logits, and
    each group's sum is tested exactly as an exponential sum (:func:`_rational_classes`), then, past 4096
    bits, the groups together (:func:`_rational_across`, up to _ACROSS_CAP terms; beyond it a bounded loop
    and a RuntimeError). An exact 0 is +0.0, the rounding of the real 0 (round_fraction's, the fast path's):
    an exact sum of nonzero terms that is 0 is +0 in IEEE round-to-nearest too, and the positive scale keeps
    it. (torch's math backend applies a negative scale as ``q (-sqrt|s|)``, ``k sqrt|s|``: an exact dS @ k of
    +0 would come back as -0 in its dq; the real derivative has no sign, and its computed value is a
    rounding residue anyway.) A NaN or +inf logit: NaN wherever the row reaches; a fully masked
    row: ``P = 0``. The layout comes from the kernel's validation; the numbers do not."""
    from refkern.kernels._common import deliver
    from refkern.kernels.attention import attention_operands
    from refkern.truth.softmax import _decide, _ivq, _logit, iv

    at = attention_operands(a["query"], a["key"], a["value"], a.get("attn_mask"), a.get("dropout_p", 0.0),
                            a.get("is_causal", False), a.get("scale"), a.get("enable_gqa", False),
                            op="truth.backward")  # fmt: skip
    B = at.iq.size
    L, S = at.Q.shape[1], at.K.shape[1]
    Gb = G.reshape(B, L, -1)
    fmt = at.fmt
    rows = {}

    def with_grad(r, dO):
        """The row r for the gradient row dO (Fractions): dP, and the set of j whose dS vanishes."""
        d, fin = r["d"], r["fin"]
        dP = {j: sum((x * v for x, v in zip(dO, r["V"][j]) if x != 0), Fraction(0)) for j in fin}
        levels = set(d.values())
        zero = {j for j in fin if all(sum((dP[j] - dP[k] for k in fin if d[k] == t), Fraction(0)) == 0 for t in levels)}
        return {**r, "dO": dO, "dP": dP, "zero": zero}

    def row(b, i):
        if (b, i) in rows:
            return rows[(b, i)]
        if at.causal:
            mrow = [(-math.inf if j > i else 0.0) for j in range(S)]
        elif at.has_mask:
            m = at.mask[at.im[b], i if at.mask.shape[1] > 1 else 0]
            mrow = [float(m[j if m.size > 1 else 0]) for j in range(S)]
        else:
            mrow = [0.0] * S
        q = at.Q[at.iq[b], i].tolist()
        z = [_logit(q, at.K[at.ik[b], j].tolist(), mrow[j], at.scale) for j in range(S)]
        r = {"nan": any(isinstance(t, float) and (t != t or t == math.inf) for t in z)}
        fin = [j for j in range(S) if isinstance(z[j], Fraction)]
        r["fin"] = fin
        if fin and not r["nan"]:
            M = max(z[j] for j in fin)
            d = {j: z[j] - M for j in fin}
            r.update(d=d, eq=len(set(d.values())) == 1, key=tuple(sorted(d.items())), vb=int(at.iv[b]),
                     V=[[Fraction(float(v)) for v in at.V[at.iv[b], j]] for j in range(S)])  # fmt: skip
            r = with_grad(r, [Fraction(float(x)) for x in Gb[b, i]])
        rows[(b, i)] = r
        return r

    def value(terms, scaled):
        """RN(s sum coef X) with X = P_j or dS_j of a row. Rows of equal logits (and values) merge first:
        ``sum c P_j = P_j sum c`` and ``sum c dS_j(dO) = dS_j(sum c dO)`` (dS is linear in dO)."""
        live = [(r, j, kind, Fraction(float(cf))) for r, j, kind, cf in terms if r["nan"] or r["fin"]]
        if any(r["nan"] for r, _, _, _ in live):
            return math.nan
        sq = Fraction(at.scale) if scaled else Fraction(1)
        merged = {}
        for r, j, kind, cf in live:
            if j not in r["d"] or cf == 0:
                continue
            k = (r["key"], j, kind) if kind == "P" else (r["key"], r["vb"], j, kind)
            if k not in merged:
                merged[k] = [r, cf if kind == "P" else [cf * x for x in r["dO"]]]
            elif kind == "P":
                merged[k][1] += cf
            else:
                merged[k][1] = [x + cf * y for x, y in zip(merged[k][1], r["dO"])]
        exact, rest = Fraction(0), []
        for k, (r, c) in merged.items():
            j, kind = k[-2], k[-1]
            if kind == "dS":
                r, c = with_grad(r, c), Fraction(1)
            if c == 0 or (kind == "dS" and j in r["zero"]):
                continue
            n = len(r["fin"])
            if r["eq"]:
                mean = sum(r["dP"].values(), Fraction(0)) / n
                exact += c * (Fraction(1, n) if kind == "P" else (r["dP"][j] - mean) / n)
            else:
                rest.append((r, j, kind, c))
        if not rest:
            return _decide(fmt, lambda: _ivq(sq * exact))

        def make(exact=exact, rest=rest):
            tot = _ivq(exact)
            for r, j, kind, cf in rest:
                e = {k: (iv.exp(_ivq(t)) if t != 0 else iv.mpf(1)) for k, t in r["d"].items()}
                den = iv.mpf(0)
                for k in r["fin"]:
                    den += e[k]
                P = {k: e[k] / den for k in r["fin"]}
                if kind == "P":
                    x = P[j]
                else:
                    delta = iv.mpf(0)
                    for k in r["fin"]:
                        delta += P[k] * _ivq(r["dP"][k])
                    x = P[j] * (_ivq(r["dP"][j]) - delta)
                tot += _ivq(cf) * x
            return _ivq(sq) * tot

        for prec in (64, 128):  # an irrational value is decided here, almost always
            v = _round_at(fmt, make, prec)
            if v is not None:
                return v
        q, left = _rational_classes(rest)  # rational sums (an exact 0, a midpoint) never decide: find them
        exact += q
        rest = [t for _, _, ts in left for t in ts]
        if not rest:
            return _decide(fmt, lambda: _ivq(sq * exact))
        if len(left) == 1:  # irrational (Lindemann-Weierstrass): decided at some precision
            return _decide(fmt, lambda: make(exact, rest), start=256)
        for prec in (256, 512, 1024, 2048, 4096):  # irrational values that need the bits (a sign under large
            v = _round_at(fmt, lambda: make(exact, rest), prec)  # logits: e**-1000 against dP), before the
            if v is not None:  # costlier test of the classes together
                return v
        how, q = _rational_across(left)
        if how == "rational":
            return _decide(fmt, lambda: _ivq(sq * (exact + q)))
        if how == "irrational":
            return _decide(fmt, lambda: make(exact, rest), start=8192)
        for prec in (8192, 16384, 32768, 65536):  # not proven irrational: a bounded loop, then an honest failure
            v = _round_at(fmt, lambda: make(exact, rest), prec)
            if v is not None:
                return v
        raise RuntimeError("truth: the interval loop did not converge: the terms of rows with different logits "
                           f"may cancel (more than {_ACROSS_CAP} terms to test them together); please report the "
                           "input")  # fmt: skip

    names = ("query", "key", "value") if wrt is None else ((wrt,) if isinstance(wrt, str) else tuple(wrt))
    out = {}
    for k in names:
        X = {"query": at.Q, "key": at.K, "value": at.V}[k]
        idx = {"query": at.iq, "key": at.ik, "value": at.iv}[k]
        v = np.zeros(X.shape)
        for t, r_, c in np.ndindex(*X.shape):
            bs = [b for b in range(B) if idx[b] == t]
            if k == "query":
                terms = [(row(b, r_), j, "dS", at.K[at.ik[b], j, c]) for b in bs for j in range(S)]
            elif k == "key":
                terms = [(row(b, i), r_, "dS", at.Q[at.iq[b], i, c]) for b in bs for i in range(L)]
            else:
                terms = [(row(b, i), r_, "P", Gb[b, i, c]) for b in bs for i in range(L)]
            v[t, r_, c] = value(terms, k != "value")
        out[k] = deliver(v.reshape(np.shape(a[k])), fmt, og.torch or at.tensor)
    return out


def _round_at(fmt, make, prec: int):
    """One step of Ziv's loop: ``make()`` at iv precision prec, rounded when both ends agree, else None."""
    from refkern.truth.softmax import _round_ends

    saved = iv.prec
    try:
        iv.prec = prec
        return _round_ends(make(), fmt)
    finally:
        iv.prec = saved


def _xmul(a: dict, b: dict) -> dict:
    """The product of two exponential sums ``{t: c}`` (``sum_t c e**t``): ``e**t e**u = e**(t + u)``."""
    out = {}
    for t, c in a.items():
        for u, d in b.items():
            out[t + u] = out.get(t + u, 0) + c * d
    return out


def _rational_classes(rest):
    """``(q, left)``: the attention terms of rest (row, j, kind, coef) split into classes of rows with the same
    multiset of logit offsets; ``q`` the exact sum of the classes whose sum is rational, left the others' terms.

    A row's offsets ``d_k = z_k - max z`` (rationals, one of them 0) give ``P_j = e**d_j / S`` and
    ``dS_j = e**d_j (dP_j S - T) / S**2`` with ``S = sum_k e**d_k`` and ``T = sum_k dP_k e**d_k``; every row of
    a class has the same S (a permutation of the keys, or another batch, changes nothing in it). A class's
    terms sum to ``A / S**2``, ``A = S sum_P c e**d_j + sum_dS c e**d_j (dP_j S - T)`` (T of the term's own
    row), A and ``S**2`` exponential sums ``sum_t C_t e**t`` with rational C_t and distinct rational t. Such
    sums are equal iff their coefficients are (Lindemann-Weierstrass: e**t for distinct algebraic t are
    linearly independent over the algebraic numbers), so ``A / S**2`` is a rational q iff ``A = q S**2``
    coefficient by coefficient, with ``q = C_0 / D_0`` at t = 0 (``D_0 >= 1``: the top logit with itself).
    Otherwise the class's sum is irrational. Covers ``sum_j dS_ij = 0`` (a dq element whose key column is
    constant over the row's keys: the coefficients c_j equal) and rows whose logits are permutations of one
    another (dk and dv terms that cancel across rows). Classes of different S that cancel only together:
    :func:`_rational_across`."""
    classes = {}
    for t in rest:
        classes.setdefault(tuple(sorted(t[0]["d"].values())), []).append(t)
    q, left = Fraction(0), []
    for offs, ts in classes.items():
        S = {}
        for d in offs:
            S[d] = S.get(d, 0) + 1
        U, W = {}, {}  # A = S U - sum_r W_r T_r: U_j = c (P terms), c dP_j (dS terms); W_r = sum c e**d_j
        for r, j, kind, c in ts:
            d = r["d"][j]
            U[d] = U.get(d, 0) + (c if kind == "P" else c * r["dP"][j])
            if kind == "dS":
                w = W.setdefault(id(r), [r, {}])[1]
                w[d] = w.get(d, 0) + c
        if W:
            A = _xmul(S, U)
            for r, w in W.values():
                T = {}
                for k, d in r["d"].items():
                    T[d] = T.get(d, 0) + r["dP"][k]
                for t, x in _xmul(w, T).items():
                    A[t] = A.get(t, 0) - x
            D = _xmul(S, S)
        else:
            A, D = U, S
        v = _ratio(A, D)
        if v is not None:
            q += v
        else:
            left.append((A, D, ts))
    return q, left


def _ratio(A: dict, D: dict):
    """``A / D`` when it is a rational (its value), else None: exponential sums with ``D_0 > 0``."""
    v = Fraction(A.get(0, 0)) / D[0]
    return v if all(A.get(t, 0) == v * D.get(t, 0) for t in set(A) | set(D)) else None


_ACROSS_CAP = 1 << 16  # the most terms the product of the classes' denominators may have (an upper bound)


def _rational_across(left):
    """The classes left by :func:`_rational_classes` (two or more, each of an irrational sum), together:
    ``sum_r A_r / D_r`` is rational q iff ``sum_r A_r prod_{r' != r} D_r' = q prod_r D_r`` coefficient by
    coefficient (the same Lindemann-Weierstrass argument; ``prod D_r`` has the coefficient ``prod D_r0 > 0`` at
    0). Classes of different S cancel only when their denominators share factors (S proportional: a row
    whose keys are another's, each repeated; or S of common polynomial factors in e**(1/N)): rare, but
    then no precision decides the element. ("rational", q), ("irrational", None), or ("unknown", None) when
    the product would exceed _ACROSS_CAP terms. Costly (the products): tried once the loop has not decided
    the element at 4096 bits."""
    if math.prod(len(D) for _, D, _ in left) > _ACROSS_CAP:
        return "unknown", None
    # on integers: exponents times the lcm of their denominators, the A_r times that of their coefficients'
    lx = math.lcm(*(Fraction(t).denominator for A, D, _ in left for t in (*A, *D)))
    lc = math.lcm(*(Fraction(c).denominator for A, _, _ in left for c in A.values()))
    F, G = {}, {0: 1}
    for A, D, _ in left:  # F / G = sum so far: (F D + A G) / (G D)
        A = {int(t * lx): int(c * lc) for t, c in A.items()}
        D = {int(t * lx): int(c) for t, c in D.items()}
        F = _xmul(F, D)
        for t, x in _xmul(A, G).items():
            F[t] = F.get(t, 0) + x
        G = _xmul(G, D)
    v = _ratio(F, G)
    if v is not None:
        v /= lc
    return ("irrational", None) if v is None else ("rational", v)


def _dot(op, G, a, grads):
    x, y = a["x"], a["y"]
    for k in range(x.shape[0]):  # out = sum_k x[k] y[k]
        grads.add("x", (k,), G[()], y[k])
        grads.add("y", (k,), G[()], x[k])


def _reduction_backward(name, G, og, a, wrt):
    """sum, mean, var, std and cumsum from their definitions, element by element: sum ``g`` (converted once
    to x's format), mean ``g / n`` (a Fraction), cumsum ``sum_{j >= i} g_j`` (mpmath, exact precision),
    var ``2 g (x_j - mu) / dof`` (Fractions), std ``g (x_j - mu) / sqrt(dof M2)`` (mpmath intervals, Ziv's
    loop; rational when ``dof M2`` is a square), each rounded once to x's format. Where torch's autograd
    formula has no real value (:mod:`refkern.kernels.reduction_backward`'s rules), its IEEE value."""
    from refkern.kernels._common import deliver
    from refkern.kernels.reduction import reduced_dims
    from refkern.ops._args import correction as _correction

    x, ox = _values(a["x"], "x", "truth.backward")
    fmt = ox.fmt
    tensor = og.torch or ox.torch
    nd = x.ndim
    if name == "cumsum":
        if nd == 0:
            return {"x": deliver(np.array(_round_float_to(float(G), fmt)), fmt, tensor)}
        ax = a["dim"] % nd
        out = np.empty(x.shape)
        for idx in np.ndindex(*x.shape):
            terms = [(float(G[idx[:ax] + (j,) + idx[ax + 1 :]]), 1.0) for j in range(idx[ax], x.shape[ax])]
            out[idx] = _exact_sum_of_products(terms, fmt, None)
        return {"x": deliver(out, fmt, tensor)}
    dims = reduced_dims(a["dim"], nd, "truth.backward")
    n = math.prod(x.shape[d] for d in dims) if nd else 1
    kept = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    Gb = np.broadcast_to(G.reshape(kept), x.shape)  # each element's grad_output value
    out = np.empty(x.shape)
    if name in ("sum", "mean"):
        for idx in np.ndindex(*x.shape):
            g = float(Gb[idx])
            if name == "sum":
                out[idx] = _round_float_to(g, fmt)
            elif not math.isfinite(g) or g == 0:
                out[idx] = _round_float_to(g / n, fmt)
            else:
                out[idx] = _decide(fmt, lambda q=Fraction(g) / n: _ivq(q))
        return {"x": deliver(out, fmt, tensor)}
    corr = _correction(a["correction"], "truth.backward")
    dof = n - corr
    nodim = a["dim"] is None or nd == 0
    groups = {}  # the elements of each reduced set, keyed by the kept indices
    for idx in np.ndindex(*x.shape):
        groups.setdefault(tuple(i for k, i in enumerate(idx) if k not in dims), []).append(idx)
    for members in groups.values():
        vals = [float(x[i]) for i in members]
        g = float(Gb[members[0]])
        for i, v in zip(members, _var_row(vals, g, dof, name == "std", nodim, fmt)):
            out[i] = v
    return {"x": deliver(out, fmt, tensor)}


def _var_row(vals, g, dof, want_std, nodim, fmt):
    """One reduced set of var (std): torch's ``(2 / dof) * grad_var * (x - mean)``, grad_var = g (var) or
    ``g / (2 std)`` masked to 0 where std is 0 (std), as an extended-real product: exact where every factor
    is a finite real, else IEEE float64 on the factors' signs (their magnitudes do not matter then)."""
    n = len(vals)
    if not all(math.isfinite(v) for v in vals):  # IEEE float64, as torch evaluates the formula
        with np.errstate(all="ignore"):
            xs = np.array(vals)
            if want_std:
                return [math.nan] * n
            mu = xs.mean()
            if nodim and dof <= 0:
                r = np.float64(g) * np.where(xs == mu, np.nan, np.inf)
            else:
                r = np.float64(math.inf if dof == 0 else float(2 / dof)) * np.float64(g) * (xs - mu)
        return [_round_float_to(float(v), fmt) for v in r]
    q = [Fraction(v) for v in vals]
    mu = sum(q, Fraction(0)) / n
    d = [v - mu for v in q]
    m2 = sum((t * t for t in d), Fraction(0))
    sgn = lambda t: 0.0 if t == 0 else math.copysign(1.0, t)  # noqa: E731
    # grad_var: ("real", Fraction or None) for a finite real (None: std's g / (2 s), irrational), or a float
    if not want_std:
        gv = ("real", Fraction(g)) if math.isfinite(g) else g
    elif dof > 0 and m2 == 0:
        gv = 0.0  # masked_fill(result == 0, 0)
    elif dof > 0:
        gv = ("real", None) if math.isfinite(g) else g  # g / (2 s), s finite and positive
    else:
        with np.errstate(all="ignore"):  # the forward is +inf (M2 > 0) or NaN (M2 == 0)
            gv = float(np.float64(g) / np.float64(math.inf if m2 > 0 else math.nan))
    out = []
    for t in d:
        if nodim and dof <= 0:
            r = sgn(gv[1] if gv[1] is not None else g) if isinstance(gv, tuple) else gv
            with np.errstate(all="ignore"):
                out.append(float(np.float64(r) * (math.nan if t == 0 else math.inf)))
            continue
        if isinstance(gv, tuple) and dof != 0:
            if g == 0 or t == 0:
                neg = ((dof < 0) ^ (math.copysign(1.0, g) < 0)) ^ (t < 0)
                out.append(-0.0 if neg else 0.0)
            elif gv[1] is not None:
                out.append(_decide(fmt, lambda v=2 * gv[1] * t / dof: _ivq(v)))
            else:
                out.append(_std_value(Fraction(g) * t, dof * m2, fmt))
            continue
        kf = math.inf if dof == 0 else sgn(dof)
        r = sgn(gv[1] if gv[1] is not None else g) if isinstance(gv, tuple) else gv
        with np.errstate(all="ignore"):
            out.append(float(np.float64(kf) * np.float64(r) * np.float64(sgn(t))))
    return out


def _std_value(num: Fraction, z: Fraction, fmt) -> float:
    """RN(num / sqrt(z)), z > 0: a rational when z is a rational square, else irrational (no midpoint)."""
    if _square(z):
        return _decide(fmt, lambda: _ivq(num / _sqrtq(z)))
    return _decide(fmt, lambda: _ivq(num) / iv.sqrt(_ivq(z)))


def _round_float_to(t: float, fmt) -> float:
    """A float64 value (NaN and infinities included) rounded once to fmt."""
    from refkern.truth.softmax import _round_float

    return _round_float(float(t), fmt)


def _nd(fn, nd):
    return lambda *z: fn(nd, *z)


_OPS = {"linear": _linear, "matmul": _matmul, "dot": _dot, **{f"conv{d}d": _nd(_conv, d) for d in (1, 2, 3)},
        **{f"conv_transpose{d}d": _nd(_conv_transpose, d) for d in (1, 2, 3)}}  # fmt: skip


def backward(op, grad_output, *args, wrt=None, precision: int | None = None, **kwargs) -> dict:
    """Ground truth of :func:`refkern.backward`: ``{argument name: gradient}``, each element the exact
    sum (mpmath, exact precision derived from its terms) of its terms from the forward definition,
    rounded once to the argument's dtype. Same arguments as :func:`refkern.backward`; the inputs are
    validated by the fast path's normalisers (shapes, dtypes) before the loops."""
    from refkern.gradients import _bind, _op_name, adjoints

    name = _op_name(op, "truth.backward")
    adjoints(name, grad_output, *args, wrt=wrt, who="truth.backward", **kwargs)  # validation only: no kernel runs
    a = _bind(name, args, kwargs, "truth.backward")
    if name in ("softmax", "log_softmax"):
        G, og = _values(grad_output, "grad_output", "truth.backward")
        return _softmax_backward(name, G, og, a, wrt)
    if name == "scaled_dot_product_attention":
        G, og = _values(grad_output, "grad_output", "truth.backward")
        return _attention_backward(name, G, og, a, wrt)
    if name.startswith(("avg_pool", "max_pool", "adaptive_avg_pool")):
        G, og = _values(grad_output, "grad_output", "truth.backward")
        return _pool_backward(name, G, og, a, wrt)
    if name in ("sum", "mean", "var", "std", "cumsum"):
        G, og = _values(grad_output, "grad_output", "truth.backward")
        return _reduction_backward(name, G, og, a, wrt)
    if name in ("layer_norm", "rms_norm", "group_norm", "batch_norm"):
        G, og = _values(grad_output, "grad_output", "truth.backward")
        fn = {"group_norm": _group_norm_backward, "batch_norm": _batch_norm_backward}.get(name, _norm_backward)
        return fn(name, G, og, a, wrt)
    diff = _ops.get(name).differentiable
    ops = {k: _values(v, k, "truth.backward") for k, v in a.items() if k in diff and v is not None}
    vals = {**a, **{k: v for k, (v, _) in ops.items()}}
    G, og = _values(grad_output, "grad_output", "truth.backward")
    if wrt is None:
        wrt = tuple(ops)
    elif isinstance(wrt, str):
        wrt = (wrt,)
    grads = _Grads({k: tuple(ops[k][1].shape) for k in ops}, wrt)
    _OPS[name](name, G, vals, grads)
    as_tensor = og.torch or any(o.torch for _, o in ops.values())
    return grads.finish(og.fmt, as_tensor, precision)
