"""``refkern.layer_norm``, ``rms_norm``, ``group_norm`` and ``batch_norm``: correctly rounded.

The definition, for the elements ``x_1 .. x_n`` one normalisation covers:

    y_j = (x_j - mean) / sqrt(var + eps) * w_j + b_j,   mean = sum x / n,   var = sum (x - mean)^2 / n

with the exact mean, the BIASED variance (torch's choice for every norm), ``eps`` the exact
float64 value of the Python float passed, the square root and the division real-valued (no
``rsqrt`` rounded first), and the affine step included, rounded ONCE to the input's dtype.
rms_norm drops the centring (``y = x / sqrt(mean(x^2) + eps) * w``). Intermediate overflow is
never an excuse: a float32 row near 1e25 normalises to its true +-1-scale values.

How. The moments are exact (:mod:`refkern.kernels._moments`); ``1 / sqrt(var + eps)`` and
each ``y_j`` are evaluated in double-word arithmetic, with an absolute error bound carried
alongside every step (a relative :data:`~refkern.accumulate.dd.EPS` per operation, plus the
propagated errors of the inputs of that step: for a product ``e(ab) = e(a)|b| + |a|e(b) +
e(a)e(b)``, for ``sqrt(w)`` ``e(w) / sqrt(w~)``, for ``1/s`` ``e(s) / (s~ (s~ - e(s)))``), and
:func:`~refkern.accumulate.ziv.decide` rounds when the bound allows; the rest (far fewer than
one element in a million on ordinary data) go through the exact path, which compares squares
of rationals. Rows holding a NaN or an infinity have no real-valued answer: they follow IEEE
arithmetic on the formula, as torch does (a layer_norm row with an inf is NaN throughout).
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import operand
from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div, dd_div_fp, dd_mul, dd_mul_fp, dd_sqrt, safe
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_array
from refkern.accumulate.ziv import decide, round_fraction, round_quotient_sqrt
from refkern.kernels._common import deliver
from refkern.kernels._moments import OK, SPECIAL, exact_moments, moments, new_workspace
from refkern.ops._args import eps as _eps  # the gradients read them here too
from refkern.ops._args import normalized_shape as _shape_arg

__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm", "normalize"]

_UNDECIDED = 3  # row status: some elements left to the exact path
_GIVEN_MAX = 2.0**1000


@jit(inline="always")
def _apply_f64(dh, dl, d_h, e_d1, r_h, e_r1, w, b, has_w, has_b, prec, emin, emax):
    """RN(((dh + dl) - delta) * r * w + b) from float64 arithmetic, or NaN when undecided.

    ``|delta - d_h| <= e_d1``, ``|r - r_h| <= e_r1``. Each operation's rounding is charged
    ``u |result|`` (``u = 2**-53``), which holds while no product underflows: every product must
    be zero only when a factor is, and lie in the bounds' range (:func:`~refkern.accumulate.dd.safe`);
    sums are exact when subnormal. ``dl`` is dropped and charged whole."""
    u = 2.0**-53
    z = dh - d_h
    e_z = u * abs(z) + abs(dl) + e_d1
    p = z * r_h
    e = e_z * (abs(r_h) + e_r1) + abs(z) * e_r1 + u * abs(p)
    if not (safe(z) and safe(p) and (p != 0.0 or z == 0.0)):
        return np.nan
    y = p
    if has_w:
        y = p * w
        e = e * abs(w) + u * abs(y)
        if not (safe(y) and (y != 0.0 or p == 0.0 or w == 0.0)):
            return np.nan
    if has_b:
        y = y + b
        e = e + u * abs(y)
    return decide(y, 0.0, e * (1.0 + 2.0**-40), prec, emin, emax)


@jit(inline="always")
def _apply_row(xr, dh, dl, d_h, d_l, e_d, r_h, r_l, e_r, W, B, wr, has_w, has_b, prec, emin, emax, out):
    """out = ((dh + dl) - delta) * r * w + b per element, decided or NaN; returns whether all decided.
    For a format narrower than float64 a float64 pass decides almost every element; the rest
    (and every float64 result) take the double-word evaluation, in a loop of their own."""
    n = xr.size
    wn = W.shape[1]
    todo = n
    if prec < 53:
        e_d1 = e_d + abs(d_l)  # |delta - d_h|
        e_r1 = e_r + abs(r_l)  # |r - r_h|
        todo = 0
        for j in range(n):
            jw = j if wn > 1 else 0
            v = _apply_f64(dh[j], dl[j], d_h, e_d1, r_h, e_r1, W[wr, jw], B[wr, jw], has_w, has_b, prec, emin, emax)
            out[j] = v
            todo += v != v
    if todo == 0:
        return True
    ok = True
    for j in range(n):
        if prec < 53 and out[j] == out[j]:
            continue
        z_h, z_l = dd_add(dh[j], dl[j], -d_h, -d_l)
        e_z = e_d + EPS * abs(z_h)
        p_h, p_l = dd_mul(z_h, z_l, r_h, r_l)
        e = e_z * abs(r_h) + abs(z_h) * e_r + e_z * e_r + EPS * abs(p_h)
        y_h, y_l = p_h, p_l
        jw = j if wn > 1 else 0
        if has_w:
            wj = W[wr, jw]
            y_h, y_l = dd_mul_fp(p_h, p_l, wj)
            e = e * abs(wj) + EPS * abs(y_h)
        q_h = y_h
        if has_b:
            y_h, y_l = dd_add_fp(y_h, y_l, B[wr, jw])
            e = e + EPS * abs(y_h)
        v = np.nan
        if safe(z_h) and safe(p_h) and safe(q_h):
            v = decide(y_h, y_l, e * (1.0 + 2.0**-40), prec, emin, emax)
        out[j] = v
        ok = ok and v == v
    return ok


@jit(inline="always")
def biased_variance(m_h, m_l, e_m2, n):
    """``(v_h, v_l, e_v)``: ``v = M2 / n`` as a double word (:func:`refkern.accumulate.dd.dd_div_fp`, within
    ``EPS |v|``) from ``M2 = m_h + m_l`` within ``e_m2``: ``e_v = e_m2 / n (1 + 2**-50) + EPS |v_h|`` (the float64
    division of the bound charged ``2**-50``)."""
    v_h, v_l = dd_div_fp(m_h, m_l, np.float64(n))
    return v_h, v_l, e_m2 / n * (1.0 + 2.0**-50) + EPS * abs(v_h)


@jit(inline="always")
def inv_std(v_h, v_l, e_v, eps):
    """(ok, r_h, r_l, e_r): ``r = (v + eps)**(-1/2)`` as the double-word ``r_h + r_l`` within ``e_r`` of the real
    value, for a variance given as ``v_h + v_l`` within ``e_v``: ``w = v + eps`` (one double-word addition,
    ``EPS |w|`` more), ``s = sqrt(w)`` within ``e_w / s (1 + 2**-40) + EPS s`` (``|sqrt(w + d) - sqrt(w)| <= |d| /
    sqrt(w)``), ``r = 1 / s`` within ``e_s / (s (s - e_s)) + EPS |r|``; ok False where ``w`` is not positive, not
    well inside the double-word range, or ``e_w >= w / 4`` (the caller's exact path decides). Shared by the forward
    (:func:`_normalize`) and the backward (:func:`refkern.kernels.norm_backward._fast_rows`)."""
    w_h, w_l = dd_add_fp(v_h, v_l, eps)
    e_w = e_v + EPS * abs(w_h)
    if not (w_h > 0.0 and e_w < 0.25 * w_h and safe(w_h)):
        return False, 0.0, 0.0, 0.0
    s_h, s_l = dd_sqrt(w_h, w_l)
    e_s = e_w / s_h * (1.0 + 2.0**-40) + EPS * s_h
    r_h, r_l = dd_div(1.0, 0.0, s_h, s_l)
    e_r = e_s / (s_h * (s_h - e_s)) + EPS * abs(r_h)
    return safe(r_h), r_h, r_l, e_r


@jit(parallel=True)
def _normalize(X, W, B, has_w, has_b, center, given, GM, GV, eps, prec, emin, emax, out, status):
    """Row r of X (R, n) normalised with weight/bias row ``r % W.shape[0]`` (a column per element,
    or one value for the row); the statistics are the row's own, or GM[r]/GV[r] when ``given``.
    status[r]: 0 decided, SPECIAL (IEEE path), 2 exact path for the row, 3 some elements NaN =
    undecided."""
    R, n = X.shape
    nW = W.shape[0]
    for r in prange(R):
        acc, tmp, scratch, dh, dl = new_workspace(n)
        x = X[r]
        wr = r % nW
        if given:
            c = GM[r]
            v_h, v_l, e_v = GV[r], 0.0, 0.0
            d_h, d_l, e_d = 0.0, 0.0, 0.0
            if not (abs(c) <= _GIVEN_MAX and 0.0 <= v_h <= _GIVEN_MAX):
                status[r] = SPECIAL
                continue
            bad = False
            for j in range(n):
                a = abs(np.float64(x[j]))
                if not a <= _GIVEN_MAX:
                    bad = True
                dh[j], dl[j] = two_sum(np.float64(x[j]), -c)
            if bad:
                status[r] = SPECIAL
                continue
        else:
            st, c, d_h, d_l, e_d, m_h, m_l, e_m2, _ = moments(x, center, prec, acc, tmp, scratch, dh, dl)
            if st != OK:
                status[r] = st
                continue
            v_h, v_l, e_v = biased_variance(m_h, m_l, e_m2, n)
        fine, r_h, r_l, e_r = inv_std(v_h, v_l, e_v, eps)
        if not fine:
            status[r] = 2
            continue
        ok = _apply_row(x, dh, dl, d_h, d_l, e_d, r_h, r_l, e_r, W, B, wr, has_w, has_b, prec, emin, emax, out[r])
        status[r] = 0 if ok else _UNDECIDED


@jit(parallel=True)
def _running_stats(Xc, RM, RV, mom, pm, em, xm, pv, ev, xv, out_m, out_v):
    """batch_norm's new running statistics per channel (row of Xc), rounded once:
    ``(1 - m) RM[c] + m mean`` to (pm, em, xm) and ``(1 - m) RV[c] + m M2 / (n - 1)`` to (pv, ev, xv),
    in double-word arithmetic with an absolute error bound and :func:`decide`; NaN where undecided
    or outside the bounds' range (a special or extreme row, an exactly zero result): the caller
    takes the exact path there. ``1 - m`` is exact as a double-word (TwoSum)."""
    R, n = Xc.shape
    o_h, o_l = two_sum(1.0, -mom)
    ok_m = safe(mom) and safe(o_h)
    for r in prange(R):
        out_m[r] = np.nan
        out_v[r] = np.nan
        acc, tmp, scratch, dh, dl = new_workspace(n)
        st, c, d_h, d_l, e_d, m_h, m_l, e_m2, _ = moments(Xc[r], True, min(pm, pv), acc, tmp, scratch, dh, dl)
        if st != OK or not ok_m:
            continue
        mean_h, mean_l = dd_add_fp(d_h, d_l, c)  # mean = c + delta
        e_mean = e_d + EPS * abs(mean_h)
        var_h, var_l = dd_div_fp(m_h, m_l, np.float64(n - 1))  # unbiased: M2 / (n - 1)
        e_var = e_m2 / (n - 1) * (1.0 + 2.0**-50) + EPS * abs(var_h)
        for k in range(2):
            s_h, s_l, e_s, old = (mean_h, mean_l, e_mean, RM[r]) if k == 0 else (var_h, var_l, e_var, RV[r])
            a_h, a_l = dd_mul_fp(o_h, o_l, old)  # exact (1 - m) times the stored value
            e_a = EPS * abs(a_h)
            b_h, b_l = dd_mul_fp(s_h, s_l, mom)
            e_b = e_s * abs(mom) + EPS * abs(b_h)
            y_h, y_l = dd_add(a_h, a_l, b_h, b_l)
            e = e_a + e_b + EPS * abs(y_h)
            if not (safe(old) and safe(s_h) and safe(a_h) and safe(b_h) and safe(y_h)):
                continue
            if k == 0:
                out_m[r] = decide(y_h, y_l, e * (1.0 + 2.0**-40), pm, em, xm)
            else:
                out_v[r] = decide(y_h, y_l, e * (1.0 + 2.0**-40), pv, ev, xv)


def normalize(X, W, B, center, fmt, eps, GM=None, GV=None):
    """Every row of the float32 or float64 (R, n) array X normalised (see the module docstring): W
    and B are (nW, n) or (nW, 1) float64 arrays or None, used by row ``r % nW``; GM/GV (R,) the
    given statistics (batch_norm in eval mode). Returns the (R, n) results rounded to fmt, as
    float32 when fmt is narrower than float64 (every value of such a format is a float32: the
    kernel stores them without a float64 copy to convert), else float64."""
    R, n = X.shape
    out = np.empty((R, n), np.float32 if fmt.prec <= 24 else np.float64)
    if R == 0 or n == 0:
        return out
    has_w, has_b = W is not None, B is not None
    Wk = W if has_w else np.ones((1, 1))
    Bk = B if has_b else np.zeros((1, 1))
    if has_w and has_b and W.shape != B.shape:  # one index rule for both
        Wk, Bk = np.broadcast_arrays(Wk, Bk)
        Wk, Bk = np.ascontiguousarray(Wk), np.ascontiguousarray(Bk)
    given = GM is not None
    gm = GM if given else np.zeros(1)
    gv = GV if given else np.zeros(1)
    status = np.zeros(R, np.int64)
    _normalize(X, Wk, Bk, has_w, has_b, center, given, gm, gv, float(eps), *fmt.params, out, status)
    for r in np.flatnonzero(status):
        wrow = Wk[r % Wk.shape[0]] if has_w else None
        brow = Bk[r % Bk.shape[0]] if has_b else None
        stats = (GM[r], GV[r]) if given else None
        if status[r] == SPECIAL:
            out[r] = _ieee_row(X[r], wrow, brow, center, eps, stats, fmt)
            continue
        cols = np.arange(n) if status[r] != _UNDECIDED else np.flatnonzero(np.isnan(out[r]))
        out[r, cols] = _exact_row(X[r], cols, wrow, brow, center, eps, stats, fmt)
    return out


def _ieee_row(x, w, b, center, eps, stats, fmt):
    """A row with NaN/inf (or given statistics outside float64's comfortable range): the formula
    in float64 IEEE arithmetic, as torch evaluates it, rounded to fmt."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        if stats is not None:
            mu, var = stats
        elif center:
            mu, var = np.mean(x), np.var(x)
        else:
            mu, var = 0.0, np.mean(x * x)
        y = (x - mu) * (1.0 / np.sqrt(var + eps))
        if w is not None:
            y = y * np.broadcast_to(w, x.shape)
        if b is not None:
            y = y + np.broadcast_to(b, x.shape)
    return round_array(np.ascontiguousarray(y, np.float64), *fmt.params)


def _exact_row(x, cols, w, b, center, eps, stats, fmt):
    """The exact path: b + (x - mean) w / sqrt(var + eps) from Fractions, rounded by comparing squares."""
    if stats is not None:
        mean, var = Fraction(stats[0]), Fraction(stats[1])
    else:
        mean, m2 = exact_moments(x, center)
        var = m2 / len(x)
    z = var + Fraction(eps)
    mean_neg = stats is not None and math.copysign(1.0, stats[0]) < 0
    if stats is None:
        mean_neg = center and len(x) > 0 and bool(np.all((x == 0) & np.signbit(x)))
    res = []
    for j in cols:
        xj = float(x[j])
        wf = float(w[j if w.size > 1 else 0]) if w is not None else 1.0
        bf = float(b[j if b.size > 1 else 0]) if b is not None else None
        wj, bj = Fraction(wf), Fraction(bf) if bf is not None else Fraction(0)
        a = (Fraction(xj) - mean) * wj
        if z > 0 and (a == 0 and bj == 0 or (a != 0 and bj != 0 and (a > 0) != (bj > 0) and a * a == bj * bj * z)):
            res.append(_zero_sign(xj, mean == 0 and mean_neg, center or stats is not None, wf, bf, a == 0))
            continue
        if z < 0:  # var + eps < 0 (a negative eps): the square root of a negative number, NaN
            res.append(math.nan)
            continue
        if z == 0:  # var + eps == 0: 0/0 or a/0, as IEEE arithmetic on the formula gives
            with np.errstate(all="ignore"):
                res.append(float(np.float64(float(a)) / np.float64(0.0) + float(bj)))
            continue
        res.append(round_quotient_sqrt(bj, a, z, fmt))
    out = np.array(res, np.float64)
    return round_array(out, *fmt.params) if out.size else out


def _zero_sign(x, mean_neg, centred, w, b, product_zero):
    """The signed zero of an exact zero result, as IEEE arithmetic along
    ``((x - mean) / sqrt(var + eps)) * w + b`` gives it: ``x - mean`` is -0 only for ``-0 - (+0)``, a
    product's zero has the sign of its factors, ``-0 + -0 = -0``, and an exact cancellation of
    nonzero values is +0 (the convention of :mod:`refkern.truth.reductions`)."""
    if not product_zero:
        return 0.0
    d_neg = (math.copysign(1.0, x) < 0 and not mean_neg) if centred else math.copysign(1.0, x) < 0
    if centred and x != 0:
        d_neg = False  # x == mean != 0: an exact zero difference is +0
    q_neg = d_neg != (math.copysign(1.0, w) < 0)
    if b is None:
        return -0.0 if q_neg else 0.0
    return -0.0 if q_neg and math.copysign(1.0, b) < 0 else 0.0


def _param(t, name, op, shape):
    """An optional affine parameter as float64 of ``shape`` (any float dtype: torch allows a float32
    weight with a half input)."""
    if t is None:
        return None
    o = operand(t, name, op)
    if tuple(o.shape) != tuple(shape):
        raise ValueError(f"{op}: expected {name} of shape {tuple(shape)}; got {name}.shape={tuple(o.shape)}.")
    return np.ascontiguousarray(o.values, np.float64)


def _trailing(op, x, normalized_shape):
    shape = _shape_arg(normalized_shape, op)
    k = len(shape)
    if k == 0 or k > x.ndim or tuple(x.shape[x.ndim - k :]) != shape:
        raise ValueError(
            f"{op}: normalized_shape={list(shape)} must be the last dimensions of the input; "
            f"got input.shape={tuple(x.shape)}."
        )
    return shape


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Reference ``F.layer_norm``: over the last ``len(normalized_shape)`` dimensions, the exact
    mean and biased variance, ``(x - mean) / sqrt(var + eps) * weight + bias`` real-valued,
    rounded once to the input's dtype (module docstring: the definition and the bound)."""
    op = "layer_norm"
    o = operand(input, "input", op)
    shape = _trailing(op, o.values, normalized_shape)
    n = int(np.prod(shape, dtype=np.int64))
    w = _param(weight, "weight", op, shape)
    b = _param(bias, "bias", op, shape)
    X = np.ascontiguousarray(o.values).reshape(-1, n) if n else np.zeros((0, 0))  # float32 or float64
    out = normalize(X, None if w is None else w.reshape(1, n), None if b is None else b.reshape(1, n), True, o.fmt,
                    _eps(eps, op))  # fmt: skip
    return deliver(out.reshape(o.shape), o.fmt, o.torch or _any_tensor(weight, bias))


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """Reference ``F.rms_norm``: ``x / sqrt(mean(x^2) + eps) * weight``, real-valued, rounded once.
    ``eps=None`` is torch's default: the epsilon of the type torch computes in, float32's 2**-23 for
    float16, bfloat16 and float32 inputs (their opmath type), 2**-52 for float64 (torch's kernels
    take ``numeric_limits<opmath_t>::epsilon()``, not ``torch.finfo(input.dtype).eps`` as its docs say)."""
    op = "rms_norm"
    o = operand(input, "input", op)
    shape = _trailing(op, o.values, normalized_shape)
    n = int(np.prod(shape, dtype=np.int64))
    w = _param(weight, "weight", op, shape)
    e = (2.0**-52 if o.fmt.prec == 53 else 2.0**-23) if eps is None else _eps(eps, op)
    X = np.ascontiguousarray(o.values).reshape(-1, n) if n else np.zeros((0, 0))
    out = normalize(X, None if w is None else w.reshape(1, n), None, False, o.fmt, e)
    return deliver(out.reshape(o.shape), o.fmt, o.torch or _any_tensor(weight))


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Reference ``F.group_norm``: input (N, C, *); the exact mean and biased variance of each
    group of C / num_groups channels over every spatial position, the affine step per channel,
    real-valued, rounded once."""
    op = "group_norm"
    o = operand(input, "input", op)
    x = o.values
    if x.ndim < 2:
        raise ValueError(f"{op}: expected input of shape (N, C, *); got input.shape={tuple(x.shape)}.")
    nb, c = x.shape[:2]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups <= 0:
        raise ValueError(f"{op}: num_groups must be a positive int; got {num_groups!r}.")
    if c % num_groups:
        raise ValueError(f"{op}: the {c} channels of input must divide into num_groups={num_groups} groups.")
    g = int(num_groups)
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    n = (c // g) * hw
    w = _param(weight, "weight", op, (c,))
    b = _param(bias, "bias", op, (c,))
    expand = lambda p: None if p is None else np.ascontiguousarray(np.repeat(p, hw).reshape(g, n))  # noqa: E731
    X = np.ascontiguousarray(x).reshape(nb * g, n)
    out = normalize(X, expand(w), expand(b), True, o.fmt, _eps(eps, op))
    return deliver(out.reshape(o.shape), o.fmt, o.torch or _any_tensor(weight, bias))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5,  # noqa: A002
               *, return_running_stats=False):  # fmt: skip
    """Reference ``F.batch_norm``; channel dimension 1, input (N, C) or (N, C, *).

    Eval (``training=False``): ``(x - running_mean[c]) / sqrt(running_var[c] + eps) * w + b``.
    Training: the batch's exact mean and BIASED variance over (N, *) per channel normalise; torch
    would then store ``(1 - momentum) * running + momentum * batch_stat``, with the UNBIASED batch
    variance (``M2 / (n - 1)``) for running_var, each real-valued and rounded once to the running
    tensor's dtype. The caller's tensors are never changed: with ``return_running_stats=True`` the
    result is ``(output, new_running_mean, new_running_var)`` (unchanged in eval; None stays None).
    An empty input gives an empty output (any shape, as torch: its statistics are not read).
    """
    op = "batch_norm"
    o = operand(input, "input", op)
    x = o.values
    e = _eps(eps, op)
    if e < 0 or (training and e == 0):  # torch's own rule for F.batch_norm (the other norms take any eps)
        need = "> 0 when training" if training else ">= 0"
        raise ValueError(f"{op}: eps must be {need}, as torch requires; got eps={eps!r}.")
    if x.size == 0:  # as torch: an empty input gives an empty output, the running statistics unchanged
        y = deliver(np.empty(x.shape), o.fmt, o.torch or _any_tensor(running_mean, running_var, weight, bias))
        return (y, running_mean, running_var) if return_running_stats else y
    if x.ndim < 2:
        raise ValueError(f"{op}: expected input of shape (N, C) or (N, C, *); got input.shape={tuple(x.shape)}.")
    c = x.shape[1]
    rm = _param(running_mean, "running_mean", op, (c,))
    rv = _param(running_var, "running_var", op, (c,))
    w = _param(weight, "weight", op, (c,))
    b = _param(bias, "bias", op, (c,))
    Xc = np.ascontiguousarray(np.moveaxis(x, 1, 0).reshape(c, -1))  # channels as rows, float32 or float64
    per = x.size // c if c else 0
    if training and per <= 1:
        raise ValueError(
            f"{op}: expected more than 1 value per channel when training; got input.shape={tuple(x.shape)}."
        )
    col = lambda p: None if p is None else p.reshape(c, 1)  # noqa: E731
    if not training and (rm is None or rv is None):
        raise ValueError(f"{op}: running_mean and running_var are required when training=False.")
    if training:
        out = normalize(Xc, col(w), col(b), True, o.fmt, e)
    else:
        out = normalize(Xc, col(w), col(b), True, o.fmt, e, GM=rm, GV=rv)
    moved = out.reshape((c, x.shape[0], *x.shape[2:]))
    tensor = o.torch or _any_tensor(running_mean, running_var, weight, bias)
    y = deliver(np.moveaxis(moved, 0, 1), o.fmt, tensor)
    if not return_running_stats:
        return y
    if not training:
        return y, running_mean, running_var
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float, np.floating, np.integer)):
        raise TypeError(f"{op}: momentum must be a float; got {momentum!r}.")
    m = Fraction(float(momentum))
    stats = [None if t is None else operand(t, name, op) for t, name in ((running_mean, "running_mean"),
                                                                          (running_var, "running_var"))]  # fmt: skip
    olds = [np.zeros(c) if so is None else np.ascontiguousarray(so.values, np.float64) for so in stats]
    fmts = [o.fmt if so is None else so.fmt for so in stats]
    fast = [np.empty(c), np.empty(c)]
    _running_stats(Xc, *olds, float(momentum), *fmts[0].params, *fmts[1].params, *fast)
    new = []
    for so, old, vals, unbiased in zip(stats, olds, fast, (False, True)):
        if so is None:
            new.append(None)
            continue
        for ch in np.flatnonzero(np.isnan(vals)):  # the exact path: undecided, special or extreme channels
            if not (np.isfinite(Xc[ch]).all() and np.isfinite(old[ch])):
                vals[ch] = _special_running(Xc[ch], float(old[ch]), float(momentum), unbiased)
                continue
            mean, m2 = exact_moments(Xc[ch])
            batch = m2 / (per - 1) if unbiased else mean
            vals[ch] = round_fraction((1 - m) * Fraction(float(old[ch])) + m * batch, so.fmt)
        new.append(deliver(vals, so.fmt, tensor))
    return y, new[0], new[1]


def _special_running(x, old, m, unbiased):
    """The running statistic where a value or the old statistic is inf or NaN, as IEEE arithmetic
    defines it (torch's): the batch mean is NaN with a NaN or with both infinities, else the infinity;
    the batch variance is NaN with any of them (inf - inf); then ``(1 - m) old + m batch``."""
    with np.errstate(all="ignore"):
        if not np.isfinite(x).all():
            pos, neg = bool((x == np.inf).any()), bool((x == -np.inf).any())
            batch = np.nan if unbiased or np.isnan(x).any() or (pos and neg) else (np.inf if pos else -np.inf)
        else:
            batch = 0.0  # finite data, special old statistic: the batch's finite value cannot change that
        return (1.0 - m) * old + m * batch


def _any_tensor(*ts):
    from refkern._arrays import is_tensor

    return any(is_tensor(t) for t in ts if t is not None)
