"""Numba kernels for CPU tensors: the slicing of :func:`refkern.engines.ozaki.make_slices` and
the rounding of :func:`refkern.engines.ozaki.round_digits`, with the same arithmetic element by
element (one pass over memory instead of one per torch op). The torch versions run on other
devices; the tests hold the two bit-identical."""

import math

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["round_planes", "make_slices_cpu", "add_plane"]


@jit(inline="always")
def _bitlen(v):
    """Bits of 0 <= v < 2**53 (0 for 0)."""
    return 0 if v == 0 else math.frexp(np.float64(v))[1]


@jit(parallel=True)
def make_slices_cpu(x, e, w, keep, out):
    """out[t, i] = the slices of row i of x: y = x[i] * 2**e[i] (|y| < 2**w), then
    round-to-nearest-even integers of y and of its scaled remainders; the last slice is the
    remainder itself (an integer for kept rows). Rows without ``keep`` are zero."""
    s = out.shape[0]
    scale = np.float64(2.0**w)
    for i in prange(x.shape[0]):
        if not keep[i]:
            out[:, i, :] = 0.0
            continue
        e1 = min(max(e[i], -1022), 1023)
        f1 = math.ldexp(1.0, e1)  # two exact power-of-two factors: neither overflows
        f2 = math.ldexp(1.0, e[i] - e1)
        for k in range(x.shape[1]):
            y = x[i, k] * f1 * f2  # exact: a kept row loses no bit
            for t in range(s - 1):
                c = np.rint(y)  # to nearest even
                out[t, i, k] = c
                y = (y - c) * scale  # the fraction, exactly, scaled to the next slice
            out[s - 1, i, k] = y


@jit(parallel=True)
def add_plane(plane, x, sign):
    """plane += sign * x, x float64 integers below 2**53 (converted exactly), plane int64."""
    for i in prange(plane.shape[0]):
        for j in range(plane.shape[1]):
            plane[i, j] += sign * np.int64(x[i, j])


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
