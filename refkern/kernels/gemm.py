"""``refkern.matmul`` and ``refkern.linear``: torch semantics, every output element reduced
by a named method (correctly rounded with the default ``accumulate="exact"``)."""

import numpy as np

import refkern.engines as engines
from refkern._arrays import is_tensor
from refkern.engines import filter as filt
from refkern.engines import run_gemm
from refkern.kernels._common import deliver, finish, plan
from refkern.kernels._element import EXACT
from refkern.kernels._gemm_numba import linear_operands, matmul_operands, run_numba
from refkern.scale._dispatch import dask_in, to_dask

__all__ = ["matmul", "linear", "matmul_operands", "linear_operands", "run_gemm", "run_numba"]


def _acc(p):
    return "exact" if p.method == EXACT else "other"


def _device(*xs):
    """The device of the first tensor argument not on the CPU (None: compute on the CPU)."""
    for x in xs:
        if is_tensor(x) and x.device.type != "cpu":
            return x.device
    return None


def _run(p, engine, A3, Bt3, ia, ib, bias, shape, device, names):
    """run_gemm's values, by the engine that ``engine`` names for this GEMM; ``names``: the
    operands of A3, Bt3 and the bias."""
    m, n, k = A3.shape[1], Bt3.shape[1], A3.shape[2]
    chosen = engines.choose(engine, _acc(p), m * len(ia), n, k, device, filterable=filt.applies(p))
    if chosen != "filter":
        Bt3 = np.ascontiguousarray(Bt3)  # matmul's operands may hold B^T as a view (the filter takes it so)
    if chosen == "blas":
        from refkern.engines.blas import run_batched

        formats = tuple(p.ops[k].fmt if p.ops.get(k) is not None else None for k in names)
        return run_batched(p, A3, Bt3, ia, ib, bias, shape, formats, device)
    if chosen == "filter":
        return filt.gemm(p, A3, Bt3, ia, ib, bias, shape, device=device)[0]
    return run_numba(p, A3, Bt3, ia, ib, bias, shape)[0]


def _cuda(t) -> bool:
    """Whether ``t`` is a torch tensor on a CUDA device (one place, so a test can stand a CPU tensor in)."""
    return getattr(getattr(t, "device", None), "type", None) == "cuda"


def _on_device(engine, accumulate, accum_dtype, a, b, bias=None):
    """``a @ b (+ bias)`` exactly by the filter's device path (:func:`refkern.engines.filter_device.matmul`:
    the float64 GEMM and the decision on the device, the few undecided elements exact on the CPU), as a
    CPU tensor, where it applies: 2-D float16/bfloat16/float32 tensors of one dtype on one CUDA device
    (``bias`` 1-D or None), ``accumulate="exact"`` with no ``accum_dtype``, ``engine`` "filter", or "auto"
    from ``FILTER_MIN_WORK`` products; None elsewhere (the general path). It spares the operands' copies
    to the CPU and back (an H100 at 4096^3 float32: 228x torch's float64 matmul with them, 22x without;
    docs/kernels.md). The same bits: the device path is the filter's decision, checked against the Numba
    engine there (benchmarks/gpu_filter_smoke.py)."""
    if engine not in ("auto", "filter") or accumulate != "exact" or accum_dtype is not None:
        return None
    ts = [t for t in (a, b, bias) if t is not None]
    if not all(_cuda(t) for t in ts) or len({(t.device, t.dtype) for t in ts}) != 1:
        return None
    if str(a.dtype).removeprefix("torch.") not in ("float16", "bfloat16", "float32"):
        return None
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or (bias is not None and (
            bias.dim() != 1 or bias.shape[0] != b.shape[1])):  # fmt: skip
        return None
    if engine == "auto" and a.shape[0] * b.shape[1] * a.shape[1] < engines.FILTER_MIN_WORK:
        return None
    from refkern.accumulate.formats import FORMATS
    from refkern.engines.filter_device import matmul as device_matmul

    out, _ = device_matmul(a.detach(), b.detach(), None if bias is None else bias.detach())
    fmt = FORMATS[str(a.dtype).removeprefix("torch.")]
    return deliver(out.cpu().double().numpy(), fmt, True)


def matmul(a, b, *, accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):
    """Reference ``a @ b`` with ``torch.matmul`` semantics.

    1-D operands are promoted to a row (a) or a column (b) and the added dimension removed
    from the result (1-D @ 1-D is a 0-d dot product); batch dimensions broadcast as in torch.
    Inputs may be numpy arrays or torch tensors of float16, bfloat16, float32 or float64, both
    of one dtype (torch raises on mixed dtypes, and so does refkern); the result is a numpy
    array, or a CPU tensor if any input is one.

    With ``accumulate="exact"`` every element is the exact sum of its K products rounded once
    (to nearest even) to the result dtype; see :func:`refkern.dot` for what that includes.
    The other methods (``"naive"``, ``"pairwise"``, ``"kahan"``, ``"neumaier"``, ``"dot2"``)
    compute each element in ``accum_dtype`` (default: the result dtype) over k = 0..K-1;
    their bounds are in :mod:`refkern.accumulate.methods`.

    ``engine``: ``"numba"`` (the jitted kernels), ``"filter"`` (one float64 GEMM on the BLAS, a
    rigorous bound per element, the undecided elements exact: :mod:`refkern.engines.filter`;
    float16/bfloat16/float32 inputs, ``accumulate="exact"``), ``"blas"`` (exact Ozaki slices on
    torch's BLAS, on the device of the tensors; ``accumulate="exact"`` only) or ``"auto"`` (the
    rule in :mod:`refkern.engines`: the filter where it applies). All give bit-identical results.
    """
    if dask_in(a, b):  # lazy, the same bits for every chunking (refkern.scale.array)
        return to_dask("matmul", a, b, accumulate=accumulate, accum_dtype=accum_dtype, engine=engine)
    engines.check_engine("matmul", engine, accumulate)
    got = _on_device(engine, accumulate, accum_dtype, a, b)
    if got is not None:
        return got
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), accumulate, accum_dtype)
    A3, Bt3, ia, ib, shape = matmul_operands(p, contiguous=False)
    return finish(p, _run(p, engine, A3, Bt3, ia, ib, None, shape, _device(a, b), ("a", "b", "bias")))


def linear(x, weight, bias=None, *, accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):
    """Reference ``torch.nn.functional.linear``: ``y[..., o] = bias[o] + sum_k x[..., k] weight[o, k]``.

    ``x`` has shape (..., in_features), ``weight`` (out_features, in_features) (or
    (in_features,), giving shape (...)), ``bias`` (out_features,) or 0-d. The bias is a
    term of the sum: with ``accumulate="exact"`` each output is the exact value of
    ``bias + sum of products`` rounded once, which is why it generally differs from the
    result without bias plus the bias (two roundings). The other methods add the bias as
    the last term, in their working format. ``engine``: as in :func:`matmul`.
    """
    engines.check_engine("linear", engine, accumulate)
    wt = weight.T if _cuda(weight) and weight.dim() == 2 else None  # (in, out): the device path's b
    got = None if wt is None else _on_device(engine, accumulate, accum_dtype, x, wt, bias)
    if got is not None:
        return got
    p = plan("linear", {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), accumulate, accum_dtype)
    X, W, b, shape = linear_operands(p)
    zero = np.zeros(1, np.int64)
    return finish(p, _run(p, engine, X, W, zero, zero, b, shape, _device(x, weight, bias), ("x", "weight", "bias")))


