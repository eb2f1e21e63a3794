"""Matrix products of integers as torch's CPU computes them: ``matmul`` (mm, bmm, mv, dot), ``linear``, and the
operands of ``addmm``/``baddbmm`` with their ``alpha`` and ``beta``.

torch computes an integer product (uint8, int8, int16, int32, int64; bool it refuses) in integer arithmetic of
the operands' width, or a wider one, with two's complement wrap-around, and stores the low ``bits`` of the
result. Addition and multiplication modulo ``2**64`` are a ring homomorphism onto the integers modulo
``2**bits`` for every ``bits <= 64``, so in whatever order and width torch accumulates (measured on torch 2.13
CPU: int16 sums of 100 * 100 products wrap, int64 products beyond ``2**53`` are the exact values modulo
``2**64``), its result is the exact integer result modulo ``2**bits``. The kernel here computes it modulo
``2**64``, exactly, in uint64 arithmetic (whose products and sums wrap by definition), read back as int64:
no float64 detour, no limit of ``2**53``. :func:`refkern.analysis.integers.judge_integers` reduces it to the
result's own format.

``alpha`` and ``beta`` reach torch's integer kernels converted to the tensors' type by c10's checked
conversion (:func:`refkern.ops._args.integer_scale`: a float truncated toward zero, a value outside the type's
range refused), so ``addmm`` is ``beta input + alpha (mat1 @ mat2)`` in the same ring:
:func:`addmm_operands` writes it as one product ``[alpha mat1 | beta input] @ [mat2 ; I]`` (the float path's
exact form, :func:`refkern.torch.ops._addmm`), which :func:`matmul` computes."""

import numpy as np

from refkern._jit import jit
from refkern.ops._args import integer_scale

__all__ = ["matmul", "dot", "linear", "addmm_operands", "integers"]

_DTYPES = ("uint8", "int8", "int16", "int32", "int64")  #: torch's integer types of its CPU products


@jit
def _gemm(A, Bt, ia, ib, out):
    """out[t, i, j] = sum_k A[ia[t], i, k] Bt[ib[t], j, k] modulo 2**64 (uint64 arithmetic wraps)."""
    for t in range(out.shape[0]):
        a = A[ia[t]]
        b = Bt[ib[t]]
        for i in range(out.shape[1]):
            for j in range(out.shape[2]):
                s = np.uint64(0)
                for k in range(a.shape[1]):
                    s += a[i, k] * b[j, k]
                out[t, i, j] = s


def integers(v, name: str, op: str) -> np.ndarray:
    """An integer tensor or array argument (one of torch's integer product types) as an int64 numpy array, read
    exactly; bool, floating and other values refused, naming the argument."""
    if hasattr(v, "detach"):  # a torch tensor, on any device
        dt = str(v.dtype).removeprefix("torch.")
        a = v.detach().to("cpu").numpy() if dt in _DTYPES else None
    else:
        a = np.asarray(v)
        dt = a.dtype.name
    if dt not in _DTYPES:
        raise TypeError(f"{op}: an integer {name} must be one of {', '.join(_DTYPES)} (torch's integer products "
                        f"refuse the others); got {name}.dtype={dt}.")  # fmt: skip
    return a.astype(np.int64)


def _wrap(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint64)


def _mm(a, b, op):
    """``a @ b`` modulo 2**64 with torch.matmul's shapes (1-D operands promoted and the added dimension removed,
    batch dimensions broadcast) as int64."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: both arguments must be at least 1-D; got shapes {a.shape} and {b.shape}.")
    A = a[None] if a.ndim == 1 else a
    B = b[:, None] if b.ndim == 1 else b
    if A.shape[-1] != B.shape[-2]:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} cannot be multiplied ({A.shape[-1]} != "
                         f"{B.shape[-2]}).")  # fmt: skip
    try:
        batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: the batch dimensions of shapes {a.shape} and {b.shape} do not broadcast.") from None
    m, k, n = A.shape[-2], A.shape[-1], B.shape[-1]
    nb = int(np.prod(batch, dtype=np.int64))
    A3 = np.ascontiguousarray(np.broadcast_to(A, (*batch, m, k))).reshape(nb, m, k)
    Bt3 = np.ascontiguousarray(np.swapaxes(np.broadcast_to(B, (*batch, k, n)), -1, -2)).reshape(nb, n, k)
    idx = np.arange(nb, dtype=np.int64)
    out = np.empty((nb, m, n), np.uint64)
    _gemm(_wrap(A3), _wrap(Bt3), idx, idx, out)
    out = out.view(np.int64).reshape(*batch, m, n)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def matmul(a, b):
    """``torch.matmul(a, b)`` of integers (mm, bmm, mv, dot alike): the exact integer result modulo ``2**64`` as
    int64 (two's complement), which torch's result is modulo ``2**bits`` of its format (module docstring)."""
    return _mm(integers(a, "a", "matmul"), integers(b, "b", "matmul"), "matmul")


def dot(x, y):
    """``torch.dot(x, y)`` of 1-D integers: their exact sum of products modulo ``2**64`` as a 0-d int64 array."""
    x, y = integers(x, "x", "dot"), integers(y, "y", "dot")
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"dot: x and y must be 1-D of one length; got shapes {x.shape} and {y.shape}.")
    return _mm(x, y, "dot")


def linear(x, weight, bias=None):
    """``F.linear(x, weight, bias)`` of integers: ``x @ weight^T + bias`` modulo ``2**64`` as int64."""
    x, w = integers(x, "x", "linear"), integers(weight, "weight", "linear")
    out = _mm(x, w.T if w.ndim == 2 else w, "linear")
    if bias is not None:
        out = (_wrap(out) + _wrap(np.broadcast_to(integers(bias, "bias", "linear"), out.shape).copy())).view(np.int64)
    return out


def addmm_operands(name: str, input, mat1, mat2, beta, alpha):  # noqa: A002
    """(left, right): int64 torch tensors with ``left @ right = beta input + alpha (mat1 @ mat2)`` modulo
    ``2**64``, for ``addmm`` (``baddbmm``: batched) of integer tensors of one dtype: ``left = [alpha mat1 |
    beta input]`` (input broadcast to the result's shape, products modulo ``2**64``), ``right = [mat2 ; I]``.
    alpha and beta as torch converts them (:func:`refkern.ops._args.integer_scale`); a zero drops its block, as
    torch's kernel skips it. A ValueError (naming the argument) where torch refuses the call."""
    import torch

    dtype = mat1.dtype
    a = integers(mat1, "mat1" if name == "addmm" else "batch1", name)
    b = integers(mat2, "mat2" if name == "addmm" else "batch2", name)
    c = integers(input, "input", name)
    if len({t.dtype for t in (input, mat1, mat2)}) > 1:
        got = ", ".join(str(t.dtype).removeprefix("torch.") for t in (input, mat1, mat2))
        raise ValueError(f"{name}: input, mat1 and mat2 must have one dtype; got {got}.")
    rank = 2 if name == "addmm" else 3
    if a.ndim != rank or b.ndim != rank or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"{name}: operands of shapes {a.shape} and {b.shape} do not multiply as {rank}-D "
                         "matrices.")  # fmt: skip
    s_a = integer_scale(alpha, str(dtype).removeprefix("torch."), "alpha", name)
    s_b = integer_scale(beta, str(dtype).removeprefix("torch."), "beta", name)
    n = b.shape[-1]
    shape = (*a.shape[:-1], n)
    blocks, rows = [], []
    if s_a != 0:
        blocks.append((_wrap(a) * np.uint64(s_a % 2**64)).view(np.int64))
        rows.append(b)
    if s_b != 0:
        try:
            full = np.broadcast_to(c, shape)
        except ValueError:
            raise ValueError(f"{name}: input of shape {c.shape} does not broadcast to the result's {shape}.") from None
        blocks.append((_wrap(np.ascontiguousarray(full)) * np.uint64(s_b % 2**64)).view(np.int64))
        rows.append(np.broadcast_to(np.eye(n, dtype=np.int64), (*shape[:-2], n, n)))
    if not blocks:  # alpha = beta = 0: every element is 0, the empty sum
        blocks, rows = [a[..., :0]], [b[..., :0, :]]
    left = np.ascontiguousarray(np.concatenate(blocks, -1))
    right = np.ascontiguousarray(np.concatenate(rows, -2))
    return torch.from_numpy(left), torch.from_numpy(right)
