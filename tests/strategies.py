"""Test data: floats of every format, ill-conditioned dot products, and an exact-rational oracle.

Nothing here uses refkern's numerics: values are built from raw bit patterns (which covers
every binade, subnormals and specials uniformly), and the oracle works on
``fractions.Fraction`` with its own integer rounding.
"""

import math
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

FORMAT_NAMES = ("float16", "bfloat16", "float32", "float64")
# (precision, emin, emax) per format, written out here independently of refkern
PARAMS = {
    "float16": (11, -14, 15),
    "bfloat16": (8, -126, 127),
    "float32": (24, -126, 127),
    "float64": (53, -1022, 1023),
}
_BITS = {"float16": (np.uint16, np.float16), "float32": (np.uint32, np.float32), "float64": (np.uint64, np.float64)}


def from_bits(pattern: int, fmt: str) -> float:
    """The value of a bit pattern of ``fmt`` as a Python float (exact)."""
    if fmt == "bfloat16":
        return float(np.array([pattern << 16], np.uint32).view(np.float32)[0])
    u, f = _BITS[fmt]
    return float(np.array([pattern], u).view(f)[0])


def values(fmt: str, *, specials: bool = False):
    """Any value of ``fmt``: every bit pattern is equally likely, plus small 'ordinary' numbers."""
    width = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}[fmt]
    raw = st.integers(0, 2**width - 1).map(lambda p: from_bits(p, fmt))
    if not specials:
        raw = raw.filter(math.isfinite)
    ordinary = st.integers(-(2**7), 2**7).map(lambda k: k / 8.0)  # <= 8 bits: exact in every format here
    return st.one_of(raw, ordinary)


def vectors(fmt: str, *, min_size=0, max_size=40, specials=False):
    return st.lists(values(fmt, specials=specials), min_size=min_size, max_size=max_size)


def to_array(xs, fmt: str, lib: str = "numpy"):
    """A list of values of ``fmt`` as a numpy array or torch tensor of that dtype (lossless)."""
    if fmt == "bfloat16" or lib == "torch":
        import torch

        return torch.tensor(np.asarray(xs, np.float64), dtype=getattr(torch, fmt))
    return np.asarray(xs, np.float64).astype(fmt)


def round_fraction(q, fmt: str) -> float:
    """Round an exact rational (or +-inf/nan float) once to ``fmt``: nearest, ties to even,
    subnormals, overflow to inf. Independent of refkern.truth.round_exact."""
    if isinstance(q, float):
        return q
    prec, emin, emax = PARAMS[fmt]
    if q == 0:
        return 0.0
    neg = q < 0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:  # make 2**e <= q < 2**(e+1)
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    quantum = Fraction(2) ** (max(e, emin) - prec + 1)
    k = q / quantum
    n = math.floor(k)
    rest = k - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    v = n * quantum
    if v >= Fraction(2) ** (emax + 1):
        return -math.inf if neg else math.inf
    f = float(v)  # exact: v has at most prec bits
    return -f if neg else f


def exact_dot(xs, ys):
    """The exact dot product as a Fraction (finite inputs)."""
    return sum((Fraction(x) * Fraction(y) for x, y in zip(xs, ys)), Fraction(0))


def gendot(n: int, cond: float, fmt: str, rng: np.random.Generator):
    """An ill-conditioned dot product (GenDot, Ogita, Rump and Oishi 2005, Alg. 6.1).

    The first half of x and y has exponents spread over log2(cond)/2; the second half is
    chosen term by term so that the partial dot products cancel. Every value is rounded
    to ``fmt``, so the achieved condition number (returned) can differ from ``cond``.
    """
    prec, emin, emax = PARAMS[fmt]

    def rnd(v):
        return round_fraction(Fraction(v), fmt) if np.isfinite(v) else v

    b = math.log2(cond)
    n2 = n // 2
    x = np.zeros(n)
    y = np.zeros(n)
    e = np.rint(rng.random(n2) * b / 2).astype(int)
    e[0] = round(b / 2) + 1
    e[-1] = 0
    for i in range(n2):
        x[i] = rnd((2 * rng.random() - 1) * 2.0 ** e[i])
        y[i] = rnd((2 * rng.random() - 1) * 2.0 ** e[i])
    e2 = np.rint(np.linspace(b / 2, 0, n - n2)).astype(int)
    for j, i in enumerate(range(n2, n)):
        x[i] = rnd((2 * rng.random() - 1) * 2.0 ** e2[j])
        if x[i] == 0:
            x[i] = 1.0
        partial = exact_dot(x[:i].tolist(), y[:i].tolist())
        target = Fraction((2 * rng.random() - 1) * 2.0 ** e2[j])
        y[i] = rnd(float((target - partial) / Fraction(x[i])))
    perm = rng.permutation(n)
    x, y = x[perm], y[perm]
    s = exact_dot(x.tolist(), y.tolist())
    mag = sum((abs(Fraction(a) * Fraction(c)) for a, c in zip(x.tolist(), y.tolist())), Fraction(0))
    achieved = float(mag / abs(s)) if s != 0 else math.inf
    return x.tolist(), y.tolist(), achieved


def same(a, b) -> bool:
    """Bit-identical results (any NaN equals any NaN; -0 differs from +0)."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def thread_spans(n, T, omp=False):
    """The ``T`` contiguous (start, stop) chunks of ``n`` terms that threads take, written out independently of
    refkern: torch's ``ceil(n / T)`` per thread, or with ``omp`` OpenMP's static ``n // T`` with the remainder on
    the first threads (empty chunks kept)."""
    if omp:
        q, r = divmod(n, T)
        cuts = [t * q + min(t, r) for t in range(T + 1)]
    else:
        c = -(-n // T)
        cuts = [min(t * c, n) for t in range(T + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def welford_f32(x):
    """Knuth's (Welford's) update in float32 scalars, left to right, written out independently of refkern:
    (count, mean, M2)."""
    f = np.float32
    m, q, k = f(0.0), f(0.0), 0
    for v in x:
        k += 1
        d = f(v - m)
        m = f(m + f(d / f(k)))
        q = f(q + f(d * f(v - m)))
    return k, m, q
