"""The gradient of scaled_dot_product_attention's additive float mask: dS summed over every (batch, row, column)
that reads each mask element, rounded once to the mask's format (kernels.attention_backward, fast path and
exact path), against the ground truth (truth.backward.attention: mpmath intervals), bit for bit."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64  # noqa: E402
from refkern.kernels.attention import attention_operands  # noqa: E402
from refkern.kernels.attention_backward import attention_backward  # noqa: E402
from refkern.truth.backward import attention as truth_attention  # noqa: E402

_FMT = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: FLOAT32, torch.float64: FLOAT64}
OP = "scaled_dot_product_attention"

#: (query shape, key length, mask shape): a mask per (L, S) broadcast over the batches (OpInfo's), one per batch,
#: one row broadcast over L, one column over S, one value per head
CASES = (((2, 2, 3, 4), 5, (3, 5)), ((2, 3, 4), 3, (2, 3, 3)), ((2, 2, 3, 4), 4, (2, 1, 1, 4)),
         ((1, 3, 2), 5, (3, 1)), ((2, 2, 3, 4), 3, (2, 1, 1, 1)))  # fmt: skip


def _draw(qshape, S, mshape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(s, generator=gen, dtype=torch.float64) * scale).to(dtype)

    *lead, L, E = qshape
    q, k, v = r(*qshape), r(*lead, S, E), r(*lead, S, E)
    m = r(*mshape, scale=2.0)
    g = r(*lead, L, E)
    return q, k, v, m, g


def _kernel(q, k, v, m, g):
    at = attention_operands(q, k, v, m, 0.0, False, None, False)
    G = g.to(torch.float64).numpy().reshape(at.iq.size, *g.shape[-2:])
    out, counts = attention_backward(at, G, ("attn_mask",), mask_fmt=_FMT[m.dtype])
    return out["attn_mask"].reshape(tuple(m.shape)), counts


@pytest.mark.parametrize("dtype", tuple(_FMT), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_mask_gradient_equals_the_truth(case, dtype):
    qshape, S, mshape = CASES[case]
    q, k, v, m, g = _draw(qshape, S, mshape, dtype, case)
    got, _ = _kernel(q, k, v, m, g)
    want = truth_attention(OP, g, {"query": q, "key": k, "value": v, "attn_mask": m}, ("attn_mask",))["attn_mask"]
    assert want.dtype == m.dtype and tuple(want.shape) == tuple(m.shape)
    np.testing.assert_array_equal(got, want.to(torch.float64).numpy())


def test_the_exact_path_agrees_with_the_fast_path():
    """Every element through the exact path (force_exact) equals the fast path's (float32, OpInfo's shape)."""
    q, k, v, m, g = _draw((4, 4, 3, 8), 6, (3, 6), torch.float32, 11)
    at = attention_operands(q, k, v, m, 0.0, False, None, False)
    G = g.to(torch.float64).numpy().reshape(at.iq.size, 3, 8)
    fast, c1 = attention_backward(at, G, ("attn_mask",), mask_fmt=FLOAT32)
    exact, c2 = attention_backward(at, G, ("attn_mask",), force_exact=True, mask_fmt=FLOAT32)
    assert c2.exact_elements == 18 and c1.exact_elements < 18
    np.testing.assert_array_equal(fast["attn_mask"], exact["attn_mask"])


def test_close_to_torchs_float64_gradient():
    """torch's float64 math backend (sum_to of its dS) within 1e-12 relative of the exact gradient: the same
    quantity (not a proof, a check of the layout: which rows and columns each mask element sums)."""
    for qshape, S, mshape in CASES:
        q, k, v, m, g = _draw(qshape, S, mshape, torch.float64, 3)
        m = m.requires_grad_(True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        (tg,) = torch.autograd.grad(out, m, g)
        got, _ = _kernel(q, k, v, m.detach(), g)
        np.testing.assert_allclose(got, tg.numpy(), rtol=1e-12, atol=1e-14, err_msg=f"{qshape} {S} {mshape}")


def test_a_row_sums_to_zero():
    """A mask broadcast over S (one column, Sm = 1): each element sums dS_ij over j, which is exactly 0 for every
    row (sum_j P_j (dP_j - Delta) = Delta - Delta): +0 however the terms round."""
    q, k, v, m, g = _draw((1, 3, 2), 5, (3, 1), torch.float32, 5)
    got, _ = _kernel(q, k, v, m, g)
    assert np.array_equal(got, np.zeros((3, 1))) and not np.signbit(got).any()


def _torch_and_bound(qshape, S, mshape, dtype, seed):
    from refkern.analysis._envelope_backward_attention import attention_bound

    q, k, v, m, g = _draw(qshape, S, mshape, dtype, seed)
    m = m.requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    (tg,) = torch.autograd.grad(out, m, g)
    at = attention_operands(q, k, v, m.detach(), 0.0, False, None, False)
    G = g.to(torch.float64).numpy().reshape(at.iq.size, *g.shape[-2:])
    ref = attention_backward(at, G, ("attn_mask",), mask_fmt=_FMT[dtype])[0]["attn_mask"]
    b, n = attention_bound(at, G, "attn_mask", ref, _FMT[dtype])
    return tg.to(torch.float64).numpy().reshape(ref.shape), ref, b, n


@pytest.mark.parametrize("dtype", tuple(_FMT), ids=lambda d: str(d).removeprefix("torch."))
def test_torch_cpu_mask_gradients_lie_within_the_envelope(dtype):
    """torch CPU's mask gradients (OpInfo's (4, 4, 3, 8) query with a (3, 6) mask, and the layouts above) within
    the worst-case envelope of the exact gradient; n counts the (batch, row, column) triples per element."""
    for seed, (qshape, S, mshape) in enumerate(((((4, 4, 3, 8), 6, (3, 6))),) + CASES):
        got, ref, b, n = _torch_and_bound(qshape, S, mshape, dtype, seed)
        assert (np.abs(got - ref) <= b).all(), f"{qshape} {S} {mshape}: {np.max(np.abs(got - ref) / b)}x the bound"
    assert n == 2 * 3 * 3  # the last case: one value per (2, 1) batch of (2, 2, 3, 4), S = 3: 2 heads x L 3 x S 3


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=lambda d: str(d).removeprefix("torch."))
def test_a_mask_gradient_of_one_batch_is_outside_the_envelope(dtype):
    """A mask broadcast over 16 batches whose gradient kept only the first batch's dS (a missing sum_to): far
    outside the envelope (float32: at most a few ulps of |dS| sums wide)."""
    q, k, v, m, g = _draw((4, 4, 3, 8), 6, (3, 6), dtype, 2)
    at = attention_operands(q, k, v, m, 0.0, False, None, False)
    G = g.to(torch.float64).numpy().reshape(16, 3, 8)
    from refkern.analysis._envelope_backward_attention import attention_bound

    ref = attention_backward(at, G, ("attn_mask",), mask_fmt=_FMT[dtype])[0]["attn_mask"]
    one = attention_backward(attention_operands(q[:1, :1], k[:1, :1], v[:1, :1], m, 0.0, False, None, False),
                             G[:1], ("attn_mask",), mask_fmt=_FMT[dtype])[0]["attn_mask"]  # fmt: skip
    b, _ = attention_bound(at, G, "attn_mask", ref, _FMT[dtype])
    assert (np.abs(one - ref) > b).mean() > 0.9
