"""The yardstick of the elementwise functions: a correct kernel is within its math library's documented
accuracy, not correctly rounded.

For every element the error is measured against the exact value ``v`` (the double-word value of
:func:`refkern.kernels.elementwise.values`, within 2**-95 relative), and compared with the bound ``B``
of each computation a backend may have run, built from :mod:`refkern.ops._accuracy`'s classes by
propagating each step's error to first order (the derivatives are evaluated in float64 at the exact
intermediate values; the bound is then widened by ``2**-10`` of itself for the second-order terms and
those evaluations). With ``U(y)`` the spacing of the working format ``w`` at ``y`` (float32 for
float16, bfloat16 and float32 inputs, float64 for float64), ``r(y) = U(y)/2`` (one IEEE rounding,
subnormal spacing included; U taken at ``|y| (1 + 16 u)``, so that a computed value that crossed into
the next binade is charged its half ulp) and ``L_f(y)`` the library's bound for function f at its result y:

=================  ===========================================================================
op                 bound E (before the final rounding to a half format)
=================  ===========================================================================
exp ... erf        ``L_f(v)`` (one library call)
sqrt, reciprocal   ``r(v)`` (IEEE 754)
rsqrt              ``r(v) + |v|/s r(s)``, s = sqrt x (torch's CPU: 1 / sqrt(x)); ``L_rsqrt(v)`` where the
                   library has its own (CUDA's rsqrtf, 2 ulp)
pow                y = 2, -1: ``r(v)``; y = 0.5: as sqrt; y = 3: ``r(v) + |x| r(x**2)``; y = -2: ``r(v) +
                   |v|/x**2 r(x**2)`` (for half inputs ``r(x**2)`` at the half format: bfloat16 pow(-0.711, 3)
                   is 0.98 ulp off, pow(-0.0664, -2) 1.23 ulp, measured), and ``|v|`` where ``fl(x**2)``
                   overflows (1/inf = 0: float32 pow(1.85e19, -2) is 0, the exact 2.9e-39; x**2 rounded to
                   bfloat16 for bfloat16, to float32 for float16: float16 pow(300, -2) is not 0); y = -0.5:
                   as rsqrt; else ``L_pow(v)``; a tensor exponent: ``L_pow(v)`` at every element
sigmoid            ``r(v) + |v|/s (r(s) + L_exp(e))``, e = e**-x, s = 1 + e; where e**-x overflows
                   the working format the result is 0: ``E >= |v|``
silu               the same with v = x / s (torch's CPU: x / (1 + exp(-x)))
gelu               a = x fl(1/sqrt 2): ``da = |a| u + r(a)``; t = erf(a): ``dt = L_erf(t) +
                   2/sqrt(pi) e**(-a**2) da``; b = 1 + t: ``db = r(b) + dt``; h = x/2;
                   ``E = r(v) + |h| db + |b| r(h)``
gelu (tanh)        x3 = (x x) x, k = kappa x3, s = x + k, u = beta s, t = tanh u, b = 1 + t,
                   y = (x/2) b, each a rounding, kappa and beta constants rounded (u relative),
                   ``dt = L_tanh(t) + (1 - t**2) du``
softplus           y = beta x, e = e**y, l = log1p(e), q = l / beta: ``E = r(q) + (L_log1p(l) +
                   (L_exp(e) + e dy) / (1 + e)) / |beta|``; where ``fl(beta x)`` may fall on the
                   other side of threshold, x itself is accepted too
=================  ===========================================================================

Measured departures a class allows: torch's CPU rsqrt (and pow(x, -1/2)) of bfloat16/float16 rounds
the square root to the half format before the reciprocal (bfloat16 rsqrt(2416) is 0.66 ulp off); gelu,
gelu (tanh) and silu of bfloat16/float16 return 0 for results below float32's normal range; gelu's
``x (1 + erf)`` overflows for ``2|x|`` beyond the working format (any result); pow(-0, +-1/2) and
pow(-inf, +-1/2) are C99's in float16 and sqrt's/rsqrt's (the reference's) in float32 and float64.

For a float16/bfloat16 result computed in float32, ``B = E + 0.5 ulp_out(|v| + E)`` (the one rounding
to the half format); otherwise ``B = E``. An element equal to the correctly rounded value is exact;
within B of a rounding class of its device (``cpu``: torch's CPU kernels and glibc; ``cuda``: CUDA's
tables; a numpy array: any) it is rounding, and the class that explains every element with the
smallest largest ``error / B`` is named; within a fast-math class a named reduced precision; for gelu,
a result within the bound of the tanh form is the named reduced precision "gelu tanh approximation";
beyond every class a mismatch.
"""

import math

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis.report import build, errors
from refkern.kernels import elementwise as ew
from refkern.ops._accuracy import LIBRARIES

__all__ = ["bounds", "analyse", "SLACK"]

SLACK = 2.0**-10  #: relative widening of every first-order bound (module docstring)


def _ulp(y, fmt, up=False):
    """Spacing of fmt at |y| (subnormal spacing below 2**emin), elementwise; with ``up``, at
    ``|y| (1 + 16 u)``: a computed value a few ulps above y may have crossed into the next binade,
    whose half ulp its rounding then costs."""
    a = np.abs(np.asarray(y, np.float64))
    if up:
        a = a * (1.0 + 16.0 * fmt.u)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where((a > 0) & np.isfinite(a), a, 1.0)))
    e = np.maximum(e, fmt.emin)
    return np.ldexp(1.0, (e - fmt.prec + 1).astype(np.int64))


def _lib(spec, y, xarg, w):
    """A library's bound at its (exact) result y for argument xarg (:mod:`refkern.ops._accuracy`)."""
    y = np.asarray(y, np.float64)
    if spec is None:
        return 0.5 * _ulp(y, w, True)
    if isinstance(spec, (int, float)):
        return spec * _ulp(y, w, True)
    kind = spec[0]
    if kind == "abs":
        return np.full(y.shape, spec[1]) + 0.5 * _ulp(y, w)
    if kind == "rel":
        return spec[1] * np.abs(y) + 0.5 * _ulp(y, w)
    if kind == "expf_fast":
        return (2.0 + np.floor(np.abs(1.173 * xarg))) * _ulp(y, w)
    if kind == "logf_fast":
        inside = (xarg >= 0.5) & (xarg <= 2.0)
        return np.where(inside, 2.0**-21.41, 3.0 * _ulp(y, w))
    if kind == "sincos_fast":
        return np.where(np.abs(xarg) <= math.pi, 2.0**-21.41, -np.inf)  # beyond: no bound, explains nothing
    raise ValueError(f"elementwise: unknown accuracy spec {spec!r}")


def _spec(lib, f, half):
    if half and lib.half and f in lib.half:
        return lib.half[f]
    return lib.ulps.get(f, "missing")


def _steps(fmt, lib):
    """(w, half, r, L) of a computation for a result in fmt with library ``lib``: the working format w
    (float32 for float16, bfloat16 and float32, float64 for float64), whether the result is a half format,
    ``r(y)`` one rounding in w at y, ``L(f, y, xa)`` the library's bound for function f at its result y
    (None where it lacks f); module docstring."""
    w = FLOAT32 if fmt.prec <= FLOAT32.prec else FLOAT64
    half = fmt.prec < FLOAT32.prec

    def r(y):
        return 0.5 * _ulp(y, w, True)

    def L(f, y, xa):
        s = _spec(lib, f, half)
        return None if isinstance(s, str) else _lib(s, y, xa, w)

    return w, half, r, L


def bounds(fn, x, v, fmt, lib, params=()):
    """The bound B (absolute, per element; module docstring) of ``lib`` for ``fn`` at inputs x (float64)
    with exact values v, or None where the library has no function the computation needs."""
    w, half, r, L = _steps(fmt, lib)
    u = w.u
    x = np.asarray(x, np.float64)
    av = np.abs(v)

    with np.errstate(all="ignore"):
        if fn in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tanh", "erf"):
            E = L(fn, v, x)
        elif fn == "sqrt":
            E = L("sqrt", v, x) if not isinstance(_spec(lib, "sqrt", half), str) else r(v)
        elif fn == "reciprocal":
            E = r(v)
        elif fn == "rsqrt" and not isinstance(_spec(lib, "rsqrt", half), str):  # a library's own rsqrt (CUDA)
            E = L("rsqrt", v, x)
        elif fn == "rsqrt":
            s = np.sqrt(x)
            ls = L("sqrt", s, x) if not isinstance(_spec(lib, "sqrt", half), str) else r(s)
            if half:  # measured: torch's CPU rounds the half input's sqrt to the half format first
                ls = ls + 0.5 * _ulp(s, fmt, True)
            E = r(v) + av / s * ls
        elif fn == "pow" and np.ndim(params[0]):  # pow(Tensor, Tensor): the library's pow for every element
            E = L("pow", v, x)
        elif fn == "pow":
            y = params[0]
            x2 = x * x
            r2 = 0.5 * _ulp(x2, fmt, True) if half else r(x2)  # measured: bfloat16's x*x rounded to bfloat16
            if y in (2.0, -1.0):
                E = r(v)
            elif y == 0.5:  # torch's sqrt (oneMKL VM on the CPU: 0.74 ulp measured for pow(x, 0.5) too)
                E = L("sqrt", v, x) if not isinstance(_spec(lib, "sqrt", half), str) else r(v)
            elif y == 3.0:
                E = r(v) + np.abs(x) * r2
            elif y == -2.0:  # 1 / fl(x x): where fl(x x) overflows (to inf) the result is 0
                E = r(v) + av / x2 * r2
                sq = fmt if fmt.name == "bfloat16" else w  # (x x rounded to bfloat16, measured; float16's in w)
                top = math.ldexp(1.0 - 2.0**-(sq.prec + 1), sq.emax + 1) if sq.prec < 53 else math.inf  # (to inf)
                E = np.where((np.abs(x2) >= top) | np.isinf(x2), np.maximum(E, av), E)
            elif y == -0.5:
                s = np.sqrt(x)
                ls = L("sqrt", s, x) if not isinstance(_spec(lib, "sqrt", half), str) else r(s)
                if half:
                    ls = ls + 0.5 * _ulp(s, fmt, True)
                E = r(v) + av / s * ls
            else:
                E = L("pow", v, x)
        elif fn in ("sigmoid", "silu"):
            e = np.exp(-x)
            s = 1.0 + e
            le = L("exp", e, -x)
            if le is None:
                return None
            E = r(v) + av * ((r(s) + le) / s)  # (|v| / s underflows where e**-x is huge)
            over = ~(e < np.ldexp(1.0 - 2.0**-20, w.emax + 1))  # e**-x overflows: the result is 0
            E = np.where(over, np.maximum(E, av * 1.01), E)
        elif fn == "gelu":
            a = x * (1.0 / math.sqrt(2.0))
            t = np.array([math.erf(q) for q in a.tolist()]) if a.size < 4096 else _erf(a)
            da = np.abs(a) * u + r(a)
            lt = L("erf_vec" if w is FLOAT32 else "erf", t, a)
            if lt is None:
                return None
            dt = lt + 2.0 / math.sqrt(math.pi) * np.exp(-a * a) * da
            b = 1.0 + t
            h = 0.5 * x
            E = r(v) + np.abs(h) * (r(b) + dt) + np.abs(b) * r(h)
            E = np.where(2.0 * np.abs(x) < np.ldexp(1.0, w.emax + 1), E, np.inf)  # x (1 + erf) may overflow
        elif fn == "gelu_tanh":
            tf = _tanh_form(x, r, L, u)
            if tf is None:
                return None
            _, x3, t, dt = tf
            b = 1.0 + t
            h = 0.5 * x
            E = r(v) + np.abs(h) * (r(b) + dt) + np.abs(b) * r(h)
            E = np.where(np.isfinite(x3), E, np.maximum(np.nan_to_num(E, nan=0.0), av * 1.01))
        elif fn == "softplus":
            beta = params[0]
            y = beta * x
            dy = 0.0 if beta == 1.0 else r(y)
            e = np.exp(y)
            le = L("exp", e, y)
            ll = L("log1p", np.log1p(e), e)
            if le is None or ll is None:
                return None
            E = (ll + (le + e * dy) / (1.0 + e)) / abs(beta) + (0.0 if beta == 1.0 else r(v))
        else:
            raise ValueError(f"elementwise: no bound for {fn!r}")
        if E is None:
            return None
        E = np.asarray(E, np.float64) * (1.0 + SLACK)
        if half and fn in ("gelu", "gelu_tanh", "silu"):  # measured: results below float32's normal range
            E = np.where(av < np.ldexp(1.0, FLOAT32.emin), np.maximum(E, av), E)  # flushed to zero
        if half:
            E = E + 0.5 * _ulp(av + E, fmt)
        return E


_KAPPA, _BETA = 0.044715, math.sqrt(2.0 / math.pi)  #: gelu (tanh)'s constants


def _tanh_form(x, r, L, u):
    """gelu (tanh)'s ``t = tanh(beta (x + kappa (x x) x))``, each step a rounding ``r``, the constants within
    ``u`` relative, tanh within the library's ``L``: (x x, x**3, t, the bound of the computed t), or None
    where the library has no tanh (module docstring; the forward's and the gradient's first steps)."""
    x2 = x * x
    x3 = x2 * x
    k = _KAPPA * x3
    s = x + k
    inner = _BETA * s
    t = np.tanh(inner)
    dx3 = r(x3) + np.abs(x) * r(x2)
    din = r(inner) + np.abs(inner) * u + _BETA * (r(s) + (r(k) + np.abs(k) * u + _KAPPA * dx3))
    lt = L("tanh", t, inner)
    if lt is None:
        return None
    return x2, x3, t, lt + (1.0 - t * t) * din


def _erf(a):
    hi, lo = ew.values("erf", a, FLOAT64)
    return np.where(np.isnan(hi), np.vectorize(math.erf)(a), hi)


def _candidates(device):
    kind = device.split(":")[0]
    rounding = [lib for lib in LIBRARIES if not lib.reduced and (kind not in ("cpu", "cuda") or kind in lib.devices)]
    reduced = [lib for lib in LIBRARIES if lib.reduced and (kind not in ("cpu", "cuda") or kind in lib.devices)]
    return rounding, reduced


def _errors(act, ref, v, fmt, vlo=0.0):
    """|actual - (v + vlo)| (inf for unequal specials, 0 for equal ones), an infinite actual counted as
    ``2**(emax+1)`` where v is finite (the next value past the largest finite one); ``actual - v`` is
    exact where the two are close (Sterbenz), so a float64 result is measured to the double word."""
    top = math.ldexp(1.0, fmt.emax + 1) if fmt.emax < 1023 else np.finfo(np.float64).max  # (float64: its largest)
    a = np.where(np.isinf(act) & np.isfinite(v), np.sign(act) * top, act)
    with np.errstate(invalid="ignore"):
        err = np.abs((a - v) - vlo)
    same = (act == ref) | (np.isnan(act) & np.isnan(ref))
    err = np.where(same, 0.0, err)
    return np.where(np.isnan(err), np.inf, err), same


def _decide(fits, same, approx):
    """The verdict of the yardstick from ``fits`` (library name -> (library, explained per element, error / bound
    per element, ...)), the elements ``same`` as the reference and, for gelu, those ``approx`` within the tanh
    form's bound (else None): (verdict, precision, model, classes 0..3, the ratio of the class named or the
    closest rounding class, the flat indices of the (at most) ten worst elements, worst first). The class that
    explains every element with the smallest largest ratio is named (ties: the registry's order, torch's own
    first); beyond every rounding class a fast-math class, then the tanh approximation; else a mismatch."""
    order = {lib.name: i for i, lib in enumerate(LIBRARIES)}
    cands = [(float(np.max(f[2], initial=0.0)), order[n], n) for n, f in fits.items()
             if not f[0].reduced and f[1].all()]  # fmt: skip
    red = [(float(np.max(f[2], initial=0.0)), n) for n, f in fits.items() if f[0].reduced and f[1].all()]
    if bool(same.all()):
        verdict, precision, model = "exact", None, "correctly rounded"
    elif cands:
        verdict, precision, model = "rounding", None, min(cands)[2]
    elif red:
        verdict, precision, model = "reduced-precision", min(red)[1], min(red)[1]
    elif approx is not None and approx.all():
        verdict, precision, model = "reduced-precision", "gelu tanh approximation", "gelu tanh approximation"
    else:
        verdict, precision, model = "mismatch", None, None
    ok_any = np.zeros(same.size, np.bool_)
    for f in fits.values():
        if not f[0].reduced:
            ok_any |= f[1]
    classes = np.where(same, 0, np.where(ok_any, 1, 2 if verdict == "reduced-precision" else 3))
    primary = fits.get(model)
    if primary is None:  # the rounding class that comes closest (mismatch, or a reduced precision)
        near = [f for f in fits.values() if not f[0].reduced]
        primary = min(near, key=lambda f: float(np.max(f[2], initial=0.0))) if near else None
    ratio = primary[2] if primary is not None else np.where(same, 0.0, np.inf)
    key = np.where(classes == 3, ratio, 0.0) if verdict == "mismatch" else ratio
    top = np.argsort(-np.nan_to_num(key, nan=np.inf), kind="stable")[:10]
    return verdict, precision, model, classes, ratio, np.asarray([int(i) for i in top if key[i] > 0], np.int64)


def _hypotheses(fits) -> tuple:
    """(hypotheses, bound_ratios) of the yardstick's Report: per library, whether it explains every element, its
    largest error / bound, how many it leaves unexplained and whether it is a fast-math class."""
    hyps = {n: {"explains": bool(f[1].all()), "max_ratio": float(np.max(f[2], initial=0.0)),
                "unexplained": int((~f[1]).sum()), "reduced": f[0].reduced} for n, f in fits.items()}  # fmt: skip
    return hyps, {n: {"worst_case": v["max_ratio"]} for n, v in hyps.items()}


def analyse(act, fmt, device, fn, op, x, params, rtol=None, atol=None):
    """The Report of an elementwise op (``fn`` the kernel's name, ``op`` the registry's), from the
    backend's values ``act`` (float64 array) and the input values ``x`` (float64 array)."""
    shape = act.shape
    a, xf = act.reshape(-1), np.asarray(x, np.float64).reshape(-1)
    ref = np.asarray(_reference(fn, xf, fmt, params), np.float64)
    hi, lo = ew.values(fn, xf, fmt, params)
    known = ~(np.isnan(hi) & ~np.isnan(ref))
    v = np.where(known, hi, ref)  # the exact path alone: the rounded value
    err, same = _errors(a, ref, v, fmt, np.where(known, lo, 0.0))
    if fn == "pow" and not np.ndim(params[0]) and params[0] in (0.5, -0.5):  # C99's pow(-0, y), pow(-inf, y):
        neg = (xf == 0) | (xf == -np.inf)  # torch's float16 gives them, its float32/float64 sqrt's and rsqrt's
        alt = np.where(xf == 0, 0.0 if params[0] > 0 else np.inf, np.inf if params[0] > 0 else 0.0)  # (the reference's)
        c99 = neg & (a == alt) & ~np.signbit(a)
        same, err = same | c99, np.where(c99, 0.0, err)
    rounding, reduced = _candidates(device)
    fits = {}
    for lib in rounding + (reduced if fmt.prec <= FLOAT32.prec else []):  # fast-math intrinsics are float32's
        B = bounds(fn, xf, v, fmt, lib, params)
        if B is None:
            continue
        ok = same | (err <= B)
        if fn == "softplus":
            ok |= (a == xf) & (np.abs(params[0] * xf - params[1]) <= 2.0 * _ulp(params[0] * xf, FLOAT32))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(same | (np.isposinf(B) & np.isposinf(err)), 0.0, err / B)  # an infinite B: any result
        fits[lib.name] = (lib, ok, ratio, B)
    approx = None
    if fn == "gelu":  # the tanh form where the erf form was asked
        rt = np.asarray(_reference("gelu_tanh", xf, fmt, ()), np.float64)
        ht, lt = ew.values("gelu_tanh", xf, fmt)
        vt = np.where(np.isnan(ht), rt, ht)
        et, st = _errors(a, rt, vt, fmt, np.where(np.isnan(ht), 0.0, lt))
        best = [bounds("gelu_tanh", xf, vt, fmt, lib) for lib in rounding]
        Bt = np.max([b for b in best if b is not None], axis=0)
        approx = st | (et <= Bt)
    verdict, precision, model, classes, ratio, top = _decide(fits, same, approx)
    ulps = err / _ulp(v, fmt)
    notes = []
    if verdict == "rounding":
        notes.append(f"within the documented accuracy of {model} (the largest error is "
                     f"{float(np.max(ratio, initial=0.0)):.3g}x its bound)")  # fmt: skip
    finite = np.isfinite(ulps)
    hyps, ratios = _hypotheses(fits)
    return build(
        op=op, device=device, dtype=fmt.name, shape=shape, n_terms=1, verdict=verdict, precision=precision,
        classes=classes, model=model, actual=a, reference=ref, top=top,
        at_worst={"ulp": ulps[top], "bound_ratio": ratio[top], "test_ratio": ratio[top], "condition": 1.0,
                  "input": xf[top]},
        max_ulp=float(np.max(np.where(finite, ulps, 0.0), initial=0.0)) if finite.any() else float("inf"),
        max_bound_ratio=float(np.max(ratio, initial=0.0)), max_prob_ratio=float(np.max(ratio, initial=0.0)),
        hypotheses=hyps, bound_ratios=ratios, error=lambda: errors(a, ref, same), rtol=rtol, atol=atol,
        axes=tuple(f"dim{i}" for i in range(len(shape))), notes=notes,
    )  # fmt: skip


def _reference(fn, x, fmt, params):
    """The correctly rounded values of fn at the float64 inputs x (which lie in fmt), float64."""
    return ew.rounded(fn, x, fmt, params).astype(np.float64, copy=False)


def _call(name, bound):
    """(kernel name, input, params) of a bound call of the registry's op ``name``."""
    if name == "gelu":
        fn = "gelu" if bound["approximate"] == "none" else "gelu_tanh"
        if bound["approximate"] not in ("none", "tanh"):
            raise ValueError(f"compare: unknown approximate={bound['approximate']!r}; choose one of 'none', 'tanh'.")
        return fn, bound["input"], ()
    if name == "softplus":
        return name, bound["input"], (float(bound["beta"]), float(bound["threshold"]))
    if name == "pow":
        return name, bound["input"], (bound["exponent"],)
    return name, bound["input"], ()


def _operands(name, inp, params):
    """(input values (float64, the result's shape), params, format, tensor) of a bound call: pow with a tensor
    exponent or a number base through :func:`refkern.kernels.elementwise.pow_operands` (both operands broadcast and
    rounded to the result's format, as torch casts them; the exponents one per element), else the input itself."""
    from refkern._arrays import operand

    if name == "pow":
        e = params[0]
        if hasattr(e, "shape") or not (hasattr(inp, "shape") and hasattr(inp, "dtype")):
            x, y, fmt, shape, tensor = ew.pow_operands(inp, e, "compare")
            return x.reshape(shape), (y,), fmt, tensor
        params = (float(e),)
    x = operand(inp, "input", "compare")
    return np.asarray(x.values, np.float64).reshape(x.shape), params, x.fmt, x.torch


def compare_call(actual, name, args, kwargs, rtol=None, atol=None, arrays=False):
    """:func:`refkern.compare` for an elementwise op: (Report, per-element arrays or None)."""
    from refkern._arrays import is_tensor, operand
    from refkern.analysis.evaluate import _bind

    device = str(actual.device) if is_tensor(actual) else "numpy"
    act = operand(actual, "actual", "compare")
    fn, inp, params = _call(name, _bind(name, args, kwargs))
    xv, params, fmt, _ = _operands(name, inp, params)
    if tuple(act.shape) != tuple(xv.shape):
        raise ValueError(f"compare: actual.shape={tuple(act.shape)} differs from the shape {name} gives for these "
                         f"inputs, {tuple(xv.shape)}; pass the same arguments that produced it.")  # fmt: skip
    if act.fmt != fmt:
        raise TypeError(f"compare: {name} returns the input's dtype ({fmt.name}); got actual.dtype={act.fmt.name}.")
    a64 = np.asarray(act.values, np.float64).reshape(act.shape)
    rep = analyse(a64, act.fmt, device, fn, name, xv, params, rtol, atol)
    if not arrays:
        return rep, None
    lib = {b.name: b for b in LIBRARIES}.get(rep.model) or _candidates(device)[0][0]  # the named class, or torch's
    xf = xv.reshape(-1)
    ref = _reference(fn, xf, act.fmt, params)
    hi, _ = ew.values(fn, xf, act.fmt, params)
    B = bounds(fn, xf, np.where(np.isnan(hi), ref, hi), act.fmt, lib, params)
    B = np.full(xf.size, np.inf) if B is None else B
    return rep, {"actual": a64, "report": rep, "bound": B.reshape(a64.shape), "reference": ref.reshape(a64.shape)}
