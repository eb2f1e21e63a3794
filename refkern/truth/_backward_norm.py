"""Ground truth of the norms' gradients (:func:`refkern.truth.backward`): layer_norm, rms_norm, group_norm
and batch_norm from the forward definition, exact rationals and interval square roots, rounded once."""

import math
from fractions import Fraction

import numpy as np

from refkern.truth._backward_common import _round_float_to, _sqrtq, _square, _values


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
    if x.size == 0:  # no element: no term reaches any gradient (the input's empty, weight's and bias's +0)
        shapes = {k: _values(a[k], k, "truth.backward")[0].shape for k in ("input", "weight", "bias")
                  if a.get(k) is not None}  # fmt: skip
        return _deliver_norm({k: np.zeros(shapes[k]) for k in _wrt(a, wrt)}, shapes, og, ox, a)
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
