"""The non-exact accumulation methods, in a named working format.

Each kernel reduces the terms ``t_i = a_i * b_i`` (or ``t_i = a_i`` for a sum), followed by
the bias as one last term when there is one, with every
operation rounded to the working format (prec, emin, emax), emulated through
:func:`~refkern.accumulate.formats.round_to`: float16, bfloat16, float32 or float64
arithmetic as that format would round it (inputs and products are exact in float64 for
inputs of float32 or narrower). With u = 2**-prec and gamma_k = k u / (1 - k u), barring
underflow and overflow (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.):

=========== ============================================ =================================
method      algorithm                                    error bound, dot (sum: drop one u)
=========== ============================================ =================================
naive       s = fl(s + fl(t_i)), left to right           gamma_n sum|t_i|          (3.5)
pairwise    fl of a balanced binary tree of the fl(t_i)  gamma_{ceil(log2 n)+1} sum|t_i|
kahan       Kahan's compensated summation of fl(t_i)     (3u + O(n u^2)) sum|t_i|  (4.8)
neumaier    Neumaier's improved Kahan (= Sum2 of ORO)    u|s| + (u + gamma_n^2) sum|t_i|
dot2        Dot2 of Ogita, Rump and Oishi (2005)         u|s| + gamma_n^2 sum|t_i|
=========== ============================================ =================================

ORO: Ogita, Rump and Oishi, "Accurate sum and dot product", SIAM J. Sci. Comput. 26(6),
2005, doi:10.1137/030601818 (Prop. 4.5 for Sum2, Thm. 5.3 for Dot2); Neumaier, ZAMM 54, 1974.
"""

import numpy as np

from refkern._jit import jit
from refkern.accumulate._bits import fma
from refkern.accumulate.formats import round_to

__all__ = ["KERNELS", "naive", "pairwise", "kahan", "neumaier", "dot2", "energy"]


@jit(inline="always")
def _term(a, b, unit, bias, i):
    """The i-th term: a[i] * b[i] (exact in float64 for float32 inputs), or a[i]; the bias last."""
    if i == a.size:
        return bias
    return a[i] if unit else a[i] * b[i]


@jit
def naive(a, b, unit, bias, has_bias, prec, emin, emax):
    """Left-to-right sum in the working format: s = fl(s + fl(t_i))."""
    s = 0.0
    for i in range(a.size + has_bias):
        s = round_to(s + round_to(_term(a, b, unit, bias, i), prec, emin, emax), prec, emin, emax)
    return s


@jit
def pairwise(a, b, unit, bias, has_bias, prec, emin, emax):
    """Balanced binary tree: level by level, fl(x[2k] + x[2k+1]); each term sees ceil(log2 n) roundings."""
    n = a.size + has_bias
    if n == 0:
        return 0.0
    x = np.empty(n)
    for i in range(n):
        x[i] = round_to(_term(a, b, unit, bias, i), prec, emin, emax)
    m = n
    while m > 1:
        h = m // 2
        for k in range(h):
            x[k] = round_to(x[2 * k] + x[2 * k + 1], prec, emin, emax)
        if m % 2:
            x[h] = x[m - 1]
            m = h + 1
        else:
            m = h
    return x[0]


@jit
def kahan(a, b, unit, bias, has_bias, prec, emin, emax):
    """Kahan's compensated summation: c carries the rounding error of the last addition."""
    s = 0.0
    c = 0.0
    for i in range(a.size + has_bias):
        y = round_to(round_to(_term(a, b, unit, bias, i), prec, emin, emax) - c, prec, emin, emax)
        t = round_to(s + y, prec, emin, emax)
        c = round_to(round_to(t - s, prec, emin, emax) - y, prec, emin, emax)
        s = t
    return s


@jit
def neumaier(a, b, unit, bias, has_bias, prec, emin, emax):
    """Neumaier's variant: the error of each addition (exact, by FastTwoSum on the larger
    operand) is summed apart in c and added once at the end."""
    s = 0.0
    c = 0.0
    for i in range(a.size + has_bias):
        x = round_to(_term(a, b, unit, bias, i), prec, emin, emax)
        t = round_to(s + x, prec, emin, emax)
        if abs(s) >= abs(x):
            e = round_to(round_to(s - t, prec, emin, emax) + x, prec, emin, emax)
        else:
            e = round_to(round_to(x - t, prec, emin, emax) + s, prec, emin, emax)
        c = round_to(c + e, prec, emin, emax)
        s = t
    return round_to(s + c, prec, emin, emax)


@jit
def dot2(a, b, unit, bias, has_bias, prec, emin, emax):
    """Dot2 (ORO 2005, Alg. 5.3): TwoProduct and TwoSum in the working format, errors summed
    in one extra accumulator; as accurate as the working precision squared, then rounded."""
    p = 0.0
    s = 0.0
    for i in range(a.size + has_bias):
        if unit or i == a.size:
            t = _term(a, b, unit, bias, i)
            h = round_to(t, prec, emin, emax)
            r = round_to(t - h, prec, emin, emax)
        else:
            h = round_to(a[i] * b[i], prec, emin, emax)
            # TwoProduct's error a*b - h: one FMA rounding to float64 then one to the format
            # (exact when a, b lie in the format: the error fits in its precision)
            r = round_to(fma(a[i], b[i], -h), prec, emin, emax)
        # TwoSum(p, h) in the working format
        x = round_to(p + h, prec, emin, emax)
        z = round_to(x - p, prec, emin, emax)
        q = round_to(
            round_to(p - round_to(x - z, prec, emin, emax), prec, emin, emax) + round_to(h - z, prec, emin, emax),
            prec,
            emin,
            emax,
        )
        p = x
        s = round_to(s + round_to(q + r, prec, emin, emax), prec, emin, emax)
    return round_to(p + s, prec, emin, emax)


@jit
def energy(a, b, unit, bias, has_bias):
    """sqrt(sum_k s_k**2 + sum_k t_k**2) in float64, s_k the running sums of the left-to-right order.

    Not a summation method: the scale of the rounding error of a left-to-right sum in a format of
    unit u. To first order that error is sum_k delta_k s_k + sum_k eta_k t_k with |delta_k|,
    |eta_k| <= u (each addition and each product rounded once), so, with the deltas modelled
    as mean-independent (Higham and Mary 2019), it is sub-Gaussian with parameter u times this
    value (Azuma-Hoeffding). Evaluated in float64: a scale, not a reference value."""
    s = 0.0
    e = 0.0
    for i in range(a.size + has_bias):
        t = _term(a, b, unit, bias, i)
        s += t
        e += s * s + t * t
    return np.sqrt(e)


KERNELS = {
    "naive": naive,
    "pairwise": pairwise,
    "kahan": kahan,
    "neumaier": neumaier,
    "dot2": dot2,
}
