"""An accumulator that rounds toward zero: NVIDIA's tensor cores, and the drift it leaves.

A float32 GEMM on an NVIDIA tensor core (TF32 on, the default of cuDNN's convolutions; float16 and
bfloat16 inputs into a float32 accumulator) adds its products in blocks: the block's products exact,
aligned to the largest exponent with the shifted-out bits dropped, the sum normalised by truncation
(Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021).
Each such step loses, toward zero, a fraction ``theta_k`` in ``[0, 1)`` of a unit in the last place of
the running sum. Round-to-nearest errors are symmetric and average out; these do not: over K products
the losses add up to a drift toward zero that grows like K / b (b the products per step), while the
noise grows like sqrt(K). On an H100 (torch 2.11, cuBLAS, K = 4096) a float32 ``linear`` with TF32 on
was a ``mismatch``, 8.09 times float32's noise scale (``benchmarks/gpu_check.py``); an emulation (TF32
inputs, blocks of 8 products truncated) gives 7.76 and reads 0.999989 times what TF32 inputs with
round-to-nearest accumulation give, 239 standard errors of the verdict's scale test.

**The model.** Along the products' order, with ``s_k`` the exact partial sums of the rounded inputs'
products and ``ulp(s)`` float32's unit in the last place of ``s``, a kernel that rounds its running sum
after every ``b`` products drifts by about ``rho D_b``::

    D_b = - sum_(j = 1 .. ceil(K / b)) sign(s_(min(j b, K))) ulp(s_(min(j b, K))),

``rho`` the mean fraction of a unit each step loses: 1/2 for roughly uniform dropped bits, and in
``[0, 1]`` always (a step loses less than one unit of its own result, ``|result| <= |s_k|``). The
kernel's blocking is unknown (the MMA instruction's K, 8 for TF32 on Ampere and Hopper; a split K), and
so is its order of the K terms where the operands have structure: an implicit-GEMM convolution on
tensor cores runs the taps outermost and the channels innermost (NHWC), refkern's terms run each
channel's taps together. The order matters here: ``D_b`` taken along another order than the kernel's
is the kernel's drift plus a difference of two drifts of its own size (two paths' signs and partial
sums), and least squares against such a regressor shrinks ``rho`` toward 0 (regression dilution): an
emulated H100 conv2d (K = 576, blocks of 8 in the taps-major order) fitted along the channel-major
order left a 74-standard-error scale residual. So ``D_b`` is formed along each order of ``orders``
(the K order itself; for convolutions also the taps-major one) for each ``b`` of ``BLOCKS``, and
``rho`` is fitted on the output by weighted least squares on the model's own scale, the column that
leaves the least weighted squared residual kept (:func:`fit_drift`): a discrete choice among 7 or 14
and one parameter, a shrink toward zero of at most one unit per product. What remains is noise within
the order-free scale ``(1 + gamma_n) u sqrt(n + 1) M`` the model carries.
Drifts with one step per product (``b = 1``) left a 9-standard-error scale residual on a million
elements of a K = 64 gradient computed with ``b = 8``: the last steps' partial sums follow ``y`` more
than the average step's, hence the blocks. A bug that scales the output up, down by more than such a
drift, or any part of it, is still a bug: the fitted shift is the same fraction of every element's own
``D_b`` (measured: a 3e-5 shrink of an emulated H100 linear, K = 4096, 0.4 times the spread of correct
tensor-core kernels, is a mismatch).
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["drift", "orders", "fit_drift", "RHO_MAX", "BLOCKS"]

RHO_MAX = 1.0  # at most one unit in the last place lost per rounding step (module docstring)
BLOCKS = (1, 2, 4, 8, 16, 32, 64)  # products per rounding step tried (module docstring)


@jit(parallel=True, error_model="numpy")
def _drift(L, R, blocks, out):
    """out[s, j] = D_b of the module docstring for b = blocks[j]: the running sum of L[s] * R[s] (float64)
    rounded, toward zero, after every b-th product and after the last, where the block added a nonzero
    product (a block of zeros, a convolution's padding, leaves a stored sum as it is: nothing lost)."""
    K, nb = L.shape[1], blocks.size
    for s in prange(L.shape[0]):
        acc = 0.0
        moved = np.zeros(nb, np.bool_)
        for k in range(K):
            t = L[s, k] * R[s, k]
            acc += t
            step = 0.0
            a = abs(acc)
            if a > 0.0 and a < math.inf:
                m, e = math.frexp(a)  # a = m 2**e, m in [0.5, 1): float32's unit is 2**(e - 24)
                u = math.ldexp(1.0, max(e, -125) - 24)  # subnormal float32: the unit 2**-149
                step = -u if acc > 0.0 else u
            for j in range(nb):
                moved[j] = moved[j] or t != 0.0
                if (k + 1) % blocks[j] == 0 or k == K - 1:
                    if moved[j]:
                        out[s, j] += step
                    moved[j] = False


def orders(taps: int, K: int) -> list:
    """The orders ``D`` is formed along (module docstring): None (the terms' own order) and, for a
    convolution of ``taps`` taps per channel (``K = channels * taps``), the permutation of its terms that
    runs the taps outermost."""
    if taps <= 1 or K % taps:
        return [None]
    return [None, np.arange(K).reshape(K // taps, taps).T.reshape(-1)]


def drift(L, R, taps: int = 1) -> np.ndarray:
    """``D_b`` of the module docstring for each row of ``L`` and ``R`` (the rows' rounded inputs, in
    the terms' order), along each order of :func:`orders` and for each ``b`` of ``BLOCKS``: a float64
    array of shape (rows, len(orders) * len(BLOCKS))."""
    perms = orders(taps, L.shape[1])
    out = np.zeros((L.shape[0], len(perms) * len(BLOCKS)))
    if L.size:
        blocks = np.asarray(BLOCKS, np.int64)
        for i, p in enumerate(perms):
            Lp, Rp = (L, R) if p is None else (L[:, p], R[:, p])
            part = np.zeros((L.shape[0], len(BLOCKS)))
            _drift(np.ascontiguousarray(Lp, np.float64), np.ascontiguousarray(Rp, np.float64), blocks, part)
            out[:, i * len(BLOCKS):(i + 1) * len(BLOCKS)] = part
    return out


def fit_drift(actual, c, var, D) -> tuple:
    """``(c + rho D_j, j, rho)``: for each column ``D_j`` of ``D`` (:func:`drift`), ``rho_j = sum w (a - c)
    D_j / sum w D_j**2`` over the finite elements, ``w = 1 / var``, clipped to ``[0, RHO_MAX]`` (the module
    docstring's bound); the column whose fit leaves the least ``sum w (a - c - rho_j D_j)**2`` is kept
    (no drift, ``j`` None, where nothing is finite)."""
    with np.errstate(all="ignore"):
        ok = np.isfinite(actual) & np.isfinite(c) & np.isfinite(D).all(axis=1) & (var > 0) & np.isfinite(var)
        w = np.where(ok, 1.0 / np.where(ok, var, 1.0), 0.0)
        r = np.where(ok, actual - c, 0.0)
        Dk = np.where(ok[:, None], D, 0.0)
        den = (w[:, None] * Dk * Dk).sum(axis=0)
        rho = np.clip(np.where(den > 0, (w[:, None] * r[:, None] * Dk).sum(axis=0) / np.where(den > 0, den, 1.0),
                               0.0), 0.0, RHO_MAX)  # fmt: skip
        rss = (w[:, None] * (r[:, None] - rho * Dk) ** 2).sum(axis=0)
    if not ok.any() or not (den > 0).any():
        return c, None, 0.0
    j = int(np.argmin(rss))
    return c + rho[j] * np.where(np.isfinite(D[:, j]), D[:, j], 0.0), j, float(rho[j])
