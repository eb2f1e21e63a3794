"""Exact first and second moments of a row, the common start of mean, var, std and the norms.

For a row ``x_1 .. x_n`` (float32 or float64 values), :func:`moments` returns, exactly or with a stated
bound:

* ``S = sum x_i`` exactly, from the superaccumulator;
* a shift ``c`` near the mean, ``fl(RN(S) / n)`` rounded to ``prec`` significant bits (0 for the
  uncentred second moment) and, exactly, ``d_i = x_i - c = dh_i + dl_i`` (Knuth's TwoSum: no
  loss). Any float64 shift makes the identities below exact; a shift of the inputs' own
  precision (callers pass their result format's, the inputs' for the norms and var/std) makes
  ``x_i - c`` a float64 for every ordinary row of float32 or narrower values, so that ``dl = 0``
  and the three passes over it are skipped;
* ``Sd = sum d_i = S - n c`` and ``T = sum d_i^2`` exactly (the squares are the exact dot products
  ``dh.dh + 2 dh.dl + dl.dl``), each read out as a double-word within ``2**-106`` of its value;
* ``M2 = sum (x_i - mean)^2 = T - Sd^2 / n`` (the exact identity for any shift) and
  ``delta = mean - c = Sd / n`` as double-words with absolute error bounds.

Because ``c`` lies within about ``2**-prec |mean|`` of the mean, ``Sd^2 / n <= n 2**(2 - 2 prec)
mean^2`` is small next to ``T`` unless the row's spread is below the inputs' own resolution, and
the subtraction loses nothing that the bound does not state (``e_m2`` carries ``3E |Sd^2 / n|``):
the catastrophic cancellation of the one-pass formula ``E[x^2] - E[x]^2`` never happens here.
The bounds use :data:`~refkern.accumulate.dd.EPS` per double-word operation, and hold while the
row's values lie in ``[2**-300, 2**300]`` (or are 0): rows outside that range (only float64 inputs
can reach it) are flagged for the exact path, :func:`exact_moments`, which computes the same
quantities as Python Fractions.
"""

from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.dd import EPS, dd_add, dd_div_fp, dd_mul
from refkern.accumulate.eft import two_sum
from refkern.accumulate.exact import BLOCK, _dot_range, _sum_range
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import SIZE, acc_init, acc_reset
from refkern.accumulate.ziv import acc_dd

__all__ = ["OK", "SPECIAL", "EXACT_ROW", "Workspace", "moments", "exact_moments", "new_workspace"]

OK, SPECIAL, EXACT_ROW = 0, 1, 2  # row status: fast path; a NaN/inf in the row; needs the exact path
_ROW_LO_BITS = np.int64(0x2D30000000000000)  # the bit pattern of 2**-300
_ROW_HI_BITS = np.int64(0x52B0000000000000)  # of 2**300
_INF_BITS = np.int64(0x7FF0000000000000)
_ABS = np.int64(0x7FFFFFFFFFFFFFFF)


@jit
def new_workspace(n):
    """(acc, tmp, scratch, dh, dl): two accumulators, a block buffer and the row's split deviations."""
    acc = np.empty(SIZE, np.int64)
    acc_init(acc)
    tmp = np.empty(SIZE, np.int64)
    acc_init(tmp)
    return acc, tmp, np.empty(BLOCK), np.empty(max(n, 1)), np.empty(max(n, 1))


Workspace = tuple  # what new_workspace returns, for the type annotations of callers


@jit
def moments(x, center, prec, acc, tmp, scratch, dh, dl):
    """Exact moments of the row ``x`` (float32 or float64, n >= 1). Returns
    ``(status, c, delta_h, delta_l, e_delta, m2_h, m2_l, e_m2, s_h)`` where ``c + delta`` is the
    mean (``delta = 0``, ``c = 0`` when not ``center``: then ``M2 = sum x_i^2``), ``e_*`` are
    absolute error bounds, and ``s_h = RN(S)``. ``dh``/``dl`` hold ``x - c`` exactly on return;
    ``c`` has at most ``prec`` significant bits (the bounds hold for any shift).

    Error bounds (``E = EPS``): ``|Sd - Sd~| <= 2**-106 |Sd~|``; ``delta = Sd~ / n`` adds one
    operation: ``e_delta = 2E |delta|``. ``Sd~^2 / n`` costs two operations and inherits
    ``2 * 2**-106`` from Sd~: ``<= 3E |q|``; ``T`` is read within ``2**-106 |T|``; the final
    subtraction adds ``E |M2~|``: ``e_m2 = E |T| + 3E |q| + E |M2~| + 2**-1070``.
    """
    n = x.size
    mx = np.int64(0)  # largest and smallest nonzero |x| as bit patterns: integer reductions vectorize
    mn = _INF_BITS
    for i in range(n):
        y = bits(np.float64(x[i])) & _ABS
        mx = y if y > mx else mx
        y = y if y != 0 else _INF_BITS
        mn = y if y < mn else mn
    if mx >= _INF_BITS:  # an inf or a NaN
        return SPECIAL, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    if mx > _ROW_HI_BITS or mn < _ROW_LO_BITS:
        return EXACT_ROW, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    acc_reset(acc)
    _sum_range(x, 0, n, acc, scratch)
    s_h, _ = acc_dd(acc, tmp)
    c = round_to(s_h / n, prec, -1022, 1023) if center else 0.0  # float32 data: x - c exact
    orr = np.int64(0)
    for i in range(n):
        a, b = two_sum(np.float64(x[i]), -c)
        dh[i] = a
        dl[i] = b
        orr |= bits(b) & _ABS
    low = orr != 0  # some x - c is not a float64
    acc_reset(acc)  # Sd = sum (dh + dl)
    _sum_range(dh, 0, n, acc, scratch)
    if low:
        _sum_range(dl, 0, n, acc, scratch)
    sd_h, sd_l = acc_dd(acc, tmp)
    acc_reset(acc)  # T = sum (dh + dl)^2
    _dot_range(dh, dh, 0, n, acc, scratch)
    if low:
        _dot_range(dh, dl, 0, n, acc, scratch)
        _dot_range(dh, dl, 0, n, acc, scratch)
        _dot_range(dl, dl, 0, n, acc, scratch)
    t_h, t_l = acc_dd(acc, tmp)
    if not center:
        return OK, 0.0, 0.0, 0.0, 0.0, t_h, t_l, abs(t_h) * 2.0**-105 + 2.0**-1070, s_h
    q_h, q_l = dd_mul(sd_h, sd_l, sd_h, sd_l)
    q_h, q_l = dd_div_fp(q_h, q_l, np.float64(n))
    m_h, m_l = dd_add(t_h, t_l, -q_h, -q_l)
    e_m2 = EPS * abs(t_h) + 3.0 * EPS * abs(q_h) + EPS * abs(m_h) + 2.0**-1070
    d_h, d_l = dd_div_fp(sd_h, sd_l, np.float64(n))
    return OK, c, d_h, d_l, 2.0 * EPS * abs(d_h), m_h, m_l, e_m2, s_h


def exact_moments(x, center: bool = True):
    """(mean, M2) of the finite float64 row ``x`` as Fractions: the exact path's statistics
    (mean 0 and M2 = sum x^2 when not ``center``)."""
    xs = [Fraction(v) for v in np.asarray(x, np.float64).tolist()]
    n = len(xs)
    mean = sum(xs, Fraction(0)) / n if center and n else Fraction(0)
    return mean, sum(((v - mean) ** 2 for v in xs), Fraction(0))
