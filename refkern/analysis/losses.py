"""The yardstick of the losses (nll_loss, cross_entropy): the worst-case envelope of every correct
implementation of torch's composition, and the verdict on it (:mod:`refkern.analysis.verdict_envelope`).

A correct cross_entropy is torch's: ``logp = log_softmax(x)`` in the input's dtype, then nll_loss on
``logp`` (and, with label smoothing, ``-(logp * w).sum(class)``); every step is an operation of the
standard model with the working unit ``u`` (float32 for float16/bfloat16/float32 results, torch's opmath;
float64 for float64) and, for a half result, a store of its result to that format (``u_m = u_out``; 0
otherwise); ``ua = u + u_m``. First order, with ``gamma_k(u) = k u (1 + 4 k u) / (1 - k u)`` (infinite
beyond ``k u = 1/8``: nothing is claimed), for row r, target t, weight w, ``l_rc = -logp_rc`` and ``b_rc``
the log_softmax envelope of :mod:`refkern.analysis.envelope` (the computed ``logp`` within ``b_rc`` of
the exact one; 0 for nll_loss, whose log-probabilities are given):

* ``nll_r = w_t l_rt`` within ``e_nll = |w_t| b_rt + ua |nll_r|`` (the product, stored);
* ``s_r = sum_c w_c l_rc`` within ``e_s = sum_c |w_c| (b_rc + ua l_rc) + gamma_{C-1}(u) sum_c |w_c| l_rc + u_m
  |s_r|`` (the products stored, the sum in any order, stored);
* probability targets: ``q_r = sum_c w_c t'_rc l_rc``, ``t' = P (1 - eps) + eps / C`` computed (two
  operations and a constant), then the products by ``logp`` and by ``w``: ``gamma_5(ua)`` per term;
* a sum over the R rows of any of these: the rows' bounds, ``gamma_{R-1}(u)`` of the magnitudes, ``u_m``
  (stored); a mean: ``(e_N + |N / D| e_D) / (|D| - e_D) + ua |N / D|`` with ``e_D = gamma_{R-1}(u) sum
  |w_t| + u_m |D|`` (the sum of the counted weights);
* the smoothing: ``y = (1 - eps) N + (eps / C) S``: each constant rounded (u), each product and the sum
  ``ua``: ``(1 - eps) (e_N + (u + ua) |N|) + (eps / C) (e_S + (u + ua) |S|) + ua |y|``;
* the centre, the correctly rounded reference, is one store away from the exact value, and a half
  result computed in float32 is stored once more: ``u_out |y| + eta`` once (float32, float64) or twice
  (half), eta half the smallest subnormal.

Every bound is multiplied by 1.01 (the magnitudes are float64 evaluations within ``(C + R) 2**-52`` of
their values, and the second-order remainders of the products of ``(1 + d)`` factors). A half result
whose stored intermediate (a row's smoothing sum, a reduction's numerator or divisor) exceeds the
format's largest finite value may overflow in a correct implementation (torch's float16 cross_entropy
with label smoothing: ``smooth_loss.sum()`` is inf beyond 65504): no bound is claimed there.

What a bug looks like: an nll_loss that ignores ``ignore_index`` (the ignored rows counted with some
class) or a mean over every row instead of the counted weights moves the result by the ignored rows'
share, far beyond ``gamma_R``; that is a mismatch. An error below the envelope cannot be told from
rounding: the Report's ``detectable`` gives its size in ulps.
"""

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis.actual import actual_as
from refkern.kernels._loss_bound import logsoftmax_rows, pick_bounds, row_sums
from refkern.kernels._loss_call import loss_call
from refkern.kernels.loss import cross_entropy_values, gamma, log_sums, nll_values

__all__ = ["compare_call", "envelope"]

_SLACK = 1.01


def _units(fmt):
    """(u, u_m, ua): the working unit (float64's for a float64 result, else float32's: torch's opmath), the
    unit of a half result's stores (0 otherwise) and their sum (module docstring)."""
    u = FLOAT64.u if fmt is FLOAT64 else FLOAT32.u
    u_m = fmt.u if fmt.prec < FLOAT32.prec else 0.0
    return u, u_m, u + u_m


def _stores(y, fmt):
    """The centre's store(s) at the value y: ``u_out |y| + eta`` once (float32, float64) or twice (a half result
    computed in float32), eta half the smallest subnormal."""
    return (2 if fmt.prec < FLOAT32.prec else 1) * (fmt.u * np.abs(y) + 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1))


def _pointwise_reduced(lv, e, mag, red, fmt):
    """The envelope of a pointwise loss: per-element values ``lv`` within ``e`` (magnitudes ``mag``) reduced by
    ``red`` (a sum: ``gamma_{n-1}(u) sum mag + u_m |Y|``; a mean: its division, ``ua |y|``), times 1.01, plus the
    centre's store(s); NaN bounds infinite."""
    u, u_m, ua = _units(fmt)
    with np.errstate(all="ignore"):
        y = lv
        if red != "none":
            Y = float(lv.sum())
            e = float(e.sum() + gamma(max(lv.size - 1, 0), u) * float(mag.sum()) + u_m * Y)
            y = Y
            if red == "mean":
                y = Y / lv.size if lv.size else np.nan
                e = e / max(lv.size, 1) + ua * abs(y)
        b = np.asarray(e * _SLACK + _stores(y, fmt), np.float64)
    return np.where(np.isnan(b), np.inf, b)


def _reduce(vals, errs, u, u_m):
    """(value, bound) of the sum over rows of values within errs."""
    s = float(vals.sum())
    return s, float(errs.sum() + gamma(max(vals.size - 1, 0), u) * np.abs(vals).sum() + u_m * abs(s))


def _div(N, eN, D, eD, ua):
    with np.errstate(all="ignore"):
        y = N / D
        e = (eN + abs(y) * eD) / (abs(D) - eD) + ua * abs(y) if eD < abs(D) else np.inf
    return y, e


def envelope(c, fmt, ls=None) -> tuple[np.ndarray, list, bool]:
    """The bound per output element (module docstring), notes, and whether a stored intermediate may
    overflow (then an infinite or NaN result is accepted too); ``ls``: :func:`~refkern.kernels.loss.log_sums`
    of ``c.X`` when the caller has it."""
    u, u_m, ua = _units(fmt)
    top = fmt.max if hasattr(fmt, "max") else 2.0 ** fmt.emax * (2.0 - 2.0 ** (1 - fmt.prec))
    R, C = c.raw.shape
    w = np.ones(C) if c.weight is None else c.weight
    eps = c.label_smoothing
    notes = []
    with np.errstate(all="ignore"):
        valid = c.valid
        if c.op != "nll_loss":
            ls = log_sums(c.X) if ls is None else ls
            M, L = ls[0], ls[1]
            stats = logsoftmax_rows(c.X, ls, fmt)  # the log_softmax envelope, per row (b_rc on demand)
        over = False  # a stored intermediate beyond the format's range (half results)
        if c.probs is not None:
            q, terms_abs, b_sum = row_sums(c.X, M, L, stats, w, c.probs, eps, fmt).T
            eq = b_sum + gamma(5, ua) * terms_abs + gamma(C - 1, u) * terms_abs + u_m * np.abs(q)
            N, eN, S, eS, D, eD = q, eq, None, None, float(R), 0.0
            if c.reduction != "none":
                N, eN = _reduce(q, eq, u, u_m)
        else:
            t = np.where(valid, c.target, 0)
            wt = np.where(valid, w[t], 0.0)
            rows = np.arange(R)
            if c.op == "nll_loss":
                lt, bt = -np.asarray(c.raw[rows, t], np.float64), np.zeros(R)
            else:
                lt, bt = (M - c.X[rows, t]) + L, pick_bounds(c.X, stats, t, fmt)
            nll = np.where(valid, wt * lt, 0.0)
            e_nll = np.where(valid, np.abs(wt) * bt + ua * np.abs(nll), 0.0)
            N, eN = nll, e_nll
            S = eS = None
            if eps:
                s, mag, b_sum = row_sums(c.X, M, L, stats, w, None, 0.0, fmt).T
                s = np.where(valid, s, 0.0)
                es = b_sum + ua * mag + gamma(C - 1, u) * mag + u_m * np.abs(s)
                S, eS = s, np.where(valid, es, 0.0)
                over |= bool(u_m and np.any(np.where(valid, mag, 0.0) * (1 + 2 * C * ua) > top))
            wv = wt[valid]
            D, eD = float(wv.sum()), float(gamma(max(wv.size - 1, 0), u) * np.abs(wv).sum() + u_m * abs(wv.sum()))
            if c.reduction != "none":
                N, eN = _reduce(nll, e_nll, u, u_m)
                if S is not None:
                    over |= bool(u_m and np.abs(np.where(valid, mag, 0.0)).sum() * (1 + 2 * R * ua) > top)
                    S, eS = _reduce(S, eS, u, u_m)
        if c.reduction == "mean":
            over |= bool(u_m and abs(D) + eD > top)
            N, eN = _div(N, eN, D, eD, ua)
            if S is not None:
                S, eS = _div(S, eS, D, eD, ua)
        if S is not None:
            y = (1.0 - eps) * N + (eps / C) * S
            e = (1.0 - eps) * (eN + (u + ua) * np.abs(N)) + (eps / C) * (eS + (u + ua) * np.abs(S)) + ua * np.abs(y)
        else:
            y, e = N, eN
        y = np.asarray(y, np.float64)
        b = np.asarray(e, np.float64) * _SLACK + _stores(y, fmt)
        b = np.where(np.isnan(b), np.inf, b)
    over = bool(over or (u_m and c.reduction != "none" and np.abs(N).max(initial=0.0) > top))
    if over:
        notes.append(f"an intermediate stored in {fmt.name} (a sum over the rows or classes) exceeds its range: a "
                     "correct implementation may overflow there: an infinite or NaN result is accepted")  # fmt: skip
    return b.reshape(c.out_shape), notes, over


def _report(name, act, ref, b, fmt, device, n_terms, rtol, atol, notes):
    """The Report of a loss judged by its envelope ``b`` around the reference ``ref``
    (:func:`~refkern.analysis.verdict_envelope.decide_envelope`: exact, rounding or mismatch), built by
    :func:`refkern.analysis.report.from_decision` as every route's."""
    from refkern.analysis.report import errors, from_decision, peak, worst_of
    from refkern.analysis.ulp import ulp_errors
    from refkern.analysis.verdict_envelope import decide_envelope

    d = decide_envelope(act, ref, [("rounding", None, ref, b)], fmt)
    f0 = d.fits[0]
    err = errors(act, ref, f0.state == 0)
    with np.errstate(all="ignore"):
        ratio = np.where(f0.state == 0, 0.0, err / b)
    ulps = ulp_errors(act, ref, fmt)
    top, _ = worst_of(f0.state == 3 if d.verdict == "mismatch" else err > 0, ratio, ref.shape)
    mx = peak(ratio)
    return from_decision(
        d, op=name, device=device, dtype=fmt.name, shape=ref.shape, n_terms=n_terms, actual=act, reference=ref,
        top=top, at_worst={"ulp": ulps.reshape(-1)[top], "bound_ratio": ratio.reshape(-1)[top],
                           "test_ratio": ratio.reshape(-1)[top], "condition": 1.0},
        max_ulp=peak(ulps), max_bound_ratio=mx, max_prob_ratio=mx,
        hypotheses={"rounding": {"explains": f0.explains, "max_ratio": mx}},
        bound_ratios={"rounding": {"worst_case": mx}}, error=err, rtol=rtol, atol=atol,
        axes=tuple(f"dim{i}" for i in range(ref.ndim)), notes=notes,
    )  # fmt: skip


def pointwise_envelope(op, x, t, fmt, red) -> np.ndarray:
    """The envelope of mse_loss and l1_loss: per element ``l = (x - t)**2`` within ``gamma_3(ua) l`` (the
    difference, the square, a store) or ``|x - t|`` within ``gamma_2(ua) l``; a sum adds ``gamma_{n-1}(u) sum l +
    u_m |y|``, a mean its division ``ua |y|``; then the centre's store(s) (module docstring's units)."""
    ua = _units(fmt)[2]
    with np.errstate(all="ignore"):
        lv = np.abs(x - t) ** (2 if op == "mse_loss" else 1)
        e = gamma(3 if op == "mse_loss" else 2, ua) * lv
    return _pointwise_reduced(lv, e, lv, red, fmt)


def binary_envelope(op, x, y, w, pw, fmt, red) -> np.ndarray:
    """The envelope of binary_cross_entropy (torch's CPU: ``(y - 1) max(log1p(-p), -100) - y max(log p, -100)``,
    times w) and binary_cross_entropy_with_logits (``(1 - y) x + ((pw - 1) y + 1) (log1p(e**-|x|) + max(-x,
    0))``, times w). Each library call (log, log1p, exp) within 1 ulp of the working format (SLEEF u10,
    glibc): ``2u`` of its result, and log1p's argument ``e**-|x|`` within ``2u`` of itself (``2u t`` more);
    every other step (the products by y, 1 - y, pw - 1, w; the additions; the store) one rounding ``ua``,
    at most 8 per element: ``gamma_8(ua)`` of the element's terms' magnitudes ``|a| + |b1 f1| + |b2 f2|`` plus
    ``|b| (2u |f| + u + 2u t)`` for each log. A log within its error of the clamp -100 may be clamped or not:
    ``|b| |f + 100|`` more. Then a sum, a mean and the centre's store(s) as for mse_loss."""
    from refkern.kernels.loss_binary import binary_bound_terms

    u, u_m, ua = _units(fmt)
    lv, e, mag = binary_bound_terms(op, x, y, w, pw, u, float(gamma(8, ua)))  # per element, one jitted pass
    b = _pointwise_reduced(lv, e, mag, red, fmt)
    return b.reshape(np.shape(x)) if red == "none" else b.reshape(())


def _binary_call(actual, name, args, kwargs, rtol, atol, arrays):
    from refkern.analysis.evaluate import _bind
    from refkern.kernels.loss_binary import binary_call, binary_values

    x, y, w, pw, fmt, _, red = binary_call(name, **_bind(name, args, kwargs))
    shape = x.shape if red == "none" else ()
    a64, device = actual_as(actual, name, shape, fmt)
    ref = np.asarray(binary_values(name, x, y, w, pw, fmt, red), np.float64).reshape(shape)
    b = binary_envelope(name, x, y, w, pw, fmt, red).reshape(shape)
    note = f"{name} judged by the worst-case envelope of torch's formula (refkern.analysis.losses)"
    rep = _report(name, a64, ref, b, fmt, device, int(x.size), rtol, atol, [note])
    return rep, ({"reference": ref, "actual": a64, "bound": b, "report": rep} if arrays else None)


def _pointwise_call(actual, name, args, kwargs, rtol, atol, arrays):
    from refkern.analysis.evaluate import _bind
    from refkern.kernels.loss_pointwise import pointwise_call, pointwise_values

    x, t, fmt, _, red = pointwise_call(name, **_bind(name, args, kwargs))
    shape = x.shape if red == "none" else ()
    a64, device = actual_as(actual, name, shape, fmt)
    ref = np.asarray(pointwise_values(name, x, t, fmt, red), np.float64).reshape(shape)
    b = np.asarray(pointwise_envelope(name, x, t, fmt, red)).reshape(shape)
    rep = _report(name, a64, ref, b, fmt, device, int(x.size), rtol, atol,
                  [f"{name} judged by the worst-case envelope of its roundings (refkern.analysis.losses)"])  # fmt: skip
    return rep, ({"reference": ref, "actual": a64, "bound": b, "report": rep} if arrays else None)


def compare_call(actual, name, args, kwargs, rtol=None, atol=None, arrays=False):
    """:func:`refkern.compare` for a loss: (Report, per-element arrays or None)."""
    from refkern.analysis.evaluate import _bind

    if name in ("mse_loss", "l1_loss"):
        return _pointwise_call(actual, name, args, kwargs, rtol, atol, arrays)
    if name.startswith("binary_cross_entropy"):
        return _binary_call(actual, name, args, kwargs, rtol, atol, arrays)
    c = loss_call(name, **_bind(name, args, kwargs))
    a64, device = actual_as(actual, name, c.out_shape, c.fmt)
    ls = None if name == "nll_loss" else log_sums(c.X)  # shared by the reference and the envelope
    ref = np.asarray(nll_values(c) if name == "nll_loss" else cross_entropy_values(c, ls), np.float64)
    ref = ref.reshape(c.out_shape)
    b, notes, over = envelope(c, c.fmt, ls)
    spilled = over & ~np.isfinite(a64) & np.isfinite(ref)
    if spilled.any():  # the intermediate's overflow: inf or NaN is what such a correct implementation returns
        ref = np.where(spilled, a64, ref)
    n_terms = c.C if c.reduction == "none" else c.raw.size
    rep = _report(name, a64, ref, b, c.fmt, device, int(n_terms), rtol, atol, notes)
    rep.notes = rep.notes + [
        f"{name} judged by the worst-case envelope of torch's composition (refkern.analysis.losses): an error below "
        f"it, median {rep.detectable['element']['median_ulps']:.3g} ulp here, cannot be told from rounding"]
    k = int(np.count_nonzero(spilled))
    if k and rep.verdict in ("exact", "rounding"):  # an overflow of a correct implementation is no exact result
        rep.verdict = "rounding"
        rep.counts = {**rep.counts, "exact": rep.counts["exact"] - k, "rounding": rep.counts["rounding"] + k}
    return rep, ({"reference": ref, "actual": a64, "bound": b, "report": rep} if arrays else None)


def grad_bound(c, G, ref_rows) -> np.ndarray:
    """The envelope (R, C) of nll_loss's gradient (row layout): at each counted row's target ``y = -w_t g``
    (a product: ``gamma_1(ua)``) or, for "mean", ``-w_t g / D`` with D the forward's sum of the counted
    weights as it stored it (``e_D = gamma_{R-1}(u) sum |w_t| + u_m |D|``, the backward reads that stored
    value) and a division: ``|y| (e_D / (|D| - e_D) + gamma_2(ua))``; plus the centre's store(s). Every
    other element is 0, bit for bit."""
    fmt = c.fmt
    u, u_m, ua = _units(fmt)
    R, C = c.raw.shape
    b = np.zeros((R, C))
    rows = np.flatnonzero(c.valid)
    if not rows.size:
        return b
    t = c.target[rows]
    y = np.abs(ref_rows[rows, t])
    with np.errstate(all="ignore"):
        if c.reduction == "mean":
            w = np.ones(C) if c.weight is None else c.weight
            wt = w[t]
            D = abs(float(wt.sum()))
            eD = float(gamma(max(rows.size - 1, 0), u) * np.abs(wt).sum() + u_m * D)
            e = y * ((eD / (D - eD) if eD < D else np.inf) + gamma(2, ua))
        else:
            e = y * gamma(1, ua)
        e = e * _SLACK + _stores(y, fmt)
    b[rows, t] = np.where(np.isnan(e), np.inf, e)
    return b


def grad_report(got, g, a, who, rtol=None, atol=None):
    """compare_backward's Report for the gradient of nll_loss's input."""
    from refkern.analysis.actual import actual_grad
    from refkern.kernels.loss_grad import _back, nll_grad, nll_grad_call

    c, G = nll_grad_call(g, a, who)
    a64, device = actual_grad(got, "input", c.fmt, who)
    ref_rows = nll_grad(c, G)
    b = _back(c, grad_bound(c, G, ref_rows))
    ref = np.asarray(_back(c, ref_rows), np.float64)
    a64 = a64.reshape(ref.shape)
    notes = ["the gradient of nll_loss judged by its worst-case envelope (refkern.analysis.losses): -w_t g (over the "
             "stored sum of the counted weights for a mean) at each counted target, 0 bit for bit elsewhere"]
    return _report("nll_loss backward (input)", a64, ref, b, c.fmt, device, 1, rtol, atol, notes)


def mse_grad_report(got, g, a, who, rtol=None, atol=None):
    """compare_backward's Report for the gradient of mse_loss's input. torch computes ``norm (x - t) g`` with
    ``norm = 2 / n`` (mean) or 2, a float64 constant converted to the working precision: a conversion, a
    difference, two products and the store, each one rounding: ``gamma_4(ua) |y|`` (times 1.01), plus the
    centre's store(s)."""
    from refkern.analysis.actual import actual_grad
    from refkern.kernels.loss_grad import mse_grad, mse_grad_call

    x, t, G, fmt, _, red = mse_grad_call(g, a, who)
    a64, device = actual_grad(got, "input", fmt, who)  # its shape: compare_backward checked it
    ref = mse_grad(x, t, G, fmt, red)
    with np.errstate(all="ignore"):
        b = gamma(4, _units(fmt)[2]) * np.abs(ref) * _SLACK + _stores(ref, fmt)
    a64 = a64.reshape(ref.shape)
    note = "the gradient of mse_loss judged by its worst-case envelope (refkern.analysis.losses)"
    return _report("mse_loss backward (input)", a64, ref, np.where(np.isnan(b), np.inf, b), fmt, device, 1, rtol,
                   atol, [note])  # fmt: skip


def bce_grad_report(got, g, a, who, rtol=None, atol=None):
    """compare_backward's Report for the gradient of binary_cross_entropy's input. torch computes ``g (p - y) /
    max((1 - p) p, eps)`` (eps 1e-12 as a float32), times w, over n for a mean: at most 7 roundings (1 - p,
    the product, p - y, by g, the division, by w, by 1/n) and the store: ``gamma_7(ua) |y|`` (times 1.01);
    where the computed ``(1 - p) p`` may fall on the other side of eps (within ``gamma_2(ua)`` of it) the
    clamped value is accepted too; plus the centre's store(s)."""
    from refkern.analysis.actual import actual_grad
    from refkern.kernels.loss_grad import BCE_EPS, bce_grad, bce_grad_call

    p, y, w, G, fmt, _, red = bce_grad_call(g, a, who)
    a64, device = actual_grad(got, "input", fmt, who)  # its shape: compare_backward checked it
    ref = bce_grad(p, y, w, G, fmt, red)
    ua = _units(fmt)[2]
    with np.errstate(all="ignore"):
        q = p * (1 - p)
        n = p.size if red == "mean" else 1
        near = np.abs(q - BCE_EPS) <= gamma(2, ua) * q
        other = np.where(q > BCE_EPS, G * w * (p - y) / BCE_EPS, G * w * (p - y) / q) / n
        b = gamma(7, ua) * np.abs(ref) * _SLACK + np.where(near, np.abs(other - ref), 0.0)
        b = b + _stores(ref, fmt)
    a64 = a64.reshape(ref.shape)
    note = "the gradient of binary_cross_entropy judged by its worst-case envelope (refkern.analysis.losses)"
    return _report("binary_cross_entropy backward (input)", a64, ref, np.where(np.isnan(b), np.inf, b), fmt, device,
                   1, rtol, atol, [note])  # fmt: skip
