"""A row's shared errors left free, its elements' own roundings bounded: a test that is certain.

Some ops compute each element of a row through a short chain of roundings of its own and a value that
the whole row shares. log_softmax is ``y_j = x_j - K`` with ``K = M + log D`` (``M`` the row's maximum, ``D =
sum exp(x_k - M)``): whatever a correct kernel does to ``K`` (its sum's order, tiles, an online rescale, a
log within some ulps, a stage stored in a half format), it does once per row, and then each element is at
most ``fl_o(fl_w(fl_m(fl_w(x_j - M)) - L^))`` or ``fl_o(fl_w(x_j - K^))``: the subtraction of the maximum
rounded in the working format (unit roundoff ``u_w``), possibly stored in a half stage format (``u_m``),
the subtraction of the shared value rounded, and the store to the result format (``u_o``). So the
residual of every correct result against the correctly rounded reference ``ref`` is

    r_j = a_j - ref_j = c + e_j,    |e_j| <= b_j,

one free constant ``c`` per row (``-(K^ - K)``: never modelled, never bounded here) and element errors
bounded by the sum of the chain's half-ulps (a rounding to nearest of a value of magnitude at most ``m``
errs by at most ``h(m) = u 2**floor(log2 m)``, half the ulp of ``m``'s binade, plus half the smallest
subnormal ``eta`` where it underflows; ``h`` grows with ``m``, so an upper bound of the magnitude gives an
upper bound of the error):

    b_j = h_w(|z_j|) + h_m(|z_j| + h_w) + h_w(V_j) + h_o(V_j + h_w(V_j)) + h_o(|ref_j|) + etas,

``z_j = x_j - M`` (exact in float64 for inputs of 24 bits or fewer), ``V_j`` a bound of the magnitude of
the value the last working rounding rounds, ``|ref_j| + h_o(|ref_j|)`` (the exact value) plus the first
roundings and a first-order bound ``dL`` on ``|L^ - L|`` and ``h_w(|K|)`` (the shared value's own
rounding, only to widen the binade), and the reference's own rounding ``h_o(|ref_j|)``. For a float32
result ``u_o = u_w`` and the store is that last rounding (its term counted once).

**The test.** ``T = min_c max_j |r_j - c| / b_j`` over the row's finite elements: every correct kernel
gives ``T <= 1``, so a row with ``T > 1`` is a mismatch for sure. It is deterministic: no level, no share
of the false-alarm budget, no constant beyond the chain's roundings. It is blind to what ``c`` can absorb
(a whole row offset: the statistical test of :mod:`refkern.analysis.inside` judges ``c`` against the
scale of ``K``'s errors), and it sees what ``c`` cannot: a row scaled by ``1 + e`` moves its elements by
``e y_j``, which no constant follows once ``e (max y - min y) > 2 (b_j + b_k)``; a log_softmax row of 64
randn logits in float32 spans about 6 in ``y``, so a scale of 4 u (8 spreads of correct kernels, where
the statistical row test's level is 6.4 on the scale of ``D``'s 63 roundings) moves the row's ends 3 ulps
apart against ``b`` of 1.5 ulps each. One element off by ``d`` is flagged once ``d > 2 (b_j + min_k b_k)``
(the others within ``b_k`` of the true ``c``, ``e_j`` at ``-b_j`` at worst): the power the report gives
(:meth:`LogSoftmaxRows.detectable_ulps`).

**Reduced precisions** (the hypotheses of :mod:`refkern.analysis.envelope`) are judged against the same
``ref`` with their own element roundings added (:func:`candidate`): the output stored in ``p``
(``h_p(V_j + h_w)`` more), the inputs rounded to ``p`` and computed in float32 (``h_p(|x_j|)`` more per
element, the maximum's rounding shared; float32 working roundings).

What this test assumes of a kernel is the element chain above: a kernel that recomputes an element through
another shared value per tile (a log_softmax written tile by tile against tile maxima) or that takes the log
of a computed softmax (:mod:`refkern.analysis._envelope_softmax` names that one a bug) is outside it.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format

__all__ = ["LogSoftmaxRows", "candidate", "groups", "half_subnormal", "ROW_OWN"]

ROW_OWN = "row's own roundings"  #: the ``axis`` of this test's failing rows (groups of :mod:`~refkern.analysis.inside`)

#: ``2**-40``: the float64 evaluation of the bound (a dozen additions of positive terms, each within 2**-53
#: relative) and of the residual ``a - ref`` (within 2**-53 of it) is covered by widening ``b`` by this
#: relative amount and ``2**-52 (|a| + |ref|)``
EVAL_SLACK = 2.0**-40
#: ulps within which the log of a correct kernel is (as :mod:`refkern.analysis._envelope_softmax`'s
#: LOG_SCALE_ULPS: used here only to widen a binade, never as the bound itself)
LOG_ULPS = 1.0
#: the exp of a correct kernel within this many ulps (the largest of _envelope_softmax's binades, float32's)
EXP_ULPS = 4.75


def half_subnormal(u_w: float, out: Format) -> float:
    """``eta``: half the smallest subnormal of the working format (float64's where ``u_w`` is, else float32's) or of
    the result format, whichever is larger: a rounding's absolute error where it underflows."""
    wf = FLOAT64 if u_w <= FLOAT64.u else FLOAT32
    return max(math.ldexp(1.0, f.emin - f.prec) for f in (wf, out))


def groups(rows, z, means, mask) -> list:
    """The failing rows ``rows`` (most significant first) as groups of :mod:`refkern.analysis.inside`: ``ax``
    None, ``axis`` :data:`ROW_OWN`, ``z`` their T, ``mean`` their fitted shared error, the first holding ``mask``."""
    out = []
    for i, t, m in zip(rows, z, means):
        out.append({"axis": ROW_OWN, "ax": None, "index": int(i), "z": float(t), "mean": float(m),
                    "mask": mask if not out else None})  # fmt: skip
    return out


@jit(inline="always")
def _h(m, u):
    """Half the ulp of ``m``'s binade in a format of unit roundoff ``u`` (0 for ``u`` 0 or ``m`` 0): the most a
    rounding to nearest of a value of magnitude at most ``m`` errs above the subnormal range."""
    if u == 0.0 or m == 0.0:
        return 0.0
    return u * math.ldexp(1.0, math.frexp(m)[1] - 1)


@jit(inline="always")
def _row_setup(x, y, n, uw, um):
    """(M, dL, hK, ok) of one row: the finite maximum, a first-order bound on ``|L^ - L|`` (a log within
    LOG_ULPS ulps of a sum of ``n`` exps within EXP_ULPS ulps, ``n - 1`` additions and as many rescales, a
    half stage's store of L), and the rounding of ``K = M + L``; ``ok`` False where the row holds NaN or
    ``+inf`` (no finite result to bound)."""
    M = -np.inf
    for j in range(n):
        v = x[j]
        if v != v or v == np.inf:
            return 0.0, 0.0, 0.0, False
        if v > M:
            M = v
    if M == -np.inf:
        return 0.0, 0.0, 0.0, False
    L = 0.0
    for j in range(n):  # -y at the maximum is L (the reference's, within its own rounding)
        if x[j] == M:
            L = abs(y[j])
            break
    dL = uw * (2.0 * LOG_ULPS * L + n * (2.0 * EXP_ULPS + 3.0)) + um * L
    hK = _h(abs(M) + L + dL, uw)
    return M, dL, hK, True


@jit(inline="always")
def _bound(xj, yj, M, dL, hK, uw, um, uo, up_in, up_out, eta):
    """``b_j`` of the module docstring for one element (inf where it is not a finite result of a finite
    logit), widened by EVAL_SLACK; ``up_in``/``up_out``: a candidate's inputs or output rounded to p."""
    if not (abs(xj) < np.inf and abs(yj) < np.inf):
        return np.inf
    hin = _h(abs(xj), up_in) + _h(abs(M), up_in)  # the inputs rounded to p: z moves by at most these
    z = (abs(xj - M) + hin) * (1.0 + EVAL_SLACK)  # float64 sums round down at most by this: no binade lost
    hz = _h(z, uw)
    hm = _h(z + hz, um)
    ay = abs(yj)
    href = _h(ay, uo)
    V = (ay + href + hin + hz + hm + dL + hK + _h(dL + ay + z, um)) * (1.0 + EVAL_SLACK)
    hv = _h(V, uw)
    ho = _h(V + hv, uo) if uo != uw else 0.0  # a float32 result: the last working rounding is the store
    hp = _h(V + hv + ho, up_out)
    b = _h(abs(xj), up_in) + hz + hm + hv + ho + hp + href + 8.0 * eta  # eta: each of the 8 roundings' underflow
    return b * (1.0 + EVAL_SLACK) + 2.0**-52 * (ay + V)


@jit(parallel=True, error_model="numpy")
def _lsm_bounds(X, Y, uw, um, uo, up_in, up_out, eta, B):
    """``b`` (R, n) of every element (inf where none applies: rows with NaN or +inf, non-finite elements)."""
    R, n = X.shape
    for i in prange(R):
        M, dL, hK, ok = _row_setup(X[i], Y[i], n, uw, um)
        for j in range(n):
            B[i, j] = _bound(X[i, j], Y[i, j], M, dL, hK, uw, um, uo, up_in, up_out, eta) if ok else np.inf


@jit(inline="always")
def _feasible(r, b, t):
    """Is there one ``c`` with ``|r_j - c| <= t b_j`` for every j?"""
    lo, hi = -np.inf, np.inf
    for j in range(r.size):
        if b[j] < np.inf:
            lo = max(lo, r[j] - t * b[j])
            hi = min(hi, r[j] + t * b[j])
    return lo <= hi, 0.5 * (lo + hi)


@jit(parallel=True, error_model="numpy")
def _lsm_test(X, Y, A, uw, um, uo, up_in, up_out, eta, T, C):
    """Per row ``T = min_c max_j |r_j - c| / b_j`` (0 where ``T <= 1``: the common case, one pass; else by
    bisection to 2**-30 relative, inf where no finite ``t`` below 2**60 fits) and the ``c`` at ``T``."""
    R, n = X.shape
    for i in prange(R):
        T[i], C[i] = 0.0, 0.0
        M, dL, hK, ok = _row_setup(X[i], Y[i], n, uw, um)
        if not ok:
            continue
        r, b = np.empty(n), np.empty(n)
        for j in range(n):
            a = A[i, j]
            b[j] = _bound(X[i, j], Y[i, j], M, dL, hK, uw, um, uo, up_in, up_out, eta)
            if not abs(a) < np.inf:  # a non-finite element: the envelope's and the element test's to judge
                b[j] = np.inf
            r[j] = a - Y[i, j] if b[j] < np.inf else 0.0
        fit, c = _feasible(r, b, 1.0)
        if fit:
            C[i] = c
            continue
        lo, hi = 1.0, 2.0
        while not _feasible(r, b, hi)[0]:
            lo, hi = hi, 2.0 * hi
            if hi > 2.0**60:
                break
        if hi > 2.0**60:
            T[i] = np.inf
            continue
        while hi - lo > 2.0**-30 * hi:
            mid = 0.5 * (lo + hi)
            if _feasible(r, b, mid)[0]:
                hi = mid
            else:
                lo = mid
        T[i], C[i] = hi, _feasible(r, b, hi)[1]


def candidate(key: str | None, out: Format, u_w: float) -> tuple:
    """``(u_w, up_in, up_out)`` of the rounding family (``key`` None) or of the envelope's reduced-precision
    hypothesis ``key`` (:func:`refkern.analysis.envelope._candidates`: ``"bf16"`` the inputs rounded to bf16
    and computed in float32, ``"bf16 output"`` the float32 result stored in bf16); None for a key this
    test does not model."""
    from refkern.accumulate.formats import BFLOAT16, FLOAT16

    fmts = {"fp16": FLOAT16, "bf16": BFLOAT16, "fp32": FLOAT32}
    if key is None:
        return u_w, 0.0, 0.0
    if key in fmts:
        return FLOAT32.u, fmts[key].u, 0.0
    if key.endswith(" output") and key[:-7] in fmts:
        return u_w, 0.0, fmts[key[:-7]].u
    return None


class LogSoftmaxRows:
    """The test of the module docstring for a log_softmax whose logits are the rows ``X`` (R, n) and whose
    correctly rounded result is ``ref`` (the output's layout; ``rows``/``back`` convert), in the result
    format ``out`` with working unit ``u_w`` and stage unit ``u_m``."""

    def __init__(self, X, ref, rows, back, out: Format, u_w: float, u_m: float):
        self.X = np.ascontiguousarray(X, np.float64)
        self.Y = np.ascontiguousarray(rows(np.asarray(ref, np.float64)), np.float64)
        self.rows, self.back, self.out, self.u_w, self.u_m = rows, back, out, float(u_w), float(u_m)
        self.eta = half_subnormal(u_w, out)

    def _params(self, key):
        cand = candidate(key, self.out, self.u_w)
        if cand is None:
            return None
        uw, up_in, up_out = cand
        return uw, self.u_m, self.out.u, up_in, up_out, self.eta

    def bounds(self, key=None) -> np.ndarray:
        """``b`` in row layout (R, n)."""
        B = np.empty(self.X.shape)
        if B.size:
            _lsm_bounds(self.X, self.Y, *self._params(key), B)
        return B

    def t(self, actual, key=None):
        """(T, c) per row for the output ``actual`` (the output's layout); None for a key not modelled."""
        p = self._params(key)
        if p is None:
            return None
        A = np.ascontiguousarray(self.rows(np.asarray(actual, np.float64)), np.float64)
        T, C = np.zeros(self.X.shape[0]), np.zeros(self.X.shape[0])
        if A.size:
            _lsm_test(self.X, self.Y, A, *p, T, C)
        return T, C

    def failures(self, actual, key=None) -> list:
        """The failing rows as groups of :mod:`refkern.analysis.inside` (``ax`` None, ``axis`` :data:`ROW_OWN`,
        ``z`` = T, the first holding ``mask``: the elements beyond ``b_j`` of the row's best
        ``c``, those no constant makes fit), most significant first; [] where every row fits."""
        got = self.t(actual, key)
        if got is None:
            return []
        T, C = got
        bad = np.flatnonzero(T > 1.0)
        if not bad.size:
            return []
        A = self.rows(np.asarray(actual, np.float64))
        B = self.bounds(key)
        with np.errstate(invalid="ignore"):
            off = np.zeros(self.X.shape, bool)
            off[bad] = np.abs(A[bad] - self.Y[bad] - C[bad, None]) > B[bad]
        mask = np.asarray(self.back(off), bool)
        order = bad[np.argsort(-T[bad])]
        return groups(order, T[order], C[order], mask)

    def detectable_ulps(self, ref) -> tuple:
        """(median, largest) over the finite elements of ``2 (b_j + min_k b_k)`` in ulps of the result at
        ``ref``: one element off by more is flagged for sure (module docstring); (inf, inf) where no row
        has two finite elements."""
        B = self.bounds()
        fin = np.isfinite(B)
        two = fin.sum(axis=1) >= 2
        if not two.any():
            return np.inf, np.inf
        bmin = np.min(np.where(fin, B, np.inf), axis=1, keepdims=True)
        d = np.where(fin & two[:, None], 2.0 * (B + bmin), np.nan)
        y = np.abs(self.Y)
        with np.errstate(all="ignore"):
            e = np.frexp(np.where(np.isfinite(y) & (y > 0), y, 0.0))[1]
            ulp = np.ldexp(1.0, np.maximum(e - 1, self.out.emin) - self.out.prec + 1)
            ulps = (d / ulp)[~np.isnan(d)]
        return float(np.median(ulps)), float(np.max(ulps))
