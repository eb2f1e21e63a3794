"""refkern.backward of pow with an operand broadcast against the other (refkern.kernels.pow_backward): autograd's sum of
the elementwise gradients over the broadcast dimensions, exact and rounded once, bit for bit against
refkern.truth.backward (mpmath intervals and Fractions, refkern.truth._backward_math) and against sums written
out here by hand; ties, cancellations, torch's formulas at the domain's edges, non-finite terms, errors."""

import numpy as np
import pytest

import refkern.truth as truth
from refkern.gradients import backward, broadcast_operands

SHAPES = [((3, 1, 4), (5, 1)), ((2, 3), ()), ((4,), (3, 4)), ((1, 6), (5, 1)), ((2, 1, 3), (2, 4, 1))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("xs, ys", SHAPES)
def test_broadcast_gradients_are_the_truth(xs, ys, dtype):
    rng = np.random.default_rng(len(xs) * 10 + len(ys))
    x = (rng.random(xs) * 3 + 0.05).astype(dtype)
    x.reshape(-1)[::5] = 1.0  # ln 1 = 0: the exponent's terms exact zeros there
    y = rng.standard_normal(ys).astype(dtype)
    if y.ndim:
        y.reshape(-1)[::4] = 2.0  # rational terms beside the irrational ones
    g = rng.standard_normal(np.broadcast_shapes(xs, ys)).astype(dtype)
    got = backward("pow", g, x, y)
    want = truth.backward("pow", g, x, y)
    for k in ("input", "exponent"):
        assert got[k].shape == np.shape(x if k == "input" else y) and got[k].dtype == dtype
        np.testing.assert_array_equal(got[k], want[k])


def test_a_tie_of_exact_terms_rounds_to_even():
    """x = 1 read by two exponents 2: terms ``2 g_j x``, 2 and 2**-23: the sum 2 + 2**-23 is the float32 midpoint
    of 2 and 2 + 2**-22; to even, 2. Plus 2**-40 more it rounds up."""
    x = np.ones(1, np.float32)
    y = np.full(2, 2.0, np.float32)
    assert backward("pow", np.array([1.0, 2.0**-24], np.float32), x, y)["input"][0] == 2.0
    up = backward("pow", np.array([1.0, 2.0**-24 + 2.0**-41], np.float32), x, y)["input"][0]
    assert up == np.float32(2.0 + 2.0**-22)


def test_equal_irrational_terms_cancel_to_plus_zero():
    """``g x**y ln x`` twice with opposite g: exactly zero (+0, autograd's sum starts at +0), decided with no
    precision limit; beside a third term, that term alone, correctly rounded."""
    x = np.array([3.0, 3.0, 5.0], np.float32)
    y = np.array([0.7], np.float32)
    g = np.array([0.375, -0.375, 0.0], np.float32)
    got = backward("pow", g, x, y, wrt="exponent")["exponent"]
    assert got[0] == 0.0 and not np.signbit(got[0])
    g[2] = 1.5
    want = truth.backward("pow", np.array([1.5], np.float32), x[2:], y, wrt="exponent")["exponent"]
    assert backward("pow", g, x, y, wrt="exponent")["exponent"][0] == want[0]


def test_the_domains_edges_and_non_finite_terms():
    """x = 0 with y = 0.5 (torch's formula: inf), a negative x with a non-integer y (NaN), y = 0 (torch's zeros);
    a NaN or +inf with -inf among the terms gives NaN, one infinity that infinity."""
    y = np.array([[0.5], [2.0]])
    x = np.array([0.0, 4.0])
    g = np.array([[1.0, 1.0], [1.0, 1.0]])
    got = backward("pow", g, x, y)
    assert got["input"][0] == np.inf  # 0.5 * 0**-0.5 = inf, plus 2 * 0 = 0
    np.testing.assert_array_equal(got["input"], truth.backward("pow", g, x, y)["input"])
    neg = backward("pow", g, np.array([-2.0, 4.0]), np.array([[0.5], [0.0]]))
    assert np.isnan(neg["input"][0]) and neg["input"][1] == 0.25  # 0.5 * 4**-0.5 + torch's 0 at y = 0
    both = backward("pow", np.array([[1.0], [-1.0]]), np.array([0.0]), np.array([[0.5], [0.5]]))["input"]
    assert np.isnan(both[0])  # +inf and -inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hand_written_sums(dtype):
    """Rational terms written out: ``y x**(y - 1)`` at x = 2 for y = 2, 3, -1 is 4, 12, -1/4: with g = (1, 1, 1),
    15.75; ``x**y ln x`` at x = 1 is 0 for every y."""
    x = np.array([2.0, 1.0], dtype)
    y = np.array([[2.0], [3.0], [-1.0]], dtype)
    got = backward("pow", np.ones((3, 2), dtype), x, y)
    assert got["input"].tolist() == [15.75, 2.0 + 3.0 - 1.0]
    assert got["exponent"][:, 0].tolist() == [float(dtype(4 * np.log(2))), float(dtype(8 * np.log(2))),
                                              float(dtype(0.5 * np.log(2)))]  # fmt: skip


def test_wrt_picks_and_the_full_operand_keeps_its_rule():
    rng = np.random.default_rng(3)
    x = (rng.random((4, 3)) + 0.5).astype(np.float32)
    y = rng.standard_normal(3).astype(np.float32)
    g = rng.standard_normal((4, 3)).astype(np.float32)
    assert broadcast_operands("pow", {"input": x, "exponent": y}, ("input", "exponent")) == ("exponent",)
    assert list(backward("pow", g, x, y, wrt="exponent")) == ["exponent"]
    both = backward("pow", g, x, y)
    assert list(both) == ["input", "exponent"]
    full = backward("pow", g, x, np.broadcast_to(y, (4, 3)).copy(), wrt="input")["input"]
    np.testing.assert_array_equal(both["input"], full)  # the full operand: the elementwise rule, unchanged


def test_a_broadcast_operand_of_another_dtype_is_refused_with_its_name():
    x = np.ones((2, 3), np.float64)
    y = np.ones(3, np.float32)  # the result is float64: the exponent's gradient would be cast back
    with pytest.raises(ValueError, match=r"backward: pow's gradient of exponent takes exponent of the result's dtype, "
                                         r"float64; got float32"):  # fmt: skip
        backward("pow", np.ones((2, 3)), x, y, wrt="exponent")
    with pytest.raises(ValueError, match="grad_output"):
        backward("pow", np.ones((2, 2)), x, y.astype(np.float64), wrt="exponent")


def test_torch_tensors_and_torchs_own_gradient_judged():
    torch = pytest.importorskip("torch")
    from refkern.gradients import compare_backward

    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 1, 4, generator=gen) * 2 + 0.1).requires_grad_()
    y = torch.randn(5, 1, generator=gen).requires_grad_()
    g = torch.randn(3, 5, 4, generator=gen)
    torch.pow(x, y).backward(g)
    got = backward("pow", g, x.detach(), y.detach())
    assert isinstance(got["exponent"], torch.Tensor) and got["exponent"].shape == (5, 1)
    reps = compare_backward({"input": x.grad, "exponent": y.grad}, "pow", g, x.detach(), y.detach())
    assert {k: r.verdict for k, r in reps.items()} .keys() == {"input", "exponent"}
    assert all(r.verdict in ("exact", "rounding") for r in reps.values())
