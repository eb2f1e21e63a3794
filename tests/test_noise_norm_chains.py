"""A float32 norm's emulated row statistics (refkern.analysis.noise_norm_chains): member counts and the rest's
formula pinned by hand; each member's statistic checked against the kernel written out here in numpy float32
scalars (the sum of squares, Welford, the two-pass loop) and its shift against the norm computed in rationals;
and the verdict on correct long-chain kernels (rounding) and on bugs of 8 spreads of correct kernels (mismatch)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from strategies import welford_f32

import refkern as rk
from refkern.analysis import noise_norm_chains as NC
from refkern.analysis import noise_var_chains as V
from refkern.analysis.noise_chains import member_specs as sum_specs
from refkern.analysis.noise_chains import rest_sq

U = 2.0**-24
F32 = np.float32


def _seq_sum(v):
    s = F32(0.0)
    for t in v:
        s = F32(s + t)
    return s


def test_member_counts_by_hand():
    # n = 64, C = 8. Sums: L = 1, T = 1..7 (7), the scalar loop backwards (1), OpenMP's split where it differs
    # from ceil(n / T): T = 3 (22, 22, 20 vs 22, 21, 21), T = 6, T = 7 (not T = 5: 13 x 4 + 12 both ways): 3;
    # L = 4, T = 1: 1. 12 specs, two divisions each.
    assert len(sum_specs(64)) == 12
    assert NC.member_count(64, False) == 24
    # var: those 12 as Welford, fixed blocks of 16 and 32 (B > ceil(64 / 8) = 8, fewer than 8 blocks), 8 two-pass
    # loops, no float32-merged tiles (B_MIN = 32 > 8): 22, two divisions each
    assert len(V.member_specs(64)) == 22
    assert NC.member_count(64, True) == 44
    assert not NC.applies(np.zeros((2, 3), np.float32), 3)  # C = isqrt(3) = 1: nothing emulated
    assert NC.applies(np.zeros((2, 4), np.float32), 4)
    assert not NC.applies(np.full((2, 16), 0.1), 16)  # not float32 numbers


def test_rest_of_the_mean_of_squares_by_hand():
    """rms_norm's rest: u**2 (5 sum x**4 + S_rest**2(x**2)) / n**2 + (u ms)**2; layer_norm's mean: u**2 (S_rest**2
    / n**2 + mean**2); the whole family's variance kept for layer_norm's variance (None)."""
    X = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.25, 2.0]], np.float32)
    # C = 2 chains of 2; x**2 of row 0 = 1, 4, 9, 16. Contiguous, left to right: the chains' partial sums past
    # their first term 5 and 25 (25 + 625), their combine (5 + 25)**2 = 900: 1550; right to left 5 and 25
    # again: 1550; lanes (1, 9) and (4, 16), either way: 10**2 + 20**2 + 900 = 1400. The largest: 1550.
    assert rest_sq(np.asarray(X, np.float64) ** 2)[0] == pytest.approx(1550.0, abs=0)
    ms = 30.0 / 4
    _, sv2 = NC.rest_shared(X, False, np.zeros(2), np.array([ms, 0.0]), U)
    want = U * U * (5.0 * (1 + 16 + 81 + 256) + 1550.0) / 16 + (U * ms) ** 2
    assert sv2[0] == pytest.approx(want, rel=1e-15)
    # the values 1, 2, 3, 4: contiguous 3**2 + 7**2 + combine 10**2 = 158 (either way); lanes (1, 3), (2, 4):
    # 4**2 + 6**2 + 100 = 152. The largest: 158.
    assert rest_sq(np.asarray(X, np.float64))[0] == pytest.approx(158.0, abs=0)
    smu2, none = NC.rest_shared(X, True, np.array([2.5, 0.4375]), np.zeros(2), U)
    assert none is None
    assert smu2[0] == pytest.approx(U * U * (158.0 / 16 + 2.5**2), rel=1e-15)


@pytest.mark.parametrize("n", [64, 200])
def test_mean_of_squares_members_are_the_kernels(n):
    """The scalar loop's sum of fl(x x) (left to right, right to left), divided by n or times fl(1 / n), plus
    fl(eps): w of two members, the float32 sum exactly (the division's rounding left in the member's variance)."""
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((3, n)) + 2.0).astype(F32)
    eps = 1e-6
    mu, w, smu2, sw2 = NC.stat_members(X, False, eps, 50.0)
    specs = sum_specs(n)
    k = len(specs)
    fwd = int(np.flatnonzero((specs[:, 0] == 1) & (specs[:, 1] == 1) & (specs[:, 2] == 0))[0])
    bwd = int(np.flatnonzero((specs[:, 0] == 1) & (specs[:, 1] == 1) & (specs[:, 2] == 1))[0])
    for i in range(3):
        sq = [F32(v * v) for v in X[i]]
        s_f, s_b = _seq_sum(sq), _seq_sum(sq[::-1])
        assert w[fwd, i] == float(s_f) / n + float(F32(eps))
        assert w[bwd, i] == float(s_b) / n + float(F32(eps))
        assert w[k + fwd, i] == float(s_f) * float(F32(1.0) / F32(n)) + float(F32(eps))
    assert not mu.any() and not smu2.any()
    assert np.all(sw2 > 0)  # the division and eps's addition are not emulated: a variance each


def test_layer_norm_members_are_the_kernels():
    """Welford's scalar loop and the two-pass loop: mean and w = fl(fl(M2 / n) + fl(eps)) exactly (one chain)."""
    rng = np.random.default_rng(4)
    n = 100
    X = (rng.standard_normal((2, n)) + 300.0).astype(F32)
    eps = 1e-5
    m2 = np.array([float(sum((Fraction(float(v)) - sum(map(Fraction, map(float, r))) / n) ** 2 for v in r)) for r in X])
    mu, w, smu2, sw2 = NC.stat_members(X, True, eps, 50.0, m2, np.full(2, 1e30))
    specs = V.member_specs(n)
    k = len(specs)
    wel = int(np.flatnonzero((specs[:, 0] == V.WELFORD) & (specs[:, 1] == 1) & (specs[:, 2] == 1)
                             & (specs[:, 3] == 0) & (specs[:, 5] == 0))[0])  # fmt: skip
    two = int(np.flatnonzero((specs[:, 0] == V.TWO_PASS) & (specs[:, 2] == 1) & (specs[:, 3] == 0)
                             & (specs[:, 4] == 0))[0])  # fmt: skip
    for i in range(2):
        _, m, q = welford_f32(X[i])
        assert mu[wel, i] == float(m)
        assert w[wel, i] == float(F32(F32(q / F32(n)) + F32(eps)))
        s = _seq_sum(X[i])
        mh = F32(s / F32(n))
        a = _seq_sum([F32(F32(v - mh) * F32(v - mh)) for v in X[i]])
        assert mu[two, i] == float(mh)
        assert w[two, i] == float(F32(F32(a / F32(n)) + F32(eps)))
        assert w[k + two, i] == float(F32(F32(a * F32(F32(1.0) / F32(n))) + F32(eps)))
    for j in (wel, two, k + wel, k + two):  # one chain: nothing left unemulated
        assert not smu2[j].any() and not sw2[j].any()


def test_merged_mean_variance_by_hand():
    """Two Welford chunks of 32 merged: the mean is the exact merge, its variance one merge's rounding of a
    mean within |mc| + 2 max |m_j - mc| and the store's (u mc)**2."""
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((1, 64)) + 300.0).astype(F32)
    spec = np.array([[V.WELFORD, 2, 1, 0, 0, 0]], np.int64)
    mo, M2, sM2, smo = V.member_moments(X, spec, 1e9, np.zeros(1), np.full(1, 1e30))
    _, m1, _ = welford_f32(X[0, :32])
    _, m2_, _ = welford_f32(X[0, 32:])
    mc = (32 * float(m1) + 32 * float(m2_)) / 64
    dev = max(abs(float(m1) - mc), abs(float(m2_) - mc))
    assert mo[0, 0] == pytest.approx(mc, rel=1e-15)
    assert smo[0, 0] == pytest.approx((U * (abs(mc) + 2 * dev)) ** 2 + (U * mc) ** 2, rel=1e-12)
    assert sM2[0, 0] > 0


def test_shift_is_the_norm_with_the_members_statistics():
    """A member's (A, B): (x - mu_k) r_k w - (x - mean) r w = A l1 + B l2 for every x, checked in rationals."""
    mean, r = np.array([2.0]), np.array([1.0 / math.sqrt(3.0)])
    mu, w = np.array([[2.0 + 2.0**-20]]), np.array([[3.0 * (1 + 2.0**-22)]])
    A, B, rem1, rem2 = NC.shifts(mean, r, mu, w, np.zeros((1, 1)), np.zeros((1, 1)))
    rk_ = 1.0 / math.sqrt(w[0, 0])
    for x, wt in ((5.0, 1.5), (-1.0, 0.25), (2.0, 1.0)):
        want = (Fraction(x) - Fraction(mu[0, 0])) * Fraction(rk_) * Fraction(wt) - (Fraction(x) - Fraction(
            mean[0])) * Fraction(r[0]) * Fraction(wt)  # fmt: skip
        l1 = r[0] * wt
        l2 = (x - mean[0]) * l1
        got = A[0, 0] * l1 + B[0, 0] * l2
        assert abs(got - float(want)) <= 1e-15 * (abs(x) + 3) * wt
    assert rem1[0, 0] == 0 and rem2[0, 0] == 0
    bad = NC.shifts(mean, r, np.array([[np.nan]]), w, np.zeros((1, 1)), np.zeros((1, 1)))
    assert all(np.isnan(b[0, 0]) for b in bad)  # a refused member never passes


# ------------------------------------------------------------------------------------------------- verdicts


def _rows(n, offset, seed=0, R=4):
    g = np.random.default_rng(seed)
    X = (g.standard_normal((R, n)) + offset).astype(F32)
    w = (1.0 + 0.1 * g.standard_normal(n)).astype(F32)
    b = (0.1 * g.standard_normal(n)).astype(F32)
    return X, w, b


def _layer_norm_seq(X, w, b, eps, how):
    """float32 layer_norm with one long chain's statistics: sequential Welford or the two-pass scalar loop."""
    n = X.shape[1]
    out = np.empty_like(X)
    for i, x in enumerate(X):
        if how == "welford":
            _, m, q = welford_f32(x)
        else:
            m = F32(_seq_sum(x) / F32(n))
            q = _seq_sum([F32(F32(v - m) * F32(v - m)) for v in x])
        r = F32(F32(1.0) / F32(np.sqrt(F32(F32(q / F32(n)) + F32(eps)))))
        out[i] = F32(F32(F32(x - m) * r) * w) + b
    return out


def _rms_norm_seq(X, w, eps):
    n = X.shape[1]
    out = np.empty_like(X)
    for i, x in enumerate(X):
        s = _seq_sum([F32(v * v) for v in x])
        r = F32(F32(1.0) / F32(np.sqrt(F32(F32(s / F32(n)) + F32(eps)))))
        out[i] = F32(F32(x * r) * w)
    return out


def _judge(name, out, X, w, b, eps):
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (out, X, w)]
    if name == "layer_norm":
        return rk.compare(t[0], "layer_norm", t[1], (X.shape[1],), t[2], torch.from_numpy(b), eps)
    return rk.compare(t[0], "rms_norm", t[1], (X.shape[1],), t[2], eps)


@pytest.mark.parametrize(("name", "n", "offset", "how"), [
    ("layer_norm", 4096, 300.0, "two-pass"), ("layer_norm", 4096, 300.0, "welford"), ("layer_norm", 1024, 0.0, "welford"),
    ("rms_norm", 4096, 0.0, "seq"), ("rms_norm", 1024, 300.0, "seq"),
])  # fmt: skip
def test_long_chain_kernels_are_rounding_and_bugs_of_8_spreads_are_not(name, n, offset, how):
    """A scalar loop's statistics (a correct kernel whose chain is the longest) is `rounding`; that kernel's output
    with one element, or one row scaled, off by 8 times the spread of the correct kernels here (the scalar loop,
    torch's CPU kernel, the exact result rounded) is a mismatch: before the members, the scale's one draw of the
    scalar loop's chain let such bugs pass (bench_verdict, session 9)."""
    X, w, b = _rows(n, offset)
    eps = 1e-5
    seq = _layer_norm_seq(X, w, b, eps, how) if name == "layer_norm" else _rms_norm_seq(X, w, eps)
    tx = [torch.from_numpy(a) for a in (X, w, b)]
    if name == "layer_norm":
        cpu = torch.nn.functional.layer_norm(tx[0], (n,), tx[1], tx[2], eps).numpy()
        ex = rk.layer_norm(tx[0].double(), (n,), tx[1].double(), tx[2].double(), eps)
    else:
        cpu = torch.nn.functional.rms_norm(tx[0], (n,), tx[1], eps).numpy()
        ex = rk.rms_norm(tx[0].double(), (n,), tx[1].double(), eps)
    exact = np.asarray(ex, np.float64)
    spread = max(np.abs(o.astype(np.float64) - exact).max() for o in (seq, cpu, exact.astype(F32)))
    assert _judge(name, seq, X, w, b, eps).verdict == "rounding"
    assert _judge(name, cpu, X, w, b, eps).verdict == "rounding"
    el = seq.copy()
    el[1, 7] = F32(el[1, 7] + 8.0 * spread)
    assert _judge(name, el, X, w, b, eps).verdict == "mismatch"
    row = seq.copy()
    row[2] = (row[2].astype(np.float64) * (1.0 + 8.0 * spread / np.abs(row[2]).max())).astype(F32)
    assert _judge(name, row, X, w, b, eps).verdict == "mismatch"
