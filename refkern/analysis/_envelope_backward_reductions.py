"""The gradients' envelopes of mean, var, std and cumsum (:mod:`refkern.analysis._envelope_backward`,
whose docstring derives the envelopes)."""


import numpy as np

from refkern.accumulate.formats import FLOAT64, Format
from refkern.analysis._envelope_backward_ops import EVAL_SLACK, NORM_SECOND_ORDER, _units

MEAN_ROUNDINGS = 3  #: mean's g / n: n converted to the working format, the reciprocal (or the division), the product


VAR_K_ROUNDINGS = 3  #: var's (2 / dof) g: 2 / dof in float64, its conversion to the working format, the product


def mean_bound(t: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of the gradient of a mean, ``g / n`` per element of grad_output, around ``ref`` (its
    correctly rounded value), from ``t = |g| / n`` (float64), for results in ``out``.

    **What a correct backward computes** (torch: ``sum_backward(grad) / n``; CUDA divides by a scalar as
    ``a * (1 / b)``; half formats compute in float32, torch's opmath, and round once to the result): in the
    working precision ``ua`` (float32 for float16/bfloat16/float32 results, float64 for float64) either
    ``fl(g / fl(n))`` or ``fl(g * fl(1 / fl(n)))``, then one store to the result format. ``fl(n)`` rounds
    once (n above 2**24 in float32), the reciprocal or the division once, the product once:
    MEAN_ROUNDINGS = 3 relative roundings, ``|v - g / n| <= gamma_3(ua) |g / n| + eta_w`` (``eta_w``: the
    working format's smallest normal, for a product that underflows; the reciprocal of an integer
    below 2**63 does not).

    The store and the centre as the norms' step 6: ``|actual - ref| <= E (1 + 2**-52) + u_o (2 |ref| (1 + 2
    u_o) + E) + 2 eta_o`` (``t`` is within 2**-53 of ``|g / n|``), then EVAL_SLACK. Elements whose reference
    is not finite get 0 (IEEE arithmetic there: only the same value fits)."""
    from refkern.analysis.envelope import _gamma

    u, _, eta_w, _, u_o, eta_o = _units(out)
    with np.errstate(all="ignore"):
        E = _gamma(MEAN_ROUNDINGS, u) * np.asarray(t, np.float64) + eta_w
        refm = np.abs(ref)
        B = E * (1.0 + 2.0**-52) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = np.where(np.isnan(B), np.inf, B * EVAL_SLACK)
        return np.where(np.isfinite(ref), B, 0.0)


def _forward_std(X: np.ndarray, corr, out: Format) -> np.ndarray:
    """The correctly rounded std of each row of the float64 (R, n) array X in ``out`` (the forward's value,
    the centre of its envelope), float64 (R,)."""
    from refkern.kernels.reduction import _exact_var, _row_var

    res = np.empty(X.shape[0])
    status = np.zeros(X.shape[0], np.int64)
    c_h = float(corr)
    _row_var(np.ascontiguousarray(X), c_h, float(corr - type(corr)(c_h)), True, *out.params, res, status)
    for r in np.flatnonzero(status == 2):
        res[r] = _exact_var(X[r], corr, out, True)
    return res


def centred(X: np.ndarray, out: Format):
    """(d, e_d, slack) for the finite float64 rows (R, n) of X: ``d = x - mu`` in float64, the bound ``e_d``
    on a correct backend's stored ``x - mean^`` around the exact ``x - mu`` (:func:`var_bound`, step 1), and
    the float64 evaluation's own error on d (step 5)."""
    from refkern.analysis.envelope import _gamma

    R, n = X.shape
    u, u_m, _, _, _, eta_o = _units(out)
    with np.errstate(all="ignore"):
        mu = X.mean(axis=1, keepdims=True) if n else np.zeros((R, 1))
        A = np.abs(X).mean(axis=1, keepdims=True) if n else np.zeros((R, 1))
        d = X - mu
        slack = (n + 4) * 2.0**-52 * (A + np.abs(mu)) + 2.0**-52 * np.abs(d)
        g_n = _gamma(n + 1, u)[()] * A
        dmu = g_n + u_m * (np.abs(mu) + g_n) + eta_o
        e_d = dmu + (u + u_m) * (np.abs(d) + dmu) + eta_o
    return d, e_d, slack


def var_bound(X: np.ndarray, G: np.ndarray, corr, ref: np.ndarray, out: Format, want_std: bool,
              nodim: bool) -> np.ndarray:  # fmt: skip
    """The envelope of the gradient of var (std with ``want_std``) over the rows of the float64 (R, n)
    array X, one grad_output value per row G (R,), ``dof = n - corr``, around ``ref`` (R, n) (the correctly
    rounded gradient), for results in ``out``.

    **What a correct backward computes.** torch's autograd (``var_backward``, ``std_backward``): ``(2 / dof)
    * grad * (self - self.mean(dim, True))``, each a tensor op that stores its result in the dtype; std
    first forms ``grad_var = grad / (2 result)`` from its own *stored* forward output. The class covered:
    the three factors multiplied in any order, ``2 / dof`` evaluated in float64 and converted to the
    working format, every operation in the working precision ``ua`` (float32, torch's opmath, for half
    and float32 results; float64 for float64) and every intermediate possibly stored in the result format
    (``uc = ua + u_m``, ``u_m`` the half format's unit, 0 otherwise; ``eta_o`` absolute, half its smallest
    subnormal), the mean by any correct implementation.

    **Derivation** (``mu`` the mean, ``d = x - mu``, ``A = mean |x|``, ``K = 2 / |dof|``; every error charged
    against magnitudes inflated by their own bounds, so the cross terms of perturbed products are covered):

    1. The stored mean: ``|mean^ - mu| <= dmu = gamma_{n+1}(ua) A + u_m (|mu| + gamma_{n+1}(ua) A) + eta_o``
       (n - 1 additions, n converted, the division; the store of that value). ``x - mean^``, computed and
       stored: within ``e_d = dmu + uc (|d| + dmu) + eta_o`` of d. This is the cancellation every correct
       backend shows on offset data (an absolute error ``ua |mu|`` per element), ``D = |d| + e_d``.
    2. The factor multiplying d. var: ``q = g``, exact. std: the forward's stored ``s^`` is within ``e_s =
       B_f + u_o s + eta_o`` of ``s = sqrt(M2 / dof)`` (``B_f`` its forward envelope around the correctly
       rounded std, :mod:`refkern.analysis.envelope`); ``q = g / (2 s)``: ``2 s^`` is exact, the quotient
       rounds once and is stored (``uc``): within ``e_q = |g| e_s / (2 s (s - e_s)) + uc |g| / (2 (s - e_s)) +
       eta_o`` (infinite where ``s <= e_s``: no bound is claimed); ``Q = |q| + e_q``.
    3. ``t = fl(fl(2 / dof) q)``, stored: within ``e_t = K e_q + VAR_K_ROUNDINGS uc K Q + eta_o``,
       VAR_K_ROUNDINGS = 3 (2 / dof in float64, its conversion, the product).
    4. ``t d^``: within ``E = e_t D + K Q e_d + ua (K Q + e_t) D + eta_w`` of ``K q d``, the exact gradient
       (the product's rounding in the working format; another order of the three factors rounds the same
       number of times on the same magnitudes).
    5. The store and the centre as the norms' step 6: ``E (1 + NORM_SECOND_ORDER ua) + u_o (2 |ref| (1 + 2
       u_o) + E) + 2 eta_o``. The bound is evaluated in float64: mu, d (within ``(n + 4) 2**-52 (A + |mu|)
       + 2**-52 |d|``, added to D) and s (the correctly rounded float64 std: ``2**-52 s`` added to e_s),
       then EVAL_SLACK.

    Rows with a NaN or an infinity (in x or g), ``dof <= 0`` (except var with a ``dim`` and ``dof < 0``,
    torch's finite formula), std rows with ``M2 = 0`` and non-finite references get 0: torch's rule is an
    IEEE value (:mod:`refkern.kernels.reduction_backward`), only the same value fits."""
    from refkern.analysis.envelope import envelopes

    R, n = X.shape
    u, u_m, eta_w, _, u_o, eta_o = _units(out)
    uc = u + u_m
    dof = n - float(corr)
    with np.errstate(all="ignore"):
        fin = np.isfinite(X).all(axis=1) & np.isfinite(G)
        Xf = np.where(fin[:, None], X, 0.0)
        d, e_d, slack = centred(Xf, out)
        D = np.abs(d) + e_d + slack
        K = 2.0 / abs(dof) if dof != 0 else np.inf
        Ga = np.abs(G)[:, None]
        bad = ~fin[:, None] | np.zeros((1, n), bool)
        if dof <= 0 and (nodim or want_std or dof == 0):
            bad = bad | True
        if want_std and dof > 0 and R and n:
            s64 = _forward_std(Xf, corr, FLOAT64)[:, None]
            s_o = _forward_std(Xf, corr, out)
            hyps, _ = envelopes("std", {"x": Xf, "dim": 1, "correction": float(corr), "keepdim": False}, s_o, out,
                                lazy=True)  # fmt: skip
            b_f = np.asarray(hyps[0][3], np.float64).reshape(R, 1)
            e_s = b_f + u_o * s64 + eta_o + 2.0**-52 * s64
            lo = s64 - e_s
            e_q = np.where(lo > 0, Ga * e_s / (2.0 * s64 * lo) + uc * Ga / (2.0 * lo) + eta_o, np.inf)
            Q = Ga / (2.0 * s64) + e_q
            bad = bad | (s64 == 0)
        else:
            e_q = 0.0
            Q = Ga
        KQ = K * Q
        e_t = K * e_q + VAR_K_ROUNDINGS * uc * KQ + eta_o
        E = e_t * D + KQ * e_d + u * (KQ + e_t) * D + eta_w
        refm = np.abs(ref)
        B = E * (1.0 + NORM_SECOND_ORDER * u) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = np.where(np.isnan(B), np.inf, B * EVAL_SLACK)
        return np.where(bad | ~np.isfinite(ref), 0.0, B)


def cumsum_converted_bound(gp: np.ndarray, axis: int, ref_p: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of cumsum's gradient with ``dtype=`` where grad_output is not representable in the
    input's format ``out``: autograd converts it first (``grad.to(self.scalar_type())``, the float64 values
    ``gp``) and takes the reversed cumsum of that in ``out``. A correct backend lies within the forward cumsum
    envelope (:mod:`refkern.analysis.envelope`, its "rounding" hypothesis) of ``ref_p``, the correctly rounded
    reversed cumsum of gp; the reference ``ref`` (that of the given grad_output) is a known distance
    ``|ref_p - ref|`` away, both exact: their sum. Elements where either reference is not finite get 0."""
    from refkern.analysis.envelope import envelopes

    fl = np.ascontiguousarray(np.flip(gp, axis))
    hyps, _ = envelopes("cumsum", {"x": fl, "dim": axis, "dtype": None}, np.ascontiguousarray(np.flip(ref_p, axis)),
                        out, lazy=True)  # fmt: skip
    with np.errstate(all="ignore"):
        b = np.flip(np.asarray(hyps[0][3], np.float64), axis) + np.abs(ref_p - ref)
        b = np.where(np.isnan(b), np.inf, b)
        return np.where(np.isfinite(ref) & np.isfinite(ref_p), b, 0.0)
