"""The exact gradient of pow's operand broadcast against the other one (:func:`refkern.backward`'s, autograd's
``sum_to``): ``G_i = sum_{j -> i} t_j`` over the result elements j that read element i of the operand, rounded
once (to nearest even) to the result's dtype.

The terms are the elementwise gradients of :mod:`refkern.kernels.math_grad`: ``t_j = g_j y_j x_j**(y_j - 1)`` for
the input, ``g_j x_j**y_j ln x_j`` for the exponent, each the real value where it is defined, and where it is not
(g = 0, non-finite operands, the edges of the domain: that module's docstring) torch's formula rounded once to
the dtype, as the elementwise gradient defines it. An exactly zero sum is +0 (autograd's sum starts at +0:
torch's sum of -0 values is +0); a nonzero sum that rounds to zero keeps its sign. Where a term is not finite,
the IEEE sum of the non-finite terms (NaN, or that infinity): the finite ones cannot change it.

Ziv's strategy:

1. **Balls in float64.** Each term is a float64 ball ``v_j +- r_j`` (:func:`refkern.kernels.math_grad.values`;
   ``r_j = 0`` where the term is exact), summed per element with Sum2 (Ogita, Rump and Oishi, "Accurate sum and
   dot product", SIAM J. Sci. Comput. 26(6), 2005: TwoSum on the running sum, the errors summed):
   ``|S + S_l - sum v_j| <= gamma_{n-1}**2 sum |v_j|`` (Prop. 4.5's proof; ``gamma_n = n u / (1 - n u)``,
   ``u = 2**-53``). The real sum lies within ``R = (sum r_j + gamma_{n-1}**2 sum|v_j| (1 + 2**-20))
   (1 + 2**-40) + 2**-1074`` of ``S + S_l`` (``sum r_j`` and ``sum |v_j|`` float64 sums of n nonnegative terms
   with ``n 2**-52`` relative added: every order of n float64 additions errs by at most ``gamma_{n-1}``,
   Higham 2002 (4.4)); the rounding is decided where both ends of that interval round alike and not to zero.
2. **The exact path** for the rest: the terms of equal ``(x_j, y_j)`` merged first (their g's summed
   exactly: ``sum g_j f'(x) = (sum g_j) f'(x)``, so equal irrational terms cancel exactly), then each term an
   integer interval of :mod:`refkern.kernels._ew_exact` (a point where it is exact or rational with a
   power-of-two denominator, a quotient interval for another rational, ``g f'(x)`` otherwise), the intervals
   summed and raised in precision until they round alike (:func:`refkern.kernels._ew_exact.ziv`). A sum of
   exact and rational terms is a Fraction, rounded once (+0 when zero). An exactly rational sum of distinct
   irrational terms (``2 g ln 2 - g ln 4``) decides at no precision: the loop raises RuntimeError at
   ``2**16`` bits (not met in practice; the identical ones are merged).
"""

import math
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_array

__all__ = ["pow_reduced"]


@jit
def _sum2_rows(V, hi, lo):
    """Each row of V summed as a double word ``hi + lo`` (Sum2: TwoSum on the running sum, its errors summed):
    ``|hi + lo - sum| <= gamma_{n-1}**2 sum |v|`` in float64 (module docstring)."""
    for i in range(V.shape[0]):
        s = 0.0
        c = 0.0
        for j in range(V.shape[1]):
            s, e = two_sum(s, V[i, j])
            c += e
        hi[i], lo[i] = two_sum(s, c)


def _gamma2(n):
    """``gamma_{n-1}**2`` in float64 (u = 2**-53), rounded up by the caller's ``1 + 2**-20``."""
    m = max(n - 1, 0) * 2.0**-53
    return (m / (1.0 - m)) ** 2


def _exact_sum(fn, terms, fmt):
    """RN of the sum of ``terms`` ``(g, x, y, v, r)`` (step 2 of the module docstring)."""
    from refkern.kernels import _ew_exact as xe
    from refkern.kernels import math_grad as mg

    prec, emin, emax = fmt.params
    merged = {}  # (x, y) -> the exact sum of the g's of the irrational terms at that point
    exact = Fraction(0)
    for g, x, y, v, r in terms:
        if r == 0.0:  # an exact term: torch's formula rounded, an exact product, g itself
            exact += Fraction(v)
            continue
        q = mg._rational(fn, x, (y,))
        if q is not None:
            exact += Fraction(g) * q
        else:
            merged[(x, y)] = merged.get((x, y), Fraction(0)) + Fraction(g)
    merged = {k: s for k, s in merged.items() if s != 0}
    if not merged:
        return 0.0 if exact == 0 else xe.round_rational(exact.numerator, exact.denominator, prec, emin, emax)

    def interval(w):
        d = exact.denominator
        acc = xe.point(exact) if d & (d - 1) == 0 else xe.div(xe.point(exact.numerator), xe.point(d), w + 8)
        for (x, y), s in merged.items():
            acc = xe.add(acc, xe.mul(xe.point(s), mg._interval(fn, x, (y,), w + 8), w + 8), w + 8)
        return acc

    return xe.ziv(interval, prec, emin, emax)


def pow_reduced(grad_output, bound, k, who="backward"):
    """The exact gradient of ``torch.pow(input, exponent)`` (the bound call ``bound``) with respect to ``k``
    ("input" or "exponent"), an operand broadcast against the other (module docstring; pow's record's
    ``Backward.broadcast``): an array (a CPU tensor when an input is one) of k's shape and of the result's dtype,
    which k must have (a gradient cast to another dtype is a second rounding)."""
    input, exponent = bound["input"], bound["exponent"]  # noqa: A001
    from refkern._arrays import operand
    from refkern.kernels import elementwise as ew
    from refkern.kernels import math_grad as mg
    from refkern.kernels._common import deliver
    from refkern.kernels._grad import grad_output as _grad_output

    xf, yf, fmt, shape, tensor = ew.pow_operands(input, exponent, who)
    o = operand(input if k == "input" else exponent, k, who)
    if o.fmt is not fmt:
        raise ValueError(f"{who}: pow's gradient of {k} takes {k} of the result's dtype, {fmt.name}; got "
                         f"{o.fmt.name}. Its gradient would be cast: convert {k} first.")  # fmt: skip
    g = _grad_output(grad_output, "pow", fmt, shape, who)
    gf = np.ascontiguousarray(g.values, np.float64).reshape(-1)
    fn = "pow" if k == "input" else "pow_exponent"
    own = tuple(o.shape)
    lead = (1,) * (len(shape) - len(own)) + own
    axes = tuple(i for i in range(len(shape)) if lead[i] == 1 and shape[i] != 1)
    keep = tuple(i for i in range(len(shape)) if i not in axes)
    n, m = math.prod(shape[i] for i in axes), math.prod(lead)

    def rows(t):  # (element of k, its n terms)
        return np.ascontiguousarray(np.transpose(np.reshape(t, shape), keep + axes), np.float64).reshape(m, n)

    v, rad, _, _ = mg.values(fn, gf, xf, fmt, (yf,))
    V, Rd = rows(v), rows(rad)
    out = np.empty(m)
    S, Sl = np.empty(m), np.empty(m)
    with np.errstate(all="ignore"):
        ieee = ~np.isfinite(V) & (Rd == 0.0)  # a non-finite term by definition (torch's formula), not a ball's overflow
        bad = np.any(ieee, axis=1)
        finite = np.all(np.isfinite(V) & np.isfinite(Rd), axis=1)
        _sum2_rows(np.where(finite[:, None], V, 0.0), S, Sl)
        grow = 1.0 + n * 2.0**-52
        R = (Rd.sum(axis=1) * grow + _gamma2(n) * np.abs(V).sum(axis=1) * grow * (1.0 + 2.0**-20)) * (
            1.0 + 2.0**-40) + 2.0**-1074  # fmt: skip
        lo = round_array(S + (Sl - R), *fmt.params)
        hi = round_array(S + (Sl + R), *fmt.params)
    done = finite & ~bad & (lo == hi) & (lo != 0.0)
    out[done] = lo[done]
    for i in np.flatnonzero(bad):  # the IEEE sum of the non-finite terms
        t = V[i][ieee[i]]
        out[i] = np.nan if np.isnan(t).any() or (t.max() > 0 and t.min() < 0) else t[0]
    rest = np.flatnonzero(~bad & ~done)
    if rest.size:
        G, X, Y = rows(gf), rows(xf), rows(np.broadcast_to(yf, xf.shape))
        for i in rest:
            out[i] = _exact_sum(fn, zip(G[i].tolist(), X[i].tolist(), Y[i].tolist(), V[i].tolist(), Rd[i].tolist()),
                                fmt)  # fmt: skip
    return deliver(out.reshape(own), fmt, tensor or g.torch)
