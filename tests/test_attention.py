"""scaled_dot_product_attention: bit-identical to the mpmath truth on small problems of every format and
layout (masks, causal, GQA, scale, hard logits, ties whose output is a midpoint, fully masked rows,
specials), each path of Ziv's strategy forced, torch's math backend within its float64 error on an
OpInfo-style grid, and the argument errors."""

import math
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import PARAMS, same

import refkern as rk
from refkern import truth
from refkern.kernels.attention import attention_operands, attention_rows, default_scale

torch = pytest.importorskip("torch")
F = torch.nn.functional
SDPA = rk.scaled_dot_product_attention
FMTS = ("float16", "bfloat16", "float32", "float64")


def _math(*args, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kw)


def _assert_same(got, want, what=""):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    g = got.double().reshape(-1).tolist()
    w = want.double().reshape(-1).tolist()
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(g, w)) if not same(a, b)]
    assert not bad, f"{what}: {len(bad)} elements differ from the truth, first (index, got, truth): {bad[:3]}"


def _qkv(seed, shape_q, shape_k, shape_v, fmt, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, fmt)
    q = (torch.randn(shape_q, generator=g, dtype=torch.float64) * spread).to(dt)
    k = (torch.randn(shape_k, generator=g, dtype=torch.float64) * spread).to(dt)
    v = torch.randn(shape_v, generator=g, dtype=torch.float64).to(dt)
    return q, k, v


# ---------------------------------------------------------------- bit-identical to the truth

LAYOUTS = {
    "2d": ((3, 4), (5, 4), (5, 2), {}),
    "3d": ((2, 3, 4), (2, 5, 4), (2, 5, 3), {}),
    "4d causal L<S": ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 2), {"is_causal": True}),
    "4d causal L>S": ((1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 2), {"is_causal": True}),
    "bool mask bcast": ((2, 2, 3, 4), (2, 2, 4, 4), (2, 2, 4, 2), {"attn_mask": "bool"}),
    "float mask": ((1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 2), {"attn_mask": "float"}),
    "gqa": ((1, 4, 2, 4), (1, 2, 3, 4), (1, 1, 3, 2), {"enable_gqa": True}),
    "batch bcast": ((2, 3, 4), (1, 5, 4), (5, 2), {}),
    "scale": ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"scale": -0.7}),
}


def _kw(kw, L, S, fmt, seed):
    kw = dict(kw)
    rng = np.random.default_rng(seed)
    if kw.get("attn_mask") == "bool":
        m = rng.random((2, 1, L, S)) > 0.35
        m[0, 0, 0] = False  # a fully masked row
        kw["attn_mask"] = torch.from_numpy(m)
    elif kw.get("attn_mask") == "float":
        m = rng.standard_normal((L, S)) * 2
        m[1] = -np.inf  # fully masked
        m[2, 1:] = -np.inf  # a single key left: the output is v_0 exactly
        kw["attn_mask"] = torch.from_numpy(m).to(torch.float32 if fmt != "float64" else torch.float64)
    return kw


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_match_truth(layout, fmt):
    sq, sk, sv, kw = LAYOUTS[layout]
    q, k, v = _qkv(zlib.crc32(layout.encode()), sq, sk, sv, fmt)
    kw = _kw(kw, sq[-2], sk[-2], fmt, 1)
    _assert_same(SDPA(q, k, v, **kw), truth.scaled_dot_product_attention(q, k, v, **kw), f"{layout} {fmt}")


@given(st.sampled_from(FMTS), st.integers(1, 4), st.integers(1, 5), st.integers(0, 4), st.integers(1, 3),
       st.sampled_from(["normal", "large", "ties", "midpoint", "tiny"]), st.integers(0, 2**31))  # fmt: skip
def test_random_match_truth(fmt, L, S, E, Ev, kind, seed):
    """Ordinary, large (logits up to ~1e4), tied (q = 0: every output is the mean of v, a midpoint when v
    holds two neighbours), and tiny-valued problems."""
    q, k, v = _qkv(seed, (2, L, E), (2, S, E), (2, S, Ev), fmt, spread=30.0 if kind == "large" else 2.0)
    if kind in ("ties", "midpoint"):
        q = torch.zeros_like(q)
    if kind == "midpoint" and S >= 2:
        one = torch.tensor(1.0, dtype=q.dtype)
        nxt = torch.nextafter(one, torch.tensor(2.0, dtype=q.dtype)) if fmt != "bfloat16" else one + 2.0**-7
        v = torch.full_like(v, 1.0)
        v[:, 1] = nxt  # mean of 1 and its successor (S == 2): exactly a midpoint
        v = v[:, :2] if S == 2 else v
        k = k[:, : v.shape[1]]
    if kind == "tiny":
        v = v * torch.tensor(2.0**-130 if fmt != "float16" else 2.0**-20, dtype=v.dtype)
    _assert_same(SDPA(q, k, v), truth.scaled_dot_product_attention(q, k, v), f"{kind} {fmt}")


def test_hard_cases_match_truth():
    inf = math.inf
    q = torch.tensor([[1.0, 2.0], [0.0, 0.0], [100.0, -100.0], [3.0, 1.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [50.0, 50.0]])
    v = torch.tensor([[1.0, -1.0], [1.0 + 2.0**-23, 1.0], [2.0**-140, 3.0]])
    m = torch.tensor([[0.0, -inf, 0.0], [0.0, 0.0, -inf], [-inf, -inf, -inf], [0.0, 0.0, 0.0]])
    for kw in ({}, {"attn_mask": m}, {"is_causal": True}, {"scale": 3.0}):
        _assert_same(SDPA(q, k, v, **kw), truth.scaled_dot_product_attention(q, k, v, **kw), str(kw))
        q64, k64, v64 = q.double() * 10, k.double() * 30, v.double()
        kw64 = {**kw, "attn_mask": m.double()} if "attn_mask" in kw else kw
        _assert_same(SDPA(q64, k64, v64, **kw64), truth.scaled_dot_product_attention(q64, k64, v64, **kw64), "f64")


def test_float64_extremes_match_truth():
    """Logits near 1e300 apart, values near the overflow threshold and subnormal values: the double-word
    pass leaves its range to the exact path, which still matches the truth."""
    q = torch.tensor([[1e150, 1.0], [1e-160, 2.0]], dtype=torch.float64)
    k = torch.tensor([[1e150, 0.0], [2e150, 1.0], [1.0, 1e-300]], dtype=torch.float64)
    for v in ([[1e308, -1e308], [1.7e308, 1.0], [3.0, 5e-324]], [[1e-320, -1e-310], [2e-320, 1.0], [3.0, 5e-324]]):
        v = torch.tensor(v, dtype=torch.float64)
        _assert_same(SDPA(q, k, v), truth.scaled_dot_product_attention(q, k, v))


def test_specials_match_truth_and_torch():
    """NaN/inf inputs and masks follow IEEE on the definition, as torch's math backend."""
    inf, nan = math.inf, math.nan
    q = torch.tensor([[1.0, 0.5], [inf, 1.0], [nan, 0.0], [0.5, 0.5]], dtype=torch.float64)
    k = torch.tensor([[1.0, 1.0], [2.0, -1.0], [0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 2.0], [inf, 0.5], [3.0, -inf]], dtype=torch.float64)
    m = torch.tensor([[True, False, True], [True, True, True], [True, True, True], [False, False, False]])
    got = SDPA(q, k, v, attn_mask=m)
    _assert_same(got, truth.scaled_dot_product_attention(q, k, v, attn_mask=m))
    ref = _math(q, k, v, attn_mask=m)
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    fin = ~torch.isnan(got) & torch.isfinite(ref)
    assert torch.allclose(got[fin], ref[fin], rtol=1e-12, atol=0)
    assert torch.equal(got[torch.isinf(ref)], ref[torch.isinf(ref)])


# ---------------------------------------------------------------- the three paths


@pytest.mark.parametrize("fmt", FMTS)
def test_forced_paths_agree(fmt):
    q, k, v = _qkv(5, (2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 5), fmt)
    q[0, 0] = 0  # ties
    a = attention_operands(q, k, v, is_causal=True)
    auto, ca = attention_rows(a)
    dd, cd = attention_rows(a, force="dd")
    ex, ce = attention_rows(a, force="exact")
    assert cd.dd_rows == ca.rows and ce.exact_elements == ce.elements
    for x, what in ((dd, "dd"), (ex, "exact")):
        diff = [(i, s, t) for i, (s, t) in enumerate(zip(auto.ravel(), x.ravel())) if not same(s, t)]
        assert not diff, f"{what}: {diff[:3]}"


def test_fallback_rate():
    """On ordinary float32 data the float64 pass decides ~94% of rows outright (the rest: a few columns each
    in double-word), and nothing reaches the exact path."""
    q, k, v = _qkv(9, (1, 2, 128, 64), (1, 2, 128, 64), (1, 2, 128, 64), "float32", spread=1.0)
    _, c = attention_rows(attention_operands(q, k, v))
    print(f"float32: {c.dd_rows}/{c.rows} rows to the double-word pass, {c.exact_elements}/{c.elements} exact")
    assert c.dd_rows <= c.rows // 5 and c.exact_elements == 0
    _, c = attention_rows(attention_operands(q.double(), k.double(), v.double()))
    assert c.exact_elements == 0


# ---------------------------------------------------------------- torch's semantics

GRID = [
    dict(sq=(4, 8), sk=(6, 8), sv=(6, 3)),
    dict(sq=(2, 5, 8), sk=(2, 7, 8), sv=(2, 7, 8)),
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), is_causal=True),
    dict(sq=(2, 3, 7, 8), sk=(2, 3, 5, 8), sv=(2, 3, 5, 4), is_causal=True),
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(5, 7), bool_mask=True),
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(2, 1, 1, 7)),
    dict(sq=(2, 4, 5, 8), sk=(2, 2, 7, 8), sv=(2, 2, 7, 4), enable_gqa=True),
    dict(sq=(2, 4, 5, 8), sk=(2, 1, 7, 8), sv=(2, 4, 7, 4), enable_gqa=True, scale=0.3),
    dict(sq=(3, 5, 8), sk=(1, 7, 8), sv=(7, 2), scale=2.0),
    dict(sq=(1, 2, 1, 5, 8), sk=(1, 2, 3, 7, 8), sv=(1, 2, 3, 7, 4)),
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(5, 7)),  # a 2-D float mask
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(3, 5, 7), bool_mask=True),  # 3-D, broadcast
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(5, 1), bool_mask=True),  # whole rows masked
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), mask=(1, 7)),  # one bias per key
    dict(sq=(2, 4, 7, 8), sk=(2, 2, 5, 8), sv=(2, 2, 5, 6), enable_gqa=True, is_causal=True),  # L > S
    dict(sq=(2, 4, 5, 8), sk=(2, 2, 7, 8), sv=(2, 2, 7, 4), enable_gqa=True, mask=(2, 4, 5, 7)),
    dict(sq=(2, 1, 8), sk=(2, 1, 8), sv=(2, 1, 3)),  # L = S = 1
    dict(sq=(2, 5, 1), sk=(2, 7, 1), sv=(2, 7, 4), scale=-0.5),  # E = 1, a negative scale
    dict(sq=(2, 3, 5, 8), sk=(2, 3, 7, 8), sv=(2, 3, 7, 4), strided=True, is_causal=True),  # (B, L, H, E) views
]


@pytest.mark.parametrize("fmt", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(GRID)))
def test_agrees_with_torch_math_float64(case, fmt):
    """Within torch's float64 error (2**-40 of max |v|) plus one unit of the result format."""
    c = dict(GRID[case])
    q, k, v = _qkv(case, c.pop("sq"), c.pop("sk"), c.pop("sv"), fmt, spread=1.5)
    if c.pop("strided", False):  # the layout of a (B, L, H, E) projection viewed as (B, H, L, E): not contiguous
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        assert not q.is_contiguous()
    if "mask" in c:
        g = torch.Generator().manual_seed(case)
        shape = c.pop("mask")
        if c.pop("bool_mask", False):
            c["attn_mask"] = torch.rand(shape, generator=g) > 0.3
        else:
            c["attn_mask"] = (torch.randn(shape, generator=g) * 2).to(torch.float32)
    got = SDPA(q, k, v, **c)
    kw64 = {**c, "attn_mask": c["attn_mask"].double()} if "attn_mask" in c and c["attn_mask"].is_floating_point() \
        else c  # fmt: skip
    ref = _math(q.double(), k.double(), v.double(), **kw64)
    assert got.dtype == q.dtype and got.shape == ref.shape
    prec, emin, _ = PARAMS[fmt]
    ulp = torch.tensor([2.0 ** (max(math.frexp(x)[1] - 1, emin) - prec + 1) for x in ref.reshape(-1).tolist()])
    tol = 2.0**-40 * v.double().abs().max() + (ulp.reshape(ref.shape) if prec < 53 else 0)
    assert ((got.double() - ref).abs() <= tol).all()
    if case == 0:  # numpy in, numpy out
        out = SDPA(q.double().numpy(), k.double().numpy(), v.double().numpy())
        assert isinstance(out, np.ndarray) and out.dtype == np.float64


def test_scale_none_is_torch_float64_value():
    assert default_scale(64) == 0.125 and default_scale(5) == 1.0 / math.sqrt(5) == 0.4472135954999579
    q, k, v = _qkv(3, (2, 3, 5), (2, 4, 5), (2, 4, 2), "float32")
    assert torch.equal(SDPA(q, k, v), SDPA(q, k, v, scale=1.0 / math.sqrt(5)))


def test_degenerate_shapes_follow_torch():
    q, k, v = _qkv(4, (2, 3, 4), (2, 5, 4), (2, 5, 2), "float32")
    assert SDPA(q[:, :0], k, v).shape == (2, 0, 2)
    assert torch.equal(SDPA(q, k[:, :0], v[:, :0]), _math(q, k[:, :0], v[:, :0]))  # S = 0: zeros
    e0 = SDPA(q[..., :0], k[..., :0], v)  # E = 0: the logits are 0, the output is the mean of v
    assert torch.allclose(e0, _math(q[..., :0], k[..., :0], v), rtol=1e-6)
    m = torch.zeros(3, 5, dtype=torch.bool)
    assert torch.equal(SDPA(q, k, v, attn_mask=m), torch.zeros(2, 3, 2))  # fully masked: zeros, as torch


def test_errors_name_the_argument():
    q, k, v = _qkv(1, (2, 3, 4), (2, 5, 4), (2, 5, 2), "float32")
    cases = [
        (dict(dropout_p=0.1), ValueError, r"^scaled_dot_product_attention: dropout_p must be 0; got dropout_p=0.1\. "
                                          r"No reference exists for a random dropout mask"),
        (dict(attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True), ValueError, r"attn_mask must be None"),
        (dict(attn_mask=torch.zeros(3, 5, dtype=torch.float64)), TypeError, r"attn_mask must be bool, float32"),
        (dict(attn_mask=torch.zeros(4, 3, 5)), ValueError, r"attn_mask must broadcast"),
    ]  # fmt: skip
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            SDPA(q, k, v, **kw)
    with pytest.raises(TypeError, match=r"same dtype"):
        SDPA(q, k.double(), v)
    with pytest.raises(ValueError, match=r"same last dimension E"):
        SDPA(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"number of positions S"):
        SDPA(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"at least 2-D"):
        SDPA(q[0, 0], k[0], v[0])
    with pytest.raises(ValueError, match=r"multiple of the key heads"):
        SDPA(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), enable_gqa=True)
