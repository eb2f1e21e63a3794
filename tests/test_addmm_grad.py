"""addmm's and baddbmm's gradients (refkern.torch.ops.addmm_gradients): each one forward matmul whose exact
result is the gradient, checked against exact rationals (fractions.Fraction, rounded once by the truth's own
rounding), torch CPU's gradients judged with no false alarm, and wrong gradients (a scale dropped or applied
twice) a mismatch."""

import warnings
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64  # noqa: E402
from refkern.analysis.compare import compare  # noqa: E402
from refkern.torch.ops import addmm_gradients, from_call  # noqa: E402
from refkern.truth.products import round_exact  # noqa: E402

_FMT = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: FLOAT32, torch.float64: FLOAT64}
DTYPES = tuple(_FMT)
SCALES = ((0.6, 0.2), (1, 1), (-0.7, 3.3), (0, 1), (1, 0))  # (alpha, beta)


def _round(q: Fraction, fmt) -> float:
    """A dyadic rational rounded once to fmt (the truth's rounding, not the kernels')."""
    if q == 0:
        return 0.0
    den = q.denominator
    k = den.bit_length() - 1
    assert den == 1 << k  # sums of products of binary floats are dyadic
    return round_exact(q < 0, abs(q.numerator), -k, fmt)


def _q(t):
    return np.vectorize(Fraction, otypes=[object])(t.detach().to(torch.float64).numpy())


def _opmath(s, dtype):
    return Fraction(float(torch.tensor(float(s), dtype=torch.float64 if dtype == torch.float64 else torch.float32)))


def _truth(g, inp, m1, m2, beta, alpha):
    """{argument: exact gradient rounded once}: alpha g mat2^T, alpha mat1^T g, beta g summed to the input's
    shape, every sum exact in Fraction (alpha, beta as torch's kernels take them: in the opmath type)."""
    dt = m1.dtype
    a, b = _opmath(alpha, dt), _opmath(beta, dt)
    G, A, B = _q(g), _q(m1), _q(m2)
    d1 = a * np.matmul(G, np.swapaxes(B, -1, -2))
    d2 = a * np.matmul(np.swapaxes(A, -1, -2), G)
    own = (1,) * (G.ndim - inp.dim()) + tuple(inp.shape)
    red = tuple(i for i in range(G.ndim) if own[i] != G.shape[i])
    di = (b * G).sum(axis=red, keepdims=True) if red else b * G
    di = di.reshape(tuple(inp.shape))
    fmt = _FMT[dt]
    rnd = np.vectorize(lambda q: _round(q, fmt), otypes=[np.float64])
    return {"input": rnd(di), "mat1": rnd(d1), "mat2": rnd(d2), "batch1": rnd(d1), "batch2": rnd(d2)}


def _call(name, shape_in, m, k, n, batch, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(*s):
        return torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)

    lead = (batch,) if name == "baddbmm" else ()
    inp, m1, m2 = draw(*shape_in), draw(*lead, m, k), draw(*lead, k, n)
    g = draw(*lead, m, n)
    return inp, m1, m2, g


_SHAPES = {"addmm": ((5,), (4, 1), (4, 5), (), (1, 5)), "baddbmm": ((5,), (3, 4, 5), (3, 1, 5), (4, 1), ())}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", ("addmm", "baddbmm"))
def test_gradient_calls_compute_the_exact_gradient(name, dtype):
    """Every gradient call's reference (refkern's exact matmul, rounded once to the gradient's dtype as compare
    rounds it) equals the exact rational gradient rounded once, bit for bit (compare says exact, 0 ulp), for every
    input shape and scale (alpha, beta as float32 for half and float32 tensors)."""
    fn = getattr(torch, name)
    for i, shape in enumerate(_SHAPES[name]):
        for alpha, beta in SCALES:
            inp, m1, m2, g = _call(name, shape, 4, 3, 5, 3, dtype, 10 * i)
            spec = from_call(fn, (inp, m1, m2), dict(beta=beta, alpha=alpha))
            calls = spec.gradient_calls(g)
            assert [id(t) for t, _, _ in calls] == [id(m1), id(m2), id(inp)]
            want = _truth(g, inp, m1, m2, beta, alpha)
            for _, arg, adj in calls:
                truth = torch.from_numpy(want[arg]).to(dtype)  # exact: the values are in dtype already
                assert np.array_equal(truth.to(torch.float64).numpy(), want[arg])
                rep = compare(adj.from_grad(truth), adj.op, *adj.args, **adj.kwargs)
                assert rep.verdict == "exact" and rep.max_ulp == 0, f"{name} {shape} {alpha} {beta} {arg}\n{rep}"


def test_the_names_are_torchs():
    inp, m1, m2, g = _call("baddbmm", (5,), 4, 3, 5, 2, torch.float32, 0)
    assert [a for _, a, _ in addmm_gradients(g, inp, m1, m2, 1, 1, ("input", "batch1", "batch2"))] == ["batch1",
                                                                                                      "batch2",
                                                                                                      "input"]  # fmt: skip
    spec = from_call(torch.baddbmm, (inp, m1, m2), {})
    assert [a for _, a, _ in spec.gradient_calls(g)] == ["batch1", "batch2", "input"]
    want = [(id(inp), "input"), (id(m1), "batch1"), (id(m2), "batch2")]
    assert [(id(t), a) for t, a in spec.gradient_names()] == want
    assert from_call(torch.mm, (m1[0], m2[0]), {}).gradient_calls(g[0]) == []
    assert from_call(torch.mm, (m1[0], m2[0]), {}).gradient_names() == []


def test_half_input_terms_are_torchs_opmath_products_and_their_error():
    """For half g and beta != 1 each term beta g is two: fl32(beta g) and the rest, exactly (here 3.3 g for
    g = 1.0009765625 = 1 + 2**-10: fl32(3.3) g holds 35 bits)."""
    inp = torch.zeros(1, dtype=torch.float16)
    m1, m2 = torch.ones(2, 1, dtype=torch.float16), torch.ones(1, 1, dtype=torch.float16)
    g = torch.tensor([[1.0009765625], [1.0]], dtype=torch.float16)
    (_, _, adj), = [c for c in addmm_gradients(g, inp, m1, m2, 3.3, 1.0) if c[1] == "input"]  # fmt: skip
    left = adj.args[0]
    assert tuple(left.shape) == (1, 4)
    b = float(np.float32(3.3))
    hi = [float(np.float32(b * 1.0009765625)), float(np.float32(b * 1.0))]
    assert left[0, :2].tolist() == hi
    assert [Fraction(h) + Fraction(lo) for h, lo in zip(hi, left[0, 2:].tolist())] == [
        Fraction(b) * Fraction(1.0009765625), Fraction(b)]  # fmt: skip


def _allowed(dtype):
    return ("exact", "rounding") if dtype in (torch.float32, torch.float64) else ("exact", "rounding",
                                                                                  "reduced-precision")  # fmt: skip


def _torch_grads(name, shape, m, k, n, batch, dtype, alpha, beta, seed):
    inp, m1, m2, g = _call(name, shape, m, k, n, batch, dtype, seed)
    leaves = [t.requires_grad_(True) for t in (inp, m1, m2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(torch, name)(*leaves, beta=beta, alpha=alpha)
    grads = dict(zip(map(id, leaves), torch.autograd.grad(out, leaves, g)))
    spec = from_call(getattr(torch, name), tuple(leaves), dict(beta=beta, alpha=alpha))
    return [(arg, adj, grads[id(t)]) for t, arg, adj in spec.gradient_calls(g)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_torch_cpu_gradients_are_not_a_false_alarm(dtype):
    """torch CPU's gradients (fl(fl(g mat2^T) alpha), sum_to(fl(beta g))) at 64-term sums: never a mismatch;
    float32 and float64 exact or rounding (beta = 3.3: the double rounding fl16(fl32(beta g)) of half terms)."""
    for name, shape, (m, k, n) in (("addmm", (48,), (64, 96, 48)), ("addmm", (64, 1), (64, 80, 48)),
                                   ("baddbmm", (1, 24), (16, 40, 24))):  # fmt: skip
        for alpha, beta in ((0.6, 0.2), (-0.7, 3.3), (1, 1)):
            for arg, adj, got in _torch_grads(name, shape, m, k, n, 4, dtype, alpha, beta, 7):
                rep = compare(adj.from_grad(got), adj.op, *adj.args, **adj.kwargs)
                assert rep.verdict in _allowed(dtype), f"{name} {shape} {alpha} {beta} {arg}\n{rep}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_a_scale_dropped_or_applied_twice_is_a_mismatch(dtype):
    """alpha = 0.6 left out of mat1's and mat2's gradients, or beta = 0.2 applied twice to the input's: a 40%
    and an 80% error, far past any rounding (the verdict is mismatch)."""
    for arg, adj, got in _torch_grads("addmm", (48,), 64, 96, 48, 1, dtype, 0.6, 0.2, 3):
        wrong = got / 0.6 if arg != "input" else got * 0.2
        rep = compare(adj.from_grad(wrong.to(got.dtype)), adj.op, *adj.args, **adj.kwargs)
        assert rep.verdict == "mismatch", f"{arg}\n{rep}"
