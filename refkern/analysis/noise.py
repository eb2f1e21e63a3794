"""The statistical scale of the ops that the worst-case envelopes bound: how far a correct kernel
typically lands from the exact result, per element, by first-order propagation of each rounding.

The worst-case envelope (:mod:`refkern.analysis.envelope`) holds for every correct implementation, so
it grows like ``n u`` times a condition number and is infinite in bfloat16 at 32 features: inside it,
anything passes. This module gives the yardstick of the statistical test that decides inside it
(:mod:`refkern.analysis.inside`), built as :mod:`refkern.analysis.stats` builds the GEMMs': a correct
kernel returns the exact value plus ``e = sum_j c_j v_j delta_j`` to first order, one term per rounding
``j`` of a value ``v_j`` with ``|delta_j| <= u_j``, ``c_j`` the derivative of the output with respect to
that value, computed per element from the exact intermediates (the row's mean, variance and ``r =
(var + eps)**-1/2``, its maximum, exponentials and their sum, the attention weights). With the deltas
mean-independent (Higham and Mary 2019), Azuma-Hoeffding gives ``P(|e| >= lam sigma) <= 2 exp(-lam**2
/ 2)`` with::

    sigma**2 = sum_j (u_j c_j v_j)**2 + 2 (u_o y)**2 + 2 eta_o**2 + k eta_w**2

(the reference's own rounding to the result format and the backend's store: ``u_o |y|`` each, ``eta_o``
half the result format's smallest subnormal; ``k`` roundings that may underflow by ``eta_w``, half the
working format's smallest subnormal). The working unit is float32's for fp16, bf16 and fp32 results
(torch's opmath type, every GPU kernel's statistics) and float64's for float64 results.

**The kernels people run are the family.** A sum's roundings are its partial sums; which partial sums
depends on the order, so the scale takes ``S**2 = max(sum_k P_k**2, sum_k Q_k**2)`` over the prefix sums
``P`` (left to right) and suffix sums ``Q`` (right to left): on data without structure pairwise,
blocked, tree and cascade orders have smaller partial sums than either (each of their partial sums is
a sum of fewer consecutive terms), and a CPU scalar loop is the left-to-right order itself. Per family:

* **sum, mean** (and the average pools, whose windows are short: the order-free ``(n + 1) (u M)**2``,
  ``M = sum|x|``): ``u**2 S**2``; a mean adds its division ``u |y|``. With a float32 result that scale
  stays for the group tests, while the element test takes the long chains out and emulates them
  (:mod:`refkern.analysis.noise_chains`: one output is one draw, and the scalar loop's scale let a bug
  of 33 times the spread of correct kernels pass).
* **var, std**: ``M2 = sum d_k**2`` with ``d = x - mean``: each ``d_k`` (``2 d_k**2 u``) and its square
  (``d_k**2 u``), the partial sums of the squares (``S`` of ``d**2``), and, for Welford's updating
  algorithm, each running mean's rounding ``u (|m_k| + 2 |x_k - m_(k-1)| / k)``, which reaches M2 with the
  factor ``2 k |sum_(j > k) (x_j - m_(j-1)) / j|`` (an error ``e`` in ``m_k`` persists as ``e k / j`` in
  ``m_j`` and moves the j-th increment ``(x_j - m_(j-1))**2 (j - 1) / j`` by ``-2 (x_j - m_(j-1)) e k / j``);
  the mean's own error ``e_mu`` enters only at second order, ``n e_mu**2``, kept as one more term (it is
  all there is for a constant row). Then ``var = M2 / D`` (``u var``); ``std = sqrt(var)`` by propagating
  ``[var - lam sigma, var + lam sigma]`` through the square root at the test's level ``lam``, the wider
  side over ``lam`` (first order fails where the variance is near 0), plus ``u std``. Squares that
  underflow lose up to ``2 n eta`` of M2, one bounded term (every square may lose it alike). That scale
  stays for the group tests; with a float32 or half result on float32 values the element test takes the
  long chains out and emulates them (:mod:`refkern.analysis.noise_var_chains`: sequential and chunked
  Welford, the two-pass loop; the sequential Welford's scale let a float32 var off by 32 times the spread
  of correct kernels pass), its scale the rest's (every order of chains of at most ``n / C`` terms).
* **norms** ``y = (x - mean) r w + b``: shared by a row, the mean's error ``sigma_mu`` (reaching ``y`` as
  ``r w``) and ``r``'s relative error ``sigma_w / (2 w) + 2 RSQRT_ULPS u`` (``w = var + eps``, rsqrt within
  RSQRT_ULPS ulps); per element ``x - mean``, the product by ``r``, by ``w`` and the bias's addition
  (``3 (u t)**2 + (u y)**2``, ``t = (x - mean) r w``). Two forms are in the family, each a model of its
  own: the standard one above and the **folded** one of torch's CPU kernels and cuDNN's inference, ``x (r
  w) + (b - mean r w)``, whose roundings are ``r w`` and its product with ``x`` (``2 (u x r w)**2``), ``mean
  r w`` and the shift (``(u mean r w)**2 + (u (b - mean r w))**2``) and the sum; it loses about
  ``log2(|x| / |x - mean|)`` bits and is named when only it explains a result. A third member is a
  **sequential Welford** mean on rows whose values sit on a coarse grid (bf16 rows of mean 300 and spread
  1 hold three values): its running roundings ``m_k + d_k / k`` are then not mean-independent and drift
  together (measured: 700 float32 ulps of the mean at 4096 elements, 20x the averaged scale), so that
  member takes the drift of those kernels themselves, emulated on the rows: ``D`` the largest ``|m - mean|``
  of the sequential Welford means in the working format, ``m += (x - m) / k`` and ``m += (x - m) fl(1 / k)``,
  left to right and right to left (:func:`~refkern.analysis.noise_rows.welford_drift`), and accepts ``|e|
  <= lam sigma + r |w| D`` through the variance ``2 sigma**2 + 2 (r w D / lam)**2`` (``(a + b)**2 <= 2 a**2 +
  2 b**2``), sigma the larger of the two forms'. The rows' drifts are not averaged across rows either (on
  such rows they share a sign): a group of one column sums them, up to ``|w_j| sum_i r_i D_i``, so where
  the columns are groups each element takes ``c_ij = r_i |w_j| D_i |w_j| sum_k r_k D_k`` for ``(r w D)**2``
  (``c_ij >= (r_i w_j D_i)**2``, and the column's ``sum_i c_ij`` is its drift's square), over ``level(1)``, the
  lowest level of any test of the call. The drift's worst case, every step's rounding ``u (|m_k| +
  2 |d_k / k|)`` of one sign reaching the mean times ``k / n``, ``B = u (max(sum_k |P_k|, sum_k |Q_k|) + 2 sum
  |x - mean|) / n``, is no kernel's: measured 3-19x the emulated drift on bf16 rows (four to six values),
  19-160x on fp16 rows (24 to 30 values) of 1024-8192 features, where that window passed bugs of 8-32 spreads of
  correct kernels (an element, a feature, a constant offset; 8 of 13 at 8192). batch_norm with batch
  statistics and a half result stores the statistics in the result format (torch's CPU kernel):
  ``u_o |mean|`` and ``u_o var`` more.
* **softmax, log_softmax, attention**: each term ``t_j = exp(z_j - M)`` carries a relative error
  ``beta_j``: the exponential within B ulps at its argument (torch's exp_u20 measured per binade of |x|:
  :data:`~refkern.analysis._envelope_softmax.EXP_SCALE_BINADES`, 2 to 4.75), the
  subtraction ``u |z_j - M|``, for attention the logit's dot product (its partial sums over E, bounded per
  block of :data:`DOT_BLOCK` features as P @ V's below, and its products ``sum_l (q_l k_jl)**2``), the
  scale's product ``u |z_j|``, q and k scaled by ``fl(sqrt(s))`` (two roundings each, ``u_o`` more where
  they are stored in a half result format: k's independent per term, q's shared by the row's logits,
  ``s sum_l eps_l q_l C_cl`` with ``C_cl = sum_j w_j (v_jc - o_c) k_jl`` computed per row) and a float
  mask's addition (``u |z_j|``). A weight moves by
  ``w_i (beta_i - sum_j w_j beta_j)``, an attention output by ``sum_j w_j (v_j - o) beta_j``; the sum ``D``
  by its partial sums (``u S_t / D`` relative) and, in an online (tiled) softmax, by one exponential and
  one product each time the running maximum rises: at most ``R`` times, ``R`` the number of records of
  the row read left to right or right to left (a tiled kernel rises at most once per tile, never more
  often than the records of its order; in attention the exponential cancels between the numerator
  and the denominator, the two products remain). For softmax and log_softmax each rescale moves ``D``
  by the sum of the terms before its record, not by ``D``, and each rounding is charged its half-ulp
  ``u 2**floor(log2 m)`` rather than ``u m`` (:func:`~refkern.analysis._softmax_rows.shared_sq`,
  :func:`~refkern.analysis._softmax_rows.half_ulp`: the exps, the argument, D's additions from the row's
  maximum on, log D, ``M + log D`` and the last subtraction); a cumsum's running sum likewise
  (:func:`~refkern.analysis.noise_scan.scan_var`). attention's ``P @ V``: the partial sums, bounded per
  block of :data:`BLOCK` keys by ``BLOCK (|P_b| + A_b)**2`` (``P_b`` the partial sum at the block's start,
  ``A_b`` the block's ``sum |w v|``), and the division (two roundings: reciprocal and product).
  log_softmax: ``log D`` within :data:`~refkern.analysis._envelope_softmax.LOG_SCALE_ULPS` ulps, its
  relative error ``sigma_D``, the subtractions.

**Half results** (fp16, bf16) are computed in float32 and stored once; the kernels people run also
round one or two intermediates to the result format (measured within 1-3 of its ulps), and those are in
the family with ``u_o``: the normalised row before the weight (Hugging Face's RMSNorm), P before P @ V
(FlashAttention 2 and Hugging Face's eager attention), q, k and the scores (torch's math backend),
log_softmax's stages (torch's CPU kernel), each weight. What accumulates in the result format is not
here: it is a reduced precision, a hypothesis of its own.

What is not first order is left out knowingly: products of two deltas (below ``n u**2`` of the
output, far under every term above at the sizes where they could matter, ``n u < 2**-8``).
"""

import math
from dataclasses import dataclass, field

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.analysis import noise_norm_chains as norm_chains
from refkern.analysis import scan_kernels
from refkern.analysis._rows import _partial_sq
from refkern.analysis.noise_attention import attention_noise
from refkern.analysis.noise_chains import batches, chains_of, member_specs, rest_sq
from refkern.analysis.noise_moments import _moments, _var_rows
from refkern.analysis.noise_rows import RowShared, frozen, held_dtype, keys, norm_sums, welford_drift
from refkern.analysis.noise_scan import half_scan, scan_var
from refkern.analysis.noise_softmax import scale_rows
from refkern.analysis.noise_store import straddle, thread_members
from refkern.analysis.noise_var_chains import batches as var_batches
from refkern.analysis.noise_var_chains import member_specs as var_member_specs
from refkern.analysis.noise_var_chains import rest_s2 as var_rest_s2
from refkern.analysis.row_bound import LogSoftmaxRows
from refkern.analysis.row_bound_norm import NormRows
from refkern.analysis.scan_bound import ScanIncrements
from refkern.analysis.stats import level

__all__ = ["Noise", "noise", "RSQRT_ULPS"]

RSQRT_ULPS = 2  #: 1/sqrt within 2 ulps (CUDA's rsqrtf, documented maximum; sqrt then a division: 2 roundings)


@dataclass
class Noise:
    """The scale of one call: ``var`` (sigma**2 per output element, the standard formulas), further
    members of the rounding family with the same centre (``models``: ``[(key, text, thunk)]``, ``thunk()``
    their sigma**2, or (sigma**2, their own ``coherent``) where the errors they share differ, computed only
    when the standard formulas do not explain the output, or None where the member does not apply to this
    call), and the
    output axes along which a group holds at most one element of any row (``group_axes``): elements of
    one row share the row's errors (its mean, its variance, its sum), so a group of several of them
    would have a correlated sum; a group along any other axis would not be a sum of independent terms."""

    var: np.ndarray
    models: list = field(default_factory=list)
    group_axes: tuple = ()
    scale: object = 1.0  # powers of two (a float, or one per element): ``var`` is in units of values times it
    #: where the caller knows how the elements' errors correlate: ``coherent(y)``, the variance of ``sum e y``
    #: beyond ``sum sigma**2 y**2`` (errors shared by several elements), for the scale test; None: no scale test
    coherent: object = None
    #: reduced precisions with the same centre, only a wider scale (a sum accumulated in the half format):
    #: ``[(precision, key, text, thunk)]``; named only where the scale test ran (``coherent``) and passed
    precisions: list = field(default_factory=list)
    #: where a half result is the float32 computation stored once (the reductions): ``(pre, thunk)``,
    #: sigma**2 before the store and a thunk giving ``(xh, err)``, the exact result to float64 within
    #: ``err``, for the element test that knows the store is one rounding to nearest (inside._straddle)
    straddle: object = None
    #: where the family's longest chains are emulated (a float32 sum or mean, :mod:`~refkern.analysis.
    #: noise_chains`): ``(var_el, thunk)``, the element test's sigma**2 for every other order and a thunk
    #: yielding batches of the members' ``(xh, err, pre)``, (k,) + shape each (inside._members); ``var`` the
    #: whole family's scale, for the group tests
    members: object = None
    #: where each element of a row is a short chain of its own roundings around one value the row shares
    #: (log_softmax): the certain test of :mod:`refkern.analysis.row_bound` (``failures(actual, key)``,
    #: ``detectable_ulps(ref)``), the shared value left free
    free: object = None


def _eta(f: Format, e: int = 0) -> float:
    """Half the smallest subnormal of ``f`` (a rounding's absolute error in the subnormal range), times
    ``2**e`` (float64's, 2**-1075, is not a float64 number itself: it is scaled first)."""
    return math.ldexp(1.0, f.emin - f.prec + e)


def _stores(y, out: Format):
    """The reference's own rounding to the result format and the backend's store (module docstring)."""
    return 2.0 * (out.u * y) ** 2 + 2.0 * _eta(out) ** 2


# ------------------------------------------------------------------------------------------------ sums


def _chains(lay, kind, ref, stores, eta_w):
    """:attr:`Noise.members` of a float32 sum or mean (:mod:`refkern.analysis.noise_chains`), or None
    where nothing is emulated (fewer than 4 terms, or values that are not float32 numbers)."""
    X = np.asarray(lay.X)
    if chains_of(lay.n) < 2 or not np.array_equal(X, X.astype(np.float32)):
        return None
    u, d = FLOAT32.u, float(max(lay.n, 1) if kind == "mean" else 1)
    var_el = lay.back(u * u * rest_sq(X) / d**2) + stores + ((u * ref) ** 2 if kind == "mean" else 0.0)
    slack = (lay.n + 4) * eta_w**2  # what may underflow in the chains

    def thunk():  # only where an element fails the rest's scale
        # a correct member refused with probability at most ALPHA / PARTS over all members and rows: spent
        # besides the element tests' share (noise_chains.members)
        lam_v = level(len(member_specs(lay.n)) * X.shape[0])
        for xh, err, pre in batches(X, kind, lam_v):
            yield _laid_back(lay, (xh, err, pre + slack))

    return var_el, thunk


def _laid_back(lay, arrays):
    """Emulated members' (k, R) arrays in the output's layout, (k,) + shape each."""
    return tuple(np.stack([lay.back(row) for row in a]) for a in arrays)


def _sum_rows(X, u, kind, n):
    """sigma**2 of a sum or a mean of each row, before the stores."""
    s2 = u * u * _partial_sq(X)
    if kind == "mean":
        return s2 / max(n, 1) ** 2
    return s2


def _var_chains(lay, u, lam, eta2, eta_w, out):
    """``(sigma**2 of the rest, thunk)`` of a var or std with a float32 or half result whose rows are float32
    numbers (:mod:`refkern.analysis.noise_var_chains`): the element test's scale before the stores for every
    order of short chains, and a thunk yielding batches of the long-chain members' ``(xh, err, pre)``, (k,)
    + shape each; None where nothing is emulated (fewer than 4 terms, a divisor <= 0, other values)."""
    X = np.asarray(lay.X)
    D = float(lay.divisor)
    if chains_of(lay.n) < 2 or D <= 0 or not np.array_equal(X, X.astype(np.float32)):
        return None
    rm2, _, rs2 = var_rest_s2(X)
    v_el = lay.back(_var_rows(lay, u, lam, eta2, (rm2, rs2)))
    std = lay.kind == "std"
    half = out.prec < FLOAT32.prec
    # what may underflow: the squares' 2 n eta (on var; through std's square root at most its square root,
    # sqrt being 1/2-Hoelder) and the stores' eta_w each
    slack = (lay.n * eta2 / D if std else (lay.n * eta2 / D) ** 2) + (lay.n + 4) * eta_w**2

    def thunk():  # only where an element fails the rest's scale
        m2, _, s2f, _ = _moments(X, True, u)  # the whole family's scale: every correct member within it
        # a correct member refused with probability at most ALPHA / PARTS over all members and rows: spent
        # besides the element tests' share (noise_var_chains.members; two divisions each)
        lam_v = level(2 * len(var_member_specs(lay.n)) * X.shape[0])
        for xh, err, pre in var_batches(X, D, std, half, lam_v, m2, s2f + (lay.n * eta2) ** 2, lam):
            yield _laid_back(lay, (xh, err, pre + slack))

    return v_el, thunk


# ---------------------------------------------------------------------------------------------- norms


@jit(parallel=True, error_model="numpy")
def _norm_elements(X, W, B, Y, mean, r, smu2, srel2, u, u_m, u_o, eta2, folded, out):
    """Per element of the rows: sigma**2 of the standard form (or, with ``folded``, of the folded form)
    of the module docstring, with the stores ``2 (u_o y)**2 + eta2``. X and Y (float32 or float64) are
    widened as they are read; W and B (1 or R, 1 or n) are read at row ``i % rows``, column ``j`` or 0."""
    R, n = X.shape
    sw, sb = int(W.shape[1] > 1), int(B.shape[1] > 1)
    for i in prange(R):
        mu, ri, a2, b2 = mean[i], r[i], smu2[i], srel2[i]
        wr, br = W[i % W.shape[0]], B[i % B.shape[0]]
        for j in range(n):
            x, w, b, y = np.float64(X[i, j]), wr[j * sw], br[j * sb], np.float64(Y[i, j])
            rw = ri * w
            t = (x - mu) * rw
            v = rw * rw * a2 + t * t * b2 + (u_m * t) ** 2 + 2.0 * (u_o * y) ** 2 + eta2  # u_m: the row stored first
            if folded:
                xr, mr = x * rw, mu * rw
                v += u * u * (2.0 * xr * xr + mr * mr + (b - mr) ** 2 + y * y)
            else:
                v += u * u * (3.0 * t * t + y * y)
            out[i, j] = v


def _norm(lay, name, ref_rows, u, out, eta2):
    """(sigma**2 of the standard form, a thunk giving the folded form's, the sequential Welford mean's drift
    bound per row and its variance per element, the row-shared errors), rows of the output."""
    X = lay.X
    R, n = X.shape
    half = out.prec < FLOAT32.prec
    if lay.given is not None:
        mean = np.broadcast_to(np.asarray(lay.given[0], np.float64), (R,)).copy()
        var = np.broadcast_to(np.asarray(lay.given[1], np.float64), (R,)).copy()
        smu2, sv2 = np.zeros(R), np.zeros(R)
    else:
        m2, mean, s2, smu2 = _moments(X, lay.center, u)
        var = m2 / max(n, 1)
        sv2 = s2 / max(n, 1) ** 2 + (u * var) ** 2
        if name == "batch_norm" and half:  # the batch statistics stored in the result format
            smu2 = smu2 + (out.u * mean) ** 2
            sv2 = sv2 + (out.u * var) ** 2
    rest = norm_chains.rest_of(lay, name, out, u, mean, var, smu2, sv2)  # float32 statistics' members, their rest
    with np.errstate(all="ignore"):
        w = var + lay.eps
        r = 1.0 / np.sqrt(w)
        srel2_stat = (sv2 + (u * w) ** 2) / (4.0 * w * w)  # the variance's and w's roundings
        smu2, srel2_stat = (smu2, srel2_stat) if rest is None else rest.apply(smu2, srel2_stat, w)
        srel2 = srel2_stat + (2.0 * RSQRT_ULPS * u) ** 2  # and rsqrt's, bounded (2 RSQRT_ULPS u relative)
    from refkern.analysis.envelope import _param_rows

    Wr, Br = _param_rows(lay.W, R, n), _param_rows(lay.B, R, n)
    # the rows and the reference in one format, C-contiguous and read-only (noise_rows.held_dtype, frozen: exact
    # widening, read per element): one compiled _norm_elements per format, not per mix and layout (9 in a cold CI)
    h = held_dtype(X, ref_rows)
    Y, Xc = frozen(ref_rows, h), frozen(X, h)
    mem = None if rest is None else rest.members(Xc, mean, r, Wr, smu2, srel2_stat, m2, s2)

    def run(folded):
        v = np.empty((R, n))
        _norm_elements(Xc, Wr, Br, Y, mean, r, smu2, srel2, float(u), out.u if half else 0.0, out.u, eta2, folded, v)
        return v

    def drift_bound():  # sequential Welford's running mean: its drift emulated, not averaged (module docstring)
        return welford_drift(Xc, mean)

    def drift(B, columns=False):  # (r w B)**2; columns: r |w| B times its column's sum over the rows (docstring)
        with np.errstate(all="ignore"):
            c = (r * B)[:, None] * np.broadcast_to(np.abs(Wr), (R, n))
            c = c * (c.sum(axis=0) if columns else c)
            return np.where(np.isfinite(c), c, np.inf)

    def shared(drift=None, folded=False, seq=False):
        """The row-shared errors (:class:`RowShared`): the mean's (loading ``r w``) and r's relative error
        (loading ``t = (x - mean) r w``): its variance's part averaged, its rsqrt's part bounded (within
        RSQRT_ULPS ulps: ``2 RSQRT_ULPS u`` relative, one value per row, not a draw); ``drift``: a sequential
        Welford mean's drift bound per row, a bounded shared error on the mean's loading. ``folded``: the
        folded form's products ``r w`` and shifts ``b - mean r w``, one rounding per parameter, which a row
        shares where its parameters are one value (batch_norm's channel): taken as one error each per row,
        fully correlated (loadings ``x r w`` relative and ``|mean r w| + |b - mean r w|`` absolute; the
        elements' variances hold them once each)."""

        def t():
            with np.errstate(all="ignore"):
                return (np.asarray(Xc, np.float64) - mean[:, None]) * (r[:, None] * Wr)

        def rw():  # loadings are thunks: the quick path's fused sums never form these (R, n) arrays
            return r[:, None] * Wr

        Bt = np.full(R, 2.0 * RSQRT_ULPS * u)
        bounds = [(Bt, t)] + ([] if drift is None else [(drift, rw)])
        terms = [(smu2, rw), (srel2_stat, t)]
        if folded:

            def xrw():
                return np.asarray(Xc, np.float64) * (r[:, None] * Wr)

            def shift():
                with np.errstate(all="ignore"):
                    mrw = mean[:, None] * r[:, None] * Wr
                    return np.abs(mrw) + np.abs(Br - mrw)

            terms += [(np.full(R, u * u), xrw), (np.full(R, u * u), shift)]
        wd = None if rest is None else rest.widen  # rows that are the output's last axis: the sums in one pass
        fused = None if name == "batch_norm" or folded else norm_sums(Xc, mean, r, Wr, smu2, srel2_stat, (Bt, drift),
                                                                      wd)  # fmt: skip
        return RowShared(lay.rows, lay.back, R, terms, bounds=bounds, keys=lambda: keys(Xc, significand=not lay.center
                         and lay.given is None), fused=fused, widen=wd,
                         members=norm_chains.sequential(Xc, mean, r, Wr, smu2) if seq else mem)  # fmt: skip

    return run(False), lambda: run(True), drift_bound, drift, shared


# --------------------------------------------------------------------------------- softmax, attention


# ------------------------------------------------------------------------------------------------ API


def noise(name: str, args: dict, ref, out: Format, lam: float) -> Noise:
    """The scale of the call ``name(**args)`` whose correctly rounded result is ``ref`` in the format
    ``out`` (module docstring); ``lam`` is the element test's level (std's interval through the square
    root is taken at it)."""
    from refkern.analysis._envelope_ops import layout

    if name == "rms_norm" and args.get("eps") is None:
        from refkern._arrays import operand

        args = dict(args, eps=2.0**-52 if operand(args["input"], "input", name).fmt.prec == 53 else 2.0**-23)
    ref_held = np.asarray(ref) if np.asarray(ref).dtype in (np.float32, np.float64) else np.asarray(ref, np.float64)
    lay = layout(name, args, ref_held.shape)
    u = FLOAT64.u if out is FLOAT64 else FLOAT32.u
    u_m = out.u if out.prec < FLOAT32.prec else 0.0
    kind, nd = lay.kind, ref_held.ndim
    ref = ref_held if kind == "norm" else np.asarray(ref_held, np.float64)  # the norms' kernel widens as it reads
    every = tuple(range(nd))
    deg = 2 if kind == "var" else 1  # the homogeneous degree of the op's output in its input
    ek = _tiny_exponent(lay, out, deg)  # values times 2**ek, exact: squares of float64 values near 2**-1022 underflow
    k = 2.0**ek
    if ek:
        lay.X = lay.X * k
        lay.absmean = None if lay.absmean is None else lay.absmean * k
        ref = ref * 2.0 ** (deg * ek)
    eta_w = _eta(FLOAT64 if out is FLOAT64 else FLOAT32, deg * ek)
    stores = None  # the norms' kernel adds them itself
    if kind != "norm":
        stores = 2.0 * (out.u * ref) ** 2 + 2.0 * _eta(out, deg * ek) ** 2 + (lay.n + 4) * eta_w**2
    sc = 2.0 ** (deg * ek)
    if kind == "max":
        return Noise(stores, [], every, sc)
    if kind in ("sum", "mean") and name in ("sum", "mean"):
        v = lay.back(_sum_rows(lay.X, u, kind, lay.n))
        if kind == "mean":
            v = v + (u * ref) ** 2
        mb = None
        if out is FLOAT32 and not ek:
            mb = _chains(lay, kind, ref, stores, eta_w)
        elif out.prec < FLOAT32.prec and not ek:  # torch's CPU threads' partials, stored in the result format

            def threads():
                got = thread_members(lay.X, name, out, lam)
                if got is not None:
                    yield _laid_back(lay, got)

            mb = (None, threads)
        return Noise(v + stores, [], every, sc, straddle=straddle(name, lay, v, out), members=mb)
    if kind == "mean":  # average pools: short windows, the order-free scale
        m = lay.absmean * lay.n
        return Noise(lay.back((lay.n + 1) * (u * m) ** 2 / lay.n**2) + (u * ref) ** 2 + stores, [], every, sc)
    if kind in ("var", "std"):
        eta2 = 2.0 * _eta(FLOAT64 if out is FLOAT64 else FLOAT32, 2 * ek)  # squares: degree 2
        v = lay.back(_var_rows(lay, u, lam, eta2))
        mv = _var_chains(lay, u, lam, eta2, eta_w, out) if out is not FLOAT64 and not ek else None
        if mv is None:
            return Noise(v + stores, [], every, sc, straddle=straddle(name, lay, v, out))
        v_el, thunk = mv  # the element test: the rest's scale, or a member (a half result: the store's test on it)
        mb = (v_el + stores if out is FLOAT32 else None, thunk)
        return Noise(v + stores, [], every, sc, straddle=straddle(name, lay, v_el, out), members=mb)
    if kind == "cumsum":
        X = lay.X
        with np.errstate(all="ignore"):
            P = np.cumsum(X, axis=1)
            P2 = P * P
            var = scan_var(X, u)  # the partial sums formed up to each element, at their half-ulps (noise_scan)
        scan = _cumsum_axes(name, args, nd)
        precs, free = [], None
        if nd and X.size:
            n = X.shape[1]

            def rows(w, ax=scan[0]):
                return np.ascontiguousarray(np.moveaxis(w, ax, -1)).reshape(-1, n)

            free = ScanIncrements(X, rows, lay.back, out, u, k)  # the certain test of the increments (scan_bound)
        if out.prec < FLOAT32.prec and nd and X.size:  # a running sum held in the result format (noise_scan)
            P2[:, 0] = 0.0  # the first value is stored, not summed
            x0, ax = lay.back(X), scan[0]  # the input as given: torch's CUDA kernel is chosen by its shape
            precs = [half_scan(P2, rows, lay.back, out, stores, lambda a: scan_kernels.matches(a, x0, ax, out))]
        return Noise(lay.back(var) + stores, [], scan, sc, precisions=precs, free=free)
    if kind == "norm":
        eta2 = 2.0 * _eta(out) ** 2 + (lay.n + 4) * eta_w**2
        std, fold, drift_bound, drift, shared = _norm(lay, name, lay.rows(ref_held, ref_held.dtype), u, out, eta2)
        axes = _norm_axes(name, args, nd)
        folded = ("folded affine form", "the folded affine form x (r w) + (b - mean r w) of torch's CPU norms and "
                  "cuDNN's inference", lambda: (lay.back(fold()), shared(folded=True)))  # fmt: skip
        models = [folded] if lay.center or lay.given is not None else []
        if lay.center and lay.given is None:  # a member only on rows whose values repeat (_quantized): the rows
            # are sorted to know, so only when the member is asked for

            def welford():
                if not _quantized(lay.X):
                    return None
                if u == FLOAT32.u:  # float32 statistics: the four sequential means emulated as members, exactly
                    return lay.back(np.maximum(std, fold())), shared(folded=True, seq=True)
                B = drift_bound()  # the mean's drift, emulated: in the scale tests a bound of its own
                lam_d = min(lam, level(1)) if axes else lam  # a column's group test runs at a level >= level(1)
                return (lay.back(2.0 * np.maximum(std, fold()) + 2.0 * drift(B, bool(axes)) / lam_d**2),
                        shared(B, folded=True))  # fmt: skip

            models.append(("sequential Welford", "a sequential Welford mean whose running roundings drift together "
                           "(quantized offset rows: emulated, not averaged)", welford))  # fmt: skip
        free = None
        if lay.given is None and nd and lay.X.size:  # the certain test within rows, both statistics left free
            from refkern.analysis.envelope import _param_rows

            R, n = lay.X.shape
            free = NormRows(lay.X, _param_rows(lay.W, R, n), _param_rows(lay.B, R, n), lay.center, lay.eps,
                            ref_held, lambda v: lay.rows(v, None), lay.back, out, u, u_m)  # fmt: skip
        return Noise(lay.back(std), models, axes, coherent=shared(), free=free)
    axes = (_softmax_axis(args, nd),) if nd and kind in ("softmax", "log_softmax") else ()
    if kind == "log_softmax":
        y2, sh = scale_rows(lay.X, u, u_m, True, shared=True)
        free = LogSoftmaxRows(lay.X, ref, lay.rows, lay.back, out, u, u_m) if nd and lay.X.size else None
        return Noise(lay.back(y2) + stores, [], axes, free=free,
                     coherent=RowShared(lay.rows, lay.back, lay.X.shape[0], [(sh, 1.0)], keys=lambda: keys(lay.X)))
    if kind == "softmax":  # in units of each weight's power of two: tiny weights' variances do not underflow
        rel, sh, ch = scale_rows(lay.X, u, u_m, False, shared=True, chains=out is FLOAT32 and u == FLOAT32.u)
        rel = lay.back(rel)
        with np.errstate(all="ignore"):
            _, e = np.frexp(np.where(np.isfinite(ref) & (ref != 0), np.abs(ref), 1.0))
        sc = np.ldexp(1.0, np.minimum(1 - e, 1000))  # ref * sc in [1, 2); 1 for weights of 0 and 1
        sc = np.where(ref == 0, 2.0**1000, sc) if out is FLOAT64 else 1.0  # float32's squares do not underflow
        ys = ref * sc
        eta_w, eta_o = (_eta(f) * sc if np.ndim(sc) == 0 else np.ldexp(1.0, f.emin - f.prec + np.frexp(sc)[1] - 1)
                        for f in (FLOAT64 if out is FLOAT64 else FLOAT32, out))  # fmt: skip
        v = rel * ys * ys + 2.0 * (out.u * ys) ** 2 + 2.0 * eta_o**2 + (lay.n + 4) * eta_w**2
        ysr = lay.rows(np.broadcast_to(ys, ref.shape))
        coh = RowShared(lay.rows, lay.back, lay.X.shape[0], [(sh, ysr)], keys=lambda: keys(lay.X))
        return Noise(v, [], axes, sc, coherent=coh if ch is None else ch.attach(coh, ysr, sh))  # float32: members
    if kind == "attention":
        rows = lay.rows(ref)
        Ev = ref.shape[-1] if nd else 1

        def row_shared(var):  # a query's outputs share its sum D, its weights' errors (and q's rounding), with
            # correlations the scale does not carry: within a row the scale test takes them at their largest
            return RowShared(lambda w: np.asarray(w, np.float64).reshape(-1, Ev), lambda w: np.reshape(w, ref.shape),
                             var.size // max(Ev, 1), sigma=np.sqrt(var).reshape(-1, Ev))  # fmt: skip

        # the standard formulas: the scale applied to the scores (FlashAttention's kernels, torch's CPU flash); q
        # scaled by fl(sqrt(s)) and stored (torch's math backend) shares its rounding over a row's logits, a member
        # whose term costs a GEMM of L S Ev E products, run only where the standard formulas do not explain
        v = lay.back(attention_noise(lay, u, u_m, rows, q_term=False)) + stores

        def math_backend():
            vq = v + lay.back(attention_noise(lay, u, u_m, rows, q_term="only"))
            return vq, row_shared(vq)

        models = [("q scaled and stored", "q and k scaled by fl(sqrt(scale)) and stored in the result format (torch's "
                   "math backend): q's rounding shared by a row's logits", math_backend)]  # fmt: skip
        return Noise(v, models, (nd - 1,) if nd else (), coherent=row_shared(v))
    raise AssertionError(kind)  # pragma: no cover - every kind of layout() is handled


def _quantized(X) -> bool:
    """Do the rows' values repeat (some row holds at most half as many distinct values as elements)? Only
    then do a sequential Welford mean's running roundings drift together (the same increments recur: a bf16
    row of mean 300 and spread 1 holds three values), the premise of that member of the norms' family;
    on rows of distinct values they are mean-independent and the standard scale holds (float32 rows of mean
    300 and 4096 features: with the member, bugs of 8 to 32 spreads of correct kernels passed as rounding)."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] < 2:
        return False
    S = np.sort(X, axis=1)
    distinct = 1 + np.count_nonzero(S[:, 1:] != S[:, :-1], axis=1)
    return bool(np.any(distinct * 2 <= X.shape[1]))


TINY = 2.0**-300  #: below this largest |value|, a float64 call's scale is computed on values times 2**600
_TINY_E = 600


def _tiny_exponent(lay, out, deg) -> int:
    """``e``: the values of a float64 sum, mean, scan, pool or variance are multiplied by ``2**e`` before
    their scale is computed (0 elsewhere): below :data:`TINY` the squares of the terms underflow (the
    variance of an error near 2**-1074 is 2**-2148), and a homogeneous op's scale may be computed on
    values times 2**600 exactly, the test comparing values times the same; a variance, of degree 2, by
    2**500 (its results times 2**1000, the largest power of two that stays finite)."""
    if out is not FLOAT64 or lay.kind not in ("sum", "mean", "cumsum", "var", "std", "max") or lay.X is None:
        return 0
    with np.errstate(invalid="ignore"):
        m = float(np.max(np.abs(lay.X), initial=0.0, where=np.isfinite(lay.X)))
    return min(_TINY_E, 1000 // deg) if 0.0 < m < TINY else 0


def _cumsum_axes(name, args, nd):
    """A scan's elements share the prefix errors along the scan: a group holds one element per row only
    along the scan axis (one position, every row)."""
    from refkern.kernels.reduction import reduced_dims

    if nd == 0:
        return ()
    (axis,) = reduced_dims(args["dim"], nd, name) or (0,)
    return (axis,)


def _softmax_axis(args, nd):
    d = int(args["dim"])
    return d % nd


def _norm_axes(name, args, nd):
    """A norm's rows share their statistics: a group holds one element per row only along the one
    normalised axis of layer_norm and rms_norm (a normalized_shape of one dimension)."""
    if name in ("layer_norm", "rms_norm"):
        ns = args["normalized_shape"]
        k = 1 if isinstance(ns, (int, np.integer)) else len(tuple(ns))
        return (nd - 1,) if k == 1 and nd else ()
    return ()
