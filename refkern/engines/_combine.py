"""The rounding of :func:`refkern.engines.ozaki.round_digits` as a Numba kernel, for CPU tensors.

The same integer algorithm, element by element (about 20x faster than the elementwise torch
ops on the CPU); the torch version runs on other devices, and the tests hold the two
bit-identical.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["round_planes"]


@jit(inline="always")
def _bitlen(v):
    """Bits of 0 <= v < 2**53 (0 for 0)."""
    return 0 if v == 0 else math.frexp(np.float64(v))[1]


@jit(parallel=True)
def round_planes(g, ea, eb, c, w, prec, emin, emax, out, zero):
    """out[i, j] = sum_k g[k, i, j] * 2**(ea[i] + eb[j] + c - k w) rounded once to (prec, emin,
    emax); zero[i, j] = whether that sum is exactly 0 (out = +0 then). |g| < 2**60."""
    n, m, nn = g.shape
    mask = (np.int64(1) << w) - 1
    for i in prange(m):
        d = np.empty(n + 1, np.int64)
        for j in range(nn):
            d[0] = 0
            for k in range(n):
                d[k + 1] = g[k, i, j]
            for k in range(n, 0, -1):  # carry: digits below the top in [0, 2**w)
                d[k - 1] += d[k] >> w
                d[k] &= mask
            neg = d[0] < 0
            if neg:  # |V|: negate and carry again
                for k in range(n + 1):
                    d[k] = -d[k]
                for k in range(n, 0, -1):
                    d[k - 1] += d[k] >> w
                    d[k] &= mask
            e0 = ea[i] + eb[j] + c + w  # weight of the last place of digit 0
            lead = np.int64(0)
            found = False
            for k in range(n + 1):
                if d[k] != 0:
                    lead = e0 - k * w + _bitlen(d[k]) - 1
                    found = True
                    break
            if not found:
                out[i, j] = 0.0
                zero[i, j] = True
                continue
            zero[i, j] = False
            q = max(lead - prec + 1, emin - prec + 1)  # weight of the last kept bit
            kept = np.int64(0)
            rbit = np.int64(0)
            sticky = False
            for k in range(n + 1):
                v = d[k]
                if v == 0:
                    continue
                sh = e0 - k * w - q  # digit k's last place lies sh places above the last kept bit
                if sh >= 0:
                    kept += v << sh  # < 2**(prec + 1): no overflow
                    continue
                t = -1 - sh  # position of the round bit inside digit k
                if t < 63:
                    kept += v >> (t + 1) if t < 62 else 0
                    rbit |= (v >> t) & 1
                    sticky |= (v & ((np.int64(1) << t) - 1)) != 0
                else:
                    sticky = True
            mm = kept + (rbit & np.int64(sticky or (kept & 1) == 1))  # round half to even
            if mm == 0:
                r = 0.0
            elif _bitlen(mm) - 1 + q > emax:
                r = np.inf
            else:
                r = math.ldexp(np.float64(mm), q)  # exact: the value is on the format's grid
            out[i, j] = -r if neg else r
