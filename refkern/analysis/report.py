"""``Report``: what ``refkern.compare`` found, per tensor and per element."""

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Report", "BitReport", "where_summary", "VERDICTS", "SEVERITY", "passes", "counts", "COLUMNS_NOTE",
           "build", "from_decision", "worst_of", "tolerance", "errors", "peak", "envelope_hypotheses"]

#: the one order of the verdicts, best first: every ranking of verdicts reads it
VERDICTS = ("exact", "rounding", "reduced-precision", "mismatch")
#: verdict -> severity, worst lowest (mismatch 0 .. exact 3; None, not judged: -1): the worst has the least
SEVERITY = {None: -1, **{v: len(VERDICTS) - 1 - i for i, v in enumerate(VERDICTS)}}


def counts(classes) -> dict:
    """The number of elements of each verdict class (0..3, :data:`VERDICTS` order) in the int8 ``classes``:
    four counting passes over the bytes (``np.bincount`` would first widen them to int64, a copy eight
    times the array)."""
    c = np.asarray(classes).reshape(-1)
    return {v: int(np.count_nonzero(c == k)) for k, v in enumerate(VERDICTS)}


def passes(verdict, precision, allow) -> bool:
    """The one pass/fail rule: ``verdict`` is in ``allow``, or it is ``reduced-precision`` in a precision that
    ``allow`` names (``("exact", "rounding", "tf32")`` accepts a result explained by TF32)."""
    return verdict in allow or (verdict == "reduced-precision" and precision in allow)

#: one line under every table that shows ulps: what the columns mean, scale first
COLUMNS_NOTE = (
    "error/noise: the largest error over the rounding noise scale sqrt(n) u M (a correct result stays "
    "near or below 1); bound ratio: over the worst-case bound (for reductions, norms, pools, softmax and "
    "attention both are over the worst-case envelope, at most 1 for any correct implementation); max ulp "
    "is large where outputs are near zero (the terms cancel) and means little there"
)


def peak(a) -> float:
    """The largest value of the non-negative figures ``a`` (NaN if one is NaN), 0.0 for none."""
    return float(np.max(a, initial=0.0))


def errors(actual, reference, equal) -> np.ndarray:
    """|actual - reference| per element, float64: 0 where ``equal`` (the same value, NaN matching NaN),
    inf where the difference is undefined (a NaN against a number, inf - inf): the error every route
    measures, and that ``rtol``/``atol`` are tested against."""
    with np.errstate(all="ignore"):
        err = np.where(equal, 0.0, np.abs(np.asarray(actual, np.float64) - reference))
    return np.where(np.isnan(err), np.inf, err)


def tolerance(err, reference, classes, rtol, atol) -> dict | None:
    """With rtol/atol: how many elements fail ``err <= atol + rtol |reference|`` as torch's isclose reads
    it (``equal_nan=False``): an element equal to its reference passes, an infinity included, whatever
    rtol; an infinite error fails, whatever the bound (a NaN or a finite value against an infinity); an
    element whose reference is NaN fails. And how many of those the rounding hypothesis explains anyway
    (class 1); None without a tolerance."""
    if rtol is None and atol is None:
        return None
    rt, at = float(rtol or 0.0), float(atol or 0.0)
    ref = np.asarray(reference, np.float64)
    with np.errstate(invalid="ignore"):  # 0 * inf is NaN: an equal infinity passes by the first test
        failing = ~(((err == 0) & ~np.isnan(ref)) | (np.isfinite(err) & (err <= at + rt * np.abs(ref))))
    return {"rtol": rt, "atol": at, "failing": int(failing.sum()),
            "failing_explained_by_rounding": int((failing & (np.asarray(classes) == 1)).sum())}  # fmt: skip


def _unravel(top, shape) -> list:
    return [tuple(int(i) for i in np.unravel_index(f, shape)) for f in top] if len(shape) else [()] * len(top)


def worst_of(eligible, key, shape):
    """The (at most) ten eligible elements with the largest ``key``, worst first (NaN counts as inf; ties:
    the lower index first): flat indices and multi-indices."""
    from refkern.analysis.passes import top_k

    top = top_k(np.ascontiguousarray(eligible, np.bool_).reshape(-1), np.ascontiguousarray(key, np.float64).reshape(-1),
                10)  # fmt: skip
    return top, _unravel(top, shape)


def envelope_hypotheses(fits) -> tuple:
    """(hypotheses, bound_ratios) of a Report judged by worst-case envelopes (and the statistical test
    inside them, whose fits carry ``lam``): each fit's summary, and each envelope's largest ratio."""
    hyps = {(f.model.key + " (statistical)" if hasattr(f, "lam") else f.model.key): f.summary(1.0) for f in fits}
    return hyps, {f.model.key: {"worst_case": f.max_ratio} for f in fits if not hasattr(f, "lam")}


def build(*, op, device, dtype, shape, n_terms, verdict, precision, classes, actual, reference, top, at_worst,
          max_ulp, max_bound_ratio, max_prob_ratio, hypotheses, bound_ratios, model=None, alternatives=(),
          structure=None, detectable=None, thresholds=None, error=None, rtol=None, atol=None, axes=None, notes=(),
          condition=None) -> "Report":
    """The one builder of a :class:`Report`, for every route (compare's statistical test and envelopes, the
    gradients' envelopes, the elementwise yardstick): what the verdict decided (``verdict``, ``precision``,
    ``model`` (its description), ``alternatives``, ``structure``, ``detectable``, ``thresholds``, and
    ``classes``, 0..3 per element in :data:`VERDICTS` order) and the route's figures, read the same way.

    ``counts`` are the elements per class; ``worst`` the multi-indices of the flat indices ``top`` (worst
    first), each detailed with its actual and reference value and the figures ``at_worst`` (name -> value
    per element of ``top``, or one value for all); ``where`` (only with ``axes``, the names of the axes)
    the positions of the unexplained elements of a mismatch; ``tolerance`` with ``rtol``/``atol``,
    :func:`tolerance` of ``error`` (:func:`errors`; an array, or a function computing it, called only
    then); ``notes``: the structure found first, then the route's own."""
    flat_a, flat_r = np.asarray(actual).reshape(-1), np.asarray(reference).reshape(-1)
    cols = {k: (v if np.ndim(v) else np.full(len(top), v, np.float64)) for k, v in at_worst.items()}
    worst = _unravel(top, shape)
    details = [{"index": list(w), "actual": float(flat_a[f]), "reference": float(flat_r[f]),
                **{k: float(v[j]) for k, v in cols.items()}} for j, (w, f) in enumerate(zip(worst, top))]  # fmt: skip
    where = {}
    if verdict == "mismatch" and axes is not None and len(shape):
        where = where_summary(np.argwhere(np.asarray(classes).reshape(shape) == 3), tuple(shape), axes)
    tol = None
    if rtol is not None or atol is not None:
        tol = tolerance(error() if callable(error) else error, reference, classes, rtol, atol)
    return Report(
        op=op, device=device, dtype=dtype, shape=tuple(shape), n_terms=int(n_terms), verdict=verdict,
        precision=precision, max_ulp=max_ulp, max_bound_ratio=max_bound_ratio, max_prob_ratio=max_prob_ratio,
        worst=worst, worst_details=details, counts=counts(classes), where=where, hypotheses=hypotheses,
        bound_ratios=bound_ratios, condition=condition if condition is not None else {"median": 1.0, "max": 1.0},
        tolerance=tol, notes=[f["text"] for f in structure or ()] + list(notes), model=model,
        alternatives=sorted(set(alternatives)), structure=structure if structure is not None else [],
        detectable=detectable if detectable is not None else {}, thresholds=thresholds if thresholds is not None
        else {},
    )  # fmt: skip


def from_decision(d, **kw) -> "Report":
    """:func:`build` with what the verdict's :class:`~refkern.analysis.verdict.Decision` ``d`` decided."""
    return build(verdict=d.verdict, precision=d.precision, classes=d.classes,
                 model=d.model.kind if d.model is not None else None, alternatives=d.alternatives,
                 structure=d.structure, detectable=d.detectable, thresholds=d.thresholds, **kw)  # fmt: skip


class BitReport:
    """The Report of an op whose result is defined to the bit (IEEE 754 add, mul, div, sqrt,
    comparisons, selections, integer arithmetic): recomputed on the CPU in the same dtype, from the
    same inputs; ``exact`` when every element is the same (NaN matching NaN), else ``mismatch`` (the audit's
    judge of the ops refkern has no reference for; the same verdicts, order and pass rule as :class:`Report`)."""

    precision = None
    notes = ()

    def __init__(self, n, n_diff, max_ulp, first=None, against="the CPU's IEEE result"):
        self.n = n
        self.against = against  # what the elements are compared with (refkern.analysis.integers: the exact integers)
        self.n_diff = n_diff
        self.max_ulp = max_ulp
        self.first = first  # index of the first differing element
        self.verdict = VERDICTS[0] if n_diff == 0 else VERDICTS[-1]  # exact, else mismatch: nothing in between
        self.max_bound_ratio = math.inf if n_diff else 0.0
        self.max_prob_ratio = math.inf if n_diff else 0.0

    @property
    def counts(self) -> dict:
        """Elements per verdict, as :attr:`Report.counts`: the equal ones exact, the others mismatch."""
        return {**dict.fromkeys(VERDICTS, 0), VERDICTS[0]: self.n - self.n_diff, VERDICTS[-1]: self.n_diff}

    @property
    def n_elements(self) -> int:
        return self.n

    @property
    def explained(self) -> bool:
        return self.verdict != "mismatch"

    def to_dict(self):
        return {"verdict": self.verdict, "kind": "bitwise", "n": self.n, "n_diff": self.n_diff,
                "max_ulp": self.max_ulp, "first": self.first}  # fmt: skip

    def __str__(self):
        if not self.n_diff:
            return f"exact: all {self.n} elements equal {self.against}"
        return (f"mismatch: {self.n_diff} of {self.n} elements differ from {self.against} (first at index "
                f"{self.first}, up to {self.max_ulp:.3g} ulp)")  # fmt: skip

def where_summary(idx: np.ndarray, shape: tuple, axes: tuple) -> dict:
    """For the multi-indices ``idx`` (k, ndim) of unexplained elements: per axis, which
    positions hold them, so that a missing channel, a shifted column or a border shows."""
    out = {}
    for ax, (name, size) in enumerate(zip(axes, shape)):
        vals, counts = np.unique(idx[:, ax], return_counts=True) if len(idx) else (np.array([]), np.array([]))
        if len(vals) == size:
            desc = f"all {size}"
        elif len(vals) <= 6:
            desc = ", ".join(str(int(v)) for v in vals) + f" (of {size})"
        else:
            desc = f"{len(vals)} of {size} (from {int(vals.min())} to {int(vals.max())})"
        out[name] = {"positions": [int(v) for v in vals[:64]], "counts": [int(c) for c in counts[:64]], "text": desc}
    return out


@dataclass
class Report:
    """The analysis of one output tensor against its exact reference.

    verdict: "exact", "rounding", "reduced-precision" or "mismatch"; precision: the format
    that explains a reduced-precision result ("tf32", "fp16", "bf16"), else None.
    max_ulp: the largest |error| in ulps of the result format at the correctly rounded value;
    max_bound_ratio: the largest |error| / (worst-case rounding bound of the result format's
    working precision): above 1 the element cannot be ordinary rounding.
    worst: indices of the elements that break the explanation (mismatch), or of the largest
    deviations otherwise, worst first. counts: elements per class. bound_ratios: for fp64, fp32,
    tf32, fp16 and bf16, the largest error relative to that precision's worst-case bound and to
    its probabilistic scale. where: per axis, the
    positions of the unexplained elements. tolerance: with rtol/atol, how many elements fail
    that test and how many of those are within the rounding bound anyway.
    model: the computation that explains the output (or that a mismatch is measured against);
    alternatives: other precisions that fit as well (indistinguishable on these inputs);
    structure: the signatures found among the unexplained elements (offset per channel, shift,
    border, missing terms), each with a ``text``; detectable: the smallest error of one
    element, and of a whole group along each axis, that the test would have flagged;
    thresholds: the false-alarm budget and the levels derived from it
    (:mod:`refkern.analysis.stats`).
    """

    op: str
    device: str
    dtype: str
    shape: tuple
    n_terms: int
    verdict: str
    precision: str | None
    max_ulp: float
    max_bound_ratio: float
    max_prob_ratio: float
    worst: list
    worst_details: list
    counts: dict
    where: dict
    hypotheses: dict
    bound_ratios: dict
    condition: dict
    tolerance: dict | None = None
    notes: list = field(default_factory=list)
    model: str | None = None
    alternatives: list = field(default_factory=list)
    structure: list = field(default_factory=list)
    detectable: dict = field(default_factory=dict)
    thresholds: dict = field(default_factory=dict)

    @property
    def n_elements(self) -> int:
        return int(sum(self.counts.values()))

    @property
    def explained(self) -> bool:
        return self.verdict != "mismatch"

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (non-finite floats as the strings "inf", "-inf", "nan")."""
        return _plain({k: getattr(self, k) for k in self.__dataclass_fields__})

    def headline(self) -> str:
        prec = f" ({' or '.join([self.precision, *self.alternatives])})" if self.precision else ""
        return f"{self.op} on {self.device} ({self.dtype}): {self.verdict}{prec}"

    def __str__(self) -> str:
        lines = [self.headline()]
        n = self.n_elements
        c = self.counts
        lines.append(
            f"  elements: {n}; exact {c['exact']}, within rounding {c['rounding']}, "
            f"reduced precision {c['reduced-precision']}, unexplained {c['mismatch']}"
        )
        if (self.detectable or {}).get("test") == "statistical, inside the envelope":
            env = (self.detectable.get("envelope") or {}).get("median_ulps")
            # an infinite envelope makes every ratio to it 0: say so rather than print "0x"
            vs_env = ("the worst-case envelope is infinite here" if env == float("inf") and not self.max_bound_ratio
                      else f"{_num(self.max_bound_ratio)}x the worst-case envelope of a correct implementation")
            lines.append(
                f"  max error {_num(self.max_prob_ratio)}x the statistical threshold, {vs_env}; "
                f"{_num(self.max_ulp)} ulp; {self.n_terms} terms"
            )
        elif (self.detectable or {}).get("test") == "worst-case envelope":
            lines.append(
                f"  max error {_num(self.max_bound_ratio)}x the worst-case envelope of a correct implementation; "
                f"{_num(self.max_ulp)} ulp; {self.n_terms} terms"
            )
        else:
            lines.append(
                f"  max error {_num(self.max_prob_ratio)}x the rounding noise scale sqrt(n) u M, "
                f"{_num(self.max_bound_ratio)}x the worst-case bound; {_num(self.max_ulp)} ulp; {self.n_terms} terms"
            )
        if self.max_ulp > 64 and self.verdict in ("exact", "rounding"):
            lines.append(
                "  (many ulps are normal where outputs are near zero: the terms cancel, and an ulp of the "
                "small result is tiny next to the rounding of the large terms)"
            )
        lines.append(f"  condition number: median {_num(self.condition['median'])}, max {_num(self.condition['max'])}")
        if all("probabilistic" in v for v in self.bound_ratios.values()):
            ratios = ", ".join(
                f"{k} {_num(v['worst_case'])}/{_num(v['probabilistic'])}" for k, v in self.bound_ratios.items()
            )
            lines.append(f"  max error / bound (worst case/probabilistic): {ratios}")
        else:  # the ops judged by worst-case envelopes have no probabilistic scale
            ratios = ", ".join(f"{k} {_num(v['worst_case'])}" for k, v in self.bound_ratios.items())
            lines.append(f"  max error / worst-case envelope: {ratios}")
        if self.model and self.verdict != "mismatch":
            lines.append(f"  explained by: {self.model}")
        elif self.model:
            lines.append(f"  measured against: {self.model}")
        if self.worst_details:
            lines.append("  worst: " + ("unexplained elements" if self.verdict == "mismatch" else "largest deviations"))
            for w in self.worst_details[:5]:
                bound = "no finite bound" if not w["bound_ratio"] and w["ulp"] else f"{_num(w['bound_ratio'])}x bound"
                lines.append(
                    f"    {tuple(w['index'])}: actual {w['actual']:.9g}, exact {w['reference']:.9g}, "
                    f"{_num(w['ulp'])} ulp, {bound}, condition {_num(w['condition'])}"
                )
        if self.verdict == "mismatch" and self.where:
            lines.append("  where: " + "; ".join(f"{k}: {v['text']}" for k, v in self.where.items()))
        if self.tolerance:
            t = self.tolerance
            lines.append(
                f"  allclose(rtol={t['rtol']}, atol={t['atol']}): {t['failing']} elements fail, "
                f"{t['failing_explained_by_rounding']} of them within the rounding bound"
            )
        lines += [f"  note: {m}" for m in self.notes]
        det = self.detectable
        if det and self.verdict != "exact" and det.get("test") == "statistical, inside the envelope":
            e, env = det["element"], det.get("envelope") or {}
            lines.append(
                f"  detectable: one element off by {_num(e['median_ulps'])} ulp (median; largest "
                f"{_num(e['max_ulps'])}) is flagged; the worst-case envelope alone would pass "
                f"{_num(env.get('median_ulps'))} ulp (median)"
            )
        elif det and self.verdict != "exact" and det.get("test") == "worst-case envelope":
            e = det["element"]
            lines.append(
                f"  detectable: an element off by less than its envelope, median {_num(e['median_ulps'])} ulp "
                f"(largest {_num(e['max_ulps'])}), cannot be told from rounding"
            )
        elif det and self.verdict != "exact":
            groups = ", ".join(f"a whole {k} {_num(v)}" for k, v in det.get("groups", {}).items())
            lines.append(
                f"  detectable (median): one element off by {_num(det['element'])} "
                f"({_num(det['element_in_scale_units'])}x sqrt(n) u M)" + (f"; a constant offset of {groups}" if groups
                                                                            else "")
            )  # fmt: skip
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Report {self.headline()}, max {_num(self.max_ulp)} ulp>"

    def _repr_html_(self) -> str:
        import html

        color = {"exact": "#2e7d32", "rounding": "#2e7d32", "reduced-precision": "#ef6c00", "mismatch": "#c62828"}
        body = html.escape(str(self)).replace("\n", "<br>")
        style = f"font-family:monospace;border-left:4px solid {color[self.verdict]};padding-left:8px"
        return f'<div style="{style}">{body}</div>'


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return str(v)
    return f"{v:.3g}"


def _plain(o):
    """Plain JSON types: numpy scalars and arrays, tuples, and non-finite floats converted."""
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, np.ndarray)):
        return [_plain(v) for v in (o.tolist() if isinstance(o, np.ndarray) else o)]
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, (int, np.integer)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return f if math.isfinite(f) else ("nan" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    return o
