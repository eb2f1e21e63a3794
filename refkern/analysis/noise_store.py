"""The store of a half reduction, known exactly: what the element test of :mod:`refkern.analysis.inside`
(``_straddle``) needs beside the scale of :mod:`refkern.analysis.noise`.

A sum, mean, variance or standard deviation with a bfloat16 or float16 result is computed in float32
and stored once: a correct kernel returns ``RN(v)``, ``v`` within the float32 computation's scale of the
exact result, so the test asks how far the exact result lies from the values that round to the output
(not a rounding charged as noise). torch's CPU kernels on several threads also store each thread's
partial in the result format: :func:`thread_partials_sq` puts those roundings in the scale.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format

__all__ = ["GRAIN", "thread_partials_sq", "straddle", "straddle_z"]


GRAIN = 32768  #: torch's CPU parallel grain (at::internal::GRAIN_SIZE): a reduction splits into chunks of at least it


def thread_partials_sq(X) -> np.ndarray:
    """Per row of X (R, n): ``max_T sum_t P_t**2`` over the splits of torch's CPU reductions: ``T`` threads
    (``2 <= T <= ceil(n / GRAIN)``, any machine), contiguous chunks of ``ceil(n / T)``, ``P_t`` a chunk's sum.
    A half sum on several threads stores each thread's float32 partial in the result format and adds them
    in float32 (measured on torch 2.13: this emulation reproduced its bf16 and fp16 sums on 1 to 32
    threads, 100 of 100 cases of 3e5 and 1e6 terms); a mean's partials, divided by n before or after the
    store (68 of 72 matched "before"), round alike. Those roundings, ``u_o |P_t|`` each (over n for a
    mean), are in the scale before the store, sub-Gaussian as every other."""
    R, n = X.shape
    C = np.concatenate([np.zeros((R, 1)), np.cumsum(np.asarray(X, np.float64), axis=1)], axis=1)
    best = np.zeros(R)
    for T in range(2, -(-n // GRAIN) + 1):
        c = -(-n // T)
        edges = np.minimum(np.arange(0, n + c, c), n)
        edges = np.unique(edges)
        P = np.diff(C[:, edges], axis=1)
        best = np.maximum(best, (P * P).sum(axis=1))
    return best


def straddle(name, lay, pre, out: Format):
    """:attr:`Noise.straddle` of a reduction (sum, mean, var, std) with a half result, else None. The
    exact result to float64 is the op's own correctly rounded reference on the rows widened to float64
    (exactly: ``err = u64 |xh|``, one rounding); ``pre`` is the scale before the stores, with what may
    underflow in the working format (``(n + 4) eta_w**2``); the store itself, subnormal or not, is the
    test's interval."""
    if out.prec >= FLOAT32.prec or lay.X is None:
        return None
    if name in ("sum", "mean") and lay.n > GRAIN:  # torch's CPU threads' partial sums, stored in the result format
        pre = pre + lay.back((out.u / (lay.n if name == "mean" else 1)) ** 2 * thread_partials_sq(lay.X))

    def thunk():
        from refkern.ops import get

        X = np.asarray(lay.X, np.float64)
        kw = {} if name in ("sum", "mean") else {"correction": lay.n - lay.divisor}
        xh = np.asarray(lay.back(np.asarray(get(name).reference(X, dim=1, **kw), np.float64)), np.float64)
        return xh, FLOAT64.u * np.abs(xh)

    return np.asarray(pre, np.float64) + (lay.n + 4) * math.ldexp(1.0, FLOAT32.emin - FLOAT32.prec) ** 2, thunk


@jit(parallel=True, error_model="numpy")
def straddle_z(a, xh, err, pre, prec, emin, z):
    """The element test of a result stored once in the format (prec, emin) (``inside._straddle``): per
    element, the distance from the high-precision centre ``xh`` (within ``err`` of the exact result) to the
    values that round to ``a``, ``[a - h_lo, a + h_hi]`` (half the spacing to each neighbour: below a power
    of two the spacing toward zero halves; at 0 half the smallest subnormal each side), less ``err``, in
    units of ``sqrt(pre)``; 0 where equal or both NaN, inf at any other special."""
    tiny = 2.0 ** (emin - prec + 1)
    for i in prange(a.size):
        x, y = a[i], xh[i]
        if x == y or (x != x and y != y):
            z[i] = 0.0
            continue
        if not (x - x == 0.0 and y - y == 0.0):
            z[i] = np.inf
            continue
        ax = abs(x)
        if ax == 0.0:
            lo = hi = tiny / 2.0
        else:
            m, e = math.frexp(ax)  # ax = m 2**e, m in [1/2, 1)
            sp = 2.0 ** (max(e - 1, emin) - prec + 1)
            down = sp / 2.0 if m == 0.5 and e - 1 > emin else sp  # the spacing toward zero
            lo, hi = (down / 2.0, sp / 2.0) if x > 0 else (sp / 2.0, down / 2.0)
        d = 0.0
        if y < x - lo:
            d = (x - lo) - y
        elif y > x + hi:
            d = y - (x + hi)
        d = max(d - err[i], 0.0)
        if d == 0.0:
            z[i] = 0.0
        else:
            zi = d / math.sqrt(pre[i])
            z[i] = np.inf if zi != zi else zi
