"""The sample's terms taken again instead of gathered again (Problem.terms holds its last rows; with_inputs'
problem rounds them) and the order check's rows run side by side (partials._other_sq_rows, 32 rows at a
time): the same values as a fresh gather, and as the orders run one addition at a time."""

import numpy as np
import pytest
import torch
from test_partials import _other_sq_by_hand

from refkern.accumulate.formats import BFLOAT16, FLOAT16, TFLOAT32, round_array
from refkern.analysis.evaluate import problem
from refkern.analysis.partials import LANES, SPLITS, _other_sq

CASES = {
    "conv2d": lambda g: ("conv2d", (torch.randn(2, 6, 9, 9, generator=g), torch.randn(4, 3, 3, 3, generator=g),
                                    torch.randn(4, generator=g)), {"padding": 1, "groups": 2, "stride": 2}),
    "conv_transpose2d": lambda g: ("conv_transpose2d", (torch.randn(1, 4, 5, 5, generator=g),
                                                        torch.randn(4, 3, 3, 3, generator=g), None), {"stride": 2}),
    "linear": lambda g: ("linear", (torch.randn(7, 33, generator=g), torch.randn(5, 33, generator=g),
                                    torch.randn(5, generator=g)), {}),
}  # fmt: skip


def _same(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("case", list(CASES))
def test_held_rows_are_a_fresh_gather(case):
    op, args, kw = CASES[case](torch.Generator().manual_seed(3))
    pr = problem(op, args, kw)
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(pr.size, min(pr.size, 40), replace=False))
    first = pr.terms(idx)
    assert _same(first, pr._terms(idx))
    sub = idx[::3][::-1].copy()  # some of them, out of order: rows taken from the held ones
    again = pr.terms(sub)
    assert _same(again, pr._terms(sub))
    again[0][:] = 7.0  # each call's arrays are its own
    assert _same(pr.terms(idx), pr._terms(idx))
    for fmt, mode in ((BFLOAT16, 0), (TFLOAT32, 1), (FLOAT16, 2)):
        for round_bias in (False, True):
            got = pr.with_inputs((fmt, mode, round_bias)).terms(sub)
            fresh = pr.with_inputs((fmt, mode, round_bias))._terms(sub)  # gathered from the rounded operands
            L, R, b, hb = pr._terms(sub)
            assert _same(got, fresh)
            assert _same(got[:2], (round_array(L, *fmt.params, mode), round_array(R, *fmt.params, mode)))
    other = np.setdiff1d(np.arange(pr.size), idx)[:5]  # not held: gathered (from the rounded operands)
    assert _same(pr.with_inputs((BFLOAT16, 0, False)).terms(other), pr.with_inputs((BFLOAT16, 0, False))._terms(other))


@pytest.mark.parametrize("K", [5, 64, 130])
def test_other_orders_side_by_side(K):
    """70 rows (32 + 32 + 6: blocks and a partial one, its empty columns zero) of every kind, each row equal to
    the orders run one addition at a time (within a few units of float64: the squares summed in another order),
    and each row's value the same as that row checked alone (the same operations in the same order)."""
    g = np.random.default_rng(K)
    T = g.standard_normal((70, K)) * 2.0 ** g.integers(-8, 8, (70, K))
    T[0] = (-1.0) ** np.arange(K) * (1 + 0.1 * g.standard_normal(K))  # signs repeating with the lanes
    T[33] = 0.0
    T[69, :] = -0.0
    got = _other_sq(T, LANES)
    for r in range(T.shape[0]):
        assert got[r] == pytest.approx(_other_sq_by_hand(T[r], LANES, SPLITS), rel=1e-13, abs=0.0), (K, r)
        assert got[r] == _other_sq(T[r : r + 1], LANES)[0]
