"""``refkern.compare`` and ``refkern.assert_matches_reference``."""

import numpy as np

from refkern._arrays import is_tensor, operand
from refkern.accumulate.formats import FORMATS
from refkern.analysis.evaluate import evaluate, op_name
from refkern.analysis.report import Report, where_summary
from refkern.analysis.verdict import bound, decide, precision_ratios, residual, working_units

__all__ = ["compare", "assert_matches_reference", "elements"]


def _actual(actual):
    """(float64 values, format, device) of a backend's output, without loss."""
    device = str(actual.device) if is_tensor(actual) else "numpy"
    o = operand(actual, "actual", "compare")
    return np.asarray(o.values, np.float64).reshape(o.shape), o.fmt, device


def _ulps(actual, ref, fmt):
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.frexp(np.where(ref == 0, 1.0, ref))[1] - 1
        e = np.where(ref == 0, fmt.emin, np.maximum(e, fmt.emin))
        ulp = np.ldexp(1.0, (e - fmt.prec + 1).astype(np.int64))
        err = residual(actual, ref)
        return np.where(np.isfinite(ref), err / ulp, np.where(err == 0, 0.0, np.inf))


def compare(actual, op, *args, rtol: float | None = None, atol: float | None = None, **kwargs) -> Report:
    """Analyse a backend's output against the exact reference of the same call.

    ``compare(out, "conv2d", x, w, b, stride=1, padding=1)`` computes the correctly rounded
    reference from the very inputs given (``op`` is "dot", "matmul", "linear", "conv1d",
    "conv2d" or the refkern function itself; the arguments are exactly the op's). ``actual`` is a
    numpy array or a torch tensor on any device, in the dtype the backend returned (the
    reference is rounded once to that dtype). With ``rtol``/``atol`` the report also says how
    many elements fail that tolerance, and how many of those are ordinary rounding anyway.

    The verdict and the bounds it rests on are described in :mod:`refkern.analysis.verdict`.
    """
    return _analyse(actual, op, args, kwargs, rtol, atol)[0]


def elements(actual, op, *args, **kwargs) -> dict:
    """Per-element arrays behind a Report, for plots: ``reference``, ``actual``, ``error``
    (|actual - reference|), ``bound`` (worst-case rounding bound), ``scale`` (probabilistic),
    ``magnitude`` (sum of |terms|), ``ulp`` (error in ulps) and the ``report`` itself."""
    return _analyse(actual, op, args, kwargs, None, None)[1]


def _analyse(actual, op, args, kwargs, rtol, atol):
    name = op_name(op)
    act, fmt, device = _actual(actual)
    if fmt.name not in FORMATS:
        raise TypeError(f"compare: actual must be a float16, bfloat16, float32 or float64 result; got {fmt.name}.")
    ev = evaluate(name, args, kwargs, out=fmt)
    if act.shape != ev.values.shape:
        raise ValueError(
            f"compare: actual.shape={act.shape} differs from the shape {name} gives for these inputs, "
            f"{ev.values.shape}; pass the same arguments that produced it."
        )

    def emulate(f, truncate, round_bias):
        return evaluate(name, args, kwargs, out=fmt, emulate=(f, truncate, round_bias))

    ref, mag = ev.values, ev.mag
    err = residual(act, ref)
    d = decide(act, ev, emulate, ev.in_prec, err)
    u_acc, u_out = working_units(fmt)
    ulps = _ulps(act, ref, fmt)
    r0 = d.rounding.ratios
    with np.errstate(divide="ignore", invalid="ignore"):
        prob = np.where(err == 0, 0.0, err / (np.sqrt(ev.n_terms) * u_acc * mag + 2 * u_out * np.abs(ref)))
        cond = np.where(mag == 0, 1.0, mag / np.abs(ref))
    exact = err == 0
    within = ~exact & (r0 <= 1.0)
    if d.verdict == "reduced-precision":
        reduced = ~exact & ~within & (d.chosen.ratios <= 1.0)
    else:
        reduced = np.zeros_like(exact)
    unexplained = ~(exact | within | reduced)
    if d.outliers is not None:  # bounded, but implausible as rounding and unlike the rest of the tensor
        unexplained = d.outliers
        within &= ~unexplained
        reduced = ~exact & ~within & ~unexplained  # explained by the hypothesis that leaves the outliers
    counts = {"exact": int(exact.sum()), "rounding": int(within.sum()), "reduced-precision": int(reduced.sum()),
              "mismatch": int(unexplained.sum())}  # fmt: skip
    key = r0 if d.verdict in ("mismatch", "rounding", "exact") else d.chosen.ratios
    if d.outliers is not None:
        key = prob
    eligible = (unexplained if d.verdict == "mismatch" else ~exact).reshape(-1)
    k = np.where(eligible, np.nan_to_num(key.reshape(-1), nan=np.inf), -1.0)
    n_top = min(10, int(eligible.sum()))
    top = np.argpartition(-k, n_top - 1)[:n_top] if n_top else np.zeros(0, np.int64)
    top = top[np.argsort(-k[top], kind="stable")]  # the ten worst, worst first
    worst = [tuple(int(i) for i in np.unravel_index(f, ref.shape)) for f in top] if ref.shape else [()] * len(top)
    details = [
        {
            "index": list(w),
            "actual": float(act.reshape(-1)[f]),
            "reference": float(ref.reshape(-1)[f]),
            "ulp": float(ulps.reshape(-1)[f]),
            "bound_ratio": float(r0.reshape(-1)[f]),
            "condition": float(cond.reshape(-1)[f]),
        }  # fmt: skip
        for w, f in zip(worst, top)
    ]
    where = {}
    if d.verdict == "mismatch" and ref.ndim:
        where = where_summary(np.argwhere(unexplained), ref.shape, ev.axes)
    tol = None
    if rtol is not None or atol is not None:
        rt, at = float(rtol or 0.0), float(atol or 0.0)
        with np.errstate(invalid="ignore"):
            failing = ~(err <= at + rt * np.abs(ref))
        tol = {"rtol": rt, "atol": at, "failing": int(failing.sum()),
               "failing_explained_by_rounding": int((failing & (r0 <= 1.0)).sum())}  # fmt: skip
    notes = []
    if d.outliers is not None and d.verdict == "mismatch" and not (r0[d.outliers] <= 1.0).all():
        notes.append(f"{int(d.outliers.sum())} element(s) break a precision that explains every other one")
    elif d.outliers is not None:
        notes.append(f"{int(d.outliers.sum())} element(s) lie within the worst-case bound but far beyond the "
                     "probabilistic scale that the rest of the tensor follows: implausible as rounding")  # fmt: skip
    if d.verdict == "reduced-precision" and d.chosen.name in ("tf32", "fp16"):
        others = [h.name for h in d.hypotheses[1:] if h.explains and h.name != d.chosen.name]
        if others:
            notes.append(f"{' and '.join(others)} explain it too; {d.chosen.name} fits best")
    finite = np.isfinite(cond)
    rep = Report(
        op=name,
        device=device,
        dtype=fmt.name,
        shape=tuple(ref.shape),
        n_terms=ev.n_terms,
        verdict=d.verdict,
        precision=d.precision,
        max_ulp=float(ulps.max()) if ulps.size else 0.0,
        max_bound_ratio=float(r0.max()) if r0.size else 0.0,
        max_prob_ratio=float(prob.max()) if prob.size else 0.0,
        worst=worst,
        worst_details=details,
        counts=counts,
        where=where,
        hypotheses={h.key: h.summary() for h in d.hypotheses},
        bound_ratios=precision_ratios(err, ev),
        condition={
            "median": float(np.median(cond)) if cond.size else 1.0,
            "max": float(cond[finite].max()) if finite.any() else float("inf"),
        },  # fmt: skip
        tolerance=tol,
        notes=notes,
    )
    bound0 = bound(mag, ref, ev.n_terms, u_acc, u_out)
    arrays = {"reference": ref, "actual": act, "error": err, "bound": bound0, "magnitude": mag, "ulp": ulps,
              "scale": np.sqrt(ev.n_terms) * u_acc * mag + 2 * u_out * np.abs(ref), "report": rep}  # fmt: skip
    return rep, arrays


def assert_matches_reference(actual, op, *args, allow=("exact", "rounding"), **kwargs) -> Report:
    """pytest helper: fail unless compare()'s verdict is in ``allow``.

    ``allow`` takes verdicts and precisions: ("exact", "rounding", "tf32") also accepts a
    reduced-precision result explained by TF32. The failure message reads like torch's
    assert_close, with refkern's lines added; the Report is returned on success.
    """
    __tracebackhide__ = True
    rep = compare(actual, op, *args, **kwargs)
    ok = rep.verdict in allow or (rep.verdict == "reduced-precision" and rep.precision in allow)
    if not ok:
        n = rep.n_elements
        fp = "fp64" if rep.dtype == "float64" else "fp32"
        what = f"{rep.verdict} ({rep.precision})" if rep.precision else rep.verdict
        if rep.verdict == "mismatch":
            bad, why = rep.counts["mismatch"], f"not explained by {fp} rounding"
        else:  # a reduced precision that allow= does not accept: it explains every inexact element
            bad = n - rep.counts["exact"]
            why = f"fit {rep.precision} inputs or accumulation better than {fp} rounding"
        lines = [
            f"{rep.op} on {rep.device} ({rep.dtype}) does not match the exact reference: {what}",
            f"Mismatched elements: {bad} / {n} ({100.0 * bad / max(n, 1):.1f}%) {why}",
        ]
        if rep.worst_details:
            w = rep.worst_details[0]
            lines.append(
                f"Worst: index {tuple(w['index'])}, {w['ulp']:.3g} ulp, {w['bound_ratio']:.3g}x the bound, "
                f"condition number {w['condition']:.3g}"
            )
        lines.append(str(rep))
        raise AssertionError("\n".join(lines))
    return rep
