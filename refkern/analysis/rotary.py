"""The rotary position embedding as one operation: ``y = s (q cos(theta) + rotate(q) sin(theta))``, its
correctly rounded reference and its yardstick (issue 26, the audit's composed patterns).

``q`` is the query or key (any float format), ``theta`` the angles as the model computed them (float32
in Hugging Face's models: ``position * inv_freq``; an IEEE product, the same on every backend),
broadcast to q's shape, ``s`` the attention scaling (1 for the default rotary), and ``rotate``:

- ``"half"`` (Llama, Qwen2, Mistral, GPT-NeoX: ``rotate_half``): ``cat(-q[..., d/2:], q[..., :d/2])``;
- ``"interleaved"`` (GPT-J): the pairs ``(q[2i], q[2i+1])`` rotated, ``(-q[2i+1], q[2i])``.

**Reference.** ``cos`` and ``sin`` of each angle are the double-word values of
:func:`refkern.kernels.elementwise.values` (within ``2**-95`` relative); ``y`` is evaluated in float64
with the bound ``eb = 2**-50 (|q| + |rotate q|) |s|``: the two products ``fl(q c)`` and ``fl(r s')`` err
by at most ``2**-53`` of ``|q|`` and ``|r|`` (``|c|, |s'| <= 1``), the omitted low words by ``2**-95``
of the same, their sum by ``2**-53 (|q| + |r|) (1 + 2**-52)``, the scaling by one more ``2**-53``:
at most ``4.01 * 2**-53 (|q| + |r|) |s| < 2**-50 (|q| + |r|) |s|``. Where ``y +- eb`` rounds alike in
the output format, that rounding is the reference; elsewhere mpmath at 256 bits decides it.

**Yardstick** (as :mod:`refkern.analysis.elementwise`'s, a bound per element and per math library,
each step's error propagated to first order). A correct implementation takes ``c = cos(theta)`` from
its library (``L_cos(c)``, at the angles' working format w: float32 for float32 angles), may scale it
in w (``r_w(s c)``), may round it to q's format d (``r_d(s c)``, as Hugging Face does with
``cos.to(x.dtype)``), multiplies in d (``r_d(q s c)``), likewise for sin, and adds in d:

``E = |q| (|s| L_cos + r_w(s c) + r_d(s c)) + |r| (|s| L_sin + r_w(s s') + r_d(s s')) + r_d(q s c) +
r_d(r s s') + r_d(y)``

(``r_w`` only where s != 1, ``r_d(s c)`` only where d is narrower than w; ``r_f(z)`` half the spacing
of f at ``|z| (1 + 16 u)``). An implementation that keeps cos in float32, or fuses the products, errs
less. ``B = (E + eb)(1 + 2**-10)``. Within B of a rounding class of the device: rounding; within the
fast-math class (``__sinf``/``__cosf``, ``2**-21.41`` absolute on ``[-pi, pi]`` only): a named reduced
precision; beyond every class: mismatch (:func:`refkern.analysis.elementwise._decide`).
"""

import math

import numpy as np

from refkern.accumulate.formats import FLOAT32, round_array
from refkern.analysis.elementwise import SLACK, _candidates, _decide, _hypotheses, _steps, _ulp
from refkern.analysis.report import build, errors
from refkern.kernels import elementwise as ew

__all__ = ["rotate", "reference", "analyse", "compare_rotary", "CONVENTIONS"]

CONVENTIONS = ("half", "interleaved")
_EB = 2.0**-50  #: relative bound of the float64 evaluation (module docstring)


def rotate(q, convention="half"):
    """``rotate(q)`` of the module docstring, on a float64 numpy array (exact: signs and selections)."""
    q = np.asarray(q, np.float64)
    if convention == "half":
        h = q.shape[-1] // 2
        return np.concatenate([-q[..., h:], q[..., :h]], axis=-1)
    if convention == "interleaved":
        r = np.empty_like(q)
        r[..., 0::2], r[..., 1::2] = -q[..., 1::2], q[..., 0::2]
        return r
    raise ValueError(f"rotary: unknown convention={convention!r}; choose one of 'half', 'interleaved'.")


def _cos_sin(theta):
    """(cos, sin) of the float64 angles, each to float64 (hi) and the low word (lo), over the distinct angles."""
    u, inv = np.unique(theta.reshape(-1), return_inverse=True)
    out = []
    for fn in ("cos", "sin"):
        hi, lo = ew.values(fn, u, FLOAT32)
        bad = np.flatnonzero(np.isnan(hi) & np.isfinite(u))
        if bad.size:  # the double-word bound did not hold: mpmath, at a precision covering the argument
            import mpmath

            with mpmath.workprec(256 + max(0, int(np.log2(np.max(np.abs(u[bad])) + 1)))):
                f = getattr(mpmath, fn)
                for i in bad:
                    v = f(mpmath.mpf(float(u[i])))
                    hi[i] = float(v)
                    lo[i] = float(v - hi[i])
        out.append((hi[inv].reshape(theta.shape), lo[inv].reshape(theta.shape)))
    return out


def _exact_round(q, r, theta, scale, fmt):
    """The correctly rounded ``s (q cos theta + r sin theta)`` of one element, with mpmath."""
    import mpmath

    with mpmath.workprec(256 + max(0, int(math.log2(abs(theta) + 1)))):
        t = mpmath.mpf(theta)
        y = mpmath.mpf(scale) * (mpmath.mpf(q) * mpmath.cos(t) + mpmath.mpf(r) * mpmath.sin(t))
        hi = float(y)
        lo = float(y - hi)
    if lo != 0.0:  # off a midpoint of fmt (at most 24 bits, or fmt is float64 and hi is the rounding)
        hi = float(np.nextafter(hi, math.copysign(math.inf, lo)))
    return float(round_array(np.array([hi]), *fmt.params)[0]) if fmt.prec < 53 else float(y)


def reference(q, theta, scale, fmt, convention="half"):
    """(the correctly rounded rotation in ``fmt``, its float64 value y, the bound ``eb`` of y's error, the
    rotated q, cos, sin) of float64 arrays ``q`` and ``theta`` (theta broadcast to q's shape)."""
    q = np.asarray(q, np.float64)
    theta = np.asarray(theta, np.float64)
    r = rotate(q, convention)
    (ch, cl), (sh, sl) = (tuple(np.broadcast_to(v, q.shape) for v in p) for p in _cos_sin(np.ascontiguousarray(theta)))
    theta = np.broadcast_to(theta, q.shape)
    with np.errstate(all="ignore"):
        y = scale * ((q * ch + r * sh) + (q * cl + r * sl))
        eb = _EB * (np.abs(q) + np.abs(r)) * abs(scale)
        lo, hi = (round_array(y + d, *fmt.params) for d in (-eb, eb))
    ref = round_array(y, *fmt.params)
    for i in np.flatnonzero((lo != hi).reshape(-1)):
        idx = np.unravel_index(i, q.shape)
        ref[idx] = _exact_round(float(q[idx]), float(r[idx]), float(theta[idx]), scale, fmt)
    return ref, y, eb, r, ch, sh


def _bound(q, r, c, s_, y, scale, tfmt, fmt, lib, theta):
    """E of the module docstring for library ``lib``, or None where it has no cos or sin."""
    w, _, rw, L = _steps(tfmt, lib)
    lc, ls = L("cos", c, theta), L("sin", s_, theta)
    if lc is None or ls is None:
        return None

    def rd(z):
        return 0.5 * _ulp(z, fmt, True)

    sc, ss = scale * c, scale * s_
    dc, ds = abs(scale) * lc, abs(scale) * ls
    if scale != 1.0:
        dc, ds = dc + rw(sc), ds + rw(ss)
    if fmt.prec < w.prec:
        dc, ds = dc + rd(sc), ds + rd(ss)
    return np.abs(q) * dc + np.abs(r) * ds + rd(q * sc) + rd(r * ss) + rd(y)


def analyse(act, fmt, device, q, theta, tfmt, scale=1.0, convention="half", op="rotary", rtol=None, atol=None):
    """The Report of a rotation: ``act`` the backend's values (float64, in ``fmt``), ``q`` and ``theta``
    float64 arrays (theta's values in ``tfmt``, broadcast to q's shape)."""
    shape = np.shape(act)
    ref, y, eb, r, c, s_ = reference(q, theta, scale, fmt, convention)
    q = np.asarray(q, np.float64)
    th = np.broadcast_to(np.asarray(theta, np.float64), q.shape)
    a = np.asarray(act, np.float64)
    same = (a == ref) | (np.isnan(a) & np.isnan(ref))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - y))
    err = np.where(np.isnan(err), np.inf, err).reshape(-1)
    same = same.reshape(-1)
    rounding, reduced = _candidates(device)
    fits = {}
    for lib in rounding + (reduced if tfmt.prec <= FLOAT32.prec else []):
        E = _bound(q, r, c, s_, y, scale, tfmt, fmt, lib, th)
        if E is None:
            continue
        with np.errstate(invalid="ignore"):
            B = ((E + eb) * (1.0 + SLACK)).reshape(-1)
            ok = same | (err <= B)
            ratio = np.where(same, 0.0, err / B)
        fits[lib.name] = (lib, ok, np.where(np.isnan(ratio), np.inf, ratio), B)
    verdict, precision, model, classes, ratio, top = _decide(fits, same, None)
    ulps = err / _ulp(y.reshape(-1), fmt)
    notes = [f"rotary ({convention} convention), angles in {tfmt.name}" + (f", scaled by {scale:g}" if scale != 1.0
                                                                          else "")]  # fmt: skip
    if verdict == "rounding":
        notes.append(f"within the documented accuracy of {model} (the largest error is "
                     f"{float(np.max(ratio, initial=0.0)):.3g}x its bound)")  # fmt: skip
    finite = np.isfinite(ulps)
    hyps, ratios = _hypotheses(fits)
    flat_a, flat_r = a.reshape(-1), ref.reshape(-1)
    return build(
        op=op, device=device, dtype=fmt.name, shape=shape, n_terms=2, verdict=verdict, precision=precision,
        classes=classes, model=model, actual=flat_a, reference=flat_r, top=top,
        at_worst={"ulp": ulps[top], "bound_ratio": ratio[top], "test_ratio": ratio[top], "condition": 1.0,
                  "input": th.reshape(-1)[top]},
        max_ulp=float(np.max(np.where(finite, ulps, 0.0), initial=0.0)) if finite.any() else float("inf"),
        max_bound_ratio=float(np.max(ratio, initial=0.0)), max_prob_ratio=float(np.max(ratio, initial=0.0)),
        hypotheses=hyps, bound_ratios=ratios, error=lambda: errors(flat_a, flat_r, same), rtol=rtol, atol=atol,
        axes=tuple(f"dim{i}" for i in range(len(shape))), notes=notes,
    )  # fmt: skip


def compare_rotary(actual, q, theta, scale=1.0, convention="half", rtol=None, atol=None):
    """Judge a backend's rotary embedding ``actual`` of ``q`` at angles ``theta`` (arrays or tensors; theta
    broadcastable to q's shape) against the exact rotation (module docstring): a Report whose op is "rotary".
    The output's format is actual's; the angles' working format is theta's."""
    from refkern._arrays import is_tensor, operand

    if convention not in CONVENTIONS:
        raise ValueError(f"rotary: unknown convention={convention!r}; choose one of 'half', 'interleaved'.")
    device = str(actual.device) if is_tensor(actual) else "numpy"
    act, qo, to = (operand(v, n, "rotary") for v, n in ((actual, "actual"), (q, "q"), (theta, "theta")))
    if tuple(act.shape) != tuple(qo.shape):
        raise ValueError(f"rotary: actual.shape={tuple(act.shape)} differs from q.shape={tuple(qo.shape)}; pass the q "
                         "that was rotated.")  # fmt: skip
    if qo.shape and qo.shape[-1] % 2:
        raise ValueError(f"rotary: the last axis of q must have an even size; got q.shape={tuple(qo.shape)}.")
    th = np.asarray(to.values, np.float64).reshape(to.shape)
    try:
        fits = np.broadcast_shapes(th.shape, qo.shape) == tuple(qo.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"rotary: theta.shape={tuple(to.shape)} does not broadcast to "
                         f"q.shape={tuple(qo.shape)}.") from None  # fmt: skip
    a64 = np.asarray(act.values, np.float64).reshape(act.shape)
    q64 = np.asarray(qo.values, np.float64).reshape(qo.shape)
    return analyse(a64, act.fmt, device, q64, th, to.fmt, float(scale), convention, rtol=rtol, atol=atol)
