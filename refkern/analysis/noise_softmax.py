"""The statistical scale of softmax and log_softmax per row (the forward's; :mod:`refkern.analysis.noise` and
:mod:`refkern.analysis.noise_backward` read it): each element's own roundings and the part a row shares, from the
exact intermediates (module docstring of :mod:`refkern.analysis.noise`, "softmax and attention")."""

import numpy as np

from refkern.analysis._envelope_softmax import EXP_SCALE_ULPS
from refkern.analysis._envelope_softmax import LOG_SCALE_ULPS as LOG_ULPS
from refkern.analysis._rows import _weights, exp_ulps_rows
from refkern.analysis._softmax_rows import half_ulp, shared_sq
from refkern.analysis.noise_softmax_chains import Chains, applies

__all__ = ["scale_rows"]


def scale_rows(X, u, u_m, log, shared=False, chains=None):
    """Before the stores: sigma**2 of log_softmax over the rows of the logits X; for softmax sigma**2
    relative to the weight's square (a weight far below 2**-511 has a variance that underflows). With
    ``shared``, also the part every element of a row shares, per row: softmax's relative ``sum_j w_j beta_j``
    and ``D``'s errors (additions, rescales), log_softmax's ``log D`` and ``M + log D`` (absolute). With
    ``chains`` not None (softmax, ``shared``) a third value is returned: where ``chains`` is true and
    :func:`~refkern.analysis.noise_softmax_chains.applies`, D's additions are the rest's and this is that
    module's :class:`~refkern.analysis.noise_softmax_chains.Chains`, else None."""
    Mf, arg, t, D, w = _weights(X)
    with np.errstate(all="ignore"):
        B, Brow = exp_ulps_rows(arg, t, u)
        # the exp within B ulps of t (2 B half-ulps of the computed t, whose binade is at most t (1 + 2 B u)'s),
        # the argument z - M rounded once (its half-ulp), relative to t
        beta2 = (2.0 * B * half_ulp(t * (1.0 + 2.0 * B * u), u) / t) ** 2 + half_ulp(np.abs(arg), u) ** 2 + u_m**2
        beta2 = np.where(np.isfinite(arg) & (t > 0), beta2, 0.0)  # a term of weight 0 moves nothing
        wb = np.einsum("ij,ij->i", w * w, beta2)  # sum_j w_j**2 beta_j**2
        adds, rec = shared_sq(X, t, u, EXP_SCALE_ULPS)  # the sum's additions at their half-ulps; its rescales
        ch = None
        if chains and not log and applies(X):  # the long chains emulated: the element and row tests on the rest
            ch = Chains(X, arg, t, D, B, Brow, u, wb, adds, rec)
            adds = ch.adds_rest
        sd2 = wb + adds + rec * ((2.0 * Brow + 1.0) * u) ** 2
        if log:
            L = np.log(D)
            # |log D^ - L| to first order: log's LOG_ULPS ulps and D^'s relative error (n exps within
            # EXP_SCALE_ULPS, n - 1 additions, at most n rescales of 2 EXP_SCALE_ULPS + 1): each value below is
            # rounded within the half-ulp of its magnitude widened by it
            dL = u * (2.0 * LOG_ULPS * np.abs(L) + X.shape[1] * (2.0 * EXP_SCALE_ULPS + 3.0))
            hL = 2.0 * LOG_ULPS * half_ulp(np.abs(L) + dL, u)  # log D within LOG_ULPS ulps
            hML = half_ulp(np.abs(Mf[:, 0] + L) + dL, u)  # M + log D
            y2 = half_ulp(np.abs(arg), u) ** 2 + (sd2 + hL**2 + hML**2)[:, None]
            y2 = y2 + half_ulp(np.abs(arg - L[:, None]) + dL[:, None], u) ** 2
            y2 = y2 + u_m**2 * (arg * arg + (L * L)[:, None] + 1.0)
            y2 = np.where(np.isfinite(y2), y2, 0.0)
            # the row shares log D's error, M + log D's rounding and, where a stage is stored in the result
            # format (u_m), log D's store: one value per row
            return (y2, sd2 + hL**2 + hML**2 + (u_m * L) ** 2) if shared else y2
        own = beta2 * (1.0 - 2.0 * w)
        rel = (own + wb[:, None] + (adds + 2.0 * u * u)[:, None]
               + (rec * ((2.0 * Brow + 1.0) * u) ** 2)[:, None] + u_m**2)  # fmt: skip
        rel = np.where(np.isfinite(rel), np.maximum(rel, 0.0), 0.0)  # relative: sigma**2 / w**2
        if chains is not None:
            return rel, sd2, ch
        return (rel, sd2) if shared else rel
