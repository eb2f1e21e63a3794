"""The judging of cross_entropy's gradient (:mod:`refkern.kernels.loss_ce_grad`): the correctly rounded
``s (p A - B)`` against a backend's, by the worst-case envelope of torch's CPU composition:

1. ``y = log_softmax(x)`` stored in the dtype, within the forward's envelope of a correct log_softmax
   (:func:`refkern.kernels._loss_bound.pick_bounds`, the envelope the forward loss is judged by) of the exact;
2. ``gy = -s B``, formed by autograd in the dtype: nll_loss's backward ``-w_t g / total_weight`` (two roundings),
   with label smoothing ``g (1 - eps)`` first and the smoothing's path ``g (eps / C)``, ``/ weight sum``, ``w_j``
   (three) added to it at the target (one), probability targets ``g / R``, ``w_j``, ``y'_j`` with ``y' = y (1 -
   eps) + eps / C`` itself two roundings: at most 7 roundings in the dtype, each within ``u_o`` of its own term,
   whose magnitudes sum to ``|s| |B|_j`` (``|B|_j`` the sum of the terms' magnitudes); a mean's divisor D as torch
   sums it (R weights accumulated in the working precision, then stored: ``e_D = gamma_R(u) sum |w_t| + u_o |D|``,
   a relative ``e_D / (|D| - e_D)`` on every gy);
3. ``_log_softmax_backward_data``: ``gx = gy - exp(y) sum_k gy_k`` in the working precision (float32 for float32
   and the halves, float64 for float64; a half result stored): the sum ``gamma_C(u)``, exp within 1 ulp (``2 u``
   relative) of ``e**y``, which is within ``expm1(e_y)`` (relative) of p, the product and the difference one
   rounding each.

Per element: ``e_gy = |s| |B|_j (gamma_7(u_o) + d_D (1 + gamma_7(u_o)))``, ``e_S = gamma_C(u) sum_k (|gy_k| +
e_gy_k) + sum_k e_gy_k``, ``e_p = p (expm1(e_y) + 2 u) (1 + 2 u)`` (0 where x = -inf: exp(-inf) = 0 exactly), and
``b = [e_gy + e_p (|S| + e_S) + p e_S + u (p + e_p)(|S| + e_S) + u |ref| + (u_o |ref| + eta_o)_half] 1.01 + 2
eta_w + 7 eta_o`` (eta: half the format's smallest subnormal)."""

import numpy as np

__all__ = ["ce_report", "ce_bound", "ce_target_bound"]


def ce_bound(c, G, ref_rows) -> np.ndarray:
    """The envelope (R, C), row layout, of torch's cross_entropy gradient around the reference rows (module
    docstring); ``c`` the validated call, ``G`` grad_output per row."""
    from refkern.accumulate.formats import FLOAT64
    from refkern.kernels._loss_bound import logsoftmax_rows, pick_bounds
    from refkern.kernels.loss import gamma, log_sums
    from refkern.kernels.loss_ce_grad import ce_coefficients

    fmt = c.fmt
    wide = fmt is FLOAT64
    u = 2.0**-53 if wide else 2.0**-24
    eta_w = 2.0**-1075 if wide else 2.0**-150
    uo, eta_o, half = fmt.u, 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1), fmt.prec < 24
    X = c.X
    R, C = X.shape
    if not R:
        return np.zeros((R, C))
    D, Bf = ce_coefficients(c)
    w = np.ones(C) if c.weight is None else np.asarray(c.weight, np.float64)
    eps = c.label_smoothing
    g7 = float(gamma(7, uo))
    with np.errstate(all="ignore"):
        if c.target is None:
            mag = np.abs(w)[None, :] * (np.abs(c.probs) * (1 - eps) + eps / C)
        else:
            mag = np.zeros((R, C))
            rows = np.flatnonzero(c.valid)
            mag[rows] = (eps / C) * np.abs(w)[None, :]
            mag[rows, c.target[rows]] += (1 - eps) * np.abs(w[c.target[rows]])
        dD = 0.0
        if c.reduction == "mean" and c.target is not None:
            wt = np.abs(w[c.target[c.valid]])
            eD = float(gamma(max(R, 1), u)) * float(wt.sum()) + uo * abs(float(D))
            dD = eD / (abs(float(D)) - eD) if eD < abs(float(D)) else np.inf
        s = G / float(D) if D != 0 else np.full(R, np.nan)
        gy = np.stack([-s[r] * np.array([float(b) for b in Bf(r)]) if Bf(r) is not None else np.zeros(C)
                       for r in range(R)])  # fmt: skip
        egy = np.abs(s)[:, None] * mag * (g7 + dD * (1 + g7))
        S = gy.sum(1)
        eS = float(gamma(C, u)) * (np.abs(gy) + egy).sum(1) + egy.sum(1)
        m = np.max(X, axis=1, keepdims=True)
        p = np.exp(X - m) / np.exp(X - m).sum(1, keepdims=True)
        stats = logsoftmax_rows(X, log_sums(X), fmt)
        ey = np.stack([pick_bounds(X, stats, np.full(R, j), fmt) for j in range(C)], axis=1)
        ep = np.where(X == -np.inf, 0.0, p * (np.expm1(ey) + 2 * u) * (1 + 2 * u))
        aS, eS = np.abs(S)[:, None], eS[:, None]
        b = (egy + ep * (aS + eS) + p * eS + u * (p + ep) * (aS + eS) + u * np.abs(ref_rows)
             + (uo * np.abs(ref_rows) + eta_o if half else 0.0)) * 1.01 + 2 * eta_w + 7 * eta_o  # fmt: skip
    return np.where(np.isnan(b), np.inf, b)


def ce_target_bound(c, G, ref_rows) -> np.ndarray:
    """The envelope (R, C), row layout, of torch's gradient of a probability target: autograd forms ``-(g / R) w_j
    y_j (1 - eps)`` (a mean's division, the products by the weight, by the stored log_softmax ``y`` and by ``1 -
    eps``: at most 4 roundings in the dtype, the negation exact), ``y`` within the forward's envelope ``e_y``
    (:func:`refkern.kernels._loss_bound.pick_bounds`) of the exact ``log p``: ``|s (1 - eps) w_j| e_y (1 +
    gamma_4(u_o)) + gamma_4(u_o) |ref| + 4 eta_o``, times 1.01."""
    from refkern.kernels._loss_bound import logsoftmax_rows, pick_bounds
    from refkern.kernels.loss import gamma, log_sums
    from refkern.kernels.loss_ce_grad import ce_coefficients

    fmt = c.fmt
    X = c.X
    R, C = X.shape
    if not R:
        return np.zeros((R, C))
    D, _ = ce_coefficients(c)
    w = np.ones(C) if c.weight is None else np.asarray(c.weight, np.float64)
    g4, eta_o = float(gamma(4, fmt.u)), 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1)
    stats = logsoftmax_rows(X, log_sums(X), fmt)
    ey = np.stack([pick_bounds(X, stats, np.full(R, j), fmt) for j in range(C)], axis=1)
    with np.errstate(all="ignore"):
        coef = np.abs(G / float(D))[:, None] * (1 - c.label_smoothing) * np.abs(w)[None, :]
        b = (coef * ey * (1 + g4) + g4 * np.abs(ref_rows) + 4 * eta_o) * 1.01
    return np.where(np.isnan(b), np.inf, b)


def ce_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for the gradient of cross_entropy's input or probability target."""
    from refkern.analysis.actual import actual_grad
    from refkern.analysis.losses import _report
    from refkern.kernels.loss_ce_grad import ce_grad, ce_grad_call, ce_target_grad
    from refkern.kernels.loss_grad import _back

    c, G, _ = ce_grad_call(grad_output, bound, who)
    a64, device = actual_grad(got, k, c.fmt, who)
    if k == "target":
        ref_rows = ce_target_grad(c, G)
        b, ref = _back(c, ce_target_bound(c, G, ref_rows)), np.asarray(_back(c, ref_rows), np.float64)
        note = ("the gradient of cross_entropy's probability target judged by the worst-case envelope of torch's "
                "products with its stored log_softmax (refkern.analysis.loss_ce_grad)")
        return _report("cross_entropy backward (target)", a64.reshape(ref.shape), ref, b, c.fmt, device, 1, rtol,
                       atol, [note])  # fmt: skip
    ref_rows = ce_grad(c, G)
    b = _back(c, ce_bound(c, G, ref_rows))
    ref = np.asarray(_back(c, ref_rows), np.float64)
    note = ("the gradient of cross_entropy judged by the worst-case envelope of torch's composition (log_softmax, "
            "nll_loss or the probability targets' sum, autograd's products: refkern.analysis.loss_ce_grad)")
    return _report("cross_entropy backward (input)", a64.reshape(ref.shape), ref, b, c.fmt, device, c.C, rtol, atol,
                   [note])  # fmt: skip
