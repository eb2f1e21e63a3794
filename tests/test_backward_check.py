"""refkern.torch.check(..., backward=True): every gradient of every floating-point argument (and
module parameter) judged on every backend, the gradients without a reference listed, a gradient
bug caught."""

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import refkern as rk  # noqa: E402
import refkern.torch as rkt  # noqa: E402

GOOD = ("exact", "rounding")


def _rows(res):
    return {(r.backend, r.argument): r for r in res.grads}


def test_conv2d_gradients_are_judged_with_the_seeded_grad_output():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    res = rkt.check(F.conv2d, x, w, b, padding=1, stride=2, devices=["cpu"], backward=True)
    assert res.rows[0].report.verdict in GOOD
    rows = _rows(res)
    assert sorted(rows) == [("cpu", "bias"), ("cpu", "weight"), ("cpu", "x")]
    assert all(r.report.verdict in GOOD for r in rows.values()), str(res)
    # the same verdicts as compare_backward on torch's own autograd with the documented grad_output
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    y = F.conv2d(xl, wl, bl, padding=1, stride=2)
    g = torch.randn(tuple(y.shape), generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    y.backward(g)
    reps = rk.compare_backward({"x": xl.grad, "weight": wl.grad, "bias": bl.grad}, "conv2d", g, x, w, b,
                               padding=1, stride=2)  # fmt: skip
    for k, rep in reps.items():
        assert rows[("cpu", k)].report.max_ulp == rep.max_ulp and rows[("cpu", k)].report.verdict == rep.verdict
    text = str(res)
    assert "backward (grad_output: standard normal, generator seed 0)" in text
    assert [ln.split()[:2] for ln in text.splitlines()[-3:]] == [["cpu", "x"], ["cpu", "weight"], ["cpu", "bias"]]
    d = res.to_dict()
    assert d["grad_output"].startswith("grad_output: standard normal") and len(d["grads"]) == 3
    assert d["grads"][1]["argument"] == "weight" and d["grads"][1]["report"]["verdict"] in GOOD


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_module_parameters_and_input_on_every_dtype(dtype):
    torch.manual_seed(1)
    for m, x in [(nn.Linear(16, 5), torch.randn(3, 7, 16)), (nn.Conv1d(4, 6, 3, stride=2, groups=2), torch.randn(2, 4, 11)),
                 (nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1), torch.randn(2, 4, 3, 3))]:  # fmt: skip
        res = rkt.check(m.to(dtype), x.to(dtype), devices=["cpu"], backward=True)
        rows = _rows(res)
        first = "input" if isinstance(m, nn.ConvTranspose2d) else "x"
        assert sorted(a for _, a in rows) == sorted([first, "weight", "bias"])
        assert all(r.report is not None and r.report.verdict in GOOD for r in rows.values()), str(res)
        assert all(r.report.dtype == str(dtype).removeprefix("torch.") for r in rows.values())


def test_compiled_and_given_grad_output():
    torch.manual_seed(2)
    a, b = torch.randn(2, 3, 4), torch.randn(4, 5)
    g = torch.randn(2, 3, 5)
    res = rkt.check(torch.matmul, a, b, devices=["cpu"], compile=True, backward=True, grad_output=g)
    rows = _rows(res)
    assert sorted(rows) == [("cpu", "a"), ("cpu", "b"), ("cpu+compile", "a"), ("cpu+compile", "b")]
    assert all(r.report.verdict in GOOD for r in rows.values()), str(res)
    assert res.grad_output == "grad_output: given"
    # the given grad_output is the one judged: the exact gradient of b for g, not for another
    exact = rk.backward("matmul", g, a, b)["b"]
    bl = b.clone().requires_grad_()
    torch.matmul(a, bl).backward(g)
    assert rows[("cpu", "b")].report.max_ulp == rk.compare_backward({"b": bl.grad}, "matmul", g, a, b)["b"].max_ulp
    assert torch.equal(exact, rk.backward("matmul", g, a, b)["b"])


class _DropFirstImage(torch.autograd.Function):
    """linear whose grad_weight forgets the first row of the batch: a wrong reduction over the batch."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g[1:].T @ x[1:], g.sum(0)


def test_a_gradient_bug_is_caught_and_the_others_pass():
    torch.manual_seed(3)
    x, w, b = torch.randn(8, 32), torch.randn(6, 32), torch.randn(6)
    res = rkt.check(_DropFirstImage.apply, x, w, b, op="linear", devices=["cpu"], backward=True)
    rows = _rows(res)
    assert res.rows[0].report.verdict in GOOD  # the forward is right
    assert rows[("cpu", "weight")].report.verdict == "mismatch", str(res)
    assert rows[("cpu", "x")].report.verdict in GOOD and rows[("cpu", "bias")].report.verdict in GOOD


def test_gradients_without_a_reference_are_listed():
    torch.manual_seed(4)
    x = torch.randn(3, 8)
    res = rkt.check(torch.cumsum, x, 1, devices=["cpu"], backward=True)  # every op check maps has a backward now:
    assert res.rows[0].report is not None  # cumsum's gradient (a reversed cumsum of grad_output) is judged
    assert [(r.backend, r.argument, r.report.verdict) for r in res.grads] == [("cpu", "x", "exact")]
    # addmm's tensors: each gradient judged as the forward call whose exact result it is (OpCall.gradient_calls)
    res = rkt.check(torch.addmm, torch.randn(5), torch.randn(3, 4), torch.randn(4, 5), devices=["cpu"], backward=True)
    assert {r.argument: r.report is not None and r.report.verdict in GOOD for r in res.grads} == {
        "input": True, "mat1": True, "mat2": True}
    # one tensor as both operands: its gradient is the sum of two
    a = torch.randn(4, 4)
    res = rkt.check(torch.matmul, a, a, devices=["cpu"], backward=True)
    assert [r.note for r in res.grads] == ["no backward reference: it is a and b of matmul at once (its gradient is "
                                           "the sum of theirs)"]  # fmt: skip


class _BrokenBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return a @ b

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("backward kernel exploded")


def test_a_backward_that_fails_leaves_the_forward_judged():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    res = rkt.check(_BrokenBackward.apply, a, b, op="matmul", devices=["cpu", "cuda:7"], backward=True)
    assert res.rows[0].report.verdict in GOOD
    assert [(r.backend, r.argument, r.note) for r in res.grads] == [
        ("cpu", "a", "failed: backward: RuntimeError: backward kernel exploded"),
        ("cpu", "b", "failed: backward: RuntimeError: backward kernel exploded")]  # fmt: skip


def test_grad_output_errors():
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^check: grad_output must have the output's shape and dtype, \(2, 3\) "
                       r"float32; got \(3, 2\) float32\.$"):  # fmt: skip
        rkt.check(F.linear, x, w, devices=["cpu"], backward=True, grad_output=torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"^check: grad_output must have .* got \(2, 3\) float64\.$"):
        rkt.check(F.linear, x, w, devices=["cpu"], backward=True, grad_output=torch.randn(2, 3).double())
    with pytest.raises(TypeError, match=r"^check: grad_output must be a tensor of the output's shape; got list\.$"):
        rkt.check(F.linear, x, w, devices=["cpu"], backward=True, grad_output=[1.0])
    with pytest.raises(TypeError, match=r"^check: grad_output= is the gradient fed to the backward pass; pass "):
        rkt.check(F.linear, x, w, devices=["cpu"], grad_output=torch.randn(2, 3))
