"""The verdict: which computation explains a backend's output, decided as a statistical test.

The hypotheses are models that are run on the very inputs (:mod:`refkern.analysis.hypotheses`);
the thresholds come from the null distribution of correct rounding (:mod:`refkern.analysis.stats`).
With ``z_i = |actual_i - c_i| / sigma_i`` for a model of centre ``c`` and scale ``sigma``:

1. **exact**: bit-identical (+0 and -0 alike, NaN where the reference is NaN).
2. A model **explains** the output when every element has ``z_i <= lam_el`` (lam of the number
   of elements) and no group of elements along an output axis has a residual sum beyond
   ``lam_grp`` standard errors (:mod:`refkern.analysis.structure`). For the rounding model this
   test is the false-alarm budget: a correct result fails it with probability <= ``ALPHA``
   under the model, at any reduction length.
3. **rounding**: a model of the rounding family explains it (any order in fp32, or fp64 for
   fp64 results; for fp16/bf16 results also the product rounded before the bias is added), and
   no reduced precision fits decisively better (4).
4. **Choice by fit, never by order of trial.** Every model is first run on a sample of elements
   (uniform, seeded). Its fit is a capped loss on one yardstick common to all models, the
   rounding scale ``sigma_0``: ``score_H = sum min((actual - c_H)**2 / sigma_0**2, lam_el**2) / 2``.
   An element a model misses by more than the element threshold costs what an anomaly costs,
   so a handful of bad elements cannot hand the output to a vaguer model. Only models that
   fit most of the sample enter this comparison (a model that misses half the elements is no
   base to call the others anomalies: the breakdown point). Models whose score is within
   ``lam_fit**2 / 2`` of the best cannot be told apart: under rounding, ``2 (score_0 - score_H)
   = W_0 - W_H = -D + 2 sum e d / sigma_0**2`` (d the model's shift, ``D = sum d**2 /
   sigma_0**2``, no element capped) is at most ``-D + 2 lam sqrt(D) <= lam**2`` except with
   probability ``alpha`` (Azuma on ``sum e d``), so a reduced precision displaces a rounding
   model that explains the output only beyond that margin.
5. **Verification.** The models of that band that explain the sample (no element beyond
   ``lam_el`` on their own scale) are verified on every element, the rounding family first,
   then by fit. Then the models outside the band that explain the sample, by fit, unless a
   model of the band dominates them (:func:`_dominates`: an accumulator's noise would not
   let any other centre fit that closely). Accumulator models must first carry the right
   amount of noise (:func:`_noise_size`: one-sided Mann-Whitney tests against the quietest and
   the noisiest emulated order), so that a correct result with a small bug, far cleaner than
   fp16 accumulation, is not called fp16. The first model that explains every element is the
   verdict; other precisions that explain the sample within the band are indistinguishable.
6. **Overflow is no excuse.** An element that is inf or NaN where the exact result is finite is
   explained by no model (:func:`overflowed`): a correct implementation returns the finite value
   (the standard model has no exponent limit, and intermediate overflow is avoidable by scaling),
   and a model whose emulation overflows too (fp16 inputs beyond 65504) names why, not a precision
   the output was computed in correctly: it is named in a note of the mismatch.
7. **mismatch** otherwise, measured against the rounding family if it is in the band, else
   against the model of the band with the fewest unexplained elements. The unexplained
   elements are those beyond ``lam_el`` and the elements of groups beyond ``lam_grp``; their
   pattern is named (structure signatures).

A test can only see what stands above the noise: the decision carries the smallest error of
one element, and of a whole group, that would have been flagged (``detectable``).
"""

import math
from dataclasses import dataclass, field, replace

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT64, round_to
from refkern.analysis.hypotheses import Model, centre, centre_sample, models, rounding_variance
from refkern.analysis.partials import order_bound
from refkern.analysis.statfit import unexplained
from refkern.analysis.stats import ALPHA, asymmetric, level, min_pvalue, proportion_margin, sign_power, smaller_pvalue
from refkern.analysis.structure import counted_once, detectable, group_failures, n_groups, signatures
from refkern.engines.filter import threads_for
from refkern.kernels._element import NAIVE

__all__ = ["Fit", "Decision", "decide", "SAMPLE", "sample_indices", "overflowed"]

_FULL_TRIES = 3  # models verified on every element, at most (each costs one exact evaluation)
SAMPLE = 4096  #: sampled elements for the fits (fewer when K is long: at most 2**20 terms gathered)
_SEED = 0x5EED


def sample_indices(n_el: int, k: int) -> np.ndarray:
    """A uniform sample of flat indices, seeded: the same call gives the same sample."""
    s = min(n_el, SAMPLE, max(256, 2**20 // max(k, 1)))
    if s >= n_el:
        return np.arange(n_el)
    return np.sort(np.random.default_rng(_SEED).choice(n_el, s, replace=False))


_OVERFLOW = (
    "an overflow or an invalid operation that no correct implementation performs (intermediate overflow is no excuse)"
)


def overflowed(actual, ref) -> np.ndarray:
    """Boolean mask (ref's shape): ``actual`` is inf or NaN where the exact result ``ref`` is finite.
    No model explains such an element (module docstring, 6)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(ref) & ~np.isfinite(actual)


def _overflow_note(over, fits) -> dict:
    """The finding for the elements of :func:`overflowed`, naming the hypotheses whose own emulation
    gives inf/NaN at every one of them (``fits``: (name, centre at those elements))."""
    n = int(np.count_nonzero(over))
    who = list(dict.fromkeys(name for name, c in fits if c.size and not np.isfinite(c).any()))
    text = f"{n} element{'s' if n > 1 else ''} inf or NaN where the exact result is finite: " + _OVERFLOW
    if who:
        text += f"; {' and '.join(who)} overflow on these inputs and give that too"
    return {"kind": "overflow", "text": text}


@dataclass
class Fit:
    """One model tested against the output."""

    model: Model
    sample_fails: int = 0  # sampled elements beyond lam_el
    w: float = np.inf  # fit on the sample, common yardstick
    noise_ok: bool = True  # accumulator models: the noise has the right size
    full: bool = False  # tested on every element
    fails: np.ndarray | None = None  # full: elements beyond lam_el
    groups: list = field(default_factory=list)  # full: failing groups
    centre: np.ndarray | None = None
    var: np.ndarray | None = None
    max_z: float = 0.0
    z: np.ndarray | None = None  # full: |actual - centre| / sigma per element
    score: float = np.inf  # capped fit on the sample (module docstring, 4)
    res: np.ndarray | None = None  # |actual - centre| on the sample
    over_centre: np.ndarray | None = None  # the centre at the sampled elements of :func:`overflowed`

    @property
    def explains(self) -> bool:
        return self.full and not self.fails.any() and not self.groups

    def unexplained(self) -> np.ndarray:
        """Elements beyond lam_el and the elements of the failing groups (of a failing scale test: the
        elements whose residual has the scale's sign, :func:`_scale_failure`)."""
        return unexplained(self.fails, self.groups)

    def summary(self, lam_el) -> dict:
        d = {"kind": self.model.kind, "precision": self.model.precision, "explains": self.explains,
             "tested_on": "every element" if self.full else "sample", "sample_unexplained": self.sample_fails,
             "fit": self.w, "score": self.score}  # fmt: skip
        if self.full:
            d.update(unexplained=int(self.unexplained().sum()), failing_groups=len(self.groups),
                     max_ratio=self.max_z / lam_el)  # fmt: skip
        if self.model.order is not None:
            d["noise_size_ok"] = self.noise_ok
        return d


@dataclass
class Decision:
    verdict: str
    precision: str | None
    model: Model | None  # the model that explains the output, or the one a mismatch is measured against
    classes: np.ndarray  # per element: 0 exact, 1 rounding, 2 reduced precision, 3 unexplained
    fits: list
    z: np.ndarray | None  # per element |actual - centre| / sigma under ``model`` (rounding's if None); envelopes:
    # the ratio to the bound, None for "exact" and "rounding" (the fits hold it)
    alternatives: list = field(default_factory=list)  # precisions that fit as well (indistinguishable)
    structure: list = field(default_factory=list)
    detectable: dict = field(default_factory=dict)
    thresholds: dict = field(default_factory=dict)

    @property
    def unexplained(self) -> np.ndarray:
        return self.classes == 3


def _classes(exact, k):
    """int8 per element: 0 where ``exact``, else ``k`` (no int64 temporary or masked store: outputs can
    be large)."""
    cls = np.asarray(np.logical_not(exact)).view(np.int8)  # asarray: a 0-d input gives a numpy scalar
    if k != 1:
        cls *= np.int8(k)
    return cls


def _zscore(a, c, var, grid=None):
    """|a - c| / sqrt(var) elementwise (0 where equal, NaN alike; inf where undefined, and, with
    ``grid``, for values off the grid of the format the model stores in): :func:`_element_test`'s z."""
    return _element_test_arrays(a, c, var, np.inf, grid)[0]


def _grid(m: Model, out):
    return m.storage if m.storage.prec < out.prec else None


class _Tester:
    def __init__(self, actual, pr, ref, mag):
        self.a, self.pr, self.ref = actual, pr, ref
        self.over = overflowed(actual, ref)
        self.lam_el = level(ref.size)
        # the groups along the axes, each a sum and a scale test, and the whole output's scale and (of several
        # elements: of one it is the element test) offset tests
        self.lam_grp = level(2 * n_groups(ref.shape) + 1 + (ref.size > 1))
        self.ms = models(pr.fmt, pr.in_prec, pr.bias is not None, pr.name)
        self.lam_fit = level(len(self.ms) - 1)
        # the order term of the orders backends use (refkern.analysis.partials), for every model that fixes all
        # but the order: the rounding family's and the rounded-input precisions' alike (None: the order-free
        # scale; sigma_0 formed once, with it where it applies: a full pass over the output, 8 ms at 1.6M elements)
        self.idx = sample_indices(ref.size, pr.n_terms)  # one sample for the fits, the order check, the power figures
        pr.order_term = order_bound(pr, mag, self.idx)
        order = None if pr.order_term is None else pr.order_term.reshape(ref.shape)
        self.var0 = rounding_variance(self.ms[0], pr.n_terms, mag, ref, order=order)

    def full(self, f: Fit, c=None, var=None):
        """Test a model on every element (``c``, ``var`` given for the reference model)."""
        if c is None:
            c, var = centre(self.pr, f.model, self.a)
        z, fails, keep, r, vk = _element_test_arrays(self.a, c, var, self.lam_el, _grid(f.model, self.pr.fmt))
        z[self.over], fails[self.over] = np.inf, True  # explained by no model, even one that overflows alike
        f.full, f.fails, f.centre, f.var, f.z = True, fails, c, var, z
        f.groups = group_failures(r, vk, keep, c, self.a, self.pr.axes, self.lam_grp)
        f.groups += _scale_failure(r, vk, keep, self.ref, self.lam_grp)
        f.groups += _axis_scale_failures(r, vk, keep, self.ref, self.lam_grp, self.pr.axes, c=c, a=self.a)
        f.groups += _offset_failure(r, vk, keep, self.lam_grp) if r.size > 1 else []
        f.max_z = float(z.max()) if z.size else 0.0
        return f


def _weights(vk, keep, ref):
    """(y, w) of the scale tests: the kept ``ref`` and ``y / sigma**2`` (0 where not kept or undefined)."""
    with np.errstate(all="ignore"):
        y = np.where(keep, ref, 0.0)
        return y, np.where(keep & (vk > 0) & np.isfinite(vk), y / vk, 0.0)


def _scale_failure(r, vk, keep, ref, lam, coherent=None, stats=None) -> list:
    """The scale test: does the residual follow the output? Under the model each residual ``r_i =
    actual_i - c_i`` is sub-Gaussian with ``sigma_i**2`` given everything before it, whatever the exact
    result (the rounding errors are mean-independent, :mod:`refkern.analysis.stats`), so for weights
    ``w_i`` fixed by the exact problem alone ``T = sum r_i w_i / sqrt(sum sigma_i**2 w_i**2)`` over the kept
    elements is sub-Gaussian with parameter 1 (Azuma), and ``|T| > lam`` has probability at most ``2
    exp(-lam**2 / 2)``: one more test of the group part of the budget (``lam_grp`` counts it). The weights
    are the likelihood ratio's for a pure scale error ``r = s y`` (``y`` the exact result, not the model's
    centre, which carries its own error), ``w = y / sigma**2``: ``T = s sqrt(sum y**2 / sigma**2)``, at least
    the ``s sum y**2 / sqrt(sum sigma**2 y**2)`` of the weights ``y`` (Cauchy-Schwarz), however noisy the
    model: fp16 accumulation explained a 1% scale error element by element (K = 4096), and bf16
    accumulation a 5% one (64 x 64 outputs: T = 4.3 with the weights y, 6.5 with these). ``coherent(w)``:
    the variance of ``sum e w`` beyond ``sum sigma**2 w**2`` where several elements share an error (None:
    independent), and where it has them, shared errors bounded, not averaged (``coherent.bound``), whose
    most is added to the threshold. ``stats``: the per-row sums of :meth:`~refkern.analysis.noise_rows.
    RowShared.stats` where the caller has them (their totals are this test's). A failing test is reported
    as a group over the whole output (``ax`` None) whose elements are those whose residual has the scale's
    sign; ``mean`` is the weighted slope ``s``."""
    with np.errstate(all="ignore"):
        if stats is not None:
            num, var = float(np.sum(stats[0])), float(np.sum(stats[1]) + np.sum(stats[3]))
            bd = float(np.sum(stats[4]))
        else:
            y, w = _weights(vk, keep, ref)
            num = float(np.sum(r * w))
            var = float(np.sum(vk * w * w)) + (float(coherent(w)) if coherent is not None else 0.0)
            bd = getattr(coherent, "bound", lambda w: None)(w)
            bd = float(np.sum(bd)) if bd is not None else 0.0  # errors bounded, not averaged: a margin of their own
        den = math.sqrt(var) if var > 0 and math.isfinite(var) else 0.0
    if not num or not math.isfinite(num) or not den > 0 or abs(num) <= lam * den + bd:
        return []
    y, w = _weights(vk, keep, ref)
    ex = coherent.grouped(w, vk, np.arange(coherent.count)) if getattr(coherent, "keys", None) else None
    if ex is not None:  # equal keys' errors taken correlated (RowShared.grouped): asked for only here
        den = math.sqrt(max(var + float(np.sum(ex)), 0.0))
        if abs(num) <= lam * den + bd:
            return []
    if getattr(coherent, "members", None) is not None:  # a float32 norm: one emulated statistic for every row
        st = stats if stats is not None else coherent.stats(r, vk, keep, ref)
        if coherent.member_rows(st, w, lam)[1]:
            return []
    s = num / float(np.sum(y * w))
    return [{"axis": "scale", "ax": None, "index": 0, "z": abs(num) / den, "mean": s,
             "mask": keep & (r * y * np.sign(num) > 0)}]  # fmt: skip


def _offset_failure(r, vk, keep, lam) -> list:
    """The offset test: ``T = sum r_i / sqrt(sum sigma_i**2)`` over the kept elements of the whole output,
    sub-Gaussian with parameter 1 under the model (Azuma, as :func:`_scale_failure`; the weights all 1),
    so ``|T| > lam`` has probability at most ``2 exp(-lam**2 / 2)``: one more test of the group part of
    the budget. A constant offset moves every group's sum a little and this one by ``sqrt(n)`` more (a
    bf16 matmul offset by half the spread of correct kernels passed every row and column under fp16
    accumulation's scale). Reported as a group over the whole output (``ax`` None, ``axis`` "offset"), its
    elements those whose residual has the offset's sign; ``mean`` the mean residual."""
    with np.errstate(all="ignore"):
        num = float(np.sum(r))
        var = float(np.sum(vk))
        den = math.sqrt(var) if var > 0 and math.isfinite(var) else 0.0
    if not num or not math.isfinite(num) or not den > 0 or abs(num) <= lam * den:
        return []
    cnt = max(int(np.count_nonzero(keep)), 1)
    return [{"axis": "offset", "ax": None, "index": 0, "z": abs(num) / den, "mean": num / cnt,
             "mask": keep & (r * np.sign(num) > 0)}]  # fmt: skip


def _axis_scale_failures(r, vk, keep, ref, lam, axes, only=None, last=None, c=None, a=None, vg=None) -> list:
    """The scale test of :func:`_scale_failure` on each group along each axis (of the axes ``only``,
    every axis when None; the groups of :func:`~refkern.analysis.structure.group_failures`, whose elements
    are independent under the model): ``T_g = sum_(i in g) r_i w_i / sqrt(sum sigma_i**2 w_i**2)``, ``w = y /
    sigma**2``, sub-Gaussian with parameter 1 for the same reason, so ``|T_g| > lam`` has probability at
    most ``2 exp(-lam**2 / 2)``: one more test per group (``lam_grp`` counts them twice). A group's residual
    sum sees an offset; this sees a group scaled (a row of a product, a feature's weight), whose residuals
    ``s y`` of either sign sum to about 0. Failing groups are reported as groups (``scale`` True, ``mean``
    the weighted slope). ``last``: the last axis's ``(sum r w, sum sigma**2 w**2)`` where a pass has them
    (:attr:`~refkern.analysis.noise_rows.RowShared.fused`). With the centre ``c`` and the actual ``a``, a
    failing group is tested again counting each repeated (centre, actual) pair once, as the sum tests do
    (:func:`~refkern.analysis.structure.group_failures`: a deterministic backend gives equal inputs one
    error; a scan of a constant row repeated over rows is one row's errors, not independent ones). ``vg``: the
    groups' variances where they differ from the weights' ``vk`` (a float32 norm's columns on the whole
    family's shared scale, :attr:`~refkern.analysis.noise_rows.RowShared.widen`; ``last`` then on it too)."""
    if r.ndim == 0:
        return []
    vg = vk if vg is None else vg
    out = []
    sums = None
    with np.errstate(all="ignore"):
        for ax in range(r.ndim):
            if r.shape[ax] < 2 or (only is not None and ax not in only):
                continue
            other = tuple(i for i in range(r.ndim) if i != ax)
            if ax == r.ndim - 1 and last is not None and last.shape[1] == r.shape[-1]:
                num, var = last[0], last[1]
            else:
                if sums is None:
                    y, w = _weights(vk, keep, ref)
                    sums = (r * w, vg * w * w)
                num, var = sums[0].sum(axis=other), sums[1].sum(axis=other)
            den = np.sqrt(var)
            bad = (num != 0) & np.isfinite(num) & (den > 0) & np.isfinite(den) & (np.abs(num) > lam * den)
            if bad.any():
                y, w = _weights(vk, keep, ref)
                slope = (y * w).sum(axis=other)
                if c is not None and a is not None:
                    bad &= _once(r, vg, w, c, a, ax, other, lam)
            for i in np.flatnonzero(bad):
                out.append({"axis": axes[ax], "ax": ax, "index": int(i), "z": float(abs(num[i]) / den[i]),
                            "mean": float(num[i] / slope[i]), "scale": True})  # fmt: skip
    return out


def _once(r, vk, w, c, a, ax, other, lam):
    """Per index along ``ax``: does its scale test still fail with each repeated (c, a) pair counted once
    in its group (:func:`~refkern.analysis.structure.counted_once`; all True where no pair repeats)?"""
    ids = counted_once(c, a, (ax,)).get(ax)
    if ids is None:
        return True
    num, var = (r * w * ids).sum(axis=other), (vk * w * w * ids).sum(axis=other)
    return np.abs(num) > lam * np.sqrt(var)


def n_rows(coherent) -> int:
    """The number of row scale tests (:func:`_row_scale_failures`) that ``coherent`` asks for: its rows
    where it knows them (:class:`~refkern.analysis.noise.RowShared`) and there are several, else 0 (one
    row's test is the scale test itself)."""
    R = getattr(coherent, "count", 0)
    return R if R > 1 else 0


def _row_scale_failures(r, vk, keep, ref, lam, coherent, stats=None) -> list:
    """The scale test of :func:`_scale_failure` on each row of ``coherent`` (rows whose elements share
    errors: a norm's mean and ``r``, a softmax's sum, a query's weights): ``T_r = sum_(i in r) r_i w_i /
    sqrt(sum sigma_i**2 w_i**2 + coherent.per_row(w)_r)``, ``w = y / sigma**2``, sub-Gaussian with
    parameter 1 under the model for the same reason (Azuma, the weights fixed by the exact problem), so
    ``|T_r| > lam`` has probability at most ``2 exp(-lam**2 / 2)``: one more test each of the group part of
    the budget (``lam_grp`` counts them, :func:`n_rows`). A row's errors that the model shares (its mean,
    ``r``, ``D``) are in ``per_row``, so a row may follow its output only by them, and those bounded, not
    averaged, by ``coherent.bound(w)``, added to the threshold; a bug that scales one row by more fails.
    A failing row is a group over that row (``ax`` None, ``axis`` "row scale"), its elements those whose
    residual has the row's slope's sign; ``mean`` the row's weighted slope. ``stats``: as
    :func:`_scale_failure`'s (computed here where not given)."""
    num, vv, yw, extra, bd = (coherent.stats(r, vk, keep, ref) if stats is None else stats)[:5]
    rows = coherent.rows
    with np.errstate(all="ignore"):
        var = vv + extra
        den = np.sqrt(np.where(var > 0, var, 0.0))
        bad = (num != 0) & np.isfinite(num) & (den > 0) & np.isfinite(den) & (np.abs(num) > lam * den + bd)
        y, w = _weights(vk, keep, ref) if bad.any() else (None, None)
        ex = coherent.grouped(w, vk, np.flatnonzero(bad)) if bad.any() else None
        if ex is not None:  # equal keys' errors taken correlated, on the failing rows only (more variance)
            idx = np.flatnonzero(bad)
            den[idx] = np.sqrt(np.maximum(var[idx] + ex, 0.0))
            bad[idx] = np.abs(num[idx]) > lam * den[idx] + bd[idx]
    if bad.any() and getattr(coherent, "members", None) is not None:  # a float32 norm: a row passes on one
        # emulated statistic (noise_norm_chains), its shift taken out exactly
        st = stats if stats is not None else coherent.stats(r, vk, keep, ref)
        bad &= ~coherent.member_rows(st, w, lam)[0]
    if not bad.any():
        return []
    sign = coherent.back(np.where(bad, np.sign(num), 0.0)[:, None] * np.ones((1, rows(y).shape[1])))
    mask = keep & (r * y * sign > 0)  # the failing rows' elements on their slope's side, held by the first group
    out = []
    idx = np.flatnonzero(bad)
    for i in idx[np.argsort(-np.abs(num[idx]) / den[idx])]:
        out.append({"axis": "row scale", "ax": None, "index": int(i), "z": float(abs(num[i]) / den[i]),
                    "mean": float(num[i] / yw[i]), "mask": mask if not out else None})  # fmt: skip
    return out


def _element_test_arrays(a, c, var, lam, grid):
    """(z, fails, keep, r, vk) of :func:`_element_test`, arrays of ``a``'s shape."""
    shape = np.shape(a)
    z, fails, keep, r, vk = (np.empty(shape), np.empty(shape, bool), np.empty(shape, bool), np.empty(shape),
                             np.empty(shape))  # fmt: skip
    flat = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (a, c, var))
    _element_test(*flat, lam, grid is not None, *(grid or FLOAT64).params,
                  *(v.reshape(-1) for v in (z, fails, keep, r, vk)))  # fmt: skip
    return z, fails, keep, r, vk


@jit
def z_one(x, y, sd):
    """One element's z, ``|x - y| / sd``: 0 where equal or both NaN, inf where undefined."""
    if x == y or (x != x and y != y):
        return 0.0
    if not sd > 0.0:  # no scale (an exactly known value) and another value: infinitely far
        return np.inf
    z = abs(x - y) / sd
    return np.inf if z != z else z


@jit(parallel=True)
def _element_test(a, c, var, lam, grid, prec, emin, emax, z, fails, keep, r, vk):
    """One pass of :func:`_zscore` and the element test: z, z > lam, and the residual and variance
    of the elements kept for the group tests (passed and finite), 0 elsewhere."""
    for i in prange(a.size):
        x, y = a[i], c[i]
        zi = z_one(x, y, np.sqrt(var[i]))
        if grid and x == x and round_to(x, prec, emin, emax) != x:
            zi = np.inf  # off the grid of the format the model stores in
        z[i] = zi
        bad = zi > lam
        fails[i] = bad
        k = not bad and x - x == 0.0 and y - y == 0.0
        keep[i] = k
        r[i] = x - y if k else 0.0
        vk[i] = var[i] if k else 0.0


def _sample_fits(t: _Tester, fits, idx):
    """Every model on the sample: failures on its own scale, the fit W and the capped score on the
    rounding yardstick, and the noise-size test of the accumulator models. The sample's z-scores are a few
    thousand elements: their jitted passes run on one thread (:func:`~refkern.engines.filter.threads_for`;
    a parallel launch on 1820 elements cost 32 ms of wall time under load against 0.013 ms on one thread,
    593 such launches 4.3 s of a ResNet-18 audit's 12.4 s of CPU)."""
    with threads_for(idx.size):
        return _sample_fits_on(t, fits, idx)


def _sample_fits_on(t: _Tester, fits, idx):
    pr, a, ref = t.pr, t.a.reshape(-1), t.ref.reshape(-1)
    terms = pr.terms(idx)
    a_s, x_s, v0 = a[idx], ref[idx], t.var0.reshape(-1)[idx]
    over = t.over.reshape(-1)[idx]
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.isfinite(a_s) & np.isfinite(x_s) & (v0 > 0)
    orders = {}
    for f in fits:
        m = f.model
        if m.rz and fits[0].full and fits[0].explains:  # the rounding family explains every element (its full
            f.sample_fails = idx.size  # test ran first): it is the verdict whatever the tensor-core models fit, so
            continue  # the drift's pass over the sample's K terms (+35% of a float32 linear's compare) is skipped
        c, var = (x_s, v0) if m is t.ms[0] else centre_sample(terms, pr, m, a_s)
        z = _zscore(a_s, c, var, _grid(m, pr.fmt))
        z[over] = np.inf
        f.over_centre = c[over]
        f.sample_fails = int(np.sum(z > t.lam_el))
        with np.errstate(invalid="ignore"):
            f.res = np.where(z == np.inf, np.inf, np.abs(a_s - c))
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            q = _zscore(a_s, c, v0, _grid(m, pr.fmt)) ** 2  # on the rounding yardstick, common to every model
            q[over] = np.inf
            f.w = float(np.sum(np.where(ok, q, 0.0)))
            f.score = float(np.sum(np.minimum(q, t.lam_el**2)) / 2)  # an element missed costs what an anomaly costs
        if m.order is not None:
            orders.setdefault(m.acc.name, []).append((f, c, var))
    if orders:  # the noisiest order of the working precision: an accumulator must be louder than it
        m0 = t.ms[0]
        c32, _ = centre_sample(terms, pr, replace(m0, key="fp32 accumulation (left-to-right)", order=NAIVE,
                                                  storage=pr.fmt))  # fmt: skip
    for group in orders.values():
        _noise_size(group, a_s, x_s, ok, ALPHA / 3 / max(len(fits) - 1, 1), c32)
    return idx, terms[0], terms[1]


def _noise_size(group, a_s, x_s, ok, alpha, c32=None):
    """Accumulator models: is the backend's error as large as that accumulator makes it?

    With q_i = (value_i - exact_i)**2 / sigma_i**2 on the sample, the backend's q should lie
    between those of the quietest and the noisiest emulated order. One-sided Mann-Whitney tests
    (:func:`~refkern.analysis.stats.smaller_pvalue`, level ``alpha`` each): the backend's q not
    stochastically smaller than the quietest order's (a correct result with a small bug is far
    cleaner than fp16 accumulation), nor larger than the noisiest order's; and, the evidence a bug
    would not give (issue 24: a precision is named only with it), stochastically larger than the q of
    ``c32``, the working precision's noisiest order (float32 left to right, stored in the result
    format): an accumulator no louder than a correct kernel has left no trace of itself (fp16
    accumulation under a bfloat16 result, whose store is coarser than fp16's roundings, was named for
    a correct bf16 matmul with one element off by 8x and 32x the spread of correct kernels; a constant
    offset of half that spread still passes this test and is named). Ranks, so a few bad
    elements do not rule the test as they would rule a sum of squares. With too few finite sampled
    elements for the test to reject at ``alpha`` at all (:func:`~refkern.analysis.stats.min_pvalue`
    above it: fewer than 14 at a level of 2.6e-8, 1 / C(28, 14) = 2.5e-8), nothing tells the accumulator's
    noise from a bug of its size, so the accumulator is not eligible (a bf16 grad_bias of 4 channels
    that kept one image of two was named "bf16 accumulation", at 166 times fp32's worst-case bound)."""
    var = group[0][2]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        qa = ((a_s - x_s) ** 2 / var)[ok]
        qs = [((c - x_s) ** 2 / var)[ok] for _, c, _ in group]
    d_ok, x_ok = a_s[ok] - x_s[ok], x_s[ok]
    if min_pvalue(qa.size, qa.size) > alpha or not sign_power(d_ok, x_ok, alpha):  # no power: no evidence
        for f, _, _ in group:
            f.noise_ok = False
        return
    meds = [float(np.median(q)) for q in qs]
    quiet, noisy = qs[int(np.argmin(meds))], qs[int(np.argmax(meds))]
    too_clean = smaller_pvalue(qa, quiet) <= alpha
    too_noisy = smaller_pvalue(noisy, qa) <= alpha
    if c32 is not None:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            q32 = ((c32 - x_s) ** 2 / var)[ok]
        too_clean = too_clean or not smaller_pvalue(q32, qa) <= alpha  # no louder than float32
    lopsided = asymmetric(d_ok, x_ok, alpha, [(c - x_s)[ok] for _, c, _ in group])  # the signs
    for f, _, _ in group:
        f.noise_ok = not (too_clean or too_noisy or lopsided)


def _dominates(s: Fit, e: Fit, eps: float) -> bool:
    """Does the sharp model ``s`` fit so much closer than ``e`` that ``e`` cannot be the truth?

    If ``e`` were the truth (an accumulator in some order), the actual error n = actual - exact is
    its noise, and ``s``'s residual n - d (d = c_s - exact, independent of n) is stochastically no
    smaller than |n| for n symmetric and unimodal (Anderson's theorem), while ``e``'s own residual,
    the difference of two such errors, is about sqrt(2) |n|. So the median of ``s``'s residuals
    cannot fall below ``e``'s median over sqrt(2); with the empirical medians each within the
    (1/2 -+ eps) quantiles (Hoeffding), ``s`` dominates when its (1/2 + eps) quantile is below
    ``e``'s (1/2 - eps) quantile over sqrt(2)."""
    if eps >= 0.5 or s.res is None or e.res is None:
        return False
    return float(np.quantile(s.res, 0.5 + eps)) < float(np.quantile(e.res, 0.5 - eps)) / np.sqrt(2.0)


def decide(actual, pr, ref, mag) -> Decision:
    """The verdict on ``actual`` (float64, the shape of ``ref``) for the Problem ``pr`` whose exact
    result, rounded to the output format, is ``ref`` and whose magnitudes are ``mag``."""
    t = _Tester(actual, pr, ref, mag)
    exact = (actual == ref) | (np.isnan(actual) & np.isnan(ref))
    thresholds = {"alpha": ALPHA, "element": t.lam_el, "group": t.lam_grp, "fit": t.lam_fit**2}
    scale = np.sqrt(pr.n_terms) * t.ms[0].acc.u * mag
    idx = t.idx
    det = detectable(t.var0, scale, ref.shape, pr.axes, t.lam_el, t.lam_grp, idx)
    fits = [Fit(m) for m in t.ms]
    r0 = t.full(fits[0], ref, t.var0)
    if exact.all():
        return Decision("exact", None, None, np.zeros(ref.shape, np.int8), fits[:1], r0.z, [], [], det, thresholds)
    sample = _sample_fits(t, fits, idx)
    n_s = len(sample[0])
    live = [f for f in fits if f.noise_ok]
    sharp = [f for f in live if f.sample_fails < n_s / 2]  # fit most of the sample: the breakdown point
    best = min((f.score for f in sharp), default=np.inf)
    band = t.lam_fit**2 / 2  # the likelihood-ratio margin of the module docstring, on the half-scaled fit
    inband = [f for f in sharp if f.score <= best + band]
    first = sorted((f for f in inband if not f.sample_fails), key=lambda f: (not f.model.rounding, f.score))
    eps = proportion_margin(n_s, ALPHA / 3 / max(len(fits) - 1, 1))
    rest = sorted((f for f in live if not f.sample_fails and f not in first
                   and not any(_dominates(g, f, eps) for g in inband)), key=lambda f: f.score)  # fmt: skip
    for f in (first + rest)[:_FULL_TRIES]:
        if not f.full:
            t.full(f)
        if f.explains:
            if f.model.rounding:
                cls = _classes(exact, 1)
                return Decision("rounding", None, f.model, cls, fits, f.z, [], [], det, thresholds)
            tie = sorted({g.model.precision for g in first + rest if not g.model.rounding
                          and g.model.precision != f.model.precision and g.score <= f.score + band})  # fmt: skip
            cls = _classes(exact, 2)
            return Decision("reduced-precision", f.model.precision, f.model, cls, fits, f.z, tie, [], det, thresholds)
    # nothing explains: measure against the rounding family when it fits as well as the best, else
    # against the best fit (a bug on top of a tf32 result is measured against tf32)
    # (and only when it explains most of the sample: a model that misses half the elements is no base
    # to call the others anomalies; below that breakdown point the rounding family is the yardstick)
    cands = [f for f in inband if f.model.rounding] or inband or [f for f in fits if f.model.rounding]
    for f in cands[:_FULL_TRIES]:
        if not f.full:
            t.full(f)
    base = min((f for f in cands if f.full), key=lambda f: int(f.unexplained().sum()))  # ties: the first
    bad = base.unexplained()
    cls = np.where(exact, 0, np.where(bad, 3, np.where(r0.z <= t.lam_el, 1, 2))).astype(np.int8)
    found = signatures(actual, base.centre, base.var, bad, pr, t.lam_el, sample)
    whole, along = [], []  # the whole output's findings lead, then each group's
    for g in base.groups:
        if g.get("scale") and g["ax"] is not None:  # a group's scale test (:func:`_axis_scale_failures`)
            along.append({"kind": "scale", "factor": 1.0 + g["mean"], "text": f"{g['axis']} {g['index']} is "
                             f"{1.0 + g['mean']:.6g} times what {base.model.kind} gives ({g['z']:.3g} standard "
                             "errors): scaled, not accumulator noise"})  # fmt: skip
        if g["ax"] is None and g["axis"] == "offset":  # the offset test (:func:`_offset_failure`)
            whole.append({"kind": "offset", "axis": "all", "indices": [], "offsets": [g["mean"]], "bias": None,
                             "text": "the output is "
                             f"offset by {g['mean']:.3g} on average from what {base.model.kind} gives ({g['z']:.3g} "
                             "standard errors): an offset, not accumulator noise"})  # fmt: skip
            continue
        if g["ax"] is None:  # the scale test (:func:`_scale_failure`)
            whole.append({"kind": "scale", "factor": 1.0 + g["mean"], "text": f"the output is {1.0 + g['mean']:.6g} "
                             f"times what {base.model.kind} gives ({g['z']:.3g} standard errors): a scale error, not "
                             "accumulator noise"})  # fmt: skip
    found = whole + along + found
    if t.over.any():
        found.insert(0, _overflow_note(t.over, [(f"{f.model.precision} inputs", f.over_centre) for f in fits
                                                if not f.model.rounding and f.over_centre is not None]))  # fmt: skip
    return Decision("mismatch", None, base.model, cls, fits, base.z, [], found, det, thresholds)
