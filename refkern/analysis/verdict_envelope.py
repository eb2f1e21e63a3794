"""The verdict of an op judged by envelopes (a mean, a norm, a softmax, attention, a gradient): which
hypothesis explains a backend's output, every element tested against its envelope in one blocked pass
(:func:`decide_envelope`; :mod:`refkern.analysis.verdict` decides the sums of products and holds the
:class:`Decision` both return)."""

import functools
from dataclasses import dataclass

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import round_to
from refkern.analysis.hypotheses import Model
from refkern.analysis.noise_rows import frozen
from refkern.analysis.passes import (
    chunks,
    insert_top,
    median_bracket,
    median_in_bracket,
    median_max_bound_ulps,
    merge_top,
    ulps_at,
)
from refkern.analysis.verdict import Decision, _classes, _overflow_note, overflowed

__all__ = ["decide_envelope"]


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
        return np.array([0.0 if self.state.reshape(-1)[i] == 0 else _ratio_one(float(a[i]), float(c[i]),
                         b[i if b.size == a.size else 0], *params) for i in flat], np.float64)  # fmt: skip

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
        c, b = _held(mid), _bound_held(bound)
        if c.dtype != a.dtype:  # one format for both (exact widening): the passes compile once per format, not per mix
            a, c = a.astype(np.float64), c.astype(np.float64)
        params = (st is not out, *st.params, key == ONE_PASS)
        counts, tcnt = np.zeros((nch, 5), np.int64), np.zeros(nch, np.int64)
        tidx, tval = np.zeros((nch, _TOP), np.int64), np.zeros((nch, _TOP))
        lo, hi, room = median_bracket(c, np.broadcast_to(b, c.shape), out.prec, out.emin) if ulps and (
            b.size > 1 or (b.size == 1 and b[0] < np.inf)) else (0.0, 0.0, 0.0)  # fmt: skip
        # a bracket of one value needs no kept value (median_in_bracket): one slot each, overwritten
        kept = np.empty((nch, (int(room * (-(-a.size // nch))) + 64 if lo != hi else 1) if ulps else 0))
        n_kept, n_below, peak, uerr = np.zeros(nch, np.int64), np.zeros(nch, np.int64), np.zeros(nch), np.zeros(nch)
        vacuous = b.size == 1 and b[0] == np.inf and not params[0] and a.size  # the norms' bound beyond n u > 1/8
        if vacuous:
            _vacuous_pass(a, c, params[-1], out.prec, out.emin, state, counts, tidx, tval, tcnt, uerr)
            peak[:] = np.inf
        else:
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
            f.median_ulps = np.inf if vacuous else median_in_bracket(kept, n_kept, n_below, a.size, lo, hi)
            if f.median_ulps is None:  # outside the sampled bracket: two passes of its own
                f.median_ulps = median_max_bound_ulps(np.asarray(c, np.float64), np.ascontiguousarray(
                    np.broadcast_to(b, c.shape)), out.prec, out.emin)[0]  # fmt: skip
            f.max_ulps, f.max_error_ulps = (float(peak.max()), float(uerr.max())) if a.size else (0.0, 0.0)
        fits.append(f)
    return fits


def _bound_held(bound):
    """A bound flat and contiguous in float64, read-only (one compiled pass, not one per writeable flag: 3 in a
    cold CI run); one value where it is one value broadcast (the norms' infinite envelope:
    :func:`~refkern.analysis.envelope._norm_envelope`), which the passes read for every element."""
    b = np.asarray(bound)
    if b.size > 1 and not any(b.strides):
        return frozen(np.full(1, b.reshape(-1)[0], np.float64))
    return frozen(b, np.float64).reshape(-1)


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
    in those ulps. ``a`` and ``c`` are float32 or float64, each element widened as it is read; ``bound``
    has a's size, or one value for every element.

    Each chunk goes by blocks of :data:`_BLOCK` elements in two loops: the first computes every
    element's figures with selects and arithmetic only (the equal/unequal bit of real outputs is a
    coin flip, and a branch on it, or on the bracket, costs more than the whole loop), keeping each
    element's top-list key and bound in ulps in the block's buffers; the second makes the rare
    inserts into the top list and stores the values inside the median's bracket. The maxima are kept
    as the bits of non-negative floats, which order as integers."""
    n = a.size
    nch = counts.shape[0]
    keep_ratio = ratio.size == n
    full = bound.size == n  # else one bound for every element
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
                x, y, b = np.float64(a[i]), np.float64(c[i]), bound[i if full else 0]  # float32 widened, exactly
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


@jit(parallel=True, error_model="numpy")
def _vacuous_pass(a, c, one_pass, oprec, oemin, state, counts, tidx, tval, tcnt, uerr):
    """:func:`_envelope_pass` where the bound is +inf for every element and no grid is required (the rounding
    envelope of a norm once n u > 1/8: :func:`~refkern.analysis.envelope._norm_envelope`), with the same
    outputs but the ratio array: an unequal element's ratio ``|a - c| / inf`` is 0 (state 2, vacuous) where the
    difference is finite and inf (state 3, beyond) where it is not (one NaN, or infinities that differ), but
    for ``one_pass``'s NaN output, which is within; every finite centre counts as blind; the bound in ulps is
    inf everywhere (its median and largest, which the caller sets), and the largest error in ulps is
    :func:`~refkern.analysis.passes.ulps_at`'s. The top list takes the keys in the same order as the full
    pass's (-1 equal, 0 within, the largest float beyond), so it holds the same elements. No ratio, bracket
    or kept values: what the full pass spends on a bound that says nothing. By blocks of :data:`_BLOCK` in two
    loops as the full pass (selects only in the first, the rare inserts in the second): half the time of one
    loop that branches on the equal/unequal coin flip (layer_norm (32, 512, 768) bf16, one thread: 0.093 s ->
    0.050 s)."""
    n = a.size
    nch = counts.shape[0]
    for ch in prange(nch):
        n0 = n2 = n3 = n4 = m = 0
        ue = 0
        ti, tv = tidx[ch], tval[ch]
        keys = np.empty(_BLOCK)
        thr = -np.inf
        start, stop = ch * n // nch, (ch + 1) * n // nch
        for s in range(start, stop, _BLOCK):
            size = min(_BLOCK, stop - s)
            for t in range(size):
                i = s + t
                x, y = np.float64(a[i]), np.float64(c[i])
                sm = (x == y) | ((x != x) & (y != y))
                far = (not abs(x - y) < np.inf) & (not (one_pass & (x != x)))
                ue = max(ue, np.float64(ulps_at(x, y, np.inf, sm, oprec, oemin)[1]).view(np.int64))
                us = not sm
                s3, s2 = far & us, us & (not far)
                state[i] = np.int8(us) + np.int8(s2) + np.int8(2 * s3)
                n0 += sm
                n2 += s2
                n3 += s3
                n4 += y - y == 0.0
                keys[t] = -1.0 if sm else (_BIG if far else 0.0)
            for t in range(size):
                key = keys[t]
                if key > thr:
                    m = insert_top(ti, tv, m, s + t, key)
                    thr = tv[m - 1] if m == ti.size else -np.inf
        counts[ch, 0], counts[ch, 1], counts[ch, 2] = n0, (stop - start) - n0 - n2 - n3, n2
        counts[ch, 3], counts[ch, 4] = n3, n4
        tcnt[ch] = m
        uerr[ch] = np.int64(ue).view(np.float64)


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
