"""The statistical scale of the gradients that the worst-case envelopes bound (softmax, log_softmax,
the norms, the poolings, mean, var and std): how far a correct backward typically lands from the exact
gradient, per element, by first-order propagation of each rounding, as :mod:`refkern.analysis.noise`
does for the forwards. The worst-case envelope (:mod:`refkern.analysis._envelope_backward`) stays the
outer certainty; inside it the statistical test of :mod:`refkern.analysis.inside` decides on this scale.

A correct backward returns the exact gradient plus ``e = sum_j c_j v_j delta_j`` to first order, one
term per rounding ``j`` of a value ``v_j`` (``|delta_j| <= u``), ``c_j`` the derivative of the gradient
element with respect to that value, computed from the exact intermediates; with the deltas
mean-independent, Azuma-Hoeffding bounds the tail by ``2 exp(-lam**2 / 2)`` at ``lam sigma`` with
``sigma**2 = sum_j (u c_j v_j)**2`` plus the stores ``2 (u_o y)**2 + 2 eta_o**2`` (the reference's own
rounding to the result format and the backend's store). The working unit ``u`` is float32's for fp16,
bf16 and fp32 results (torch's opmath) and float64's for float64. A rounding whose value is shared by
a row (a mean, an rstd, a row sum) enters each element with its own coefficient: its variance is
``c_i**2`` times the shared value's, computed per element. Sums take the partial sums of the
left-to-right and right-to-left orders, whichever is larger (:func:`~refkern.analysis.noise._partial_sq`:
pairwise, blocked and tree orders have smaller ones on data without structure).

What the backward reads of the forward is a value the backend stored, with the forward's own error
(the softmax output, the log_softmax output, the statistics mean and rstd, std's result): that error is
one more source, with the forward scale of :mod:`refkern.analysis.noise` (its shared part, the row's
denominator, kept apart from the per-element part, because it moves a whole row coherently).

Per family (``y`` the forward output, ``g`` grad_output, ``u_m`` the half result format's unit where
torch keeps an intermediate in it, 0 otherwise):

* **softmax** ``dx_i = y^_i (g_i - D^)``, ``D^ = sum_j g_j y^_j``. The stored weights carry a relative
  error ``eps_j`` of their own (the exponential, the division, the store: variance ``nu_j``) and one
  shared by the row, ``eps_S`` (the denominator: variance ``sigma_S**2``), so ``y^_j = y_j (1 + eps_j -
  eps_S)``; then ``dx_i`` moves by ``y_i (g_i - D) eps_i - y_i sum_j g_j y_j eps_j`` and by ``-y_i (g_i - 2 D)
  eps_S``; ``D``'s products and partial sums ``u**2 (sum (g y)**2 + S**2)`` (and ``u_m D`` stored),
  the difference ``(u**2 + u_m**2) (g_i - D)**2`` and either product form ``u**2 ((y g)**2 + (y D)**2 +
  dx**2)``. float64 results are scaled per element by a power of two of the weight, as the forward.
* **log_softmax** ``dx_i = g_i - exp(l^_i) G^``, ``G = sum g``: the stored ``l^_i`` (its forward variance,
  absolute) and the exponential (``2 B u`` relative, B of ``exp_scale_ulps`` at l^) move ``exp(l^_i)``
  relatively; ``G``'s partial sums (``u_m G`` stored); the product and the difference.
* **layer_norm, rms_norm, group_norm, batch_norm**, grad_input ``dx_j = r (gw_j - S / n) - r**3 d_j C /
  n`` (``d = x - mean``, ``gw = g w``, ``S = sum gw``, ``C = sum gw d``, ``r = (var + eps)**-1/2``): each
  product ``gw_k`` (charged ``u + u_m``: Hugging Face's RMSNorm forms it in the half dtype;
  ``d dx_j / d gw_k = r [j = k] - r / n - r**3 d_j d_k / n``, summed in closed form over
  k from the row's moments of ``gw**2``), ``S``'s partial sums (through ``C = S mean^ - sum gw x`` too, in
  torch's raw form), ``C``'s terms and partial sums in the larger of the raw form (``sum gw x``, then
  ``S mean^ - ds``) and the centred one (``sum gw (x - mean^)``), the stored statistics (``r``'s
  relative error, coefficient ``dx_j - 2 r**3 d_j C / n``; the mean's, ``r**3 (C + S d_j) / n``; as the
  forward's scale has them, plus ``u_m`` where they are stored in the half format), and the assembly
  ``dx = r gw + b x + c`` (``b = r**3 C / n``; ``b``'s own roundings cancel between ``b x`` and ``c = -b
  mean^ - ...`` to ``b d_j``): ``u_a**2 (2 (r gw)**2 + 5 (b d)**2 + 2 (b x)**2 + 2 (b mean)**2 + 3 (r S /
  n)**2 + 2 dx**2)``, ``u_a = u`` (``u + u_m`` for batch_norm's half kernel, which also stores S and C in
  the half format). grad_weight and grad_bias sum ``g xhat^`` and ``g`` over the rows: ``xhat^``'s
  shared errors move every term of one row in one column coherently (``r``'s by ``sum g xhat``, the
  mean's by ``r sum g``), its own roundings and the product per term, the column's partial sums; group_norm
  and batch_norm with half inputs store each block's (row's) sum in the half format (``u_m`` of it). torch's
  CPU layer_norm and rms_norm for half inputs round the running sums over the rows to the half format
  (the float32 model refuses its bf16 grad_bias by 484 sigma at 64 rows): that is a reduced precision of
  its own (``u_m`` on the partial sums), named with the scale test as its evidence.
* **the poolings**: an average's grad_input is a sum of ``k`` terms ``g / d`` (``k`` windows hold the
  element), a maximum's of ``k`` exact terms ``g``: the order-free ``(k + 1) (u_c A)**2`` (``A = sum |t|``,
  ``u_c = u + u_m``: torch's CPU kernels add into the half gradient tensor).
* **mean**: ``g / n``, MEAN_ROUNDINGS roundings. **var, std**: ``(2 / dof) q (x - mean^)`` with the
  stored mean's error (shared), ``x - mean^`` and the factor's roundings (``u_c`` each: every tensor op
  stores in the dtype), std's ``q = g / (2 s^)`` with the forward std's error. That whole scale is the group
  tests'; the element test is :func:`var_members`': each row's shared relative error fitted to the actual
  row within its bound, and a half result's mean stored in it a member of its own, its rounding known.

Where a correct kernel's shared errors are known rather than charged: batch_norm's half grad_bias is the
float32 sum stored once (:func:`bias_straddle`), its grad_weight with the statistics (and ``C``) stored in the
half format emulated (:func:`weight_members`); attention's gradients have a scale test per head on the errors
their elements share (:class:`AttentionShared`).

What is not first order is left out knowingly, as in the forward (products of two deltas).

The pools' and reductions' scales are in :mod:`refkern.analysis.noise_backward_reductions` (:func:`pool_noise`,
:func:`mean_noise`, :func:`var_noise`, :func:`var_members`), attention's in
:mod:`refkern.analysis.noise_backward_attention` (:func:`attention_noise`, :class:`AttentionShared`).
"""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.analysis._rows import _partial_sq, _weights, exp_ulps_rows
from refkern.analysis.noise import RSQRT_ULPS
from refkern.analysis.noise_moments import _moments
from refkern.analysis.noise_softmax import scale_rows

__all__ = ["softmax_noise", "norm_input_noise", "norm_param_noise", "converted", "bias_straddle", "weight_members"]

ASSEMBLY = (2.0, 5.0, 2.0, 2.0, 3.0, 2.0)  #: roundings charged on r gw, b d, b x, b mean, r S / n, dx (docstring)


def _units(out: Format):
    """(u, u_m, u_o, eta_o, eta_w): the working unit, the half result format's unit (0 otherwise), the
    result's unit, half its smallest subnormal, half the working format's smallest subnormal."""
    work = FLOAT64 if out is FLOAT64 else FLOAT32
    u_m = out.u if out.prec < FLOAT32.prec else 0.0
    return work.u, u_m, out.u, 2.0 ** (out.emin - out.prec), 2.0 ** (work.emin - work.prec)


def _stores(y, out: Format, k: float = 0.0):
    """The reference's rounding and the backend's store, ``2 (u_o y)**2 + 2 eta_o**2``, and ``k`` working
    operations that may underflow by ``eta_w`` each."""
    _, _, u_o, eta_o, eta_w = _units(out)
    return 2.0 * (u_o * y) ** 2 + 2.0 * eta_o**2 + k * eta_w**2


def converted(var, ref, fmt: Format):
    """The scale of a gradient computed in another format and converted to ``fmt`` (autograd's conversion
    back with ``dtype=``): one more rounding, ``u |ref|`` (``fmt``'s unit), and the reference's own."""
    return var + 2.0 * (fmt.u * np.asarray(ref, np.float64)) ** 2


# ------------------------------------------------------------------------------------ softmax family


def softmax_noise(xr, gr, out: Format, log: bool):
    """(sigma**2 per element of the rows (R, n), the scale: a power of two per element, or 1) of the
    softmax (log_softmax with ``log``) gradient over the rows ``xr`` of logits with grad_output ``gr``,
    computed in ``out`` (module docstring)."""
    from refkern.analysis._envelope_softmax import EXP_SCALE_ULPS, exp_scale_ulps
    from refkern.analysis._softmax_rows import half_ulp, shared_sq

    u, u_m, u_o, eta_o, eta_w = _units(out)
    eta_h = eta_o if u_m else 0.0  # D^ (G^) and g - D^ stored in the half format: a subnormal loses eta_o
    X = np.asarray(xr, np.float64)
    G = np.asarray(gr, np.float64)
    R, n = X.shape
    Mf, arg, t, Dn, y = _weights(X)
    with np.errstate(all="ignore"):
        y = np.where(np.isfinite(y), y, 0.0)
        if log:
            l2 = scale_rows(X, u, u_m, True) + 2.0 * (u_o * (arg - np.log(Dn)[:, None])) ** 2  # l^'s variance
            Gs = G.sum(axis=1, keepdims=True)
            vG = u * u * _partial_sq(G)[:, None] + (u_m * Gs) ** 2
            yG = y * Gs
            dx = G - yG
            vG = vG + eta_h**2  # G stored in the half format may be subnormal
            Bl = exp_scale_ulps(arg - np.log(Dn)[:, None], u)  # exp of the stored l^ = z - M - log D
            v = yG**2 * (l2 + (2.0 * Bl * u) ** 2) + y * y * vG + u * u * (yG**2 + dx * dx)
            v = v + u_m**2 * yG**2 + _stores(dx, out, n + 4)
            return np.where(np.isfinite(v), v, np.inf), 1.0
        # the forward's per-element and shared relative variances (noise_softmax.scale_rows, split)
        B, Brow = exp_ulps_rows(arg, t, u)
        beta2 = (2.0 * B * half_ulp(t * (1.0 + 2.0 * B * u), u) / t) ** 2 + half_ulp(np.abs(arg), u) ** 2 + u_m**2
        beta2 = np.where(np.isfinite(arg) & (t > 0), beta2, 0.0)
        nu = beta2 + 2.0 * u * u + u_o**2  # the exponential, the division, the store of y^
        adds, rec = shared_sq(X, t, u, EXP_SCALE_ULPS)  # D's additions at their half-ulps, its rescales
        sS = np.einsum("ij,ij->i", y * y, beta2) + adds + rec * ((2.0 * Brow + 1.0) * u) ** 2
        D = np.einsum("ij,ij->i", G, y)[:, None]
        h = G - D
        gy = G * y
        vD = u * u * (np.einsum("ij,ij->i", gy, gy)[:, None] + _partial_sq(gy)[:, None]) + (u_m * D) ** 2 + eta_h**2
        own = h * h * nu - 2.0 * h * G * y * nu + np.einsum("ij,ij->i", gy * gy, nu)[:, None]
        rel = (
            np.maximum(own, 0.0)
            + (G - 2.0 * D) ** 2 * sS[:, None]
            + vD
            + (u * u + u_m**2) * h * h
            + eta_h**2
            + u * u * (G * G + D * D + h * h)
        )  # fmt: skip  (relative to y**2: every term carries y_i)
        rel = np.where(np.isfinite(rel), rel, np.inf)
        dx = y * h
        if out is not FLOAT64:
            return rel * y * y + _stores(dx, out, n + 4), 1.0
        # float64: in units of each weight's power of two (a tiny weight's variance would underflow)
        _, e = np.frexp(np.where(y > 0, y, 1.0))
        sc = np.ldexp(1.0, np.minimum(1 - e, 1000))
        ys, dxs = y * sc, dx * sc
        eta_s = np.ldexp(1.0, out.emin - out.prec + np.frexp(sc)[1] - 1)  # float64's eta (2**-1075) times sc
        v = rel * ys * ys + 2.0 * (u_o * dxs) ** 2 + (n + 6) * eta_s**2
        return v, sc


# ------------------------------------------------------------------------------------------------ norms


def _stats(X, center, eps, u, u_stat):
    """Per row: (mean, r, sigma**2 of the stored mean, relative sigma**2 of the stored r), as the
    forward's scale has them (:func:`refkern.analysis.noise._norm`), plus ``u_stat`` (the half format's
    unit where the statistics are stored in it)."""
    R, n = X.shape
    m2, mean, s2, smu2 = _moments(X, center, u)
    var = m2 / max(n, 1)
    sv2 = s2 / max(n, 1) ** 2 + (u * var) ** 2
    with np.errstate(all="ignore"):
        w = var + eps
        r = 1.0 / np.sqrt(w)
        srel2 = (sv2 + (u * w) ** 2) / (4.0 * w * w) + (2.0 * RSQRT_ULPS * u) ** 2 + u_stat**2
    return mean, r, smu2 + (u_stat * mean) ** 2, srel2


def _given_stats(RM, RV, eps, u, R):
    """batch_norm in eval mode: the running statistics are exact inputs; ``invstd`` rounds ``rv + eps``
    (twice: eps converted, the addition), then within RSQRT_ULPS ulps."""
    mean = np.broadcast_to(np.asarray(RM, np.float64), (R,)).copy()
    with np.errstate(all="ignore"):
        r = 1.0 / np.sqrt(np.broadcast_to(np.asarray(RV, np.float64), (R,)) + eps)
    return mean, r, np.zeros(R), np.full(R, (2.0 * u) ** 2 / 4.0 + (2.0 * RSQRT_ULPS * u) ** 2)


@jit(error_model="numpy")
def _psq(lp, sp, spp, t, n):
    """max(left-to-right, right-to-left) sum of squared partial sums from a row's prefix accumulators
    (``lp = sum_{j >= 1} P_j**2``, ``sp = sum_{j <= n-3} P_j``, ``spp = sum_{j <= n-3} P_j**2``, t the total)."""
    if n < 2:
        return 0.0
    rp = t * t + (n - 2) * t * t - 2.0 * t * sp + spp if n > 2 else t * t
    return max(lp, rp)


@jit(parallel=True, error_model="numpy")
def _norm_input_rows(X, G, W, mean, r, smu2, srel2, u, ug, ua, us, u_o, eta_o, eta_w, asm, out):
    """sigma**2 of a norm's grad_input per element of the rows (module docstring); W (P, n), row i uses
    ``W[i % P]``; ``ua`` the assembly's unit, ``us`` the unit of S and C stored in the half format (0)."""
    R, n = X.shape
    P = W.shape[0]
    for i in prange(R):
        mu, ri = mean[i], r[i]
        S, Cn, T0, T1, T2, Tgx2, Tgd2 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        # per sum (S, ds = sum gw x, C = sum gw d): lp, sp, spp of _psq
        l0, l1, l2, p0, p1, p2, q0, q1, q2 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        ds = 0.0
        for j in range(n):
            x = X[i, j]
            d = x - mu
            gw = G[i, j] * W[i % P, j]
            S += gw
            ds += gw * x
            Cn += gw * d
            q = gw * gw
            T0 += q
            T1 += d * q
            T2 += d * d * q
            Tgx2 += (gw * x) ** 2
            Tgd2 += (gw * d) ** 2
            if j >= 1:
                l0 += S * S
                l1 += ds * ds
                l2 += Cn * Cn
            if j <= n - 3:
                p0 += S
                p1 += ds
                p2 += Cn
                q0 += S * S
                q1 += ds * ds
                q2 += Cn * Cn
        PS = _psq(l0, p0, q0, S, n)
        Pds = _psq(l1, p1, q1, ds, n)
        PC = _psq(l2, p2, q2, Cn, n)
        vraw = u * u * (Tgx2 + Pds + (S * mu) ** 2 + Cn * Cn)  # C = S mean^ - ds
        vcen = u * u * (2.0 * Tgd2 + PC)  # C = sum gw (x - mean^)
        vC = max(vraw, vcen) + (us * Cn) ** 2
        a = ri / n
        b = ri * ri * ri * Cn / n
        for j in range(n):
            x = X[i, j]
            d = x - mu
            gw = G[i, j] * W[i % P, j]
            bj = ri * ri * ri * d / n
            dx = ri * gw - a * S - bj * Cn
            v1 = a * a * T0 + 2.0 * a * bj * T1 + bj * bj * T2 + (ri * ri - 2.0 * ri * (a + bj * d)) * gw * gw
            v = ug * ug * max(v1, 0.0)
            v += a * a * (u * u * PS * max(1.0, (1.0 + ri * ri * d * mu) ** 2) + (us * S) ** 2)
            v += bj * bj * vC
            cr = dx - 2.0 * bj * Cn
            cm = ri * ri * ri * (Cn + S * d) / n
            v += srel2[i] * cr * cr + smu2[i] * cm * cm
            v += (
                ua
                * ua
                * (
                    asm[0] * (ri * gw) ** 2
                    + asm[1] * (b * d) ** 2
                    + asm[2] * (b * x) ** 2
                    + asm[3] * (b * mu) ** 2
                    + asm[4] * (a * S) ** 2
                    + asm[5] * dx * dx
                )
            )
            v += (
                2.0 * (u_o * dx) ** 2
                + 2.0 * eta_o * eta_o
                + (n + 8) * (eta_w * ri) ** 2 * (1.0 + (ri * (abs(x) + abs(mu))) ** 2)
            )
            if us > 0.0:  # every step stored in the half format: each may land below its normals
                v += 8.0 * eta_o * eta_o * (1.0 + ri * ri + (ri * ri * ri * (abs(x) + abs(mu))) ** 2)
            out[i, j] = v if v == v else np.inf


def norm_input_noise(X, G, W, center, eps, fmts, half_steps=False, given=None):
    """sigma**2 of a norm's grad_input per element of the rows (R, n) (module docstring): X, G float64
    rows, W (P, n) or None, ``fmts`` the arguments' formats; ``half_steps``: batch_norm's half kernel
    (every step stored in the half format); ``given``: batch_norm in eval mode, (running_mean,
    running_var), whose grad_input is ``g invstd w``."""
    out = fmts["input"]
    u, u_m, u_o, eta_o, eta_w = _units(out)
    R, n = X.shape
    Wk = np.ones((1, max(n, 1))) if W is None else np.ascontiguousarray(np.asarray(W, np.float64).reshape(-1, n))
    if given is not None:
        mean, r, smu2, srel2 = _given_stats(given[0], given[1], eps, u, R)
        with np.errstate(all="ignore"):
            dx = G * Wk[np.arange(R) % Wk.shape[0]] * r[:, None]
            v = dx * dx * (srel2[:, None] + 2.0 * u * u) + _stores(dx, out, 2)
        return np.where(np.isfinite(v), v, np.inf)
    mean, r, smu2, srel2 = _stats(X, center, eps, u, u_m)  # half statistics stored in the input's format
    if u_m:
        smu2 = smu2 + eta_o**2  # a stored mean below the half format's normals
    ua = u + (u_m if half_steps else 0.0)
    v = np.empty((R, n))
    if R and n:
        # g w may be formed in the half format (Hugging Face's RMSNorm: w * h.to(dtype), whose backward rounds
        # g w to it): its rounding is charged u + u_m
        _norm_input_rows(np.ascontiguousarray(X), np.ascontiguousarray(G), Wk, mean, r, smu2, srel2, u, u + u_m, ua,
                         u_m if half_steps else 0.0, u_o, eta_o, eta_w, np.asarray(ASSEMBLY), v)  # fmt: skip
    return v


def _row_col_sums(rg, R, n, *values):
    """Per (row, column) of ``rg`` ((R, n) -> (T, C)): the sum of each (R, n) array's terms that the row puts
    in that column, (R, C) each (a row's errors move those terms together)."""
    rowid = rg(np.broadcast_to(np.arange(R)[:, None], (R, n)))
    T, C = rowid.shape
    key = (rowid * C + np.broadcast_to(np.arange(C)[None, :], (T, C))).reshape(-1)
    return [np.bincount(key, rg(a).reshape(-1), R * C).reshape(R, C) for a in values]


def norm_param_noise(name, X, G, center, eps, fmts, regroup=None, given=None):
    """(sigma**2 of grad_weight or grad_bias (``name``) per element (C,), a thunk giving the same with the
    running sums rounded to the half format (torch's CPU kernels for half inputs) or None, and
    ``coherent(y)``: the variance of ``sum_c e_c y_c`` from the errors a row shares with every column, its
    statistics', ``sum_rows srel2 (A y)**2 + smu2 r**2 (B y)**2`` with ``A``, ``B`` the (row, column) sums
    of ``g xhat`` and ``g``; 0 for grad_bias, whose columns share nothing): the sums over the columns of
    ``regroup(.)`` ((R, n) -> (T, C); default the columns of X) of ``g xhat^`` and ``g`` (module docstring)."""
    fin, out = fmts["input"], fmts[name]
    u, u_m, _, _, _ = _units(fin)
    R, n = X.shape
    if given is not None:
        mean, r, smu2, srel2 = _given_stats(given[0], given[1], eps, u, R)
    else:
        mean, r, smu2, srel2 = _stats(X, center, eps, u, u_m)
    rg = regroup if regroup is not None else (lambda A: A)
    with np.errstate(all="ignore"):
        if name == "bias":
            terms = rg(G)
            v = np.zeros(terms.shape[1])
            coherent = lambda y: 0.0  # noqa: E731
            if regroup is not None and u_m:  # group_norm, batch_norm: each block's sum stored in the half format
                (B,) = _row_col_sums(rg, R, n, G)
                v = v + (u_m * u_m) * (B * B).sum(axis=0)
        else:
            d = X - mean[:, None]
            xh = d * r[:, None]
            t = G * xh
            own = u * u * (G * G * ((X * r[:, None]) ** 2 + (mean * r)[:, None] ** 2 + xh * xh) + t * t)
            terms = rg(t)
            A, B = _row_col_sums(rg, R, n, t, G)  # sum g xhat and sum g per (row, column)
            v = (srel2[:, None] * A * A + (smu2 * r * r)[:, None] * B * B).sum(axis=0) + rg(own).sum(axis=0)
            if regroup is not None and u_m:  # group_norm, batch_norm: each block's sum stored in the half format
                v = v + (u_m * u_m) * (A * A).sum(axis=0)

            def coherent(y):
                y = np.asarray(y, np.float64).reshape(-1)
                with np.errstate(all="ignore"):
                    e = float(np.sum(srel2 * (A @ y) ** 2) + np.sum(smu2 * r * r * (B @ y) ** 2))
                return e if np.isfinite(e) else np.inf

        P = _partial_sq(np.ascontiguousarray(terms.T))
        res = terms.sum(axis=0)
        v = v + u * u * P + _stores(res, out, terms.shape[0] + 2)
        v = np.where(np.isfinite(v), v, np.inf)
    half = None
    if u_m and regroup is None:  # layer_norm, rms_norm: torch's CPU running sums over the rows in half (measured)
        half = lambda: np.where(np.isfinite(v), v + u_m * u_m * P, np.inf)  # noqa: E731
    return v, half, coherent


def bias_straddle(X, G, fmts, regroup=None):
    """:attr:`~refkern.analysis.noise.Noise.straddle` of a norm's grad_bias whose every column is the sum of one
    row's terms (batch_norm: a channel's ``sum g``), in a half result format, else None. Every correct kernel
    sums the column in float32 (torch's half kernel keeps ``S`` in the half format: that store is the
    result's) and stores it once, so the result is ``RN(y + e)`` with ``e`` the float32 sum's error, ``u**2``
    times the column's partial sums (:func:`~refkern.analysis._rows._partial_sq`) plus what may underflow
    (``(n + 4) eta_w**2``): the element test of a stored result (:func:`refkern.analysis.inside._straddle`), not
    the store charged as noise of its own (``2 (u_o y)**2``: 4 channels of a float16 batch_norm over 2048
    terms let a grad_bias scaled by 8x the spread of correct kernels, 2 ulps, pass at a threshold of 6 ulps).
    The centre: the column's sum in float64, within ``2 n 2**-53 sum |g|`` (twice float64's ``gamma_n``)."""
    out = fmts["bias"]
    if out.prec >= FLOAT32.prec or regroup is None:
        return None
    R, n = X.shape
    if _one_block(regroup, R, n) is None:
        return None  # a column of several blocks (group_norm): each block's sum may be stored in the half format
    terms = np.ascontiguousarray(regroup(np.asarray(G, np.float64)).T)  # (C, N hw)
    u = FLOAT32.u
    eta_w = 2.0 ** (FLOAT32.emin - FLOAT32.prec)
    with np.errstate(all="ignore"):
        pre = u * u * _partial_sq(terms) + (terms.shape[1] + 4) * eta_w**2
    pre = np.where(np.isfinite(pre), pre, np.inf)

    def thunk():
        with np.errstate(all="ignore"):
            xh = terms.sum(axis=1)
            err = terms.shape[1] * FLOAT64.u * 2.0 * np.abs(terms).sum(axis=1)
        return xh, np.where(np.isfinite(err), err, np.inf)

    return pre, thunk


def bias_chains(X, G, fmts, regroup=None):
    """:attr:`~refkern.analysis.noise.Noise.members` ``(sigma**2 of the rest, thunk)`` of a norm's float32
    grad_bias whose every column is one row's ``sum g`` (batch_norm's channels), else None: a column is a float32
    sum of float32 terms, so its long chains are emulated as the forward sum's are
    (:mod:`refkern.analysis.noise_chains`: the members, ``T`` chunks of ``L`` lanes with ``T L < C``, exact;
    the rest, every order of chains of at most ``ceil(n / C)`` terms, charged). Charged as one draw of the
    scalar loop's partial sums (``u**2 sum P_k**2``, :func:`norm_param_noise`), a scale ``sqrt(n / log n)``
    times a blocked kernel's: a float32 batch_norm's grad_bias over 8192 terms scaled by 8x the spread of
    correct kernels passed (bench_verdict's power-backward)."""
    from types import SimpleNamespace

    from refkern.analysis.noise import _chains

    out = fmts["bias"]
    R, n = X.shape
    if out is not FLOAT32 or regroup is None or _one_block(regroup, R, n) is None:
        return None
    terms = np.ascontiguousarray(regroup(np.asarray(G, np.float64)).T)  # (C, N hw): one column's terms a row
    T = terms.shape[1]
    _, _, _, _, eta_w = _units(out)
    with np.errstate(all="ignore"):  # the forward sum's members and rest, on the columns as rows
        got = _chains(SimpleNamespace(X=terms, n=T, back=lambda a: a), "sum", None,
                      _stores(terms.sum(axis=1), out, T + 2), eta_w)  # fmt: skip
    if got is None:
        return None
    var_el, thunk = got
    return np.where(np.isfinite(var_el), var_el, np.inf), thunk


def _one_block(regroup, R, n):
    """Per row, the column that holds all its terms, where every column is one row's (batch_norm's channels);
    else None."""
    (cnt,) = _row_col_sums(regroup, R, n, np.ones((R, n)))
    hit = cnt > 0
    if hit.shape[1] != R or not (np.all(hit.sum(axis=0) == 1) and np.all(hit.sum(axis=1) == 1)):
        return None
    return np.argmax(hit, axis=1)


def weight_members(X, G, center, eps, fmts, regroup=None):
    """Members of a norm's grad_weight ``y = r sum g (x - m)`` per column where each column is one row's sum
    (batch_norm's channels) and the result is half: ``(straddle, thunk)`` for :attr:`~refkern.analysis.noise.
    Noise.straddle` and :attr:`~refkern.analysis.noise.Noise.members` (``(None, thunk)``), else None. Charged as
    noise, the statistics stored in the half format (torch's CPU kernels: ``mean`` and ``invstd`` are half
    tensors) and ``C = sum g (x - m)`` stored in it (torch's half kernel) are a relative scale of ``sqrt(3) u_p``
    per column: 4 channels of a float16 batch_norm let one element off by 8x the spread of correct kernels (4
    ulps) pass. Known, they are centres:

    * ``straddle``, every kernel with float32 statistics and sums, stored once: sigma**2 before the store from
      the float32 statistics' errors (``srel2``, ``smu2`` of :func:`_stats` with no half store), each term's own
      roundings and the sum's partial sums, around the exact gradient (the element test of a stored result,
      :func:`refkern.analysis.inside._straddle`);
    * the members, tested as a stored result (:func:`refkern.analysis.inside._members`): the statistics
      stored in p, ``m_h`` one of the two roundings of ``mean -+ lam sqrt(smu2)`` and ``r_h`` of ``r (1 -+ lam
      sqrt(srel2))`` (``lam = level(R)``: a row's float32 statistic lies beyond with probability at most ``ALPHA
      / PARTS / R``), then ``r_h sum g (x - m_h)`` stored once (sigma**2 before the store: the terms' own
      roundings and partial sums), or ``C`` stored in p first, ``RN_p(C -+ lam sigma_C)``, then times ``r_h``
      and stored (before the store: the float32 product, ``u**2 y**2``). Centres in float64: ``err`` ``2 n
      2**-53`` relative to ``r sum |g d|``."""
    from refkern.accumulate.formats import round_array
    from refkern.analysis.stats import level

    out = fmts["weight"]
    if out.prec >= FLOAT32.prec or regroup is None:
        return None  # a half result is computed in float32 (its input is half too)
    R, n = X.shape
    col = _one_block(regroup, R, n)
    if col is None:
        return None
    u, eta_w = FLOAT32.u, 2.0 ** (FLOAT32.emin - FLOAT32.prec)
    lam = level(max(R, 1))
    with np.errstate(all="ignore"):
        mean, r, smu2, srel2 = _stats(X, center, eps, u, 0.0)

        def own(m, rr):  # the terms' own roundings and the partial sums, sigma**2 per row, and sum g d, sum |g d|
            d = X - m[:, None]
            t = G * d * rr[:, None]
            v = u * u * (G * G * ((X * rr[:, None]) ** 2 + (m * rr)[:, None] ** 2 + (d * rr[:, None]) ** 2) + t * t)
            return v.sum(axis=1) + u * u * _partial_sq(np.ascontiguousarray(t)) + (n + 4) * eta_w**2, (G * d).sum(
                axis=1), np.abs(G * d).sum(axis=1)  # fmt: skip

        v0, Cx, Ax = own(mean, r)
        y = r * Cx
        Bs = G.sum(axis=1)
        v_el = v0 + srel2 * y * y + smu2 * (r * Bs) ** 2 + 2.0 * eta_w**2
        xs, errs, pres = [], [], []
        mhs = [round_array(np.ascontiguousarray(mean + sg * lam * np.sqrt(smu2)), *out.params) for sg in (-1.0, 1.0)]
        rhs = [round_array(np.ascontiguousarray(r * (1.0 + sg * lam * np.sqrt(srel2))), *out.params)
               for sg in (-1.0, 1.0)]  # fmt: skip
        for mh in mhs:
            for rh in rhs:
                vp, Cm, Am = own(mh, rh)
                xs.append(rh * Cm)
                errs.append(2.0 * n * FLOAT64.u * rh * Am)
                pres.append(vp)
                sC = np.sqrt(vp) / np.abs(rh)  # C's float32 error
                for sg in (-1.0, 1.0):
                    Ch = round_array(np.ascontiguousarray(Cm + sg * lam * sC), *out.params)
                    xs.append(Ch * rh)
                    errs.append(2.0 * FLOAT64.u * np.abs(Ch * rh))
                    pres.append((u * Ch * rh) ** 2 + eta_w**2)
        order = np.argsort(col)  # row i holds column col[i]
        fix = lambda t: np.where(np.isfinite(t), t, np.inf)  # noqa: E731
        batch = tuple(fix(np.stack([np.asarray(t)[order] for t in arr])) for arr in (xs, errs, pres))
        y, Ax = y[order], (2.0 * n * FLOAT64.u * r * Ax)[order]
    return (fix(v_el[order]), lambda: (y, fix(Ax))), lambda: iter([batch])
