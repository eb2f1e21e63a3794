"""The filter's compensated device stage (refkern.engines.filter_compensated): its constants written out by hand
with the inequalities of their derivation, and the kernel itself, run on the CPU by Numba's CUDA simulator in a
subprocess, over tests/test_filter.py's adversarial set: the interval always holds the exact sum (Python
fractions), every element it decides is refkern.truth bit for bit, and without tau (the additions' errors) some
element is decided wrongly, so the compensation is what the decisions rest on. On a CUDA device (``-m gpu``): the
stage runs and decides nearly every element the norm bound leaves at 4096^3."""

import os
import subprocess
import sys
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from refkern.engines import filter_compensated as fc  # noqa: E402

U = Fraction(1, 2**53)


def test_constants_written_by_hand():
    assert fc.THREADS == 128
    assert fc.C_S == pytest.approx(3 * 2.0**-53, abs=0)
    assert fc.TINY == pytest.approx(2.0**-1000, abs=0)
    assert fc.terms(4096, True) == 4096 + 1 + 256 and fc.terms(4096, False) == 4352
    assert fc.c_q(4353) == pytest.approx(4353 * 2.0**-53 * (1 + 2.0**-10), abs=0)
    with pytest.raises(ValueError, match=r"^c_q: expects 0 < N < 2\*\*30 errors; got 1073741824\.$"):
        fc.c_q(2**30)


@pytest.mark.parametrize("n", [2, 300, 4353, 2**20, 2**30 - 1])
def test_the_radius_covers_its_derivation(n):
    """e (1 - u) >= gamma_{N-1} / (1 - gamma_{N-1}) Q + 2 u |s| / (1 - u) with e's four roundings each losing a
    factor (1 - u) (the module docstring), in exact rational arithmetic: C_Q (1 - u)**4 against the first term's
    factor, C_S (1 - u)**4 against the second's."""
    g = (n - 1) * U / (1 - (n - 1) * U)
    need_q = g / (1 - g)
    assert need_q <= (n - 1) * U * (1 + Fraction(1, 2**21))
    assert Fraction(fc.c_q(n)) * (1 - U) ** 5 >= need_q
    assert Fraction(fc.C_S) * (1 - U) ** 5 >= 2 * U / (1 - U)


_SIMULATED = r"""
import os, sys
from fractions import Fraction
import numpy as np, torch
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from refkern.engines import filter_compensated as fc, filter_device as fd
from refkern import truth
fc.THREADS = 4  # the simulator reads it at run time: 4 threads per block keep the Python threads few
import test_filter as tf

assert fc.available(), fc.reason()
outside = wrong = decided = wrong_without_tau = 0
for name, a, b, bias in tf._adversarial():
    p, A3, Bt3, ia, ib, b64, shape = tf._operands(a, b, bias)
    A = torch.from_numpy(A3[ia]).float()
    B = torch.from_numpy(np.ascontiguousarray(Bt3[ib])).float()
    nt, m, n = A.shape[0], A.shape[1], B.shape[1]
    t, i, j = (x.reshape(-1) for x in torch.meshgrid(torch.arange(nt), torch.arange(m), torch.arange(n), indexing="ij"))
    bv = None if b64 is None else torch.from_numpy(b64.copy())[j]
    sigma, tau, q = fc.sums(A, B, t, i, j, bv)
    lo, hi = fc.interval(sigma, tau, q, A.shape[2], bv is not None)
    r, und = fd.decide_ends(lo, hi, p.out.name)
    exact = (truth.matmul(a, b) if bias is None else truth.linear(a, b.T.contiguous(), bias)).double().numpy().reshape(-1)
    got = r.double().numpy()
    dec = ~und.numpy()
    decided += int(dec.sum())
    wrong += int((got[dec].view(np.int64) != exact[dec].view(np.int64)).sum())
    A64, B64 = A.double().numpy(), B.double().numpy()
    for e in range(t.shape[0]):
        if not (np.isfinite(A64[t[e], i[e]]).all() and np.isfinite(B64[t[e], j[e]]).all()):
            assert und[e], "an element with an inf or NaN term was decided"
            continue
        terms = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(A64[t[e], i[e]], B64[t[e], j[e]])]
        s = sum(terms) + (Fraction(float(bv[e])) if bv is not None else 0)
        if not Fraction(float(lo[e])) <= s <= Fraction(float(hi[e])):
            outside += 1
    e0 = sigma.abs() * fc.C_S + fc.TINY  # tau dropped: sigma alone, as if its additions were exact
    r0, u0 = fd.decide_ends(sigma - e0, sigma + e0, p.out.name)
    d0 = ~u0.numpy()
    wrong_without_tau += int((r0.double().numpy()[d0].view(np.int64) != exact[d0].view(np.int64)).sum())
# a term lost inside thread 0's sum (k = 0 and k = THREADS), then the leading terms cancel at the tree's first merge
# (thread 0 with thread THREADS / 2) before 2**-100 joins: S = 2**-60 + 2**-100, sigma alone is 2**-100
for dtype in (torch.float32, torch.bfloat16):
    A = torch.zeros(1, 1, 2 * fc.THREADS)
    B = torch.zeros(1, 1, 2 * fc.THREADS)
    for k, (x, y) in {0: (1.0, 1.0), fc.THREADS // 2: (-1.0, 1.0), 1: (2.0**-50, 2.0**-50),
                         fc.THREADS: (2.0**-30, 2.0**-30)}.items():
        A[0, 0, k], B[0, 0, k] = x, y
    z = torch.zeros(1, dtype=torch.int64)
    sigma, tau, q = fc.sums(A.to(dtype).float(), B.to(dtype).float(), z, z, z, None)
    name = str(dtype).removeprefix("torch.")
    r, und = fd.decide_ends(*fc.interval(sigma, tau, q, A.shape[2], False), name)
    decided += int(not und[0])
    wrong += int(und[0] or float(r[0]) != 2.0**-60)
    e0 = sigma.abs() * fc.C_S + fc.TINY
    r0, u0 = fd.decide_ends(sigma - e0, sigma + e0, name)
    wrong_without_tau += int(not u0[0] and float(r0[0]) != 2.0**-60)
print("RESULT", outside, wrong, decided, wrong_without_tau)
"""


def _simulate(script, timeout=900):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_simulated_kernel_over_the_adversarial_set():
    line = [x for x in _simulate(_SIMULATED).splitlines() if x.startswith("RESULT")][0]
    outside, wrong, decided, wrong_without_tau = map(int, line.split()[1:])
    assert outside == 0, "an interval misses the exact sum"
    assert wrong == 0, "a decided element is not refkern.truth"
    assert decided > 1000
    assert wrong_without_tau > 0, "the compensation decides nothing the plain sum would get wrong: the test is blind"


_DEVICE = r"""
import numpy as np, torch
import refkern as rk
from refkern.engines import filter_compensated as fc, filter_device as fd
fc.THREADS = 4
fd.Device.force_compensated = True
rng = np.random.default_rng(3)
for dtype in ("float32", "bfloat16", "float16"):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = rng.standard_normal((64, 6)).astype(np.float32)
    x[:, 1::2] = -x[:, ::2]
    y[1::2] = y[::2]
    x[:, 62], x[:, 63] = 0, 2.0**-20
    x[:, 5] *= 1.0001
    a = torch.from_numpy(x).to(getattr(torch, dtype))
    b = torch.from_numpy(y).to(getattr(torch, dtype))
    bias = torch.from_numpy(rng.standard_normal(6).astype(np.float32)).to(a.dtype)
    for bb in (None, bias):
        got, st = fd.matmul(a, b, bb)
        want = rk.linear(a, b.T.contiguous(), bb, engine="numba") if bb is not None else rk.matmul(a, b, engine="numba")
        same = torch.equal(got.float().view(torch.int32), want.float().view(torch.int32))
        print("RESULT", dtype, bb is not None, same, st["undecided_first"], st.get("undecided_after_compensated", -1))
"""


def test_simulated_device_path_is_bit_identical_to_the_numba_engine():
    """filter_device.matmul with the compensated stage (forced on CPU tensors, the simulator): cancelling pairs of
    terms onto one small term, the same bits as the Numba engine; the stage ran where the norm bound left elements."""
    rows = [x.split()[1:] for x in _simulate(_DEVICE).splitlines() if x.startswith("RESULT")]
    assert len(rows) == 6
    assert all(r[2] == "True" for r in rows), rows
    assert any(r[0] == "float32" and int(r[3]) > 0 and int(r[4]) == 0 for r in rows), rows  # it ran, decided all


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_compensated_stage_4096():
    """4096^3 float32 on the device: the stage compiles there and leaves at most a thousandth of the elements the
    norm bound left (an H200, torch 2.11: 79,384 -> 1; this test passed there); rows 0..31 are the Numba engine's
    bits."""
    import refkern as rk
    from refkern.engines import filter_device as fd

    assert fc.available(), fc.reason()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", generator=g)
    b = torch.randn(4096, 4096, device="cuda", generator=g)
    got, st = fd.matmul(a, b)
    assert st["undecided_after_compensated"] <= st["undecided_first"] // 1000, st
    want = rk.matmul(a[:32].cpu(), b.cpu(), engine="numba")
    assert torch.equal(got[:32].cpu().view(torch.int32), want.view(torch.int32))
