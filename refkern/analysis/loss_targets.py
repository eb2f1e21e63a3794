"""The judging of a loss's gradient with respect to its target (mse_loss, binary_cross_entropy), and the route
of each of those ops' gradients to its judge (the input's stays :mod:`refkern.analysis.gradients`'s).

* mse_loss: torch's autograd computes the target's gradient as ``mse_loss_backward(g, target, input)``, the
  input's kernel with the operands swapped, so the input's envelope with them swapped judges it
  (:func:`refkern.analysis.losses.mse_grad_report`).
* binary_cross_entropy: torch's ``binary_cross_entropy_target_backward`` computes ``-logit(p) g w (/ n)``:
  ``logit(p) = log(p / (1 - p))``, the quotient in the tensor's dtype and its log in the working precision, then
  the negation (exact) and the products and the division in the result's dtype (:func:`target_bound`)."""

import numpy as np

__all__ = ["mse_loss_report", "bce_report", "target_bound"]

#: the log's own error in ulps of its result: SLEEF's ``Sleef_logf*_u10`` / ``Sleef_logd*_u10`` (torch's
#: vectorised CPU kernels) are documented within 1.0 ulp, as glibc's logf and log are (its libm-test-ulps)
LOG_ULPS = 1.0


def mse_loss_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """mse_loss's gradients: the input's by :func:`refkern.analysis.gradients.mse_loss_report`, the target's by
    the same envelope with the operands swapped (module docstring)."""
    from refkern.analysis.gradients import mse_loss_report as input_report

    if k == "input":
        return input_report(name, k, adj, got, grad_output, bound, who, rtol, atol)
    swapped = {**bound, "input": bound["target"], "target": bound["input"]}
    rep = input_report(name, "input", adj, got, grad_output, swapped, who, rtol, atol)
    rep.op = "mse_loss backward (target)"
    return rep


def target_bound(ref, c, fmt) -> np.ndarray:
    """The envelope of torch's ``-logit(p) g w / n`` around the exact ``ref = c logit(p)`` (``c = -g w / n``).

    torch's CPU ``logit`` forms ``p / (1 - p)`` in the tensor's dtype (for float16 and bfloat16 too: measured on
    10**5 values each, torch 2.13, bit for bit ``log((p / (1 - p)).float())`` stored in the dtype, 36-38% of them
    unlike the float32 quotient's), then the log in the working precision (float32's unit ``u`` for float32 and
    the halves, float64's for float64), stored in the dtype. With ``u_o`` the result's unit: ``1 - p`` and the
    quotient each round once (p below 2**-12 leaves ``1 - p = 1`` in either half format and the quotient exact,
    so no subnormal quotient rounds), so the log's argument is ``p / (1 - p) (1 + d)``, ``|d| <= gamma_2(u_o)``,
    and its log is off by ``|log(1 + d)| <= gamma_2(u_o) / (1 - gamma_2(u_o))`` (absolute, below 2.01 u_o); the
    log itself within :data:`LOG_ULPS` ulp, ``<= 2 u |logit|``; a half result's logit stored once (``u_o
    |logit|``); then three roundings in the result's dtype (by g, by w, by n): ``gamma_3(u_o)`` (as
    :func:`refkern.kernels.loss.gamma`: with its second-order slack ``1 + 12 u_o``). In all: ``|c|
    2.01 u_o + |ref| (2 LOG_ULPS u + [u_o] + gamma_3(u_o))``, times 1.01 (the second-order terms), plus half the
    smallest subnormal per rounding in the dtype (4)."""
    from refkern.accumulate.formats import FLOAT64
    from refkern.kernels.loss import gamma

    u = FLOAT64.u if fmt is FLOAT64 else 2.0**-24
    uo = fmt.u
    half = uo if fmt.prec < 24 else 0.0
    eta = 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1)
    with np.errstate(all="ignore"):
        b = (np.abs(c) * 2.01 * uo + np.abs(ref) * (2 * LOG_ULPS * u + half + gamma(3, uo))) * 1.01 + 4 * eta
    return np.where(np.isnan(b), np.inf, b)


def bce_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """binary_cross_entropy's gradients: the input's by :func:`refkern.analysis.gradients.bce_report`, the
    target's by :func:`target_bound` around the correctly rounded ``-g w logit(p) (/ n)``."""
    from refkern.analysis.actual import actual_grad
    from refkern.analysis.gradients import bce_report as input_report
    from refkern.analysis.losses import _report
    from refkern.kernels.loss_grad import bce_grad_call
    from refkern.kernels.loss_target import bce_target_grad

    if k == "input":
        return input_report(name, k, adj, got, grad_output, bound, who, rtol, atol)
    p, y, w, G, fmt, _, red = bce_grad_call(grad_output, bound, who)
    a64, device = actual_grad(got, "target", fmt, who)  # its shape: compare_backward checked it
    ref = bce_target_grad(p, y, w, G, fmt, red)
    with np.errstate(all="ignore"):
        c = G * w / (max(p.size, 1) if red == "mean" else 1)
    b = target_bound(ref, c, fmt)
    note = ("the target's gradient of binary_cross_entropy, -g w logit(p), judged by the worst-case envelope of "
            "torch's formula (refkern.analysis.loss_targets)")  # fmt: skip
    return _report("binary_cross_entropy backward (target)", a64.reshape(ref.shape), ref, b, fmt, device, 1, rtol,
                   atol, [note])  # fmt: skip
