"""The norms' certain test within rows (refkern.analysis.row_bound_norm): a row's mean and rstd errors left
free, each element's own roundings bounded. Correct kernels are emulated in float32 (two-pass, Welford and
left-to-right statistics, rsqrt off by ulps, the standard and the folded affine forms, Hugging Face's half
stage) against refkern.truth's correctly rounded norms; none may fail. Bugs no pair of shared errors
follows must."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32
from refkern.analysis import row_bound_norm
from refkern.analysis.row_bound_norm import FORMS, NormRows
from refkern.truth import layer_norm as truth_layer_norm
from refkern.truth import rms_norm as truth_rms_norm

U = 2.0**-24
F32 = np.float32
OUT = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16, torch.float16: FLOAT16}


def test_constants_pinned():
    from refkern.analysis.row_bound_norm import _KEY_HI, _KEY_LO, _of_key

    assert _of_key(_KEY_HI) == pytest.approx(2.0, abs=0) and _of_key(_KEY_LO) == pytest.approx(-2.0, abs=0)
    assert FORMS == {None: 0, "folded affine form": 1, "sequential Welford": 2}
    assert NormRows.REPORTED == 8


def _rows(n):
    return lambda r: np.asarray(r).reshape(-1, n)


def _test(X, W, B, center, eps, ref, out=FLOAT32):
    n = X.shape[1]
    u_m = out.u if out.prec < 24 else 0.0
    W = np.asarray(W, np.float64).reshape(1, -1)
    B = np.asarray(B, np.float64).reshape(1, -1)
    return NormRows(X, W, B, center, eps, ref, _rows(n), _rows(n), out, U, u_m)


def test_bound_of_a_unit_row_is_four_roundings():
    # rms_norm of [1, 1, 1, 1], weight 1, eps 0: r = 1, y = 1; x r and (x r) w rounded (u each), the product
    # order's (1 + u) P once more, and the reference's own rounding: 4 u, within the statistics' widening
    from refkern.analysis.row_bound_norm import _element

    b = _element(1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 6.5 * U, U, 0.0, U, 0.0, 0.0, 0, 2.0**-150)
    assert b == pytest.approx(4 * U, rel=2.0**-18)
    assert _element(1.0, np.inf, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, U, 0.0, U, 0.0, 0.0, 0, 0.0) == np.inf


def _stats(Xf, how, center):
    n = Xf.shape[1]
    if how == "two-pass":
        m = (Xf.sum(axis=1, dtype=F32) / F32(n)).astype(F32) if center else np.zeros(len(Xf), F32)
        d = (Xf - m[:, None]).astype(F32)
        v = ((d * d).astype(F32).sum(axis=1, dtype=F32) / F32(n)).astype(F32)
        return m, v
    m = np.zeros(len(Xf), F32)
    m2 = np.zeros(len(Xf), F32)
    for k in range(n):  # Welford, left to right (the mean of squares for rms_norm)
        x = Xf[:, k]
        if center:
            d = (x - m).astype(F32)
            m = (m + (d / F32(k + 1)).astype(F32)).astype(F32)
            m2 = (m2 + (d * (x - m).astype(F32)).astype(F32)).astype(F32)
        else:
            m2 = (m2 + (x * x).astype(F32)).astype(F32)
    return m, (m2 / F32(n)).astype(F32)


def _emulations(X, W, B, center, eps, dtype):
    """Correct norm kernels on the float32-held rows X (their outputs as float64, in the result format)."""
    Xf, Wf, Bf = X.astype(F32), W.astype(F32), B.astype(F32)
    outs, folded = [], []
    for how in ("two-pass", "welford"):
        m, v = _stats(Xf, how, center)
        r0 = (F32(1) / np.sqrt((v + F32(eps)).astype(F32))).astype(F32)
        for dr in (0, 2, -2):  # rsqrt within 2 ulps
            r = (r0 + F32(dr) * np.spacing(r0)).astype(F32)[:, None]
            mm = m[:, None]
            t = ((Xf - mm).astype(F32) * r).astype(F32)
            outs.append(((t * Wf).astype(F32) + Bf).astype(F32))  # standard
            outs.append(((Xf - mm).astype(F32) * (r * Wf).astype(F32)).astype(F32) + Bf)  # (x - m) (r w)
            s = (r * Wf).astype(F32)
            c = (Bf - (mm * s).astype(F32)).astype(F32)
            outs.append(((Xf * s).astype(F32) + c).astype(F32))  # folded
            folded += [False, False, True]
            if dtype != torch.float32:  # Hugging Face: the normalised row stored in the dtype, then the weight
                th = torch.tensor(t).to(dtype)
                outs.append((th * torch.tensor(Wf).to(dtype) + torch.tensor(Bf).to(dtype)).float().numpy())
                folded.append(False)
    return [torch.tensor(np.asarray(o, np.float64)).to(dtype).double().numpy() for o in outs], folded


def _cases(rng, n):
    yield rng.standard_normal((3, n)), 1 + 0.1 * rng.standard_normal(n), 0.1 * rng.standard_normal(n)
    yield rng.standard_normal((2, n)) + 300.0, rng.standard_normal(n), rng.standard_normal(n)  # offset rows
    w = rng.standard_normal(n)
    w[::7] = 0.0
    yield rng.standard_normal((2, n)) * 1e3, w, np.zeros(n)  # zero weights, no bias
    X = rng.standard_normal((2, n))
    X[:, ::5] = 0.0
    yield X, -np.ones(n), np.full(n, 3.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("center", [True, False])
def test_no_correct_kernel_fails(dtype, center):
    rng = np.random.default_rng(17)
    n, eps = 48, 1e-5
    for X, W, B in _cases(rng, n):
        X, W, B = (torch.tensor(np.asarray(a)).to(dtype).double().numpy() for a in (X, W, B))
        if not center:
            B = np.zeros(n)
        xt, wt, bt = (torch.tensor(a).to(dtype) for a in (X, W, B))
        if center:
            ref = truth_layer_norm(xt, (n,), wt, bt, eps=eps)
        else:
            ref = truth_rms_norm(xt, (n,), wt, eps=eps)
        ref = ref.double().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
        t = _test(X, W, B, center, eps, ref, OUT[dtype])
        outs, folded = _emulations(X, W, B, center, eps, dtype)
        for o, f in zip(outs, folded):
            assert t.failures(o, "sequential Welford") == []  # either form
            assert t.failures(o, "folded affine form" if f else None) == [], (f, X[0, :3])


def _fp32_case(rng, n=64):
    X = torch.tensor(rng.standard_normal((4, n))).float()
    W = torch.tensor(1 + 0.1 * rng.standard_normal(n)).float()
    B = torch.tensor(0.1 * rng.standard_normal(n)).float()
    return X, W, B


def test_one_element_and_one_feature_fail_a_scale_without_bias_does_not():
    rng = np.random.default_rng(19)
    X, W, B = _fp32_case(rng)
    n = X.shape[1]
    good = torch.nn.functional.layer_norm(X, (n,), W, B).double().numpy()
    ref = truth_layer_norm(X, (n,), W, B).double().numpy()
    t = _test(X.double().numpy(), W.double().numpy(), B.double().numpy(), True, 1e-5, ref)
    assert t.failures(good) == []
    bad = good.copy()
    bad[2, 9] = np.float32(bad[2, 9] * (1 + 2.0**-17))  # 128 u on one element
    g = t.failures(bad)
    assert [x["index"] for x in g] == [2] and g[0]["z"] > 1.0 and g[0]["mask"][2].any()
    bad = good.copy()
    bad[:, 5] = (bad[:, 5] + 2.0**-17).astype(np.float32)  # one feature offset
    assert len(t.failures(bad)) >= 3
    # rms_norm without bias: a row scaled by 1 + 2**-17 is r's error, left free (the statistical test's to judge)
    g0 = torch.nn.functional.rms_norm(X, (n,), W).double().numpy()
    ref = truth_rms_norm(X, (n,), W).double().numpy()
    t = _test(X.double().numpy(), W.double().numpy(), np.zeros(n), False, 2.0**-23, ref)
    scaled = g0.copy()
    scaled[1] = (scaled[1] * (1 + 2.0**-17)).astype(np.float32)
    assert t.failures(g0) == [] and t.failures(scaled) == []


def test_compare_catches_one_element_the_statistics_pass():
    rng = np.random.default_rng(23)
    X, W, B = _fp32_case(rng)
    n = X.shape[1]
    good = torch.nn.functional.layer_norm(X, (n,), W, B)
    assert rk.compare(good, "layer_norm", X, (n,), W, B).verdict in ("exact", "rounding")
    bad = good.clone()
    bad[1, 30] = bad[1, 30] * (1 + 2.0**-18)  # 64 u: a handful of ulps
    r = rk.compare(bad, "layer_norm", X, (n,), W, B)
    assert r.verdict == "mismatch"
    assert any("row 1" in note["text"] and "disagree among themselves" in note["text"] for note in r.structure)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_norms_in_every_layout_stay_rounding(dtype):
    rng = np.random.default_rng(29)
    x = torch.tensor(rng.standard_normal((2, 6, 5, 8))).to(dtype)
    w, b = torch.tensor(rng.standard_normal(6)).to(dtype), torch.tensor(rng.standard_normal(6)).to(dtype)
    out = torch.nn.functional.group_norm(x, 3, w, b)
    assert rk.compare(out, "group_norm", x, 3, w, b).verdict in ("exact", "rounding")
    rm, rv = torch.zeros(6, dtype=dtype), torch.ones(6, dtype=dtype)
    out = torch.nn.functional.batch_norm(x, rm.clone(), rv.clone(), w, b, training=True)
    assert rk.compare(out, "batch_norm", x, rm.clone(), rv.clone(), w, b, training=True).verdict in ("exact",
                                                                                                      "rounding")
    xt = x.transpose(1, 3)  # a strided layout
    wl, bl = torch.tensor(rng.standard_normal(6)).to(dtype), torch.tensor(rng.standard_normal(6)).to(dtype)
    out = torch.nn.functional.layer_norm(xt, (6,), wl, bl)
    assert rk.compare(out, "layer_norm", xt, (6,), wl, bl).verdict in ("exact", "rounding")
    assert row_bound_norm.FORMS[None] == 0
