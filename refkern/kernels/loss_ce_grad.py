"""The gradient of cross_entropy's input, correctly rounded. torch's cross_entropy is ``log_softmax`` then
``nll_loss`` (class-index targets; with ``label_smoothing`` eps, ``(1 - eps) nll + eps / C * smooth`` where
``smooth = -sum_j w_j log p_j`` over the counted rows, over the same divisor for a mean) or ``-sum_j y'_j w_j log
p_j`` (probability targets, ``y' = (1 - eps) y + eps / C``, a mean over the R rows). Every case is, per row r,

    d loss / d x_rj = s_r (p_rj A_r - B_rj),   A_r = sum_k B_rk,   p = softmax(x_r),

with ``s_r = g_r / D`` (``g_r`` the row's grad_output, the scalar's for "sum" and "mean"; D the mean's divisor:
the counted targets' weights, or R for probability targets; 1 otherwise) and ``B_rj = (1 - eps) w_t [j = t] +
(eps / C) w_j`` (class index t; 0 in an ignored row) or ``B_rj = y'_rj w_j``: each element that real number
rounded once to the input's format.

Exact path (every element: a Python loop per row, as the other losses' gradients): ``p_j = E_j / S`` with
``E_k = e**(x_k - M)`` enclosed by integer intervals (:mod:`refkern.kernels._exact_real`, relative width about
``(|k| + 3 W) 2**-W``) and exact rational coefficients; ``s (E_j A - B_j S) / S`` enclosed and rounded where both
ends round alike, else W doubles (to ``2**15`` bits). The value is rational only where p is (every finite logit of
the row equal: ``p = 1 / n``; a logit of -inf: ``p = 0``), computed exactly there; elsewhere p_j is irrational
(``e**a`` for rational a != 0, Lindemann) and so is the value unless ``s = 0`` or ``A = B_j = 0`` (exact zeros), so
it is never a rounding boundary and the loop ends. A row holding NaN or +inf, or all of whose logits are -inf, a
non-finite grad_output, or a mean over no weight (D = 0), takes torch's formula in float64 (its IEEE value)."""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr

__all__ = ["ce_grad_call", "ce_coefficients", "ce_grad", "ce_target_grad", "_cross_entropy"]

_MAX_BITS = 1 << 15


def ce_grad_call(g, a, who):
    """(the validated call, grad_output per row (R,) float64) of cross_entropy's backward."""
    from refkern.kernels._grad import grad_output
    from refkern.kernels._loss_call import loss_call

    c = loss_call("cross_entropy", **a)
    og = grad_output(g, "cross_entropy", c.fmt, c.out_shape, who)
    G = np.asarray(og.values, np.float64).reshape(-1)
    R = c.raw.shape[0]
    return c, (G if c.reduction == "none" else np.full(R, G[0] if G.size else 0.0)), og.torch


def ce_coefficients(c):
    """(D, B) of the call: the mean's divisor (a Fraction; 1 for "none" and "sum") and a function ``B(r)`` giving
    row r's coefficients ``B_rj`` (Fractions; module docstring), None for an ignored row."""
    C = c.C
    w = [Fraction(1)] * C if c.weight is None else [Fraction(float(v)) for v in c.weight]
    eps = Fraction(c.label_smoothing)
    if c.target is None:
        D = Fraction(c.raw.shape[0]) if c.reduction == "mean" else Fraction(1)

        def B(r):
            return [((1 - eps) * Fraction(float(y)) + eps / C) * wj for y, wj in zip(c.probs[r], w)]

        return D, B
    valid = c.valid
    D = sum((w[int(t)] for t in c.target[valid]), Fraction(0)) if c.reduction == "mean" else Fraction(1)

    def B(r):
        if not valid[r]:
            return None
        t = int(c.target[r])
        out = [eps / C * wj for wj in w]
        out[t] += (1 - eps) * w[t]
        return out

    return D, B


def _ieee_row(x, g, D, Bf):
    """torch's formula for one row in float64: ``gy = -(g / D) B``, ``gx = gy - e**(log_softmax x) sum gy``."""
    with np.errstate(all="ignore"):
        m = np.max(x)
        ls = (x - m) - np.log(np.sum(np.exp(x - m)))
        gy = -(g / D) * Bf
        return gy - np.exp(ls) * np.sum(gy)


#: below this exponent, e**d < 2**-2164: the interval keeps (0, 2**-2164] as the point 2**-4000 (:func:`_exp_iv`)
_FAR = -1500


def _exp_iv(d: Fraction, W: int):
    """(lo, hi) Fractions enclosing e**d, d <= 0 (relative width about (|d| / ln 2 + 3 W) 2**-W). Below
    :data:`_FAR` the value lies in (0, 2**-2164], far below half of float64's smallest subnormal even times the
    largest coefficients here (below 2**600): it is kept as the point 2**-4000, which rounds as the real value does
    (as :func:`refkern.kernels.loss_logits_grad._exp_neg_iv`: no rounding boundary but the other terms' sum itself
    lies that close to it, and there the sign of the tiny term decides, the point's sign)."""
    if d == 0:
        return Fraction(1), Fraction(1)
    if d < _FAR:
        p = Fraction(1, 1 << 4000)
        return p, p
    n, e = xr.dyadic(d)
    lo, hi, k = xr.exp_interval(n, e, W)
    s = Fraction(2) ** k
    return lo * s, hi * s


def _mul(a, b):
    """The interval product of intervals a and b (pairs of Fractions)."""
    ps = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(ps), max(ps)


def _decide(lo, hi, fmt):
    ra, rb = round_fraction(lo, fmt), round_fraction(hi, fmt)
    return ra if ra == rb and math.copysign(1.0, ra) == math.copysign(1.0, rb) else None


def _row(x, g, D, B, fmt, only=None, out=None) -> np.ndarray:
    """One row's gradient (float64 values rounded to fmt); ``B`` its coefficients (None: an ignored row). With
    ``only`` (indices) just those elements are computed, into ``out`` (the fast path's row, its other elements
    decided)."""
    C = x.size
    if B is None:
        return np.zeros(C)
    Bf = np.array([float(b) for b in B])
    fin = np.isfinite(x)
    if np.isnan(x).any() or (x == np.inf).any() or not fin.any() or not math.isfinite(g) or D == 0:
        return _ieee_row(x, g, float(D), Bf)
    ieee = _ieee_row(x, g, float(D), Bf)  # the signs of the exact zeros
    s = Fraction(g) / D
    if s == 0:
        return np.copysign(0.0, ieee)
    A = sum(B, Fraction(0))
    out = np.empty(C) if out is None else out
    idx = range(C) if only is None else [int(j) for j in only]
    xs = [Fraction(float(v)) if f else None for v, f in zip(x, fin)]
    live = [j for j in range(C) if xs[j] is not None]
    equal = all(xs[j] == xs[live[0]] for j in live)
    todo = []
    for j in idx:
        if xs[j] is None or equal:  # p rational: 0 at -inf, 1/n where every finite logit is equal
            p = Fraction(0) if xs[j] is None else Fraction(1, len(live))
            v = s * (p * A - B[j])
            out[j] = round_fraction(v, fmt) if v != 0 else math.copysign(0.0, ieee[j])
        elif A == 0 and B[j] == 0:  # an exact zero, signed as torch's formula signs it
            out[j] = math.copysign(0.0, ieee[j])
        else:
            todo.append(j)
    M = max(xs[j] for j in live)
    W = 96
    while todo and W <= _MAX_BITS:
        E = {k: _exp_iv(xs[k] - M, W) for k in live}
        S = (sum(e[0] for e in E.values()), sum(e[1] for e in E.values()))
        left = []
        for j in todo:
            N = _mul(E[j], (A, A))
            N = (N[0] - max(B[j] * S[0], B[j] * S[1]), N[1] - min(B[j] * S[0], B[j] * S[1]))
            q = (min(N[0] / S[0], N[0] / S[1]), max(N[1] / S[0], N[1] / S[1]))  # S > 0
            v = _mul((s, s), q)
            r = _decide(v[0], v[1], fmt)
            if r is None:
                left.append(j)
            else:
                out[j] = r
        todo, W = left, W * 2
    if todo:
        raise RuntimeError(f"cross_entropy: the input's gradient did not converge within {_MAX_BITS} bits.")
    return out


def ce_grad(c, G) -> np.ndarray:
    """The gradient (R, C) in row layout (class last), float64 values rounded to the input's format: for formats
    of at most 24 bits the float64 pass (:mod:`refkern.kernels.loss_ce_grad_fast`) first, the exact row
    (:func:`_row`) for the elements it leaves; float64 inputs exactly."""
    D, B = ce_coefficients(c)
    X = c.X
    R = X.shape[0]
    if not R:
        return np.zeros(X.shape)
    if c.fmt.prec > 24:
        return np.stack([_row(X[r], float(G[r]), D, B(r), c.fmt) for r in range(R)])
    from refkern.kernels.loss_ce_grad_fast import ce_rows_fast

    ok, args = _fast_args(c, G, D)
    out = np.zeros(X.shape)
    und = np.zeros(X.shape, np.bool_)
    f = c.fmt
    ce_rows_fast(X, ok, *args, f.prec, f.emin, f.emax, out, und)
    valid = c.valid if c.target is not None else np.ones(R, np.bool_)
    for r in np.flatnonzero(~ok | und.any(axis=1)):
        if not valid[r]:
            continue  # an ignored row: zeros
        if not ok[r] or und[r].all():
            out[r] = _row(X[r], float(G[r]), D, B(r), c.fmt)
        else:
            _row(X[r], float(G[r]), D, B(r), c.fmt, np.flatnonzero(und[r]), out[r])
    return out


def _fast_args(c, G, D):
    """(ok, the fast pass's arguments after ``ok``): rows with ``ok`` false (ignored, g not finite, D = 0, s = 0
    or outside float64's normal range, A = 0 or a coefficient outside [2**-1000, 2**1000]) take the exact row."""
    R, C = c.X.shape
    lo, hi = 2.0**-1000, 2.0**1000
    eps = Fraction(c.label_smoothing)
    Df = float(D)
    with np.errstate(all="ignore"):
        s = np.asarray(G, np.float64) / Df if D != 0 else np.full(R, np.nan)
    ok = np.isfinite(s) & (abs(s) >= lo) & (abs(s) <= hi)
    if c.target is None:
        wf = np.ones(C) if c.weight is None else np.asarray(c.weight, np.float64)
        args = (np.full(R, -1, np.int64), np.zeros(R), np.zeros(1), np.ascontiguousarray(c.probs, np.float64),
                np.ascontiguousarray(wf), float(1 - eps), float(eps / C), s, np.zeros(R), np.zeros(R))  # fmt: skip
        return ok, args
    wf = np.ones(C) if c.weight is None else np.asarray(c.weight, np.float64)
    b0 = float(eps / C) * wf  # within 2.01u of eps / C w_j (two roundings): the kernel charges 2.03u
    nz = b0[b0 != 0]
    if nz.size and not ((abs(nz) >= lo) & (abs(nz) <= hi)).all():
        ok[:] = False
    sw = math.fsum(wf)  # sum w correctly rounded: within 1.01u |sw| of the exact sum
    base = eps / C * Fraction(sw)
    e_base = float(eps / C) * 1.03 * 2.0**-53 * abs(sw)  # eps / C |sw - sum w|, with eps / C's own rounding
    tgt = np.asarray(c.target, np.int64).copy()
    valid = c.valid
    Bt, A, eA = np.zeros(R), np.zeros(R), np.zeros(R)
    memo = {}
    for r in np.flatnonzero(valid & ok):
        t = int(tgt[r])
        if t not in memo:
            wt = Fraction(float(wf[t]))
            bt, a = float(eps / C * wt + (1 - eps) * wt), float(base + (1 - eps) * wt)
            memo[t] = bt, a, 1.01 * 2.0**-53 * abs(a) + e_base, (bt == 0 or lo <= abs(bt) <= hi) and lo <= abs(a) <= hi
        Bt[r], A[r], eA[r], good = memo[t]
        ok[r] = good
    ok &= valid
    tgt[~ok] = 0
    return ok, (tgt, Bt, b0, np.zeros((1, 1)), np.zeros(1), 0.0, 0.0, s, A, eA)


def _log_iv(lo: Fraction, hi: Fraction, W: int):
    """(lo, hi) enclosing log of every real in [lo, hi] (0 < lo), each end within a few units of 2**-W."""
    sh = W + 8
    a, b = math.floor(lo * (1 << sh)), math.ceil(hi * (1 << sh))
    if a <= 0:  # lo below 2**-sh: its own dyadic reading
        n, e = xr.dyadic(lo)
        a_lo = xr.log_interval(n, n, e, W)[0]
    else:
        a_lo = xr.log_interval(a, a, -sh, W)[0]
    return Fraction(a_lo, 1 << W), Fraction(xr.log_interval(b, b, -sh, W)[1], 1 << W)


def _target_row(x, g, D, y, w, eps, fmt) -> np.ndarray:
    """One row of the probability target's gradient, ``-s (1 - eps) w_j log p_j`` (``s = g / D``), rounded once:
    torch's formula in float64 where an operand is not finite or p_j = 0; an exact zero (p_j = 1, every other
    logit -inf; or a zero coefficient) signed as that formula signs it; else Ziv's loop (log p_j is irrational
    unless p_j = 1, by Lindemann-Weierstrass: a rational q = log p_j would make ``sum_k e**(x_k - x_j + q)`` equal
    1, a linear relation between exponentials of rationals with positive coefficients)."""
    C = x.size
    with np.errstate(all="ignore"):
        m = np.max(x)
        ls = (x - m) - np.log(np.sum(np.exp(x - m)))
        ieee = -(g / float(D)) * w * ls * (1 - float(eps)) if D != 0 else np.full(C, np.nan)
    if np.isnan(x).any() or (x == np.inf).any() or not np.isfinite(x).any() or not math.isfinite(g) or D == 0:
        return ieee
    s = Fraction(g) / D
    xs = [Fraction(float(v)) if np.isfinite(v) else None for v in x]
    live = [k for k in range(C) if xs[k] is not None]
    M = max(xs[k] for k in live)
    out = ieee.copy()
    todo = []
    for j in range(C):
        coef = -s * (1 - eps) * Fraction(float(w[j]))
        if xs[j] is None or not math.isfinite(ieee[j]):
            continue  # p_j = 0: an infinity (or NaN), torch's
        if coef == 0 or len(live) == 1:  # log p_j = 0 where x_j is the only finite logit
            out[j] = math.copysign(0.0, ieee[j])
        else:
            todo.append((j, coef))
    W = 96
    while todo and W <= _MAX_BITS:
        E = [_exp_iv(xs[k] - M, W) for k in live]
        L = _log_iv(sum(e[0] for e in E), sum(e[1] for e in E), W)
        left = []
        for j, coef in todo:
            v = _mul((coef, coef), (xs[j] - M - L[1], xs[j] - M - L[0]))
            r = _decide(v[0], v[1], fmt)
            if r is None:
                left.append((j, coef))
            else:
                out[j] = r
        todo, W = left, W * 2
    if todo:
        raise RuntimeError(f"cross_entropy: the target's gradient did not converge within {_MAX_BITS} bits.")
    return out


def ce_target_grad(c, G) -> np.ndarray:
    """The probability target's gradient (R, C) in row layout: ``-s_r (1 - eps) w_j log p_rj`` (``s_r = g_r / D``, D
    the mean's R), each element rounded once to the target's format (the input's: torch requires one dtype)."""
    D, _ = ce_coefficients(c)
    X = c.X
    w = np.ones(c.C) if c.weight is None else np.asarray(c.weight, np.float64)
    eps = Fraction(c.label_smoothing)
    rows = [_target_row(X[r], float(G[r]), D, c.probs[r], w, eps, c.fmt) for r in range(X.shape[0])]
    return np.stack(rows) if rows else np.zeros(X.shape)


def _cross_entropy(op, g, a, wrt, who):
    """The backward rule (:class:`refkern.ops.Backward`): the input's gradient, and a probability target's."""
    from refkern.kernels._common import deliver
    from refkern.kernels._grad import Adjoint
    from refkern.kernels.loss_grad import _back

    c, G, torch_g = ce_grad_call(g, a, who)
    if "target" in wrt and c.target is not None:
        raise TypeError(f"{who}: cross_entropy's target holds class indices (integers), which have no gradient; "
                        "ask for wrt='input', or pass probability targets (floating-point, the input's shape).")
    fns = {"input": ce_grad, "target": ce_target_grad}
    return {k: Adjoint(k, op, (), compute=lambda f=fns[k]: deliver(np.ascontiguousarray(_back(c, f(c, G))), c.fmt,
                                                                   c.tensor or torch_g)) for k in wrt}  # fmt: skip
