"""The null distribution behind every threshold of the verdict.

**The model.** A correct implementation of a reduction in a format of unit roundoff u, in any
order, returns the exact value plus ``e = sum_j c_j delta_j`` to first order: one term per
rounding (every addition, every product, the final store), ``|delta_j| <= u`` and ``c_j`` the
rounded quantity (a partial sum, a product, the result). Following Higham and Mary (2019) and
Connolly, Higham and Mary (2021), the deltas are modelled as mean-independent: each has mean
zero given the ones before it. Then ``e`` is a martingale with bounded increments, and the
Azuma-Hoeffding inequality gives, whatever the order,

    P(|e| >= lam * sigma) <= 2 exp(-lam**2 / 2),       sigma**2 = u**2 * sum_j c_j**2.

For a sum of n terms of magnitude ``M = sum|terms|`` every partial sum and the sum of the
squared products are at most M, so ``sigma <= u sqrt(n + 1) M``: the order-free scale of
:mod:`refkern.analysis.hypotheses`. The rounding of the reference itself and of a narrower
store are two more bounded terms (``u_s |value|`` each).

**Thresholds.** Every test of one ``compare`` call shares one false-alarm budget ``ALPHA``:
the probability, under the model, that a correct result is called anything but correct.
It is split in three equal parts (single elements, groups of elements along the output axes,
and the fit of the reduced-precision hypotheses), and each part is split evenly over the
number of tests in it (Bonferroni). A part with ``m`` two-sided tests rejects beyond

    lam(m) = sqrt(2 ln(2 m / alpha_part))                      (:func:`level`)

(for one element in 10,000, 7.04; in 1.6 million, 7.73). Nothing here depends on the tensor's
own distribution of errors: a whole bad channel cannot raise its own yardstick.

**Where the model is not the truth.** Round-to-nearest is deterministic: on data with
repeating values (constant inputs, one-hot rows) two elements computed from the same terms
carry the same error. The group tests therefore count each distinct (reference, actual) pair
of a group once (:func:`distinct`). Algorithms that are not a sum of the products
(Winograd, FFT convolutions) are outside the model and can be called ``mismatch``.
"""

import math

import numpy as np

__all__ = ["ALPHA", "PARTS", "level", "asymmetric", "sign_power", "distinct", "repeated", "group_sums",
           "proportion_margin", "smaller_pvalue", "min_pvalue"]  # fmt: skip

ALPHA = 1e-6  #: false-alarm budget of one compare() call under the model (a choice, stated in the docs)
PARTS = 3  #: the budget is split over: single elements, groups along the axes, fit of the alternatives


def level(m: int, alpha: float = ALPHA / PARTS) -> float:
    """lam with 2 m exp(-lam**2 / 2) = alpha: m two-sided sub-Gaussian tests at family-wise level alpha."""
    return math.sqrt(2.0 * math.log(2.0 * max(int(m), 1) / alpha))


def _hash(a: np.ndarray) -> np.ndarray:
    """A 64-bit key per float64 value (its bits), for finding repeated values."""
    return np.ascontiguousarray(a, np.float64).reshape(-1).view(np.int64)


def _key(arrays, group=None):
    key = np.zeros(arrays[0].size, np.uint64)
    for a in arrays:
        key = key * np.uint64(0x9E3779B97F4A7C15) ^ _hash(a).view(np.uint64)
    if group is not None:
        key = key * np.uint64(0xBF58476D1CE4E5B9) ^ np.asarray(group, np.uint64).reshape(-1)
    return key


def repeated(*arrays) -> np.ndarray:
    """Boolean mask (the arrays' shape): True where the tuple of values occurs more than once."""
    key = _key(arrays)
    order = np.argsort(key)
    sk = key[order]
    same = sk[1:] == sk[:-1]
    rep = np.zeros(key.size, bool)
    rep[order[1:][same]] = True
    rep[order[:-1][same]] = True
    return rep.reshape(np.shape(arrays[0]))


def distinct(*arrays, group=None) -> np.ndarray:
    """Flat boolean mask: True at the first element of each distinct tuple (group, arrays...)."""
    key = _key(arrays, group)
    first = np.zeros(key.size, bool)
    first[np.unique(key, return_index=True)[1]] = True
    return first


def group_sums(r: np.ndarray, var: np.ndarray, keep: np.ndarray, axis: int):
    """Per index g along ``axis``: (sum of r, sum of var, count) over the kept elements with that
    index; ``r`` and ``var`` are 0 wherever ``keep`` is False."""
    other = tuple(i for i in range(r.ndim) if i != axis)
    return np.sum(r, axis=other), np.sum(var, axis=other), np.count_nonzero(keep, axis=other)


def proportion_margin(n: int, alpha: float) -> float:
    """eps with P(|empirical proportion - p| > eps) <= alpha for n independent indicators
    (Hoeffding: 2 exp(-2 n eps**2) = alpha). Two proportions, each within eps: differ by <= 2 eps."""
    if n <= 0:
        return math.inf
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


_EXACT_PAIRS = 4096  # below this many pairs the null of U is computed exactly


def _u_null_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u), u = 0..mn, for the Mann-Whitney U of samples of sizes m and n without ties:
    p(m, n, u) = m/(m+n) p(m-1, n, u-n) + n/(m+n) p(m, n-1, u) (the last of the m+n values in rank
    order is from the first sample, above all n of the second, or from the second)."""
    prev = [np.ones(1)] * (n + 1)  # m' = 0: U = 0 surely
    for i in range(1, m + 1):
        cur = [np.ones(1)]  # n' = 0: U = 0 surely
        for j in range(1, n + 1):
            p = np.zeros(i * j + 1)
            p[j:j + len(prev[j])] += i / (i + j) * prev[j]
            p[: len(cur[j - 1])] += j / (i + j) * cur[j - 1]
            cur.append(p)
        prev = cur
    return np.cumsum(prev[n])


def smaller_pvalue(x, y) -> float:
    """p-value of "x is stochastically smaller than y" (one-sided Mann-Whitney test; x and y
    exchangeable under the null). Ties count against rejection. Exact below 4096 pairs, the normal
    approximation of U beyond."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m, n = x.size, y.size
    if m == 0 or n == 0:
        return 1.0
    u = int(np.searchsorted(np.sort(y), x, side="right").sum())  # pairs with x_i >= y_j
    if m * n <= _EXACT_PAIRS:
        return float(min(1.0, _u_null_cdf(m, n)[u]))
    z = (u + 0.5 - m * n / 2.0) / math.sqrt(m * n * (m + n + 1) / 12.0)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def min_pvalue(m: int, n: int) -> float:
    """The smallest p-value :func:`smaller_pvalue` can give for samples of sizes m and n (U = 0, no
    ties): 1 / C(m + n, m) for the exact null, the normal approximation's tail beyond 4096 pairs. A
    test whose smallest p-value exceeds its level can never reject: it has no power at that level."""
    if m == 0 or n == 0:
        return 1.0
    if m * n <= _EXACT_PAIRS:
        return 1.0 / math.comb(m + n, m)
    z = (0.5 - m * n / 2.0) / math.sqrt(m * n * (m + n + 1) / 12.0)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _lean(d, x) -> np.ndarray:
    """(T_offset, T_scale) of :func:`asymmetric` for the errors ``d`` at the exact values ``x``, repeated
    (exact, error) pairs counted once."""
    keep = distinct(x, d)
    d, x = d[keep], x[keep]
    out = np.zeros(2)
    for i, v in enumerate((d, d * x)):
        den = float(np.sqrt(np.sum(v * v)))
        out[i] = float(np.sum(v)) / den if den > 0 else 0.0
    return out


def sign_power(d, x, alpha) -> bool:
    """Can :func:`asymmetric` reject at all on these errors? ``|T| <= sqrt(N)`` (Cauchy-Schwarz) over the
    ``N`` distinct nonzero errors, so with ``sqrt(N) <= level(2, alpha)`` no bug leans far enough to show:
    an accumulator named there would have no evidence a bug would not give (37 errors at the fit's level
    of about 6.07; a 16-channel conv2d bias with an offset of 64x the spread was named fp16 accumulation)."""
    nz = d != 0
    return math.sqrt(int(np.count_nonzero(distinct(x[nz], d[nz])))) > level(2, alpha)


def asymmetric(d, x, alpha, emulated=()) -> bool:
    """Do the errors ``d = actual - exact`` (at the exact values ``x``, a sample) lean one way, as the
    accumulator's own emulated errors (``emulated``: its orders' ``c - exact`` on the same sample) do not?

    To first order an accumulator's error is ``d_i = sum_j c_ij delta_j`` with ``c_ij`` fixed by the exact
    data (its partial sums, module docstring); with the roundings' deltas independent and symmetric,
    each ``d_i`` is symmetric, and distinct elements (their own accumulations) are independent. Given the
    magnitudes ``|d_i|``, the signs are then independent fair coins, and for any weights ``v_i`` fixed by
    the data, ``T = sum v_i d_i / sqrt(sum (v_i d_i)**2)`` is a Rademacher sum: ``P(|T| >= lam) <= 2
    exp(-lam**2 / 2)`` (Hoeffding) whatever the accumulator's scale. Two statistics, at ``lam = level(2,
    alpha)``: ``v = 1`` (an offset) and ``v = x`` (a scale error: the residual correlated with the output).
    Unlike the offset and scale tests of the full fit these need no model of the scale, so an accumulator
    whose noise is far louder than the bug cannot hide it: a constant offset of half the spread of
    correct kernels, or a whole GEMM output scaled by 8x that spread, was named fp16 or bf16 accumulation
    because the accumulator's scale covered it (bench_gemm_power). Repeated (exact, actual) pairs carry
    the same rounding and count once (:func:`distinct`).

    Where the deltas are not symmetric the emulations show it: a short accumulator stagnating on
    one-signed terms loses every small term the same way, and its emulated orders lean as the backend
    does. So ``T`` is refused only outside ``[min(0, T_k) - lam, max(0, T_k) + lam]`` over the emulated
    orders' ``T_k``: a backend in an order between the emulated ones leans between them (as the noise-size
    test takes its q between the quietest and the noisiest order), and the interval holds ``[-lam, lam]``,
    so under the symmetric model the level is the one above."""
    lam = level(2, alpha)
    t = _lean(d, x)
    ts = np.array([_lean(e, x) for e in emulated] + [np.zeros(2)])
    return bool(np.any((t < ts.min(axis=0) - lam) | (t > ts.max(axis=0) + lam)))
