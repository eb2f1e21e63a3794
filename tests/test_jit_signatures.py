"""A kernel compiles once per format, not once per form of its operands.

Numba compiles a jitted function once per tuple of argument types, and an array's type holds its dtype, its
layout (C, F or A) and its writeable flag. The wrappers of the analysis' largest kernels bring every operand the
kernel only reads to one form (C-contiguous, read-only, float64 or the held format): here each wrapper is called
with the operand forms its callers produce (float32 and float64, C and Fortran order, strided, read-only and
writable, broadcast and not) and the kernel may hold one compiled signature per format, every read operand in
the canonical form. A caller that slips a new form past the wrapper adds a signature (a full compile, tens of
seconds on a cold cache) and fails here."""

import inspect

import numpy as np
import pytest
import torch
from numba.core import types

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT32, FLOAT64
from refkern.analysis import _healthy as hl
from refkern.analysis import noise as nz
from refkern.analysis import noise_rows as nr
from refkern.analysis.hypotheses import Model
from refkern.analysis.stats import level
from refkern.kernels import loss_logits_grad as lg
from refkern.kernels import loss_logits_grad_fast as lgf

#: per kernel, the operands it only reads (the rest are its outputs and scalars)
READ = {
    hl._healthy_rows: ("a", "c", "var", "sc", "X", "mean", "r", "W"),
    hl._healthy_pass: ("a", "c", "var", "sc"),
    nr._norm_row_sums: ("p", "q", "var", "X", "mean", "r", "W"),
    lgf.logits_input_fast: ("x", "y", "w", "pw", "G"),
    lgf.logits_target_fast: ("x", "y", "w", "pw", "G"),
}
#: per kernel, the operands held in the result's format (float32 or float64, all one); the other read ones float64
HELD = {hl._healthy_rows: ("a", "c", "X"), hl._healthy_pass: ("a", "c"), nr._norm_row_sums: ("p", "q", "X")}


def _named(kernel, sig):
    return dict(zip(inspect.signature(kernel.py_func).parameters, sig))


def _check_forms(kernel):
    """Every signature the kernel holds in this process: each read operand a read-only C-contiguous array, the
    held ones of one format (float32 or float64) and the others float64. Returns the signatures per format."""
    formats = {}
    for sig in kernel.signatures:
        arg = _named(kernel, sig)
        for name in READ[kernel]:
            t = arg[name]
            assert isinstance(t, types.Array) and t.layout == "C" and not t.mutable, (kernel.__name__, name, t)
        held = {arg[name].dtype for name in HELD.get(kernel, ())}
        assert len(held) <= 1 and held <= {types.float32, types.float64}, (kernel.__name__, held)
        assert all(arg[name].dtype == types.float64 for name in READ[kernel] if name not in HELD.get(kernel, ()))
        formats.setdefault(held.pop() if held else types.float64, []).append(sig)
    return formats


def _ro(a):
    v = a.view()
    v.flags.writeable = False
    return v


def _norm_case(dtype, transposed, weight, seed=21):
    """A layer_norm (with ``weight``) or weightless rms_norm over rows of 48: (actual, reference, noise), the input
    in ``dtype`` and, ``transposed``, a Fortran-ordered view (the rows' X then strided)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 64, generator=g, dtype=dtype).T if transposed else torch.randn(64, 48, generator=g, dtype=dtype)
    if weight:
        w, b = torch.randn(48, generator=g, dtype=dtype), torch.randn(48, generator=g, dtype=dtype)
        out, args = torch.nn.functional.layer_norm(x, (48,), w, b, 1e-5), {"normalized_shape": (48,), "weight": w,
                                                                           "bias": b, "eps": 1e-5}  # fmt: skip
        name, ref = "layer_norm", rk.layer_norm(x, (48,), w, b, 1e-5)
    else:
        out, args = torch.nn.functional.rms_norm(x, (48,), None, 1e-6), {"normalized_shape": (48,), "eps": 1e-6}
        name, ref = "rms_norm", rk.rms_norm(x, (48,), None, 1e-6)
    fmt = FLOAT64 if dtype == torch.float64 else FLOAT32
    c = np.asarray(ref, np.float64 if fmt is FLOAT64 else np.float32)
    n = nz.noise(name, {"input": x, **args}, c, fmt, 5.0)
    return out.numpy(), c, n, fmt


def _healthy_variants(dtype):
    """_healthy called as its callers call it on results of one format: C and Fortran-ordered, read-only and
    writable results and variances, a norm's fused parts from contiguous and strided inputs, with and without a
    weight, a scale of one and one per element. Each call must take the quick path (the kernels run)."""
    for transposed in (False, True):
        for weight in (True, False):
            a, c, n, fmt = _norm_case(dtype, transposed, weight)
            m = Model("rounding", None, "r", fmt, fmt)
            lam_el, lam_grp = level(a.size), level(2 * 48 + 1)
            parts = n.coherent.fused.parts
            strided = np.repeat(a, 2, axis=1)[:, ::2]  # neither C nor Fortran order
            forms = [(a, c, n.var), (np.asfortranarray(a), _ro(c), _ro(n.var)), (_ro(a), np.asfortranarray(c), n.var),
                     (strided, c, np.asfortranarray(n.var))]  # fmt: skip
            for aa, cc, vv in forms:
                f = hl._healthy(m, aa, cc, vv, lam_el, lam_grp, (1,), 1.0, fmt, parts)
                assert f is not None and f.held_rows is not None  # the row pass ran, with the rows' sums
                assert hl._healthy(m, aa, cc, vv, lam_el, lam_grp, (1,), 1.0, fmt) is not None
                s = np.full(a.shape, 2.0)  # a scale per element (powers of two, exact)
                assert hl._healthy(m, aa, cc, vv * 4.0, lam_el, lam_grp, (1,), s, fmt) is not None
                assert hl._healthy(m, aa, cc, vv, lam_el, lam_grp, (), 1.0, fmt) is not None  # no group axis
                held = n.coherent.held_stats(aa, cc, vv)  # _norm_row_sums on the held values
                keep = np.ones(a.shape, bool)
                plain = n.coherent.stats(aa.astype(np.float64) - cc, vv, keep, cc.astype(np.float64))  # residuals
                for h, p in zip(held[:5], plain[:5]):
                    assert np.allclose(h, p, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("kernel", [hl._healthy_rows, hl._healthy_pass, nr._norm_row_sums], ids=lambda k: k.__name__)
def test_a_norm_quick_path_kernel_compiles_once_per_format(kernel):
    _healthy_variants(torch.float32)
    formats = _check_forms(kernel)
    assert len(formats[types.float32]) == 1  # every float32 form of the operands above: one signature
    _healthy_variants(torch.float64)
    formats = _check_forms(kernel)
    assert len(formats[types.float32]) == 1 and len(formats[types.float64]) == 1
    assert len(kernel.signatures) == 2


def test_held_rows_of_a_mixed_format_widen_exactly():
    """A float64 norm input with a float32 result (the rows' X float64, the held values float32): the quick path
    widens the result to float64 (exact) and gives what it gives on float32 rows (X rounded to float32 here has
    the same values: it was drawn in float32), bit for bit; no third signature."""
    a, c, n, _ = _norm_case(torch.float32, False, True)
    X, mean, r, W, finish = n.coherent.fused.parts
    X64 = np.asarray(X, np.float64)
    m = Model("rounding", None, "r", FLOAT32, FLOAT32)
    lam_el, lam_grp = level(a.size), level(2 * 48 + 1)
    one = hl._healthy(m, a, c, n.var, lam_el, lam_grp, (1,), 1.0, FLOAT32, (X, mean, r, W, finish))
    mixed = hl._healthy(m, a, c, n.var, lam_el, lam_grp, (1,), 1.0, FLOAT32, (X64, mean, r, W, finish))
    assert one is not None and mixed is not None
    np.testing.assert_array_equal(one.z, mixed.z)
    for u, v in zip(one.held_rows, mixed.held_rows):
        np.testing.assert_array_equal(u, v)
    assert one.peak == mixed.peak
    _check_forms(hl._healthy_rows)
    assert len(hl._healthy_rows.signatures) <= 2


def _logits_variants():
    """logits_grads with the operand forms binary_call gives: a target that broadcasts or not, a weight that is
    one value, per class or per element, pos_weight per class, grad_output one value (mean, sum) or per element."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 7)) * 4
    y = rng.random((30, 7))
    for w in (np.float64(1.0), rng.random(7), rng.random((30, 7))):
        for pw in (np.float64(1.0), 1.0 + rng.random(7)):
            for red, G in (("none", rng.standard_normal((30, 7))), ("mean", np.float64(1.0)), ("sum", np.float64(2.0))):
                for xx, yy in ((x, y), (np.asfortranarray(x), _ro(y)), (np.repeat(x, 2, axis=1)[:, ::2], y[0])):
                    for fmt in (BFLOAT16, FLOAT32):
                        lg.logits_grads(np.asarray(xx), np.asarray(yy), w, pw, G, fmt, red, ("input", "target"))


@pytest.mark.parametrize("kernel", [lgf.logits_input_fast, lgf.logits_target_fast], ids=lambda k: k.__name__)
def test_the_logits_float64_pass_compiles_once(kernel):
    _logits_variants()
    _check_forms(kernel)
    assert len(kernel.signatures) == 1


def test_the_envelope_passes_read_actual_and_centre_in_one_format():
    """A float32 result against a float64 centre (a precision hypothesis' emulation) widens both: the envelope
    pass and the norms' envelope compile once per format, never for a mix of float32 and float64 operands."""
    from refkern.analysis import envelope as en
    from refkern.analysis import verdict_envelope as ve

    g = torch.Generator().manual_seed(3)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(4, 64, generator=g).to(dt)
        o = torch.nn.functional.layer_norm(x, (64,))
        rk.compare(o, "layer_norm", x, (64,))
        rk.compare(o * 1.1, "layer_norm", x, (64,))  # a mismatch: the precisions' centres, in float64
        rk.compare(torch.softmax(x, -1) * 1.05, "softmax", x, -1)
    for kernel, k in ((ve._envelope_pass, 2), (en._norm_rows, 4)):
        for sig in kernel.signatures:
            held = [t for i, t in enumerate(sig[:k]) if i in (0, k - 1)]  # (a, c) and (X, ref)
            assert len({t.dtype for t in held}) == 1, (kernel.__name__, sig)


def test_the_norms_element_scale_compiles_once_per_format():
    """noise._norm_elements reads the rows X and the reference Y in one format, C-contiguous and read-only, whatever
    the layout of the input (a transposed block) and its dtype: at most two signatures, each with X and Y alike."""
    g = torch.Generator().manual_seed(5)
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = torch.randn(8, 64, generator=g).to(dt)
        for xx in (x, x.t().contiguous().t()):  # C and Fortran layouts
            o = torch.nn.functional.layer_norm(xx, (64,))
            rk.compare(o * 1.1, "layer_norm", xx, (64,))
            rk.compare(torch.nn.functional.rms_norm(xx, (64,)), "rms_norm", xx, (64,))
    sigs = nz._norm_elements.signatures
    assert len(sigs) <= 2, sigs
    for sig in sigs:
        X, Y = sig[0], sig[3]
        assert X == Y and X.layout == "C" and not X.mutable, sig


def test_the_envelope_pass_reads_its_bound_read_only():
    """verdict_envelope._bound_held gives the envelope pass its bound C-contiguous, float64 and read-only, whatever
    the envelope made (a fresh array, a broadcast scalar, a caller's view): the pass compiled 3 times in a cold CI
    run, twice for the bound's writeable flag alone. Each signature's bound (its third operand) is read-only."""
    from refkern.analysis import verdict_envelope as ve

    b = ve._bound_held(np.ones((3, 4)))
    assert not b.flags.writeable and b.flags.c_contiguous and b.dtype == np.float64 and b.shape == (12,)
    own = np.ones(5)
    assert not ve._bound_held(own).flags.writeable and own.flags.writeable  # the caller's array untouched
    g = torch.Generator().manual_seed(7)
    for dt in (torch.float32, torch.float64):
        x = torch.randn(4, 300, generator=g).to(dt)
        rk.compare(x.sum(-1) * 1.01, "sum", x, -1)
        rk.compare(torch.log_softmax(x, -1), "log_softmax", x, -1)
        rk.compare(torch.nn.functional.layer_norm(x, (300,)), "layer_norm", x, (300,))
    for sig in ve._envelope_pass.signatures:
        assert not sig[2].mutable, sig


def test_the_norms_row_test_compiles_once_per_format():
    """row_bound_norm's row test reads X, the reference and the output in one held format and W and B in float64,
    all read-only, whatever the caller gives (the verdict's float64 copy of a float32 result, a broadcast weight):
    it compiled 4 times in the cold CI-equivalent run (55 s with its T bisection), now once per format."""
    from refkern.analysis import row_bound_norm as rbn

    g = torch.Generator().manual_seed(9)
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(4, 64, generator=g).to(dt)
        w, b = torch.randn(64, generator=g).to(dt), torch.randn(64, generator=g).to(dt)
        for args in ((x, (64,)), (x, (64,), w, b)):
            o = torch.nn.functional.layer_norm(*args)
            bad = o.clone()
            bad[1, 3] = bad[1, 3] * 1.01
            rk.compare(bad, "layer_norm", *args)
    sigs = rbn._test.signatures
    assert len(sigs) <= 2, sigs
    for sig in sigs:
        assert sig[0] == sig[3] == sig[4] and all(not t.mutable for t in sig[:5]), sig
