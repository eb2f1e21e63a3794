"""The GEMMs' order term (refkern.analysis.partials): the block bound against partial sums formed one by
one (an independent loop per element), the lane check, and the verdict's power and false alarms with it."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.analysis.evaluate import problem
from refkern.analysis.partials import BLOCK, LANE_SAMPLE, LANES, gemm_partials, lanes_exceed
from refkern.analysis.verdict import sample_indices


def test_constants_are_pinned():
    assert BLOCK == 32
    assert LANES == (2, 4, 8, 16, 32, 64)
    assert LANE_SAMPLE == 256


def test_hand_example():
    # a = b = (1, 1, 1, 1), blocks of 2: S = (2, 2), A = (2, 2); left = (0 + 2)**2 + (2 + 2)**2 = 20, right the
    # same; 2 * 20 + sum t**2 (4) + M**2 (16) = 60, under the order-free (n + 1) M**2 = 80
    a, b = np.ones((1, 4), np.float32), np.ones((4, 1), np.float32)
    pr = problem("matmul", (a, b), {})
    _, mag = pr.run(want_mag=True)
    assert gemm_partials(pr, mag, block=2).item() == pytest.approx(60.0, abs=0)
    assert gemm_partials(pr, mag, block=32).item() == pytest.approx(80.0, abs=0)  # one padded block: 32 * 32 > 80


def _sq_partials(t, order):
    """sum of squares of every rounded value of a float64-exact run over the products ``t``: products, then the
    partial sums of ``order`` (a list of index arrays summed left to right, their results summed in turn)."""
    total = float((t * t).sum())
    results = []
    for chunk in order:
        s = 0.0
        for i, k in enumerate(chunk):
            s += t[k]
            if i:
                total += s * s
        results.append(s)
    s = results[0]
    for r in results[1:]:
        s += r
        total += s * s
    return total


@pytest.mark.parametrize("data", ["randn", "relu", "positive", "offset"])
def test_bound_holds_for_the_orders_backends_use(data):
    g = np.random.default_rng(7)
    K = 700
    a = {
        "randn": g.standard_normal((6, K)),
        "relu": np.maximum(g.standard_normal((6, K)), 0),
        "positive": g.random((6, K)),
        "offset": 300 + g.standard_normal((6, K)),
    }[data].astype(np.float32)
    b = g.standard_normal((K, 5)).astype(np.float32)
    pr = problem("matmul", (a, b), {})
    _, mag = pr.run(want_mag=True)
    bound = gemm_partials(pr, mag)
    ks = np.arange(K)
    orders = {"left to right": [ks], "right to left": [ks[::-1]],
              "split-K 256": [ks[i : i + 256] for i in range(0, K, 256)],
              "blocks of 32 reversed inside": [ks[i : i + 32][::-1] for i in range(0, K, 32)]}  # fmt: skip
    for i in range(6):
        for j in range(5):
            t = a[i].astype(np.float64) * b[:, j].astype(np.float64)
            for name, order in orders.items():
                assert _sq_partials(t, order) <= bound[i, j], (data, name, i, j)
            assert bound[i, j] <= (K + 1) * mag[i, j] ** 2  # never above the order-free bound
    if data == "randn":  # where signs mix, the bound is far under the order-free one
        assert np.median(bound / ((K + 1) * mag**2)) < 0.05


def test_lanes_check_sees_structure():
    g = np.random.default_rng(3)
    K = 1024
    alt = (((-1.0) ** np.arange(K)) * (1 + 0.1 * g.standard_normal((16, K)))).astype(np.float32)
    ones = (1 + 0.01 * g.standard_normal((K, 16))).astype(np.float32)
    rnd = g.standard_normal((16, K)).astype(np.float32)
    for a, want in ((alt, True), (rnd, False)):
        pr = problem("matmul", (a, ones), {})
        ref, mag = pr.run(want_mag=True)
        assert lanes_exceed(pr, gemm_partials(pr, mag), sample_indices(ref.size, pr.n_terms)) is want


def _f32(x):
    return np.asarray(x, np.float32)


def _lanes(a, b, L):
    """L float32 accumulators over k = l (mod L), then summed in order: sdot's structure."""
    acc = np.zeros((L, a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc[k % L] = _f32(acc[k % L] + _f32(np.outer(a[:, k], b[k])))
    out = acc[0]
    for lane in acc[1:]:
        out = _f32(out + lane)
    return out


def _sequential(a, b):
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = _f32(acc + _f32(np.outer(a[:, k], b[k])))
    return acc


@pytest.mark.parametrize("data", ["randn", "alternating"])
def test_correct_kernels_are_rounding(data):
    g = np.random.default_rng(11)
    K = 1024
    if data == "randn":
        a, b = _f32(g.standard_normal((16, K))), _f32(g.standard_normal((K, 16)))
    else:  # signs that repeat with the lanes: the contiguous bound does not hold for lanes; the check sees it
        a = _f32(((-1.0) ** np.arange(K)) * (1 + 0.1 * g.standard_normal((16, K))))
        b = _f32(1 + 0.01 * g.standard_normal((K, 16)))
    outs = {
        "torch": (torch.from_numpy(a) @ torch.from_numpy(b)).numpy(),
        "sequential": _sequential(a, b),
        "reversed": _sequential(a[:, ::-1], b[::-1]),
        "2 lanes": _lanes(a, b, 2),
        "16 lanes": _lanes(a, b, 16),
    }
    for name, out in outs.items():
        assert rk.compare(out, "matmul", a, b).verdict == "rounding", name


def test_one_element_at_eight_spreads_is_a_mismatch():
    # K = 1024 float32 randn: the spread of torch, a sequential loop and 16 lanes is about 1e-4; the order-free
    # scale put one element's threshold at 80 spreads (8.6e-3), the block bound at about 4
    g = np.random.default_rng(5)
    K = 1024
    a, b = _f32(g.standard_normal((32, K))), _f32(g.standard_normal((K, 32)))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    outs = [(torch.from_numpy(a) @ torch.from_numpy(b)).numpy(), _sequential(a, b), _lanes(a, b, 16)]
    spread = max(float(np.abs(o - exact).max()) for o in outs)
    bad = outs[0].astype(np.float64)
    bad[3, 5] += 8 * spread
    rep = rk.compare(_f32(bad), "matmul", a, b)
    assert rep.verdict == "mismatch"
    assert rep.detectable["element"] < 8 * spread
