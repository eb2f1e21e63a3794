"""Pooling: avg/adaptive averages bit for bit against an exact rational oracle written here, torch's
float64 results rounded once where that is the correctly rounded value, max pooling bit for bit
against torch on every dtype, torch's argument checks."""

import math
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from refkern.kernels import pool  # noqa: E402
from refkern.kernels.pool import (  # noqa: E402
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    max_pool1d,
    max_pool2d,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
PARAMS = {  # (significand bits, emin, emax)
    torch.float16: (11, -14, 15),
    torch.bfloat16: (8, -126, 127),
    torch.float32: (24, -126, 127),
    torch.float64: (53, -1022, 1023),
}
KINDS = ["normal", "ties", "cancel", "special", "extreme", "subnormal"]


# --- the oracle: exact rationals, one rounding, torch's geometry and signed zeros ------------------------------------


def _log2_floor(q: Fraction) -> int:
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    return e


def _rn(q: Fraction, dtype) -> float:
    """q rounded to nearest, ties to even (Python's round of a Fraction), on dtype's grid."""
    prec, emin, emax = PARAMS[dtype]
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    quantum = Fraction(2) ** (max(_log2_floor(q), emin) - prec + 1)
    v = round(q / quantum) * quantum
    if v >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(v)


def _is_midpoint(v: float, dtype) -> bool:
    """Whether the float64 v lies exactly halfway between two neighbours of dtype."""
    prec, emin, _ = PARAMS[dtype]
    if not math.isfinite(v) or v == 0:
        return False
    q = abs(Fraction(v))
    quantum = Fraction(2) ** (max(_log2_floor(q), emin) - prec + 1)
    return (q / quantum).denominator == 2


def _average(values: list, divisor: int, dtype, *, plus_zero: bool) -> float:
    """RN(sum(values) / divisor) with IEEE's specials; an exact zero sum is +0 (torch's sum starts
    at +0); with ``plus_zero`` every zero result is +0 (avg_pool adds to a zeroed output)."""
    if any(math.isnan(v) for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values or -math.inf in values:
        return (math.inf if math.inf in values else -math.inf) / divisor
    total = sum(map(Fraction, values), Fraction(0))
    if total == 0:
        return 0.0
    v = _rn(total / divisor, dtype)
    return 0.0 if (plus_zero and v == 0) else v


def _padded4(x, nd):
    """(x as an (N, C, H, W) float64 numpy array, whether it was unbatched)."""
    a = x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
    unbatched = a.ndim == nd + 1
    a = a[None] if unbatched else a
    return (a[:, :, None, :] if nd == 1 else a), unbatched


def _pair(v, nd, fill=1):
    """An int-or-tuple argument as (H, W) values; a 1-d one gets ``fill`` for H."""
    v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    v = v * (nd // len(v))
    return (fill, *v) if nd == 1 else v


def oracle_avg(x, nd, out_shape, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    """The window average of every output, from the window's definition: input positions
    ``o s - p + j`` (j < k); the divisor counts those inside ``[-p, size + p)`` (count_include_pad)
    or inside ``[0, size)``. ``out_shape`` is torch's (its size rule is checked against torch separately)."""
    a, unbatched = _padded4(x, nd)
    dtype = x.dtype
    k = _pair(kernel_size, nd)
    s = k if stride is None or stride == [] else _pair(stride, nd)
    p = _pair(padding, nd, 0)
    oh, ow = (1, out_shape[-1]) if nd == 1 else out_shape[-2:]
    H, W = a.shape[2:]
    out = np.empty((a.shape[0], a.shape[1], oh, ow))
    for i in range(oh):
        rows = [i * s[0] - p[0] + j for j in range(k[0])]
        for jj in range(ow):
            cols = [jj * s[1] - p[1] + j for j in range(k[1])]
            r_in = [r for r in rows if 0 <= r < H]
            c_in = [c for c in cols if 0 <= c < W]
            if divisor_override is not None:
                d = divisor_override
            elif count_include_pad:
                d = sum(-p[0] <= r < H + p[0] for r in rows) * sum(-p[1] <= c < W + p[1] for c in cols)
            else:
                d = len(r_in) * len(c_in)
            for n in range(a.shape[0]):
                for c in range(a.shape[1]):
                    vals = [float(a[n, c, r, q]) for r in r_in for q in c_in]
                    out[n, c, i, jj] = _average(vals, d, dtype, plus_zero=True)
    out = out[:, :, 0] if nd == 1 else out
    return out[0] if unbatched else out


def oracle_adaptive(x, nd, out_shape):
    a, unbatched = _padded4(x, nd)
    H, W = a.shape[2:]
    oh, ow = (1, out_shape[-1]) if nd == 1 else out_shape[-2:]
    out = np.empty((a.shape[0], a.shape[1], oh, ow))
    for i in range(oh):
        r0, r1 = (i * H) // oh, -((-(i + 1) * H) // oh)
        for j in range(ow):
            c0, c1 = (j * W) // ow, -((-(j + 1) * W) // ow)
            for n in range(a.shape[0]):
                for c in range(a.shape[1]):
                    vals = a[n, c, r0:r1, c0:c1].ravel().tolist()
                    out[n, c, i, j] = _average(vals, len(vals), x.dtype, plus_zero=False)
    out = out[:, :, 0] if nd == 1 else out
    return out[0] if unbatched else out


def assert_bits(got, want):
    """Same values bit for bit (NaN matches NaN; -0 and +0 differ)."""
    g = got.double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    assert g.shape == w.shape
    same = (g.view(np.int64) == w.view(np.int64)) | (np.isnan(g) & np.isnan(w))
    if not same.all():
        idx = np.argwhere(~same)[:5]
        raise AssertionError(f"{(~same).sum()} / {same.size} differ; e.g. at {idx.tolist()}: "
                             f"got {[g[tuple(i)] for i in idx]}, want {[w[tuple(i)] for i in idx]}")  # fmt: skip


# --- data ---------------------------------------------------------------------------------------------------------


def data(kind, shape, dtype, seed=0):
    """A tensor of ``dtype`` (values generated in float64 and rounded to it)."""
    g = np.random.default_rng(seed)
    prec, emin, emax = PARAMS[dtype]
    n = int(np.prod(shape))
    if kind == "normal":
        v = g.standard_normal(n) * 4.0
    elif kind == "ties":  # integers of the top binade, scaled: averages of 2 and 4 fall on midpoints often
        v = g.integers(2 ** (prec - 1), 2**prec, n) * g.choice([-1.0, 1.0], n) * 2.0 ** float(min(0, emax - prec - 2))
    elif kind == "cancel":  # huge values that cancel around small ones
        big = 2.0 ** min(emax - 4, 60)
        v = g.standard_normal(n)
        v[g.random(n) < 0.4] = big
        v[g.random(n) < 0.4] = -big
    elif kind == "special":
        v = g.standard_normal(n)
        v[g.random(n) < 0.08] = np.inf
        v[g.random(n) < 0.08] = -np.inf
        v[g.random(n) < 0.05] = np.nan
    elif kind == "extreme":  # the largest finite values (sums beyond the format, even beyond float64) and tiny ones
        top = (2 - 2.0 ** (1 - prec)) * 2.0**emax
        v = g.choice([top, -top, top / 2, 2.0 ** (emin - prec + 1), -(2.0 ** (emin - prec + 1)), 1.0], n)
    elif kind == "subnormal":  # averages on or below the subnormal grid
        v = g.integers(-7, 8, n) * 2.0 ** (emin - prec + 1)
    else:
        raise ValueError(kind)
    return torch.tensor(v.reshape(shape)).to(dtype)


AVG2D = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, divisor_override=3),
    dict(kernel_size=(1, 2), divisor_override=-1),
]
AVG1D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=1, stride=2),
]


# --- bit for bit against the oracle ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_avg_pool_is_the_exact_average_rounded_once(dtype, kind):
    x = data(kind, (2, 3, 7, 8), dtype)
    for args in AVG2D:
        shape = F.avg_pool2d(x.double(), **args).shape
        assert_bits(avg_pool2d(x, **args), oracle_avg(x, 2, shape, **args))
    x1 = data(kind, (3, 2, 11), dtype, seed=1)
    for args in AVG1D:
        shape = F.avg_pool1d(x1.double(), **args).shape
        assert_bits(avg_pool1d(x1, **args), oracle_avg(x1, 1, shape, **args))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaptive_avg_pool_is_the_exact_average_rounded_once(dtype, kind):
    x = data(kind, (2, 2, 7, 9), dtype, seed=2)
    for size in [(3, 4), (7, 2), (4, None), 1, (10, 13)]:
        got = adaptive_avg_pool2d(x, size)
        assert_bits(got, oracle_adaptive(x, 2, F.adaptive_avg_pool2d(x.double(), size).shape))
    x1 = data(kind, (3, 10), dtype, seed=3)
    for size in [3, 4, (7,), 1, 15]:
        got = adaptive_avg_pool1d(x1, size)
        assert_bits(got, oracle_adaptive(x1, 1, F.adaptive_avg_pool1d(x1.double(), size).shape))


def test_midpoints_are_decided_exactly():
    """Hand-made ties: the mean of fp16 1 and 1 + 2**-10 is the midpoint 1 + 2**-11 (even: 1);
    of 1 + 2**-10 and 1 + 2**-9 it is 1 + 3 * 2**-11 (even: 1 + 2**-9); float64 2**53 + 1 as an
    average of 2**53 and 1 with divisor 1 rounds to 2**53, and 2**53 + 3 to 2**53 + 4."""
    h = torch.tensor([[1.0, 1 + 2**-10, 1 + 2**-10, 1 + 2**-9]], dtype=torch.float16)
    assert avg_pool1d(h, 2).tolist() == [[1.0, 1 + 2**-9]]
    d = torch.tensor([[[[2.0**53, 1.0, 2.0**53 + 2, 1.0]]]], dtype=torch.float64)
    assert avg_pool2d(d, (1, 2), divisor_override=1).flatten().tolist() == [2.0**53, 2.0**53 + 4]
    f = torch.tensor([[[[2.0**24, 2.0**24], [2.0**24, 3.0]]]], dtype=torch.float32)  # (3 * 2**24 + 3) / 3
    assert avg_pool2d(f, 2, divisor_override=3).item() == 2.0**24  # the tie 2**24 + 1 goes to even


def _pieces(q: Fraction, dtype) -> list:
    """Values of dtype that sum to q exactly (greedy: each the rounding of what is left)."""
    out = []
    while q != 0 and len(out) < 8:
        out.append(_rn(q, dtype))
        q -= Fraction(out[-1])
    assert q == 0
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constructed_midpoints_and_their_neighbours(dtype):
    """Windows whose sum is exactly ``M * d`` for a midpoint M of dtype and a divisor up to 2**40
    (fp16: up to 30; bf16: 2**32), and the same plus a tiny term (the least subnormal, which puts
    a float64 window beyond a double-word), minus about 2**-30 or plus about 2**-100 of the sum: the
    rounding goes to even on the midpoint and to the side of the offset next to it."""
    prec, emin, emax = PARAMS[dtype]
    g = np.random.default_rng(11)
    rows, divisors = [], []
    for _ in range(40):
        a = Fraction(int(g.integers(2 ** (prec - 1), 2**prec)), 2 ** (prec - 1))  # a format value in [1, 2)
        m = a + Fraction(1, 2**prec)
        d = int(g.integers(1, 31)) if dtype == torch.float16 else int(g.integers(1, 2 ** min(40, 4 * prec)))
        near, nearer = (Fraction(2) ** max(emin - prec + 1, _log2_floor(m * d) - k) for k in (30, 100))
        for offset in (Fraction(0), Fraction(2) ** (emin - prec + 1), -near, nearer):
            for sign in (1, -1):
                terms = _pieces(sign * (m * d + offset), dtype)
                rows.append(terms + [0.0] * (6 - len(terms)))
                divisors.append(d)
    for d in sorted(set(divisors)):
        batch = [r for r, e in zip(rows, divisors) if e == d]
        x = torch.tensor(batch, dtype=torch.float64)[:, None, None, :].to(dtype)
        assert x.double()[:, 0, 0].tolist() == batch  # the pieces are exact in dtype
        got = avg_pool2d(x, (1, 6), divisor_override=d)
        want = [[[[_average(r, d, dtype, plus_zero=True)]]] for r in batch]
        assert_bits(got, want)


def test_each_tier_is_exercised():
    """Ties take the exact double-word path; windows whose sum is no double-word, or holds inf,
    the superaccumulator (ties included); float64's extremes the rationals."""
    before = pool.PATHS.copy()
    avg_pool2d(data("ties", (2, 4, 8, 8), torch.float64).abs(), 2)  # a quarter of the averages are midpoints
    assert pool.PATHS["exact"] - before["exact"] > 20
    for dtype in (
        torch.float32,
        torch.float64,
    ):  # ties 2**24 + 1, 2**53 + 1; terms 2**-60, 2**-120 spoil the double-word
        top, tiny = 2.0 ** PARAMS[dtype][0], [2.0**-60, 2.0**-120, -(2.0**-60), -(2.0**-120)]
        x = torch.tensor([[[top, 1.0, *tiny, math.inf, 1, 1, 1, 1, 1]]], dtype=dtype)
        mid = pool.PATHS.copy()
        assert avg_pool2d(x, (1, 6), divisor_override=1).tolist() == [[[top, math.inf]]]
        assert pool.PATHS["superacc"] - mid["superacc"] == 2
    mid = pool.PATHS.copy()
    x = torch.tensor([[1.5e308, 1.7e308, 1e-310, 3e-310]], dtype=torch.float64)
    assert avg_pool1d(x, 2).tolist() == [[float(Fraction(1.5e308) / 2 + Fraction(1.7e308) / 2), 2e-310]]
    assert pool.PATHS["rational"] - mid["rational"] == 2


def test_divisor_beyond_float64_integers():
    x = data("normal", (1, 2, 4, 4), torch.float64)
    d = 2**60 + 1
    got = avg_pool2d(x, 2, divisor_override=d)
    assert_bits(got, oracle_avg(x, 2, got.shape, kernel_size=2, divisor_override=d))


# --- against torch ------------------------------------------------------------------------------------------------


def _layouts(x):
    """The same values as contiguous, non-contiguous (a transposed copy seen back), channels_last
    and unbatched inputs."""
    yield x
    yield x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if x.dim() == 4:
        yield x.contiguous(memory_format=torch.channels_last)
    yield x[0]


AVG_GRID = [
    dict(kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=i, divisor_override=d)
    for k, s, p in [(1, None, 0), (2, None, 1), (3, 2, 1), ((3, 2), (2, 1), (1, 0)), (4, 3, 2), ((5, 3), 2, (2, 1))]
    for c in (False, True)
    for i in (True, False)
    for d in (None, 7)
]


def _rounded_torch64(ref, t64, exact, dtype):
    """ref == RN_dtype(torch's float64 result) except where that double rounding is wrong: there
    torch's float64 value must sit exactly on a midpoint of dtype and ref must equal the oracle.
    Returns the number of such elements."""
    r = ref.double().numpy()
    c = t64.to(dtype).double().numpy()
    t = t64.numpy()
    bad = ~((r.view(np.int64) == c.view(np.int64)) | (np.isnan(r) & np.isnan(c)))
    for i in map(tuple, np.argwhere(bad)):
        assert _is_midpoint(float(t[i]), dtype), (i, r[i], c[i], t[i])
        assert r[i] == exact()[i], (i, r[i], exact()[i])
    return int(bad.sum())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_avg_pool2d_agrees_with_torch_float64(dtype):
    base = data("normal", (2, 3, 9, 10), dtype, seed=5)
    double_roundings = 0
    for args in AVG_GRID:
        for x in _layouts(base):
            ref = avg_pool2d(x, **args)
            t64 = F.avg_pool2d(x.double(), **args)
            assert ref.dtype == dtype and ref.shape == t64.shape
            if dtype == torch.float64:  # torch's float64 sum errs by <= (n - 1) u sum|x|: so far from the exact value
                n = np.prod(_pair(args["kernel_size"], 2))
                bound = (n + 1) * 2.0**-53 * F.avg_pool2d(x.abs().double(), **args).abs() + 2.0**-53 * ref.abs()
                assert ((ref - t64).abs() <= bound).all()
            else:
                double_roundings += _rounded_torch64(
                    ref, t64, lambda x=x, args=args, shape=t64.shape: oracle_avg(x, 2, shape, **args), dtype
                )
    assert double_roundings <= 2  # measured: 0 on this data


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_avg_pool1d_and_adaptive_agree_with_torch_float64(dtype):
    x1 = data("normal", (3, 4, 13), dtype, seed=6)
    x2 = data("normal", (2, 3, 9, 11), dtype, seed=7)
    cases = [(avg_pool1d, F.avg_pool1d, x, a) for x in (x1, x1[0], x1[:, ::2]) for a in [
        dict(kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=i)
        for k, s, p in [(1, 1, 0), (2, None, 1), (3, 2, 1), (5, 3, 2)] for c in (False, True) for i in (True, False)
    ]]  # fmt: skip
    cases += [
        (adaptive_avg_pool1d, F.adaptive_avg_pool1d, x, dict(output_size=o))
        for x in (x1, x1[0])
        for o in (1, 4, 6, 13, 20)
    ]
    cases += [(adaptive_avg_pool2d, F.adaptive_avg_pool2d, x, dict(output_size=o)) for x in _layouts(x2)
              for o in (1, (3, 4), (9, None), (5, 14))]  # fmt: skip
    for ours, theirs, x, args in cases:
        ref = ours(x, **args)
        t64 = theirs(x.double(), **args)
        assert ref.dtype == dtype and ref.shape == t64.shape, (ours.__name__, args)
        if dtype == torch.float64:
            n = x.shape[-1] * (x.shape[-2] if theirs is F.adaptive_avg_pool2d else 1)  # >= the window size
            bound = (n + 1) * 2.0**-53 * theirs(x.abs().double(), **args) + 2.0**-53 * ref.abs()
            assert ((ref - t64).abs() <= bound).all(), (ours.__name__, args)
        else:
            assert _rounded_torch64(ref, t64, lambda: None, dtype) == 0, (ours.__name__, args)


MAX_GRID = [
    dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=c)
    for k, s, p, d in [
        (1, None, 0, 1),
        (2, None, 1, 1),
        (3, 2, 1, 1),
        ((3, 2), (2, 1), (1, 0), (1, 2)),
        (3, 1, 1, 2),
        (2, 3, 1, 3),
        ((4, 2), 2, (2, 1), (2, 1)),
    ]  # fmt: skip
    for c in (False, True)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_max_pool_is_bit_identical_to_torch(dtype):
    base = data("special", (2, 3, 9, 10), dtype, seed=8)
    base[0, 0, :3, :3] = 0.0
    base[0, 0, 1, 1] = -0.0  # -0 first in some windows, +0 first in others
    base[1, 2] = -math.inf  # whole windows of -inf
    base[1, 1, ::2, ::3] = -math.nan  # NaNs with the sign bit set
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[base.element_size()]

    def same(ours, theirs):
        """Every bit; a NaN's sign and payload too for float32/float64. torch's half kernels pass a NaN
        through float, which changes its bits differently per code path (max_pool1d keeps them,
        max_pool2d quiets an fp16 NaN and gives bf16 0x7fc0, or 0xffff when vectorized): there a
        NaN must match a NaN; refkern returns the input's own."""
        if ours.dtype != theirs.dtype:
            return False
        a, b = ours.view(bits), theirs.view(bits)
        if dtype in (torch.float16, torch.bfloat16):
            nan = ours.isnan()
            return torch.equal(nan, theirs.isnan()) and torch.equal(a[~nan], b[~nan])
        return torch.equal(a, b)

    for args in MAX_GRID:
        for x in _layouts(base):
            v, i = max_pool2d(x, **args, return_indices=True)
            tv, ti = F.max_pool2d(x, **args, return_indices=True)
            assert same(v, tv) and torch.equal(i, ti), args
            assert same(max_pool2d(x, **args), F.max_pool2d(x, **args)), args
        for x in (base[:, :, 0], base[0, :, 0], base[:, :, 3, ::2]):
            a1 = {k: (v[0] if isinstance(v, tuple) else v) for k, v in args.items()}
            assert same(max_pool1d(x, **a1), F.max_pool1d(x, **a1)), a1  # torch's max_pool1d_impl
            v, i = max_pool1d(x, **a1, return_indices=True)
            tv, ti = F.max_pool1d(x, **a1, return_indices=True)
            assert same(v, tv) and torch.equal(i, ti), a1


def test_max_pool_window_with_no_tap_inside():
    """L = 2, kernel 2, dilation 3, padding 1: the one window's taps are -1 and 2, both outside;
    torch gives -inf and the index of its first tap at or after 0 (2)."""
    x = torch.tensor([[1.0, 2.0]])
    assert F.max_pool1d(x, 2, padding=1, dilation=3, return_indices=True)[1].tolist() == [[2]]
    v, i = max_pool1d(x, 2, padding=1, dilation=3, return_indices=True)
    assert v.tolist() == [[-math.inf]] and i.tolist() == [[2]]


# --- kinds of input and output ------------------------------------------------------------------------------------


@pytest.mark.parametrize("np_dtype", [np.float16, np.float32, np.float64])
def test_numpy_in_numpy_out(np_dtype):
    x = np.random.default_rng(9).standard_normal((3, 6, 6)).astype(np_dtype)
    t = torch.from_numpy(x)
    for ours, args in [
        (avg_pool2d, dict(kernel_size=2)),
        (adaptive_avg_pool2d, dict(output_size=4)),
        (max_pool2d, dict(kernel_size=3, stride=2, padding=1)),
    ]:
        got = ours(x, **args)
        assert isinstance(got, np.ndarray) and got.dtype == np_dtype
        assert np.array_equal(got, ours(t, **args).numpy())
    x[0, 1, ::2] = -np.nan
    v, i = max_pool1d(x[0], 2, return_indices=True)
    assert isinstance(i, np.ndarray) and i.dtype == np.int64
    assert v.tobytes() == F.max_pool1d(t[0], 2).numpy().tobytes()  # NaNs bit for bit
    assert np.array_equal(i, F.max_pool1d(t[0], 2, return_indices=True)[1].numpy())


def test_empty_batch_and_empty_adaptive_output():
    x = torch.zeros(0, 2, 5, 5)
    assert avg_pool2d(x, 2).shape == F.avg_pool2d(x, 2).shape
    assert max_pool2d(x, 2, return_indices=True)[1].shape == (0, 2, 2, 2)
    y = torch.ones(1, 2, 5, 5)
    assert adaptive_avg_pool2d(y, (0, 3)).shape == F.adaptive_avg_pool2d(y, (0, 3)).shape


def test_truth_agrees_where_it_exists():
    """refkern.truth's poolings (another implementation, mpmath/rationals) give the same values;
    zeros compare equal whatever their sign: the truth gives -0 for a window of -0 values, where
    torch's CPU kernels and refkern give +0."""
    truth = pytest.importorskip("refkern.truth")
    if not hasattr(truth, "avg_pool2d"):
        pytest.skip("refkern.truth has no poolings yet")
    for dtype in DTYPES:
        x = data("ties", (2, 2, 6, 7), dtype, seed=10)
        x[0, 0, :3, :3] = -0.0  # windows of -0: +0 here, -0 there
        pairs = [
            (avg_pool2d(x, 3, 2, 1, ceil_mode=True), truth.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
            (avg_pool1d(x[0], 2), truth.avg_pool1d(x[0], 2)),
            (adaptive_avg_pool2d(x, (4, 5)), truth.adaptive_avg_pool2d(x, (4, 5))),
            (max_pool2d(x, 3, 2, 1, dilation=2), truth.max_pool2d(x, 3, 2, 1, dilation=2)),
        ]
        for ours, theirs in pairs:
            assert torch.equal(ours, theirs)


# --- argument checks ----------------------------------------------------------------------------------------------

X2 = torch.zeros(1, 2, 5, 5)
X1 = torch.zeros(1, 2, 5)
BAD = [
    (lambda: avg_pool2d(X2, 3, padding=2), ValueError, r"^avg_pool2d: padding must be at most half of kernel_size"),
    (lambda: avg_pool1d(X1, 2, padding=2), ValueError, r"^avg_pool1d: padding must be at most half"),
    (lambda: max_pool2d(X2, 2, padding=2, dilation=3), ValueError, r"^max_pool2d: padding must be at most half"),
    (lambda: avg_pool2d(X2, 0), ValueError, r"^avg_pool2d: kernel_size must be >= 1; got kernel_size=0"),
    (lambda: avg_pool2d(X2, 2, stride=0), ValueError, r"^avg_pool2d: stride must be >= 1"),
    (lambda: avg_pool2d(X2, 2, padding=-1), ValueError, r"^avg_pool2d: padding must be >= 0"),
    (lambda: max_pool1d(X1, 2, dilation=0), ValueError, r"^max_pool1d: dilation must be >= 1"),
    (lambda: avg_pool2d(X2, (2, 2, 2)), ValueError, r"^avg_pool2d: kernel_size must be an int or a tuple of 2"),
    (lambda: avg_pool1d(X1, (2, 2)), ValueError, r"^avg_pool1d: kernel_size must be an int; got kernel_size=\(2, 2\)"),
    (lambda: avg_pool2d(X2, 2.0), TypeError, r"^avg_pool2d: kernel_size must be made of ints"),
    (lambda: avg_pool2d(X2, True), TypeError, r"^avg_pool2d: kernel_size must be made of ints"),
    (lambda: avg_pool2d(X2, 6), ValueError, r"^avg_pool2d: the output would be empty"),
    (lambda: max_pool1d(X1, 3, dilation=3), ValueError, r"^max_pool1d: the output would be empty.*dilation=3"),
    (lambda: avg_pool2d(X2, 2, divisor_override=0), ValueError, r"^avg_pool2d: divisor_override must be nonzero"),
    (lambda: avg_pool2d(X2, 2, divisor_override=2.5), TypeError, r"^avg_pool2d: divisor_override must be an int"),
    (lambda: avg_pool2d(X2, 2, ceil_mode=1), TypeError, r"^avg_pool2d: ceil_mode must be a bool"),
    (lambda: avg_pool2d(X2, 2, count_include_pad=None), TypeError, r"^avg_pool2d: count_include_pad must be a bool"),
    (lambda: max_pool2d(X2, 2, return_indices="yes"), TypeError, r"^max_pool2d: return_indices must be a bool"),
    (lambda: avg_pool2d(X2[0, 0], 2), ValueError, r"^avg_pool2d: input must have shape \(C, H, W\) or \(N, C, H, W\); got input.shape=\(5, 5\)"),
    (lambda: avg_pool1d(X2, 2), ValueError, r"^avg_pool1d: input must have shape \(C, L\) or \(N, C, L\)"),
    (lambda: avg_pool2d(torch.zeros(1, 2, 0, 5), 1), ValueError, r"^avg_pool2d: input must have nonzero C, H and W"),
    (lambda: max_pool1d(torch.zeros(2, 0), 1), ValueError, r"^max_pool1d: input must have nonzero C and L"),
    (lambda: adaptive_avg_pool2d(X2, (1, 2, 3)), ValueError, r"^adaptive_avg_pool2d: output_size must be an int or 2 ints"),
    (lambda: adaptive_avg_pool1d(X1, -1), ValueError, r"^adaptive_avg_pool1d: output_size must be >= 0"),
    (lambda: adaptive_avg_pool2d(X2, 2.5), TypeError, r"^adaptive_avg_pool2d: output_size must be made of ints or None"),
    (lambda: avg_pool2d(torch.zeros(1, 1, 4, 4, dtype=torch.int64), 2), TypeError, r"^avg_pool2d: expected floating-point inputs"),
]  # fmt: skip


@pytest.mark.parametrize("call, exc, match", BAD, ids=[m.split(": ", 1)[-1][:40] for _, _, m in BAD])
def test_bad_arguments_are_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_torch_rejects_what_we_reject():
    """The same geometry checks as torch: what torch refuses, we refuse, and the other way round."""
    for args in [dict(kernel_size=3, padding=2), dict(kernel_size=2, padding=1), dict(kernel_size=6),
                 dict(kernel_size=5, stride=3, padding=2, ceil_mode=True), dict(kernel_size=4, padding=2)]:  # fmt: skip
        for ours, theirs, x in [(avg_pool2d, F.avg_pool2d, X2), (max_pool2d, F.max_pool2d, X2),
                                (avg_pool1d, F.avg_pool1d, X1), (max_pool1d, F.max_pool1d, X1)]:  # fmt: skip
            try:
                want = theirs(x, **args).shape
            except RuntimeError:
                with pytest.raises(ValueError):
                    ours(x, **args)
            else:
                assert ours(x, **args).shape == want
