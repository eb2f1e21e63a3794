"""The certain test within a row (refkern.analysis.row_bound): each row's shared error left free, each
element's own roundings bounded. Correct kernels are emulated in float32 arithmetic (every order and form
of the module docstring, the shared value off by any amount) against refkern.truth's correctly rounded
log_softmax; none may fail it. Bugs that no constant follows must."""

import math

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FORMATS
from refkern.analysis import row_bound
from refkern.analysis.row_bound import LogSoftmaxRows, candidate
from refkern.truth import log_softmax as truth_log_softmax

U = 2.0**-24


def test_constants_pinned():
    assert row_bound.EVAL_SLACK == pytest.approx(2.0**-40, abs=0)
    assert row_bound.LOG_ULPS == pytest.approx(1.0, abs=0)
    assert row_bound.EXP_ULPS == pytest.approx(4.75, abs=0)
    from refkern.analysis._envelope_softmax import EXP_SCALE_ULPS, LOG_SCALE_ULPS

    assert row_bound.EXP_ULPS == EXP_SCALE_ULPS and row_bound.LOG_ULPS == LOG_SCALE_ULPS


def test_candidates():
    assert candidate(None, FLOAT32, U) == (U, 0.0, 0.0)
    assert candidate("bf16", FLOAT32, U) == (U, 2.0**-8, 0.0)
    assert candidate("fp16 output", FLOAT32, U) == (U, 0.0, 2.0**-11)
    assert candidate("fp32", FORMATS["float64"], 2.0**-53) == (U, U, 0.0)  # computed in float32
    assert candidate("bf16 P@V", FLOAT32, U) is None


def _rows(n):
    return lambda r: np.asarray(r, np.float64).reshape(-1, n)


def _test(X, ref, out=FLOAT32):
    n = X.shape[1]
    u_m = out.u if out.prec < 24 else 0.0
    return LogSoftmaxRows(X, ref, _rows(n), _rows(n), out, U, u_m)


def _truth(X, dtype):
    t = torch.tensor(X, dtype=dtype)
    y = truth_log_softmax(t, -1)
    return (y.double().numpy() if isinstance(y, torch.Tensor) else np.asarray(y, np.float64)).reshape(X.shape)


def test_bound_is_three_half_ulps_on_a_float32_row():
    # x = [0, -1.5]: the second element's z = 1.5 (binade [1, 2)), y = -1.70141 (binade [1, 2)): its subtraction
    # of the maximum, the subtraction of L and the reference's own rounding, one float32 half-ulp each, 2**-24
    X = np.array([[0.0, -1.5]])
    b = _test(X, _truth(X, torch.float32)).bounds()
    assert b[0, 1] == pytest.approx(3 * 2.0**-24, rel=2.0**-30)
    # the maximum's z is 0 (exact); y = -0.20141 (binade [1/8, 1/4)): 2**-27 twice
    assert b[0, 0] == pytest.approx(2 * 2.0**-27, rel=2.0**-30)


def _emulations(X, out_dtype, rng):
    """Outputs of correct log_softmax kernels on float32-held rows X: float32 arithmetic in the forms of the
    module docstring, the shared value computed in several orders and moved by a shared error of any size."""
    f32 = np.float32
    Xf = X.astype(f32)
    M = Xf.max(axis=1, keepdims=True)
    z = (Xf - M).astype(f32)  # one float32 subtraction each
    e = np.exp(z.astype(np.float64)).astype(f32)
    outs = []
    for order in ("left", "tree", "reverse"):
        if order == "left":
            D = np.zeros((X.shape[0], 1), f32)
            for j in range(X.shape[1]):
                D = (D + e[:, j : j + 1]).astype(f32)
        elif order == "reverse":
            D = np.zeros((X.shape[0], 1), f32)
            for j in reversed(range(X.shape[1])):
                D = (D + e[:, j : j + 1]).astype(f32)
        else:
            D = e.sum(axis=1, keepdims=True, dtype=f32)
        L = np.log(D.astype(np.float64)).astype(f32)
        for shift in (0.0, 1.0, -37.0, 4096.0):  # a shared error of that many ulps of L: free
            Ls = (L + f32(shift) * np.spacing(np.abs(L) + f32(1e-30))).astype(f32)
            a = (z - Ls).astype(f32)  # form A
            K = (M + Ls).astype(f32)
            b = (Xf - K).astype(f32)  # form B
            outs += [a, b]
            if out_dtype != torch.float32:  # a stage stored in the half format, then the store
                zh = torch.tensor(z).to(out_dtype).float().numpy()
                outs.append((zh - Ls).astype(f32))
    outs.append(torch.log_softmax(torch.tensor(X, dtype=torch.float64), -1).numpy())  # float64, rounded once
    return [torch.tensor(np.asarray(o, np.float64)).to(out_dtype).double().numpy() for o in outs]


def _cases(rng):
    yield rng.standard_normal((4, 64))
    yield rng.standard_normal((2, 300)) * 8
    yield rng.standard_normal((2, 3)) * 30
    yield rng.standard_normal((2, 64)) + 1e4  # large logits: z small against x
    yield np.array([[0.0, -200.0, -3.0], [5.0, 5.0, -90.0]])  # a subnormal-sized y at the maximum, ties
    z = np.array([-2.0, -4.0, -1.0, -0.5])  # differences on binade edges, and one ulp either side
    yield np.stack([np.concatenate([[0.0], z]), np.concatenate([[0.0], np.nextafter(z, 0)]),
                    np.concatenate([[0.0], np.nextafter(z, -8)])]).astype(np.float32).astype(np.float64)  # fmt: skip
    yield np.array([[1.0, -np.inf, 0.5, -np.inf]])  # masked logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_no_correct_kernel_fails(dtype):
    rng = np.random.default_rng(7)
    out = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16, torch.float16: FLOAT16}[dtype]
    for X in _cases(rng):
        X = torch.tensor(X).to(dtype).double().numpy()  # logits as the format holds them
        t = _test(X, _truth(X, dtype), out)
        for o in _emulations(X, dtype, rng):
            T, _ = t.t(o)
            assert np.all(T <= 1.0), (X.shape, T)
            assert t.failures(o) == []


def test_rows_the_bound_cannot_judge_are_skipped():
    X = np.array([[1.0, np.nan, 0.0], [np.inf, 0.0, 1.0], [0.0, 0.0, 0.0]])
    t = _test(X, np.zeros(X.shape))
    B = t.bounds()
    assert np.isinf(B[:2]).all() and np.isfinite(B[2]).all()
    T, _ = t.t(np.array([[5.0, 5.0, 5.0], [9.0, -9.0, 9.0], [0.25, 0.25, 0.25]]))  # a constant: free
    assert np.all(T == 0.0)


def _fp32_rows(seed, rows):
    """(logits as float32 holds them, the truth, torch's float32 log_softmax, the test) of ``rows`` x 64 randn."""
    rng = np.random.default_rng(seed)
    X = torch.tensor(rng.standard_normal((rows, 64))).float().double().numpy()
    ref = _truth(X, torch.float32)
    good = torch.log_softmax(torch.tensor(X).float(), -1).double().numpy()
    return X, ref, good, _test(X, ref)


def test_a_scaled_row_fails_a_constant_does_not():
    X, ref, good, t = _fp32_rows(3, 4)
    assert np.all(t.t(good)[0] == 0.0)
    bad = good.copy()
    bad[1] = (bad[1] * (1 + 2.0**-19)).astype(np.float32)  # 32 u: the row's ends move 6 x 32 u apart
    T, _ = t.t(bad)
    assert T[1] > 1.0 and np.all(T[[0, 2, 3]] == 0.0)
    g = t.failures(bad)
    assert len(g) == 1 and g[0]["index"] == 1 and g[0]["mask"][1].any() and not g[0]["mask"][[0, 2, 3]].any()
    off = (good + 2.0**-10).astype(np.float32).astype(np.float64)  # a constant offset: the shared error's to judge
    assert np.all(t.t(off)[0] <= 1.0) or np.all(np.abs(off - good - 2.0**-10) > 0)


def test_one_element_beyond_the_detectable_size_is_flagged():
    X, ref, good, t = _fp32_rows(5, 2)
    B = t.bounds()
    for j in (0, 17, 63):
        for sign in (1.0, -1.0):
            bad = good.copy()
            d = 2.0 * (B[0, j] + B[0].min())
            bad[0, j] = np.nextafter(np.float32(good[0, j] + sign * d), np.float32(sign * np.inf))  # beyond d
            assert abs(bad[0, j] - good[0, j]) > d
            assert t.t(bad)[0][0] > 1.0
    med, top = t.detectable_ulps(ref)
    assert 1.0 < med <= top < 8.0  # a few ulps of the result: 2 (b_j + min b), b about 3 half-ulps


def test_compare_names_the_row_and_reports_the_finer_power():
    rng = np.random.default_rng(11)
    x = torch.tensor(rng.standard_normal((4, 64)), dtype=torch.float32)
    good = torch.log_softmax(x, -1)
    r = rk.compare(good, "log_softmax", x, -1)
    assert r.verdict in ("exact", "rounding")
    assert r.detectable["element"]["median_ulps"] < 8.0
    bad = good.clone()
    bad[2] = bad[2] * (1 + 2.0**-19)
    r = rk.compare(bad, "log_softmax", x, -1)
    assert r.verdict == "mismatch"
    assert any("row 2" in note["text"] and "disagree among themselves" in note["text"] for note in r.structure)


def test_half_results_and_their_precisions():
    rng = np.random.default_rng(13)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.tensor(rng.standard_normal((4, 256)), dtype=dtype)
        good = torch.log_softmax(x, -1)
        assert rk.compare(good, "log_softmax", x, -1).verdict in ("exact", "rounding")
        bad = good.float()
        bad[1] = bad[1] * (1 + 2.0**-5)  # 4 bf16 ulps: its ends move 16 ulps apart
        r = rk.compare(bad.to(dtype), "log_softmax", x, -1)
        assert r.verdict == "mismatch"
    # a float32 result computed in float32 and stored in bf16 stays the precision it is
    x = torch.tensor(rng.standard_normal((4, 256)), dtype=torch.float32)
    stored = torch.log_softmax(x, -1).to(torch.bfloat16).float()
    r = rk.compare(stored, "log_softmax", x, -1)
    assert (r.verdict, r.precision) == ("reduced-precision", "bf16")
    assert math.isfinite(r.detectable["element"]["median_ulps"])
