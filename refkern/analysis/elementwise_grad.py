"""The yardstick of the elementwise ops' gradients (:func:`refkern.compare_backward` of tanh, sigmoid, silu,
gelu and the math functions exp ... cos): a correct backward kernel evaluates torch's composite formula in the
working precision, with its math library's accuracy, from the forward's stored output where it takes one; it
is not correctly rounded.

As for the forward functions (:mod:`refkern.analysis.elementwise`), each step's error is propagated to first
order, the derivatives taken at the exact values (float64), every bound widened by ``SLACK`` for the
second-order terms; ``r(y)`` is one rounding in the working format w (float32 for float16, bfloat16 and
float32 inputs, float64 for float64), ``L_f(y)`` the library's bound for f at its result y, ``u`` w's unit
roundoff (a constant rounded to w, or to the half format for half inputs: ``scalar_t(...)`` in ATen's
reduced-float kernels). The formulas (ATen's CPU kernels, ``Activation.cpp`` and ``BinaryOpsKernel.cpp``;
CUDA's the same in opmath, except tanh's and sigmoid's backward for half results: ``BinaryMiscBackwardOpsKernels.cu``
writes ``a * (scalar_t{1.} - b * b)`` and ``a * (scalar_t(1.) - b) * b`` in ``scalar_t``, whose c10 ``BFloat16``
and ``Half`` operators round each product and difference to the half format; seen on an H200, torch 2.11: bfloat16
gradients 2.1 ulp off, 1.9x the opmath bound, so a CUDA class charges each step at the half format's half-ulp):

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

The math functions' gradients are torch's autograd formulas (``tools/autograd/derivatives.yaml``), each step a
separate op whose result is stored in the input's dtype (``rs(y)``: a rounding in w, or to the half format for
half inputs; an infinity where it overflows that dtype), ``t`` the stored forward output within its forward
bound ``E_t`` (an infinite bound where it overflows):

==================  ==========================================================================================
exp, expm1          ``g * t``, ``g * (t + 1)``: ``E = |g| E_t (+ |g| rs(t + 1)) + r(v)``
exp2                ``(g * t) * c``, c = ln 2 a constant of w (relative error u): ``E = c (|g| E_t + rs(g t)) +
                    |v| u + r(v)``
log, log1p          ``g / x``: ``r(v)``; ``g / (x + 1)``: ``|v| rs(x + 1) / |x + 1| + r(v)``
log2                ``g / (x * c)``, c = ln 2 a constant of w: ``E = |v| (u + rs(x c) / |x c|) + r(v)``
sqrt                ``g / (2 t)``: ``|v| E_t / t + r(v)``
rsqrt               ``(-0.5 g) * t**3``, ``t**3 = (t t) t``: ``E_p = 3 t**2 E_t + |t| rs(t**2) + rs(t**3)``,
                    ``E = 0.5 |g| E_p + |t**3| rs(0.5 g) + r(v)``
reciprocal          ``-g * (t t)``: ``E = |g| (2 |t| E_t + rs(t**2)) + r(v)``
pow                 ``g * (y * p)``, p = pow(x, y - 1) within the forward pow's bound ``E_p``, y a constant of w:
                    ``E = |g| (|y| E_p + |y p| u + rs(y p)) + r(v)``; y = 0: torch's zeros, ``E = 0``. A tensor
                    exponent: ``d = y - 1`` a stored op (``rs(d)``), p = pow(x, d) per element (the library's
                    pow), ``E_p`` plus ``|p| expm1(|ln x| rs(d))``, y exact: ``E = |g| (|y| E_p + rs(y p)) + r(v)``
pow (exponent)      ``g * (t * log(x))``, t the stored forward (``E_t``), log x stored (``E_l``, the forward log's):
                    ``E = |g| (|log x| E_t + |t| E_l + rs(t log x)) + r(v)``; torch's 0 where x = 0, y >= 0
erf                 ``(c * exp(-(x*x))) * g``, c = 2/sqrt(pi): ``E_e = L_exp(e) + e expm1(rs(x**2))`` (+ the
                    rounding to the half format), ``E = |g| (c E_e + c e u + rs(c e)) + r(v)``
softplus_backward   one kernel, in w: ``z = exp(b x)``, ``E_z = L_exp(z) + z expm1(r(b x))``, ``E = |g| E_z / (1 +
                    z)**2 + |v| (r(g z) / |g z| + r(1 + z) / (1 + z)) + r(v)``; where ``fl(b x)`` may fall on the
                    other side of the threshold, g itself is accepted too; where z overflows w, any result
sin, cos            ``g * cos(x)``, ``g * -sin(x)``: ``E = |g| E_c + r(v)``, E_c the forward cos's (sin's) bound
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
from refkern.kernels.pow_backward import _sum2_rows  # the reference's own Sum2 of rows

__all__ = ["grad_bounds", "judge_grad", "judge"]

_LN2 = math.log(2.0)


def _fwd(fn, x, fmt, lib, p=()):
    """The exact forward t and the bound of the stored forward output (the forward yardstick's)."""
    hi, lo = ew.values(fn, x, fmt, p)
    t = np.where(np.isnan(hi), np.asarray(ew._apply(fn, fn, x.astype(np.float64), p), np.float64), hi)
    return t, bounds(fn, x, t, fmt, lib, p)


def grad_bounds(fn, g, x, v, fmt, lib, p=()):
    """The bound B (absolute, per element; module docstring) of ``lib`` for the gradient of ``fn`` at inputs x and
    grad_output g (float64 arrays) with exact gradient v, or None where the library lacks a function; ``p``: pow's
    exponent, softplus's beta and threshold."""
    if fn in _COMPOSED:
        return _composed(fn, g, x, v, fmt, lib, p)
    w, half, r, L = _steps(fmt, lib)
    u = w.u if not half else fmt.u  # constants: rounded to the half format in ATen's reduced-float kernels
    ag = np.abs(g)

    with np.errstate(all="ignore"):
        if fn in ("tanh", "sigmoid"):
            if fmt.name == "float16" or (half and "cuda" in lib.devices):  # each step rounded to the half
                def r(y):  # format: ATen's CPU kernels in Vectorized<Half> (measured: sigmoid_backward 1.87 ulp at
                    return 0.5 * _ulp(y, fmt, True)  # x = -0.0165, beyond float32's); CUDA's in scalar_t (docstring)

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


_COMPOSED = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "erf", "softplus",
             "sin", "cos", "pow_exponent")  # fmt: skip


def _composed(fn, g, x, v, fmt, lib, p):
    """The bound of the math functions' gradients (module docstring's second table): torch's autograd formulas,
    each step a separate op whose result is stored in the input's dtype (``rs``: a rounding to the half format
    for half inputs), the stored forward output t within its forward bound ``E_t``; softplus_backward is one
    kernel (its steps in the working format)."""
    w, half, r, L = _steps(fmt, lib)
    u = w.u
    ag, av = np.abs(g), np.abs(v)

    # from here on a value rounds to an infinity in the input's dtype (float64: its largest finite value)
    big = math.ldexp(2.0 - 2.0**-fmt.prec, fmt.emax) if fmt.prec < 53 else np.finfo(np.float64).max

    def rs(y):  # a stored intermediate: any value where it overflows the input's dtype
        return np.where(np.abs(y) < big, 0.5 * _ulp(y, fmt, True) if half else r(y), np.inf)

    with np.errstate(all="ignore"):
        if fn in ("exp", "exp2", "expm1", "sqrt", "reciprocal", "rsqrt"):
            t, et = _fwd(fn, x, fmt, lib)
            if et is None:
                return None
            et = np.where(np.abs(t) + et < big, et, np.inf)  # the stored output may be an infinity
            if fn in ("exp", "expm1"):  # g * t, g * (t + 1): the stored output, then the stored sum
                E = ag * (et + (rs(t + 1.0) if fn == "expm1" else 0.0)) + r(v)
            elif fn == "exp2":  # (g t) c: the stored product, times ln 2 rounded to w
                E = _LN2 * (ag * et + rs(g * t)) + av * u + r(v)
            elif fn == "sqrt":  # g / (2 t)
                E = av * et / np.abs(t) + r(v)
            elif fn == "reciprocal":  # -g (t t)
                E = ag * (2 * np.abs(t) * et + rs(t * t)) + r(v)
            else:  # rsqrt: (-0.5 g) (t**3), t**3 two roundings (t t t)
                ep = 3 * t * t * et + np.abs(t) * rs(t * t) + rs(t**3)
                E = 0.5 * ag * ep + np.abs(t**3) * rs(0.5 * g) + r(v)
        elif fn == "log":  # g / x
            E = r(v)
        elif fn == "log2":  # g / (x c): the stored product x c (c = ln 2 rounded to w), then one division
            d = x * _LN2
            E = av * (u + rs(d) / np.abs(d)) + r(v)
        elif fn == "log1p":  # g / (x + 1)
            s = x + 1.0
            E = av * rs(s) / np.abs(s) + r(v)
        elif fn == "pow" and np.ndim(p[0]):  # a tensor exponent: g (y pow(x, fl(y - 1))), each step stored
            y = p[0]
            d = y - 1.0
            ed = np.where(d == 0, 0.0, rs(d))  # the stored difference (exact within the format's reach)
            pp, ep = _fwd("pow", x, fmt, lib, (d,))
            if ep is None:
                return None
            ep = ep + np.abs(pp) * np.expm1(np.abs(np.log(np.abs(x))) * ed)  # x**(d + e) = x**d e**(e ln x): not
            # first order (bfloat16's y - 1 off by 2**-6 at x = 1e-3: 11% of p)
            ep = np.where(np.abs(pp) + ep < big, ep, np.inf)
            m = y * pp
            E = np.where(y == 0, 0.0, ag * (np.abs(y) * ep + rs(m)) + r(v))
        elif fn == "pow_exponent":  # g (t log x), t the stored forward pow(x, y), log x stored
            t, et = _fwd("pow", x, fmt, lib, (p[0],))
            lg, el = _fwd("log", x, fmt, lib)
            if et is None or el is None:
                return None
            et = np.where(np.abs(t) + et < big, et, np.inf)
            m = t * lg
            E = ag * (np.abs(lg) * et + np.abs(t) * el + rs(m)) + r(v)
        elif fn == "pow":  # g (y pow(x, y - 1)); torch's zeros where y = 0
            y = p[0]
            if y == 0.0:
                return np.zeros(v.shape)
            pp, ep = _fwd("pow", x, fmt, lib, (y - 1.0,))
            if ep is None:
                return None
            ep = np.where(np.abs(pp) + ep < big, ep, np.inf)
            m = y * pp
            E = ag * (abs(y) * ep + np.abs(m) * u + rs(m)) + r(v)
        elif fn == "erf":  # (c exp(-(x x))) g, c = 2 / sqrt(pi) a constant of the working format
            s = x * x
            e = np.exp(-s)
            le = L("exp", e, -s)
            if le is None:
                return None
            ee = le + e * np.expm1(rs(s)) + (0.5 * _ulp(e, fmt, True) if half else 0.0)  # x*x stored: exp's argument
            # off by rs(s), which bfloat16 makes large (0.25 at x*x = 65): e**d - 1, not its first order d
            c = 2.0 / math.sqrt(math.pi)
            E = ag * (c * ee + c * e * u + rs(c * e)) + r(v)
        elif fn == "softplus":  # one kernel: z = exp(b x), g z / (z + 1) (g itself beyond the threshold)
            b = p[0]
            y = b * x
            z = np.exp(y)
            lz = L("exp", z, y)
            if lz is None:
                return None
            ez = lz + z * (0.0 if b == 1.0 else np.expm1(r(y)))
            n = g * z
            E = ag * ez / (1.0 + z) ** 2 + av * (r(n) / np.abs(n) + r(1.0 + z) / (1.0 + z)) + r(v)
            E = np.where(z < np.ldexp(1.0, w.emax), np.nan_to_num(E, nan=0.0), np.inf)  # z overflows: inf / inf
        else:  # sin: g cos x; cos: g (-sin x), the stored cos or sin
            _, et = _fwd("cos" if fn == "sin" else "sin", x, fmt, lib)
            if et is None:
                return None
            E = ag * et + r(v)
        E = np.where(np.isnan(E) | (np.abs(v) + E < big), E, np.inf)  # the result itself overflows: any infinity
        E = np.where(np.isnan(E), np.inf, np.asarray(E, np.float64)) * (1.0 + SLACK)
        if half:
            E = E + 0.5 * _ulp(av + E, fmt)
        return E


def judge_grad(name, got, grad_output, bound, who="compare_backward", rtol=None, atol=None, k="input"):
    """compare_backward's Report for the gradient ``got`` of argument k (the input; pow's tensor exponent) of
    elementwise op ``name``."""
    from refkern.analysis.compare import _actual_grad

    if eg.tensor_exponent(name, bound):  # pow(Tensor, Tensor): either gradient, each element its own exponent
        fn = "pow" if k == "input" else "pow_exponent"
        xf, y, fmt, shape, _ = ew.pow_operands(bound["input"], bound["exponent"], who)
        gf = np.ascontiguousarray(eg.grad_output(grad_output, name, fmt, shape, who).values, np.float64).reshape(-1)
        p = (y,)
    else:
        fn = eg.grad_fn(name, bound)
        x, g, (gf, xf) = eg._operands(name, grad_output, bound, who)
        p = eg.grad_params(name, bound, who)
        fmt, shape = x.fmt, tuple(x.shape)
    act, device = _actual_grad(got, k, fmt, who)
    a = np.asarray(act, np.float64).reshape(-1)
    ref = eg.reference(fn, gf, xf, fmt, p)
    v, rad, _, done = eg.values(fn, gf, xf, fmt, p)
    v = np.where(done | ~np.isfinite(rad), np.where(done & (rad == 0), ref, v), v)
    v = np.where(np.isfinite(v), v, ref)
    err, same = _errors(a, ref, v, fmt)
    err = np.maximum(err - np.where(np.isfinite(rad), rad, 0.0), 0.0)  # the ball's own radius: to the error's favour
    rounding, reduced = _candidates(device)
    fits = {}
    for lib in rounding + (reduced if fmt.prec <= FLOAT32.prec else []):
        B = grad_bounds(fn, gf, xf, v, fmt, lib, p)
        if B is None:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(same | np.isposinf(B) | (err == 0), 0.0, err / B)  # an infinite B: any result
        ok = same | (err <= B)
        if fn == "softplus":  # fl(b x) on the other side of the threshold: torch's g itself
            with np.errstate(over="ignore", invalid="ignore"):
                ok |= (a == gf) & (np.abs(p[0] * xf - p[1]) <= 2.0 * _ulp(p[0] * xf, FLOAT32))
        fits[lib.name] = (lib, ok, np.where(ok, np.minimum(ratio, 1.0), ratio))
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


def judge(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """The judge the elementwise ops' records name (:class:`refkern.ops.Backward`): :func:`judge_grad`."""
    return judge_grad(name, got, grad_output, bound, who, rtol, atol, k)


def reduced_arguments(name, bound, wrt) -> tuple:
    """The arguments of ``wrt`` whose gradient is a sum (:func:`judge_reduced`): pow's tensor operands broadcast
    against the other one (fewer elements than the result), as autograd's ``sum_to`` reduces them."""
    if not eg.tensor_exponent(name, bound):
        return ()
    shapes = [tuple(np.shape(bound[k])) for k in ("input", "exponent") if ew._is_array(bound.get(k))]
    shape = np.broadcast_shapes(*shapes)
    return tuple(k for k in wrt if ew._is_array(bound.get(k)) and tuple(np.shape(bound[k])) != shape)


def _gamma(n, u):
    """``gamma_{n-1} = (n-1) u / (1 - (n-1) u)``: every order of summing n terms in a format of unit roundoff u
    errs by at most ``gamma_{n-1}`` times the sum of their magnitudes (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., (4.4)); torch's float32 cascade and pairwise sums included."""
    m = np.maximum(np.asarray(n, np.float64) - 1.0, 0.0)
    return m * u / (1.0 - m * u)


def judge_reduced(name, k, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for the gradient of pow's operand ``k`` broadcast against the other one: autograd's
    ``sum_to`` of the elementwise gradients, ``G_i = sum_{j -> i} e_j`` over the result elements j that read
    element i of k (``e_j = g_j y_j x_j**(y_j - 1)``, or ``g_j x_j**y_j ln x_j`` for the exponent).

    The reference: each ``e_j`` a float64 ball ``v_j +- rad_j`` (:func:`refkern.kernels.elementwise_grad.values`;
    where it is undecided, the correctly rounded value, ``rad_j`` half an ulp of the result's dtype), summed in
    float64: ``S_i = sum v_j`` within ``R_i = sum rad_j + n 2**-53 sum |v_j|`` of ``G_i`` (every order of n
    float64 additions). A correct backend stores every ``e_j`` within the elementwise yardstick's bound ``B_j``
    (:func:`grad_bounds`, its storing in the dtype included), then sums them in its accumulation format (float32
    for float16, bfloat16 and float32, float64 for float64; unit roundoff ``u_a``), in any order, and rounds once
    to a half dtype: ``|got - G_i| <= sum B_j + gamma_{n-1}(u_a) sum (|v_j| + rad_j + B_j)`` (+ half an ulp of
    ``|S_i| + that`` for float16 and bfloat16). The error counted is ``|got - S_i| - R_i`` (the ball's radius in
    the error's favour); ``exact`` where the whole ball ``S_i +- R_i`` rounds to the backend's value. Verdicts as
    :func:`judge_grad`'s, one library class for every term; a NaN or infinite term or bound: any result there, as
    the elementwise yardstick takes an infinite bound."""
    from refkern.accumulate.formats import round_array
    from refkern.analysis.compare import _actual_grad

    fn = "pow" if k == "input" else "pow_exponent"
    xf, y, fmt, shape, _ = ew.pow_operands(bound["input"], bound["exponent"], who)
    gf = np.ascontiguousarray(eg.grad_output(grad_output, name, fmt, shape, who).values, np.float64).reshape(-1)
    own = tuple(np.shape(bound[k]))
    act, device = _actual_grad(got, k, fmt, who)
    a = np.asarray(act, np.float64).reshape(-1)
    lead = (1,) * (len(shape) - len(own)) + own
    axes = tuple(i for i in range(len(shape)) if lead[i] == 1 and shape[i] != 1)
    keep = tuple(i for i in range(len(shape)) if i not in axes)
    n, m = math.prod(shape[i] for i in axes), math.prod(lead)

    def rows(t):  # (element of k, the n terms summed into it)
        return np.ascontiguousarray(np.transpose(np.reshape(t, shape), keep + axes), np.float64).reshape(m, n)

    def total(t):  # a sum of magnitudes, rounded up (n float64 additions: n 2**-53 relative)
        return np.sum(rows(t), axis=1) * (1.0 + n * 2.0**-52)

    ref = eg.reference(fn, gf, xf, fmt, (y,))
    v0, rad0, _, done = eg.values(fn, gf, xf, fmt, (y,))
    ball = np.isfinite(rad0) & np.isfinite(v0) & ~(done & (rad0 == 0))  # a float64 ball around e_j
    v = np.where(ball, v0, ref)  # elsewhere the correctly rounded value, within half an ulp of e_j
    rad = np.where(ball, rad0, np.where(np.isfinite(ref), 0.5 * _ulp(ref, fmt), 0.0))
    S, Sl = np.empty(m), np.empty(m)
    with np.errstate(all="ignore"):
        _sum2_rows(rows(v), S, Sl)
        mag = total(np.abs(v))
        R = (total(rad) + _gamma(n, 2.0**-53) ** 2 * mag * (1.0 + 2.0**-20)) * (1.0 + 2.0**-40) + 2.0**-1074
        lo, hi = (round_array(S + (Sl - R), *fmt.params), round_array(S + (Sl + R), *fmt.params))
    rS = round_array(S + Sl, *fmt.params)
    err, same = _errors(a, rS, S, fmt, np.where(np.isfinite(Sl), Sl, 0.0))
    same = same & ((lo == hi) | ~np.isfinite(S))
    err = np.where(same, 0.0, np.maximum(err - np.where(np.isfinite(R), R, 0.0), 0.0))
    w = FLOAT32 if fmt.prec <= FLOAT32.prec else FLOAT64
    rounding, reduced = _candidates(device)
    fits = {}
    for lib in rounding + (reduced if fmt.prec <= FLOAT32.prec else []):
        B = grad_bounds(fn, gf, xf, v, fmt, lib, (y,))
        if B is None:
            continue
        with np.errstate(all="ignore"):
            B = np.where(np.isnan(B), np.inf, B)
            Bt = total(B) + _gamma(n, w.u) * total(np.abs(v) + rad + B)
            if fmt.prec < FLOAT32.prec:  # summed in float32, rounded once to the half dtype
                Bt = Bt + 0.5 * _ulp(np.abs(S) + Bt, fmt, True)
            Bt = np.where(np.isnan(Bt), np.inf, Bt)
            ratio = np.where(same | np.isposinf(Bt) | (err == 0), 0.0, err / Bt)
        ok = same | (err <= Bt) | np.isposinf(Bt)
        fits[lib.name] = (lib, ok, np.where(ok, np.minimum(ratio, 1.0), ratio))
    verdict, precision, model, classes, ratio, top = _decide(fits, same, None)
    ulps = err / _ulp(np.where(np.isfinite(S), S, 0.0), fmt)
    notes = [f"the gradient of the broadcast {k}: a sum of {n} elementwise gradients per element, judged against "
             f"{fn}'s backward formula per term and any order of summing them (refkern.analysis.elementwise_grad)"]
    finite = np.isfinite(ulps)
    hyps, ratios = _hypotheses(fits)
    return build(
        op=f"{name} backward", device=device, dtype=fmt.name, shape=own, n_terms=n, verdict=verdict,
        precision=precision, classes=classes, model=model, actual=a, reference=rS, top=top,
        at_worst={"ulp": ulps[top], "bound_ratio": ratio[top], "test_ratio": ratio[top], "condition": 1.0},
        max_ulp=float(np.max(np.where(finite, ulps, 0.0), initial=0.0)),
        max_bound_ratio=float(np.max(ratio, initial=0.0)), max_prob_ratio=float(np.max(ratio, initial=0.0)),
        hypotheses=hyps, bound_ratios=ratios, error=lambda: errors(a, rS, same), rtol=rtol, atol=atol, notes=notes,
    )  # fmt: skip
