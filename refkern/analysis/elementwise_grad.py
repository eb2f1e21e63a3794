"""The yardstick of the elementwise activations' gradients (:func:`refkern.compare_backward` of tanh, sigmoid,
silu and gelu): a correct backward kernel evaluates torch's composite formula in the working precision, with
its math library's accuracy, from the forward's stored output where it takes one; it is not correctly rounded.

As for the forward functions (:mod:`refkern.analysis.elementwise`), each step's error is propagated to first
order, the derivatives taken at the exact values (float64), every bound widened by ``SLACK`` for the
second-order terms; ``r(y)`` is one rounding in the working format w (float32 for float16, bfloat16 and
float32 inputs, float64 for float64), ``L_f(y)`` the library's bound for f at its result y, ``u`` w's unit
roundoff (a constant rounded to w, or to the half format for half inputs: ``scalar_t(...)`` in ATen's
reduced-float kernels). The formulas (ATen's CPU kernels, ``Activation.cpp`` and ``BinaryOpsKernel.cpp``;
CUDA's the same in opmath):

==================  ==========================================================================================
tanh_backward       ``g (1 - y*y)``, y the stored forward (its bound ``E_y``: the forward yardstick's, with the
                    rounding to a half output; float16: every step rounded to float16, ATen's Vectorized<Half>):
                    ``E = |g| (2|t| E_y + r(t**2) + r(1 - t**2)) + r(out)``
sigmoid_backward    ``(g (1 - y)) y``: ``dc = E_y + r(c)``, ``E = |q| E_y + |y| (|g| dc + r(q)) + r(out)``
silu_backward       ``s = 1 / (1 + exp(-x))``, ``g s (1 + x (1 - s))``: exp, add, divide, subtract, multiply,
                    add, multiply, multiply, each a rounding (where exp(-x) overflows the result is 0: E >= |v|)
gelu_backward       ``cdf = 0.5 (1 + erf(x a))``, ``pdf = b exp(-0.5 x*x)``, ``g (cdf + x pdf)``, a = 1/sqrt 2,
                    b = 1/sqrt(2 pi) constants (relative error u)
gelu_backward tanh  ``x2 = x*x``, ``inner = beta (x + kappa x2 x)``, ``t = tanh(inner)``, ``g (0.5 (1 + t) + 0.5 x
                    (1 - t*t) beta (1 + 3 kappa x2))``; the three-factor product charged ``2 u |p|``; where
                    x*x overflows w, any result (torch's ``0 * inf``: NaN at float32's largest x, measured)
==================  ==========================================================================================

For a half result: ``B = E + 0.5 ulp_out(|v| + E)``. Verdicts as the forward's: ``exact``, ``rounding`` (the
class that explains every element with the smallest largest ratio, named), ``reduced-precision`` (a fast-math
class; for gelu's erf form, the tanh form's gradient: "gelu tanh approximation"), else ``mismatch``.
"""

import math

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis.elementwise import (
    _BETA,
    _KAPPA,
    SLACK,
    _candidates,
    _decide,
    _errors,
    _hypotheses,
    _steps,
    _tanh_form,
    _ulp,
    bounds,
)
from refkern.analysis.report import build, errors
from refkern.kernels import elementwise as ew
from refkern.kernels import elementwise_grad as eg

__all__ = ["grad_bounds", "judge_grad"]


def _fwd(fn, x, fmt, lib):
    """The exact forward t and the bound of the stored forward output (the forward yardstick's)."""
    hi, lo = ew.values(fn, x, fmt)
    t = np.where(np.isnan(hi), np.asarray(ew._apply(fn, fn, x.astype(np.float64)), np.float64), hi)
    return t, bounds(fn, x, t, fmt, lib)


def grad_bounds(fn, g, x, v, fmt, lib):
    """The bound B (absolute, per element; module docstring) of ``lib`` for the gradient of ``fn`` at inputs x
    and grad_output g (float64 arrays) with exact gradient v, or None where the library lacks a function."""
    w, half, r, L = _steps(fmt, lib)
    u = w.u if not half else fmt.u  # constants: rounded to the half format in ATen's reduced-float kernels
    ag = np.abs(g)

    with np.errstate(all="ignore"):
        if fn in ("tanh", "sigmoid"):
            if fmt.name == "float16":  # ATen's CPU kernels run these in Vectorized<Half>: each step rounded
                def r(y):  # to float16 (measured: sigmoid_backward 1.87 ulp at x = -0.0165, beyond float32's)
                    return 0.5 * _ulp(y, fmt, True)

            t, ey = _fwd(fn, x, fmt, lib)
            if ey is None:
                return None
            if fn == "tanh":
                o = 1.0 - t * t
                E = ag * (2 * np.abs(t) * ey + r(t * t) + r(o)) + r(g * o)
            else:
                c = ew.values("sigmoid", -x, fmt)[0]
                c = np.where(np.isnan(c), 1.0 - t, c)
                q = g * c
                E = np.abs(q) * ey + t * (ag * (ey + r(c)) + r(q)) + r(q * t)
        elif fn == "silu":
            e = np.exp(-x)
            le = L("exp", e, -x)
            if le is None:
                return None
            d1 = 1.0 + e
            s = 1.0 / d1
            ds = s * (le + r(d1)) / d1 + r(s)
            c = e / d1  # 1 - s, exact
            m = x * c
            p = 1.0 + m
            dp = np.abs(x) * (ds + r(c)) + r(m) + r(p)
            q = g * s
            E = np.abs(q) * dp + np.abs(p) * (ag * ds + r(q)) + r(q * p)
            over = ~(e < np.ldexp(1.0 - 2.0**-20, w.emax + 1))  # exp(-x) overflows: torch's result is 0
            E = np.where(over, np.maximum(np.nan_to_num(E), np.abs(v) * 1.01), E)
        elif fn == "gelu":
            a = x / math.sqrt(2.0)
            t = np.asarray(ew.values("erf", a, FLOAT64)[0])
            t = np.where(np.isnan(t), np.vectorize(math.erf, otypes=[np.float64])(a), t)
            da = np.abs(a) * u + r(a)
            lt = L("erf_vec" if w is FLOAT32 else "erf", t, a)
            e = np.exp(-0.5 * x * x)
            le = L("exp", e, -0.5 * x * x)
            if lt is None or le is None:
                return None
            dt = lt + 2.0 / math.sqrt(math.pi) * np.exp(-a * a) * da
            cdf = 0.5 * (1.0 + t)
            dcdf = 0.5 * (dt + r(1.0 + t)) + r(cdf)
            b = 0.5 * math.sqrt(2.0 / math.pi)
            sq = x * x
            de = le + e * (0.5 * r(sq) + r(0.5 * sq))
            pdf = b * e
            dpdf = b * de + pdf * u + r(pdf)
            xp = x * pdf
            s = cdf + xp
            E = ag * (dcdf + np.abs(x) * dpdf + r(xp) + r(s)) + r(g * s)
        elif fn == "gelu_tanh":
            kap, beta = _KAPPA, _BETA
            tf = _tanh_form(x, r, L, u)
            if tf is None:
                return None
            x2, _, t, dt = tf
            right = 1.0 + t
            dld = 0.5 * (dt + r(right))
            td = 1.0 - t * t
            dtd = 2 * np.abs(t) * dt + r(t * t) + r(td)
            m2 = 3 * kap * x2
            o = 1.0 + m2
            did = beta * (np.abs(m2) * 2 * u + 3 * kap * r(x2) + r(m2) + r(o)) + beta * o * u
            idv = beta * o
            left = 0.5 * x
            rd = left * td * idv
            drd = np.abs(left) * (dtd * idv + td * did) + 2 * u * np.abs(rd) + r(left) * td * idv
            tot = 0.5 * right + rd
            E = ag * (dld + drd + r(tot)) + r(g * tot)
            E = np.where(np.abs(x) < np.ldexp(1.0, (w.emax + 1) // 2), E, np.inf)  # x*x overflows: 0 * inf, NaN
        else:
            raise ValueError(f"elementwise: no gradient bound for {fn!r}")
        E = np.asarray(E, np.float64) * (1.0 + SLACK)
        if half:
            E = E + 0.5 * _ulp(np.abs(v) + E, fmt)
        return E


def judge_grad(name, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for the gradient ``got`` of the input of elementwise op ``name``."""
    from refkern._arrays import is_tensor, operand

    fn = eg.grad_fn(name, bound)
    x, g, (gf, xf) = eg._operands(name, grad_output, bound, who)
    act = operand(got, "the gradient", who)
    if act.fmt.name != x.fmt.name:
        raise TypeError(f"{who}: the gradient of input must have the dtype of input, {x.fmt.name}; got "
                        f"{act.fmt.name}.")  # fmt: skip
    fmt, shape = x.fmt, tuple(x.shape)
    device = str(got.device) if is_tensor(got) else "numpy"
    a = np.asarray(act.values, np.float64).reshape(-1)
    ref = eg.reference(fn, gf, xf, fmt)
    v, rad, _, done = eg.values(fn, gf, xf, fmt)
    v = np.where(done | ~np.isfinite(rad), np.where(done & (rad == 0), ref, v), v)
    v = np.where(np.isfinite(v), v, ref)
    err, same = _errors(a, ref, v, fmt)
    err = np.maximum(err - np.where(np.isfinite(rad), rad, 0.0), 0.0)  # the ball's own radius: to the error's favour
    rounding, reduced = _candidates(device)
    fits = {}
    for lib in rounding + (reduced if fmt.prec <= FLOAT32.prec else []):
        B = grad_bounds(fn, gf, xf, v, fmt, lib)
        if B is None:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(same | np.isposinf(B) | (err == 0), 0.0, err / B)  # an infinite B: any result
        fits[lib.name] = (lib, same | (err <= B), ratio)
    approx = None
    if fn == "gelu":  # the tanh form's gradient where the erf form's was asked
        rt = eg.reference("gelu_tanh", gf, xf, fmt)
        et, st = _errors(a, rt, rt, fmt)
        Bs = [grad_bounds("gelu_tanh", gf, xf, rt, fmt, lib) for lib in rounding]
        Bt = np.max([b for b in Bs if b is not None], axis=0) + 0.5 * _ulp(rt, fmt)
        approx = st | (et <= Bt)
    verdict, precision, model, classes, ratio, top = _decide(fits, same, approx)
    ulps = err / _ulp(np.where(np.isfinite(v), v, 0.0), fmt)
    notes = [f"the gradient judged against {fn}'s backward formula in the working precision with each library's "
             "accuracy (refkern.analysis.elementwise_grad)"]  # fmt: skip
    finite = np.isfinite(ulps)
    hyps, ratios = _hypotheses(fits)
    return build(
        op=f"{name} backward", device=device, dtype=fmt.name, shape=shape, n_terms=1, verdict=verdict,
        precision=precision, classes=classes, model=model, actual=a, reference=ref, top=top,
        at_worst={"ulp": ulps[top], "bound_ratio": ratio[top], "test_ratio": ratio[top], "condition": 1.0,
                  "input": xf[top], "grad_output": gf[top]},
        max_ulp=float(np.max(np.where(finite, ulps, 0.0), initial=0.0)),
        max_bound_ratio=float(np.max(ratio, initial=0.0)), max_prob_ratio=float(np.max(ratio, initial=0.0)),
        hypotheses=hyps, bound_ratios=ratios, error=lambda: errors(a, ref, same), rtol=rtol, atol=atol, notes=notes,
    )  # fmt: skip
