"""One element of the filtering engine: its bound and decision (:func:`decide_one`), and the exact
path on chosen elements (:func:`_exact_pairs`). A leaf that both the CPU engine
(:mod:`refkern.engines.filter`, which re-exports these names) and the device one
(:mod:`refkern.engines.filter_device`) read, so neither imports the other's module for them."""

import contextlib

import numba
import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.kernels._element import EXACT, reduce_element, row_stats

__all__ = ["SLACK", "M_MIN", "M_MAX", "K_MAX", "PARALLEL_TERMS", "bound", "decide_one", "threads_for"]

SLACK = 1.015625  # 1 + 2**-6: c in e = c (K + 1) u m, derived in decide_one
M_MIN = 2.0**-960  # below: e could underflow and a flushed subnormal sum is not covered (decide_one)
M_MAX = 2.0**1000  # above: s + e could overflow float64
K_MAX = 1 << 40  # (2K + 2) u <= 2**-10 for K below this: decide_one's derivation
PARALLEL_TERMS = 1 << 22  # products the exact path must form before it runs on every thread


@jit(inline="always")
def bound(k, m):
    """e = fl(c (K + 1) u m), c = SLACK, u = 2**-53: the error bound of :func:`decide_one`.
    (K + 1) c 2**-53 is exact (K + 1 < 2**41 times a 7-bit c), so e has one rounding."""
    return ((k + 1) * 1.015625 * 2.0**-53) * m


@jit(inline="always")
def decide_one(s, m, k, prec, emin, emax):
    """The correctly rounded value, in the format (prec, emin, emax), of the exact sum S of K + 1
    terms (K products and the bias, every term a multiple of 2**-1074) of which ``s`` is a float64
    sum in any order and ``m`` a float64 number with ``m >= (1 - gamma_{2K+2}) T``, T = sum |terms|;
    NaN where the bound cannot decide (the caller then computes the element exactly).

    Derivation (u = 2**-53, K < K_MAX so (2K + 2) u <= 2**-10):
    1. |s - S| <= gamma_K T (K additions; an addition whose result is subnormal is exact here,
       every partial sum being a multiple of 2**-1074; a BLAS that flushes it to zero errs by at
       most 2**-1022 more per addition: F = K 2**-1022 in total).
    2. T <= m / (1 - gamma_{2K+2}) <= m (1 + 2**-9), gamma_K <= K u (1 + 2**-9): |s - S| <=
       err' = K u m (1 + 2**-9)**2 + F <= 1.005 K u m + F.
    3. e = :func:`bound` >= c (K + 1) u m (1 - u), c = 1 + 2**-6. The ends fl(s -+ e) err by at most
       u (|s| + e) + 2**-1075 each, |s| <= T + err' <= 1.002 m + err'. S lies between them when
       e (1 - u) - u (1.002 m + err') - 2**-1075 >= err', i.e. when (dividing by u m, m >= M_MIN so
       (F + 2**-1075) / (u m) <= 2**-9 K + 2**-62): c (K + 1) (1 - 2u) - 1.002 - 2u >=
       1.005 K (1 + u) + 2**-9 K + 2**-62, true for c = 1 + 2**-6 (1.0156 K + 0.0136 against
       1.0070 K) and false near c = 1: the slack is what the rounding of the bound needs.
    4. |s| > e: S is not zero and has the sign of s (a zero sum's sign needs the exact path).
    5. Rounding is monotonic: when round(fl(s - e)) == round(fl(s + e)), S rounds to that value,
       overflow to inf, subnormals and a tiny S rounding to a signed zero included.
    m NaN or inf (a term inf or NaN) fails M_MIN <= m <= M_MAX: such elements go exact.
    For float32 the hardware conversion float64 -> float32 is round_to(x, 24, -126, 127)."""
    if M_MIN <= m <= M_MAX:
        e = bound(k, m)
        if abs(s) > e:
            if prec == 24 and emin == -126 and emax == 127:
                lo = np.float64(np.float32(s - e))
                hi = np.float64(np.float32(s + e))
            else:
                lo = round_to(s - e, prec, emin, emax)
                hi = round_to(s + e, prec, emin, emax)
            if lo == hi:
                return lo
    return np.nan


@jit(parallel=True)
def _exact_pairs(A, B, ri, rj, bias, has_bias, narrow, prec, emin, emax, out):
    """out[s] = bias[s] + sum_k A[ri[s], k] B[rj[s], k], exact, rounded once (the Numba engine's
    reduce_element, with the rows' statistics computed here)."""
    for s in prange(ri.size):
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        scratch = np.empty(BLOCK)
        st = np.empty((2, 2), np.int64)
        row_stats(A[ri[s] : ri[s] + 1], st[0:1])
        row_stats(B[rj[s] : rj[s] + 1], st[1:2])
        out[s] = reduce_element(
            A[ri[s]], B[rj[s]], bias[s], has_bias, EXACT, narrow, st[0, 0], st[0, 1], st[1, 0], st[1, 1],
            prec, emin, emax, acc, scratch,
        )  # fmt: skip


@contextlib.contextmanager
def _threads(n):
    """Numba kernels on ``n`` threads inside (see :func:`_norms`: after a BLAS call, one thread
    unless the work is large enough to pay for the contention)."""
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, old)))
    try:
        yield
    finally:
        numba.set_num_threads(old)


def threads_for(terms):
    """A context: Numba kernels inside on every thread when the work reaches ``PARALLEL_TERMS``
    products, else on one. Below it a parallel launch costs more than it saves: the verdict's
    sample kernels (1820 patches of 576 terms) took 1.3 ms of CPU on one thread, and a parallel
    kernel on 1820 elements 32 ms of wall time on 2 threads against 0.013 ms on one (load average
    12.8 on 2 cores: each launch waits for both threads to be scheduled, and for torch's and the
    BLAS's spinning threads)."""
    return _threads(numba.get_num_threads() if terms >= PARALLEL_TERMS else 1)
