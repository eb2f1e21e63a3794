"""Ground truth of the losses: nll_loss, cross_entropy (mpmath intervals, rounded once).

Read from torch's definitions, with their own reading of the arguments (the reference's is
:mod:`refkern.kernels._loss_call`): the class axis is dim 1 (dim 0 of a (C,) input), ``-log p_rc =
log sum_k e**(x_rk) - x_rc`` is enclosed by ``mpmath.iv`` (exp and log outward-rounded, the logits as
exact rationals shifted by the row's maximum), the weights, smoothing and reduction are applied to the
intervals as written in torch's functional form (``(1 - eps) nll + eps / C * smooth``, the mean divided by
the weights of the counted targets, or by the number of samples for probability targets), and the
precision doubles from ``precision`` bits until both ends round alike
(:func:`refkern.truth.softmax._decide`). nll_loss is rational: its sums are Fractions, rounded once.
Special values (NaN rows, -inf logits, an empty or all-ignored mean) are torch's IEEE results, evaluated
in float64 on the same formula, only where the result is not finite.
"""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import operand
from refkern.truth._backward_common import _round_float_to
from refkern.truth.reductions import round_fraction
from refkern.truth.softmax import _decide, _ivq

__all__ = ["nll_loss", "cross_entropy", "mse_loss", "l1_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits"]

iv = mpmath.iv


def _red(reduction, size_average, reduce):
    if size_average is not None or reduce is not None:
        sa = True if size_average is None else bool(size_average)
        return "none" if reduce is False else ("mean" if sa else "sum")
    return reduction


def _read(op, input, target, weight):  # noqa: A002
    o = operand(input, "input", op)
    x = np.asarray(o.values, np.float64).reshape(o.shape)
    rows = x.reshape(1, -1) if x.ndim == 1 else np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])
    shape = () if x.ndim == 1 else (x.shape[0], *x.shape[2:])
    C = rows.shape[1]
    w = [1.0] * C
    if weight is not None:
        w = [float(v) for v in np.asarray(operand(weight, "weight", op).values).reshape(-1)]
    probs = None
    if hasattr(target, "is_floating_point") and target.is_floating_point() or (
            not hasattr(target, "detach") and np.asarray(target).dtype.kind == "f"):
        t = np.asarray(operand(target, "target", op).values, np.float64).reshape(x.shape)
        probs = t.reshape(1, -1) if x.ndim == 1 else np.moveaxis(t, 1, -1).reshape(-1, C)
        tg = None
    else:
        tg = (target.detach().cpu().numpy() if hasattr(target, "detach") else np.asarray(target)).astype(np.int64)
        tg = tg.reshape(-1)
    return rows, tg, probs, w, shape, o.fmt


def _ieee(values):
    return float(np.sum(np.asarray(values, np.float64)))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,  # noqa: A002
             reduction="mean", *, precision: int = 64):  # fmt: skip
    """Ground truth of :func:`refkern.nll_loss` (exact rationals, rounded once)."""
    rows, tg, _, w, shape, fmt = _read("nll_loss", input, target, weight)
    red = _red(reduction, size_average, reduce)
    terms, ws, special = [], [], []
    for r, t in enumerate(tg):
        if t == ignore_index:
            terms.append(None)
            continue
        x = float(rows[r, t])
        if not (math.isfinite(x) and math.isfinite(w[t])):
            special.append(-(w[t] * x))
            terms.append(-(w[t] * x))
            continue
        terms.append(-Fraction(w[t]) * Fraction(x))
        ws.append(Fraction(w[t]))
    if red == "none":
        out = [0.0 if q is None else (q if isinstance(q, float) else round_fraction(q, fmt)) for q in terms]
        return np.asarray(out, np.float64).reshape(shape)
    num = sum((q for q in terms if isinstance(q, Fraction)), Fraction(0))
    if special:
        s = _ieee(special)
        return np.float64(s / float(sum(ws) + 0) if red == "mean" and sum(ws) else s)
    if red == "sum":
        return np.float64(round_fraction(num, fmt))
    D = sum(ws, Fraction(0)) if weight is not None else Fraction(len(ws))
    if D == 0:
        return np.float64(math.nan if num == 0 else math.copysign(math.inf, num))
    return np.float64(round_fraction(num / D, fmt))


def _lse(row):
    """A function giving log sum_k e**(x_k - M) as an interval at the current precision, and M."""
    fin = [Fraction(v) for v in row if v != -math.inf]
    M = max(fin)
    d = [q - M for q in fin]

    def make():
        if len(d) == 1:
            return iv.mpf(0)
        s = iv.mpf(0)
        for q in d:
            s += iv.exp(_ivq(q)) if q != 0 else iv.mpf(1)
        return iv.log(s)

    return make, M


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,  # noqa: A002
                  reduction="mean", label_smoothing=0.0, *, precision: int = 64):  # fmt: skip
    """Ground truth of :func:`refkern.cross_entropy` (module docstring)."""
    rows, tg, probs, w, shape, fmt = _read("cross_entropy", input, target, weight)
    red = _red(reduction, size_average, reduce)
    R, C = rows.shape
    eps = Fraction(float(label_smoothing))
    coefs = []  # per row: {class: exact coefficient}, or None for an ignored row
    for r in range(R):
        if probs is not None:
            coefs.append({c: Fraction(w[c]) * (Fraction(float(probs[r, c])) * (1 - eps) + eps / C) for c in range(C)})
        elif tg[r] == ignore_index:
            coefs.append(None)
        else:
            a = {c: eps / C * Fraction(w[c]) for c in range(C)} if eps else {}
            a[int(tg[r])] = a.get(int(tg[r]), Fraction(0)) + (1 - eps) * Fraction(w[int(tg[r])])
            coefs.append(a)
    special = {}
    for r in range(R):
        row = [float(v) for v in rows[r]]
        if coefs[r] is None:
            continue
        if any(v != v or v == math.inf for v in row) or all(v == -math.inf for v in row):
            special[r] = math.nan
        elif any(row[c] == -math.inf for c in coefs[r]):
            special[r] = _ieee([float(a) * math.inf for c, a in coefs[r].items() if row[c] == -math.inf])
    makers = {r: _lse([float(v) for v in rows[r]]) for r in range(R) if coefs[r] is not None and r not in special}

    def row_value(r):
        make, M = makers[r]
        L = make()
        tot = iv.mpf(0)
        for c, a in coefs[r].items():
            tot += _ivq(a) * (_ivq(M - Fraction(float(rows[r, c]))) + L)
        return tot

    if red == "none":
        out = []
        for r in range(R):
            if coefs[r] is None:
                out.append(0.0)
            elif r in special:
                out.append(special[r])
            else:
                out.append(_decide(fmt, lambda r=r: row_value(r), precision))
        return np.asarray(out, np.float64).reshape(shape)
    if probs is not None:
        D = Fraction(R)
    else:
        D = sum((Fraction(w[int(t)]) for t in tg if t != ignore_index), Fraction(0))
    if special:
        s = _ieee(list(special.values()))
        return np.float64(s / float(D) if red == "mean" else s)

    def total():
        s = iv.mpf(0)
        for r in makers:
            s += row_value(r)
        return s / _ivq(D) if red == "mean" else s

    if red == "mean" and D == 0:
        num = _decide(fmt, lambda: sum((row_value(r) for r in makers), iv.mpf(0)), precision) if makers else 0.0
        return np.float64(math.nan if num == 0 else math.copysign(math.inf, num))
    return np.float64(_decide(fmt, total, precision))


def nll_backward(grad_output, a, wrt) -> dict:
    """``{"input": gradient}`` of nll_loss's call ``a``: ``-w_t g`` (over the exact sum of the counted weights
    for "mean") at each counted row's target, 0 elsewhere; exact Fractions rounded once."""
    rows, tg, _, w, shape, fmt = _read("nll_loss", a["input"], a["target"], a.get("weight"))
    red = _red(a.get("reduction", "mean"), a.get("size_average"), a.get("reduce"))
    ign = a.get("ignore_index", -100)
    go = operand(grad_output, "grad_output", "truth.backward")
    G = [float(v) for v in np.asarray(go.values, np.float64).reshape(-1)]
    counted = [r for r in range(len(tg)) if tg[r] != ign]
    D = sum((Fraction(w[int(tg[r])]) for r in counted), Fraction(0)) if a.get("weight") is not None \
        else Fraction(len(counted))  # fmt: skip
    out = np.zeros(rows.shape)
    for r in counted:
        t = int(tg[r])
        g = G[r] if red == "none" else G[0]
        q = -Fraction(w[t]) * Fraction(g)
        if red == "mean":
            out[r, t] = round_fraction(q / D, fmt) if D != 0 else (math.copysign(math.inf, q) if q else math.nan)
        else:
            out[r, t] = round_fraction(q, fmt)
    x = np.asarray(operand(a["input"], "input", "truth.backward").values).reshape(
        operand(a["input"], "input", "truth.backward").shape)
    res = out.reshape(x.shape) if x.ndim == 1 else np.moveaxis(out.reshape(*shape, x.shape[1]), -1, 1)
    return {"input": res}


def _pointwise(op, input, target, size_average, reduce, reduction):  # noqa: A002
    red = _red(reduction, size_average, reduce)
    ox, ot = operand(input, "input", op), operand(target, "target", op)
    fmt = ox.fmt if ox.fmt.prec >= ot.fmt.prec else ot.fmt
    if {ox.fmt.name, ot.fmt.name} == {"float16", "bfloat16"}:
        from refkern.accumulate.formats import FLOAT32

        fmt = FLOAT32
    x = np.asarray(ox.values, np.float64).reshape(ox.shape)
    t = np.asarray(ot.values, np.float64).reshape(ot.shape)
    x, t = np.broadcast_arrays(x, t)
    vals = []
    for a, b in zip(x.reshape(-1), t.reshape(-1)):
        if not (math.isfinite(a) and math.isfinite(b)):
            vals.append(float((a - b) ** 2 if op == "mse_loss" else abs(a - b)))
        else:
            d = Fraction(float(a)) - Fraction(float(b))
            vals.append(d * d if op == "mse_loss" else abs(d))
    if red == "none":
        return np.asarray([v if isinstance(v, float) else round_fraction(v, fmt) for v in vals],
                          np.float64).reshape(x.shape)  # fmt: skip
    if any(isinstance(v, float) for v in vals):
        s = _ieee([float(v) for v in vals])
        return np.float64(s / len(vals) if red == "mean" else s)
    tot = sum(vals, Fraction(0))
    if red == "mean":
        return np.float64(math.nan if not vals else round_fraction(tot / len(vals), fmt))
    return np.float64(round_fraction(tot, fmt))


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", *, precision: int = 64):  # noqa: A002
    """Ground truth of :func:`refkern.mse_loss`: exact Fractions, rounded once."""
    return _pointwise("mse_loss", input, target, size_average, reduce, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", *, precision: int = 64):  # noqa: A002
    """Ground truth of :func:`refkern.l1_loss`: exact Fractions, rounded once."""
    return _pointwise("l1_loss", input, target, size_average, reduce, reduction)


def _binary(op, input, target, weight, reduction, size_average, reduce, pos_weight, precision):  # noqa: A002
    red = _red(reduction, size_average, reduce)
    ox, ot = operand(input, "input", op), operand(target, "target", op)
    shape = tuple(ox.shape)
    x = np.asarray(ox.values, np.float64).reshape(shape)
    y = np.asarray(ot.values, np.float64).reshape(shape)
    fmt = ox.fmt if ox.fmt.prec >= ot.fmt.prec else ot.fmt

    def bc(v, name):
        return np.ones(shape) if v is None else np.broadcast_to(
            np.asarray(operand(v, name, op).values, np.float64).reshape(operand(v, name, op).shape), shape)

    w, pw = bc(weight, "weight"), bc(pos_weight, "pos_weight")
    cut = iv.mpf(-100)

    def clamp(v):  # max(v, -100) of an interval
        return iv.mpf([max(v.a, cut.a), max(v.b, cut.b)])

    def elem(i):
        xi, yi, wi, pi = (Fraction(float(a.reshape(-1)[i])) for a in (x, y, w, pw))
        if op == "binary_cross_entropy":
            l1 = clamp(iv.log(_ivq(xi))) if xi > 0 else cut
            l2 = clamp(iv.log(_ivq(1 - xi))) if xi < 1 else cut
            return -_ivq(wi) * (_ivq(yi) * l1 + _ivq(1 - yi) * l2)
        sp = iv.log(1 + iv.exp(-_ivq(xi)))  # log(1 + e**-x)
        return _ivq(wi) * (_ivq((1 - yi) * xi) + _ivq(1 + (pi - 1) * yi) * sp)

    n = x.size
    finite = all(np.isfinite(a).all() for a in (x, y, w, pw))
    if not finite:  # IEEE's value of torch's formula, in float64, as the reference's special path
        with np.errstate(all="ignore"):
            if op == "binary_cross_entropy":
                v = -w * (y * np.maximum(np.log(x), -100) + (1 - y) * np.maximum(np.log1p(-x), -100))
            else:
                v = w * ((1 - y) * x + (1 + (pw - 1) * y) * (np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)))
        if red == "none":
            out = np.asarray(v, np.float64)
            good = np.isfinite(x) & np.isfinite(y) & np.isfinite(w) & np.isfinite(pw)
            for i in np.flatnonzero(good.reshape(-1)):
                out.reshape(-1)[i] = _decide(fmt, lambda i=i: elem(i), precision)
            return out.reshape(shape)
        return np.float64(v.sum() / n if red == "mean" else v.sum())
    if red == "none":
        return np.asarray([_decide(fmt, lambda i=i: elem(i), precision) for i in range(n)], np.float64).reshape(shape)
    if n == 0:
        return np.float64(math.nan if red == "mean" else 0.0)

    def total():
        s = iv.mpf(0)
        for i in range(n):
            s += elem(i)
        return s / n if red == "mean" else s

    return np.float64(_decide(fmt, total, precision))


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean",  # noqa: A002
                         *, precision: int = 64):  # fmt: skip
    """Ground truth of :func:`refkern.binary_cross_entropy`: mpmath intervals of each clamped log, rounded once."""
    return _binary("binary_cross_entropy", input, target, weight, reduction, size_average, reduce, None, precision)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                                     reduction="mean", pos_weight=None, *, precision: int = 64):  # fmt: skip
    """Ground truth of :func:`refkern.binary_cross_entropy_with_logits`: mpmath intervals, rounded once."""
    return _binary("binary_cross_entropy_with_logits", input, target, weight, reduction, size_average, reduce,
                   pos_weight, precision)  # fmt: skip


def mse_backward(grad_output, a, wrt) -> dict:
    """``{"input": 2 (x - t) g, "target": 2 (t - x) g}`` (each over n for a mean), for the arguments in ``wrt``:
    exact Fractions, rounded once (a zero is +0)."""
    red = _red(a.get("reduction", "mean"), a.get("size_average"), a.get("reduce"))
    ox, ot = operand(a["input"], "input", "truth.backward"), operand(a["target"], "target", "truth.backward")
    x, t = np.broadcast_arrays(np.asarray(ox.values, np.float64).reshape(ox.shape),
                               np.asarray(ot.values, np.float64).reshape(ot.shape))  # fmt: skip
    go = operand(grad_output, "grad_output", "truth.backward")
    G = np.broadcast_to(np.asarray(go.values, np.float64).reshape(go.shape), x.shape)
    fmt = ox.fmt if ox.fmt.prec >= ot.fmt.prec else ot.fmt
    out = {}
    for k, (u, v) in (("input", (x, t)), ("target", (t, x))):
        if k not in wrt:
            continue
        r = np.empty(x.shape)
        for i in np.ndindex(*x.shape):
            q = 2 * (Fraction(float(u[i])) - Fraction(float(v[i]))) * Fraction(float(G[i]))
            r[i] = round_fraction(q / x.size if red == "mean" else q, fmt)
        out[k] = r
    return out


def bce_backward(grad_output, a, wrt, precision=64) -> dict:
    """``{"input": g w (p - y) / max(p (1 - p), eps) (/ n)}``, eps torch's 1e-12 as a float32: exact Fractions,
    rounded once; ``{"target": -g w (log p - log(1 - p)) (/ n)}`` (the derivative of the unclamped loss, torch's):
    mpmath intervals of the logs, rounded once (Ziv), and torch's formula in float64 where p is 0, 1/2 or 1 or g
    or w is 0 or not finite (an infinity, NaN, or a zero signed as that formula signs it)."""
    red = _red(a.get("reduction", "mean"), a.get("size_average"), a.get("reduce"))
    op = "truth.backward"
    op_p, op_y = operand(a["input"], "input", op), operand(a["target"], "target", op)
    shape = tuple(op_p.shape)
    p = np.asarray(op_p.values, np.float64).reshape(shape)
    y = np.asarray(op_y.values, np.float64).reshape(shape)
    w = np.ones(shape) if a.get("weight") is None else np.broadcast_to(np.asarray(
        operand(a["weight"], "weight", op).values, np.float64).reshape(operand(a["weight"], "weight", op).shape), shape)
    go = operand(grad_output, "grad_output", op)
    G = np.broadcast_to(np.asarray(go.values, np.float64).reshape(go.shape), shape)
    n = p.size if red == "mean" else 1
    out = {}
    if "input" in wrt:
        r = np.empty(shape)
        eps = Fraction(float(np.float32(1e-12)))
        for i in np.ndindex(*shape):
            P, Y, W, Gi = (Fraction(float(v[i])) for v in (p, y, w, G))
            q = Gi * W * (P - Y) / max(P * (1 - P), eps)
            r[i] = round_fraction(q / n, op_p.fmt)
        out["input"] = r
    if "target" in wrt:
        r = np.empty(shape)
        for i in np.ndindex(*shape):
            pi, gi, wi = float(p[i]), float(G[i]), float(w[i])
            if not (0 < pi < 1 and pi != 0.5 and math.isfinite(gi * wi) and gi * wi != 0):
                with np.errstate(all="ignore"):
                    r[i] = -(np.log(pi) - np.log1p(-pi)) * gi * wi / n
                continue
            c = -Fraction(gi) * Fraction(wi) / n
            P = Fraction(pi)
            r[i] = _decide(op_p.fmt, lambda c=c, P=P: _ivq(c) * (iv.log(_ivq(P)) - iv.log(_ivq(1 - P))), precision)
        out["target"] = r
    return out


def bce_logits_backward(grad_output, a, wrt, precision=64) -> dict:
    """``{"input": c (A sigmoid(x) - pw y), "target": c (-x + (pw - 1) log(1 + e**-x))}``, ``A = 1 + (pw - 1) y``,
    ``c = g w (/ n)``: mpmath intervals (exp, log), rounded once (Ziv); exact Fractions where the value is rational
    (x = 0, A = 0, pw = 1, c = 0), a zero signed as torch's formula in float64 signs it; that formula's IEEE value
    where an operand is not finite."""
    red = _red(a.get("reduction", "mean"), a.get("size_average"), a.get("reduce"))
    op = "truth.backward"
    ox = operand(a["input"], "input", op)
    shape = tuple(ox.shape)
    fmt = ox.fmt

    def arr(name, default=None):
        v = a.get(name)
        if v is None:
            return np.full(shape, default)
        o = operand(v, name, op)
        return np.broadcast_to(np.asarray(o.values, np.float64).reshape(o.shape), shape)

    x, y, w, pw = arr("input"), arr("target"), arr("weight", 1.0), arr("pos_weight", 1.0)
    go = operand(grad_output, "grad_output", op)
    G = np.broadcast_to(np.asarray(go.values, np.float64).reshape(go.shape), shape)
    n = x.size if red == "mean" else 1
    out = {}
    for k in wrt:
        r = np.empty(shape)
        for i in np.ndindex(*shape):
            xi, yi, wi, pi, gi = (float(v[i]) for v in (x, y, w, pw, G))
            with np.errstate(all="ignore"):  # torch's formula in float64: the specials, and the sign of a zero
                if k == "input":
                    s = 0.0 if xi <= -700 else 1 / (1 + math.exp(-xi))  # e**-x beyond float64: 1 / inf
                    ieee = ((pi * yi + 1 - yi) * s - pi * yi) * gi * wi / n
                else:
                    ieee = (-xi + (pi - 1) * (np.logaddexp(0.0, -xi))) * gi * wi / n
            if not all(math.isfinite(v) for v in (xi, yi, wi, pi, gi)):
                r[i] = _round_float_to(ieee, fmt)
                continue
            X, Y, PW = Fraction(xi), Fraction(yi), Fraction(pi)
            c = Fraction(gi) * Fraction(wi) / n
            A = 1 + (PW - 1) * Y
            if k == "input" and (X == 0 or A == 0 or c == 0):
                q = c * (A * (Fraction(1, 2) if X == 0 else 0) - PW * Y)
            elif k == "target" and (PW == 1 or c == 0):
                q = -c * X
            else:
                if k == "input":
                    make = lambda c=c, A=A, X=X, PW=PW, Y=Y: _ivq(c) * (  # noqa: E731
                        _ivq(A) / (1 + iv.exp(-_ivq(X))) - _ivq(PW * Y))
                else:
                    make = lambda c=c, X=X, PW=PW: _ivq(c) * (  # noqa: E731
                        -_ivq(X) + _ivq(PW - 1) * iv.log(1 + iv.exp(-_ivq(X))))
                r[i] = _decide(fmt, make, precision)
                continue
            r[i] = round_fraction(q, fmt) if q != 0 else math.copysign(0.0, ieee)
        out[k] = r
    return out


def ce_backward(grad_output, a, wrt, precision=64) -> dict:
    """``{"input": s (p A - B), "target": -s (1 - eps) w log p}`` (the target's for probability targets) of
    cross_entropy (:mod:`refkern.kernels.loss_ce_grad`'s module docstring, read here from torch's definitions with
    this module's own reading of the arguments): ``p`` the softmax by mpmath intervals (``p_j = 1 / sum_k e**(x_k
    - x_j)``), the coefficients exact Fractions, rounded once (Ziv); rational where every finite logit of the row
    is equal or a logit is -inf; torch's formula in float64 for a row with NaN or +inf, all -inf, a non-finite
    grad_output or a mean over no weight."""
    rows, tg, probs, w, shape, fmt = _read("cross_entropy", a["input"], a["target"], a.get("weight"))
    red = _red(a.get("reduction", "mean"), a.get("size_average"), a.get("reduce"))
    ign, eps = a.get("ignore_index", -100), Fraction(float(a.get("label_smoothing", 0.0)))
    R, C = rows.shape
    W = [Fraction(v) for v in w]
    go = operand(grad_output, "grad_output", "truth.backward")
    Gv = [float(v) for v in np.asarray(go.values, np.float64).reshape(-1)]
    counted = [r for r in range(R) if probs is not None or int(tg[r]) != ign]
    if red != "mean":
        D = Fraction(1)
    elif probs is not None:
        D = Fraction(R)
    else:
        D = sum((W[int(tg[r])] for r in counted), Fraction(0))
    out = np.zeros((R, C))
    for r in counted:
        g = Gv[r] if red == "none" else Gv[0]
        if probs is not None:
            B = [((1 - eps) * Fraction(float(probs[r, j])) + eps / C) * W[j] for j in range(C)]
        else:
            t = int(tg[r])
            B = [eps / C * W[j] + ((1 - eps) * W[t] if j == t else 0) for j in range(C)]
        x = [float(v) for v in rows[r]]
        with np.errstate(all="ignore"):  # torch's formula in float64 (the specials, and a zero's sign)
            xa = np.array(x)
            ls = (xa - np.max(xa)) - np.log(np.sum(np.exp(xa - np.max(xa))))
            gy = -(g / float(D)) * np.array([float(b) for b in B]) if D != 0 else np.full(C, math.nan)
            ieee = gy - np.exp(ls) * np.sum(gy)
        if any(math.isnan(v) or v == math.inf for v in x) or all(v == -math.inf for v in x) or \
                not math.isfinite(g) or D == 0:  # fmt: skip
            out[r] = [_round_float_to(v, fmt) for v in ieee]
            continue
        s = Fraction(g) / D
        A = sum(B, Fraction(0))
        fin = [j for j in range(C) if x[j] != -math.inf]
        X = [Fraction(v) if v != -math.inf else None for v in x]
        equal = all(X[j] == X[fin[0]] for j in fin)
        for j in range(C):
            if X[j] is None or equal or s == 0 or (A == 0 and B[j] == 0):
                p = Fraction(0) if X[j] is None else (Fraction(1, len(fin)) if equal else None)
                q = Fraction(0) if p is None else s * (p * A - B[j])
                out[r, j] = round_fraction(q, fmt) if q != 0 else math.copysign(0.0, ieee[j])
                continue
            out[r, j] = _decide(fmt, lambda s=s, A=A, B=B[j], X=X, j=j, fin=fin: _ivq(s) * (_ivq(A) / sum(
                (iv.exp(_ivq(X[k] - X[j])) for k in fin), iv.mpf(0)) - _ivq(B)), precision)  # fmt: skip
    x = np.asarray(operand(a["input"], "input", "truth.backward").values).reshape(
        operand(a["input"], "input", "truth.backward").shape)

    def back(v):
        return v.reshape(x.shape) if x.ndim == 1 else np.moveaxis(v.reshape(*shape, x.shape[1]), -1, 1)

    res = {"input": back(out)} if "input" in wrt else {}
    if "target" in wrt:
        res["target"] = back(_ce_target(rows, Gv, D, W, eps, red, fmt, precision))
    return res


def _ce_target(rows, Gv, D, W, eps, red, fmt, precision):
    """The probability target's gradient ``-(g / D) (1 - eps) w_j log p_j`` in row layout: mpmath intervals of
    ``log p_j = -log sum_k e**(x_k - x_j)``, rounded once; torch's formula in float64 for the specials (p_j = 0, a
    NaN or +inf row, a mean over nothing) and the sign of a zero (p_j = 1 or a zero coefficient)."""
    R, C = rows.shape
    out = np.zeros((R, C))
    for r in range(R):
        g = Gv[r] if red == "none" else Gv[0]
        x = [float(v) for v in rows[r]]
        with np.errstate(all="ignore"):
            xa = np.array(x)
            ls = (xa - np.max(xa)) - np.log(np.sum(np.exp(xa - np.max(xa))))
            ieee = -(g / float(D)) * np.array([float(v) for v in W]) * ls * (1 - float(eps)) if D != 0 else \
                np.full(C, math.nan)  # fmt: skip
        fin = [j for j in range(C) if math.isfinite(x[j])]
        if any(math.isnan(v) or v == math.inf for v in x) or not fin or not math.isfinite(g) or D == 0:
            out[r] = [_round_float_to(v, fmt) for v in ieee]
            continue
        for j in range(C):
            coef = -(Fraction(g) / D) * (1 - eps) * W[j]
            if not math.isfinite(x[j]) or not math.isfinite(ieee[j]):
                out[r, j] = _round_float_to(ieee[j], fmt)
            elif coef == 0 or len(fin) == 1:
                out[r, j] = math.copysign(0.0, ieee[j])
            else:
                X = [Fraction(x[k]) for k in fin]
                out[r, j] = _decide(fmt, lambda coef=coef, X=X, xj=Fraction(x[j]): _ivq(coef) * -iv.log(sum(
                    (iv.exp(_ivq(v - xj)) for v in X), iv.mpf(0))), precision)  # fmt: skip
    return out
