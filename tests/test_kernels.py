"""matmul, linear, conv1d, conv2d: exact against the mpmath truth on every argument
combination, torch's semantics (shapes and float64 values), method bounds, and errors."""

import math
import zlib

import numpy as np
import pytest
from strategies import same

import refkern as rk
from refkern import truth

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _data(rng, shape, dtype="float32", kind="normal"):
    """Random inputs; kind="adversarial" mixes magnitudes 2**-40..2**40 and exact cancellations."""
    x = rng.standard_normal(shape)
    if kind == "adversarial":
        x = x * 2.0 ** rng.integers(-40, 41, shape)
        flat = x.reshape(-1)
        flat[1::3] = -flat[0 : len(flat[1::3]) * 3 : 3]  # exact negatives of other entries
    return x.astype(dtype)


def _all_same(got, want):
    g, w = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
    assert g.shape == w.shape
    bad = [i for i in range(g.size) if not same(g[i], w[i])]
    assert not bad, f"{len(bad)} elements differ, first at {bad[0]}: {g[bad[0]]!r} vs {w[bad[0]]!r}"


# ---------------------------------------------------------------------------- exactness

MATMUL_SHAPES = [
    ((5,), (5,)),
    ((4, 5), (5,)),
    ((5,), (5, 3)),
    ((3, 5), (5, 4)),
    ((2, 3, 5), (5, 2)),
    ((2, 1, 3, 5), (4, 5, 2)),  # batch broadcasting
    ((3, 0), (0, 2)),  # empty reduction: zeros
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype,kind", [("float32", "normal"), ("float64", "adversarial"), ("float16", "normal")])
def test_matmul_exact(sa, sb, dtype, kind):
    rng = _rng("mm", sa, sb, dtype)
    a, b = _data(rng, sa, dtype, kind), _data(rng, sb, dtype, kind)
    got = rk.matmul(a, b)
    assert got.shape == np.matmul(a, b).shape and got.dtype == np.dtype(dtype)
    _all_same(got, truth.matmul(a, b))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sx,sw", [((7,), (3, 7)), ((2, 7), (3, 7)), ((2, 2, 7), (3, 7)), ((2, 7), (7,))])
def test_linear_exact(sx, sw, bias):
    rng = _rng("lin", sx, sw, bias)
    x, w = _data(rng, sx, "float32", "adversarial"), _data(rng, sw, "float32", "adversarial")
    b = _data(rng, sw[:1] if len(sw) == 2 else (), "float32") if bias else None
    _all_same(rk.linear(x, w, b), truth.linear(x, w, b))


CONV2D_CASES = [
    dict(),
    dict(stride=2),
    dict(stride=(1, 2), padding=(1, 2)),
    dict(padding=1, dilation=2),
    dict(padding="same"),
    dict(padding="same", dilation=(2, 1)),
    dict(padding="valid", stride=(2, 1)),
    dict(padding=1, groups=2),
    dict(padding="same", padding_mode="reflect"),
    dict(padding=(1, 2), padding_mode="replicate"),
    dict(padding=2, padding_mode="circular", stride=2),
]


@pytest.mark.parametrize("kw", CONV2D_CASES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "default")
@pytest.mark.parametrize("ksize", [(3, 3), (2, 4)])
def test_conv2d_exact(kw, ksize):
    rng = _rng("c2", kw, ksize)
    g = kw.get("groups", 1)
    x = _data(rng, (2, 4, 6, 7), "float32", "adversarial")
    w = _data(rng, (4, 4 // g, *ksize), "float32", "adversarial")
    b = _data(rng, (4,), "float32")
    _all_same(rk.conv2d(x, w, b, **kw), truth.conv2d(x, w, b, **kw))


def test_conv2d_depthwise_unbatched_float64_exact():
    rng = _rng("dw")
    x = _data(rng, (3, 5, 5), "float64", "adversarial")
    w = _data(rng, (6, 1, 3, 3), "float64", "adversarial")
    got = rk.conv2d(x, w, None, padding=1, groups=3)
    assert got.shape == (6, 5, 5)
    _all_same(got, truth.conv2d(x, w, None, padding=1, groups=3))


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(stride=2, padding=1),
        dict(padding="same", dilation=2),
        dict(groups=2, padding_mode="circular", padding=1),
    ],
)
def test_conv1d_exact(kw):
    rng = _rng("c1", kw)
    g = kw.get("groups", 1)
    x = _data(rng, (2, 4, 9), "float32", "adversarial")
    w = _data(rng, (6, 4 // g, 3), "float32", "adversarial")
    b = _data(rng, (6,), "float32")
    _all_same(rk.conv1d(x, w, b, **kw), truth.conv1d(x, w, b, **kw))


def test_specials_and_extremes_per_element():
    a = np.array([[1e30, 1.0, -1e30], [np.inf, 1.0, 0.0], [3e38, 3e38, -3e38], [0.0, 0.0, 0.0]], np.float32)
    b = np.array([[1.0, 1.0], [1.0, np.inf], [1.0, -0.0]], np.float32)
    got = rk.matmul(a, b)
    _all_same(got, truth.matmul(a, b))
    assert got[0, 0] == 1.0 and got[1, 1] == np.inf and math.isnan(got[3, 1]) and got[2, 0] == np.float32(3e38)


@pytest.mark.parametrize(
    "row,bias,want",
    [
        ([1.0, 2.0**-24], 0.0, 1.0),  # exact midpoint: ties to even
        ([1.0, 2.0**-24, 2.0**-60], 0.0, 1.0 + 2.0**-23),  # just above the midpoint
        ([1.0 + 2.0**-23, 2.0**-24], 0.0, 1.0 + 2.0**-22),  # midpoint, odd neighbour: up
        ([1.0, -(2.0**-25), -(2.0**-80)], 0.0, 1.0 - 2.0**-24),  # just below 1 - 2**-25 (a midpoint): down
        ([2.0**-24], 1.0, 1.0),  # the bias makes the midpoint
        ([1e30, 1.0, -1e30], 0.0, 1.0),  # cancellation: the float64 estimate cannot decide, exact path does
        ([1.0, -1.0], -0.0, 0.0),  # exact zero: sign by the IEEE rule
        ([-0.0, 0.0], -0.0, 0.0),
        ([-0.0, -0.0], -0.0, -0.0),
    ],
)
def test_fast_rounding_path_decides_only_when_it_can(row, bias, want):
    """float32 outputs use a float64 estimate of the two bin counts with an error bound; near a
    midpoint or under cancellation it must hand over to the exact path."""
    a = np.array([row], np.float32)
    got = rk.linear(a, np.ones((1, len(row)), np.float32), np.array([bias], np.float32))
    assert same(got[0, 0], want)
    _all_same(got, truth.linear(a, np.ones((1, len(row)), np.float32), np.array([bias], np.float32)))


def test_float32_conversion_is_round_to_float32():
    """The convolutions' fast path rounds float32 results by the float64 -> float32 conversion
    (refkern.kernels.conv.decide), taking it for round_to(x, 24, -126, 127): the same for every
    float64 x. Pinned on midpoints and their neighbours (normal, subnormal, the overflow threshold
    2**128 - 2**103 and the largest float32), values beyond float32's range and random bit patterns."""
    from refkern.accumulate.formats import FLOAT32, round_array

    rng = np.random.default_rng(32)
    e = rng.integers(-160, 129, 4000).astype(float)
    mid = (2 * rng.integers(0, 2**23, 4000) + 1 + 2**24) * 2.0 ** (e - 24)  # odd multiples of half an ulp
    sub = (2 * rng.integers(0, 2**22, 1000) + 1) * 2.0**-150  # subnormal midpoints
    edge = np.array([2.0**128 - 2.0**103, 2.0**128 - 2.0**104, 2.0**128, 2.0**-150, 2.0**-149, 3 * 2.0**-150, 1e300])
    x = np.concatenate([mid, sub, edge])
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, 0.0)])
    x = np.concatenate([x, -x, rng.integers(0, 2**63, 20000, dtype=np.int64).view(np.float64)])
    x = x[np.isfinite(x)]
    want = round_array(x, *FLOAT32.params)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as round_to gives
        got = x.astype(np.float32).astype(np.float64)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


def test_torch_in_tensor_out():
    x, w, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    y = rk.conv2d(x, w, b, padding=1)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.device.type == "cpu"
    _all_same(y.numpy(), truth.conv2d(x, w, b, padding=1).numpy())
    h = rk.linear(torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(3, 4, dtype=torch.bfloat16))
    assert h.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "call,torch_call,match",
    [
        (lambda a, b: rk.matmul(a, b), torch.matmul, r"^matmul: a and b must have the same dtype, as torch requires \(it does not promote\); got a\.dtype=float32 and b\.dtype=float64\. Convert one"),
        (lambda a, b: rk.linear(a, b.T), lambda a, b: F.linear(a, b.T), r"^linear: x and weight must have the same dtype.*got x\.dtype=float32 and weight\.dtype=float64\."),
        (lambda a, b: rk.linear(a, a[:2], b[0]), lambda a, b: F.linear(a, a[:2], b[0]), r"^linear: x and bias must have the same dtype.*got x\.dtype=float32 and bias\.dtype=float64\."),
        (lambda a, b: rk.truth.matmul(a, b), torch.matmul, r"^truth\.matmul: a and b must have the same dtype"),
    ],
)  # fmt: skip
def test_mixed_dtypes_raise_as_torch_does(call, torch_call, match):
    a, b = torch.ones(3, 5), torch.ones(5, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        torch_call(a, b)
    with pytest.raises(TypeError, match=match):
        call(a, b)
    with pytest.raises(TypeError, match=match):  # numpy arrays follow the same rule
        call(a.numpy(), b.numpy())


@pytest.mark.parametrize("nd", [1, 2])
def test_mixed_conv_dtypes_raise_as_torch_does(nd):
    x = torch.ones(1, 2, *([6] * nd), dtype=torch.float16)
    w = torch.ones(3, 2, *([3] * nd), dtype=torch.bfloat16)
    f, tf = (rk.conv1d, F.conv1d) if nd == 1 else (rk.conv2d, F.conv2d)
    with pytest.raises(RuntimeError):
        tf(x, w)
    with pytest.raises(
        TypeError,
        match=rf"^conv{nd}d: x and weight must have the same dtype.*got x\.dtype=float16 and weight\.dtype=bfloat16\.",
    ):
        f(x, w)
    with pytest.raises(TypeError, match=rf"^conv{nd}d: x and bias must have the same dtype"):
        f(x, x.new_ones(3, 2, *([3] * nd)), torch.ones(3))


def test_compare_still_takes_the_mixed_operands_of_autocast():
    """Under autocast torch casts the operands on the way in: a bf16 activation meets an fp32 weight."""
    x, w, b = torch.randn(4, 16).bfloat16(), torch.randn(8, 16), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.linear(x, w, b)
    assert out.dtype == torch.bfloat16
    assert rk.compare(out, "linear", x, w, b).verdict in ("exact", "rounding", "reduced-precision")


def test_bias_is_a_term_of_the_exact_sum():
    """The forum question: conv(x, w, b) - conv(x, w) != b, and the exact reference says why."""
    rng = _rng("bias")
    x = rng.random((200, 1, 1, 1)).astype(np.float32)
    w = rng.random((1, 1, 1, 1)).astype(np.float32)
    b = rng.random(1).astype(np.float32)
    with_b = rk.conv2d(x, w, b)
    without = rk.conv2d(x, w)
    _all_same(with_b, truth.conv2d(x, w, b))
    exact = x.astype(np.float64) * w.astype(np.float64)[0, 0, 0, 0] + np.float64(b[0])  # exact in float64
    assert (with_b == exact.astype(np.float32)).all()  # one rounding of the exact value
    assert ((with_b - without) != b[0]).any()  # the subtraction shows two roundings, not a bug


# ------------------------------------------------------------ semantics parity with torch


def _close_to_torch_f64(got, want, absterms, k):
    """|exact - torch float64| <= gamma_k * sum|terms| + u|exact| (torch's own float64 rounding)."""
    u = 2.0**-53
    tol = (k * u / (1 - k * u)) * absterms + u * np.abs(want) + 1e-300
    err = np.abs(np.asarray(got, np.float64) - want)
    assert (err <= tol).all(), f"max err/tol {np.max(err / tol):.3g}"


MATMUL_GRID = [((4, 6), (6, 3)), ((6,), (6, 2)), ((3, 2, 6), (6,)), ((2, 1, 3, 4), (5, 4, 2)), ((7,), (7,))]


@pytest.mark.parametrize("sa,sb", MATMUL_GRID)
def test_matmul_matches_torch(sa, sb):
    rng = _rng("mmt", sa, sb)
    a, b = torch.from_numpy(_data(rng, sa, "float64")), torch.from_numpy(_data(rng, sb, "float64"))
    got, want = rk.matmul(a, b), torch.matmul(a, b)
    assert got.shape == want.shape
    _close_to_torch_f64(got.numpy(), want.numpy(), torch.matmul(a.abs(), b.abs()).numpy(), sa[-1] + 1)


CONV_GRID = [
    dict(stride=s, padding=p, dilation=d, groups=g)
    for s in (1, 2, (2, 1))
    for p in (0, 1, (2, 0), "valid")
    for d in (1, (1, 2))
    for g in (1, 2)
] + [dict(padding="same", dilation=d, groups=g) for d in (1, 2, (2, 1)) for g in (1, 4)]


@pytest.mark.parametrize("kw", CONV_GRID, ids=str)
@pytest.mark.parametrize("ksize", [(3, 3), (2, 3)])
def test_conv2d_matches_torch(kw, ksize):
    rng = _rng("ct", kw, ksize)
    g = kw["groups"]
    x = torch.from_numpy(_data(rng, (2, 4, 8, 9), "float64"))
    w = torch.from_numpy(_data(rng, (4, 4 // g, *ksize), "float64"))
    b = torch.from_numpy(_data(rng, (4,), "float64"))
    got, want = rk.conv2d(x, w, b, **kw), F.conv2d(x, w, b, **kw)
    assert got.shape == want.shape
    absterms = F.conv2d(x.abs(), w.abs(), b.abs(), **kw).numpy()
    _close_to_torch_f64(got.numpy(), want.numpy(), absterms, w[0].numel() + 1)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [1, (2, 1), "same"])
@pytest.mark.parametrize("nd", [1, 2])
def test_padding_modes_match_nn_conv(mode, padding, nd):
    torch.manual_seed(0)
    cls = torch.nn.Conv1d if nd == 1 else torch.nn.Conv2d
    if nd == 1 and isinstance(padding, tuple):
        padding = padding[0]
    m = cls(4, 6, 4 if padding == "same" else 3, padding=padding, padding_mode=mode, groups=2, dtype=torch.float64)
    x = torch.randn(2, 4, *([9] if nd == 1 else [7, 8]), dtype=torch.float64)
    with torch.no_grad():
        want = m(x)
    f = rk.conv1d if nd == 1 else rk.conv2d
    got = f(x, m.weight.detach(), m.bias.detach(), padding=padding, padding_mode=mode, groups=2)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    "kw",
    [dict(stride=(2,)), dict(dilation=(2,)), dict(padding=(1,)), dict(stride=[2], padding=[1], dilation=(1,))],
    ids=str,
)
def test_conv2d_one_element_tuples_expand_as_torch(kw):
    rng = _rng("c1", kw)
    x = torch.from_numpy(_data(rng, (1, 2, 8, 9), "float64"))
    w = torch.from_numpy(_data(rng, (3, 2, 3, 3), "float64"))
    got, want = rk.conv2d(x, w, **kw), F.conv2d(x, w, **kw)
    assert got.shape == want.shape
    absterms = F.conv2d(x.abs(), w.abs(), **kw).numpy()
    _close_to_torch_f64(got.numpy(), want.numpy(), absterms, w[0].numel())


def test_unbatched_conv1d_matches_torch():
    x, w = torch.randn(3, 10, dtype=torch.float64), torch.randn(5, 3, 4, dtype=torch.float64)
    got, want = rk.conv1d(x, w, padding="same"), F.conv1d(x, w, padding="same")
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------------- the other methods


def _plain_f32_loop_linear(x, w, b):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for i in range(x.shape[0]):
        for o in range(w.shape[0]):
            s = np.float32(0)
            for k in range(x.shape[1]):
                s = np.float32(s + np.float32(x[i, k] * w[o, k]))
            out[i, o] = np.float32(s + b[o])
    return out


def test_naive_float32_is_a_plain_loop():
    rng = _rng("naive")
    x, w, b = _data(rng, (3, 40)), _data(rng, (4, 40)), _data(rng, (4,))
    got = rk.linear(x, w, b, accumulate="naive", accum_dtype="float32")
    assert (got == _plain_f32_loop_linear(x, w, b)).all()
    # conv in (ci, ky, kx) order, the bias last
    xc, wc, bc = _data(rng, (1, 2, 4, 4)), _data(rng, (3, 2, 3, 3)), _data(rng, (3,))
    got = rk.conv2d(xc, wc, bc, accumulate="naive", accum_dtype="float32")
    patches = np.stack([xc[0, :, i : i + 3, j : j + 3].reshape(-1) for i in range(2) for j in range(2)])
    want = _plain_f32_loop_linear(patches, wc.reshape(3, -1), bc).T.reshape(1, 3, 2, 2)
    assert (got == want).all()


@pytest.mark.parametrize("method", ["naive", "pairwise", "kahan", "neumaier", "dot2"])
def test_methods_within_their_bounds(method):
    from fractions import Fraction

    rng = _rng("bounds", method)
    x, w, b = _data(rng, (3, 50), "float32", "adversarial"), _data(rng, (2, 50)), _data(rng, (2,))
    got = rk.linear(x, w, b, accumulate=method)
    u, n = Fraction(1, 2**24), 51
    gamma = n * u / (1 - n * u)
    for i in range(3):
        for o in range(2):
            terms = [Fraction(float(x[i, k])) * Fraction(float(w[o, k])) for k in range(50)] + [Fraction(float(b[o]))]
            s, mag = sum(terms), sum(abs(t) for t in terms)
            bound = {
                "naive": gamma * mag,
                "pairwise": (math.ceil(math.log2(n)) + 1) * u / (1 - (math.ceil(math.log2(n)) + 1) * u) * mag,
                "kahan": (3 * u + 8 * n * u * u) * mag,
                "neumaier": u * abs(s) + (u + gamma**2) * mag,
                "dot2": u * abs(s) + gamma**2 * mag,
            }[method]
            assert abs(Fraction(float(got[i, o])) - s) <= bound


def test_fp16_accumulation_differs_from_exact():
    rng = _rng("fp16acc")
    x, w = _data(rng, (4, 512)), _data(rng, (8, 512))
    exact = rk.linear(x, w)
    half = rk.linear(x, w, accumulate="naive", accum_dtype="float16")
    assert half.dtype == np.float32 and (half != exact).mean() > 0.5


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: rk.matmul(np.ones((3, 4)), np.ones((5, 2))), ValueError, r"^matmul: inner dimensions must match; got a\.shape=\(3, 4\) and b\.shape=\(5, 2\)\."),
        (lambda: rk.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 2))), ValueError, r"^matmul: batch dimensions must broadcast"),
        (lambda: rk.matmul(np.float64(1.0), np.ones(2)), ValueError, r"^matmul: both arguments need at least 1 dimension"),
        (lambda: rk.matmul(np.ones((2, 2)), np.ones((2, 2), np.int32)), TypeError, r"^matmul: expected floating-point inputs .*; got b\.dtype=int32\."),
        (lambda: rk.matmul(np.ones(2), np.ones(2), accumulate="kahn"), ValueError, r"^matmul: unknown accumulate='kahn'; choose one of"),
        (lambda: rk.linear(np.ones((2, 5)), np.ones((3, 4))), ValueError, r"^linear: the last dimension of x must equal in_features; got x\.shape=\(2, 5\) and weight\.shape=\(3, 4\)\."),
        (lambda: rk.linear(np.ones((2, 4)), np.ones((3, 4)), np.ones(4)), ValueError, r"^linear: bias must have shape \(3,\) or \(\); got bias\.shape=\(4,\)\."),
        (lambda: rk.linear(np.ones((2, 4)), np.ones((3, 4, 1))), ValueError, r"^linear: weight must have shape \(out_features, in_features\)"),
        (lambda: rk.conv2d(np.ones((32, 32)), np.ones((1, 1, 3, 3))), ValueError, r"^conv2d: input must have shape \(N, C, H, W\) or \(C, H, W\); got shape \(32, 32\)\. Add batch and channel axes"),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3))), ValueError, r"^conv2d: weight must have shape \(C_out, C_in / groups, kh, kw\); got weight\.shape=\(4, 3, 3\)\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 1, 3, 3)), groups=2), ValueError, r"^conv2d: input channels and output channels must be divisible by groups; got 3 input channels, 4 output channels and groups=2\."),
        (lambda: rk.conv2d(np.ones((1, 4, 8, 8)), np.ones((4, 1, 3, 3)), groups=2), ValueError, r"^conv2d: expected weight\.shape\[1\] \* groups == input channels"),
        (lambda: rk.conv2d(np.ones((1, 3, 2, 2)), np.ones((4, 3, 3, 3))), ValueError, r"^conv2d: kernel size can't be greater than the padded input size; got padded input size \(2, 2\) and dilated kernel size \(3, 3\)\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), padding=-1), ValueError, r"^conv2d: padding must be non-negative; got padding=-1\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), stride=0), ValueError, r"^conv2d: stride must be positive; got stride=0\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), stride=(1, 2, 3)), ValueError, r"^conv2d: stride must be an int or a tuple of 1 or 2 ints; got stride=\(1, 2, 3\)\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), stride=()), ValueError, r"^conv2d: stride must be an int or a tuple of 1 or 2 ints; got stride=\(\)\."),
        (lambda: rk.conv1d(np.ones((1, 3, 8)), np.ones((4, 3, 3)), stride=(2, 2)), ValueError, r"^conv1d: stride must be an int or a tuple of 1 int; got stride=\(2, 2\)\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), padding="same", stride=2), ValueError, r"^conv2d: padding='same' is not supported for strided convolutions"),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), padding="full"), ValueError, r"^conv2d: padding must be an int, a tuple of 1 or 2 ints, 'valid' or 'same'; got padding='full'\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), padding_mode="mirror", padding=1), ValueError, r"^conv2d: unknown padding_mode='mirror'; choose one of 'zeros', 'reflect', 'replicate', 'circular'\."),
        (lambda: rk.conv2d(np.ones((1, 3, 3, 3)), np.ones((4, 3, 3, 3)), padding=3, padding_mode="reflect"), ValueError, r"^conv2d: padding_mode='reflect' needs padding smaller than the input size"),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), np.ones(3)), ValueError, r"^conv2d: bias must have shape \(4,\); got bias\.shape=\(3,\)\."),
        (lambda: rk.conv2d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3, 3)), groups=0), ValueError, r"^conv2d: groups must be a positive int; got groups=0\."),
        (lambda: rk.conv1d(np.ones((1, 3, 8, 8)), np.ones((4, 3, 3))), ValueError, r"^conv1d: input must have shape \(N, C, L\) or \(C, L\); got shape \(1, 3, 8, 8\)\."),
        (lambda: rk.conv1d(np.ones(8), np.ones((4, 3, 3))), ValueError, r"^conv1d: input must have shape \(N, C, L\) or \(C, L\); got shape \(8,\)\. Add batch and channel axes: x\[None, None\]\."),
    ],
)  # fmt: skip
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
