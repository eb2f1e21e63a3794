"""The public surface: return types, torch interop, type promotion, and the errors."""

import subprocess
import sys

import numpy as np
import pytest

import refkern as rk

torch = pytest.importorskip("torch")


def test_import_is_light():
    code = ("import sys, refkern; print(*(m in sys.modules for m in ('torch', 'mpmath', 'dask', 'distributed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False", "False"]


def test_public_api():
    assert set(rk.__all__) >= {"dot", "sum", "truth", "METHODS", "__version__"}
    assert rk.METHODS == ("dot2", "exact", "kahan", "naive", "neumaier", "pairwise")


def test_kernels_are_cached_on_their_import_closure():
    import os

    from refkern._jit import _PKG, CACHE, closure
    from refkern.accumulate.exact import _exact_dot_serial

    assert CACHE
    rk.dot(np.ones(3, np.float32), np.ones(3, np.float32))
    locator = _exact_dot_serial._cache._impl.locator
    assert type(locator).__name__.startswith("Refkern")
    assert locator._refkern_file == os.path.join(_PKG, "accumulate", "exact.py")

    def names(mod):
        return {os.path.relpath(f, _PKG) for f in closure(os.path.join(_PKG, *mod.split("/")))}

    # what a kernel calls or reads, at any depth, stamps it; the adapter and the verdict do not
    assert {"accumulate/exact.py", "accumulate/superacc.py", "accumulate/formats.py", "_jit.py"} <= names(
        "accumulate/exact.py"
    )
    attention = names("kernels/attention.py")
    assert {"kernels/_transcendental.py", "kernels/_exact_real.py", "accumulate/formats.py"} <= attention
    assert not attention & {"torch/audit.py", "analysis/envelope.py", "analysis/verdict.py", "cli.py"}
    assert names("accumulate/formats.py") == {"accumulate/formats.py", "accumulate/_bits.py", "_jit.py"}


@pytest.mark.parametrize("dtype,want", [("float16", np.float16), ("float32", np.float32), ("float64", np.float64)])
def test_numpy_in_numpy_scalar_out(dtype, want):
    x = np.arange(1, 5, dtype=dtype)
    for m in rk.METHODS:
        r = rk.dot(x, x, accumulate=m)
        assert type(r) is want and r == 30
        assert type(rk.sum(x, accumulate=m)) is want


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_torch_in_tensor_out(dtype):
    dt = getattr(torch, dtype)
    x = torch.arange(1, 5, dtype=dt, requires_grad=dtype != "bfloat16" and dtype != "float16")
    r = rk.dot(x, x)
    assert isinstance(r, torch.Tensor) and r.dtype == dt and r.shape == () and r.device.type == "cpu"
    assert r.item() == 30
    assert rk.sum(x).item() == 10


@pytest.mark.parametrize(
    "x,y",
    [
        (torch.ones(3, dtype=torch.float16), torch.ones(3, dtype=torch.bfloat16)),
        (torch.ones(3), torch.ones(3, dtype=torch.float64)),
        (np.ones(3, np.float32), np.ones(3, np.float64)),
    ],
    ids=["f16-bf16", "torch-f32-f64", "numpy-f32-f64"],
)
def test_mixed_dtypes_raise_as_torch_dot_does(x, y):
    tx = torch.as_tensor(x)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.dot(tx, torch.as_tensor(y))
    want = rf"^dot: x and y must have the same dtype, as torch requires \(it does not promote\); got x\.dtype={str(tx.dtype).removeprefix('torch.')} and y\.dtype="
    with pytest.raises(TypeError, match=want):
        rk.dot(x, y)
    with pytest.raises(TypeError, match=r"^truth\.dot: x and y must have the same dtype"):
        rk.truth.dot(x, y)


def test_numpy_and_torch_of_one_dtype_mix():
    assert isinstance(rk.dot(np.ones(3, np.float32), torch.ones(3)), torch.Tensor)


def test_non_contiguous_and_multidim_inputs():
    a = np.arange(20, dtype=np.float32)[::2]
    assert rk.dot(a, a) == np.dot(a.astype(np.float64), a.astype(np.float64))
    t = torch.arange(12.0).reshape(3, 4).t()
    assert rk.sum(t).item() == 66.0


def test_bfloat16_tensor_is_not_rounded_on_the_way_in():
    x = torch.tensor([1.0 + 2**-7, -1.0], dtype=torch.bfloat16)
    assert rk.sum(x).item() == 2**-7


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: rk.dot(np.ones(3), np.ones(4)), ValueError, r"^dot: x and y must have the same length; got x\.shape=\(3,\) and y\.shape=\(4,\)\."),
        (lambda: rk.dot(np.ones((2, 3)), np.ones((2, 3))), ValueError, r"^dot: expected 1-D inputs; got x\.shape=\(2, 3\)"),
        (lambda: rk.dot(np.ones(3), np.arange(3)), TypeError, r"^dot: expected floating-point inputs \(float16, bfloat16, float32 or float64\); got y\.dtype=int64\."),
        (lambda: rk.sum(np.ones(3, np.complex128)), TypeError, r"^sum: expected floating-point inputs .*; got x\.dtype=complex128\."),
        (lambda: rk.sum(np.array(["a"], dtype=object)), TypeError, r"^sum: expected floating-point inputs .*; got x\.dtype=object\."),
        (lambda: rk.sum(torch.ones(3, dtype=torch.int32)), TypeError, r"^sum: expected floating-point inputs .*; got x\.dtype=torch\.int32\."),
        (lambda: rk.dot(np.ones(3), np.ones(3), accumulate="kahn"), ValueError, r"^dot: unknown accumulate='kahn'; choose one of 'dot2', 'exact', 'kahan', 'naive', 'neumaier', 'pairwise'\."),
        (lambda: rk.sum(np.ones(3), accumulate="naive", accum_dtype="fp8"), ValueError, r"^sum: unknown accum_dtype='fp8'; choose one of 'bfloat16', 'float16', 'float32', 'float64'\."),
        (lambda: rk.sum(np.ones(3), accum_dtype="fp16"), ValueError, r"^sum: accum_dtype='fp16' does not apply to accumulate='exact'"),
        (lambda: rk.sum([[1.0], [2.0, 3.0]]), TypeError, r"^sum: x must be an array or tensor of floats"),
        (lambda: rk.truth.dot(np.ones(3), np.ones(2)), ValueError, r"^truth\.dot: expected 1-D inputs of equal length"),
    ],
)  # fmt: skip
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("name", ["float16", "fp16", "half", np.float16, "torch.float16"])
def test_accum_dtype_spellings(name):
    if name == "torch.float16":
        name = torch.float16
    x = np.full(3000, 1.0, np.float32)
    assert rk.sum(x, accumulate="naive", accum_dtype=name) == 2048.0  # fp16 stalls at 2048
