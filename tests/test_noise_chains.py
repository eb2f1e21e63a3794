"""The float32 sums' emulated chains (refkern.analysis.noise_chains) and the sign test of the accumulators
(refkern.analysis.stats.asymmetric): each pinned by hand, each checked against kernels written out here."""

import math

import numpy as np
import pytest
import torch
from strategies import thread_spans

import refkern as rk
from refkern.analysis import noise_chains as nc
from refkern.analysis.stats import asymmetric, level


def _chain(x, back=False):
    acc = np.float32(0.0)
    for v in (x[::-1] if back else x):
        acc = np.float32(acc + v)
    return acc


def _lanes(x, L):
    acc = np.zeros(L, np.float32)
    for k, v in enumerate(x):
        acc[k % L] = np.float32(acc[k % L] + v)
    return acc


def _threads(x, T, omp=False):
    return [x[a:b] for a, b in thread_spans(len(x), T, omp) if b > a]


def test_chains_and_members_by_hand():
    """C = isqrt(n) capped at 64; the members are T chunks of L lanes with T L < C, the scalar loop also
    right to left, OpenMP's split where it differs from ceil(n / T)."""
    assert (nc.C_MAX, nc.LANES) == (64, (1, 4, 8, 16, 32))
    assert [nc.chains_of(n) for n in (3, 4, 1000, 4095, 4096, 10**7)] == [1, 2, 31, 63, 64, 64]
    assert nc.member_specs(3).shape == (0, 4)
    assert nc.member_specs(4).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    # n = 10, C = 3: T = 1, 2 scalar chains; 10 % 2 == 0, so one split
    assert nc.member_specs(10).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [2, 1, 0, 0]]
    # n = 17, C = 4: T = 2 splits 9, 8 and T = 3 6, 6, 5 both ways (torch's and OpenMP's): listed once
    assert nc.member_specs(17).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [2, 1, 0, 0], [3, 1, 0, 0]]
    # n = 26, C = 5: T = 4 splits 7, 7, 7, 5 (torch) and 7, 7, 6, 6 (OpenMP)
    specs = nc.member_specs(26).tolist()
    assert [4, 1, 0, 0] in specs and [4, 1, 0, 1] in specs


def test_members_are_the_kernels_written_out():
    """Every member's centre is the exact sum of the chain values of the kernel it names."""
    x = np.random.default_rng(7).standard_normal(1000).astype(np.float32)
    specs = nc.member_specs(1000)
    xh, err, pre = nc.members(x.reshape(1, -1), "sum", 1e9)
    for j, (T, L, back, omp) in enumerate(specs.tolist()):
        vals = [v for ch in _threads(x, T, omp) for v in (_lanes(ch, L) if L > 1 else [_chain(ch, back)])]
        assert xh[j, 0] == pytest.approx(math.fsum(float(v) for v in vals), rel=1e-15, abs=0), (T, L, back, omp)
    # the scalar loop: one chain, its last addition the only rounding left: matched exactly (pre 0)
    assert pre[0, 0] == 0.0 and pre[1, 0] == 0.0
    assert xh[0, 0] == float(_chain(x)) and xh[1, 0] == float(_chain(x, True))


def test_the_rest_by_hand():
    """Four ones, C = 2: chunks [1, 1], [1, 1] have partial sums 2, 2 and the combine 4: 4 + 4 + 16 = 24;
    lanes (0, 2), (1, 3) the same."""
    assert nc.rest_sq(np.ones((1, 4))).tolist() == pytest.approx([24.0], abs=0)


def test_a_stagnating_chain_is_no_member():
    """pytorch#38716: a scalar float32 loop over 4e7 values in [0, 1) stops at 2**24; its own error is far
    beyond its scale, so it is refused, while the same member on randn is kept."""
    g = np.random.default_rng(3)
    x = g.random(40_000_000, dtype=np.float32).reshape(1, -1)
    xh, _, _ = nc.members(x, "sum", level(10), nc.member_specs(x.shape[1])[:1])
    assert np.isnan(xh[0, 0])
    y = g.standard_normal(100_000).astype(np.float32).reshape(1, -1)
    xh, _, _ = nc.members(y, "sum", level(10), nc.member_specs(y.shape[1])[:1])
    assert xh[0, 0] == float(_chain(y[0]))


@pytest.mark.parametrize("n", [1000, 100_003])
def test_long_chain_kernels_are_rounding_and_a_small_bug_is_not(n):
    """A scalar loop either way, threads of scalar loops (both splits) and SIMD lanes: each is rounding;
    the torch result moved by 8 times the largest of their errors is a mismatch."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    t = torch.from_numpy(x)
    exact = math.fsum(float(v) for v in x)
    kernels = {"loop": _chain(x), "reversed": _chain(x, True)}
    for T in (2, 3, 7):
        for omp in (False, True):
            kernels[f"{T} threads{' omp' if omp else ''}"] = np.float32(sum(float(_chain(c)) for c in _threads(x, T, omp)))
    kernels["8 lanes"] = np.float32(sum(float(v) for v in _lanes(x, 8)))
    for name, v in kernels.items():
        rep = rk.compare(torch.tensor(v), "sum", t)
        assert rep.verdict in ("exact", "rounding"), (name, str(rep))
    spread = max(abs(float(v) - exact) for v in kernels.values())
    bad = torch.tensor(np.float32(float(t.sum()) + 8 * spread))
    assert rk.compare(bad, "sum", t).verdict == "mismatch"


def test_asymmetric_by_hand():
    """lam = level(2, alpha); T_offset = sum d / sqrt(sum d**2): 16 errors of +1 give 16 / 4 = 4."""
    alpha = 1e-6
    lam = level(2, alpha)
    assert lam == pytest.approx(math.sqrt(2 * math.log(4 / alpha)), abs=0)
    x = np.arange(1.0, 17.0)
    assert asymmetric(np.ones(16), x, 0.5) is (4.0 > level(2, 0.5))
    assert asymmetric(np.ones(16), x, alpha) is False  # 4 < lam = 5.56
    d = np.ones(64)  # T_offset = 8 > lam
    assert asymmetric(d, np.arange(64.0), alpha) is True
    # the emulated orders lean as much: the interval moves with them
    assert asymmetric(d, np.arange(64.0), alpha, [0.9 * d]) is False
    # balanced signs: T = 0, whatever the magnitudes
    assert asymmetric(np.tile([1.0, -1.0], 32), np.arange(64.0), alpha) is False
    # repeated (exact, error) pairs count once: 64 copies of one pair are one error, T = 1
    assert asymmetric(np.ones(64), np.zeros(64), alpha) is False


def test_thread_members_by_hand():
    """bf16 sum of 2 * GRAIN + 2 terms, ones then twos: two or three threads (ceil(n / GRAIN) = 3).
    T = 2, chunks of GRAIN + 1: partials 32769 -> 32768 (bf16 spacing 256 there, 1 above 32768, far from
    the midpoint) and 65538 -> 65536, total 98304. T = 3, chunks of 21846: 21846 -> 21888 (spacing 128),
    10923 + 2 * 10923 = 32769 -> 32768, 43692 -> 43776 (spacing 256); total 98432. No partial is near a
    boundary (the chunks' float32 scale is under 1.5 at lam = 7), so one member each, its scale the
    float32 additions of the partials: (2**-24)**2 times 98304**2, and 54656**2 + 98432**2."""
    from refkern.accumulate.formats import BFLOAT16
    from refkern.analysis.noise_store import GRAIN, thread_members

    X = np.concatenate([np.ones(GRAIN + 1), 2.0 * np.ones(GRAIN + 1)]).reshape(1, -1)
    xh, err, pre = thread_members(X, "sum", BFLOAT16, 7.0)
    assert xh.tolist() == [[98304.0], [98432.0]]
    u2 = 2.0**-48
    assert pre[:, 0].tolist() == pytest.approx([u2 * 98304.0**2, u2 * (54656.0**2 + 98432.0**2)], abs=0)
    # a mean: divided before the store (32769 / n, 65538 / n rounded) and after (32768 + 65536) / n
    xh, _, _ = thread_members(X, "mean", BFLOAT16, 7.0)
    n = X.shape[1]
    r = [float(torch.tensor(v / n).bfloat16()) for v in (32769.0, 65538.0)]
    assert xh[:2, 0].tolist() == pytest.approx([sum(r), 98304.0 / n], rel=1e-15, abs=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_half_sums_on_any_thread_count_are_rounding(dtype):
    """torch's CPU stores each thread's partial in the result format: on 1 to 8 threads its half sums and
    means of 3e5 terms stay rounding, and the sum one ulp off (a bug the thread members do not make here)
    is caught where no member lands on it."""
    x = torch.randn(300_001, generator=torch.Generator().manual_seed(5)).to(dtype)
    old = torch.get_num_threads()
    try:
        for th in (1, 2, 3, 8):
            torch.set_num_threads(th)
            for op in ("sum", "mean"):
                assert rk.compare(getattr(x, op)(), op, x).verdict in ("exact", "rounding"), (th, op)
    finally:
        torch.set_num_threads(old)
    good = x.sum()
    far = (good.double() * (1 + 2.0**-6)).to(dtype)  # 2**-6 relative: several ulps of a half result
    assert rk.compare(far, "sum", x).verdict == "mismatch"


def test_sign_power_by_hand():
    """The sign test can reject only where sqrt(N) > lam = level(2, alpha): N distinct nonzero errors."""
    from refkern.analysis.stats import sign_power

    alpha = 1e-6
    lam2 = level(2, alpha) ** 2  # 30.4: lam = 5.51
    assert lam2 == pytest.approx(2 * math.log(4 / alpha), abs=0)
    x = np.arange(64.0)
    assert sign_power(np.ones(31), x[:31], alpha) is True  # sqrt(31) = 5.57 > 5.51
    assert sign_power(np.ones(30), x[:30], alpha) is False  # sqrt(30) = 5.48
    assert sign_power(np.r_[np.ones(30), np.zeros(30)], x[:60], alpha) is False  # zeros do not count
    assert sign_power(np.ones(64), np.zeros(64), alpha) is False  # one distinct pair
