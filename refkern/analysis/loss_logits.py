"""The judging of binary_cross_entropy_with_logits' gradients (:mod:`refkern.kernels.loss_logits_grad`): the
correctly rounded gradient against a backend's, by the worst-case envelope of torch's CPU formulas (measured bit
for bit on torch 2.13, 2,000 elements x 4 dtypes x pos_weight or not x "none"/"mean"):

    input:  (sigmoid(x) - y) g w / n,  or with pos_weight  ((pw y + 1 - y) sigmoid(x) - pw y) g w / n
    target: -x g w / n,                or with pos_weight  (log_sigmoid(-x) - log_sigmoid(x) pw) g w / n

each operation rounded in the tensor's dtype; sigmoid and log_sigmoid computed in the working precision (float32
for float32 and the halves, float64 for float64; a half result stored once). Their accuracy, from how torch's CPU
kernels form them: sigmoid ``1 / (1 + e**-x)`` (exp within 1 ulp, ``<= 2 u`` relative, then a sum and a quotient:
``4 u`` relative, measured 2.47 u on 3e5 float32 values), and 0 where ``e**-x`` overflows (x below -log of the
largest finite value: an absolute error of sigmoid(x) itself); log_sigmoid ``min(x, 0) - log1p(e**-|x|)`` (exp and
log1p within 1 ulp each, the exp's relative error passing through log1p at most as itself, a sum of terms of one
sign: ``5 u`` relative, measured 1.94 u); each charged half the working format's smallest subnormal besides."""

import math

import numpy as np

__all__ = ["logits_report", "logits_bound"]


def _parts(fmt):
    """(u, eta_w, u_o, eta_o, half, the working format's largest finite value)."""
    from refkern.accumulate.formats import FLOAT64

    wide = fmt is FLOAT64
    u = 2.0**-53 if wide else 2.0**-24
    eta_w = 2.0**-1075 if wide else 2.0**-150
    eta_o = 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1)
    big = np.finfo(np.float64 if wide else np.float32).max
    return u, eta_w, fmt.u, eta_o, fmt.prec < 24, float(big)


def logits_bound(k, ref, x, y, w, pw, G, n, fmt, with_pw) -> np.ndarray:
    """The envelope of torch's formula for gradient ``k`` around ``ref`` (module docstring), per element:

    * the stored sigmoid ``s``: ``e_s = 4 u s + eta_w + [s where x < 1 - log(max)] + [u_o s + eta_o]`` (the
      bracket: a half result's store);
    * input, no pos_weight: ``|c| (e_s + u_o |s - y| + eta_o)``; with it, ``t = pw y`` and ``A = 1 + t - y``
      formed in three roundings (``e_A = u_o (2 |t| + 1 + |A|)``): ``|c| (e_A s + |A| e_s + u_o |A| s + u_o |t|
      + u_o |D| + 4 eta_o)``, ``D = A s - t``;
    * target, no pos_weight: ``-x`` exact; with it, ``l1 = log_sigmoid(-x)``, ``l2 = log_sigmoid(x)`` each within
      ``e_l(v) = 5 u |v| + eta_w + [u_o |v| + eta_o]``, then ``l2 pw`` and the difference: ``|c| (e_l(l1) + |pw|
      e_l(l2) + u_o |pw l2| + u_o |D| + 2 eta_o)``, ``D = l1 - pw l2``;

    then the three roundings by g, by w and by n (``c = g w / n``): times ``1 + gamma_3(u_o)``, plus ``gamma_3(u_o)
    |ref| + 3 eta_o``; all times 1.01 (second-order terms, and the float64 evaluation of s and the logs here)."""
    from refkern.kernels.loss import gamma

    u, eta_w, uo, eta_o, half, big = _parts(fmt)
    g3 = float(gamma(3, uo))
    hs = 1.0 if half else 0.0
    with np.errstate(all="ignore"):
        c = np.abs(G * w / n)
        if k == "input":
            s = np.where(x >= 0, 1.0 / (1.0 + np.exp(-x)), np.exp(x) / (1.0 + np.exp(x)))
            lost = np.where(x < 1.0 - math.log(big), s, 0.0)  # e**-x overflows: 0 computed
            es = 4 * u * s + eta_w + lost + hs * (uo * s + eta_o)
            if not with_pw:
                inner = es + uo * np.abs(s - y) + eta_o
            else:
                t = pw * y
                A = 1.0 + t - y
                eA = uo * (2 * np.abs(t) + 1.0 + np.abs(A))
                inner = eA * s + np.abs(A) * es + uo * np.abs(A) * s + uo * np.abs(t) + uo * np.abs(A * s - t) \
                    + 4 * eta_o  # fmt: skip
        elif not with_pw:
            inner = np.zeros(np.shape(ref))
        else:
            l1, l2 = -np.logaddexp(0.0, x), -np.logaddexp(0.0, -x)

            def el(v):
                return 5 * u * np.abs(v) + eta_w + hs * (uo * np.abs(v) + eta_o)

            inner = el(l1) + np.abs(pw) * el(l2) + uo * np.abs(pw * l2) + uo * np.abs(l1 - pw * l2) + 2 * eta_o
        b = (c * inner * (1 + g3) + g3 * np.abs(ref) + 3 * eta_o) * 1.01
    return np.where(np.isnan(b), np.inf, b)


def logits_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for gradient ``k`` ("input" or "target") of binary_cross_entropy_with_logits."""
    from refkern.analysis.actual import actual_grad
    from refkern.analysis.losses import _report
    from refkern.kernels.loss_logits_grad import logits_grad_call, logits_grads

    x, y, w, pw, G, fmt, _, red = logits_grad_call(grad_output, bound, who)
    a64, device = actual_grad(got, k, fmt, who)  # its shape: compare_backward checked it
    ref = logits_grads(x, y, w, pw, G, fmt, red, (k,))[k]
    n = max(x.size, 1) if red == "mean" else 1
    b = logits_bound(k, ref, x, y, w, pw, G, n, fmt, bound.get("pos_weight") is not None)
    note = (f"the gradient of binary_cross_entropy_with_logits' {k} judged by the worst-case envelope of torch's "
            "formula (refkern.analysis.loss_logits)")  # fmt: skip
    return _report(f"binary_cross_entropy_with_logits backward ({k})", a64.reshape(ref.shape), ref, b, fmt, device,
                   1, rtol, atol, [note])  # fmt: skip
