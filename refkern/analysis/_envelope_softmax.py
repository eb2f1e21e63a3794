"""The envelopes of softmax, log_softmax and scaled_dot_product_attention, and the named bugs of
attention; the derivation and every constant are in :mod:`refkern.analysis.envelope`'s docstring, the
terms of the tensors stored in a half result format (its A5) here.

**Half-precision results (A5).** For a float16/bfloat16 result the arithmetic is float32 (unit ``u``)
and only some tensors are stored in the result format (unit ``u_m``, and ``eta_h``, half its smallest
subnormal, where a stored value underflows). What torch's CPU kernels store (read from their sources
and checked bit for bit against float32 emulations on torch 2.13):

* softmax over the last dim: nothing (float32 throughout, the output rounded once); over another dim:
  each ``exp(x - max)`` (the sum is of the float32 exps);
* log_softmax over the last dim: the sum ``D`` and ``log D``; over another dim: nothing;
* scaled_dot_product_attention, math backend: nothing by default (it upcasts to float32); with
  ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``: q and k scaled by ``fl(sqrt(s))``,
  the scores ``q k^T`` (and the scores plus a float mask), the softmax output ``P``; the CPU flash
  kernel: each tile's ``exp(z - m_tile)`` (the sum is of the float32 exps; the running sums, their
  rescales and ``P @ V`` stay float32); FlashAttention on GPUs likewise rounds its P tiles.

The class covered: any subset of (S1) q and k scaled (``sqrt(s)`` on each, or ``s`` on q), (S2) the
scores before and after a float mask is added, (S3) each exp term or each weight, once, before it
enters the numerator and/or the denominator, (S4) log_softmax's sum and its log, and the output. Per
stored element, from ``fl_m(y) = y (1 + d) + e``, ``|d| <= u_m``, ``|e| <= eta_h``:

* (S1) each product ``q'_l k'_l`` gains a factor ``(1 + u_m)**2`` on top of the float32 logit's:
  ``gamma`` becomes ``G_h = (1 + gamma_{E+6}) (1 + u_m)**2 - 1``; a stored value that underflows adds
  ``eta_h`` times the other factor: ``(1 + G_h) eta_h max(s, sqrt(s)) (sum|q| + sum|k|) + E eta_h**2``;
* (S2) the scores, within ``d1`` (the above) of ``s q.k``: ``u_m (s sum|q k| + d1) + eta_h``; a float
  mask converted, added and stored: ``(2 u + u_m) (1 + 2 u + u_m) (|z| + s sum|q k| + Delta) + eta_h``;
* (S3) one factor ``(1 + u_m)`` on the term in ``lam_j`` and in ``lam'_j`` (both, whether the
  denominator sums the stored terms or the float32 ones); a stored value below the normal range
  (term against a tile maximum ``m_tile <= M``: ``>= t_j e**-lam_j``; weight ``t^_j / D^``, ``D^ <= 2 D
  e**lam_max``) adds ``eta_h 2 D^`` in units of t, grown by ``e**lam_max``: ``a`` gains ``eta_h 2 D
  e**(2 lam_max)`` per term with ``t_j e**-lam_j < 2**emin 2 D e**lam_max``;
* (S4) ``D^`` stored: ``ell`` gains ``L(u_m)``; ``log D^`` stored: ``eps_l = 2 LOG_ULPS u + u_m``.

The rescale factors, the running sums, ``P @ V`` and the division are float32 (``u``) in every kernel
listed, so nothing grows with n in ``u_m``: the envelope is about ``(lam_n + lam_d + 2) u_m`` relative
(two stores: the result's and the reference's, see :func:`_centre_rounding`) where the previous
"``u + u_m`` on every operation" reached ``L(S) = inf`` beyond 2**8 / (2 + R) bf16 terms. A sum
accumulated in the result format (a half-precision reduction) is not in the class: it is a
reduced-precision computation, not a rounding of a correct one.

**Reduced-precision P and stored outputs** (float32 results, :func:`reduced_hypotheses`). Rounding to a
format is monotone: a value computed anywhere in ``[lo, hi]`` rounds into ``[fl_p(lo), fl_p(hi)]`` (``lo``
taken to 0 where it is below float32's normal range: a flushed value). Around the centre ``fl_p(c)`` the
distance ``delta = max(fl_p(hi) - fl_p(c), fl_p(c) - fl_p(lo))`` is 0 unless the interval straddles a
rounding boundary of p, a fraction about ``(hi - lo) / ulp_p`` of the terms: the hypotheses are sharp.

* P normalised: the float32 weight is within ``e_w,j`` of ``w_j`` (softmax's envelope of that weight, with
  the logits' errors, plus the float64 weight's own distance ``w (e**(2 Delta64 + (S + 4) 2**-52) - 1)``);
  centre ``sum_j fl_p(w_j) v_j``, bound ``sum_j delta_j |v_j| + gamma_S sum_j max|P'_j| |v_j|`` (P' @ V in
  float32, S roundings) ``+ gamma_{S+4}(2**-53) sum_j |fl_p(w_j) v_j|`` (the centre in float64) + the store
  ``u (|c| + B) / (1 - u) + 2**-150``.
* P as flash terms against the row's computed maximum: ``t^_j`` within ``e**(+-lt_j)``, ``lt_j = theta_j +
  L(2 EXP_ULPS u)``, of ``t_j``; ``N' = sum_j fl_p(t^_j) v_j`` in float32 is within ``sum_j delta_j |v_j| +
  gamma_S sum max|P'_j| |v_j|`` of ``Nc = sum_j fl_p(t_j) v_j``; the float32 sum of the unrounded terms
  within ``E_D + a`` of D (the attention envelope's); ``|N'/D^ - Nc/D| <= (|N' - Nc| + |c| (E_D + a)) / (D -
  E_D - a)``; then the reciprocal and the product, ``2u (|c| + e) (1 + 4u)``, the centre's float64
  evaluation ``gamma_{S+4}(2**-53) (sum |fl_p(t) v| + |c|)``, the store.
* a stored softmax or log_softmax output: the rounding hypothesis's bound B holds ``|computed - ref| <= B``
  (its float32 store included, so a float32 result converted to p is covered too): the interval
  ``[fl_p(ref - B), fl_p(ref + B)]`` around ``fl_p(ref)``.

The hypotheses are named by the verdict as reduced precisions "fp16"/"bf16" (keys "fp16 P@V", "fp16 P@V
(flash)", "fp16 output", ...); a bug of the effect's size is not excused by them: their bound is the
float32 envelope plus one p-ulp only on the terms whose interval straddles a rounding boundary.
"""

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, Format, round_array

__all__ = [
    "EXP_ULPS",
    "EXP_SCALE_ULPS",
    "EXP_SCALE_BINADES",
    "exp_scale_ulps",
    "LOG_SCALE_ULPS",
    "LOG_ULPS",
    "ARG_ROUNDINGS",
    "LOGIT_ROUNDINGS",
    "UNDERFLOW_OPS",
    "bound",
    "named_bugs",
    "reduced_hypotheses",
]

EXP_ULPS = 20  #: exp within 20 ulps of the working format (torch's exp_u20 on AVX2/AVX-512), exp(0) = 1 exactly
LOG_ULPS = 4  #: log within 4 ulps (glibc, Sleef u10 and CUDA's logf are within 1)
#: The statistical scale's exp (:mod:`refkern.analysis.noise`): the largest error, on a softmax's arguments
#: ``x <= 0`` with a normal result, of the exps that correct float32 kernels call, per binade of ``|x|``
#: (upper end, ulps). torch's ``Vectorized<float>::exp_u20`` (AVX2 and AVX-512 share its algorithm; documented
#: "ULP=20"), measured over every float32 in [-88, 0] by a bit-exact emulation
#: (``benchmarks/calibrate_exp_u20.py --binades``): 1.88, 1.85, 1.84, 1.91, 2.06, 2.30, 2.84, 3.95 and 4.70
#: ulp in [0, 1/2), [1/2, 1), [1, 2), ..., [32, 64), [64, 128) (its reduction's n (ln 2 - ln2_f) grows with
#: |x|); CUDA's expf is documented within 2, SLEEF's u10 and glibc's within 1. Each rounded up to a quarter
#: (exact in binary), at least 2. A deterministic error bounded by B has a second moment of at most B**2, so
#: ``(2 B u)**2`` is charged as each term's relative variance. float64 kernels' exps (SLEEF u10, glibc, CUDA's
#: exp) are within 1 ulp. (The envelope keeps the documented EXP_ULPS: it bounds, it does not average. Below
#: the normal range exp_u20 flushes to 0, an absolute error of at most 1.42 float32 minima, the underflow
#: terms' share.)
EXP_SCALE_BINADES = ((0.5, 2.0), (1.0, 2.0), (2.0, 2.0), (4.0, 2.0), (8.0, 2.25), (16.0, 2.5), (32.0, 3.0),
                     (64.0, 4.0), (np.inf, 4.75))  # fmt: skip
EXP_SCALE_ULPS = EXP_SCALE_BINADES[-1][1]  #: the largest of them (float32), 4.75
EXP_SCALE_ULPS_F64 = 1.0  #: float64's


def exp_scale_ulps(arg, u):
    """The bound B of :data:`EXP_SCALE_BINADES` at each exp argument ``arg`` (an array; the largest where it is
    not finite) for the working unit ``u`` (float64's: :data:`EXP_SCALE_ULPS_F64`)."""
    a = np.abs(np.asarray(arg, np.float64))
    if u <= FLOAT64.u:
        return np.full(a.shape, EXP_SCALE_ULPS_F64)
    out = np.full(a.shape, EXP_SCALE_ULPS)
    with np.errstate(invalid="ignore"):
        for top, b in reversed(EXP_SCALE_BINADES[:-1]):
            out = np.where(a < top, b, out)
    return out


#: The statistical scale's log (log_softmax's log D): SLEEF u10, glibc and CUDA's logf are within 1 ulp
#: (their documented maxima, :mod:`refkern.ops._accuracy`); torch's CPU log_softmax takes std::log of the sum.
LOG_SCALE_ULPS = 1.0
ARG_ROUNDINGS = 3  #: the exp argument (z - m) c: the subtraction, c's own rounding, the product
LOGIT_ROUNDINGS = 6  #: a logit's roundings beyond its E - 1 additions: fl(sqrt(s)) twice (2 each), q sqrt(s),
#: k sqrt(s) (torch's math backend; the fused kernels round fewer), the product
UNDERFLOW_OPS = 6  #: operations per term that may underflow: exp, its store, division, product, addition, rescale
_DIV_ROUNDINGS = 2  # a reciprocal and a product (or one correctly rounded division)
_SOFTMAX_RESCALES = 1  # a softmax output's exp, rescaled once from a partial maximum to the final one


def _lg(s):
    """-log(1 - s): the log of the largest growth ``prod (1 + d_i)^{+-1}`` with ``sum |d_i| <= s`` (inf from 1)."""
    s = np.asarray(s, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s < 1.0, -np.log1p(-np.minimum(s, 1.0)), np.inf)


def _eta(u) -> float:
    """The absolute error an underflowing operation of the working format (unit ``u``) may add: its smallest
    normal (a flush to zero included)."""
    return 2.0 ** (FLOAT64 if u <= FLOAT64.u else FLOAT32).emin


def _eta_h(u_m, out: Format) -> float:
    """Half the smallest subnormal of the result format: what a store of an intermediate in it may add
    where it underflows (0 when nothing is stored there: float32 and float64 results)."""
    return 2.0 ** (out.emin - out.prec) if u_m > 0 else 0.0


class _Rows:
    """The denominator side of rows of logits ``z`` (R, n) (-inf: masked) with logit errors ``dl``, in float32
    (or float64) arithmetic of unit ``u`` with each exp term stored once with ``u_m`` (module docstring), one
    jitted pass per row (:func:`~refkern.analysis._softmax_rows.rows_pass`, which states the terms)."""

    def __init__(self, z, dl, d64, u, u_m, out, num_ops, num_rescales=None, keep=True):
        """``keep``: also hold ``t``, ``gap``, ``theta`` and ``live`` (the softmax envelopes and the flash
        hypotheses read them; attention's envelope needs only ``e_n`` and the rows' sums)."""
        from refkern.analysis._softmax_rows import ROW_FIELDS, rank_tables, rows_pass

        R, n = z.shape
        self.n = n
        z, dl, d64 = (np.ascontiguousarray(np.broadcast_to(v, (R, n)), np.float64) for v in (z, dl, d64))
        shape = (R, n) if keep else (1, 1)
        self.t, self.gap, self.theta = (np.empty(shape) for _ in range(3))
        self.live = np.empty(shape, np.bool_)
        self.e_n = np.empty((R, n))
        with np.errstate(all="ignore"):  # each live term's exp(z - M) (M the row's largest: rows_pass reads it)
            np.exp(z - np.max(z, axis=1, initial=-np.inf)[:, None], out=self.e_n)
        st = np.empty((R, ROW_FIELDS))
        eta_h = _eta_h(u_m, out)
        tables = rank_tables(n, u, u_m, 2 * EXP_ULPS * u, num_ops, num_rescales)  # eps_e: exp within EXP_ULPS ulps
        rows_pass(z, dl, d64, float(u), float(ARG_ROUNDINGS), -1 if num_rescales is None else int(num_rescales),
                  *tables, UNDERFLOW_OPS * n * _eta(u), eta_h, 2.0**out.emin, bool(keep), self.t, self.gap,
                  self.theta, self.e_n, self.live, st)  # fmt: skip
        if not keep:
            del self.t, self.gap, self.theta, self.live
        self.M, self.D, self.ED, self.a, self.d64max = (np.ascontiguousarray(st[:, k]) for k in range(5))
        self.bad, self.empty = st[:, 5] != 0, st[:, 6] != 0

    def ratio_bound(self, num, o_abs, vmax, slack, wv):
        """|computed - exact| of sum_j t_j v_j (1 + b_j) / sum_j t_j (1 + a_j) (module docstring), per row and
        column: ``num`` = sum_j e_n,j |v_j|, ``o_abs`` >= |exact|, ``vmax`` = max_j |v_j|, ``wv`` >= sum_j w_j |v_j|
        (row, column arrays)."""
        col = (slice(None),) + (None,) * (np.ndim(num) - 1)
        with np.errstate(all="ignore"):
            den = (self.D - self.ED - self.a)[col]
            a = self.a[col]
            b = (num + o_abs * self.ED[col] + a * np.maximum(vmax, 1.0) + o_abs * a) / den
            b = np.where(den > 0, b * slack, np.inf)
            b = b + 2.0 * np.expm1(2 * self.d64max)[col] * wv  # the float64 logits' distance to the exact ones
            b = np.where(self.empty[col], 0.0, np.where(self.bad[col], np.inf, b))
        return np.where(np.isnan(b), np.inf, b)


def _exact_abs(ref, out: Format):
    """An upper bound on |exact| from its rounding ``ref`` to ``out``."""
    with np.errstate(all="ignore"):
        return (np.abs(ref) + 2.0 ** (out.emin - out.prec)) / (1.0 - out.u)


def _centre_rounding(ref, out: Format):
    """|exact - ref|: the centre is itself rounded to the result format, and a computed value within the envelope
    of the exact one may round to the neighbour of ``ref`` (module docstring); 0 where ``ref`` is not finite."""
    with np.errstate(all="ignore"):
        c = out.u * _exact_abs(ref, out) + 2.0 ** (out.emin - out.prec)
    return np.where(np.isfinite(ref), c, 0.0)


def _slack(n, E):
    """The envelope's own float64 evaluation (module docstring)."""
    return 1.0 + (n + E + 64) * 2.0**-50


def _softmax(lay, u, u_m, ref, out, log):
    X = lay.X
    R, n = X.shape
    rows = _Rows(X, np.zeros_like(X), np.zeros_like(X), u, u_m, out, _DIV_ROUNDINGS, _SOFTMAX_RESCALES)
    o_abs = _exact_abs(lay.rows(ref), out)
    if not log:
        b = rows.ratio_bound(rows.e_n, o_abs, np.ones((R, n)), _slack(n, 0), o_abs)
        return np.where(rows.live | rows.bad[:, None], b, 0.0)  # a -inf entry is exactly 0
    eps_l = 2 * LOG_ULPS * u + u_m  # the log within LOG_ULPS ulps, stored with u_m
    eta = max(_eta(u), _eta_h(u_m, out))
    with np.errstate(all="ignore"):
        ell = _lg((rows.ED + rows.a) / rows.D) + _lg(u_m)  # the sum, and its store
        logd = np.log(rows.D)
        err_l = ell + eps_l * (logd + ell) + eta + u * np.abs(rows.M)  # the log; a rounded reference m c
        c = u * np.maximum(rows.gap, (np.abs(rows.M) + logd + err_l)[:, None])
        b = (err_l[:, None] + c + u * (o_abs + err_l[:, None] + c)) * _slack(n, 0) + 3 * rows.d64max[:, None]
        b = np.where(rows.live, b, np.where(rows.bad[:, None], np.inf, 0.0))
    return np.where(np.isnan(b), np.inf, b)


def _logits(a, l1=False):
    """Per output batch: (z (L, S) float64 logits with the mask, s sum_l |q_l k_l| (L, S), mask ((L, S), or a
    0-d zero where there is none), and with ``l1`` the pair (sum_l |q_l| (L,), sum_l |k_l| (S,)) whose outer
    sum is each logit's, else None)."""
    L, E = a.Q.shape[1], a.Q.shape[2]
    S = a.K.shape[1]
    s = abs(a.scale)
    for b in range(a.iq.size):
        q, k = a.Q[a.iq[b]], a.K[a.ik[b]]
        with np.errstate(all="ignore"):
            z = a.scale * (q @ k.T) if E else np.zeros((L, S))
            mag = s * (np.abs(q) @ np.abs(k).T) if E else np.zeros((L, S))
            n1 = (np.abs(q).sum(axis=1), np.abs(k).sum(axis=1)) if l1 else None
        if a.causal:
            m = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, 0.0)
        elif a.has_mask:
            m = np.broadcast_to(a.mask[a.im[b]], (L, S))
        else:
            m = np.zeros(())
            z += 0.0  # as z + m: a -0.0 logit becomes +0.0
            yield b, z, mag, m, n1
            continue
        yield b, z + m, mag, m, n1


def _logit_errors(a, u, u_m, out):
    """Per output batch: (b, z, Delta, Delta64): the logits, their errors in the working precision with the
    half-format stores (S1, S2), and the float64 logits' own (module docstrings; one jitted pass per batch,
    :func:`~refkern.analysis._softmax_rows.logit_errors_pass`, which states the terms)."""
    from refkern.analysis._softmax_rows import logit_errors_pass

    E = a.Q.shape[2]
    kk = (E + LOGIT_ROUNDINGS) * u
    G = kk / (1.0 - kk) if kk < 1.0 else np.inf
    G_h = (1 + G) * (1 + u_m) ** 2 - 1  # q and k (scaled) stored with u_m: a factor (1 + u_m)**2 on each product
    eta, eta_h = _eta(u), _eta_h(u_m, out)
    s = abs(a.scale)
    for b, z, mag, m, n1 in _logits(a, l1=bool(u_m)):
        L, S = z.shape
        dl, d64 = np.empty((L, S)), np.empty((L, S))
        ql, kl = n1 if n1 is not None else (np.zeros(L), np.zeros(S))
        has_m = np.ndim(m) > 0 and not a.causal  # a float mask (a causal one adds no rounding: 0 or -inf)
        mm = np.ascontiguousarray(np.broadcast_to(m, (L, S)) if has_m else np.zeros((1, 1)), np.float64)
        logit_errors_pass(np.ascontiguousarray(z, np.float64), np.ascontiguousarray(mag, np.float64),
                          np.ascontiguousarray(ql, np.float64), np.ascontiguousarray(kl, np.float64), mm, has_m,
                          G_h, (E + LOGIT_ROUNDINGS) * eta, u_m, (1 + G_h) * eta_h * max(s, np.sqrt(s)),
                          E * eta_h**2, eta_h, (2 * u + u_m) * (1 + 2 * u + u_m), float(E + 2), dl, d64)  # fmt: skip
        yield b, z, dl, d64


def _attention(lay, u, u_m, ref, out):
    a = lay.extra["a"]
    L, E = a.Q.shape[1], a.Q.shape[2]
    S, Ev = a.V.shape[1], a.V.shape[2]
    rref = lay.rows(ref)
    res = np.zeros(rref.shape)
    if S == 0 or L == 0 or Ev == 0:
        return res
    for b, z, dl, d64 in _logit_errors(a, u, u_m, out):
        rows = _Rows(z, dl, d64, u, u_m, out, _DIV_ROUNDINGS + 1 + S - 1, keep=False)
        v = a.V[a.iv[b]]
        with np.errstate(all="ignore"):
            num = rows.e_n @ np.abs(v)
        vmax = np.broadcast_to(np.abs(v).max(axis=0, initial=0.0), (L, Ev))
        res[b] = rows.ratio_bound(num, _exact_abs(rref[b], out), vmax, _slack(S, E), vmax)
    return res


def bound(lay, u, u_m, ref, out):
    """The envelope of one hypothesis (``u``: the working unit plus ``u_m``, the unit of the result format
    where intermediates are stored in it, as :func:`refkern.analysis.envelope.envelopes` passes them), ref's
    shape. Only the stored tensors of the module docstring are charged ``u_m``; every operation ``u - u_m``."""
    u_w = u - u_m  # exact: float32's unit plus a half format's unit is a float64 number
    if lay.kind == "attention":
        b = _attention(lay, u_w, u_m, ref, out)
    else:
        b = _softmax(lay, u_w, u_m, ref, out, lay.kind == "log_softmax")
    return lay.back(b + _centre_rounding(lay.rows(ref), out))


# ------------------------------------------------------------------ reduced-precision P and outputs

_P_FORMATS = (("fp16", FLOAT16), ("bf16", BFLOAT16))


def _fl(x, fmt: Format):
    return round_array(x, *fmt.params)


def _outward(lo, hi):
    """[lo, hi] widened by the float64 rounding of their own evaluation (one ulp each way)."""
    return lo - 2.0**-52 * np.abs(lo), hi + 2.0**-52 * np.abs(hi)


def _rounded_between(c, lo, hi, fmt: Format, ftz_below=None):
    """(fl(c), the largest distance from fl(c) to fl(y) for y in [lo, hi]): rounding is monotone, so fl(y)
    lies in [fl(lo), fl(hi)]; ``lo`` is taken to 0 where it is below ``ftz_below`` (a flushed float32 value)."""
    lo, hi = _outward(lo, hi)
    if ftz_below is not None:
        lo = np.where(lo < ftz_below, np.minimum(lo, 0.0), lo)
    fc, flo, fhi = _fl(c, fmt), _fl(lo, fmt), _fl(hi, fmt)
    with np.errstate(invalid="ignore"):
        d = np.maximum(fhi - fc, fc - flo)
    return fc, np.where(np.isnan(d), np.inf, d), np.maximum(np.abs(flo), np.abs(fhi))


def _store32(c, rest, out: Format):
    """The float32 result's own rounding, around a centre ``c`` with the rest of the bound ``rest``."""
    with np.errstate(all="ignore"):
        return out.u * (np.abs(c) + rest) / (1 - out.u) + 2.0 ** (out.emin - out.prec)


def _gamma(k, u):
    return k * u / (1 - k * u) if k * u < 0.5 else np.inf


def _pv(lay, out, fmt: Format, flash: bool):
    """(centre, bound) of attention with the weights rounded to ``fmt`` before ``P @ V`` (module docstring):
    normalised weights ``fl_p(w_j)`` (``flash=False``) or the exp terms against the row's maximum
    ``fl_p(t_j)`` divided by the float32 sum of the unrounded ones (``flash=True``)."""
    a = lay.extra["a"]
    L, S, Ev = a.Q.shape[1], a.V.shape[1], a.V.shape[2]
    u = FLOAT32.u
    shape = (a.iq.size, L, Ev)
    centre, bnd = np.zeros(shape), np.zeros(shape)
    g_s, g64 = _gamma(S, u), _gamma(S + 4, FLOAT64.u)
    for b, z, dl, d64 in _logit_errors(a, u, 0.0, out):
        v = a.V[a.iv[b]]
        av = np.abs(v)
        with np.errstate(all="ignore"):
            if flash:
                rows = _Rows(z, dl, d64, u, 0.0, out, _DIV_ROUNDINGS + 1 + S - 1)
                t = rows.t
                lt = rows.theta + _lg(2 * EXP_ULPS * u)  # the exp term against the row's computed maximum
                lo = np.where(rows.live, t * np.exp(-lt), 0.0)
                hi = np.where(rows.live, t * np.exp(lt), 0.0)
                p, dp, pmax = _rounded_between(t, lo, hi, fmt, 2.0**FLOAT32.emin)
                num = p @ v
                c = num / rows.D[:, None]
                err_n = dp @ av + g_s * (pmax @ av) + g64 * (np.abs(p) @ av)  # P' @ V in float32; float64's own
                den = (rows.D - rows.ED - rows.a)[:, None]
                e = (err_n + np.abs(c) * (rows.ED + rows.a)[:, None]) / den
                e = np.where(den > 0, e, np.inf) + 2 * u * (np.abs(c) + e) * (1 + 4 * u)  # reciprocal and product
                e = e + g64 * np.abs(c)
            else:
                rows = _Rows(z, dl, d64, u, 0.0, out, _DIV_ROUNDINGS, _SOFTMAX_RESCALES)
                w = np.where(rows.live, rows.t / rows.D[:, None], 0.0)
                slack = np.expm1(2 * rows.d64max[:, None] + (S + 4) * 2.0**-52)  # float64 w to the exact weight
                w_abs = w * (1 + slack)
                e_w = rows.ratio_bound(rows.e_n, w_abs, np.ones_like(w), _slack(S, 0), w_abs) + w * slack
                lo, hi = np.where(rows.live, w - e_w, 0.0), np.where(rows.live, w + e_w, 0.0)
                p, dp, pmax = _rounded_between(w, lo, hi, fmt, 2.0**FLOAT32.emin)
                c = p @ v
                e = dp @ av + g_s * (pmax @ av) + g64 * (np.abs(p) @ av)
            e = np.where(rows.bad[:, None], np.inf, np.where(rows.empty[:, None], 0.0, e))
            e = np.where(np.isnan(e), np.inf, e)
        c = np.where(rows.empty[:, None], 0.0, c)
        centre[b], bnd[b] = c, e + _store32(c, e, out)
    return lay.back(centre), lay.back(bnd)


def _stored_output(ref, rounding, fmt: Format):
    """(centre, bound) of a softmax or log_softmax computed in float32 (within ``rounding`` of ``ref``, the
    rounding hypothesis's bound) and stored in ``fmt``: fl_p is monotone, so the result lies in
    [fl_p(ref - B), fl_p(ref + B)]; the centre is fl_p(ref)."""
    with np.errstate(all="ignore"):
        c, d, _ = _rounded_between(ref, ref - rounding, ref + rounding, fmt)
    fin = np.isfinite(ref)
    return np.where(fin, c, ref), np.where(fin, d, 0.0)


def reduced_hypotheses(name, lay, ref, out: Format, rounding):
    """Reduced-precision hypotheses beyond the inputs' (module docstring): for float32 results of attention,
    the weights rounded to fp16 or bf16 before ``P @ V``, normalised or as flash tiles against the row
    maximum; of softmax and log_softmax, the output stored in fp16 or bf16. ``(key, precision, None, thunk)``,
    each ``thunk() -> (centre, bound)`` run only when the rounding hypothesis does not explain the output."""
    if out is not FLOAT32:
        return []
    if lay.kind == "attention":
        a = lay.extra["a"]
        if not (a.Q.shape[1] and a.V.shape[1] and a.V.shape[2]):
            return []
        return [(f"{p} P@V" + (" (flash)" if flash else ""), p, None, lambda f=fmt, fl=flash: _pv(lay, out, f, fl))
                for p, fmt in _P_FORMATS for flash in (False, True)]  # fmt: skip
    return [(f"{p} output", p, None, lambda f=fmt: _stored_output(ref, rounding, f)) for p, fmt in _P_FORMATS]


# ------------------------------------------------------------------ named bugs (used only to name a mismatch)


def _log_max(fmt: Format) -> float:
    """log of the format's largest finite value: exp overflows beyond it."""
    return float(np.log(2.0 - 2.0 ** (1 - fmt.prec)) + (fmt.emax) * np.log(2.0))


def _log_min(fmt: Format) -> float:
    """log of the format's smallest subnormal: a sum of exps all below it is 0."""
    return float((fmt.emin - fmt.prec + 1) * np.log(2.0))


def _no_max_subtraction(row_max, out: Format):
    """Rows whose exp, taken without subtracting the maximum, overflows (or all underflow) in the working
    format or the result's: the rows where that bug shows."""
    fmts = {FLOAT64 if out is FLOAT64 else FLOAT32, out}
    with np.errstate(invalid="ignore"):
        return np.any([(row_max > _log_max(f) - 0.01) | (row_max < _log_min(f)) for f in fmts], axis=0)


def _overflow_namer(flagged):
    """Explains the mismatch when every element beyond the rounding envelope lies in a row where exp
    without the max subtraction overflows (``flagged()``: those elements, computed only when asked), the
    reference is finite there, and some of them are inf or NaN: the overflow's signature (the other
    elements of such a row come out as exp(x) / inf = 0, or as a wrong finite value when the sum alone
    overflowed in a wider format)."""

    def fn(actual, unexplained, ref):
        bad = unexplained & np.isfinite(ref)
        if not bad.any() or np.isfinite(actual[bad]).all() or (unexplained & ~bad).any():
            return False
        return bool(flagged()[bad].all())

    return fn


def _centre_namer(name, alt, envelope):
    """Explains the mismatch when refkern's op on the modified arguments ``alt``, within ``envelope(lay,
    centre)`` (its own rounding envelope and the store, :func:`refkern.analysis.envelope.envelopes`
    passes it: this module does not import that one, which imports it), explains every element."""

    def fn(actual, unexplained, ref):
        from refkern.analysis._envelope_ops import layout
        from refkern.ops import get

        res = get(name).reference(**alt)
        c = _as_f64(res).reshape(ref.shape)
        b = envelope(layout(name, alt, ref.shape), c)
        with np.errstate(all="ignore"):
            same = (actual == c) | (np.isnan(actual) & np.isnan(c))
            return bool(np.all(same | (np.abs(actual - c) <= b)))

    return fn


def _as_f64(x):
    from refkern._arrays import operand

    return np.asarray(operand(x, "reference", "compare").values, np.float64)


def _swap(x, i, j):
    from refkern._arrays import is_tensor

    return x.transpose(i, j) if is_tensor(x) else np.swapaxes(np.asarray(x), i, j)


def _is_bool(m):
    from refkern._arrays import is_tensor

    return m is not None and (str(m.dtype) == "torch.bool" if is_tensor(m) else np.asarray(m).dtype == np.bool_)


_NO_MAX = (
    "inf/NaN where the reference is finite, in rows whose exp overflows without the row maximum "
    "subtracted: the maximum was not subtracted before exp"
)


_LOG_OF_SOFTMAX = (
    "-inf where the reference is finite and below the log of the smallest normal: log(softmax(x)), taken "
    "after the softmax underflowed, instead of x - max - log(sum)"
)


def _log_of_softmax_namer(out):
    """Explains the mismatch when every element beyond the envelope is -inf where the reference is finite
    and so small that its softmax underflows (flushed below the normal range) in the working or result format."""

    def fn(actual, unexplained, ref):
        floor = max(FLOAT32.emin if out is not FLOAT64 else FLOAT64.emin, out.emin) * np.log(2.0)
        return bool(unexplained.any() and np.all(actual[unexplained] == -np.inf) and np.all(ref[unexplained] < floor))

    return fn


def named_bugs(name, args, lay, out, envelope):
    """``[(key, text, fn)]``: patterns a mismatch may be named by, each ``fn(actual, unexplained, ref) -> bool``
    evaluated only when the verdict is already "mismatch" (a hypothesis that names, never one that excuses);
    ``envelope(lay, centre)``: the rounding envelope and store of a call of layout ``lay`` centred on ``centre``."""
    if name in ("softmax", "log_softmax"):

        def flagged():
            rmax = np.max(np.where(np.isfinite(lay.X), lay.X, -np.inf), axis=1, initial=-np.inf)
            return lay.back(np.broadcast_to(_no_max_subtraction(rmax, out)[:, None], lay.X.shape))

        found = [("no max", _NO_MAX, _overflow_namer(flagged))]
        if name == "log_softmax":
            found.append(("log of softmax", _LOG_OF_SOFTMAX, _log_of_softmax_namer(out)))
        shape = np.shape(args["input"])
        if shape:
            dim = int(args["dim"]) % len(shape)
            for d in range(len(shape)):
                if d != dim and shape[d] == shape[dim]:
                    text = f"fits {name} over dim={d} instead of dim={dim}"
                    found.append((f"dim {d}", text, _centre_namer(name, {**args, "dim": d}, envelope)))
        return found
    a = lay.extra["a"]
    E, S, L = a.Q.shape[2], a.K.shape[1], a.Q.shape[1]

    def flagged():
        rmax = [np.max(np.where(np.isnan(z), np.inf, z), axis=1, initial=-np.inf) for _, z, _, _, _ in _logits(a)]
        rows = _no_max_subtraction(np.stack(rmax), out)
        return lay.back(np.broadcast_to(rows[:, :, None], (a.iq.size, L, a.V.shape[2])))

    found = [("no max", _NO_MAX, _overflow_namer(flagged))]
    alts = []
    if E:
        from refkern.kernels.attention import default_scale

        for label, s in (("1/E", 1.0 / E), ("none: 1", 1.0), ("1/sqrt(E), the default", default_scale(E))):
            if s != a.scale:
                text = f"fits scale={s:.6g} ({label}) instead of {a.scale:.6g}: the logits are scaled wrongly"
                alts.append((f"scale {label}", text, {"scale": s}))
    offset = np.arange(S)[None, :] - np.arange(L)[:, None]
    if a.causal:
        shifts = [(1, "shifted by +1: each query also sees the next key"),
                  (-1, "shifted by -1: each query misses its own key")]  # fmt: skip
        if S != L:
            shifts.append((S - L, f"aligned bottom-right (diagonal offset S - L = {S - L}); torch aligns it top-left"))
        for k, what in shifts:
            alt = {"is_causal": False, "attn_mask": offset <= k}
            alts.append((f"causal {k:+d}", f"fits a causal mask {what}", alt))
    if a.causal or a.has_mask:
        text = "fits attention without the mask: attn_mask / is_causal was ignored"
        alts.append(("no mask", text, {"is_causal": False, "attn_mask": None}))
    if _is_bool(args.get("attn_mask")):
        text = "fits the boolean mask inverted (True taken as masked out)"
        alts.append(("inverted mask", text, {"attn_mask": ~args["attn_mask"]}))
    if S == E and S:
        text = "fits q @ k instead of q @ k^T: the key was used untransposed (possible here because S == E)"
        alts.append(("key untransposed", text, {"key": _swap(args["key"], -2, -1)}))
    return found + [(key, text, _centre_namer(name, {**args, **alt}, envelope)) for key, text, alt in alts]
