"""NVIDIA tensor cores' accumulation, rounded toward zero (refkern.analysis.tensor_cores): the drift by hand,
its fit, and the verdict on GEMMs and convolutions emulated as an H100 computes them with TF32 on (seen on an
H100 with torch 2.11: a float32 linear and conv2d with TF32 on were called mismatch before these models)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import refkern as rk
from refkern.analysis.tensor_cores import BLOCKS, RHO_MAX, drift, fit_drift, orders

U = 2.0**-23  # float32's unit in the last place of 1


def test_constants_by_hand():
    assert RHO_MAX == pytest.approx(1.0, abs=0)
    assert BLOCKS == (1, 2, 4, 8, 16, 32, 64)


def test_drift_by_hand():
    # products 1, 2**-30, -4: partial sums 1, 1 + 2**-30, -3 + 2**-30, whose float32 units are U, U, 2U (the last
    # negative: a step toward zero adds). b = 1: -U - U + 2U = 0; b = 2: steps after the 2nd and the last
    # product, -U + 2U = U; b >= 4: the last only, 2U.
    D = drift(np.array([[1.0, 2.0**-30, -4.0]]), np.ones((1, 3)))
    want = [0.0, U, 2 * U, 2 * U, 2 * U, 2 * U, 2 * U]
    assert D.shape == (1, 7) and D[0].tolist() == pytest.approx(want, abs=0)


def test_a_block_of_zeros_loses_nothing():
    # products 1, 0, 0, 0, 1 with b = 2: after the 2nd product (the block held a 1) -U; after the 4th the block
    # held zeros only (a padded tap): nothing; after the last, s = 2: -2U. b = 1: -U four times at s = 1 would
    # overcount: the zeros' steps are skipped, so -U - 2U as well.
    D = drift(np.array([[1.0, 0.0, 0.0, 0.0, 1.0]]), np.ones((1, 5)))
    assert D[0, 0] == pytest.approx(-3 * U, abs=0) and D[0, 1] == pytest.approx(-3 * U, abs=0)
    assert D[0, 2] == pytest.approx(-U - 2 * U, abs=0)  # b = 4: after the 4th (the 1st was nonzero), the last
    assert D[0, 3] == pytest.approx(-2 * U, abs=0)  # b = 8: the last only


def test_orders_of_a_convolution():
    # 2 channels x 3 taps, terms (c, tap): taps outermost reads c0t0, c1t0, c0t1, c1t1, c0t2, c1t2
    assert orders(1, 6) == [None]
    perm = orders(3, 6)[1]
    assert perm.tolist() == [0, 3, 1, 4, 2, 5]
    L = np.array([[1.0, 0.0, 0.0, 1.0, 0.0, 0.0]])  # c0t0 = 1, c1t0 = 1: adjacent in the taps-major order
    D = drift(L, np.ones_like(L), taps=3)
    assert D.shape == (1, 14)
    assert D[0, 7 + 1] == pytest.approx(-2 * U, abs=0)  # taps-major, b = 2: one step after both ones, s = 2
    assert D[0, 1] == pytest.approx(-U - 2 * U, abs=0)  # channel-major, b = 2: s = 1 after the 1st pair, 2 later


def test_fit_by_hand():
    c, var = np.zeros(4), np.ones(4)
    D = np.array([[1.0, 0.0], [2.0, 1.0], [-1.0, 3.0], [0.5, -1.0]])
    out, j, rho = fit_drift(0.5 * D[:, 1], c, var, D)  # the second column, half a unit per step
    assert (j, rho) == (1, pytest.approx(0.5, abs=1e-15)) and out == pytest.approx(0.5 * D[:, 1], abs=1e-15)
    out, j, rho = fit_drift(3.0 * D[:, 0], c, var, D)  # more than one unit per step: clipped to RHO_MAX
    assert (j, rho) == (0, pytest.approx(1.0, abs=0))
    out, j, rho = fit_drift(-D[:, 0], c, var, D[:, :1])  # away from zero: no drift does that (rho clipped to 0)
    assert rho == pytest.approx(0.0, abs=0) and out.tolist() == c.tolist()


def _tf32(x, mode):
    """float32 values to TF32 (10 stored bits): ties to even, or truncated."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    if mode == "nearest":
        b = b + 0xFFF + ((b >> 13) & 1)
    return ((b >> 13) << 13).astype(np.uint32).view(np.float32).astype(np.float64)


def _toward_zero(x):
    f = x.astype(np.float32).astype(np.float64)
    over = np.abs(f) > np.abs(x)
    f[over] = np.nextafter(f[over].astype(np.float32), np.float32(0)).astype(np.float64)
    return f


def _tensor_core_gemm(A, B, mode="nearest", block=8):
    """A @ B as a tensor core does (Fasi et al. 2021, simplified): TF32 inputs, each block of ``block`` exact
    products added to the float32 accumulator and the sum truncated toward zero."""
    A, B = _tf32(A, mode), _tf32(B, mode)
    C = np.zeros((A.shape[0], B.shape[1]))
    for k in range(0, A.shape[1], block):
        C = _toward_zero(C + A[:, k:k + block] @ B[k:k + block, :])
    return C


def _linear_case(K=1024, mode="nearest", block=8):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(32, K, generator=g), torch.randn(96, K, generator=g), torch.randn(96, generator=g)
    C = _tensor_core_gemm(x.double().numpy(), w.double().numpy().T, mode, block)
    return x, w, b, torch.from_numpy(_toward_zero(C + b.double().numpy())).float()


@pytest.mark.parametrize("mode,block", [("nearest", 8), ("nearest", 4), ("truncated", 16)])
def test_tensor_core_linear_is_tf32(mode, block):
    x, w, b, out = _linear_case(mode=mode, block=block)
    rep = rk.compare(out, "linear", x, w, b)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "tf32"), str(rep)
    assert "tensor-core" in rep.model


def test_tensor_core_linear_with_a_bug_is_a_mismatch():
    x, w, b, out = _linear_case()
    for bug in (out.double() * (1 + 3e-5), out.double() * (1 - 1e-3), out.double() - b.double()):
        rep = rk.compare(bug.float(), "linear", x, w, b)
        assert rep.verdict == "mismatch", str(rep)


def test_tensor_core_conv2d_taps_major_is_tf32():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 32, 12, 12, generator=g), torch.randn(16, 32, 3, 3, generator=g)
    cols = F.unfold(x.double(), 3, padding=1).reshape(2, 32, 9, -1).permute(0, 2, 1, 3).reshape(2, 288, -1)
    W = w.double().permute(0, 2, 3, 1).reshape(16, 288)  # NHWC implicit GEMM: taps outermost, channels inner
    out = np.stack([_tensor_core_gemm(W.numpy(), cols[n].numpy()) for n in range(2)]).reshape(2, 16, 12, 12)
    rep = rk.compare(torch.from_numpy(out).float(), "conv2d", x, w, padding=1)
    assert (rep.verdict, rep.precision) == ("reduced-precision", "tf32"), str(rep)


def test_cuda_division_by_a_scalar_is_a_product_by_its_reciprocal():
    # torch's CUDA div(a, b) with b a CPU scalar computes a * fl32(1 / b) (refkern.torch._bits.reciprocal_product):
    # written here with numpy's float32 arithmetic, on values where it differs from the quotient in the last bit
    from refkern.torch._bits import times_reciprocal

    a = np.float32(np.arange(1, 2000)) * np.float32(0.37)
    b = 2.0794415416798357  # T5's log(max_distance / max_exact) = log(8)
    want = a * (np.float32(1) / np.float32(b))
    assert (want != a / np.float32(b)).sum() > 0  # the case the audit must accept
    got = times_reciprocal(torch.from_numpy(a), b, torch.float32).numpy()
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    ah = torch.from_numpy(a[:50]).half()
    half = times_reciprocal(ah, b, torch.float16)  # in float32, rounded once
    assert half.tolist() == torch.from_numpy(ah.float().numpy() * (np.float32(1) / np.float32(b))).half().tolist()


def test_same_bits_by_hand():
    # the audit's bit comparison: a NaN pair is equal whatever its payload, -0 and +0 differ, an inf against a
    # finite value differs with no finite ulp count; the largest finite ulp distance and the first index come back
    from refkern.torch._bits import _same_bits

    a = torch.tensor([1.0, float("nan"), -0.0, 2.0, float("inf"), 1.0], dtype=torch.float32)
    e = torch.tensor([1.0, float("nan"), 0.0, 2.0 + 2.0**-22, 1.0, 1.0], dtype=torch.float32)
    e.view(torch.int32)[1] = 0x7FC00001  # another NaN payload
    n, nd, ulp, first = _same_bits(a, e)
    assert (n, nd, first) == (6, 3, 2)
    assert ulp == pytest.approx(2.0**-22 / (2.0**-23 * (2.0 + 2.0**-22)), abs=0)
    assert _same_bits(torch.arange(4), torch.tensor([0, 1, 3, 3])) == (4, 1, float("inf"), 2)
