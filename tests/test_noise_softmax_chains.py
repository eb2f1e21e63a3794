"""A float32 softmax's emulated denominator chains (refkern.analysis.noise_softmax_chains): member counts, the flips'
variance proxy, the terms' slack and the rest pinned by hand; each member's shift checked against the kernel
written out here in numpy float32 scalars (the scalar loop, SIMD lanes, the online loop both ways); the members'
remaining scale against a kernel with another exp (numpy's float32 exp); and the verdict on correct long-chain
kernels (rounding) and on bugs of 8 spreads of correct kernels (mismatch)."""

import math

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.analysis import noise_softmax_chains as SC
from refkern.analysis._softmax_rows import shared_sq
from refkern.analysis.noise_chains import _flip_sq, rest_sq
from refkern.analysis.noise_chains import member_specs as sum_specs
from refkern.analysis.noise_softmax import scale_rows

U = 2.0**-24
F32 = np.float32


def _exp32(a):
    """The correctly rounded float32 exp of a float32 argument (float64's exp, within an ulp of float64, rounded)."""
    return F32(math.exp(float(a)))


def _loop(terms):
    s = F32(0.0)
    for t in terms:
        s = F32(s + t)
    return float(s)


def _online(x, back):
    """Milakov and Gimelshein's running normaliser in float32 scalars: its sum in the final maximum's units, and
    the exact sum of its float32 terms in those units."""
    m, s, ex = F32(-np.inf), F32(0.0), 0.0
    for v in x[::-1] if back else x:
        if v > m:
            if s > 0:
                s = F32(s * _exp32(F32(m - v)))
                ex *= math.exp(float(m) - float(v))
            m = v
        t = _exp32(F32(v - m))
        s = F32(s + t)
        ex += float(t)
    return float(s), ex


def test_member_count_by_hand():
    # n = 64, C = 8: the sums' 12 specs (test_noise_norm_chains) and the online loop both ways
    assert SC.ONLINE == 2
    assert len(sum_specs(64)) == 12
    assert SC.member_count(64) == 14
    assert not SC.applies(np.zeros((2, 3), np.float32))  # C = isqrt(3) = 1: nothing emulated
    assert SC.applies(np.zeros((2, 4), np.float32))


def test_flip_variance_by_hand():
    # 1 + 0.5 = 1.5, ulp(1.5) = 2**-23; a term known to 2**-25: p = 1/4, (1 - 2 p) / (2 ln((1 - p) / p)) = 0.5 / (2 ln 3)
    assert _flip_sq(F32(1.0), F32(1.5), 2.0**-25) == pytest.approx(2.0**-46 * 0.5 / (2.0 * math.log(3.0)), abs=0)
    # p = 1 >= 1/2: Hoeffding's h**2 = ulp**2 / 4
    assert _flip_sq(F32(1.0), F32(1.25), 2.0**-23) == pytest.approx(2.0**-46 / 4.0, abs=0)
    # into a larger binade (1.5 -> 2, ulp(2) = 2**-22): h(new)**2 + h(old)**2 = ulp**2 (1/4 + 1/16)
    assert _flip_sq(F32(1.5), F32(2.0), 1e-12) == pytest.approx(2.0**-44 * 0.3125, abs=0)
    assert _flip_sq(F32(1.0), F32(1.5), 0.0) == pytest.approx(0.0, abs=0)  # the same term: no flip
    # the proxy is at most Hoeffding's and increases with p
    ps = [_flip_sq(F32(1.0), F32(1.5), p * 2.0**-23) for p in (1e-4, 1e-2, 0.1, 0.3, 0.49)]
    assert all(a < b for a, b in zip(ps, ps[1:])) and ps[-1] <= 2.0**-46 / 4.0


def test_slack_by_hand():
    # t = e**-1 in [1/4, 1/2): h = u / 4; an exp within B = 2 ulps against one within half of one: (2 B + 1) h
    t = math.exp(-1.0)
    d = SC.slack(np.array([[-1.0, -np.inf]]), np.array([[t, 0.0]]), np.array([[2.0, 2.0]]), U)
    assert d[0, 0] == pytest.approx(5.0 * U / 4.0, abs=0)
    assert d[0, 1] == pytest.approx(0.0, abs=0)  # a term of 0 is 0 in every kernel


def test_rest_by_hand():
    # logits log(1, 2, 3, 4): t = 1/4, 1/2, 3/4, 1, D = 5/2. C = 2 chains of 2: contiguous, either way, partial
    # sums 0.75 and 1.75 and their combine 2.5: 0.5625 + 3.0625 + 6.25 = 9.875; lanes (1/4, 3/4), (1/2, 1): 1 + 2.25
    # + 6.25 = 9.5. The largest: 9.875.
    t = np.array([[0.25, 0.5, 0.75, 1.0]])
    assert rest_sq(t)[0] == pytest.approx(9.875, abs=0)
    # the family's (shared_sq): right to left from the maximum on, half-ulps of 1.75, 2.25, 2.5: u**2 (1 + 4 + 4)
    # beats left to right (u P before the maximum: 0.75, 1.5; then h(2.5) = 2 u: 0.5625 + 2.25 + 4 = 6.8125)
    X = np.log(np.array([[1.0, 2.0, 3.0, 4.0]]))
    adds, _ = shared_sq(X, np.exp(X - X.max()), U, 4.75)
    assert adds[0] / U**2 == pytest.approx(9.0 / 6.25, rel=1e-12)
    _, _, ch = scale_rows(X.astype(np.float32).astype(np.float64), U, 0.0, False, shared=True, chains=True)
    # the rest is at most the family's: min(9.875, 9) / D**2
    assert ch.adds_rest[0] / U**2 == pytest.approx(9.0 / 6.25, rel=1e-6)


def _rows(R, n, seed=0):
    return np.random.default_rng(seed).standard_normal((R, n)).astype(np.float32)


@pytest.mark.parametrize("n", [64, 300])
def test_members_are_the_kernels(n):
    """Each member's shift A = D / (D + e) - 1, e its float32 chain less the exact sum of its own float32 terms,
    against the kernels written out here: the scalar loop both ways, four SIMD lanes added pairwise, the online
    loop both ways."""
    X = _rows(5, n)
    X64 = X.astype(np.float64)
    _, _, ch = scale_rows(X64, U, 0.0, False, shared=True, chains=True)
    A, B, rem1, rem2 = ch.make()
    specs = [tuple(s) for s in sum_specs(n)]
    assert A.shape == (len(specs) + 2, 5) and not B.any() and not rem2.any()
    D = np.exp(X64 - X64.max(axis=1, keepdims=True)).sum(axis=1)
    for i in range(5):
        x = X[i]
        t32 = [_exp32(F32(v - x.max())) for v in x]
        S = sum(float(v) for v in t32)
        want = {(1, 1, 0, 0): _loop(t32), (1, 1, 1, 0): _loop(t32[::-1])}
        lanes = [_loop(t32[k::4]) for k in range(4)]
        want[(1, 4, 0, 0)] = sum(lanes)  # the lanes' values exact, their combine free: the centre is their sum
        for key, v in want.items():
            e = v - S
            assert A[specs.index(key), i] == pytest.approx(D[i] / (D[i] + e) - 1.0, rel=1e-6, abs=1e-15)
        for back in range(2):
            s, ex = _online(x, back)
            assert A[len(specs) + back, i] == pytest.approx(D[i] / (D[i] + s - ex) - 1.0, rel=1e-6, abs=1e-15)
    assert np.all(rem1 > 0)


@pytest.mark.parametrize("n", [64, 1024])
def test_the_members_scale_holds_another_exp(n):
    """The scalar loop with numpy's float32 exp (not the correctly rounded one the member uses): its D less the
    member's centre stays within lam_grp (6.4) of the member's remaining scale on every one of 200 rows (the exps'
    errors and the flips their differences cause, module docstring)."""
    X = _rows(200, n, seed=1)
    X64 = X.astype(np.float64)
    _, _, ch = scale_rows(X64, U, 0.0, False, shared=True, chains=True)
    A, _, rem1, _ = ch.make()
    D = np.exp(X64 - X64.max(axis=1, keepdims=True)).sum(axis=1)
    Dk = D / (1.0 + A[0])  # the scalar loop's member: D + e
    T = np.exp(X - X.max(axis=1, keepdims=True))  # numpy's float32 exp
    Dn = np.cumsum(T, axis=1, dtype=np.float32)[:, -1].astype(np.float64)
    z = np.abs(Dn - Dk) / D / np.sqrt(rem1[0])
    assert z.max() < 6.4, z.max()


def _judge(out, X):
    return rk.compare(torch.from_numpy(np.ascontiguousarray(out)), "softmax", torch.from_numpy(X), -1)


@pytest.mark.parametrize("seed", range(4))
def test_long_chain_kernels_are_rounding_and_bugs_of_8_spreads_are_not(seed):
    """The two-pass scalar loop, with a division or a reciprocal, and the online loop (correct kernels whose D
    chains are the longest) and torch's CPU kernel are `rounding`; one element off by 8 times the spread of these
    correct kernels (and the exact result rounded) is a mismatch, and so is the whole tensor scaled by 24 u
    relative, 8 spreads of bench_verdict's correct kernels (2.3-3.6 u at the largest weight, 64 logits, float32),
    which passed before the members (the rows' shared scale then held the scalar loop's chain, 4.2-4.4 u)."""
    X = _rows(4, 64, seed=seed)
    X64 = X.astype(np.float64)
    exact = np.exp(X64 - X64.max(axis=1, keepdims=True))
    exact /= exact.sum(axis=1, keepdims=True)
    seq, rec, onl = (np.empty_like(X) for _ in range(3))
    for i, x in enumerate(X):
        t32 = [_exp32(F32(v - x.max())) for v in x]
        d = F32(_loop(t32))
        r = F32(F32(1.0) / d)
        s, _ = _online(x, False)
        seq[i], rec[i], onl[i] = ([F32(t / d) for t in t32], [F32(t * r) for t in t32], [F32(t / F32(s)) for t in t32])
    cpu = torch.softmax(torch.from_numpy(X), -1).numpy()
    spread = max(np.abs(o.astype(np.float64) - exact).max() for o in (seq, rec, onl, cpu, exact.astype(F32)))
    for o in (seq, rec, onl, cpu):
        assert _judge(o, X).verdict == "rounding"
    el = seq.copy()
    el[1, 7] = F32(el[1, 7] + 8.0 * spread)
    assert _judge(el, X).verdict == "mismatch"
    scaled = (seq.astype(np.float64) * (1.0 + 24.0 * U)).astype(F32)
    assert _judge(scaled, X).verdict == "mismatch"
