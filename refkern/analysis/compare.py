"""``refkern.compare`` and ``refkern.assert_matches_reference``."""

import numpy as np
from numba import prange

import refkern.ops as _ops
from refkern._arrays import converted_once, operand
from refkern._jit import jit
from refkern.accumulate.formats import FORMATS
from refkern.analysis.actual import actual as _actual  # (gradients.py reads these two here too)
from refkern.analysis.actual import actual_grad as _actual_grad  # noqa: F401
from refkern.analysis.bounds import bound1, precision_ratios, working_units
from refkern.analysis.envelope import OPS as ENVELOPE_OPS
from refkern.analysis.envelope import envelopes
from refkern.analysis.evaluate import _bind, op_name, problem
from refkern.analysis.inside import decide_inside
from refkern.analysis.integers import is_integer_result, judge_integers
from refkern.analysis.partials import reference_and_partials
from refkern.analysis.passes import median
from refkern.analysis.report import Report, envelope_hypotheses, errors, from_decision, passes, peak, worst_of
from refkern.analysis.ulp import ulp_errors
from refkern.analysis.verdict import decide
from refkern.analysis.verdict_envelope import decide_envelope
from refkern.engines.filter import threads_for
from refkern.scale._dispatch import computed, dask_in

__all__ = ["compare", "assert_matches_reference", "elements"]


def _ulps(actual, ref, fmt):
    return ulp_errors(actual, ref, fmt)


@jit(parallel=True)
def _figures(a, ref, mag, n, u_acc, u_out, arrays, err, bound0, r0, scale, prob, cond):
    """Per element, in one pass: |error| (0 for equal specials, inf for unequal ones), the worst-case
    bound B of :func:`~refkern.analysis.bounds.bound` and error / B, the noise scale
    sqrt(n) u M + 2 u |ref| and error / scale, and the condition number M / |ref|; the bound and
    the scale themselves only with ``arrays``."""
    for i in prange(a.size):
        x, y, m = a[i], ref[i], mag[i]
        if x == y or (x != x and y != y):
            e = 0.0
        else:
            e = abs(x - y)
            if e != e:
                e = np.inf
        err[i] = e
        b = bound1(m, y, n, u_acc, u_out)
        q = e / b if e > 0 else 0.0
        r0[i] = q if q == q else np.inf
        sc = np.sqrt(n) * u_acc * m + 2.0 * u_out * abs(y)
        if arrays:  # only elements() hands these out
            bound0[i] = b
            scale[i] = sc
        q = e / sc if e > 0 else 0.0
        prob[i] = q if q == q else np.inf
        cond[i] = 1.0 if m == 0.0 else m / abs(y)


_worst = worst_of  # (flat indices, multi-indices) of the worst elements: report.worst_of


def compare(actual, op, *args, rtol: float | None = None, atol: float | None = None, **kwargs) -> Report:
    """Analyse a backend's output against the exact reference of the same call.

    ``compare(out, "conv2d", x, w, b, stride=1, padding=1)`` computes the correctly rounded
    reference from the very inputs given (``op`` names a refkern op, "dot", "matmul", "linear",
    the convolutions, the reductions, norms and pools, "softmax", "log_softmax",
    "scaled_dot_product_attention", or is the refkern function itself; the arguments are exactly
    the op's). Products and convolutions are judged by the statistical test of
    :mod:`refkern.analysis.verdict`, the other ops by worst-case envelopes
    (:mod:`refkern.analysis.envelope`). ``actual`` is a
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
    return _analyse(actual, op, args, kwargs, None, None, arrays=True)[1]


def _analyse(actual, op, args, kwargs, rtol, atol, arrays=False):
    with converted_once():  # each input tensor converted once, however many readers it has
        return _analyse_once(actual, op, args, kwargs, rtol, atol, arrays)


def _analyse_once(actual, op, args, kwargs, rtol, atol, arrays):
    if dask_in(actual, *args, *kwargs.values()):  # Dask arrays: computed together, then judged
        actual, args, kwargs = computed(actual, args, kwargs)
    name = op_name(op)
    if is_integer_result(actual):  # integer arithmetic, defined to the bit (refkern.analysis.integers)
        return judge_integers(actual, name, args, kwargs), None
    judge = _ops.get(name).judge  # an error model with a judge of its own (refkern.ops.JUDGES)
    if judge is not None:
        return judge(actual, name, args, kwargs, rtol, atol, arrays)
    act, fmt, device = _actual(actual, held=name in ENVELOPE_OPS and not arrays)
    if fmt.name not in FORMATS:
        raise TypeError(f"compare: actual must be a float16, bfloat16, float32 or float64 result; got {fmt.name}.")
    if name in ENVELOPE_OPS:
        return _analyse_envelope(name, act, fmt, device, args, kwargs, rtol, atol, arrays)
    pr = problem(name, args, kwargs, out=fmt)
    # a GEMM's or a convolution's reference, magnitudes and order term from one pass (no GEMM of |A| |B|, and
    # none of A B where the filter's test decides): refkern.analysis.partials; the reference run otherwise
    fused = reference_and_partials(pr)
    ref, mag = fused if fused is not None else pr.run(want_mag=True)
    if act.shape != ref.shape:
        raise ValueError(
            f"compare: actual.shape={act.shape} differs from the shape {name} gives for these inputs, "
            f"{ref.shape}; pass the same arguments that produced it."
        )
    d = decide(act, pr, ref, mag)
    u_acc, u_out = working_units(fmt)
    ulps = _ulps(act, ref, fmt)
    err, r0, prob, cond = (np.empty(ref.shape) for _ in range(4))
    bound0, scale = (np.empty(ref.shape if arrays else 0) for _ in range(2))
    flat = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (act, ref, mag))
    with threads_for(ref.size):  # a few ns per element: one thread below PARALLEL_TERMS elements (1.6M: 4.8 ms of
        # CPU on one, 6.4 ms of CPU and 17 ms of wall time on two at load 15; ResNet-18's 21 in an audit: 0.16 s)
        _figures(*flat, pr.n_terms, u_acc, u_out, arrays, *(v.reshape(-1) for v in (err, bound0, r0, scale, prob,
                                                                                    cond)))  # fmt: skip
    eligible = (d.unexplained if d.verdict == "mismatch" else err > 0).reshape(-1)
    top, _ = _worst(eligible, d.z if d.verdict == "mismatch" else prob, ref.shape)
    lam = d.thresholds["element"]
    notes = []
    if d.verdict == "mismatch" and d.model is not None and not d.model.rounding:
        notes.append(f"measured against {d.model.kind}, which explains every other element")
    if d.verdict == "mismatch" and bool(np.any(d.unexplained)) and bool(np.all(r0[d.unexplained] <= 1.0)):
        notes.append("every unexplained element lies within the worst-case bound, but beyond what rounding "
                     "produces at this false-alarm rate: implausible as rounding, not impossible")  # fmt: skip
    if d.alternatives:
        notes.append(f"{' and '.join(sorted(set(d.alternatives)))} fit as well: indistinguishable on these inputs")
    finite = np.isfinite(cond)
    rep = from_decision(
        d, op=name, device=device, dtype=fmt.name, shape=ref.shape, n_terms=pr.n_terms, actual=act, reference=ref,
        top=top, at_worst={"ulp": ulps.reshape(-1)[top], "bound_ratio": r0.reshape(-1)[top],
                           "test_ratio": d.z.reshape(-1)[top] / lam, "condition": cond.reshape(-1)[top]},
        max_ulp=peak(ulps), max_bound_ratio=peak(r0), max_prob_ratio=peak(prob),
        hypotheses={f.model.key: f.summary(lam) for f in d.fits},
        bound_ratios=precision_ratios(err, pr.n_terms, mag, ref, fmt),
        condition={"median": median(cond) if cond.size else 1.0,
                   "max": float(cond[finite].max()) if finite.any() else float("inf")},
        error=err, rtol=rtol, atol=atol, axes=pr.axes, notes=notes,
    )  # fmt: skip
    arrays = {"reference": ref, "actual": act, "error": err, "bound": bound0, "magnitude": mag, "ulp": ulps,
              "scale": scale, "test_ratio": d.z / lam, "report": rep}  # fmt: skip
    return rep, arrays


def _f64(v):
    return np.asarray(v, np.float64)


def _reference_as(name, args, kwargs, fmt, held=False):
    """The op's exact reference, rounded once to ``fmt`` (the format the backend returned), float64;
    with ``held``, float32 where ``fmt`` is narrower than float64 (each value exact in it)."""
    from refkern import ops
    from refkern.accumulate.formats import FLOAT64

    bound = _bind(name, args, kwargs)
    fn = ops.get(name).reference
    res = fn(**bound)
    if isinstance(res, tuple):
        res = res[0]
    ref = _actual(res, held=True)[0]
    got = operand(res, "reference", "compare").fmt
    if got != fmt:  # the backend returned another dtype (autocast): round the exact value to it
        wide = dict(bound)
        key = next(iter(wide))
        if fmt.prec > got.prec:
            wide[key] = np.asarray(operand(wide[key], key, "compare").values, np.float64)
            if "dtype" in wide:
                wide["dtype"] = None
            res64 = fn(**wide)
            res64 = res64[0] if isinstance(res64, tuple) else res64
            ref = np.asarray(_actual(res64)[0], np.float64)
        from refkern.accumulate.formats import round_array

        ref = np.asarray(ref, np.float64)
        ref = round_array(np.ascontiguousarray(ref), *fmt.params) if fmt.prec < FLOAT64.prec else ref
    return np.asarray(ref, np.float32 if held and fmt.prec <= 24 else np.float64), bound


def _analyse_envelope(name, act, fmt, device, args, kwargs, rtol, atol, arrays):
    """compare() for the ops judged by worst-case envelopes (reductions, norms, pools).

    ``act`` and the reference stay float32 for fp16, bf16 and fp32 results (no float64 copy of
    either: at 10^7 elements the copies cost more than the verdict's pass): every value is exact in
    float32, the verdict's pass widens each element as it reads it, and every arithmetic on them
    here is in float64 (:func:`_f64`)."""
    ref, bound = _reference_as(name, args, kwargs, fmt, held=not arrays)
    if act.shape != ref.shape:
        raise ValueError(
            f"compare: actual.shape={act.shape} differs from the shape {name} gives for these inputs, "
            f"{ref.shape}; pass the same arguments that produced it."
        )
    envs, n = envelopes(name, bound, ref, fmt, lazy=True)
    axes = tuple(f"dim{i}" for i in range(ref.ndim))
    d = decide_inside(act, ref, envs, decide_envelope(act, ref, envs, fmt), name, bound, fmt, axes)
    ulps = _ulps(act, ref, fmt) if arrays else None  # else only the max and the worst elements' (no array)
    f0, lam = d.fits[0], d.thresholds["element"]
    stat = next((f for f in d.fits if f.model is d.model and hasattr(f, "lam")), None)  # the statistical model
    if stat is not None and d.verdict == "mismatch":  # the unexplained elements, largest z first
        top, _ = _worst(d.unexplained, d.z, ref.shape)
    else:  # the ten largest envelope ratios among the unequal elements, from the envelope's own pass
        top = f0.top[f0.state.reshape(-1)[f0.top] == 3] if d.verdict == "mismatch" else f0.top
    z = d.z.reshape(-1) if d.z is not None else np.zeros(ref.size)
    err = errors(act, ref, f0.state == 0) if rtol is not None or atol is not None or arrays else None
    notes = []
    if d.alternatives:
        notes.append(f"{' and '.join(sorted(set(d.alternatives)))} inputs fit as well: indistinguishable on these "
                     "inputs")  # fmt: skip
    blind = f0.blind
    if blind:  # n u > 1/8 in the working precision, or an interval that reaches a pole: no bound is claimed
        notes.append(f"no worst-case envelope holds for {blind} of {ref.size} elements (too many operations for the "
                     "working precision to bound): the statistical test alone judges them")  # fmt: skip
    hyps, ratios = envelope_hypotheses(d.fits)
    rep = from_decision(
        d, op=name, device=device, dtype=fmt.name, shape=ref.shape, n_terms=n, actual=act, reference=ref, top=top,
        at_worst={"ulp": ulp_errors(_f64(act.reshape(-1)[top]), _f64(ref.reshape(-1)[top]), fmt),
                  "bound_ratio": f0.ratio_at(top), "test_ratio": z[top] / lam, "condition": 1.0},
        max_ulp=f0.max_error_ulps, max_bound_ratio=f0.max_ratio, max_prob_ratio=peak(z) / lam, hypotheses=hyps,
        bound_ratios=ratios, error=err, rtol=rtol, atol=atol, axes=axes, notes=notes,
    )  # fmt: skip
    out = {"reference": ref, "actual": act, "error": err, "bound": d.fits[0].bound, "magnitude": np.abs(ref),
           "ulp": ulps, "scale": f0.bound, "test_ratio": f0.ratio, "report": rep} if arrays else None  # fmt: skip
    return rep, out


def assert_matches_reference(actual, op, *args, allow=("exact", "rounding"), **kwargs) -> Report:
    """pytest helper: fail unless compare()'s verdict is in ``allow``.

    ``allow`` takes verdicts and precisions: ("exact", "rounding", "tf32") also accepts a
    reduced-precision result explained by TF32. The failure message reads like torch's
    assert_close, with refkern's lines added; the Report is returned on success.
    """
    __tracebackhide__ = True
    rep = compare(actual, op, *args, **kwargs)
    if not passes(rep.verdict, rep.precision, allow):
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
