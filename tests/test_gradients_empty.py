"""Gradients of calls with a dimension of size 0 (torch's OpInfo samples hold them): refkern.backward equals
truth.backward (the gradients of empty sums are +0, an empty gradient has no element), and compare_backward
judges torch's gradients without refusing them. A matmul whose batch is broadcast is judged per tap
(kernels/gemm_grad: one tap per broadcast batch element), which needs every dimension non-zero: where one is 0
the plain product judges it (K = 0: every element +0), and a wrong value there is still a mismatch."""

import warnings

import numpy as np
import pytest

import refkern as rk
from refkern.gradients import compare_backward

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

#: (a.shape, b.shape) of torch.matmul with a broadcast batch and one dimension 0: the contracted one (K), a row
#: or column count (M, N), the batch (OpInfo's (5, 5, 0) @ (0, 5) and (0, 0) @ (5, 0, 0) among them)
MATMULS = [((5, 5, 0), (0, 5)), ((0, 0), (5, 0, 0)), ((3, 4, 0), (0, 5)), ((3, 4, 2), (2, 0)), ((3, 0, 2), (2, 5)),
           ((0, 4, 2), (2, 5)), ((4, 2), (3, 2, 0)), ((2, 1, 3, 0), (4, 0, 2))]  # fmt: skip


def _bits(t):
    return np.asarray(t.double().numpy()).view(np.int64).tolist()


def _torch_grads(fn, leaves, seed=0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*leaves, **kw)
        g = torch.randn(tuple(out.shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        g = g.to(out.dtype)
        return g, torch.autograd.grad(out, leaves, g)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa, sb", MATMULS)
def test_matmul_with_an_empty_dimension(sa, sb, dtype):
    a = torch.randn(sa, dtype=torch.float64).to(dtype).requires_grad_()
    b = torch.randn(sb, dtype=torch.float64).to(dtype).requires_grad_()
    g, (ga, gb) = _torch_grads(torch.matmul, (a, b))
    a0, b0 = a.detach(), b.detach()
    mine = rk.backward("matmul", g, a0, b0)
    truth = rk.truth.backward("matmul", g, a0, b0)
    for k, got in (("a", ga), ("b", gb)):
        assert tuple(mine[k].shape) == tuple(truth[k].shape) == tuple(got.shape)
        assert _bits(mine[k]) == _bits(truth[k])  # +0 where the sum is empty
        rep = compare_backward({k: got}, "matmul", g, a0, b0)[k]
        assert rep.verdict == "exact", rep


@pytest.mark.parametrize("sa, sb, k", [((3, 0, 2), (2, 5), "b"), ((4, 2), (3, 2, 0), "a"), ((3, 4, 2), (2, 0), "a")])
def test_a_nonzero_gradient_of_empty_sums_is_a_mismatch(sa, sb, k):
    """The gradient of a broadcast matmul whose terms are all missing (M, K or N = 0, the gradient non-empty)
    is +0 everywhere: a backend giving 1 there is caught, although the taps' judge does not run."""
    a, b = torch.randn(sa), torch.randn(sb)
    g = torch.randn(tuple(torch.matmul(a, b).shape))
    want = a if k == "a" else b
    assert want.numel() > 0
    rep = compare_backward({k: torch.ones_like(want)}, "matmul", g, a, b)[k]
    assert rep.verdict == "mismatch", rep


POOLS = [("avg_pool1d", (0, 3, 9), dict(kernel_size=3)), ("avg_pool2d", (0, 3, 8, 8), dict(kernel_size=3)),
         ("max_pool1d", (0, 3, 9), dict(kernel_size=3)), ("max_pool2d", (0, 3, 8, 8), dict(kernel_size=3)),
         ("adaptive_avg_pool1d", (0, 8, 8), dict(output_size=4)),
         ("adaptive_avg_pool2d", (0, 3, 8, 8), dict(output_size=(4, 4)))]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, shape, kw", POOLS)
def test_pool_of_a_batch_of_0_samples(op, shape, kw, dtype):
    x = torch.randn(shape, dtype=torch.float64).to(dtype).requires_grad_()
    g, (gx,) = _torch_grads(getattr(F, op), (x,), **kw)
    x0 = x.detach()
    mine = rk.backward(op, g, x0, **kw)["input"]
    assert tuple(mine.shape) == tuple(rk.truth.backward(op, g, x0, **kw)["input"].shape) == shape
    assert compare_backward({"input": gx}, op, g, x0, **kw)["input"].verdict == "exact"


@pytest.mark.parametrize("op, shape, kw", POOLS[:2])
def test_pool_gradients_of_a_nonempty_batch_are_unchanged(op, shape, kw):
    """The planes' row count is now read from the output, not inferred: a batch of 2 still equals the truth."""
    x = torch.randn((2, *shape[1:]), dtype=torch.float64).float()
    g = torch.randn(tuple(getattr(F, op)(x, **kw).shape))
    assert _bits(rk.backward(op, g, x, **kw)["input"]) == _bits(rk.truth.backward(op, g, x, **kw)["input"])


#: (input shape, training) of batch_norm with no element: OpInfo's 1-D (0,) with running statistics (0,), and a
#: batch of 0 samples, where weight and bias still get a gradient (+0: no term reaches them)
BATCH_NORMS = [((0,), True), ((0,), False), ((0, 3), True), ((0, 3), False), ((0, 3, 4), True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, training", BATCH_NORMS)
def test_batch_norm_of_an_empty_input(shape, training, dtype):
    c = shape[1] if len(shape) > 1 else 0
    x = torch.randn(shape, dtype=torch.float64).to(dtype).requires_grad_()
    rm, rv = torch.zeros(c, dtype=dtype), torch.ones(c, dtype=dtype)
    params = [torch.randn(c, dtype=torch.float64).to(dtype).requires_grad_() for _ in range(2)] if c else [None] * 2
    leaves = (x, *[p for p in params if p is not None])
    g, grads = _torch_grads(lambda *t: F.batch_norm(t[0], rm, rv, *(t[1:] or params), training=training), leaves)
    args = (x.detach(), rm, rv, *[None if p is None else p.detach() for p in params])
    names = ("input", "weight", "bias")[: len(leaves)]
    mine = rk.backward("batch_norm", g, *args, training=training)
    truth = rk.truth.backward("batch_norm", g, *args, training=training)
    reps = compare_backward(dict(zip(names, grads)), "batch_norm", g, *args, training=training)
    for k, got in zip(names, grads):
        assert tuple(mine[k].shape) == tuple(got.shape) and _bits(mine[k]) == _bits(truth[k])
        assert reps[k].verdict == "exact", reps[k]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", (True, False))
def test_a_nonzero_gradient_of_an_empty_batch_norm_is_a_mismatch(training, dtype):
    """A weight's gradient of 1 where no term reaches it (a batch of 0 samples): a mismatch."""
    x, rm, rv = torch.zeros((0, 3), dtype=dtype), torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    w, b = torch.ones(3, dtype=dtype), torch.zeros(3, dtype=dtype)
    g = torch.zeros((0, 3), dtype=dtype)
    bad = compare_backward({"weight": torch.ones(3, dtype=dtype)}, "batch_norm", g, x, rm, rv, w, b, training=training)
    assert bad["weight"].verdict == "mismatch"
