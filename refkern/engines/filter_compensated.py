"""The filter's last device stage: each undecided element's sum recomputed with error-free transformations
(issue 27, point 4).

After the float64 GEMM and its norm bound (:mod:`refkern.engines.filter_device`), a few elements per
thousand of a float32 product are undecided: their interval ``gamma_K T`` holds a rounding boundary.
Here one CUDA block per such element reads its row of A and of B once (float32, coalesced, in
THREADS-wide strides), forms each product exactly in float64 and adds it with Knuth's TwoSum, keeping
the rounding error of every addition; the block's partial sums are merged by TwoSum in a tree. Three
float64 numbers come back per element: the sum ``sigma``, the float64 sum ``tau`` of the additions'
errors and the float64 sum ``Q`` of their absolute values. One launch, no gathered copies: the
pairwise stage it replaces on a GPU gathered ``2 K`` operands per element into temporaries and the
``|A| |B|`` GEMM cost a whole GEMM (H100, 4096**3 float32: 79,384 elements, 32.7 ms of device time
against 2.2 ms for the GEMM).

**The bound** (:func:`interval`). TwoSum (Knuth, TAOCP vol. 2, 4.2.2; six operations, round to nearest,
no overflow) gives ``a + b = h + err`` exactly, for every pair of float64 numbers, subnormals included.
Every term (the K exact products, the bias, and the zeros each thread starts from) enters ``sigma``
through TwoSums only, so the exact sum is ``S = sigma + sum(err)`` over the N <= K + 1 + 2 THREADS
errors (one TwoSum per term and per merge, plus the zero each thread's ``tau`` and ``Q`` start from).
``tau`` and ``Q`` are float64 sums of those N numbers in one tree (each thread's in order, then the
block's merges); any summation of N terms errs by at most ``gamma_{N-1}`` times the sum of their
absolute values (Higham, *Accuracy and Stability*, 2nd ed., 4.2), so ``|tau - sum err| <=
gamma_{N-1} E`` and ``Q >= (1 - gamma_{N-1}) E``, E = sum |err|: ``|S - (sigma + tau)| <=
gamma_{N-1} / (1 - gamma_{N-1}) Q``. With ``s = fl(sigma + tau)`` (one more rounding, ``u |s| / (1 -
u)``) and the ends ``fl(s -+ e)`` (each ``u (|s| + e)`` off at most; an addition whose result is
subnormal is exact), S lies between the ends when ``e (1 - u) >= gamma_{N-1} / (1 - gamma_{N-1}) Q
+ 2 u |s| / (1 - u)``. The radius used (:func:`interval`) is ``e = fl(fl(fl(C_Q Q) + fl(C_S |s|)) + TINY)``, C_Q =
N u (1 + 2**-10), C_S = 3 u, TINY = 2**-1000: for N < 2**30, ``gamma_{N-1} / (1 - gamma_{N-1}) <=
(N - 1) u (1 + 2**-21)``, and the four roundings of e lose at most a factor ``(1 - u)**4`` (C_Q's
2**-10 and C_S's third u cover them and e's own ``1 - u``) plus three underflows of at most 2**-1075
(TINY covers them). The ends are rounded as in :func:`refkern.engines.filter_device.decide_ends`: both
equal and nonzero decides the element (rounding is monotonic); a zero result's sign is the exact
path's. Since ``E <= gamma_K T`` (each error at most u times its partial sum), e is about
``K u**2 T``: at K = 4096 some ``2**-94 T``, so only elements whose exact sum lies within about
2**-70 of a float32 boundary, relative, stay undecided (exact midpoints, ties: the adversarial set).

**Assumptions, checked.** Products of float32, bfloat16 and float16 numbers are exact in float64
(24 + 24 bits; the smallest, 2**-298, is a normal float64) and finite sums of them do not overflow
(``K 2**256 < 2**1023`` for K < 2**40): an inf or NaN term makes sigma, tau or Q inf or NaN, the ends
never compare equal and the element stays undecided. The kernel is compiled with ``fastmath=False``
(no flush to zero, no contraction of a multiply and an add: the only multiply forms an exact product,
so a contraction would change nothing anyway), and its operands are float32 (the narrow formats
widen to float32 exactly).

**Where it runs.** On a CUDA device through Numba's CUDA target (:func:`available` says whether it
compiles there; otherwise the device keeps its |A| |B| and pairwise stages). Its tests run the same
kernel on the CPU under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, a subprocess)."""

import contextlib
import os

import numpy as np

__all__ = ["THREADS", "C_S", "TINY", "terms", "c_q", "available", "sums", "interval"]

THREADS = 128  # threads per element: one block reads a row of A and of B in 512-byte strides
C_S = 3 * 2.0**-53  # the radius's share for s's rounding and the ends' (module docstring)
TINY = 2.0**-1000  # covers three underflowing roundings of the radius (module docstring)
_N_MAX = 1 << 30  # c_q's derivation needs N below this


def terms(k, has_bias):
    """N, the number of errors summed into tau and Q: a TwoSum per term (K products, the bias) and per
    merge of THREADS partial sums, and the zeros the threads start from (module docstring)."""
    return k + int(bool(has_bias)) + 2 * THREADS


def c_q(n):
    """C_Q = N u (1 + 2**-10), exact in float64 (N < 2**30 times an 11-bit factor)."""
    if not 0 < n < _N_MAX:
        raise ValueError(f"c_q: expects 0 < N < 2**30 errors; got {n}.")
    return n * 2.0**-53 * (1 + 2.0**-10)


_KERNEL = None
_REASON = None


def _simulated():
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


cuda = None  # numba.cuda, imported by _kernel() (a module global: the simulator swaps it for its own)


def _body(A, B, t, i, j, bias, out):
    """One block per element (a grid-stride loop over them): each thread sums a THREADS-strided slice of
    the products with TwoSum, then the block merges its partial sums by TwoSum in a tree (module
    docstring). out[:, el] = sigma, tau, Q."""
    tid = cuda.threadIdx.x
    sh = cuda.shared.array((3, THREADS), np.float64)
    n = t.shape[0]
    k_len = A.shape[2]
    el = cuda.blockIdx.x
    while el < n:
        ti, ii, jj = t[el], i[el], j[el]
        s = 0.0
        tau = 0.0
        q = 0.0
        k = tid
        while k < k_len:
            x = np.float64(A[ti, ii, k]) * np.float64(B[ti, jj, k])  # exact
            h = s + x
            z = h - s
            err = (s - (h - z)) + (x - z)  # TwoSum: s + x = h + err exactly
            s = h
            tau += err
            q += abs(err)
            k += THREADS
        if tid == 0 and bias.shape[0] > 0:
            x = bias[el]
            h = s + x
            z = h - s
            err = (s - (h - z)) + (x - z)
            s = h
            tau += err
            q += abs(err)
        sh[0, tid] = s
        sh[1, tid] = tau
        sh[2, tid] = q
        cuda.syncthreads()
        w = THREADS // 2
        while w > 0:
            if tid < w:
                a = sh[0, tid]
                b = sh[0, tid + w]
                h = a + b
                z = h - a
                err = (a - (h - z)) + (b - z)
                sh[0, tid] = h
                sh[1, tid] = (sh[1, tid] + sh[1, tid + w]) + err
                sh[2, tid] = (sh[2, tid] + sh[2, tid + w]) + abs(err)
            cuda.syncthreads()
            w //= 2
        if tid == 0:
            out[0, el] = sh[0, 0]
            out[1, el] = sh[1, 0]
            out[2, el] = sh[2, 0]
        cuda.syncthreads()  # the next element reuses sh
        el += cuda.gridDim.x


SIGNATURE = ("void(float32[:, :, ::1], float32[:, :, ::1], int64[::1], int64[::1], int64[::1], float64[::1], "
             "float64[:, ::1])")  # A, B, t, i, j, bias, out: C-contiguous, the one signature


@contextlib.contextmanager
def _numpy_row_stack():
    """numba-cuda registers an overload of ``np.row_stack`` when its target loads; numpy 2.5 removed
    that alias of ``np.vstack``, and the registration then fails (seen on an H200 image: numba 0.68.0,
    its numba-cuda, numpy 2.5.2: "module 'numpy' has no attribute 'row_stack'"). The alias is lent for
    the import and the (eager) compilation only, then taken back: numpy is left as it was."""
    lent = not hasattr(np, "row_stack")
    if lent:
        setattr(np, "row_stack", np.vstack)  # noqa: B010 (the name numpy 2.5 no longer has)
    try:
        yield
    finally:
        if lent:
            delattr(np, "row_stack")  # noqa: B010


def _kernel():
    """The CUDA kernel, compiled once for its one signature (Numba's CUDA target, imported only here)."""
    global _KERNEL, cuda
    if _KERNEL is None:
        with _numpy_row_stack():
            from numba import cuda as numba_cuda

            cuda = numba_cuda
            _KERNEL = numba_cuda.jit(SIGNATURE, fastmath=False)(_body)
    return _KERNEL


def available():
    """Whether the kernel compiles and runs here (a CUDA device with Numba's CUDA target, or the
    simulator); the reason it does not is kept in ``reason()``. Checked once, on two elements whose sums
    are exact in float64."""
    global _REASON
    if _REASON is not None:
        return _REASON == ""
    try:
        import torch

        dev = "cpu" if _simulated() else "cuda"
        a = torch.tensor([[[1.0, 2.0**-30, 3.0]]], dtype=torch.float32, device=dev)
        b = torch.tensor([[[1.0, 1.0, -3.0], [2.0, 0.5, 0.25]]], dtype=torch.float32, device=dev)
        zero = torch.zeros(2, dtype=torch.int64, device=dev)
        sigma, tau, _ = sums(a, b, zero, zero, torch.arange(2, device=dev), None)
        got = tuple((sigma + tau).cpu().tolist())
        want = (1.0 + 2.0**-30 - 9.0, 2.0 + 2.0**-31 + 0.75)
        _REASON = "" if got == want else f"the kernel's check gave {got}, expected {want}"
    except Exception as exc:  # no CUDA target, no device, a compile failure: the device keeps its stages
        _REASON = f"{type(exc).__name__}: {exc}"
    return _REASON == ""


def reason():
    return _REASON


def _launch(A, B, t, i, j, bias, torch_mod):
    """Run the kernel; numpy arrays (the simulator) or CUDA torch tensors (``torch_mod`` given).
    Returns out (3, n): sigma, tau, Q."""
    kernel = _kernel()
    n = t.shape[0]
    blocks = max(1, min(n, 1 << 20))
    if torch_mod is None:
        out = np.empty((3, n))
        kernel[blocks, THREADS](A, B, t, i, j, bias, out)
        return out
    from numba import cuda as numba_cuda

    out = torch_mod.empty((3, n), dtype=torch_mod.float64, device=A.device)
    torch_mod.cuda.synchronize(A.device)
    args = [numba_cuda.as_cuda_array(x) for x in (A, B, t, i, j, bias, out)]
    kernel[blocks, THREADS](*args)
    numba_cuda.synchronize()
    return out


def sums(A32, B32, t, i, j, bias):
    """(sigma, tau, Q) for the elements (t, i, j) of A32[t] @ B32[t]^T (+ bias): float32 torch tensors
    (T, M, K) and (T, N, K), int64 index tensors, ``bias`` a float64 tensor of t's length or None; on a
    CUDA device, or CPU tensors under the simulator. Three float64 tensors on their device."""
    import torch

    k = A32.shape[2]
    if not 0 < terms(k, bias is not None) < _N_MAX:
        raise ValueError(f"sums: expects K below 2**30 - 2 THREADS; got K = {k}.")
    if A32.device.type == "cuda":
        b = torch.zeros(0, dtype=torch.float64, device=A32.device) if bias is None else bias.contiguous()
        out = _launch(A32.contiguous(), B32.contiguous(), t.contiguous(), i.contiguous(), j.contiguous(), b, torch)
    else:
        if not _simulated():
            raise RuntimeError("sums: the kernel runs on a CUDA device, or on the CPU only under Numba's CUDA "
                               "simulator (NUMBA_ENABLE_CUDASIM=1).")  # fmt: skip
        b = np.zeros(0) if bias is None else bias.numpy()
        out = torch.from_numpy(_launch(A32.numpy(), B32.numpy(), t.numpy(), i.numpy(), j.numpy(), b, None))
    return out[0], out[1], out[2]


def interval(sigma, tau, q, k, has_bias):
    """(lo, hi): float64 tensors whose interval holds each element's exact sum, from the kernel's
    sigma, tau and Q (module docstring: the radius e and why the ends fl(s -+ e) hold it)."""
    s = sigma + tau
    e = (q * c_q(terms(k, has_bias)) + s.abs() * C_S) + TINY
    return s - e, s + e
