"""refkern.backward for scaled_dot_product_attention: bit for bit against truth.backward (mpmath, its own
formula) on hard cases, the fast path against the exact path, within torch's float64 autograd, no false
alarm on torch's CPU gradients (math and flash backends, fp32/fp16/bf16), injected bugs caught, the
envelope's constants pinned."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
F = torch.nn.functional
OP = "scaled_dot_product_attention"
NAMES = ("query", "key", "value")


def _bits(t):
    return t.double().numpy().view(np.int64).tolist()


def _qkvg(seed, shapes, dtype, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes)
    g = torch.randn(*shapes[0][:-1], shapes[2][-1], generator=gen, dtype=torch.float64)
    return (q * scale).to(dtype), (k * scale).to(dtype), v.to(dtype), g.to(dtype)


def _hard_cases(dtype):
    """(name, q, k, v, g, kwargs): large logits (the exact path), a bool mask with a fully masked row, an
    additive mask, causal, GQA with a broadcast batch, equal logits (rational P), constant v (dS = 0),
    two identical query rows with opposite dO (their dk and dv terms cancel exactly)."""
    big = 30.0 if dtype in (torch.float32, torch.float64) else 6.0
    shapes = ((2, 4, 3), (2, 5, 3), (2, 5, 2))
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]], dtype=torch.bool)
    add = torch.tensor([[0.0, -1.5, -math.inf, 2.0, 0.25]])  # float32: allowed with every query dtype
    q, k, v, g = _qkvg(1, shapes, dtype)
    ql, kl, _, _ = _qkvg(1, shapes, dtype, big)
    qg, kg, vg, _ = _qkvg(2, ((1, 4, 3, 2), (2, 2, 4, 2), (2, 2, 4, 3)), dtype)
    gg = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(dtype)
    z = torch.zeros_like(q)
    qt, gt = q.clone(), g.clone()
    qt[:, 1], gt[:, 1] = qt[:, 0], -gt[:, 0]  # identical rows, opposite dO: their dk and dv terms cancel
    return [
        ("large logits", ql, kl, v, g, {}),
        ("bool mask, fully masked row", q, k, v, g, {"attn_mask": mask}),
        ("additive mask", q, k, v, g, {"attn_mask": add}),
        ("causal, scale", q, k, v, g, {"is_causal": True, "scale": 0.75}),
        ("gqa, broadcast batch", qg, kg, vg, gg, {"enable_gqa": True}),
        ("equal logits", z, k, v, g, {}),
        ("constant v", q, k, torch.ones_like(v), g, {}),
        ("rows that cancel", qt, k, v, gt, {}),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                         ids=lambda d: str(d)[6:])  # fmt: skip
def test_bit_identical_to_truth_on_hard_cases(dtype):
    for name, q, k, v, g, kw in _hard_cases(dtype):
        fast = rk.backward(OP, g, q, k, v, **kw)
        truth = rk.truth.backward(OP, g, q, k, v, **kw)
        for n, x in zip(NAMES, (q, k, v)):
            assert fast[n].dtype == dtype and fast[n].shape == x.shape, (name, n)
            assert _bits(fast[n]) == _bits(truth[n]), (name, n)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("float32", "float64"))
def test_exact_path_far_offsets_and_combined_rows_bit_identical_to_truth(dtype):
    """Two paths of the exact fallback: a logit offset far below exp_dd's range (-2545: e**a_j underflows
    every format, the gradients are zeros whose sign the exact sign of dS decides), and identical query
    rows with different dO (their dk and dv terms combine into one row whose intervals are Fractions)."""
    q = torch.tensor([[[60.0, 0.0], [0.0, 1.0]]], dtype=dtype)
    k = torch.tensor([[[60.0, 0.0], [0.0, 0.0], [1.0, -1.0]]], dtype=dtype)
    v = torch.tensor([[[1.0, 2.0], [-3.0, 0.5], [0.25, 1.0]]], dtype=dtype)
    g = torch.tensor([[[1.0, -1.0], [0.5, 2.0]]], dtype=dtype)
    fast, truth = rk.backward(OP, g, q, k, v), rk.truth.backward(OP, g, q, k, v)
    assert all(_bits(fast[n]) == _bits(truth[n]) for n in NAMES)
    assert torch.signbit(fast["query"][0, 0]).all() and not torch.signbit(fast["key"][0, 2, 0])  # -0.0, +0.0
    q, k, v, g = _qkvg(1, ((2, 4, 3), (2, 5, 3), (2, 5, 2)), dtype, 30.0 if dtype == torch.float32 else 1.0)
    q[:, 1] = q[:, 0]
    g[:, 1] = 0.5 * g[:, 0] + 0.25
    fast, truth = rk.backward(OP, g, q, k, v), rk.truth.backward(OP, g, q, k, v)
    assert all(_bits(fast[n]) == _bits(truth[n]) for n in NAMES)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bfloat16", "float32"))
def test_a_rows_dS_summing_to_zero_is_exact_zero(dtype):
    """sum_j dS_ij = 0 in every row: a dq element whose key column is constant over the row's keys is exactly
    0 (the interval loop alone never decides it: the exact path finds it by its pair test, truth by grouping
    the row's terms by exponent). Seen in bfloat16 under a causal mask (row 1 has two keys, equal in a
    column). Bit for bit against truth, signed zeros included (+0: an exact zero)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 3, 4, generator=gen).to(dtype) for _ in range(4))
    k[0, 1, 2] = k[0, 0, 2]  # row 1 (keys 0 and 1 under the causal mask): dq[1, 2] = s k (dS_0 + dS_1) = 0
    k[0, :, 3] = 0.75  # column 3 constant: dq[:, 3] = 0 in every row
    r = rk.backward(OP, g, q, k, v, is_causal=True)
    zeros = torch.stack([r["query"][0, 1, 2], *r["query"][0, :, 3]])
    assert (zeros == 0).all() and not torch.signbit(zeros).any()
    assert (r["query"][0, 2, :3] != 0).all()
    truth = rk.truth.backward(OP, g, q, k, v, is_causal=True)
    for n in NAMES:
        assert _bits(r[n]) == _bits(truth[n]), n


def _zero_cases(dtype):
    """(name, q, k, v, g, kwargs, [(name, index) of exact zeros]): a key column constant over every key
    (non-causal, negative scale), a bool mask whose row 0 attends keys equal in a column that the masked key
    is not, GQA with a column constant over one key/value head's keys (the dq of its two query heads)."""
    q, k, v, g = _qkvg(11, ((2, 3, 4), (2, 5, 4), (2, 5, 3)), dtype)
    k[:, :, 1] = -1.5
    mask = torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 1]], dtype=torch.bool)
    qm, km, vm, gm = _qkvg(12, ((1, 3, 4), (1, 5, 4), (1, 5, 3)), dtype)
    km[0, [0, 2, 3, 4], 2] = 0.5  # row 0's keys agree in column 2; key 1 (masked for row 0) does not
    km[0, 1, 2] = 0.25
    qg, kg, vg, _ = _qkvg(13, ((1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)), dtype)
    gg = torch.randn(1, 4, 3, 3, generator=torch.Generator().manual_seed(14), dtype=torch.float64).to(dtype)
    kg[0, 0, :, 3] = 2.0
    return [
        ("constant key column, scale < 0", q, k, v, g, {"scale": -0.5}, [("query", (b, i, 1)) for b in range(2) for i in range(3)]),
        ("bool mask", qm, km, vm, gm, {"attn_mask": mask}, [("query", (0, 0, 2))]),
        ("gqa", qg, kg, vg, gg, {"enable_gqa": True}, [("query", (0, h, i, 3)) for h in (0, 1) for i in range(3)]),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bfloat16", "float32"))
def test_truth_exact_zeros_of_constant_key_columns(dtype):
    """truth.backward decides the exact zeros of sum_j dS_ij = 0 (a non-causal row, a masked row, GQA, a
    negative scale) as +0 and agrees with the fast path bit for bit; the elements beside them are nonzero."""
    for name, q, k, v, g, kw, zeros in _zero_cases(dtype):
        truth = rk.truth.backward(OP, g, q, k, v, **kw)
        fast = rk.backward(OP, g, q, k, v, **kw)
        for n in NAMES:
            assert _bits(fast[n]) == _bits(truth[n]), (name, n)
        z = torch.stack([truth[n][ix] for n, ix in zeros])
        assert (z == 0).all() and not torch.signbit(z).any(), name
        assert (truth["query"] != 0).sum() == truth["query"].numel() - len(zeros), name


def _across_cases(dtype):
    """(q, k, v, g, (name, rows, column of exact zeros), kwargs): see
    test_exact_zeros_across_rows_of_permuted_logits."""

    def t(x):
        return torch.tensor(x, dtype=dtype)

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)  # row 1 sees row 0's two keys twice
    inf = math.inf
    rows = [[0.0, -1.0, -inf, -inf], [0.0, -1.0, -2.0, -3.0], [-2.0, -1.0, 0.0, -3.0]]
    add = torch.tensor(rows)  # float32: allowed with every query dtype
    gen = torch.Generator().manual_seed(0)
    ka, va = torch.randn(4, 2, generator=gen).to(dtype), torch.randn(4, 2, generator=gen).to(dtype)
    return [
        (t([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]), t([[1.0, 0.0], [0.0, 1.0]]), t([[0.5, -1.0], [2.0, 0.25]]),
         t([[1.0, 0.5], [1.0, -0.75], [-2.0, 1.0]]), ("value", 2, 0), {}),
        (t([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]), t([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), t([[1.0, 0.0], [0.0, 0.0]]),
         t([[1.0, 0.0], [-1.0, 0.0]]), ("key", 2, 2), {}),
        (t([[1.0, 0.5], [1.0, 0.5]]), t([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
         t([[0.5, -1.0], [2.0, 0.25], [1.0, 1.0], [-1.0, 0.5]]), t([[1.0, 0.5], [-2.0, 1.0]]), ("value", 2, 0),
         {"attn_mask": mask}),
        (torch.zeros(3, 2, dtype=dtype), ka, va, t([[1.0, 0.5], [-1.0, 0.25], [-1.0, 2.0]]), ("value", 1, 0),
         {"attn_mask": add}),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bfloat16", "float32"))
def test_exact_zeros_across_rows_of_permuted_logits(dtype):
    """dk and dv elements that are exactly 0 by cancellation between rows of different logits: rows A, B with
    logits (a, 0) and (0, a) share S = 1 + e**-a, so ``P_A0 + P_B0 = 1``, and C's equal logits give
    ``P_C0 = 1/2``: dv_0 = dv_1 = 0 with dO = (1, 1, -2) in that column; ``dS_A0 = dS_B0``'s common factor
    ``P_0 P_1`` times ``(dP_A0 - dP_A1) q_A + (dP_B0 - dP_B1) q_B`` = 0 in a column where q_A = q_B. Both paths
    group the terms by their rows' logits (truth: the multiset; the kernel: S up to a factor) (+0). Rows of
    proportional S: a masked row sees keys (k0, k1), the next (k0, k1, k0, k1), so ``S_1 = 2 S_0`` and
    ``P_00 - 2 P_10 / 2 = 0`` with dO = (1, -2) (truth: by testing the classes together; the kernel: one
    class). S sharing a factor (additive mask, x = e**-1): ``S_0 = 1 + x``, ``S_1 = S_2 = (1 + x)(1 + x**2)``
    with key 0 at offsets 0, 0, -2, so ``1/S_0 - (1 + x**2)/S_1 = 0`` with dO = (1, -1, -1): found by both
    testing the classes together. The fast path bit for bit against truth; the other elements within an ulp
    of torch's float64 autograd (torch's own error apart)."""
    for q, k, v, g, (n, rows, col), kw in _across_cases(dtype):
        truth = rk.truth.backward(OP, g, q, k, v, **kw)
        fast = rk.backward(OP, g, q, k, v, **kw)
        for m in NAMES:
            assert _bits(fast[m]) == _bits(truth[m]), (n, m, kw.keys())
        z = truth[n][:rows, col]
        assert (z == 0).all() and not torch.signbit(z).any(), n
        ref = _torch_grads(*(x.double() for x in (q, k, v, g)), **kw)
        for m in NAMES:
            tol = torch.finfo(dtype).eps * ref[m].abs() + 1e-14  # an ulp, and float64 autograd's own error
            assert ((truth[m].double() - ref[m]).abs() <= tol).all(), m


def test_semantics_of_masks_and_zero_gradients():
    q, k, v, g, kw = _hard_cases(torch.float32)[1][1:]
    r = rk.backward(OP, g, q, k, v, **kw)
    assert (r["query"][:, 1] == 0).all()  # a fully masked row: P = 0, no gradient (torch's math backend)
    q, k, v, g, kw = _hard_cases(torch.float32)[6][1:]
    r = rk.backward(OP, g, q, k, v, **kw)
    assert (r["query"] == 0).all() and (r["key"] == 0).all()  # constant v: dS = 0 exactly
    q, k, v, g, kw = _hard_cases(torch.float32)[7][1:]
    r = rk.backward(OP, g, q, k, v, **kw)
    rest = rk.backward(OP, g[:, 2:], q[:, 2:], k, v)  # rows 0 and 1 cancel exactly: the other rows' gradients
    assert torch.equal(r["key"], rest["key"]) and torch.equal(r["value"], rest["value"])
    assert torch.equal(r["query"][:, 0], -r["query"][:, 1])
    q2, g2 = q[:1, :1].expand(1, 2, 3).clone(), torch.cat([g[:1, :1], -g[:1, :1]], 1)  # only those two rows
    r = rk.backward(OP, g2, q2, k[:1], v[:1])  # every dk, dv element exactly 0: found by merging the rows
    assert (r["key"] == 0).all() and (r["value"] == 0).all() and _bits(r["key"]) == _bits(rk.truth.backward(
        OP, g2, q2, k[:1], v[:1])["key"])  # fmt: skip


def test_fast_path_equals_exact_path():
    from refkern.kernels.attention import attention_operands
    from refkern.kernels.attention_backward import attention_backward

    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, g = _qkvg(3, ((2, 4, 3), (2, 5, 3), (2, 5, 2)), dtype)
        a = attention_operands(q, k, v, is_causal=True)
        G = g.double().numpy()
        fast, cf = attention_backward(a, G, NAMES)
        exact, ce = attention_backward(a, G, NAMES, force_exact=True)
        assert cf.exact_elements < cf.elements and ce.exact_elements == ce.elements
        for n in NAMES:
            assert np.array_equal(fast[n], exact[n]), n


def _torch_grads(q, k, v, g, backend=None, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(backend if backend is not None else SDPBackend.MATH):
        F.scaled_dot_product_attention(qq, kk, vv, **kw).backward(g)
    return {"query": qq.grad, "key": kk.grad, "value": vv.grad}


def test_float64_within_torch_autograd_error():
    """torch's float64 autograd is a correct float64 backward: the float64 envelope holds it, and the
    float32 reference agrees with it to within float32 rounding plus that error."""
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]], dtype=torch.bool)  # a fully masked row
    for kw in ({"is_causal": True}, {"attn_mask": mask}):
        q, k, v, g = _qkvg(4, ((1, 3, 2), (1, 4, 2), (1, 4, 2)), torch.float64)
        got = _torch_grads(q, k, v, g, **kw)
        reps = rk.compare_backward(got, OP, g, q, k, v, **kw)
        assert all(r.verdict in ("exact", "rounding") for r in reps.values()), {n: r.verdict for n, r in reps.items()}
        ref = rk.backward(OP, g, q, k, v, **kw)
        for n in NAMES:
            assert (ref[n] - got[n]).abs().max() <= 1e-13 * (1 + got[n].abs().max()), n


def _backends():
    from torch.nn.attention import SDPBackend

    return (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=lambda d: str(d)[6:])
def test_no_false_alarm_on_torch_cpu(dtype):
    cases = [({}, 1.0), ({"is_causal": True}, 1.0), ({}, 4.0)]
    seen = 0
    for backend in _backends():
        for kw, sc in cases:
            q, k, v, g = _qkvg(5, ((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8)), dtype, sc)
            try:
                got = _torch_grads(q, k, v, g, backend, **kw)
            except RuntimeError:  # the CPU offers no flash kernel for this call
                continue
            seen += 1
            reps = rk.compare_backward(got, OP, g, q, k, v, **kw)
            for n, r in reps.items():
                assert r.verdict in ("exact", "rounding"), (str(backend), kw, sc, n, r.verdict, r.max_bound_ratio)
    assert seen >= len(cases)


def _manual(q, k, v, g, scale, drop_rowsum=False, no_scale_dk=False):
    """A float32 backward by the definition, with an optional bug."""
    q, k, v, g = (x.float() for x in (q, k, v, g))
    P = (scale * q @ k.transpose(-1, -2)).softmax(-1)
    dP = g @ v.transpose(-1, -2)
    dS = P * dP if drop_rowsum else P * (dP - (dP * P).sum(-1, keepdim=True))
    return {"query": scale * dS @ k, "key": (1.0 if no_scale_dk else scale) * dS.transpose(-1, -2) @ q,
            "value": P.transpose(-1, -2) @ g}  # fmt: skip


def test_injected_bugs_caught():
    q, k, v, g = _qkvg(6, ((2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)), torch.float32)
    ok = rk.compare_backward(_manual(q, k, v, g, 0.25), OP, g, q, k, v)
    assert all(r.verdict in ("exact", "rounding") for r in ok.values())
    rows = rk.compare_backward(_manual(q, k, v, g, 0.25, drop_rowsum=True), OP, g, q, k, v)
    assert rows["query"].verdict == "mismatch" and rows["key"].verdict == "mismatch"
    assert rows["value"].verdict in ("exact", "rounding")
    sc = rk.compare_backward(_manual(q, k, v, g, 0.25, no_scale_dk=True), OP, g, q, k, v)
    assert sc["key"].verdict == "mismatch" and sc["query"].verdict in ("exact", "rounding")


def test_errors_and_wrt():
    q, k, v, g = _qkvg(7, ((1, 3, 2), (1, 4, 2), (1, 4, 2)), torch.float32)
    with pytest.raises(ValueError, match=r"^backward: scaled_dot_product_attention with dropout_p > 0"):
        rk.backward(OP, g, q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape"):
        rk.backward(OP, g[:, :2], q, k, v)
    bad = q.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^backward: scaled_dot_product_attention backward needs finite"):
        rk.backward(OP, g, bad, k, v)
    only = rk.backward(OP, g, q, k, v, wrt=("value",))
    assert set(only) == {"value"} and torch.equal(only["value"], rk.backward(OP, g, q, k, v)["value"])


def test_envelope_constants_pinned():
    """Each constant of attention_bound's derivation (its docstring), and one value by hand: q = [[1]],
    k = [[0], [0]], v = [[1], [0]], dO = [[1]] (float32): z = (0, 0), P = (1/2, 1/2), dv_j = 1/2, n = L = 1."""
    assert (envb.SCALE_ROUNDINGS, envb.LOGIT_ROUNDINGS, envb.SHIFT_ROUNDINGS, envb.FLASH_O_ROUNDINGS,
            envb.DS_ROUNDINGS, envb.REDUCE_EXTRA, envb.ATTN_SECOND_ORDER) == (4, 2, 4, 3, 3, 6, 8)  # fmt: skip
    from refkern.analysis._envelope_softmax import EXP_ULPS
    from refkern.kernels.attention import attention_operands

    q, k, v, g = (torch.tensor(x, dtype=torch.float32) for x in ([[1.0]], [[0.0], [0.0]], [[1.0], [0.0]], [[1.0]]))
    a = attention_operands(q, k, v)
    b, n = envb.attention_bound(a, g.double().numpy().reshape(1, 1, 1), "value", np.full((1, 2, 1), 0.5))
    uu, eta, u_o, eta_o = 2.0**-24, 2.0**-126, 2.0**-24, 2.0**-150

    def gam(m):
        return m * uu / (1 - m * uu)

    dl = eta + 4 * uu * (math.log(2) + 1)  # ez = eta (A = 0, z = 0)
    x1 = math.expm1(2 * dl)
    eP = 0.5 * (x1 + gam(2 + EXP_ULPS + 3) * (1 + x1) + 6 * 2.0**-52) + eta
    E = eP + (gam(1 + 2) + 17 * 2.0**-52) * (0.5 + eP) + 3 * eta
    want = (E * (1 + 8 * uu) + u_o * (2 * 0.5 * (1 + 2 * u_o) + E) + 2 * eta_o) * (1 + 2.0**-40)
    assert n == 1 and b.shape == (1, 2, 1)
    assert b[0, 0, 0] == pytest.approx(want, rel=1e-12, abs=0) and b[0, 1, 0] == pytest.approx(want, rel=1e-12, abs=0)


def test_truth_cross_row_test_capped_fails_honestly(monkeypatch):
    """Past _ACROSS_CAP terms truth does not test classes of rows together: on an exact zero that needs it, a
    bounded loop and a RuntimeError, not a guess."""
    import importlib

    tb = importlib.import_module("refkern.truth._backward_softmax")  # where truth's attention backward reads it
    q = torch.tensor([[1.0, 0.5], [1.0, 0.5]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    v, g = torch.ones(4, 1), torch.tensor([[1.0], [-2.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    monkeypatch.setattr(tb, "_ACROSS_CAP", 1)
    with pytest.raises(RuntimeError, match=r"^truth: the interval loop did not converge: the terms of rows"):
        rk.truth.backward(OP, g, q, k, v, attn_mask=mask, wrt="value")
