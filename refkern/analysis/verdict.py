"""From a backend's output and the exact reference to a verdict on the whole tensor.

Per element, with ``M = sum|terms|``, ``n`` terms, accumulation unit ``u_a`` and result unit
``u_o``, a backend that forms the same products and adds them in any order in precision
``u_a``, then stores in the result format, errs from the correctly rounded value by at most
(Higham 2002, (3.5) with the final rounding)::

    B = (1 + u_o) gamma_n(u_a) M + 2 u_o |ref|,      gamma_n(u) = n u / (1 - n u).

The hypotheses, from the finest:

* ``exact``: bit-identical (+0 and -0 count as equal).
* ``rounding``: every element within B for the result format's working precision (fp32
  accumulation for fp32, fp16 and bf16 results; fp64 for fp64). This is a theorem: a
  correct fp32 backend cannot fail it, whatever its summation order or blocking.
* reduced precision by emulation (``tf32``, ``fp16``, ``bf16`` inputs, rounded to nearest
  or truncated): the exact result of the op on inputs rounded that way, checked with
  the same bound. When both "rounding" and a reduced precision explain every element
  (long reductions, where gamma_n is loose), the one whose residuals are far smaller wins:
  a TF32 result sits near the TF32 emulation and far from the exact one.
* reduced-precision accumulation (``fp16``, ``bf16`` accumulators), which cannot be
  emulated without knowing the order: within the worst-case bound everywhere,
  99% of elements within 3 sqrt(n) u M (Higham and Mary 2019), the deviations
  widespread (at least 10% of the elements beyond the rounding bound) and of both signs
  (20% to 80% positive). An isolated bad element, a column, a border or a constant
  offset is then not mistaken for a precision.
* ``mismatch``: nothing explains every element (and when an emulated precision explains all
  but at most 1% of them, those few are the unexplained ones, rather than a looser
  accumulation hypothesis swallowing them); or one does by its worst-case bound, but
  a few elements are outliers. For long reductions gamma_n is loose enough to hide a
  real error (at K = 2048 an element off by 1e-3 can sit inside it). Where the explaining
  hypothesis holds, the probabilistic scale ``p = |error| / (sqrt(n) u_a M + 2 u_o |ref|)``
  of correct results stays near or below 1 in practice (measured max 1.24 on 2,000 torch CPU outputs).
  An element with ``p > max(6, 20 * q99)``, where q99 is the tensor's own 99th percentile
  of p, is unexplained: such an error is implausible as rounding (Higham and Mary 2019) and
  inconsistent with the rest of the tensor. Systematic effects (an adversarial data pattern)
  raise q99 for all elements and are not flagged. The unexplained elements are listed,
  worst first.

Emulations cost one exact evaluation each. They run only if some element exceeds the
probabilistic scale sqrt(n) u_a M of the rounding hypothesis, or if rounding fails.
"""

from dataclasses import dataclass, field

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, TFLOAT32, Format

__all__ = ["Hypothesis", "Decision", "decide", "bound", "working_units", "precision_ratios"]

# (name, format, ways its inputs are rounded: truncate?, bias rounded too?); TF32 is a tensor-core
# input conversion (bias added in fp32), fp16/bf16 also a dtype cast of every operand (autocast)
_EMULATED = [
    ("tf32", TFLOAT32, ((False, False), (True, False))),
    ("fp16", FLOAT16, ((False, False), (False, True))),
    ("bf16", BFLOAT16, ((False, False), (True, False), (False, True), (True, True))),
]
_ACCUMULATED = [("fp16", FLOAT16), ("bf16", BFLOAT16)]
BETTER_FIT = 8.0  # a reduced precision must fit this much better than "rounding" when both explain
TIE = 2.0  # reduced precisions whose fits are within this factor cannot be told apart
OUTLIER_MIN, OUTLIER_FACTOR = 6.0, 20.0  # p beyond max(6, 20 * its 99th percentile): an outlier
NEARLY = 0.01  # an emulated precision that fails on at most 1% of the elements names those as unexplained


def _mag_slack(n):
    """M is a float64 sum of n non-negative terms in any order: relative error below (n + 1) 2**-52."""
    return 1.0 + (n + 1) * 2.0**-52


def working_units(fmt: Format) -> tuple[float, float]:
    """(u_accumulation, u_result) of the 'rounding' hypothesis for a result format."""
    return (FLOAT64.u if fmt.prec >= FLOAT64.prec else FLOAT32.u), fmt.u


def _gamma(n, u):
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else np.inf


def bound(mag, ref, n, u_acc, u_out):
    """The worst-case bound B of the module docstring, elementwise."""
    b = (1.0 + u_out) * _gamma(n, u_acc) * mag * _mag_slack(n) + 2.0 * u_out * np.abs(ref)
    return b + n * 2.0**-1074  # underflow of float64 M


def residual(actual, ref):
    """actual - ref, with equal specials (same infinity, both NaN) as 0 and unequal ones as inf."""
    with np.errstate(invalid="ignore"):
        e = actual - ref
    same = (actual == ref) | (np.isnan(actual) & np.isnan(ref))
    e = np.where(same, 0.0, e)
    return np.where(np.isnan(e), np.inf, np.abs(e))


def _ratio(err, b):
    """err / b elementwise: 0 where err is 0, inf where the bound is 0 or NaN (it explains nothing)."""
    out = np.zeros_like(err)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(err, b, out=out, where=err > 0)
    out[np.isnan(out)] = np.inf
    return out


@dataclass
class Hypothesis:
    name: str  # "rounding", "tf32", "fp16", "bf16"
    kind: str  # "working", "emulated inputs (round to nearest)", ... , "accumulation"
    ratios: np.ndarray  # |actual - ref_H| / B_H per element
    explains: bool

    @property
    def key(self) -> str:
        """Unique per hypothesis tried: 'fp16' (emulated inputs) differs from 'fp16 accumulation'."""
        return f"{self.name} accumulation" if self.kind.endswith("accumulation") else self.name

    @property
    def max_ratio(self) -> float:
        return float(self.ratios.max()) if self.ratios.size else 0.0

    @property
    def score(self) -> float:
        """rms of the ratios: how tightly the hypothesis fits the whole tensor."""
        r = self.ratios[np.isfinite(self.ratios)]
        return float(np.sqrt(np.mean(r * r))) if r.size == self.ratios.size and r.size else np.inf

    def summary(self) -> dict:
        return {"kind": self.kind, "explains": self.explains, "max_ratio": self.max_ratio, "score": self.score}


@dataclass
class Decision:
    verdict: str
    precision: str | None
    rounding: Hypothesis
    chosen: Hypothesis | None
    hypotheses: list = field(default_factory=list)
    screened: bool = False  # whether the emulations ran
    outliers: np.ndarray | None = None  # elements an explaining hypothesis bounds but cannot make plausible


def _outliers(actual, ev, u_acc, u_out):
    """Elements far beyond the probabilistic scale of a hypothesis, relative to the whole tensor."""
    err = residual(actual, ev.values)
    scale = np.sqrt(ev.n_terms) * u_acc * ev.mag * _mag_slack(ev.n_terms) + 2.0 * u_out * np.abs(ev.values)
    p = _ratio(err, scale)
    if p.size == 0 or not np.any(err > 0):
        return np.zeros(err.shape, bool)
    q99 = float(np.quantile(np.where(np.isfinite(p), p, np.inf), 0.99))  # over every element, exact ones too
    return p > max(OUTLIER_MIN, OUTLIER_FACTOR * q99)


def _checked(d, actual, ev_h, u_acc, u_out):
    """The decision, or a mismatch if the chosen hypothesis leaves outliers."""
    out = _outliers(actual, ev_h, u_acc, u_out)
    if out.any():
        return Decision("mismatch", None, d.rounding, None, d.hypotheses, d.screened, out)
    return d


def decide(actual, ev, emulate, in_prec: int, err=None) -> Decision:
    """The verdict for ``actual`` against the evaluation ``ev``; ``emulate(fmt, truncate, round_bias)`` returns
    the evaluation on inputs rounded to ``fmt``; ``in_prec`` is the multiplied inputs' precision."""
    u_acc, u_out = working_units(ev.fmt)
    err = residual(actual, ev.values) if err is None else err
    r0 = _ratio(err, bound(ev.mag, ev.values, ev.n_terms, u_acc, u_out))
    rounding = Hypothesis("rounding", "working precision", r0, bool(np.all(r0 <= 1.0)))
    hyps = [rounding]
    if err.size == 0 or np.all(err == 0):
        return Decision("exact", None, rounding, None, hyps)
    with np.errstate(invalid="ignore"):
        screen = bool(np.any(err > np.sqrt(ev.n_terms) * u_acc * ev.mag + 2.0 * u_out * np.abs(ev.values)))
    if rounding.explains and not screen:
        return Decision("rounding", None, rounding, rounding, hyps)  # every element within the scale
    u32 = FLOAT32.u
    evals = {}
    for name, fmt, modes in _EMULATED:
        if fmt.prec >= in_prec:
            continue  # the inputs are already this coarse: rounding them changes nothing
        best = None
        for truncate, round_bias in modes:
            if round_bias and not ev.has_bias:
                continue
            evh = emulate(fmt, truncate, round_bias)
            rh = _ratio(residual(actual, evh.values), bound(evh.mag, evh.values, ev.n_terms, u32, u_out))
            how = ("truncated" if truncate else "round to nearest") + (", bias too" if round_bias else "")
            h = Hypothesis(name, f"{name} inputs ({how})", rh, bool(np.all(rh <= 1.0)))
            if best is None or (h.explains, -h.score) > (best.explains, -best.score):
                best, evals[name] = h, evh
        hyps.append(best)
    reduced = [h for h in hyps[1:] if h.explains]
    best_reduced = None
    if reduced:  # near-ties (inputs that round alike to tf32 and fp16) go to the first of tf32, fp16, bf16
        best = min(h.score for h in reduced)
        best_reduced = next(h for h in reduced if h.score <= TIE * best)
    if best_reduced is not None and (not rounding.explains or best_reduced.score * BETTER_FIT < rounding.score):
        d = Decision("reduced-precision", best_reduced.name, rounding, best_reduced, hyps, True)
        return _checked(d, actual, evals[best_reduced.name], u32, u_out)
    if rounding.explains:
        return _checked(Decision("rounding", None, rounding, rounding, hyps, True), actual, ev, u_acc, u_out)
    nearly = [h for h in hyps[1:] if 0 < np.mean(h.ratios > 1.0) <= NEARLY]
    if nearly:  # an emulation explains all but a few elements: those few are the anomaly
        h = min(nearly, key=lambda h: np.mean(h.ratios > 1.0))
        return Decision("mismatch", None, rounding, None, hyps, True, h.ratios > 1.0)
    widespread = np.mean(r0 > 1.0) >= 0.10
    with np.errstate(invalid="ignore"):
        signed = (actual - ev.values)[err > 0]
    pos = float(np.mean(signed > 0)) if signed.size else 0.5
    balanced = signed.size < 20 or 0.2 <= pos <= 0.8  # rounding noise has both signs; an offset does not
    for name, fmt in _ACCUMULATED:
        rh = _ratio(err, bound(ev.mag, ev.values, ev.n_terms, fmt.u, u_out))
        typical = 3.0 * np.sqrt(ev.n_terms) * fmt.u * ev.mag + 2.0 * u_out * np.abs(ev.values)
        with np.errstate(invalid="ignore"):
            mostly_noise = np.mean(err <= typical) >= 0.99
        explains = bool(np.all(rh <= 1.0) and mostly_noise and widespread and balanced)
        h = Hypothesis(name, f"{name} accumulation", rh, explains)
        hyps.append(h)
        if h.explains:
            return Decision("reduced-precision", name, rounding, h, hyps, True)
    return Decision("mismatch", None, rounding, None, hyps, True)


# (input unit roundoff, accumulation unit roundoff) of each candidate precision; truncation of
# the inputs (TF32, bf16) doubles the input unit, so the larger one is used
CANDIDATES = {
    "fp64": (0.0, FLOAT64.u),
    "fp32": (0.0, FLOAT32.u),
    "tf32": (2.0 * TFLOAT32.u, FLOAT32.u),
    "fp16": (FLOAT16.u, FLOAT32.u),
    "bf16": (2.0 * BFLOAT16.u, FLOAT32.u),
}


def _max_ratio(e, b) -> float:
    """max(e / b); a NaN bound (inf/NaN inputs) explains nothing and counts as inf."""
    if e.size == 0:
        return 0.0
    v = float(np.max(e / b))
    return np.inf if v != v else v


def precision_ratios(err, ev) -> dict:
    """For each candidate precision: the largest ratio of the error to its worst-case bound and
    to its probabilistic scale (the analytic version of each hypothesis, no emulation).

    worst case: (2 u_i + u_i^2) M + (1 + u_o) gamma_n(u_a) (1 + u_i)^2 M + 2 u_o |ref|,
    inputs rounded with unit u_i, accumulation u_a (Higham 2002, (3.5) and the rounding of
    each factor); probabilistic scale: sqrt(n) u_a M + 2 u_i M / sqrt(n) + 2 u_o |ref|, the
    typical size of independent rounding errors (Higham and Mary 2019), not a bound."""
    n, u_o = ev.n_terms, ev.fmt.u
    inexact = err > 0  # only these can have a nonzero ratio
    e, m, ref = err[inexact], (ev.mag * _mag_slack(n))[inexact], np.abs(ev.values)[inexact]
    out = {}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # inf/NaN inputs: 0 * inf in M
        for name, (ui, ua) in CANDIDATES.items():
            worst = (2 * ui + ui * ui) * m + (1 + u_o) * _gamma(n, ua) * (1 + ui) ** 2 * m + 2 * u_o * ref
            prob = np.sqrt(n) * ua * m + 2 * ui * m / np.sqrt(max(n, 1)) + 2 * u_o * ref
            out[name] = {"worst_case": _max_ratio(e, worst), "probabilistic": _max_ratio(e, prob)}
    return out
