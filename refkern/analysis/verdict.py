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

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT64, round_to
from refkern.analysis.hypotheses import Model, centre, centre_sample, models, rounding_variance
from refkern.analysis.passes import (
    chunks,
    insert_top,
    median_bracket,
    median_in_bracket,
    median_max_bound_ulps,
    merge_top,
    ulps_at,
)
from refkern.analysis.stats import ALPHA, level, min_pvalue, proportion_margin, smaller_pvalue
from refkern.analysis.structure import detectable, group_failures, n_groups, signatures

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
        out = self.fails.copy()
        for g in self.groups:
            if g["ax"] is None:
                out |= g["mask"]
                continue
            sl = [slice(None)] * out.ndim
            sl[g["ax"]] = g["index"]
            out[tuple(sl)] = True
        return out

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
        self.lam_grp = level(n_groups(ref.shape) + 1)  # the groups along the axes and the scale test
        self.ms = models(pr.fmt, pr.in_prec, pr.bias is not None, pr.name)
        self.lam_fit = level(len(self.ms) - 1)
        self.var0 = rounding_variance(self.ms[0], pr.n_terms, mag, ref)

    def full(self, f: Fit, c=None, var=None):
        """Test a model on every element (``c``, ``var`` given for the reference model)."""
        if c is None:
            c, var = centre(self.pr, f.model)
        z, fails, keep, r, vk = _element_test_arrays(self.a, c, var, self.lam_el, _grid(f.model, self.pr.fmt))
        z[self.over], fails[self.over] = np.inf, True  # explained by no model, even one that overflows alike
        f.full, f.fails, f.centre, f.var, f.z = True, fails, c, var, z
        f.groups = group_failures(r, vk, keep, c, self.a, self.pr.axes, self.lam_grp)
        f.groups += _scale_failure(r, vk, keep, self.ref, self.lam_grp)
        f.max_z = float(z.max()) if z.size else 0.0
        return f


def _scale_failure(r, vk, keep, ref, lam, coherent=None) -> list:
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
    independent). A failing test is reported as a group over the whole output (``ax`` None) whose
    elements are those whose residual has the scale's sign; ``mean`` is the weighted slope ``s``."""
    with np.errstate(all="ignore"):
        y = np.where(keep, ref, 0.0)
        w = np.where(keep & (vk > 0) & np.isfinite(vk), y / vk, 0.0)
        num = float(np.sum(r * w))
        var = float(np.sum(vk * w * w)) + (float(coherent(w)) if coherent is not None else 0.0)
        den = math.sqrt(var) if var > 0 and math.isfinite(var) else 0.0
    if not num or not math.isfinite(num) or not den > 0 or abs(num) <= lam * den:
        return []
    s = num / float(np.sum(y * w))
    return [{"axis": "scale", "ax": None, "index": 0, "z": abs(num) / den, "mean": s,
             "mask": keep & (r * y * np.sign(num) > 0)}]  # fmt: skip


def _element_test_arrays(a, c, var, lam, grid):
    """(z, fails, keep, r, vk) of :func:`_element_test`, arrays of ``a``'s shape."""
    shape = np.shape(a)
    z, fails, keep, r, vk = (np.empty(shape), np.empty(shape, bool), np.empty(shape, bool), np.empty(shape),
                             np.empty(shape))  # fmt: skip
    flat = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (a, c, var))
    _element_test(*flat, lam, grid is not None, *(grid or FLOAT64).params,
                  *(v.reshape(-1) for v in (z, fails, keep, r, vk)))  # fmt: skip
    return z, fails, keep, r, vk


@jit(parallel=True)
def _element_test(a, c, var, lam, grid, prec, emin, emax, z, fails, keep, r, vk):
    """One pass of :func:`_zscore` and the element test: z, z > lam, and the residual and variance
    of the elements kept for the group tests (passed and finite), 0 elsewhere."""
    for i in prange(a.size):
        x, y = a[i], c[i]
        if x == y or (x != x and y != y):
            zi = 0.0
        else:
            zi = abs(x - y) / np.sqrt(var[i])
            if zi != zi:
                zi = np.inf
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
    rounding yardstick, and the noise-size test of the accumulator models."""
    pr, a, ref = t.pr, t.a.reshape(-1), t.ref.reshape(-1)
    terms = pr.terms(idx)
    a_s, x_s, v0 = a[idx], ref[idx], t.var0.reshape(-1)[idx]
    over = t.over.reshape(-1)[idx]
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.isfinite(a_s) & np.isfinite(x_s) & (v0 > 0)
    orders = {}
    for f in fits:
        m = f.model
        c, var = (x_s, v0) if m is t.ms[0] else centre_sample(terms, pr, m)
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
    for group in orders.values():
        _noise_size(group, a_s, x_s, ok, ALPHA / 3 / max(len(fits) - 1, 1))
    return idx, terms[0], terms[1]


def _noise_size(group, a_s, x_s, ok, alpha):
    """Accumulator models: is the backend's error as large as that accumulator makes it?

    With q_i = (value_i - exact_i)**2 / sigma_i**2 on the sample, the backend's q should lie
    between those of the quietest and the noisiest emulated order. One-sided Mann-Whitney tests
    (:func:`~refkern.analysis.stats.smaller_pvalue`, level ``alpha`` each): the backend's q not
    stochastically smaller than the quietest order's (a correct result with a small bug is far
    cleaner than fp16 accumulation), nor larger than the noisiest order's. Ranks, so a few bad
    elements do not rule the test as they would rule a sum of squares. With too few finite sampled
    elements for the test to reject at ``alpha`` at all (:func:`~refkern.analysis.stats.min_pvalue`
    above it: fewer than 14 at a level of 2.6e-8, 1 / C(28, 14) = 2.5e-8), nothing tells the accumulator's
    noise from a bug of its size, so the accumulator is not eligible (a bf16 grad_bias of 4 channels
    that kept one image of two was named "bf16 accumulation", at 166 times fp32's worst-case bound)."""
    var = group[0][2]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        qa = ((a_s - x_s) ** 2 / var)[ok]
        qs = [((c - x_s) ** 2 / var)[ok] for _, c, _ in group]
    if min_pvalue(qa.size, qa.size) > alpha:  # no power: no evidence for any accumulator of this group
        for f, _, _ in group:
            f.noise_ok = False
        return
    meds = [float(np.median(q)) for q in qs]
    quiet, noisy = qs[int(np.argmin(meds))], qs[int(np.argmax(meds))]
    too_clean = smaller_pvalue(qa, quiet) <= alpha
    too_noisy = smaller_pvalue(noisy, qa) <= alpha
    for f, _, _ in group:
        f.noise_ok = not (too_clean or too_noisy)


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
    idx = sample_indices(ref.size, pr.n_terms)  # one sample for the fits and the power figures
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
    for g in base.groups:
        if g["ax"] is None:  # the scale test (:func:`_scale_failure`)
            found.insert(0, {"kind": "scale", "factor": 1.0 + g["mean"], "text": f"the output is {1.0 + g['mean']:.6g} "
                             f"times what {base.model.kind} gives ({g['z']:.3g} standard errors): a scale error, not "
                             "accumulator noise"})  # fmt: skip
    if t.over.any():
        found.insert(0, _overflow_note(t.over, [(f"{f.model.precision} inputs", f.over_centre) for f in fits
                                                if not f.model.rounding and f.over_centre is not None]))  # fmt: skip
    return Decision("mismatch", None, base.model, cls, fits, base.z, [], found, det, thresholds)


@dataclass
class _EnvelopeFit:
    """A hypothesis of :mod:`refkern.analysis.envelope`: a worst-case bound per element, with the
    summaries of its one pass (:func:`_envelope_pass`)."""

    model: Model
    bound: np.ndarray
    state: np.ndarray  # int8 per element: 0 equal, 1 within a finite bound, 2 vacuous, 3 beyond
    centre: np.ndarray | None = None
    src: tuple = ()  # (actual, centre, bound, params) flat: what the pass read, for the ratios asked for later
    counts: tuple = (0, 0, 0, 0)  # elements per state
    blind: int = 0  # elements of a finite centre whose bound is infinite (or NaN): no envelope holds there
    top: np.ndarray | None = None  # flat indices of the (at most) ten largest ratios among the unequal, worst first
    max_ratio: float = 0.0
    median_ulps: float | None = None  # the bound in ulps of the result at the centre (with ``ulps=True``)
    max_ulps: float | None = None
    max_error_ulps: float | None = None  # the largest |actual - centre| in ulps of the result at the centre

    @property
    def explains(self) -> bool:
        return not self.counts[3]

    @functools.cached_property
    def ratio(self) -> np.ndarray:
        """|actual - centre| / bound per element (0 where equal, NaN alike; inf where a special
        differs): computed again when asked for, rather than kept by every pass."""
        return _ratios(*self.src).reshape(self.state.shape)

    def ratio_at(self, flat) -> np.ndarray:
        """:attr:`ratio` at the flat indices ``flat`` only."""
        a, c, b, params = self.src
        return np.array([0.0 if self.state.reshape(-1)[i] == 0 else _ratio_one(float(a[i]), float(c[i]), b[i], *params)
                         for i in flat], np.float64)  # fmt: skip

    @property
    def vacuous(self) -> np.ndarray:
        """Elements that differ from the centre and pass only because the bound is infinite (the
        envelope claims nothing there). The rounding hypothesis may pass them (no false alarm where
        nothing is claimed); a reduced precision may not be *named* on them: a window that holds any
        value is no evidence for that precision, and a bug would hide in it."""
        return self.state == 2

    def summary(self, lam_el) -> dict:
        bad = int(self.counts[3])
        return {"kind": self.model.kind, "precision": self.model.precision, "explains": bad == 0,
                "tested_on": "every element", "unexplained": bad, "max_ratio": self.max_ratio,
                "test": "worst-case envelope"}  # fmt: skip


def _run(e):
    """A hypothesis of :func:`~refkern.analysis.envelope.envelopes`, its lazy centre and bound computed."""
    return (*e[:2], *e[3]()) if e[2] is None else e


_TOP = 10  # the worst elements a report lists


def _envelope_fits(actual, out, hyps, ulps=False) -> list:
    """One :class:`_EnvelopeFit` per ``(key, precision, centre, bound)``; with ``ulps``, also the
    median and largest bound and the largest error in ulps of ``out`` at the centre."""
    from refkern.accumulate.formats import FORMATS
    from refkern.analysis.envelope import ONE_PASS, storage

    fits = []
    a = _held(actual)
    nch = chunks(a.size)
    for key, prec, mid, bound in hyps:
        fmt = FORMATS.get({"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(prec, ""), out)
        st = storage(out, prec)
        if key == f"{prec} output":  # a softmax/log_softmax output stored in p (_envelope_softmax): each value
            st = fmt  # is fl_p of a float32 one, on p's grid; the pass refuses a value off it
        kind = (f"a correct implementation in {'float64' if out.prec == 53 else 'float32'} arithmetic"
                if key == "rounding" else ONE_PASS + " E[x^2] - E[x]^2" if key == ONE_PASS
                else f"{fmt.name} inputs, computed correctly after the conversion"
                + (f", stored in {st.name}" if st is not out else "") if key == prec
                else f"{key}: otherwise a correct float32 computation")  # fmt: skip
        m = Model(key, prec, kind, st, fmt)
        state = np.empty(a.size, np.int8)
        c, b = _held(mid), np.ascontiguousarray(bound, np.float64).reshape(-1)
        params = (st is not out, *st.params, key == ONE_PASS)
        counts, tcnt = np.zeros((nch, 5), np.int64), np.zeros(nch, np.int64)
        tidx, tval = np.zeros((nch, _TOP), np.int64), np.zeros((nch, _TOP))
        lo, hi, room = median_bracket(c, b, out.prec, out.emin) if ulps else (0.0, 0.0, 0.0)
        kept = np.empty((nch, int(room * (-(-a.size // nch))) + 64 if ulps else 0))
        n_kept, n_below, peak, uerr = np.zeros(nch, np.int64), np.zeros(nch, np.int64), np.zeros(nch), np.zeros(nch)
        _envelope_pass(a, c, b, *params, ulps, out.prec, out.emin, lo, hi, np.empty(0), state, counts, tidx, tval,
                       tcnt, kept, n_kept, n_below, peak, uerr)  # fmt: skip
        shape = np.shape(actual)
        # the equal elements' -1 keys fill a chunk's list only while it is short, at its end
        tcnt = ((tval >= 0.0) & (np.arange(_TOP)[None, :] < tcnt[:, None])).sum(axis=1)
        top = merge_top(tidx, tval, tcnt, _TOP)  # its keys hold an infinite ratio as the largest float: read it again
        f = _EnvelopeFit(m, np.reshape(bound, shape), state.reshape(shape), np.reshape(mid, shape),
                         src=(a, c, b, params), counts=tuple(int(v) for v in counts.sum(axis=0)[:4]),
                         blind=int(counts[:, 4].sum()), top=top)  # fmt: skip
        f.max_ratio = float(f.ratio_at(top[:1]).max(initial=0.0))
        if ulps:
            f.median_ulps = median_in_bracket(kept, n_kept, n_below, a.size)
            if f.median_ulps is None:  # outside the sampled bracket: two passes of its own
                f.median_ulps = median_max_bound_ulps(np.asarray(c, np.float64), b, out.prec, out.emin)[0]
            f.max_ulps, f.max_error_ulps = (float(peak.max()), float(uerr.max())) if a.size else (0.0, 0.0)
        fits.append(f)
    return fits


def _held(v):
    """``v`` flat and contiguous as it is held: float32 (the values of an fp16, bf16 or fp32 result,
    each exact) or float64, never a float64 copy of float32 values (the passes widen per element)."""
    v = np.asarray(v)
    return np.ascontiguousarray(v, v.dtype if v.dtype in (np.float32, np.float64) else np.float64).reshape(-1)


_BIG = np.finfo(np.float64).max  # an infinite ratio's key in the top list (the ratios themselves stay inf)


@jit(error_model="numpy")
def _ratio_one(x, y, b, grid, prec, emin, emax, one_pass):
    """One element's ratio of :func:`_envelope_pass` for unequal x and y (IEEE division: x/0 is inf)."""
    r = abs(x - y) / b
    if r != r:
        r = np.inf
    if grid and x == x and round_to(x, prec, emin, emax) != x:
        r = np.inf  # off the grid of the format the hypothesis stores in
    if one_pass and x != x and b == np.inf:
        r = 0.0
    return r


def _ratios(a, c, b, params):
    """The ratio array of one hypothesis (:func:`_envelope_pass` again, writing it)."""
    ratio, state = np.empty(a.size), np.empty(a.size, np.int8)
    nch = chunks(a.size)
    z = np.zeros(nch)
    _envelope_pass(a, c, b, *params, False, 53, -1022, 0.0, 0.0, ratio, state, np.zeros((nch, 5), np.int64),
                   np.zeros((nch, _TOP), np.int64), np.zeros((nch, _TOP)), np.zeros(nch, np.int64), np.empty((nch, 0)),
                   np.zeros(nch, np.int64), np.zeros(nch, np.int64), z, z.copy())  # fmt: skip
    return ratio


_BLOCK = 512  # elements per block of :func:`_envelope_pass` (its buffers stay in the L1 cache)


@jit(parallel=True, error_model="numpy")
def _envelope_pass(a, c, bound, grid, prec, emin, emax, one_pass, ulps, oprec, oemin, lo, hi, ratio, state, counts,
                   tidx, tval, tcnt, kept, n_kept, n_below, peak, uerr):  # fmt: skip
    """Per element, in one pass: ``ratio = |a - c| / bound`` (0 where equal, NaN alike; inf where one
    is NaN, where an infinite error meets an infinite bound, and, with ``grid``, for a value off the
    grid of the format the hypothesis stores in) and ``state``: 0 equal, 1 within a finite bound,
    2 within only because the bound is infinite (vacuous), 3 beyond (``ratio`` only written when it
    has a's size: the callers that keep only the summaries pass an empty one). ``one_pass``: a NaN where the
    bound is infinite is within (E[x^2] - E[x]^2 + eps can fall below 0: its square root is NaN where
    the envelope reaches 0). Per chunk of :func:`~refkern.analysis.passes.chunks` (the rows of the
    summary arrays): the count of each state and of the infinite bounds at a finite centre (at an inf or
    NaN centre the bound is inf by nature, and every other value is beyond it), the ``k`` largest ratios
    among the unequal elements (:func:`~refkern.analysis.passes.insert_top`), and with ``ulps``, for
    the bound in ulps of the result format (oprec, oemin) at ``c``: the count below ``lo``, the
    values in [lo, hi] (kept while there is room, all counted:
    :func:`~refkern.analysis.passes.median_in_bracket`) and the largest; and the largest ``|a - c|``
    in those ulps. ``a`` and ``c`` are float32 or float64, each element widened as it is read.

    Each chunk goes by blocks of :data:`_BLOCK` elements in two loops: the first computes every
    element's figures with selects and arithmetic only (the equal/unequal bit of real outputs is a
    coin flip, and a branch on it, or on the bracket, costs more than the whole loop), keeping each
    element's top-list key and bound in ulps in the block's buffers; the second makes the rare
    inserts into the top list and stores the values inside the median's bracket. The maxima are kept
    as the bits of non-negative floats, which order as integers."""
    n = a.size
    nch = counts.shape[0]
    keep_ratio = ratio.size == n
    for ch in prange(nch):
        n0 = n2 = n3 = n4 = m = nk = nb = 0
        pk = ue = 0  # bits of the largest bound and error in ulps
        ti, tv, kc = tidx[ch], tval[ch], kept[ch]  # views made once per chunk (each is a reference count)
        room = max(kc.size, 1)
        if not ulps:
            kc = np.empty(1)
        keys, vals = np.empty(_BLOCK), np.empty(_BLOCK)
        thr = -np.inf  # the key an element must beat to enter the chunk's list (its k-th, once full)
        start, stop = ch * n // nch, (ch + 1) * n // nch
        for s in range(start, stop, _BLOCK):
            size = min(_BLOCK, stop - s)
            for t in range(size):
                i = s + t
                x, y, b = np.float64(a[i]), np.float64(c[i]), bound[i]  # float32 arrays widened here, exactly
                sm = (x == y) | ((x != x) & (y != y))
                r = _ratio_one(x, y, b, grid, prec, emin, emax, one_pass)
                if ulps:
                    v, d = ulps_at(x, y, b, sm, oprec, oemin)
                    pk = max(pk, np.float64(v).view(np.int64))
                    ue = max(ue, np.float64(d).view(np.int64))
                    vals[t] = v
                if keep_ratio:
                    ratio[i] = 0.0 if sm else r
                far, inf, us = r > 1.0, not b < np.inf, not sm
                blind = inf & (y - y == 0.0)  # at an inf or NaN centre the bound is inf by nature: no blind spot
                s3, s2 = far & us, inf & us & (not far)
                state[i] = np.int8(us) + np.int8(s2) + np.int8(2 * s3)  # 0 equal, 1 within, 2 vacuous, 3 beyond
                n0 += sm
                n2 += s2
                n3 += s3
                n4 += blind
                w = np.float64(sm)
                keys[t] = min(r, _BIG) * (1.0 - w) - w  # -1 for an equal element (never outranks an unequal one)
            for t in range(size):
                key = keys[t]
                if key > thr:
                    m = insert_top(ti, tv, m, s + t, key)
                    thr = tv[m - 1] if m == ti.size else -np.inf
                if ulps:
                    v = vals[t]
                    nb += v < lo
                    kc[min(nk, room - 1)] = v  # committed only by the count: the next value may overwrite it
                    nk += (v >= lo) & (v <= hi)
        counts[ch, 0], counts[ch, 1], counts[ch, 2] = n0, (stop - start) - n0 - n2 - n3, n2
        counts[ch, 3], counts[ch, 4] = n3, n4
        tcnt[ch], n_kept[ch], n_below[ch] = m, nk, nb
        peak[ch], uerr[ch] = np.int64(pk).view(np.float64), np.int64(ue).view(np.float64)


def _evidence(f: _EnvelopeFit, r0: _EnvelopeFit, ref, fails0) -> tuple:
    """(swallowed, strong) for the precision hypothesis ``f`` over the elements rounding does not
    explain (flat indices ``fails0``).

    *swallowed*: how many ``f`` explains only with a window that holds the rounding window whole,
    ``B_f >= |c_f - ref| + B_0`` (an infinite bound included). Such an element is no evidence for
    ``f``: any output that a bug of that size next to a correct result gives is inside ``f``'s window
    too. *strong*: how many lie where ``f``'s window and rounding's are disjoint,
    ``B_f + B_0 < |c_f - ref|``: there ``f`` predicts that a computation in its precision leaves
    rounding's window, on which side and by how much, and the output fulfils that prediction; where
    the windows merely overlap, a bug just beyond rounding's window lands in ``f``'s part whenever
    ``f``'s window reaches that far (a single element off by 1.5 times its envelope was named fp16
    that way: a std, a log_softmax, an attention output in bench_verdict). Two things make an element
    both informative and strong whatever the width: equality with ``f``'s centre, and, for a
    hypothesis that stores in a coarser format than the result (float32 behind float64), a value on
    that grid with a finite bound (a bug next to a correct float64 result is off float32's grid). A
    precision is named only when no element is swallowed and at least one is strong. The softmax and
    attention hypotheses that round P or the output to p (:mod:`refkern.analysis._envelope_softmax`)
    are not sharp by construction: a term whose float32 interval straddles a rounding boundary of p
    adds a p-ulp to the window, and once the float32 envelope nears a p-ulp most terms do (attention
    at S = 1000: 97% of the fp16 weights), so the window holds rounding's whole (one element off by
    1.1 to 2 times its envelope was named fp16 or bf16 that way, and a log_softmax over 10^5 terms,
    whose envelope spans more than a bf16 ulp, named bf16). They take the same test, with two
    differences. An output stored in p lies on p's grid (:func:`_envelope_fits` gives it p's storage):
    a value on it is evidence as float32's grid is behind a float64 result, a value off it is refused.
    For P rounded before P @ V, a swallowed element with a finite bound does not veto: its window is
    wide only by the p-ulps of the weights whose rounding the hypothesis cannot predict, the
    precision's own resolution, not an ill-conditioned step; it is no evidence, and the strong
    elements must carry the naming (a bug next to a correct result must land in a window of p's that
    is disjoint from rounding's, while p's windows hold every other element)."""
    b, c = f.bound.reshape(-1)[fails0], f.centre.reshape(-1)[fails0]
    b0, gap = r0.bound.reshape(-1)[fails0], np.abs(c - ref.reshape(-1)[fails0])
    with np.errstate(invalid="ignore"):
        informative, strong = b < gap + b0, b + b0 < gap
    sure = f.state.reshape(-1)[fails0] == 0  # equal to the centre: no bug lands there by chance
    if f.model.storage is not r0.model.storage:  # a coarser grid (float32 behind a float64 result, an output
        sure |= b < np.inf  # stored in p): a bug next to a correct result is off that grid, outside the window
    n_strong = int(np.count_nonzero(strong | sure))  # whatever its width
    if f.model.key != f.model.precision and f.model.storage is r0.model.storage:  # P rounded before P @ V: a
        # window that holds rounding's (a weight straddling a p boundary) is no evidence, but finite, no veto
        return int(np.count_nonzero(f.vacuous.reshape(-1)[fails0])), n_strong
    return int(fails0.size - np.count_nonzero(informative | sure)), n_strong


def decide_envelope(actual, ref, envs: dict, out) -> Decision:
    """The verdict for ops judged by worst-case envelopes (:mod:`refkern.analysis.envelope`).

    ``envs``: ``[(key, precision, centre, bound)]`` (or ``(key, precision, None, thunk)``, run only
    when the rounding envelope does not hold), and ``(key, text, fn, None)`` for a named bug
    (:func:`refkern.analysis._envelope_softmax.named_bugs`): ``fn(actual, unexplained, ref)`` is called
    only once the verdict is "mismatch", to name it (``text``), never to excuse an element. An element
    is explained by a hypothesis when ``|actual - centre| <= B`` (equal specials
    count as exact; a NaN or inf that differs never fits). The envelopes bound every correct
    implementation, so "rounding" is never refused to a correct result (no false alarm, at any
    rate: the test is deterministic), and the threshold is 1 by construction, not a tuned
    constant. Verdict: "exact" when every element equals the reference; "rounding" when the
    rounding envelope holds everywhere; else "reduced-precision" with the finest precision whose
    envelope holds everywhere and explains every element that rounding does not with a window that
    does not hold rounding's own (:func:`_evidence`: a window that holds any value, or every value
    a bug next to a correct result could take, names nothing; elements of the output passed only
    by an infinite bound are reported as blind spots) and at least one of them where its window and
    rounding's are disjoint (a prediction that precision makes and rounding does
    not), the coarser ones that qualify too reported as indistinguishable; else "mismatch", measured against
    the rounding envelope, with a
    note when the one-pass variance (a known wrong algorithm) or a named bug explains what rounding
    does not.
    A bug that moves an element by less than its rounding envelope cannot be seen: ``detectable``
    reports that size (median and largest, in units of the result format's ulp at the reference).
    """
    from refkern.analysis.envelope import ONE_PASS, ONE_PASS_TEXT

    named = [e for e in envs if callable(e[2])]
    hyps = [e for e in envs if not callable(e[2])]
    fits = _envelope_fits(actual, out, hyps[:1], ulps=True)
    r0 = fits[0]
    det = {"element": {"median_ulps": r0.median_ulps, "max_ulps": r0.max_ulps}, "test": "worst-case envelope"}
    thresholds = {"element": 1.0, "test": "worst-case envelope"}
    z = None  # the ratio array only where a verdict other than exact or rounding needs it (fits compute it lazily)
    if r0.counts[0] == ref.size:
        return Decision("exact", None, None, np.zeros(ref.shape, np.int8), fits[:1], z, [], [], det, thresholds)
    if r0.explains:
        return Decision("rounding", None, r0.model, _classes(r0.state == 0, 1), fits, z, [], [], det,
                        thresholds)  # fmt: skip
    actual, ref = np.asarray(actual, np.float64), np.asarray(ref, np.float64)  # float32 where held so (compare)
    fits += _envelope_fits(actual, out, [_run(e) for e in hyps[1:]])
    bad = r0.state == 3  # beyond the rounding envelope
    fails0 = np.flatnonzero(bad)
    over = overflowed(actual, ref).reshape(-1)
    precise = [f for f in fits[1:] if f.model.precision and f.explains and not over.any()]  # overflow: docstring, 6
    evidence = {id(f): _evidence(f, r0, ref, fails0) for f in precise}
    swallowed = {i: e[0] for i, e in evidence.items()}
    weak = {i for i, (n, strong) in evidence.items() if not n and not strong}
    reduced = sorted((f for f in fits[1:] if id(f) in swallowed and not swallowed[id(f)] and id(f) not in weak),
                     key=lambda f: -f.model.acc.prec)  # fmt: skip
    if reduced:
        f, tie = reduced[0], [g.model.precision for g in reduced[1:]]
        blind = int(np.count_nonzero(f.vacuous))
        found = [{"kind": "blind", "text": f"{blind} elements fit {f.model.precision} inputs only because its envelope "
                  "holds any value there (an ill-conditioned step, such as a variance that rounding made 0): a bug "
                  "there cannot be seen"}] if blind else []  # fmt: skip
        return Decision("reduced-precision", f.model.precision, f.model, _classes(r0.state == 0, 2), fits,
                        f.ratio, tie, found, det, thresholds)  # fmt: skip
    cls = _classes(r0.state == 0, 1)
    cls[bad] = 3
    found = []
    if over.any():
        found.append(_overflow_note(over, [(f"{f.model.precision} inputs" if f.model.key == f.model.precision
                                            else f.model.key, f.centre.reshape(-1)[over])
                                           for f in fits[1:] if f.model.precision]))  # fmt: skip
    one = [f for f in fits if f.model.key == ONE_PASS]
    if one and one[0].explains and (bad & ~one[0].vacuous).any():  # var/std: the one-pass window is rounding's,
        # centred alike and wider: nested, so it fits every error up to its width, a one-pass variance's or not
        with np.errstate(all="ignore"):
            wide = float(np.max((one[0].bound / r0.bound)[bad & ~one[0].vacuous]))
        found.append({"kind": "algorithm", "text": f"{ONE_PASS_TEXT}; on these inputs its cancellation allows errors "
                      f"up to {wide:.3g}x rounding's envelope, and any other error in the variance of that size fits "
                      "as well"})  # fmt: skip
    for f in fits[1:]:
        p = f"{f.model.precision} inputs" if f.model.key == f.model.precision else f.model.key  # "fp16 P@V"
        if id(f) in weak:
            found.append({"kind": "blind", "text": f"{p} would explain it, but only through windows that "
                          "overlap rounding's (none of the elements rounding does not explain lies where "
                          f"{p} and rounding predict apart): there a bug just beyond rounding and {p} "
                          "cannot be told apart"})  # fmt: skip
            break
        if swallowed.get(id(f)):
            found.append({"kind": "blind", "text": f"{p} would explain it, but only through "
                          "windows that hold rounding's own (an ill-conditioned step, such as a variance that their "
                          f"rounding made small or 0: {swallowed[id(f)]} of the elements rounding does not explain): "
                          f"there a bug and {p} cannot be told apart"})  # fmt: skip
            break
    for _, text, fn, _ in named:
        if fn(actual, bad, ref):
            found.append({"kind": "pattern", "text": text})
    return Decision("mismatch", None, r0.model, cls, fits, r0.ratio, [], found, det, thresholds)
