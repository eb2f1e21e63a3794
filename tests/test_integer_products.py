"""Integer products (refkern.kernels.integer_gemm) against the Python-int truth (refkern.truth.integers), and the
truth's semantics against torch's CPU itself: matmul, mm, bmm, mv, dot, linear and addmm/baddbmm with alpha and
beta, in every integer dtype torch multiplies, values beyond 2**53 included; judged to the bit by compare."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.kernels import integer_gemm as ig
from refkern.ops._args import integer_scale
from refkern.truth import integers as ti

DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _draw(g, shape, dtype, big=False):
    """Integers spread over the whole of ``dtype`` (int64: up to 2**62 in magnitude when ``big``, so that
    products and sums leave float64's 2**53 far behind and wrap modulo 2**64)."""
    if dtype == torch.int64:
        hi = 2**62 if big else 2**20
        return torch.randint(-hi, hi, shape, generator=g, dtype=torch.int64)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, shape, generator=g, dtype=torch.int64).to(dtype)


def _same(kernel_int64, truth, dtype):
    """The kernel's int64 (exact modulo 2**64) and the truth's exact ints agree in ``dtype``'s residues, and in
    int64's (the kernel's own claim)."""
    k = np.asarray(kernel_int64, dtype=np.int64)
    assert k.shape == np.shape(truth)
    assert ti.wrap(k.astype(object), "int64").tolist() == ti.wrap(truth, "int64").tolist()
    assert ti.wrap(k.astype(object), dtype).tolist() == ti.wrap(truth, dtype).tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((7,), (7, 2)), ((2, 7), (7,)), ((5,), (5,)),
                                    ((2, 1, 3, 6), (4, 6, 2)), ((3, 0), (0, 4)), ((0, 3), (3, 2))])  # fmt: skip
def test_matmul_is_the_exact_integers_modulo_2_to_the_64(dtype, sa, sb):
    g = torch.Generator().manual_seed(len(sa) * 10 + len(sb))
    a, b = _draw(g, sa, dtype, big=True), _draw(g, sb, dtype, big=True)
    exact = ti.matmul(a, b)
    _same(ig.matmul(a, b), exact, dtype)
    got = torch.matmul(a, b)  # torch's CPU: the exact integers in its own format
    assert got.tolist() == ti.wrap(exact, dtype).tolist()
    assert rk.compare(got, "matmul", a, b).verdict == "exact"


def test_products_beyond_2_to_the_53_are_judged_and_an_off_by_one_found():
    a = torch.tensor([[2**62 + 12345, 3]])
    b = torch.tensor([[7], [2**61 + 1]])
    want = ((2**62 + 12345) * 7 + 3 * (2**61 + 1)) % 2**64  # written out: 2305843009213780370
    assert want == 2305843009213780370 and torch.mm(a, b).item() == want
    assert rk.compare(torch.mm(a, b), "matmul", a, b).verdict == "exact"
    rep = rk.compare(torch.mm(a, b) + 1, "matmul", a, b)
    assert (rep.verdict, rep.n_diff, rep.max_ulp) == ("mismatch", 1, pytest.approx(1.0, abs=0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dot_mv_bmm_and_linear(dtype):
    g = torch.Generator().manual_seed(5)
    x, y = _draw(g, (9,), dtype, big=True), _draw(g, (9,), dtype, big=True)
    _same(ig.dot(x, y), ti.dot(x, y), dtype)
    assert torch.dot(x, y).item() == ti.wrap(ti.dot(x, y), dtype).item()
    assert rk.compare(torch.dot(x, y), "dot", x, y).verdict == "exact"
    m = _draw(g, (4, 9), dtype, big=True)
    assert rk.compare(torch.mv(m, x), "matmul", m, x).verdict == "exact"
    p, q = _draw(g, (3, 4, 5), dtype, big=True), _draw(g, (3, 5, 2), dtype, big=True)
    assert torch.bmm(p, q).tolist() == ti.wrap(ti.matmul(p, q), dtype).tolist()
    w, bias = _draw(g, (6, 9), dtype, big=True), _draw(g, (6,), dtype, big=True)
    _same(ig.linear(m, w, bias), ti.linear(m, w, bias), dtype)
    if dtype == torch.int64:  # F.linear of smaller integers: torch's CPU addmm takes them too
        got = torch.nn.functional.linear(m, w, bias)
        assert got.tolist() == ti.wrap(ti.linear(m, w, bias), dtype).tolist()
        assert rk.compare(got, "linear", m, w, bias).verdict == "exact"


#: (dtype, value) -> what torch 2.13's CPU addmm multiplies by (None: refused), written out from c10's checked
#: conversion (a float truncated toward zero, an out-of-range value refused; an unsigned type takes -max .. -1);
#: a list of pairs, not a dict: 2**63 and 2.0**63 are equal keys
SCALES = [(("int8", -2.5), -2), (("int8", 127.9), None), (("int8", -128.9), None), (("int8", -128), -128),
          (("int8", 128), None), (("int8", -0.99), 0), (("int8", True), 1), (("uint8", -1), -1),
          (("uint8", -255), -255), (("uint8", -256), None), (("uint8", 255), 255), (("uint8", 256), None),
          (("uint8", 127.9), 127), (("uint8", 255.0), 255), (("uint8", 255.00001), None), (("uint8", -0.5), None),
          (("int16", 255.00001), 255), (("int64", 2**63 - 1), 2**63 - 1), (("int64", -(2**63)), -(2**63)),
          (("int64", 2**63), None), (("int64", 2.0**63), 2**63), (("int64", 1e30), None),
          (("int64", float("nan")), None), (("int64", float("inf")), None), (("int64", 1j), None)]  # fmt: skip


@pytest.mark.parametrize("key, want", SCALES, ids=repr)
def test_alpha_as_torch_converts_it(key, want):
    dtype, value = key
    t = getattr(torch, dtype)
    one = torch.ones(1, 1, dtype=t)
    try:
        got = torch.addmm(one * 0, one, one, alpha=value).item()
    except RuntimeError:
        got = None
    if want is None:
        assert got is None
        with pytest.raises((ValueError, TypeError), match=r"^addmm: alpha must"):
            integer_scale(value, dtype, "alpha", "addmm")
        return
    assert integer_scale(value, dtype, "alpha", "addmm") == want
    assert got == ti.wrap(want, dtype).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0, 1), (1, 0), (0, 0), (3, -2), (0.2, 0.6), (-1, 5.9), (2, 0)])
@pytest.mark.parametrize("name", ["addmm", "baddbmm"])
def test_addmm_with_alpha_and_beta(dtype, beta, alpha, name):
    g = torch.Generator().manual_seed(7)
    lead = (3,) if name == "baddbmm" else ()
    m1, m2 = _draw(g, (*lead, 4, 6), dtype, big=True), _draw(g, (*lead, 6, 5), dtype, big=True)
    for inp in (_draw(g, (*lead, 4, 5), dtype, big=True), _draw(g, (5,), dtype, big=True), _draw(g, (), dtype)):
        got = getattr(torch, name)(inp, m1, m2, beta=beta, alpha=alpha)
        exact = ti.addmm(inp, m1, m2, beta=beta, alpha=alpha)
        assert got.tolist() == ti.wrap(exact, dtype).tolist()
        left, right = ig.addmm_operands(name, inp, m1, m2, beta, alpha)
        _same(ig.matmul(left, right), exact, dtype)
        assert rk.compare(got, "matmul", left, right).verdict == "exact"
        off = got.clone()
        off.view(-1)[0] += 1
        assert rk.compare(off, "matmul", left, right).verdict == "mismatch"


def test_bad_integer_inputs_name_the_argument():
    b = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"^matmul: an integer a must be one of uint8, int8, int16, int32, int64 .*"
                                        r"got a\.dtype=bool"):  # fmt: skip
        ig.matmul(b, b)
    with pytest.raises(RuntimeError):  # torch refuses it too
        torch.mm(b, b)
    i8 = torch.ones(2, 2, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"^addmm: alpha must lie in \[-128, 127\] for int8 operands .* alpha=300"):
        ig.addmm_operands("addmm", i8, i8, i8, 1, 300)
    with pytest.raises(ValueError, match=r"^addmm: input, mat1 and mat2 must have one dtype; got int16, int8, int8"):
        ig.addmm_operands("addmm", i8.to(torch.int16), i8, i8, 1, 1)
    with pytest.raises(TypeError, match=r"^compare: an integer result .* argument 1 of matmul is float32"):
        rk.compare(i8 @ i8, "matmul", i8, i8.float())
