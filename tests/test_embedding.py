"""embedding and its backward: the lookup bit for bit, the exact scatter-add against its truth (Fractions),
the yardstick against torch's CPU gradients (no false alarm) and the bug that keeps one of a repeated token's
gradients (a mismatch), the bound written by hand, errors, and the audit of a training step."""

import numpy as np
import pytest

import refkern as rk
import refkern.truth

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPTIONS = ((None, False), (3, False), (None, True), (-2, True))


def _call(dtype, seed=0, V=40, D=8, shape=(4, 30)):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, shape, generator=g)
    w = torch.randn(V, D, generator=g).to(dtype)
    return idx, w


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_equals_the_truth_and_torch_is_no_false_alarm(dtype):
    idx, w = _call(dtype)
    for pad, scale in OPTIONS:
        wt = w.clone().requires_grad_()
        y = F.embedding(idx, wt, padding_idx=pad, scale_grad_by_freq=scale)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        y.backward(g)
        kw = dict(padding_idx=pad, scale_grad_by_freq=scale)
        ref = rk.backward("embedding", g, idx, w, **kw)["weight"]
        truth = refkern.truth.backward("embedding", g, idx, w, **kw)["weight"]
        assert np.array_equal(ref.double().numpy(), truth)
        aten = rk.embedding_dense_backward(g, idx, w.shape[0], -1 if pad is None else pad % w.shape[0], scale)
        assert torch.equal(aten, ref)
        rep = rk.compare_backward({"weight": wt.grad}, "embedding", g, idx, w, **kw)["weight"]
        assert rep.verdict in ("exact", "rounding"), str(rep)
        keep_one = torch.zeros_like(w)  # the bug: each repeated token keeps one row of grad_output (the last)
        keep_one[idx.reshape(-1)] = g.reshape(-1, w.shape[1])
        if pad is not None:
            keep_one[pad] = 0
        assert rk.compare_backward({"weight": keep_one}, "embedding", g, idx, w, **kw)["weight"].verdict == "mismatch"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lookup_is_judged_bit_for_bit(dtype):
    idx, w = _call(dtype)
    y = F.embedding(idx, w)
    assert torch.equal(rk.embedding(idx, w), y)
    assert rk.compare(y, "embedding", idx, w).verdict == "exact"
    bad = y.clone()
    bad[0, 0, 0] = torch.nextafter(bad[0, 0, 0].double(), torch.tensor(np.inf, dtype=torch.float64)).to(dtype) \
        if dtype == torch.float64 else bad[0, 0, 0] * 2  # fmt: skip
    assert rk.compare(bad, "embedding", idx, w).verdict == "mismatch"


def test_exact_sums_beyond_float64():
    """Terms 2**100, 1 and -2**100 sum to 1 exactly (a float64 running sum gives 0); a float64 result of repeated
    indices is rounded once."""
    g = torch.tensor([[2.0**100], [1.0], [-(2.0**100)], [3.0]], dtype=torch.float64)
    idx = torch.tensor([0, 0, 0, 1])
    out = rk.embedding_dense_backward(g, idx, 2, -1, False)
    assert out[:, 0].tolist() == [1.0, 3.0]
    out = rk.embedding_dense_backward(g.float(), idx, 2, -1, True)  # (2**100 + 1 - 2**100) / 3, once
    assert out[:, 0].tolist() == [np.float32(1 / 3), 3.0]


def test_bound_written_by_hand():
    """float32, a token repeated 3 times: gamma_2(u) sum|g| * 1.01 + u |ref| + eta; a single occurrence: 0."""
    from refkern.analysis.embedding import grad_bound
    from refkern.kernels.embedding import embedding_grad_call, grad_weight

    g = np.array([[1.0], [-2.0], [0.5], [7.0]], np.float32)
    c = embedding_grad_call(g, np.array([1, 1, 1, 0]), 3, None, False, "test")
    ref = grad_weight(c)
    b = grad_bound(c, ref)
    u = 2.0**-24
    g2 = 2 * u / (1 - 2 * u) * (1 + 8 * u)
    assert b[1, 0] == pytest.approx(g2 * 3.5 * 1.01 + u * 0.5 + 2.0**-150, abs=0)
    assert b[0, 0] == 0.0 and b[2, 0] == 0.0


def test_errors_name_the_argument():
    w = torch.randn(5, 3)
    with pytest.raises(IndexError, match=r"^embedding: input holds 7, out of range for 5 embeddings"):
        rk.embedding(torch.tensor([0, 7]), w)
    with pytest.raises(TypeError, match=r"^embedding: input must be an integer tensor"):
        rk.embedding(torch.tensor([0.0, 1.0]), w)
    with pytest.raises(ValueError, match=r"^embedding: norm_type must be a positive number"):
        rk.embedding(torch.tensor([0, 1]), w, max_norm=1.0, norm_type=0.0)
    with pytest.raises(ValueError, match=r"^embedding: padding_idx must be None or an int in \[-5, 5\)"):
        rk.embedding(torch.tensor([0, 1]), w, padding_idx=5)
    with pytest.raises(ValueError, match=r"^embedding_dense_backward: grad_output must have shape indices.shape"):
        rk.embedding_dense_backward(torch.randn(3, 4), torch.tensor([0, 1]), 5)


def test_the_gradient_checks_are_the_shared_ones():
    """grad_output and the backend's gradient are checked by the checks every backward makes
    (kernels._grad.grad_output, compare's _actual_grad): their messages, word for word."""
    w, idx = torch.randn(5, 3), torch.tensor([[0, 1], [1, 4]])
    with pytest.raises(ValueError, match=r"^backward: grad_output must have shape indices\.shape \+ \(embedding_dim,\) = "
                       r"\(2, 2\) \+ \(3,\); got grad_output\.shape=\(2, 2, 4\)\.$"):  # fmt: skip
        rk.backward("embedding", torch.randn(2, 2, 4), idx, w)
    with pytest.raises(TypeError, match=r"^backward: grad_output must have the dtype of the output of embedding, "
                       r"float32; got grad_output\.dtype=float64\.$"):  # fmt: skip
        rk.backward("embedding", torch.randn(2, 2, 3, dtype=torch.float64), idx, w)
    with pytest.raises(TypeError, match=r"^compare_backward: the gradient of weight must have the dtype of weight, "
                       r"float32; got float64\.$"):  # fmt: skip
        rk.compare_backward({"weight": torch.zeros(5, 3, dtype=torch.float64)}, "embedding", torch.randn(2, 2, 3),
                            idx, w)  # fmt: skip
    with pytest.raises(TypeError, match=r"^compare: embedding returns float32 for these inputs; got actual\.dtype="
                       r"float64\.$"):  # fmt: skip
        rk.compare(torch.zeros(2, 2, 3, dtype=torch.float64), "embedding", idx, w)
    with pytest.raises(ValueError, match=r"^compare: actual\.shape=\(2, 3\) differs from the shape embedding gives"):
        rk.compare(torch.zeros(2, 3), "embedding", idx, w)
    g = torch.randn(2, 2, 3, dtype=torch.float64)  # aten's backward: grad_output's own dtype and D
    assert rk.embedding_dense_backward(g, idx, 5).dtype == torch.float64


def test_the_audit_judges_embedding_dense_backward():
    from refkern.torch import audit

    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(50, 16, padding_idx=0), torch.nn.Linear(16, 50)
    idx = torch.randint(0, 50, (4, 12))
    with audit() as a:
        F.cross_entropy(lin(emb(idx)).reshape(-1, 50), idx.reshape(-1)).backward()
    ops = {c.op: c.verdict for c in a.calls}
    assert ops.get("embedding backward") in ("exact", "rounding")


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_norm(dtype):
    """The rows beyond max_norm renormalised (exact, == the mpmath truth for p = 2, 1, inf, 3, 0.5); torch's
    lookup (from a copy of weight: torch renormalises in place) exact or rounding, and on the weight torch left;
    max_norm ignored is a mismatch."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(30, 16, generator=g).to(dtype)
    idx = torch.randint(0, 30, (4, 10), generator=g)
    for p in (2.0, 1.0, float("inf"), 3.0, 0.5):
        ref = rk.embedding(idx[:1, :4], w, max_norm=1.0, norm_type=p)
        assert np.array_equal(ref.double().numpy(), refkern.truth.embedding(idx[:1, :4], w, max_norm=1.0, norm_type=p))
        wc = w.clone()
        y = F.embedding(idx, wc, max_norm=1.0, norm_type=p)
        assert rk.compare(y, "embedding", idx, w, max_norm=1.0, norm_type=p).verdict in ("exact", "rounding")
        assert rk.compare(y, "embedding", idx, wc, max_norm=1.0, norm_type=p).verdict in ("exact", "rounding")
        assert rk.compare(F.embedding(idx, w), "embedding", idx, w, max_norm=1.0, norm_type=p).verdict == "mismatch"
