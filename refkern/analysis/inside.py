"""Inside the worst-case envelope, the statistical test decides.

The worst-case envelope of :mod:`refkern.analysis.envelope` bounds every correct implementation: an
element beyond it is a mismatch for sure, and :func:`~refkern.analysis.verdict.decide_envelope` says so.
An element inside it is not thereby correct: the envelope grows like ``n u`` times a condition number
(infinite in bfloat16 at 32 features), and a layer_norm whose output is 10% too large sits inside it.
So for every op the envelope judges, the verdict is then the statistical test of the GEMMs
(:mod:`refkern.analysis.verdict`, :mod:`refkern.analysis.stats`) on the scale of
:mod:`refkern.analysis.noise`:

1. **rounding** when a member of the rounding family explains the output: every element within
   ``lam_el`` of its scale (``lam_el = level(number of elements)``, the element part of the false-alarm
   budget ``ALPHA``), and no group of elements along an axis where a group holds one element per row
   (:attr:`~refkern.analysis.noise.Noise.group_axes`) with a residual sum beyond ``lam_grp`` standard
   errors. The family is the standard formulas and, for the norms, the folded affine form (named in a
   note with the bits it loses when only it explains the output: a known formula, never a bug).
2. **reduced-precision** when rounding does not explain it and a precision hypothesis of the envelope
   (the inputs rounded to p, P rounded before P @ V, the output stored in p) explains it on the same
   test, centred on its own emulation, its envelope holding too, **with evidence a bug would not
   give**: at least one element that rounding does not explain lies where the two models' acceptance
   windows are disjoint, ``|c_p - ref| > lam_el (sigma_0 + sigma_p)``, on the side the precision
   predicts, or equals the precision's centre, or the precision stores in a coarser format than the
   result (float32 behind a float64 result, a softmax output stored in p) and the test refused every
   value off that grid: a bug next to a correct result lies off it. Between several, the best fit on
   one yardstick, rounding's (``sum min(z_0**2, lam_el**2)``, as :mod:`refkern.analysis.verdict` does:
   by fit, never by order).
3. **mismatch** otherwise, measured against rounding's standard model: the unexplained elements are
   those beyond ``lam_el`` and those of the failing groups; the envelope's named bugs, the one-pass
   variance and a stagnating sequential float32 sum are named when they fit (only to name a mismatch,
   never to excuse an element).

The report carries the power of the test: the smallest error of one element (``lam_el sigma``, in ulps
of the result at the reference: median and largest) that would have been flagged.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FORMATS
from refkern.analysis._healthy import _healthy
from refkern.analysis.hypotheses import Model
from refkern.analysis.noise import Noise, noise
from refkern.analysis.noise_rows import frozen
from refkern.analysis.noise_store import straddle_z
from refkern.analysis.passes import ulps_at
from refkern.analysis.row_bound import ROW_OWN
from refkern.analysis.statfit import INSIDE, StatFit
from refkern.analysis.stats import ALPHA, group_sums, level
from refkern.analysis.structure import group_failures, n_groups
from refkern.analysis.verdict import (
    Decision,
    _axis_scale_failures,
    _classes,
    _element_test_arrays,
    _row_scale_failures,
    _scale_failure,
    n_rows,
    overflowed,
)

__all__ = ["decide_inside", "StatFit", "INSIDE"]


_FULL = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _test(model, a, c, var, over, lam_el, lam_grp, axes, only, scale=1.0, grid=None, coherent=None,
          y=None, straddle=None, members=None, free=None) -> StatFit:  # fmt: skip
    """The element and group tests of one model of centre ``c`` and variance ``var`` (in units of values
    times ``scale``, a power of two: :attr:`~refkern.analysis.noise.Noise.scale`); with ``grid``, a
    value off that format's grid is refused (a model that stores its result in a coarser format); with
    ``coherent`` (:attr:`~refkern.analysis.noise.Noise.coherent`), the scale test of the GEMMs
    (:func:`~refkern.analysis.verdict._scale_failure`) on the exact result ``y``, its variance widened by
    the errors that several elements share; with ``straddle``, the element test of :func:`_straddle`; with
    ``members``, that of :func:`_members`; with ``free``, a thunk giving the failing rows of the certain
    test of :mod:`refkern.analysis.row_bound` (each row's shared error left free), groups like the others."""
    if np.ndim(scale) or scale != 1.0:
        a, c = a * scale, c * scale
    if straddle is not None:
        z, fails, keep, r, vk = _straddle(a, c, var, over, lam_el, straddle)
    else:
        v_el = var if members is None or members[0] is None else members[0]
        z, fails, keep, r, vk = _element_test_arrays(a, c, v_el, lam_el, grid)
        z[over], fails[over] = np.inf, True
    if members is not None:
        z, fails, keep, r, vk = _members(a, c, var, over, lam_el, members, z, fails, keep, r)
    nm = getattr(coherent, "members", None)
    if nm is not None and np.shape(a) and (fails & ~over).any():
        z, fails, keep, r, vk = _norm_members(a, c, var, over, lam_el, nm, coherent, z, fails)
    # the columns' scale: the whole family's where the elements' holds the rest's (RowShared.widen); without a fused
    # pass (softmax) asked for only where a column fails on the rest's (widening only adds variance)
    lazy = getattr(coherent, "widen", None) is not None and getattr(coherent, "fused", None) is None
    vg = vk if getattr(coherent, "widen", None) is None or lazy else _widened(vk, keep, coherent)
    st = coherent.stats(r, vk, keep, y) if hasattr(coherent, "stats") else None  # one pass for the scale tests
    groups = _columns(r, vk, keep, c, a, y, lam_grp, axes, only, vg, st)
    if lazy and groups:
        groups = _columns(r, vk, keep, c, a, y, lam_grp, axes, only, _widened(vk, keep, coherent), st)
    if groups and nm is not None and coherent.widen is None:  # columns of rows that share a member's shift
        groups = _member_columns(r, vk, keep, c if y is None else y, lam_grp, axes, only, coherent, groups)
    if coherent is not None:
        groups = groups + _scale_failure(r, vk, keep, y, lam_grp, coherent, st)
        if n_rows(coherent) > 1:
            groups = groups + _row_scale_failures(r, vk, keep, y, lam_grp, coherent, st)
    if free is not None:
        groups = groups + free()
    return StatFit(model, c, var, z, fails, groups, lam_el)


def _columns(r, vk, keep, c, a, y, lam_grp, axes, only, vg, st):
    """The group tests along the axes ``only``: each group's sum and scale test on the variances ``vg``."""
    if not only:
        return []
    groups = group_failures(r, vg, keep, c, a, axes, lam_grp, only) if _any_group(r, vg, keep, only, lam_grp) else []
    return groups + _axis_scale_failures(r, vk, keep, c if y is None else y, lam_grp, axes, only,
                                         None if st is None else st[5], c=c, a=a, vg=vg)  # fmt: skip


def _straddle(a, c, var, over, lam_el, st):
    """(z, fails, keep, r, vk) of the element test where the model's roundings before the final store are
    far finer than it (a half result of a float32 reduction): ``st = (xh, err, pre, out)`` (:attr:`~refkern.
    analysis.noise.Noise.straddle`). A correct kernel returns ``RN(v)`` with ``v = y + e``, ``e`` the error
    before the store, sub-Gaussian with ``sigma**2 = pre`` (:mod:`refkern.analysis.noise`), so the distance
    from ``y`` to the values that round to ``a`` is at most ``|e|``, and exceeds ``lam sigma`` with
    probability at most ``2 exp(-lam**2 / 2)``: the same budget as the standard test, whose ``2 (u_o y)**2``
    charges the store as noise of its own (a result one half-ulp off passes it at any level) where the
    store is one rounding to nearest, known exactly. ``xh`` is the exact result to float64 (``err``: its
    error); the group tests keep the residual ``a - c`` on ``var``, the stores included."""
    xh, err, pre, out = st
    z = np.empty(np.shape(a))
    flat = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (a, xh, err, pre))
    straddle_z(*flat, out.prec, out.emin, z.reshape(-1))
    z[over] = np.inf
    fails = z > lam_el
    with np.errstate(invalid="ignore"):
        keep = ~fails & np.isfinite(a) & np.isfinite(c)
        r = np.where(keep, a - c, 0.0)
    vk = np.where(keep, var, 0.0)
    return z, fails, keep, r, vk


def _members(a, c, var, over, lam_el, mb, z, fails, keep, r):
    """(z, fails, keep, r, vk) of the element test where members of the family are emulated (a float32
    sum's long chains, :mod:`refkern.analysis.noise_chains`; a half sum's thread partials stored in the
    result format, :func:`~refkern.analysis.noise_store.thread_members`): ``mb = (var_el, thunk, out)``.
    An element passes the first test (``z``, ``fails``: on ``var_el``, the scale of every other order, or
    the store's test) or one emulated member, whose last rounding is known exactly (``thunk()`` yields
    batches of centres, their errors and scales before it, (k,) + shape each, tested as :func:`_straddle`
    tests a store): the smallest z. Each member is one correct kernel with its own sub-Gaussian bound, so
    an element outside every one is refused at the level of the one that made it; the group tests keep
    the residual ``a - c`` on ``var``, the whole family's scale."""
    _, thunk, out = mb
    if (fails & ~over).any():
        for xh, err, pre in thunk():  # longest chains first: stop once every element is explained
            zm = np.empty(np.shape(xh))  # a batch's members in one pass
            flat = (np.ascontiguousarray(v, np.float64).reshape(-1) for v in (np.broadcast_to(a, zm.shape), xh,
                                                                                err, pre))  # fmt: skip
            straddle_z(*flat, out.prec, out.emin, zm.reshape(-1))
            np.minimum(z, zm.min(axis=0), out=z)
            z[over] = np.inf
            fails = z > lam_el
            if not (fails & ~over).any():
                break
        with np.errstate(invalid="ignore"):
            keep = ~fails & np.isfinite(a) & np.isfinite(c)
            r = np.where(keep, a - c, 0.0)
    return z, fails, keep, r, np.where(keep, var, 0.0)


def _norm_members(a, c, var, over, lam_el, nm, coh, z, fails):
    """(z, fails, keep, r, vk) of the element test where a float32 norm's row statistics are emulated
    (:class:`~refkern.analysis.noise_norm_chains.NormMembers`): an element that fails on the rest's scale
    passes on one member's, its statistic's shift taken out exactly (the smallest z)."""
    idx = np.flatnonzero((fails & ~over).reshape(-1))
    flat = [frozen(v, np.float64).reshape(-1) for v in (a, c, var)]
    zm = nm.element_z(*flat, idx)
    z = z.copy()
    zf = z.reshape(-1)
    zf[idx] = np.minimum(zf[idx], zm)
    fails = z > lam_el
    with np.errstate(invalid="ignore"):
        keep = ~fails & np.isfinite(a) & np.isfinite(c)
        r = np.where(keep, a - c, 0.0)
    return z, fails, keep, r, np.where(keep, var, 0.0)


def _member_columns(r, vk, keep, y, lam, axes, only, coh, groups):
    """The column tests (one element per row) where the rows' statistics are emulated members and the columns
    do not run on a scale that holds them (:func:`~refkern.analysis.noise_norm_chains.sequential`: on quantized
    rows the four sequential Welford means drift with one sign, so a column's sum over the rows adds their
    shifts): the groups, unless for one member (one kernel for every row) the residuals less its shifts,
    ``A l1 + B l2``, on the elements' variance less what it emulates, fail no column sum or column scale test."""
    nm = coh.members
    A, B, rem1, rem2 = nm.coef()
    X, mean, rr, W = nm.parts
    with np.errstate(all="ignore"):
        l1 = rr[:, None] * np.broadcast_to(W, X.shape)
        l2 = (np.asarray(X, np.float64) - mean[:, None]) * l1
        base = -(nm.smu2[:, None] * l1 * l1 + nm.srel2[:, None] * l2 * l2)
        for k in range(len(A)):
            if not np.all(np.isfinite(A[k])):
                continue
            rk_ = np.where(keep, r - coh.back(A[k][:, None] * l1 + B[k][:, None] * l2), 0.0)
            add = coh.back(base + rem1[k][:, None] * l1 * l1 + rem2[k][:, None] * l2 * l2)
            vk_ = np.where(keep, np.maximum(vk + add, 0.0), 0.0)
            if not _any_group(rk_, vk_, keep, only, lam) and not _axis_scale_failures(rk_, vk_, keep, y, lam, axes,
                                                                                      only):  # fmt: skip
                return [g for g in groups if g["ax"] is None]
    return groups


def _widened(vk, keep, coh):
    """The kept elements' variances on the whole family's shared scale (:attr:`~refkern.analysis.noise_rows.
    RowShared.widen`: ``d1 l1**2 + d2 l2**2`` per element added back), for the column tests."""
    d1, d2 = coh.widen
    X, mean, r, W = coh.members.parts
    with np.errstate(all="ignore"):
        l1 = r[:, None] * np.broadcast_to(W, X.shape)
        l2 = (np.asarray(X, np.float64) - mean[:, None]) * l1
        add = d1[:, None] * l1 * l1 + d2[:, None] * l2 * l2
    return np.where(keep, vk + coh.back(add), 0.0)


def _scale_tests_pass(st, lam, coh) -> bool:
    """Do the whole output's and each row's scale tests pass on the per-row sums ``st`` (:meth:`~refkern.
    analysis.noise_rows.RowShared.stats`), as :func:`~refkern.analysis.verdict._scale_failure` and
    :func:`~refkern.analysis.verdict._row_scale_failures` decide them before their equal-keys step (which
    only adds variance: a result these pass, they pass)?"""
    num, vv, _, extra, bound = st[:5]
    with np.errstate(all="ignore"):
        var = vv + extra
        tot = float(np.sum(var))
        tensor = abs(float(np.sum(num))) <= lam * math.sqrt(max(tot, 0.0)) + float(np.sum(bound))
        rows = ~(np.abs(num) > lam * np.sqrt(np.maximum(var, 0.0)) + bound) if n_rows(coh) else True
    if tensor and np.all(rows):
        return True
    # a float32 norm's emulated statistics: a row or the tensor passes on one member's (noise_norm_chains)
    got = coh.member_rows(st, None, lam) if getattr(coh, "members", None) is not None and len(st) > 6 else None
    if got is None:
        return False
    ok_rows, ok_tensor = got
    return bool((tensor or ok_tensor) and np.all(np.asarray(rows) | ok_rows))


def _any_group(r, vk, keep, only, lam) -> bool:
    """Does any group along the axes ``only`` fail, counting every element (the first test of
    :func:`~refkern.analysis.structure.group_failures`, which peels and recounts only then): on a healthy
    output the peeling's copies of r and vk are skipped."""
    for ax in only:
        g, v, _ = group_sums(r, vk, keep, ax)
        with np.errstate(all="ignore"):
            if np.any((g != 0) & ~(np.abs(g) <= lam * np.sqrt(v))):
                return True
    return False


def _at(scale, mask):
    """A scale (a float, or one per element) at the elements of ``mask``."""
    return scale[mask] if np.ndim(scale) else scale


def _ulp(ref, out):
    """The ulp of the result format at each reference value."""
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.where(np.isfinite(ref), np.abs(ref), 0.0))
    return np.ldexp(1.0, np.maximum(e - 1, out.emin) - out.prec + 1)


_POWER_SAMPLE = 1 << 16  #: elements (a seeded uniform sample) whose median gives the reported median power


def _power(var, ref, out, lam, scale=1.0, peak=None) -> dict:
    """The smallest error of one element that the element test flags, ``lam sigma``, in ulps of the result
    at the reference: the median over a seeded sample of at most :data:`_POWER_SAMPLE` finite elements
    (every element when there are fewer), and the largest over every finite element (``peak`` where a
    pass has computed it, :func:`_healthy_pass`). ``var`` is in units of values times ``scale``."""
    v, r = var.reshape(-1), ref.reshape(-1)
    sc = np.broadcast_to(np.asarray(scale, np.float64), ref.shape).reshape(-1)
    n = r.size
    if not n:
        return {"median_ulps": 0.0, "max_ulps": 0.0}
    idx = np.arange(n) if n <= _POWER_SAMPLE else np.sort(np.random.default_rng(0x5EED).choice(n, _POWER_SAMPLE,
                                                                                                   replace=False))
    with np.errstate(all="ignore"):
        rs = np.asarray(r[idx], np.float64)
        d = lam * np.sqrt(v[idx]) / (_ulp(rs, out) * sc[idx])
    d = d[np.isfinite(rs)]
    if peak is None:  # the operands read-only C float64 (noise_rows.frozen): one compiled signature
        peak = _power_max(frozen(v, np.float64), frozen(r, np.float64), frozen(sc), lam, out.prec, out.emin)
    return {"median_ulps": float(np.median(d)) if d.size else 0.0, "max_ulps": peak}


@jit(parallel=True)
def _power_max(v, r, sc, lam, prec, emin):
    """The largest ``lam sqrt(v) / sc`` in ulps of the format (prec, emin) at the finite ``r``
    (:func:`~refkern.analysis.passes.ulps_at`: exact power-of-two products, no frexp)."""
    best = 0.0
    for i in prange(r.size):
        y = r[i]
        d = ulps_at(y, y, lam * np.sqrt(v[i]) / sc[i], True, prec, emin)[0]
        best = max(best, d if y - y == 0.0 else 0.0)
    return best


def decide_inside(actual, ref, envs, d: Decision, name: str, args: dict, out, axes, nz: Noise | None = None
                  ) -> Decision:  # fmt: skip
    """The verdict for an op judged by envelopes, once :func:`~refkern.analysis.verdict.decide_envelope`
    has given ``d`` (module docstring). ``envs``: the envelope's hypotheses for the call (as
    :func:`~refkern.analysis.envelope.envelopes` gives them, lazy or run); ``axes``: the output axes' names;
    ``nz``: the scale when the caller has it (a gradient's, :mod:`refkern.analysis.noise_backward`), else
    the forward's of :func:`~refkern.analysis.noise.noise`."""
    from refkern.analysis.envelope import ONE_PASS, _rounded_args, storage

    x = np.asarray(ref)  # as it is held (float32 for fp16, bf16 and fp32 results); float64 below the quick path
    lam_el = level(x.size)
    nz = noise(name, args, x, out, lam_el) if nz is None else nz
    only = tuple(ax for ax in nz.group_axes if x.shape[ax] >= 2)
    # each group a sum and a scale test; the scale test one more, and each row's one more where rows share errors
    lam_grp = level(2 * n_groups(x.shape, only) + (nz.coherent is not None or bool(nz.precisions))
                    + n_rows(nz.coherent))  # a precision with shared errors of its own: its scale test  # fmt: skip
    thresholds = {"alpha": ALPHA, "element": lam_el, "group": lam_grp, "test": INSIDE, "envelope": 1.0}
    det = {"test": INSIDE, "envelope": d.detectable.get("element"), "group_axes": [axes[i] for i in only]}
    m0 = Model("rounding", None, d.fits[0].model.kind, out, d.fits[0].model.acc)
    sc = nz.scale
    coh = nz.coherent
    # a result rounding explains, tested in one pass over the values as they are held (no float64 copy of
    # the output, no residual arrays); any other goes through _test, which says what fails
    held = coh.held_stats if hasattr(coh, "held_stats") and coh.fused is not None and sc == 1.0 else None
    parts = getattr(coh.fused, "parts", None) if held is not None else None
    if parts is not None and getattr(coh.fused, "widen", None) is not None:
        parts = (*parts, *coh.fused.widen)  # the columns' tests on the whole family's shared scale
    r0 = _healthy(m0, actual, x, nz.var, lam_el, lam_grp, only, sc, out, parts) if (
        d.verdict == "rounding" and (coh is None or held) and nz.straddle is None and nz.members is None
    ) else None  # fmt: skip
    if r0 is not None and held is not None and not _scale_tests_pass(
            (*r0.held_rows[:5], None, *r0.held_rows[5:]) if r0.held_rows is not None else held(actual, x, nz.var),
            lam_grp, coh):  # fmt: skip
        r0 = None  # a scale test fails: _test says which
    if r0 is not None and nz.free is not None and nz.free.failures(actual):
        r0 = None  # a row's elements disagree beyond their own roundings (row_bound): _test says which
    if nz.straddle is not None:  # the store known exactly: flagged beyond lam sigma before it and half an ulp
        p = _power(nz.straddle[0], x, out, lam_el)
        det = {"element": {k: v + 0.5 for k, v in p.items()}, **det}
    else:  # with emulated members, an element off by this is flagged unless it is one of them
        v_el = nz.var if nz.members is None or nz.members[0] is None else nz.members[0]
        det = {"element": _power(v_el, x, out, lam_el, sc, peak=getattr(r0, "peak", None)), **det}
    if nz.free is not None:  # the certain test within rows flags one element off by 2 (b_j + min b): the finer
        # of the two (a median and a largest of elementwise minima are at most these)
        med, top = nz.free.detectable_ulps(x)
        el = det["element"]
        det = {**det, "element": {**el, "median_ulps": min(el["median_ulps"], med),
                                  "max_ulps": min(el["max_ulps"], top)}}  # fmt: skip
    if d.verdict == "exact":
        return _replace(d, det=det, thresholds=thresholds)
    if r0 is not None:
        return Decision("rounding", None, m0, d.classes, list(d.fits) + [r0], r0.z, [],  # decide_envelope's classes
                        list(d.structure), det, thresholds)  # fmt: skip
    a, x = np.asarray(actual, np.float64), np.asarray(x, np.float64)
    over = overflowed(a, x)
    acc = m0.acc
    st = (*nz.straddle[1](), nz.straddle[0], out) if nz.straddle is not None else None
    mb = None if nz.members is None else (*nz.members, out)
    free = None if nz.free is None else (lambda: nz.free.failures(a))
    r0 = _test(m0, a, x, nz.var, over, lam_el, lam_grp, axes, only, sc, coherent=coh, y=x, straddle=st, members=mb,
               free=free)  # fmt: skip
    fam = [r0]
    if not r0.explains:  # the other members of the family only where the standard formulas do not explain it
        members = [(key, text, v()) for key, text, v in nz.models]
        members = [(key, text, *(m if isinstance(m, tuple) else (m, coh))) for key, text, m in members if m is not None]
        fam += [_test(Model(f"rounding ({key})", None, text, out, acc), a, x, var, over, lam_el, lam_grp, axes,
                      only, sc, coherent=c, y=x, free=None if nz.free is None else (lambda k=key: nz.free.failures(
                          a, k))) for key, text, var, c in members]  # fmt: skip
    fits = list(d.fits) + fam
    exact = d.fits[0].state == 0
    notes = list(d.structure)
    if d.verdict == "mismatch":  # beyond the envelope: a mismatch for sure
        return _replace(d, z=r0.z, fits=fits, det=det, thresholds=thresholds)
    explaining = [f for f in fam if f.explains]
    if d.verdict == "rounding" and explaining:
        f = explaining[0]
        if f is not r0:
            text = _folded_note(f, name, args) if f.model.key == "rounding (folded affine form)" else (
                f"explained by {f.model.kind} only")  # fmt: skip
            notes.append({"kind": "algorithm", "text": text})
        return Decision("rounding", None, f.model, _classes(exact, 1), fits, f.z, [], notes, det, thresholds)
    # rounding does not explain it: a precision with evidence, by fit, else a mismatch
    bad0 = r0.unexplained()
    cands = []
    for e in envs:
        key, prec = e[0], e[1]
        if callable(e[2]) or prec is None or key == ONE_PASS:
            continue
        env_fit = next((g for g in d.fits if g.model.key == key), None)
        if env_fit is not None and not env_fit.explains:
            continue  # its own envelope fails: certainly not it
        if env_fit is not None:
            c, st, m = env_fit.centre, env_fit.model.storage, env_fit.model
        else:  # the envelope held for rounding, so its precisions were not run: run this one, and its envelope
            c, b = (e[2], e[3]) if e[2] is not None else e[3]()
            c = np.asarray(c, np.float64).reshape(x.shape)
            with np.errstate(invalid="ignore"):
                if not np.all((a == c) | (np.abs(a - c) <= np.asarray(b, np.float64).reshape(x.shape))):
                    continue  # its own envelope fails: certainly not it
            # the format it stores in, as decide_envelope's fits take it: float32 under a float64 result, and
            # p for an output stored in p (whose grid the test then requires)
            st = FORMATS[_FULL[prec]] if key == f"{prec} output" else storage(out, prec)
            m = Model(key, prec, key, st, st)
        c = np.asarray(c, np.float64).reshape(x.shape)
        grid = st if st.prec < out.prec else None  # its values lie on st's grid (fp32 behind float64, p)
        nz_p = nz if st is out else noise(name, args, c, st, lam_el)  # computed in st's working precision
        var_p = nz_p.var
        if key != prec:  # P rounded before P @ V, or the output stored in p: one more rounding to p
            var_p = var_p + 2.0 * (FORMATS[_FULL[prec]].u * c * nz_p.scale) ** 2
        # the certain test within rows, against the reference with this hypothesis's own element roundings
        free_p = None if nz.free is None else (lambda k=key: nz.free.failures(a, k))
        f = _test(m, a, c, var_p, over, lam_el, lam_grp, axes, only, nz_p.scale, grid, free=free_p)
        fits.append(f)
        if not f.explains:
            continue
        with np.errstate(all="ignore"):
            gap = np.abs(c - x)[bad0]
            s0, sp = np.sqrt(nz.var[bad0]) / _at(nz.scale, bad0), np.sqrt(var_p[bad0]) / _at(nz_p.scale, bad0)
            strong = gap > lam_el * (s0 + sp)
            toward = np.abs(a - c)[bad0] < np.abs(a - x)[bad0]
            # equal to its centre, or on a coarser grid that a bug next to a correct result is off: evidence
            sure = (a[bad0] == c[bad0]) | (grid is not None)
        if not (strong & toward | sure).any():
            notes.append({"kind": "blind", "text": f"{_label(m)} would explain it, but no element that rounding "
                          "does not explain lies where the two predict apart: a bug of that size and "
                          f"{_label(m)} cannot be told apart here"})  # fmt: skip
            continue
        if nz.members is not None and key == prec and grid is None:
            # rounding's element test emulates its long chains (a float32 sum's orders): so does the precision's,
            # on the inputs rounded to p, or it would be judged on the scale of the worst order, which rounding
            # is not (a float32 sum of 1e7 off by 32x the spread of correct kernels was named bf16: 2.8 from
            # the bf16 inputs' sum, inside 6 sigma of the scalar loop's order, far outside every emulated one).
            # Run only here, on what the wider scale accepted with evidence: each emulated member's scale is
            # the rest of that scale (the worst order's partial sums in it), so what the wider one refuses a
            # member accepts only with probability ALPHA
            nz_m = noise(name, _rounded_args(args, FORMATS[_FULL[prec]]), c, st, lam_el)
            if nz_m.members is not None:
                f = _test(m, a, c, var_p, over, lam_el, lam_grp, axes, only, nz_p.scale, grid,
                          members=(*nz_m.members, st), free=free_p)  # fmt: skip
                fits[-1] = f
                if not f.explains:
                    continue
        with np.errstate(all="ignore"):
            q = np.where(f.z == 0, 0.0, ((a - c) * nz.scale) ** 2 / nz.var)
        cands.append((float(np.sum(np.minimum(np.nan_to_num(q, nan=np.inf), lam_el**2))), f))
    for prec, key, text, v in nz.precisions:
        # same centre, a wider scale: the evidence a bug would not give is the scale test (a scale error is
        # not accumulator noise) and the group tests, passed on its scale; a precision with its own shared
        # errors gives (sigma**2, coherent, broad): weighed only where the float32 family leaves more than half
        # of the elements unexplained (the breakdown point: noise_scan's evidence), or where ``broad(a)`` names
        # the kernel the result equals bit for bit (scan_kernels: torch's CUDA scan emulated on the very inputs)
        if nz.coherent is not None:
            var_p, coh_p, broad = v(), coh, None
        else:
            got = v()
            if not isinstance(got, tuple):
                continue  # no scale test to run: nothing would tell it from a bug
            var_p, coh_p, broad = got
        same = broad(a) if callable(broad) else None
        if broad and same is None and not np.count_nonzero(bad0) * 2 > bad0.size:
            notes.append({"kind": "blind", "text": f"{key} would explain it, but the float32 family explains most "
                          f"elements: below the breakdown point a running sum in {prec} and a bug cannot be told "
                          "apart here"})  # fmt: skip
            continue
        f = _test(Model(key, prec, text if same is None else f"{text}; equal bit for bit to {same}", out, acc), a,
                  x, var_p, over, lam_el, lam_grp, axes, only, sc, coherent=coh_p, y=x)  # fmt: skip
        fits.append(f)
        if f.explains or same is not None:
            with np.errstate(all="ignore"):
                q = np.where(f.z == 0, 0.0, ((a - x) * nz.scale) ** 2 / nz.var)
            cands.append((-1.0 if same else float(np.sum(np.minimum(np.nan_to_num(q, nan=np.inf), lam_el**2))), f))
    if cands:
        cands.sort(key=lambda t: t[0])
        best, f = cands[0]
        band = level(max(len(cands) - 1, 1), ALPHA / 3) ** 2 / 2
        tie = sorted({g.model.precision for s, g in cands[1:] if s <= best + band and g.model.precision !=
                      f.model.precision})  # fmt: skip
        return Decision("reduced-precision", f.model.precision, f.model, _classes(exact, 2), fits, f.z, tie, notes,
                        det, thresholds)  # fmt: skip
    cls = _classes(exact, 1)
    cls[bad0] = 3
    notes += _mismatch_notes(r0, a, x, envs, name, args, out, over, bad0)
    return Decision("mismatch", None, r0.model, cls, fits, r0.z, [], notes, det, thresholds)


def _replace(d: Decision, *, det, thresholds, z=None, fits=None) -> Decision:
    return Decision(d.verdict, d.precision, d.model, d.classes, fits if fits is not None else d.fits,
                    d.z if z is None else z, d.alternatives, d.structure, det, thresholds)  # fmt: skip


def _label(m: Model) -> str:
    return f"{m.precision} inputs" if m.key == m.precision else m.key


def _folded_note(f: StatFit, name, args) -> str:
    from refkern.analysis._envelope_ops import layout

    text = f"explained by {f.model.kind} only"
    try:
        lay = layout(name, args, f.centre.shape)
        X = np.asarray(lay.X, np.float64)
        mean = X.mean(axis=1) if lay.given is None else np.broadcast_to(lay.given[0], (X.shape[0],))
        sd = X.std(axis=1) if lay.given is None else np.sqrt(np.broadcast_to(lay.given[1], (X.shape[0],)))
        with np.errstate(all="ignore"):
            bits = np.log2(np.abs(mean) / sd)
        bits = bits[np.isfinite(bits)]
        if bits.size and bits.max() > 0:
            text += (f": it loses about log2(|mean| / std) bits to cancellation, up to {bits.max():.1f} on these rows "
                     "(the standard form (x - mean) r w + b would not)")
    except (ValueError, TypeError):  # pragma: no cover - a layout of these arguments was made before
        pass
    return text


def _mismatch_notes(r0: StatFit, a, x, envs, name, args, out, over, bad) -> list:
    from refkern.analysis.envelope import ONE_PASS, ONE_PASS_TEXT
    from refkern.analysis.verdict import _overflow_note

    notes = []
    if over.any():
        notes.append(_overflow_note(over, []))
    n_el = int(r0.fails.sum())
    if n_el:
        notes.append({"kind": "elements", "text": f"{n_el} element{'s' if n_el > 1 else ''} beyond "
                      f"{r0.lam:.3g} sigma of a correct kernel's rounding (largest {r0.max_z:.3g} sigma)"})  # fmt: skip
    # the whole output's scale first, then rows', then the groups along an axis, most significant first
    rank = {"scale": 0, "row scale": 1, ROW_OWN: 1}
    for g in sorted(r0.groups, key=lambda g: (rank.get(g["axis"], 2) if g["ax"] is None else 2, -g["z"]))[:3]:
        if g["axis"] == ROW_OWN:  # the certain tests within rows; scan_bound's: a jump between neighbours
            notes.append({"kind": "group", "text": f"row {g['index']} (in the op's row layout): " + (
                f"an output differs from its predecessor by its input plus {g['mean']:.3g}, {g['z']:.3g} times the "
                "most that the roundings between neighbours of a correct scan allow (a lost carry or a jump in the "
                "scan, not rounding)" if g.get("increments") else f"its elements disagree among themselves by "
                f"{g['z']:.3g} times the most that a correct kernel's own roundings of each element allow, whatever "
                "the error its elements share (a scaled or distorted row, not rounding)")})  # fmt: skip
            continue
        if g["axis"] == "row scale":
            notes.append({"kind": "group", "text": f"row {g['index']} (in the op's row layout) follows its output: "
                          f"scaled by {1 + g['mean']:.6g} ({g['z']:.3g} standard errors), beyond what the errors "
                          "its elements share explain"})  # fmt: skip
            continue
        if g["ax"] is None:  # the scale test
            notes.append({"kind": "group", "text": f"the residuals follow the result: a scale error of {g['mean']:.3g} "
                          f"({g['z']:.3g} standard errors), not rounding noise"})  # fmt: skip
            continue
        if g.get("scale"):
            notes.append({"kind": "group", "text": f"{g['axis']} {g['index']} is scaled by {1 + g['mean']:.6g} "
                          f"({g['z']:.3g} standard errors)"})  # fmt: skip
            continue
        notes.append({"kind": "group", "text": f"{g['axis']} {g['index']} is off by {g['mean']:.3g} on average "
                      f"({g['z']:.3g} standard errors)"})  # fmt: skip
    for e in envs:
        if e[0] == ONE_PASS and not callable(e[2]):
            c, b = e[3]() if e[2] is None else e[2:]
            with np.errstate(all="ignore"):
                fit = np.abs(a - np.asarray(c, np.float64).reshape(x.shape)) <= np.asarray(b).reshape(x.shape)
            if fit[bad].all():
                notes.append({"kind": "algorithm", "text": ONE_PASS_TEXT})
        elif callable(e[2]) and e[2](a, bad, x):
            notes.append({"kind": "pattern", "text": e[1]})
    if name in ("sum", "mean") and out.prec <= 24:
        seq = _sequential_note(a, x, name, args, out, bad)
        if seq:
            notes.append({"kind": "algorithm", "text": seq})
    return notes


def _sequential_note(a, x, name, args, out, bad) -> str | None:
    """A sum or mean that a sequential float32 loop reproduces where rounding does not: it stagnates
    once the running sum outgrows the terms by 2**24 (pytorch#38716)."""
    from refkern.analysis._envelope_ops import layout

    lay = layout(name, args, x.shape)
    s = np.empty(lay.X.shape[0])
    _sequential32(np.ascontiguousarray(lay.X, np.float32), s)
    if name == "mean":
        s = s / max(lay.n, 1)
    s = lay.back(s)
    with np.errstate(all="ignore"):
        closer = np.abs(a - s) * 8 < np.abs(a - x)
    if bad.any() and closer[bad].all():
        return ("a sequential float32 running sum reproduces it: it stagnates once the sum outgrows the terms by "
                "2**24 (no correct kernel sums 10^7 terms in one float32 chain; use pairwise or blocked sums)")
    return None


@jit(parallel=False)
def _sequential32(X, out):
    """Per row: the left-to-right float32 running sum of a CPU scalar loop."""
    for i in range(X.shape[0]):
        s = np.float32(0.0)
        for j in range(X.shape[1]):
            s = np.float32(s + X[i, j])
        out[i] = s
