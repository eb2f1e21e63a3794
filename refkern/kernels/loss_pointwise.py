"""``refkern.mse_loss`` and ``refkern.l1_loss``: torch's semantics, correctly rounded.

``input`` and ``target`` broadcast together (torch warns where their shapes differ, and broadcasts); the
result dtype is their promotion. Per element ``l = (x - t)**2`` (mse) or ``|x - t|`` (l1); "none" gives
``l``, "sum" ``sum l``, "mean" ``sum l / n`` (NaN for no element, as torch's 0 / 0); each result is that
real number rounded once. Special values as IEEE arithmetic on torch's formula (an infinity or NaN in an
element, a sum of infinities of both signs).

Method: ``x - t = s + e`` exactly (TwoSum in float64) and ``s**2 = q + q'`` exactly (Dekker's product):
every element is a short sum of floats, exactly. "none" rounds it once: l1's ``|s|`` is the float64
rounding of a difference of two floats, and rounding that again to a format of p <= 24 bits is innocuous
(Figueroa: 53 >= 2p + 2); mse's ``q`` is rounded to the format with the tie broken by the sign of the rest
where ``q`` is a midpoint; elements whose difference is not exact in float64 (exponents 30 apart, or
float64 inputs) are summed as rationals. "sum" is the exact sum of every part rounded once
(:func:`~refkern.accumulate.exact.exact_sum`); "mean" peels the exact sum into float64 pieces (each the
exact sum of the parts minus the pieces so far, correctly rounded, until the rest is exactly 0), then divides
the exact rational by n and rounds once (:func:`~refkern.accumulate.ziv.round_fraction`).
"""

from fractions import Fraction

import numpy as np
from numba import get_num_threads, prange

from refkern._arrays import is_tensor, operand, promote
from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.exact import BLOCK, _sum_range, exact_sum
from refkern.accumulate.formats import FLOAT64, round_array
from refkern.accumulate.superacc import SIZE, acc_init, acc_merge
from refkern.accumulate.ziv import acc_fraction, round_fraction
from refkern.kernels._common import deliver
from refkern.kernels._loss_call import reduction_of

__all__ = ["mse_loss", "l1_loss", "pointwise_call", "pointwise_values"]

_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a float64


def pointwise_call(op, input, target, size_average=None, reduce=None, reduction="mean"):  # noqa: A002
    """(x, t) broadcast float64 arrays, the result format, tensors out, the reduction."""
    red = reduction_of(reduction, size_average, reduce, op)
    ox, ot = operand(input, "input", op), operand(target, "target", op)
    try:
        shape = np.broadcast_shapes(tuple(ox.shape), tuple(ot.shape))
    except ValueError:
        raise ValueError(f"{op}: input and target must broadcast together; got input.shape={tuple(ox.shape)} and "
                         f"target.shape={tuple(ot.shape)}.") from None  # fmt: skip
    x = np.broadcast_to(np.asarray(ox.values, np.float64).reshape(ox.shape), shape)
    t = np.broadcast_to(np.asarray(ot.values, np.float64).reshape(ot.shape), shape)
    return x, t, promote(ox.fmt, ot.fmt), ox.torch or ot.torch, red


@jit(inline="always")
def _square_k(s):
    """(q, q') with q + q' = s**2 exactly (Dekker; 2**-480 <= |s| < 2**995 or s = 0: no overflow, no underflow).
    Written once for scalars (the jitted kernel) and arrays (:func:`_square`, its Python body)."""
    q = s * s
    c = _SPLIT * s
    hi = c - (c - s)
    lo = s - hi
    return q, ((hi * hi - q) + 2.0 * hi * lo) + lo * lo


@jit(inline="always")
def _square_cross_k(s, e):
    """(p, p') with p + p' = 2 s e exactly (Dekker; the same range as :func:`_square_k`); for scalars and, as
    :func:`_square_cross`, arrays."""
    a = 2.0 * s
    p = a * e
    c = _SPLIT * a
    ah = c - (c - a)
    al = a - ah
    c = _SPLIT * e
    eh = c - (c - e)
    el = e - eh
    return p, ((ah * eh - p) + ah * el + al * eh) + al * el


# the same error-free transformations on whole float64 arrays (numpy runs the Python bodies elementwise)
_two_sum, _square, _square_cross = two_sum.py_func, _square_k.py_func, _square_cross_k.py_func


def _round_pair(q, r, fmt):
    """RN(q + r) to fmt for q = RN64(q + r): q's rounding, unless q is a midpoint of fmt, where r's sign decides."""
    if fmt.prec >= FLOAT64.prec:
        return q + 0.0
    out = round_array(np.ascontiguousarray(q), *fmt.params)
    up = round_array(np.ascontiguousarray(np.nextafter(q, np.inf)), *fmt.params)
    dn = round_array(np.ascontiguousarray(np.nextafter(q, -np.inf)), *fmt.params)
    mid = (up != dn) & (r != 0) & np.isfinite(q)
    return np.where(mid, np.where(r > 0, up, dn), out)


def _parts(op, x, t):
    """Float64 arrays whose sum, per element, is l exactly (where ``exact``), the float64 value, the
    elements whose difference is not exact (to the rationals), and the special elements."""
    with np.errstate(all="ignore"):
        s, e = _two_sum(x, -t)
        special = ~(np.isfinite(x) & np.isfinite(t))
        plain = (x - t) ** 2 if op == "mse_loss" else np.abs(x - t)
        if op == "l1_loss":
            return [np.abs(s), np.sign(s) * e], plain, special
        q, qe = _square(s)
        p1, p1e = _square_cross(s, e)
        p2, p2e = _square(e)
        return [q, qe, p1, p1e, p2, p2e], plain, special


@jit(parallel=True)
def _reduce_parts(x, t, mse, nseg, accs, flag):
    """accs[k] += the exact parts of every element of segment k (:func:`_parts`, computed per element: the
    TwoSum of x - t, then Dekker's squares and cross product for mse, |s| and sign(s) e for l1); flag[k] = 1
    where an element is not finite or its difference lies outside Dekker's range (the caller takes the
    array path)."""
    n = x.size
    nblk = (n + BLOCK - 1) // BLOCK
    for k in prange(nseg):
        acc_init(accs[k])
        buf = np.empty(6 * BLOCK)
        scratch = np.empty(6 * BLOCK)
        lo_b = nblk * k // nseg
        hi_b = nblk * (k + 1) // nseg
        for blk in range(lo_b, hi_b):
            m = 0
            for i in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
                sd, e = two_sum(x[i], -t[i])
                if not (abs(sd) < 2.0**995 and (sd == 0.0 or abs(sd) >= 2.0**-480) and e - e == 0.0):
                    flag[k] = 1
                    continue
                if not mse:
                    buf[m] = abs(sd)
                    buf[m + 1] = np.sign(sd) * e
                    m += 2
                    continue
                q, qe = _square_k(sd)
                buf[m] = q
                buf[m + 1] = qe
                m += 2
                if e != 0.0:
                    if not (abs(e) >= 2.0**-480 and abs(sd) < 2.0**994):
                        flag[k] = 1
                        continue
                    p1, p1e = _square_cross_k(sd, e)
                    p2, p2e = _square_k(e)
                    buf[m], buf[m + 1], buf[m + 2], buf[m + 3] = p1, p1e, p2, p2e
                    m += 4
            _sum_range(buf, 0, m, accs[k], scratch)


@jit
def _merge(accs):
    for k in range(1, accs.shape[0]):
        acc_merge(accs[0], accs[k])


def _reduced_fast(op, x, t, fmt, red):
    """The exact sum or mean of the elements' parts, from a per-element kernel (no (6, n) arrays); None
    where an element is special or outside its range (the array path decides those)."""
    n = x.size
    xf = np.ascontiguousarray(x, np.float64).reshape(-1)
    tf = np.ascontiguousarray(t, np.float64).reshape(-1)
    nseg = max(1, min(get_num_threads(), (n + BLOCK - 1) // BLOCK))
    accs = np.empty((nseg, SIZE), np.int64)
    flag = np.zeros(nseg, np.int8)
    _reduce_parts(xf, tf, op == "mse_loss", nseg, accs, flag)
    if flag.any():
        return None
    _merge(accs)
    total = acc_fraction(accs[0])
    return round_fraction(total / n if red == "mean" else total, fmt)


def _fraction_of(values) -> Fraction:
    parts = [float(v).as_integer_ratio() for v in values if v != 0.0]
    if not parts:
        return Fraction(0)
    k = max(d.bit_length() - 1 for _, d in parts)
    return Fraction(sum(n << (k - (d.bit_length() - 1)) for n, d in parts), 1 << k)


def _exact_total(flat) -> Fraction:
    """The exact sum of the float64 array ``flat``: peeled into correctly rounded float64 pieces."""
    pieces = []
    rest = np.ascontiguousarray(flat, np.float64)
    for _ in range(64):
        r = exact_sum(rest, FLOAT64)
        if r == 0.0:
            return _fraction_of(pieces)
        pieces.append(r)
        rest = np.ascontiguousarray(np.append(rest, -r))
    return _fraction_of(flat)  # (more than 64 pieces of 53 bits: the integers directly)


def pointwise_values(op, x, t, fmt, red) -> np.ndarray:
    """The correctly rounded result, float64 values (the broadcast shape for "none", else 0-d)."""
    if red != "none" and x.size:
        r = _reduced_fast(op, x, t, fmt, red)
        if r is not None:
            return np.asarray(r, np.float64)
    parts, plain, special = _parts(op, x, t)
    if red == "none":
        if op == "l1_loss":
            with np.errstate(invalid="ignore"):  # the special elements are IEEE's (``plain``) below
                d = np.abs(x - t)
            out = round_array(np.ascontiguousarray(d), *fmt.params) if fmt.prec < 53 else d
        else:
            out = _round_pair(parts[0], parts[1], fmt)
            inexact = (parts[2] != 0) | (parts[4] != 0) | ~np.isfinite(parts[1])
            for i in zip(*np.nonzero(inexact & ~special)):
                out[i] = round_fraction(_fraction_of([p[i] for p in parts]), fmt)
        return np.where(special, plain, out)
    n = x.size
    if special.any():
        s = plain.sum()
        return np.asarray(s / n if red == "mean" else s, np.float64)
    flat = np.concatenate([p.reshape(-1) for p in parts]) if n else np.zeros(0)
    if red == "sum":
        return np.asarray(exact_sum(np.ascontiguousarray(flat), fmt), np.float64)
    if n == 0:
        return np.asarray(np.nan)
    return np.asarray(round_fraction(_exact_total(flat) / n, fmt), np.float64)


def _run(op, input, target, size_average, reduce, reduction):  # noqa: A002
    x, t, fmt, tensor, red = pointwise_call(op, input, target, size_average, reduce, reduction)
    return deliver(np.asarray(pointwise_values(op, x, t, fmt, red), np.float64), fmt, tensor or is_tensor(target))


def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):  # noqa: A002
    """Reference ``torch.nn.functional.mse_loss``: ``(x - t)**2``, summed or averaged, rounded once (module
    docstring). A correct implementation errs by its own roundings (the difference, the square, the sum in
    any order, the division): :mod:`refkern.analysis.losses`."""
    return _run("mse_loss", input, target, size_average, reduce, reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):  # noqa: A002
    """Reference ``torch.nn.functional.l1_loss``: ``|x - t|``, summed or averaged, rounded once (module
    docstring)."""
    return _run("l1_loss", input, target, size_average, reduce, reduction)
