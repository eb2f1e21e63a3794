"""The double-word pass of ``scaled_dot_product_attention`` (:mod:`refkern.kernels.attention`, whose
docstring derives it; any format): logits, weights and outputs in double-word arithmetic with rigorous
bounds, and the mask's value at (i, j) that every pass reads."""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div, dd_mul_fp
from refkern.accumulate.eft import two_product, two_sum
from refkern.kernels._transcendental import (
    EXP_DD_REL,
    X_MIN,
    U,
    decide_scaled,
    exp_dd,
)

_TINY = 2.0**-1074


@jit(inline="always")
def _mask_value(M3, b_m, i, j, causal, has_mask):
    if causal:
        return -np.inf if j > i else 0.0
    if has_mask:
        mi = i if M3.shape[1] > 1 else 0
        mj = j if M3.shape[2] > 1 else 0
        return M3[b_m, mi, mj]
    return 0.0


@jit(inline="always")
def _dot_dd(q, k):
    """(dh, dl, err, special): q . k as a double-word within err (Dot2: exact products by FMA, two-sums,
    errors summed in float64: within ``2 gamma_2E**2 sum |q_l k_l|``, plus ``2**-1073`` per product whose
    error term underflowed), or special = 1 NaN, 2 +inf, 3 -inf (the exact IEEE sum of the products),
    4 a product overflowed float64 (the exact path takes the row)."""
    E = q.size
    sh = 0.0
    c = 0.0
    ab = 0.0
    nan = False
    pinf = False
    ninf = False
    over = False
    for l in range(E):
        a = q[l]
        b = k[l]
        if a - a != 0.0 or b - b != 0.0:  # NaN or inf factor
            if a != a or b != b or a == 0.0 or b == 0.0:
                nan = True
            elif (a > 0) == (b > 0):
                pinf = True
            else:
                ninf = True
            continue
        p, e = two_product(a, b)
        if p - p != 0.0:
            over = True
            continue
        sh, t = two_sum(sh, p)
        c += t + e
        ab += abs(p)
    if nan or (pinf and ninf):
        return np.nan, 0.0, 0.0, 1
    if pinf:
        return np.inf, 0.0, 0.0, 2
    if ninf:
        return -np.inf, 0.0, 0.0, 3
    if over:
        return 0.0, 0.0, 0.0, 4
    g = 2.0 * E * U / (1.0 - 2.0 * E * U)
    dh, dl = two_sum(sh, c)
    return dh, dl, 2.0 * g * g * ab * 1.01 + E * 2.0**-1073, 0


@jit(parallel=True)
def _dd_rows(Q, K, V, iq, ik, iv, M3, im, has_mask, causal, scale, rb, ri, want, prec, emin, emax, out, undecided):
    """Double-word pass on the rows (rb[t], ri[t]), columns c with want[b, i, c]: out[b, i, c]
    decided, or undecided[b, i, c]."""
    E = Q.shape[2]
    S, Ev = V.shape[1], V.shape[2]
    for t in prange(rb.size):
        b = rb[t]
        i = ri[t]
        q = Q[iq[b], i]
        Kb = K[ik[b]]
        Vb = V[iv[b]]
        zh = np.empty(S)
        zl = np.empty(S)
        ez = np.empty(S)
        row = 0  # 0 fine, 1 NaN row, 2 exact path
        Mh, Ml, eM = -np.inf, 0.0, 0.0
        for j in range(S):
            m = _mask_value(M3, im[b], i, j, causal, has_mask)
            if E == 0:
                dh, dl, edot, sp = 0.0, 0.0, 0.0, 0
            else:
                dh, dl, edot, sp = _dot_dd(q, Kb[j])
            if sp == 4:
                row = 2
                break
            if sp != 0 or scale - scale != 0.0:  # a non-finite dot or scale: IEEE on s * dot + m
                v = (scale * dh if E > 0 else 0.0) + m  # dh = 0 exactly when the dot is 0 (inf * 0 = NaN)
                zh[j], zl[j], ez[j] = v, 0.0, 0.0
                if v != v or v == np.inf:
                    row = 1
                    break
                if v == -np.inf:
                    continue
                row = 2  # a finite logit here would be a bug: leave it to the exact path
                break
            if m != m or m == np.inf:
                row = 1
                break
            if m == -np.inf:
                zh[j], zl[j], ez[j] = -np.inf, 0.0, 0.0
                continue
            if E == 0 or dh == 0.0:
                ph, pl, ep = 0.0, 0.0, abs(scale) * edot
            else:
                ph, pl = dd_mul_fp(dh, dl, scale)
                ep = abs(scale) * edot * (1.0 + EPS) + EPS * abs(ph) * 1.01 + 2.0**-1060
            a, c2 = dd_add_fp(ph, pl, m)
            zh[j], zl[j] = a, c2
            ez[j] = ep + EPS * abs(a) * 1.01 + 2.0**-1060
            if not abs(a) <= 2.0**1000:
                row = 2
                break
            if a > Mh or (a == Mh and c2 > Ml):
                Mh, Ml, eM = a, c2, ez[j]
        if row == 1:
            out[b, i, :] = np.nan
            continue
        if row == 2:
            undecided[b, i, :] = want[b, i, :]
            continue
        if Mh == -np.inf:  # fully masked: sum_j 0 * v_jc
            for c in range(Ev):
                bad = False
                for j in range(S):
                    if Vb[j, c] - Vb[j, c] != 0.0:
                        bad = True
                out[b, i, c] = np.nan if bad else 0.0
            continue
        ph = np.zeros(S)
        pl = np.zeros(S)
        ep = np.zeros(S)
        pos = np.zeros(S, np.bool_)  # the weight is a positive real
        Dh, Dl = 0.0, 0.0
        eD = 0.0
        slack = 0.0
        cnt = 0
        for j in range(S):
            if zh[j] == -np.inf:
                continue
            pos[j] = True
            dh, dl = dd_add(zh[j], zl[j], -Mh, -Ml)
            ed = ez[j] + eM + EPS * abs(dh) * 1.01
            if ed > 2.0**-30:
                row = 2
                break
            if dh < X_MIN:
                slack += 2.0**-2800  # e**d < e**-2000
                continue
            a, c2, k = exp_dd(dh, dl)
            ph[j] = math.ldexp(a, k)  # each may lose 2**-1075 to underflow
            pl[j] = math.ldexp(c2, k)
            ep[j] = EXP_DD_REL + 1.01 * ed
            Dh, Dl = dd_add(Dh, Dl, ph[j], pl[j])
            eD += ep[j] * ph[j]
            slack += 2.0 * _TINY
            cnt += 1
        if row == 2:
            undecided[b, i, :] = want[b, i, :]
            continue
        eD = (eD + cnt * EPS * Dh) * 1.01 + slack  # D >= 1 (the max term is e**0 = 1)
        rho = eD / Dh
        for c in range(Ev):
            if not want[b, i, c]:
                continue
            nan = False
            pinf = False
            ninf = False
            for j in range(S):
                v = Vb[j, c]
                if v - v != 0.0:
                    if v != v or not pos[j]:
                        nan = True
                    elif v > 0:
                        pinf = True
                    else:
                        ninf = True
            if nan or (pinf and ninf):
                out[b, i, c] = np.nan
                continue
            if pinf or ninf:
                out[b, i, c] = np.inf if pinf else -np.inf
                continue
            Nh, Nl = 0.0, 0.0
            A = 0.0
            emax_ = 0.0
            vs = 0.0
            for j in range(S):
                v = Vb[j, c]
                vs += abs(v)
                if ph[j] == 0.0 or v == 0.0:
                    continue
                th, tl = dd_mul_fp(ph[j], pl[j], v)
                Nh, Nl = dd_add(Nh, Nl, th, tl)
                A += abs(th)
                emax_ = max(emax_, ep[j])
            eN = A * (emax_ + (cnt + 2) * EPS) * 1.02 + (slack + S * 2.0**-1060) * (vs + 1.0)
            if not (A <= 2.0**1000 and (Nh == 0.0 or abs(Nh) >= 2.0**-900)):
                undecided[b, i, c] = True  # outside the range where the double-word bounds hold
                continue
            if Nh == 0.0:
                if eN == 0.0:
                    out[b, i, c] = 0.0
                else:
                    undecided[b, i, c] = True
                continue
            yh, yl = dd_div(Nh, Nl, Dh, Dl)
            e = ((eN + (abs(Nh) + eN) * rho) / (Dh * (1.0 - rho)) + EPS * abs(yh)) * 1.01
            val, ok = decide_scaled(yh, yl, e, 0, prec, emin, emax)
            out[b, i, c] = val
            undecided[b, i, c] = not ok
