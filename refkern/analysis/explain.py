"""``refkern.explain``: two computations of the same op, judged against each other and the exact result.

``F.linear(x, W, b)`` and ``x @ W.T + b``, a bias added before or after, one op on two
backends: algebraically equal, and their outputs differ. ``explain`` says whether each is
ordinary rounding of the exact result, whether their difference is within the sum of their
two rounding bounds, and why, in one sentence. It rests on :func:`refkern.compare`'s public
analysis (``elements``), so its verdicts are the very ones ``compare`` gives.
"""

from dataclasses import dataclass

import numpy as np

from refkern.analysis.compare import elements

__all__ = ["Explanation", "explain", "explain_arrays"]

_OK = ("exact", "rounding")


@dataclass
class Explanation:
    """What :func:`explain` found for a pair of outputs of one op.

    ``first``, ``second``: each output's Report against the exact result; ``names``: how the
    two are called in the sentence; ``differ``: elements where they differ (NaN equals NaN);
    ``n_elements``; ``max_diff``: the largest ``|first - second|``; ``max_pair_ratio``: the
    largest ``|first - second| / (bound_first + bound_second)`` over the elements that differ
    (0 when none does); ``within``: every element's difference is within that sum of the two
    worst-case rounding bounds (two correct roundings of the same exact value can differ by
    that much, and by no more); ``sentence``: the explanation, in one sentence.
    """

    names: tuple
    first: object
    second: object
    differ: int
    n_elements: int
    max_diff: float
    max_pair_ratio: float
    within: bool
    sentence: str

    def __str__(self) -> str:
        a, b = self.names
        va, vb = _v(self.first), _v(self.second)
        width = max(len(a), len(b))
        inside = "within" if self.within else "beyond"
        return "\n".join(
            [
                f"{a:<{width}}  {va}  (max {self.first.max_bound_ratio:.3g}x its rounding bound)",
                f"{b:<{width}}  {vb}  (max {self.second.max_bound_ratio:.3g}x its rounding bound)",
                f"they differ in {self.differ} of {self.n_elements} elements, by at most {self.max_diff:.3g}: "
                f"{inside} the sum of their two rounding bounds (max {self.max_pair_ratio:.3g}x)",
                f"why: {self.sentence}",
            ]
        )

    def to_dict(self) -> dict:
        """JSON-serialisable (the two Reports as ``Report.to_dict()``)."""
        from refkern.analysis.report import _plain

        return _plain(
            {"names": list(self.names), "first": self.first.to_dict(), "second": self.second.to_dict(),
             "differ": self.differ, "n_elements": self.n_elements, "max_diff": self.max_diff,
             "max_pair_ratio": self.max_pair_ratio, "within": self.within, "sentence": self.sentence}
        )  # fmt: skip


def _elements(k: int) -> str:
    return f"{k} element" + ("" if k == 1 else "s")


def _v(rep) -> str:
    return rep.verdict + (f" ({rep.precision})" if rep.precision else "")


def explain(a, b, op, *args, names=("a", "b"), **kwargs) -> Explanation:
    """Judge two outputs ``a`` and ``b`` that should both be ``op(*args, **kwargs)``.

    ``a`` and ``b`` are numpy arrays or torch tensors (any device, each in the dtype its
    computation returned); ``op`` and the arguments are exactly those of
    :func:`refkern.compare`. Both are compared with the exact result, then with each other:
    two computations that each round correctly (in any order, fused or not) differ per
    element by at most the sum of their two worst-case rounding bounds. ``names`` labels the
    two in the printed explanation, e.g. ``names=("F.linear", "x @ W.T + b")``.

    >>> import numpy as np, refkern as rk
    >>> rng = np.random.default_rng(0)
    >>> x, w = rng.standard_normal((8, 256)).astype(np.float32), rng.standard_normal((4, 256)).astype(np.float32)
    >>> fused = rk.linear(x, w, accumulate="naive")             # a plain float32 loop
    >>> pairwise = rk.linear(x, w, accumulate="pairwise")       # another order
    >>> e = rk.explain(fused, pairwise, "linear", x, w)
    >>> e.first.verdict, e.second.verdict, e.within
    ('rounding', 'rounding', True)
    """
    if not (isinstance(names, (tuple, list)) and len(names) == 2 and all(isinstance(n, str) for n in names)):
        raise TypeError(f"explain: names must be a pair of strings; got names={names!r}.")
    shape_a, shape_b = tuple(np.shape(a)), tuple(np.shape(b))
    if shape_a != shape_b:
        raise ValueError(
            f"explain: the two outputs must have the same shape; got {names[0]}.shape={shape_a} and "
            f"{names[1]}.shape={shape_b}. Pass two results of the same call."
        )
    return explain_arrays(elements(a, op, *args, **kwargs), elements(b, op, *args, **kwargs), names)


def explain_arrays(ea: dict, eb: dict, names=("a", "b")) -> Explanation:
    """:func:`explain` from the per-element arrays of two ``elements(...)`` calls on the same inputs."""
    ra, rb = ea["report"], eb["report"]
    va = np.asarray(ea["actual"], np.float64).reshape(-1)
    vb = np.asarray(eb["actual"], np.float64).reshape(-1)
    ba = np.asarray(ea["bound"], np.float64).reshape(-1)
    bb = np.asarray(eb["bound"], np.float64).reshape(-1)
    same = (va == vb) | (np.isnan(va) & np.isnan(vb))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(same, 0.0, np.abs(va - vb))
        diff = np.where(np.isnan(diff), np.inf, diff)  # inf - inf, or NaN against a number
        room = ba + bb
        ratio = np.where(same, 0.0, np.where(room > 0, diff / np.where(room > 0, room, 1.0), np.inf))
    differ = int((~same).sum())
    within = bool((diff <= room).all()) if diff.size else True
    max_diff = float(diff.max()) if diff.size else 0.0
    max_ratio = float(ratio.max()) if ratio.size else 0.0
    sentence = _sentence(names, ra, rb, differ, va.size, within)
    return Explanation(tuple(names), ra, rb, differ, int(va.size), max_diff, max_ratio, within, sentence)


def _sentence(names, ra, rb, differ, n, within) -> str:
    (a, b), reps = names, (ra, rb)
    if differ == 0:
        what = "both are the correctly rounded result" if ra.verdict == "exact" else f"both are {_v(ra)}"
        return f"{a} and {b} are identical, element for element; {what}."
    share = f"{differ} of {_elements(n)}"
    if ra.verdict in _OK and rb.verdict in _OK:
        head = f"{a} is {ra.verdict} and {b} is {rb.verdict} against the exact result"
        if within:
            return (
                f"{head}, and they differ in {share} only by what two correct roundings may: they round in "
                "different places or orders (a fused kernel, a bias added in an epilogue or after, another "
                "blocking of the sum); neither is a mistake."
            )
        return (  # each within its own bound, so each was rounded to its own dtype: the references differ
            f"{head}, each within its own bound; they differ in {share} because each was rounded to its own "
            "dtype, in its own order: neither is a mistake."
        )
    bad = [i for i in (0, 1) if reps[i].verdict == "mismatch"]
    if len(bad) == 2:
        return (
            f"neither computes this op on these inputs ({a}: {_elements(ra.counts['mismatch'])}, {b}: "
            f"{_elements(rb.counts['mismatch'])} beyond any rounding bound): look for a bug in both, or for "
            "arguments that differ from the ones given."
        )
    if len(bad) == 1:
        i = bad[0]
        nm, other, r, ro = names[i], names[1 - i], reps[i], reps[1 - i]
        return (
            f"the difference is {nm}'s: {nm} is a mismatch against the exact result "
            f"({_elements(r.counts['mismatch'])} beyond any rounding bound) while {other} is {_v(ro)}; "
            f"look for a bug in {nm}."
        )
    reduced = [i for i in (0, 1) if reps[i].verdict == "reduced-precision"]  # no mismatch, one or two reduced
    who = " and ".join(f"{names[i]} ({reps[i].precision})" for i in reduced)
    if len(reduced) == 2:
        lead = f"{who} compute in a reduced precision"
    else:
        lead = f"{who} computes in a reduced precision while {names[1 - reduced[0]]} is {reps[1 - reduced[0]].verdict}"
    return (
        f"{lead}: narrower inputs or accumulation explain it, so the difference in {share} is that precision, "
        "not a bug; turn that mode off to get the full precision."
    )
