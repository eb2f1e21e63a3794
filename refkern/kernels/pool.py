"""``refkern.avg_pool1d/2d``, ``max_pool1d/2d``, ``adaptive_avg_pool1d/2d``: torch's poolings, exact.

Names, signatures, output sizes, divisors and argument checks are torch.nn.functional's.

* An average is the exact sum of the window's input elements divided by an integer divisor,
  real-valued, rounded once to the input's dtype (to nearest, ties to even; subnormal results;
  overflow to inf only when the real quotient rounds beyond the largest finite number).
* A maximum is a selection of an input element: bit-exact by definition.

How an average is rounded (Ziv's strategy; every tier exact in what it returns):

1. Fast: the window is summed in float64 with TwoSum (Sum2 of Ogita, Rump and Oishi, "Accurate
   sum and dot product", SIAM J. Sci. Comput. 26(6), 2005, doi:10.1137/030601818): the pair
   ``(s, c)`` satisfies ``|s + c - S| <= gamma_{n-1}**2 * sum|x|`` (Prop. 4.5's proof), with
   ``gamma_n = n u / (1 - n u)``, ``u = 2**-53``. The quotient by the divisor (for float64 results
   the double-word :func:`refkern.accumulate.dd.dd_div_fp`, relative error <= 3 u**2; for narrower
   ones one float64 division, <= 2 u) and that bound bracket the real value; when the bracket
   rounds to one format value, that value is the answer.
2. Exact: a midpoint ``m`` inside a narrow bracket is decided by the sign of ``S - m * divisor``,
   which one FMA and one comparison give exactly (:func:`_side_dw`) when S is known exactly as a
   double-word: at once when every TwoSum error of the first pass was zero (``S = s``, the usual
   case for narrow inputs); otherwise (cancellation, or a float64 sum that is not exact) the window
   is summed again with TwoSum on the running sum and on its error, and when every error of the
   error vanishes, ``S = s + c`` exactly and the bracket is rebuilt from it. Midpoints are common:
   the average of 2 or 4 values of one binade is a midpoint half or a quarter of the time; of 9
   float32 values, one or two in a hundred.
3. Superaccumulator: windows whose exact sum is not a double-word (exponents more than ~100 bits
   apart), or that hold NaN or inf, are summed exactly in the superaccumulator; a tie is decided
   by the sign of ``S - m * divisor`` accumulated there.
4. Rational: a float64 window whose exact sum lies outside ``[2**-900, 2**900]``, where the
   double-word error bounds stop holding, is rounded from Python Fractions.

:data:`PATHS` counts the elements each tier decided since import (a diagnostic).

Signed zeros follow torch's CPU kernels, which add the quotient to a zeroed output (avg_pool)
or start the window sum at +0 (adaptive): an avg_pool output that is zero is always +0 (a
window of -0 values, a cancelling window, a tiny negative average that rounds to zero, a
negative ``divisor_override``); an adaptive average is +0 for an exactly zero sum and keeps the
sign of a nonzero average that rounds to zero.
"""

from collections import Counter
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import is_tensor, operand
from refkern._jit import jit
from refkern.accumulate._bits import bits, fma, pow2
from refkern.accumulate.dd import EPS, SAFE_HI, SAFE_LO, dd_div_fp
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import NNAN, NNINF, NPINF, SIZE, acc_add_float, acc_add_product, acc_init, acc_round
from refkern.accumulate.ziv import acc_dd, round_fraction
from refkern.kernels._common import deliver

__all__ = [
    "avg_pool1d",
    "avg_pool2d",
    "max_pool1d",
    "max_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "PATHS",
]

PATHS = Counter()  #: elements decided by each tier of the averages: "fast", "exact", "superacc", "rational"

FAST, EXACT, SUPERACC, RATIONAL = 0, 1, 2, 3  # per-element path codes written by the kernel

# --- the kernels --------------------------------------------------------------------------------------------------


@jit(inline="always")
def _bracket(yh, yl, err, prec, emin, emax):
    """(a, b, narrow): format values with ``a <= RN(r) <= b`` for every real ``r`` within ``err`` of
    ``yh + yl``, and whether the bracket is narrow enough that ``a`` and ``b`` are equal or adjacent.

    The bracket is :func:`refkern.accumulate.ziv.decide`'s (its docstring has the proof); both its
    ends are returned so that a tie can be decided. If a format value ``v`` lay strictly between
    ``a`` and ``b``, the bracket would contain both midpoints next to ``v``, which are at least the
    format's spacing near ``|yh| / 2``, ``>= |yh| 2**-(prec + 1)``, apart; a bracket no wider than
    ``|yh| 2**-(prec + 2)`` cannot. (The width is that of the real interval, ``2 d`` plus the float64
    roundings of its ends, ``<= 4 d``: for float64 results ``a`` and ``b`` are themselves rounded.)
    """
    d = 2.0 * err + abs(yl) * 2.0**-50 + 2.0**-1070
    if prec < 53:
        d += abs(yh) * 2.0**-51
    lo = yh + (yl - d)
    hi = yh + (yl + d)
    narrow = 4.0 * d <= abs(yh) * 2.0 ** -(prec + 2)  # the real bracket is at most 4 d wide
    if prec < 53:
        return round_to(lo, prec, emin, emax), round_to(hi, prec, emin, emax), narrow
    return lo, hi, narrow


@jit(inline="always")
def _midpoint(a, b, prec, emax):
    """The midpoint of adjacent format values a < b as a double-word (m, ml): for float64 results
    ``a + ulp / 2`` (each part exact: one ulp of a normal float64, halved); for narrower formats one
    float64 (``(a + b) / 2`` is exact, a and b having <= 24 bits; ``max + ulp / 2`` where b is the
    overflow to inf) and ml = 0."""
    if prec >= 53:
        return a, 0.5 * (b - a)
    if b == np.inf:
        return a + pow2(emax - prec), 0.0
    if a == -np.inf:
        return b - pow2(emax - prec), 0.0
    return 0.5 * (a + b), 0.0


@jit(inline="always")
def _pick(side, a, b, m, prec, emin, emax):
    """RN of a value on ``side`` (the sign of value - midpoint) of the midpoint m of a < b."""
    if side > 0.0:
        return b
    if side < 0.0:
        return a
    if prec < 53:
        return round_to(m, prec, emin, emax)  # ties to even (the overflow midpoint goes to inf)
    return a if bits(a) & 1 == 0 else b


@jit(inline="always")
def _side_dw(sh, sl, a, b, ad, prec, emax):
    """sign(S - M ad) for S = sh + sl exactly and the midpoint M of the adjacent format values
    a < b of a narrow bracket of S / ad (:func:`_bracket`), with ``ad <= 2**40`` and ``|sh|`` inside
    the double-word bounds.

    With ``M = m + ml`` (:func:`_midpoint`) and ``sh`` in ``[2**E, 2**(E + 1))``: ``y = sh - m ad``
    is a multiple of ``G = min(ulp(sh), the quantum of m)`` (m is a multiple of half the format's
    quantum there, or for float64 of one ulp), and ``|y| <= ad |S / ad - m| + |sl|``, where S / ad
    and m both lie in the bracket (at most ``2**-(prec + 2) |S / ad|`` wide), so
    ``|y| <= 2**(E - prec - 1) + 2**(E - 53)`` (float64: ``<= 2**(E - 51)``, m being one ulp from
    S / ad at most). Since ``|m| >= 2**(E - 1) / ad``, ``|y| / G <= max(2**(52 - prec), 4 ad)``
    (float64: ``<= 64 ad``), below 2**53: the FMA computes y exactly. ``y - ml ad`` (``ml ad`` a power
    of two times an integer, a multiple of G / 2) is exact likewise, and the sign of
    ``y - ml ad + sl`` is one float comparison.
    """
    m, ml = _midpoint(a, b, prec, emax)
    z = fma(-m, ad, sh)
    if ml != 0.0:
        z -= ml * ad
    return np.float64((z > -sl) - (z < -sl)), m


@jit(inline="always")
def _resolve_tie(acc, a, b, ad, prec, emin, emax):
    """RN(S / ad) for adjacent format values a < b that bracket it, S the exact sum in ``acc``:
    the sign of ``S - M ad`` for their midpoint M, accumulated exactly. ``acc`` is consumed."""
    m, ml = _midpoint(a, b, prec, emax)
    acc_add_product(acc, -m, ad)
    if ml != 0.0:
        acc_add_product(acc, -ml, ad)
    side = acc_round(acc, 53, -1022, 1023)  # nonzero unless S / ad == M: S - M ad is a multiple of 2**-1074
    return _pick(side, a, b, m, prec, emin, emax)


@jit(inline="always")
def _window_mean(X, p, h0, h1, w0, w1, d, prec, emin, emax):
    """(RN(sum X[p, h0:h1, w0:w1] / d), path): the window average rounded once; path is FAST, EXACT
    or SUPERACC when decided here, RATIONAL (value NaN) when the caller must round it from Fractions."""
    ad = abs(d)
    s = 0.0
    c = 0.0
    a = 0.0
    lost = 0.0
    for h in range(h0, h1):
        for w in range(w0, w1):
            x = X[p, h, w]
            t = s + x  # TwoSum: c collects every rounding error of the running sum
            z = t - s
            e = (s - (t - z)) + (x - z)
            c += e
            lost += abs(e)  # zero when the float64 sum s is exact (most windows of narrow inputs)
            s = t
            a += abs(x)
    if a == 0.0:
        return 0.0, FAST  # every term is +-0: an exact zero sum is +0 (torch's sum starts at +0)
    if not a < np.inf:  # a NaN or inf term, or an overflow
        return _superacc_mean(X, p, h0, h1, w0, w1, d, prec, emin, emax)
    sh, sl = two_sum(s, c)
    if SAFE_LO <= abs(sh) <= SAFE_HI:
        n = np.float64((h1 - h0) * (w1 - w0) + 1)
        bound = a * (n * n * 2.0**-106 * (1.0 + 2.0**-20))  # gamma_n**2 sum|x|, sum|x| <= a (1 + gamma_n)
        if prec < 53:  # one division: |qh - (sh + sl) / ad| <= u |sh| / ad + |sl| / ad <= 2**-51 |qh|
            qh = sh / ad
            ql = 0.0
            err = bound / ad * (1.0 + 2.0**-50) + 2.0**-51 * abs(qh)
        else:
            qh, ql = dd_div_fp(sh, sl, ad)
            err = bound / ad * (1.0 + 2.0**-50) + 2.0 * EPS * abs(qh)
        lo, hi, narrow = _bracket(qh, ql, err, prec, emin, emax)
        if lo == hi:
            return (lo if d > 0 else -lo), FAST
        if lost == 0.0 and narrow and ad <= 2.0**40:  # S == s exactly: a midpoint decided at once
            side, m = _side_dw(s, 0.0, lo, hi, ad, prec, emax)
            lo = _pick(side, lo, hi, m, prec, emin, emax)
            return (lo if d > 0 else -lo), EXACT
    # exact: the sum as a double-word, exact when the errors of the errors all vanish
    s = 0.0
    c = 0.0
    lost = 0.0
    for h in range(h0, h1):
        for w in range(w0, w1):
            s, e = two_sum(s, X[p, h, w])
            c, f = two_sum(c, e)
            lost += abs(f)  # S = s + c + (the f's)
    sh, sl = two_sum(s, c)
    if lost == 0.0 and sh == 0.0:
        return 0.0, EXACT  # an exact cancellation: +0
    if lost == 0.0 and ad <= 2.0**40 and SAFE_LO <= abs(sh) <= SAFE_HI:
        qh, ql = dd_div_fp(sh, sl, ad)
        lo, hi, narrow = _bracket(qh, ql, 2.0 * EPS * abs(qh), prec, emin, emax)
        if lo == hi or narrow:
            if lo != hi:
                side, m = _side_dw(sh, sl, lo, hi, ad, prec, emax)
                lo = _pick(side, lo, hi, m, prec, emin, emax)
            return (lo if d > 0 else -lo), EXACT
    return _superacc_mean(X, p, h0, h1, w0, w1, d, prec, emin, emax)


@jit
def _superacc_mean(X, p, h0, h1, w0, w1, d, prec, emin, emax):
    """As :func:`_window_mean`, from the window's exact sum in the superaccumulator (allocated here:
    few windows come this far)."""
    ad = abs(d)
    acc = np.empty(SIZE, np.int64)
    tmp = np.empty(SIZE, np.int64)
    acc_init(acc)
    for h in range(h0, h1):
        for w in range(w0, w1):
            acc_add_float(acc, X[p, h, w])
    if acc[NNAN] + acc[NPINF] + acc[NNINF] > 0:
        return acc_round(acc, prec, emin, emax) / d, SUPERACC  # NaN or +-inf, as IEEE division gives
    sh, sl = acc_dd(acc, tmp)  # |S - sh - sl| <= 2**-106 |sh| (+ 2**-1075 for a subnormal sl)
    if sh == 0.0:
        return 0.0, SUPERACC  # an exact cancellation: +0
    if not SAFE_LO <= abs(sh) <= SAFE_HI:
        return np.nan, RATIONAL
    qh, ql = dd_div_fp(sh, sl, ad)
    err = (abs(sh) * 2.0**-106 + 2.0**-1074) / ad * (1.0 + 2.0**-50) + 2.0 * EPS * abs(qh)
    lo, hi, narrow = _bracket(qh, ql, err, prec, emin, emax)
    if lo != hi:
        if not narrow:
            return np.nan, RATIONAL
        lo = _resolve_tie(acc, lo, hi, ad, prec, emin, emax)
    return (lo if d > 0 else -lo), SUPERACC


@jit(parallel=True)
def _window_means(X, h0, h1, w0, w1, dh, dw, dconst, prec, emin, emax, out, path):
    """out[p, i, j] = RN(sum X[p, h0[i]:h1[i], w0[j]:w1[j]] / d) with d = dconst if nonzero, else
    dh[i] * dw[j]; path[p, i, j] the tier that decided it (RATIONAL: left to the caller)."""
    nh = h0.size
    nw = w0.size
    for t in prange(X.shape[0] * nh):
        p = t // nh
        i = t - p * nh
        for j in range(nw):
            d = dconst if dconst != 0.0 else np.float64(dh[i] * dw[j])
            v, k = _window_mean(X, p, h0[i], h1[i], w0[j], w1[j], d, prec, emin, emax)
            out[p, i, j] = v
            path[p, i, j] = k


@jit(parallel=True)
def _window_max(X, kh, kw, sh, sw, ph, pw, dlh, dlw, out, idx):
    """out[p, i, j] = the max over the dilated window, idx its flat index in the (H, W) plane.

    torch's CPU scan: taps in row-major order, the running max starts at -inf and is replaced when
    ``x > max`` or x is NaN (so NaN wins, the first of equal values stays: -0 before +0); the index
    starts at the first tap inside the input, which a window with no tap inside keeps (with -inf).
    """
    nh = out.shape[1]
    nw = out.shape[2]
    H = X.shape[1]
    W = X.shape[2]
    for t in prange(X.shape[0] * nh):
        p = t // nh
        i = t - p * nh
        ih0 = i * sh - ph
        ih1 = min(ih0 + (kh - 1) * dlh + 1, H)
        while ih0 < 0:
            ih0 += dlh
        for j in range(nw):
            iw0 = j * sw - pw
            iw1 = min(iw0 + (kw - 1) * dlw + 1, W)
            while iw0 < 0:
                iw0 += dlw
            best = -np.inf
            at = ih0 * W + iw0
            for ih in range(ih0, ih1, dlh):
                for iw in range(iw0, iw1, dlw):
                    x = X[p, ih, iw]
                    if x > best or x != x:
                        best = x
                        at = ih * W + iw
            out[p, i, j] = best
            idx[p, i, j] = at


# --- arguments ----------------------------------------------------------------------------------------------------


def pool_shape(op: str, shape: tuple, nd: int):
    """(the plane (H, W), a 1-d input's (1, L), a 3-d one's (D, H, W); the leading shape) of an input of
    ``shape``, checked as torch checks it."""
    axes = ("L",) if nd == 1 else ("D", "H", "W")[3 - nd :]
    if len(shape) not in (nd + 1, nd + 2):
        names = f"(C, {', '.join(axes)}) or (N, C, {', '.join(axes)})"
        raise ValueError(f"{op}: input must have shape {names}; got input.shape={shape}.")
    if 0 in shape[-nd - 1 :]:
        sizes = f"C, {', '.join(axes[:-1])} and {axes[-1]}" if nd > 1 else "C and L"
        raise ValueError(f"{op}: input must have nonzero {sizes} (only N may be 0); got input.shape={shape}.")
    return (shape[-nd:] if nd > 1 else (1, shape[-1])), shape[:-nd]


def _pool_input(op: str, input, nd: int):  # noqa: A002
    """(operand, values as a contiguous float64 (planes, H, W) array, the leading shape)."""
    x = operand(input, "input", op)
    spatial, lead = pool_shape(op, tuple(x.shape), nd)
    X = np.ascontiguousarray(x.values, dtype=np.float64).reshape(-1, *spatial)
    return x, X, lead


def _ints(op: str, name: str, value, nd: int, minimum: int) -> tuple:
    """torch's int-or-tuple argument as ``nd`` ints, each ``>= minimum``."""
    vals = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if len(vals) not in (1, nd):
        want = "an int" if nd == 1 else f"an int or a tuple of {nd} ints"
        raise ValueError(f"{op}: {name} must be {want}; got {name}={value!r}.")
    for v in vals:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{op}: {name} must be made of ints; got {name}={value!r}.")
    if any(v < minimum for v in vals):
        raise ValueError(f"{op}: {name} must be >= {minimum}; got {name}={value!r}.")
    return tuple(int(v) for v in vals) * (nd // len(vals))


def _flag(op: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a bool; got {name}={value!r}.")
    return bool(value)


def _geometry(op, nd, kernel_size, stride, padding, dilation, ceil_mode):
    """Checked (kernel, stride, padding, dilation) tuples of ``nd`` ints, and ceil_mode."""
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    empty = stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0)
    s = k if empty else _ints(op, "stride", stride, nd, 1)  # torch's default: the kernel size
    p = _ints(op, "padding", padding, nd, 0)
    dl = _ints(op, "dilation", dilation, nd, 1)
    if any(pa > ka // 2 for pa, ka in zip(p, k)):
        raise ValueError(
            f"{op}: padding must be at most half of kernel_size (padding <= kernel_size // 2, as torch requires); "
            f"got padding={padding!r} with kernel_size={kernel_size!r}."
        )
    return k, s, p, dl, _flag(op, "ceil_mode", ceil_mode)


def _out_size(op, size, k, s, p, dl, ceil_mode) -> int:
    """torch's pooling_output_shape: with ceil_mode the last window must start inside the input
    or its left padding."""
    o = (size + 2 * p - dl * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    if o < 1:
        dil = f", dilation={dl}" if dl != 1 else ""
        raise ValueError(
            f"{op}: the output would be empty: an input of size {size} with kernel_size={k}, stride={s}, "
            f"padding={p}{dil} leaves no window; got output size {o}. Use a smaller kernel_size or more padding."
        )
    return o


def _lift(t: tuple, one: int) -> tuple:
    """A 1-d parameter as the (H, W) pair of a plane of height 1."""
    return (one, *t) if len(t) == 1 else t


def shaped(out, lead, nd):
    return out.reshape(*lead, *(out.shape[1:] if nd > 1 else out.shape[2:]))


# --- averages -----------------------------------------------------------------------------------------------------


def _averages(X, fmt, spans, dconst):
    """The window averages of every plane (float64 values of ``fmt``), every tier counted in PATHS."""
    (h0, h1, dh), (w0, w1, dw) = (tuple(np.asarray(v, np.int64) for v in zip(*sp)) for sp in spans)
    out = np.empty((X.shape[0], h0.size, w0.size))
    path = np.zeros(out.shape, np.int8)
    exact_divisor = dconst == 0 or float(dconst) == dconst
    if out.size and exact_divisor:
        _window_means(X, h0, h1, w0, w1, dh, dw, float(dconst), *fmt.params, out, path)
    if not exact_divisor:  # a divisor_override beyond float64's integers: every element from Fractions
        path[...] = RATIONAL
    counts = [int(np.count_nonzero(path == code)) for code in range(4)]
    PATHS.update(dict(zip(("fast", "exact", "superacc", "rational"), counts)))
    for p, i, j in zip(*np.nonzero(path == RATIONAL)) if counts[RATIONAL] else ():
        total = sum(map(Fraction, X[p, h0[i] : h1[i], w0[j] : w1[j]].ravel().tolist()), Fraction(0))
        d = dconst or int(dh[i] * dw[j])
        out[p, i, j] = round_fraction(total / d, fmt) if total != 0 else 0.0
    return out


def avg_spans(op, nd, plane, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """torch's average-pool windows of a ``plane`` (H, W) (a 1-d input's is (1, L), a 3-d one's (D, H, W)): per
    axis a list of ``(lo, hi, count)``, the window's input positions ``[lo, hi)`` and its divisor's factor, and
    the ``divisor_override`` (0 where None); each argument checked. The integer kernel
    (:mod:`refkern.kernels.integer_pool`) and the backward (:mod:`refkern.kernels.pool_grad`) read the same
    windows."""
    k, s, p, _, ceil_mode = _geometry(op, nd, kernel_size, stride, padding, 1, ceil_mode)
    count_include_pad = _flag(op, "count_include_pad", count_include_pad)
    dconst = 0
    if divisor_override is not None:
        if isinstance(divisor_override, (bool, np.bool_)) or not isinstance(divisor_override, (int, np.integer)):
            raise TypeError(
                f"{op}: divisor_override must be an int or None; got divisor_override={divisor_override!r}."
            )
        if divisor_override == 0:
            raise ValueError(f"{op}: divisor_override must be nonzero; got divisor_override=0.")
        dconst = int(divisor_override)
    k, s, p = _lift(k, 1), _lift(s, 1), _lift(p, 0)
    spans = []
    for a, size in enumerate(plane):
        spans.append([])
        for o in range(_out_size(op, size, k[a], s[a], p[a], 1, ceil_mode)):
            start = o * s[a] - p[a]
            end = min(start + k[a], size + p[a])  # ceil_mode's positions past the padded input are not counted
            lo, hi = max(start, 0), min(end, size)
            spans[-1].append((lo, hi, end - start if count_include_pad else hi - lo))
    return spans, dconst


def _avg_pool(op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    x, X, lead = _pool_input(op, input, nd)
    spans, dconst = avg_spans(op, nd, X.shape[1:], kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)  # fmt: skip
    out = _averages(X, x.fmt, spans, dconst)
    out += 0.0  # torch adds the quotient to a zeroed output: every zero result is +0
    return deliver(shaped(out, lead, nd), x.fmt, x.torch)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):  # noqa: A002
    """Reference ``F.avg_pool1d``: each output the exact window average, rounded once.

    Parameters
    ----------
    input : array or tensor of shape (C, L) or (N, C, L); float16, bfloat16, float32 or float64.
    kernel_size, stride, padding : int or 1-tuple; ``stride`` None (or ``[]``) is ``kernel_size``;
        ``padding <= kernel_size // 2``, implicit zeros on both sides.
    ceil_mode : bool, torch's output size rule: ``floor((L + 2 p - k) / s) + 1`` windows, or with
        ceil_mode the ceiling, less the last window if it would start at or past ``L + p``.
    count_include_pad : bool; the divisor of window ``[t, t + k)`` (``t = o s - p``) is the number of
        its positions inside ``[-p, L + p)`` when True (the padded zeros count, the positions that
        ceil_mode's last window reaches past ``L + p`` do not), else the number inside ``[0, L)``.

    Returns
    -------
    ``RN(sum of the window's input elements / divisor)``: the exact real quotient rounded once
    (to nearest, ties to even) to the input's dtype, as a numpy array or a CPU tensor like the
    input. NaN in a window, or +inf with -inf, gives NaN; an infinity gives that infinity. Every
    zero result is +0, as torch's CPU kernel gives. The sum never overflows on the way: only the
    quotient's own rounding can give inf.
    """
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):  # fmt: skip
    """Reference ``F.avg_pool2d`` on (C, H, W) or (N, C, H, W) input, each output rounded once.

    As :func:`avg_pool1d` in each of H and W (``kernel_size``, ``stride``, ``padding``: an int or a
    pair); the divisor is the product of the two dims' counts, or ``divisor_override`` (a nonzero
    int, negative allowed) when given. Every output is ``RN(S / divisor)`` for the exact sum S of
    the window's input elements, correctly rounded to the input's dtype; zero results are +0.
    """
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def _adaptive(op, nd, input, output_size):  # noqa: A002
    x, X, lead = _pool_input(op, input, nd)
    given = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,)
    if len(given) not in (1, nd):
        raise ValueError(f"{op}: output_size must be an int or {nd} ints (entries may be None); "
                         f"got output_size={output_size!r}.")  # fmt: skip
    given = given * (nd // len(given))
    sizes = X.shape[1:] if nd == 2 else X.shape[2:]
    osz = []
    for size, o in zip(sizes, given):
        if o is None:
            o = size
        if isinstance(o, (bool, np.bool_)) or not isinstance(o, (int, np.integer)):
            raise TypeError(f"{op}: output_size must be made of ints or None; got output_size={output_size!r}.")
        if o < 0:
            raise ValueError(f"{op}: output_size must be >= 0 (or None); got output_size={output_size!r}.")
        osz.append(int(o))
    if nd == 1:
        osz = [1, *osz]
    spans = []  # torch's windows: start = floor(i L / out), end = ceil((i + 1) L / out)
    for size, o in zip(X.shape[1:], osz):
        spans.append([(i * size // o, -(-(i + 1) * size // o), -(-(i + 1) * size // o) - i * size // o)
                      for i in range(o)])  # fmt: skip
    out = _averages(X, x.fmt, spans, 0) if all(osz) else np.empty((X.shape[0], *osz))
    return deliver(shaped(out, lead, nd), x.fmt, x.torch)


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    """Reference ``F.adaptive_avg_pool1d`` on (C, L) or (N, C, L) input.

    Output ``i`` of ``out = output_size`` is the average of ``x[floor(i L / out) : ceil((i + 1) L / out)]``
    (torch's windows, which overlap when L is not a multiple of out), the exact sum over the window's
    length rounded once to the input's dtype. ``output_size``: an int, a 1-tuple or None (keep L);
    0 gives an empty output, as torch. Zero: +0 for an exactly zero sum; an average that rounds to
    zero keeps its sign. NaN/inf as :func:`avg_pool1d`.
    """
    return _adaptive("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Reference ``F.adaptive_avg_pool2d`` on (C, H, W) or (N, C, H, W) input: the windows of
    :func:`adaptive_avg_pool1d` in H and in W, each output the exact window sum over its size rounded
    once. ``output_size``: an int, or a pair whose entries may be None (keep that size)."""
    return _adaptive("adaptive_avg_pool2d", 2, input, output_size)


# --- maxima -------------------------------------------------------------------------------------------------------


def _max_pool(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):  # noqa: A002
    x, X, lead = _pool_input(op, input, nd)
    k, s, p, dl, ceil_mode = _geometry(op, nd, kernel_size, stride, padding, dilation, ceil_mode)
    return_indices = _flag(op, "return_indices", return_indices)
    k, s, p, dl = _lift(k, 1), _lift(s, 1), _lift(p, 0), _lift(dl, 1)
    osz = [_out_size(op, X.shape[1 + a], k[a], s[a], p[a], dl[a], ceil_mode) for a in range(2)]
    out = np.empty((X.shape[0], *osz))
    idx = np.empty(out.shape, np.int64)
    if out.size:
        _window_max(X, k[0], k[1], s[0], s[1], p[0], p[1], dl[0], dl[1], out, idx)
    values = deliver(shaped(out, lead, nd), x.fmt, x.torch)
    nan = np.isnan(out)
    if nan.any():
        _own_nans(values, input, idx, nan)
    if not return_indices:
        return values
    idx = shaped(idx, lead, nd)
    if x.torch:
        import torch

        idx = torch.from_numpy(np.ascontiguousarray(idx))
    return values, idx


def _own_nans(values, input, idx, nan):  # noqa: A002
    """Where the maximum is NaN, the input's own NaN (sign and payload, which the way through float64
    loses for float16 and bfloat16): the element at the index chosen."""
    planes = idx.shape[0]
    mask = nan.reshape(planes, -1)
    if is_tensor(values):
        import torch

        src = input.detach().cpu().reshape(planes, -1)
        at = torch.from_numpy(np.minimum(idx.reshape(planes, -1), src.shape[1] - 1))  # NaN's indices are inside
        m = torch.from_numpy(mask)
        values.view(planes, -1)[m] = src.gather(1, at)[m]
    else:
        src = np.asarray(input).reshape(planes, -1)
        at = np.minimum(idx.reshape(planes, -1), src.shape[1] - 1)
        values.reshape(planes, -1)[mask] = np.take_along_axis(src, at, 1)[mask]


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):  # fmt: skip
    """Reference ``F.max_pool1d`` on (C, L) or (N, C, L) input: the maximum of each dilated window.

    A selection, hence bit-exact. Window ``o`` reads ``x[t + j dilation]`` for ``j < kernel_size``,
    ``t = o stride - padding``; positions outside ``[0, L)`` are padding, which acts as -inf.
    torch's output size (:func:`avg_pool1d`, with the dilated extent ``dilation (k - 1) + 1``) and
    checks (``padding <= kernel_size // 2``). As torch's CPU kernel: a NaN in the window gives NaN,
    of equal maxima the first in scan order is kept (-0 before +0 stays -0), a window with no tap
    inside the input gives -inf. ``return_indices``: also the int64 index of the chosen element
    along L (the last NaN's for a NaN; the window's first tap inside the input when none is chosen).
    A NaN result is the input's own NaN, sign and payload (the element at the returned index), as
    torch gives for float32 and float64; its float16/bfloat16 kernels pass the NaN through float,
    which changes its bits in ways that differ between code paths.
    """
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):  # fmt: skip
    """Reference ``F.max_pool2d`` on (C, H, W) or (N, C, H, W) input: as :func:`max_pool1d` in H and W,
    taps scanned row by row; ``return_indices`` gives torch's flat index ``h * W + w`` in the plane."""
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
