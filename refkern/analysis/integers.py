"""``compare`` of an integer result (a sum, a cumulative sum, a matrix product, a pool or a power of integer
inputs): torch computes it in integer arithmetic, wrapping modulo ``2**bits``, so it is defined to the bit.

Its exact value is the op's exact result on the inputs read as float64 (an integer of magnitude at most
``2**53`` is a float64 number, so the reading is exact), which refkern's reference rounds once to float64.
Where that rounded value has magnitude below ``2**53`` it is the exact integer: rounding to nearest is
monotonic and every integer below ``2**53`` is a float64 number, so ``|RN(v)| < 2**53`` implies ``|v| < 2**53``
and then ``RN(v) = v``. The integer result is that value modulo ``2**bits`` in two's complement (unsigned
formats modulo ``2**bits``). Equal to the bit: ``exact``; any other value: ``mismatch`` (a
:class:`~refkern.analysis.report.BitReport`, the verdicts of the ops defined to the bit). Beyond ``2**53``
nothing is claimed: an error says so, as for inputs beyond it.

An op whose record names an exact integer kernel (``Op.integer_reference``) is judged on it instead, with no
limit of ``2**53``: the products (``matmul``, ``dot``, ``linear``; addmm's and baddbmm's exact form, alpha and
beta as torch converts them: :mod:`refkern.kernels.integer_gemm`) return the exact result modulo ``2**64``,
whose residue modulo ``2**bits`` is the exact result's (``2**bits`` divides ``2**64``); ``avg_pool1d`` and
``avg_pool2d`` of int64 return torch's own rule, the int64 window sum divided with truncation toward zero
(:mod:`refkern.kernels.integer_pool`), which the float64 reference's rounded quotient is not."""

import numpy as np

import refkern.ops as _ops
from refkern.analysis.report import BitReport

__all__ = ["is_integer_result", "judge_integers"]

_EXACT = 2.0**53  #: every integer of smaller magnitude is a float64 number (module docstring)


def _numpy(v):
    if hasattr(v, "detach"):  # a torch tensor, on any device
        return v.detach().to("cpu").numpy()
    return np.asarray(v)


def is_integer_result(actual) -> bool:
    """Whether ``actual`` (a torch tensor or an array) holds integers (bool included)."""
    dt = getattr(actual, "dtype", None)
    if dt is None:
        return False
    if hasattr(dt, "is_floating_point"):  # torch.dtype
        return not (dt.is_floating_point or dt.is_complex)
    return np.dtype(dt).kind in "iub"


def _as_float64(v, where, name, adt):
    """An integer tensor argument read as float64 (exactly: every element of magnitude at most 2**53); other
    arguments as they are; a floating array refused (``adt``: the integer result's dtype)."""
    if not is_integer_result(v):
        if getattr(v, "dtype", None) is not None and hasattr(v, "shape"):
            raise TypeError(f"compare: an integer result (actual.dtype={adt}) is judged only from integer inputs; "
                            f"argument {where} of {name} is {str(v.dtype).removeprefix('torch.')}.")  # fmt: skip
        return v
    a = _numpy(v)
    big = (a > 2**53) | (a < -(2**53)) if a.dtype.kind in "iu" else np.zeros(a.shape, bool)  # in integers: exact
    if big.any():
        raise ValueError(f"compare: argument {where} of {name} holds integers beyond 2**53 in magnitude (e.g. "
                         f"{int(a[big].reshape(-1)[0])}); an integer result is judged only where float64 holds every "
                         "input exactly.")  # fmt: skip
    out = a.astype(np.float64)
    if hasattr(v, "detach"):
        import torch

        return torch.from_numpy(out)
    return out


def _exact_int64(actual, name, args, kwargs):
    """The op's exact integer kernel (``Op.integer_reference``: a product modulo 2**64, avg_pool's truncating
    division) on the integer arguments as given, as int64; a floating argument refused as for the float64 path."""
    adt = _numpy(actual).dtype
    for where, v in (*enumerate(args), *kwargs.items()):
        if getattr(v, "dtype", None) is not None and hasattr(v, "shape") and not is_integer_result(v):
            raise TypeError(f"compare: an integer result (actual.dtype={adt}) is judged only from integer inputs; "
                            f"argument {where!r} of {name} is {str(v.dtype).removeprefix('torch.')}.")  # fmt: skip
    kwargs = {k: v for k, v in kwargs.items() if k not in ("dtype", "accumulate", "accum_dtype", "engine")}
    return np.asarray(_numpy(_ops.resolve_path(_ops.get(name).integer_reference)(*args, **kwargs)), np.int64)


def _wrapped(exact, dtype):
    """int64 values (exact, or exact modulo 2**64) reduced to ``dtype``'s residues, as int64: two's complement
    for the signed formats, ``[0, 2**bits)`` for the unsigned ones."""
    bits = 8 * dtype.itemsize
    if dtype.kind == "u":
        return np.mod(exact, 1 << bits) if bits < 64 else exact
    if bits < 64:
        half = 1 << (bits - 1)
        return np.mod(exact + half, 1 << bits) - half
    return exact


def judge_integers(actual, name, args, kwargs):
    """The :class:`~refkern.analysis.report.BitReport` of an integer ``actual`` against the exact integer result
    of ``name`` on ``args`` and ``kwargs`` wrapped to ``actual``'s format (module docstring)."""
    act = _numpy(actual)
    if act.dtype == np.bool_:
        raise TypeError(f"compare: {name} gives no bool result; actual is bool.")
    if _ops.get(name).integer_reference is not None:
        want = _exact_int64(actual, name, args, kwargs)
        if want.shape != act.shape:
            raise ValueError(f"compare: actual.shape={act.shape} differs from the shape {name} gives for these "
                             f"inputs, {want.shape}; pass the same arguments that produced it.")  # fmt: skip
        return _report(act, _wrapped(want, act.dtype))
    args = tuple(_as_float64(v, i, name, act.dtype) for i, v in enumerate(args))
    # an integer dtype= names the result's format, which the wrap below applies: the reference stays float64
    kwargs = {k: _as_float64(v, repr(k), name, act.dtype) for k, v in kwargs.items() if k != "dtype"}
    ref = _ops.get(name).reference(*args, **kwargs)
    ref = np.asarray(_numpy(ref[0] if isinstance(ref, tuple) else ref), np.float64)  # a pool's (values, indices)
    if ref.shape != act.shape:
        raise ValueError(f"compare: actual.shape={act.shape} differs from the shape {name} gives for these inputs, "
                         f"{ref.shape}; pass the same arguments that produced it.")  # fmt: skip
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(ref) < _EXACT) | (ref != np.round(ref))
    if bad.any():
        raise ValueError(f"compare: the exact integer result of {name} is beyond 2**53 in magnitude (or not an "
                         "integer) at some element: an integer result is judged only below 2**53.")  # fmt: skip
    return _report(act, _wrapped(ref.astype(np.int64), act.dtype))


def _report(act, want):
    """The BitReport of ``act`` against the wrapped exact integers ``want`` (int64)."""
    diff = act.astype(np.int64).reshape(-1) != want.reshape(-1)
    n_diff = int(np.count_nonzero(diff))
    first = int(np.argmax(diff)) if n_diff else None
    # the largest difference, in Python ints (int64's would wrap, float64's round away a difference beyond 2**53)
    got, exp = act.astype(np.int64).reshape(-1)[diff].tolist(), want.reshape(-1)[diff].tolist()
    big = float(max(abs(g - e) for g, e in zip(got, exp))) if n_diff else 0.0
    return BitReport(act.size, n_diff, big, first, against="the exact integer result")
