"""The fast path of binary_cross_entropy_with_logits' input gradient (:mod:`refkern.kernels.loss_logits_grad`):
``c (A sigmoid(x) - pw y)``, ``c = g w / n``, ``A = 1 + (pw - 1) y``, evaluated in float64 with a rigorous bound
and rounded to a format of at most 24 bits where the bound holds no rounding boundary; ``und`` marks the rest
(the exact element).

Bound (u = 2**-53), every operand finite, ``|x| <= 700`` (so sigmoid(x) >= e**-700 > 2**-1010, normal):

1. ``sigmoid(x) = q 2**k (1 + theta)``, ``|theta| <= rel`` (:func:`refkern.kernels._ew_f64._f_sigmoid`: 4.04u or
   6.06u, plus 2**-1073), ``σ = q 2**k`` exact (normal).
2. ``Â = fl(1 + fl(fl(pw - 1) y))``: three roundings, ``e_A = 2.03 u |fl(pw - 1) y| + 1.01 u |Â|``;
   ``fl(pw y)`` within ``u |fl(pw y)|``.
3. ``t = fl(fl(Â σ) - fl(pw y))``: ``e_t = (σ e_A + 1.01 rel |Â| σ + u |Â σ| + u |pw y| + u |t|) 1.01``.
4. ``ĉ = fl(fl(g w) / n)`` within ``2.01 u |c|`` (``2**-1000 <= |ĉ| <= 2**1000``, else undecided); ``v = fl(ĉ t)``:
   ``|v - c T| <= (2.03 u |ĉ| (|t| + e_t) + |ĉ| e_t + u |v| + 2**-1074) 1.01``, decided by the enclosure's ends
   (:func:`refkern.kernels.loss_ce_grad_fast._decide_signed`). Exact zeros and rational ties (x = 0, A = 0,
   pw y = 0 with c = 0) fall inside their own bound: undecided, the exact element's.

The target's gradient ``c (-x + (pw - 1) softplus(-x))``, ``|x| <= 100``: ``softplus(-x)`` as
:func:`refkern.kernels._ew_vec._v_softplus` computes and bounds it (``L`` within ``e_L``, that derivation's terms
charged 1.01); ``a = fl(fl(pw - 1) L)`` within ``e_a = (|pm| e_L + 1.01 u |pm| (L + e_L) + u |a|) 1.01``, ``t =
fl(a - x)`` within ``e_t = e_a + u |t|``; ``ĉ t`` as in 4."""

from numba import prange

from refkern._jit import jit
from refkern.kernels._ew_f64 import _f_sigmoid
from refkern.kernels._ew_vec import softplus_bound
from refkern.kernels._transcendental import U, ldexp
from refkern.kernels.loss_ce_grad_fast import _decide_signed

__all__ = ["logits_input_fast", "logits_target_fast"]


@jit(parallel=True)
def logits_input_fast(x, y, w, pw, G, n, prec, emin, emax, out, und):
    """Flat float64 operands (broadcast), the mean's n (1 otherwise): ``out`` the gradient rounded to (prec, emin,
    emax) where decided, ``und`` elsewhere (module docstring)."""
    for i in prange(x.size):
        xi, yi, pi = x[i], y[i], pw[i]
        c = (G[i] * w[i]) / n
        ok = abs(xi) <= 700.0 and abs(yi) <= 2.0**500 and abs(pi) <= 2.0**500 and 2.0**-1000 <= abs(c) <= 2.0**1000
        if not ok:
            und[i] = True
            continue
        q, rel, k = _f_sigmoid(xi)
        s = ldexp(q, k)
        a1 = (pi - 1.0) * yi
        A = 1.0 + a1
        eA = 2.03 * U * abs(a1) + 1.01 * U * abs(A)
        ty = pi * yi
        q1 = A * s
        t = q1 - ty
        et = (s * eA + 1.01 * rel * abs(A) * s + U * abs(q1) + U * abs(ty) + U * abs(t)) * 1.01
        v = c * t
        e = (2.03 * U * abs(c) * (abs(t) + et) + abs(c) * et + U * abs(v) + 2.0**-1074) * 1.01
        r, dec = _decide_signed(v, e, 0.0, prec, emin, emax)
        out[i] = r
        und[i] = not dec


@jit(parallel=True)
def logits_target_fast(x, y, w, pw, G, n, prec, emin, emax, out, und):
    """The target's gradient as :func:`logits_input_fast` the input's (module docstring)."""
    for i in prange(x.size):
        xi, pi = x[i], pw[i]
        c = (G[i] * w[i]) / n
        ok = abs(xi) <= 100.0 and abs(pi) <= 2.0**500 and 2.0**-1000 <= abs(c) <= 2.0**1000
        if not ok:
            und[i] = True
            continue
        z = -xi  # softplus(z) = max(z, 0) + log1p(e**-|z|), _v_softplus's evaluation and bound
        q, eq = softplus_bound(z)
        pm = pi - 1.0
        a = pm * q
        ea = (abs(pm) * eq + 1.01 * U * abs(pm) * (q + eq) + U * abs(a)) * 1.01
        tt = a - xi
        et = ea + U * abs(tt)
        r = c * tt
        er = (2.03 * U * abs(c) * (abs(tt) + et) + abs(c) * et + U * abs(r) + 2.0**-1074) * 1.01
        val, dec = _decide_signed(r, er, 0.0, prec, emin, emax)
        out[i] = val
        und[i] = not dec
