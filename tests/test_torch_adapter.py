"""refkern.torch: devices, check across backends, audit of whole models, reference mode."""

import gc
import sys
import tracemalloc
import types
import weakref
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import refkern as rk  # noqa: E402
import refkern.torch as rkt  # noqa: E402


class SmallNet(nn.Module):
    """Two convs, two linears, relu, flatten."""

    def __init__(self, conv=nn.Conv2d):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = conv(8, 8, 3, padding=1)
        self.f1 = nn.Linear(8 * 8 * 8, 32)
        self.f2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = torch.flatten(x, 1)
        return self.f2(F.relu(self.f1(x)))


# -------------------------------------------------------------------------------- devices


@pytest.fixture
def directml_standin(monkeypatch):
    """A stand-in for torch_directml following its API (device_count, device, device_name,
    has_float64_support, is_available); its 'adapter' computes on the CPU."""
    dml = types.ModuleType("torch_directml")
    dml.is_available = lambda: True
    dml.device_count = lambda: 1
    dml.device = lambda i=0: torch.device("cpu")
    dml.device_name = lambda i=0: "Stand-in DirectML adapter"
    dml.has_float64_support = lambda dev=None: False
    monkeypatch.setitem(sys.modules, "torch_directml", dml)
    return dml


def test_devices_lists_the_cpu():
    ds = rkt.devices()
    cpu = ds[0]
    assert cpu.name == "cpu" and set(cpu.dtypes) == {"float16", "bfloat16", "float32", "float64"}
    assert "float32_matmul_precision" in cpu.settings


def test_devices_find_directml(directml_standin):
    dml = [d for d in rkt.devices() if d.kind == "dml"]
    assert [d.name for d in dml] == ["dml:0"]
    assert dml[0].dtypes == ("float16", "float32")  # no float64 on DirectML
    assert "Stand-in DirectML adapter" in dml[0].description


# ---------------------------------------------------------------------------------- check


def test_check_cpu_eager_and_compiled():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    res = rkt.check(F.conv2d, x, w, b, padding=1, devices=["cpu"], compile=True)
    assert [r.backend for r in res.rows] == ["cpu", "cpu+compile"]
    assert all(r.report.verdict in ("exact", "rounding") for r in res.rows), str(res)
    text = str(res)
    assert text.splitlines()[0] == "conv2d (2, 3, 8, 8) x (4, 3, 3, 3) x (4,) (float32)"
    assert "cpu+compile" in text and "rounding" in text
    ((name, first, e),) = res.pairs
    assert (name, first) == ("cpu+compile", "cpu") and e.within
    assert text.splitlines()[-1] == f"  cpu+compile against cpu: {e.sentence}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_check_half_precisions_on_cpu(dtype):
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 64, dtype=dtype), torch.randn(8, 64, dtype=dtype), torch.randn(8, dtype=dtype)
    res = rkt.check(F.linear, x, w, b, devices="cpu")
    rep = res.rows[0].report
    assert rep.dtype == str(dtype).removeprefix("torch.")
    assert rep.verdict in ("exact", "rounding"), str(res)


def test_check_modules_and_callables():
    torch.manual_seed(2)
    m = nn.Conv2d(4, 6, 3, padding="same", padding_mode="reflect", groups=2)
    res = rkt.check(m, torch.randn(1, 4, 7, 7), devices=["cpu"])
    assert res.op == "conv2d" and res.rows[0].report.verdict in ("exact", "rounding")
    res = rkt.check(lambda a, b: a @ b, torch.randn(3, 5), torch.randn(5, 2), op="matmul", devices=["cpu"])
    assert res.rows[0].report.verdict in ("exact", "rounding")


def test_check_names_a_backend_that_cannot_take_the_dtype(directml_standin):
    x, w = torch.randn(2, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    res = rkt.check(F.linear, x, w)
    rows = {r.backend: r for r in res.rows}
    assert rows["cpu"].report.verdict in ("exact", "rounding")
    assert rows["dml:0"].report is None and rows["dml:0"].note == "dml does not support float64"
    res = rkt.check(F.linear, x.float(), w.float(), devices=["dml"])  # the DirectML code path runs
    assert res.rows[0].backend == "dml:0" and res.rows[0].report.verdict in ("exact", "rounding")


def test_check_reports_unavailable_devices_and_failures():
    x, w = torch.randn(2, 16), torch.randn(4, 16)
    res = rkt.check(F.linear, x, w, devices=["cpu", "cuda:7"])
    assert res.rows[1].backend == "cuda:7" and res.rows[1].note == "not available on this machine"

    def exploding(a, b):
        raise RuntimeError("kernel exploded\n" + "x" * 300)

    res = rkt.check(exploding, x, w.T, op="matmul", devices=["cpu"])
    row = res.rows[0]
    assert row.report is None and row.note.startswith("failed: RuntimeError: kernel exploded")
    assert row.error == "RuntimeError: kernel exploded\n" + "x" * 300 and res.to_dict()["rows"][0]["error"] == row.error


def test_check_raises_on_what_torch_rejects_and_on_unknown_arguments():
    x, w = torch.randn(2, 16), torch.randn(4, 16)
    with pytest.raises(TypeError, match=r"^linear: x and weight must have the same dtype"):
        rkt.check(nn.Linear(16, 4), x.double(), devices=["cpu"])  # float module, double input: torch raises too
    xc, wc = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    with pytest.raises(
        TypeError,
        match=r"^check: conv2d takes no argument 'paddin'; did you mean 'padding'\? conv2d takes stride, padding, dilation, groups, padding_mode\.$",
    ):
        rkt.check(F.conv2d, xc, wc, paddin=1)
    with pytest.raises(
        TypeError,
        match=r"^check: F\.conv2d takes no padding_mode \(nn\.Conv2d does\); got padding_mode='reflect'\. Check an nn\.Conv2d module",
    ):
        rkt.check(F.conv2d, xc, wc, padding=1, padding_mode="reflect")
    with pytest.raises(TypeError, match=r"^check: matmul takes no keyword arguments; got 'stride'\. Drop it\."):
        rkt.check(lambda a, b: a @ b, x, w.T, op="matmul", stride=1)
    with pytest.raises(
        TypeError, match=r"^check: bias is an operand of linear, not a keyword argument; pass it as the third operand\."
    ):
        rkt.check(F.linear, x, w, op="linear", bias=torch.randn(4))


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [1, (2, 1), (1,), "same", "valid"], ids=str)
@pytest.mark.parametrize("nd", [1, 2])
def test_torch_function_takes_padding_mode_as_nn_conv_does(mode, padding, nd):
    if nd == 1 and isinstance(padding, tuple) and len(padding) == 2:
        padding = padding[:1]
    torch.manual_seed(7)
    cls = nn.Conv1d if nd == 1 else nn.Conv2d
    fn = rkt.torch_function(f"conv{nd}d")
    m = cls(4, 6, 4 if padding == "same" else 3, padding=padding if padding != (1,) else 1, padding_mode=mode, groups=2)
    x = torch.randn(2, 4, *([9] if nd == 1 else [7, 8]))
    with torch.no_grad():
        want = m(x)
        got = fn(x, m.weight, m.bias, padding=padding, groups=2, padding_mode=mode)
    assert torch.equal(got, want)
    res = rkt.check(fn, x, m.weight.detach(), m.bias.detach(), padding=padding, groups=2, padding_mode=mode,
                    op=f"conv{nd}d", devices=["cpu"])  # fmt: skip
    assert res.rows[0].report.verdict in ("exact", "rounding"), str(res)


def test_check_says_why_two_backends_differ(directml_standin):
    torch.manual_seed(8)
    x, w, b = torch.randn(4, 64), torch.randn(8, 64), torch.randn(8)
    res = rkt.check(F.linear, x, w, b, devices=["cpu", "dml"])  # the stand-in computes on the CPU too
    assert [(n, f) for n, f, _ in res.pairs] == [("dml:0", "cpu")]
    e = res.pairs[0][2]
    assert e.differ == 0 and e.within
    assert str(res).splitlines()[-1] == "  dml:0 against cpu: cpu and dml:0 are identical, element for element; " + (
        "both are the correctly rounded result." if e.first.verdict == "exact" else "both are rounding."
    )
    assert res.to_dict()["pairs"][0]["sentence"] == e.sentence


def test_check_errors():
    with pytest.raises(ValueError, match=r"^check: cannot tell what 'relu' computes; pass op="):
        rkt.check(F.relu, torch.randn(3))
    with pytest.raises(ValueError, match=r"^check: unknown device 'tpu'"):
        rkt.check(F.linear, torch.randn(2, 3), torch.randn(2, 3), devices=["tpu"])
    with pytest.raises(ValueError, match=r"^check: unknown op='conv4d'"):
        rkt.check(lambda *a: a[0], torch.randn(2), op="conv4d")


# ---------------------------------------------------------------------------------- audit


def test_audit_small_cnn_mlp():
    torch.manual_seed(3)
    net = SmallNet()
    x = torch.randn(4, 3, 8, 8)
    with rkt.audit() as a:
        net(x)
    products = [c for c in a.calls if c.op != "relu"]
    assert [c.name for c in products] == ["SmallNet.c1", "SmallNet.c2", "SmallNet.f1", "SmallNet.f2"]
    assert [c.op for c in products] == ["conv2d", "conv2d", "linear", "linear"]
    assert [c.aten for c in products] == ["aten.convolution.default"] * 2 + ["aten.addmm.default"] * 2
    relus = [c for c in a.calls if c.op == "relu"]  # F.relu is IEEE-defined: checked bit for bit, not skipped
    assert len(relus) == 3 and all(isinstance(c.report, rkt.BitReport) and c.verdict == "exact" for c in relus)
    assert all(c.verdict in ("exact", "rounding") for c in a.calls)
    assert a.first_failure is None and a.unchecked == {}
    text = a.report()
    assert text.startswith("audit: 7 of 7 ops checked (4 rounding, 3 exact); every op is exact or rounding")
    assert "not checked" not in text


class OnBuggyBackend(torch.Tensor):
    """A tensor on a stand-in backend whose convolution kernel is broken: it drops the last input
    channel. Like a real backend's kernel it sits below torch's dispatcher (a tensor subclass's
    ``__torch_dispatch__``), where the audit sees the op's true inputs and the kernel's output."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        args, kwargs = tree_map(lambda t: t.elem if isinstance(t, cls) else t, (args, kwargs or {}))
        if func is torch.ops.aten.convolution.default:
            x, w = args[0], args[1]
            args = (x[:, :-1], w[:, :-1], *args[2:])
        return func(*args, **kwargs)  # plain tensors: results come back to the CPU


class ConvOnBuggyBackend(nn.Conv2d):
    def forward(self, x):
        return F.conv2d(OnBuggyBackend(x), self.weight, self.bias, padding=self.padding)


def test_audit_names_the_wrong_layer():
    torch.manual_seed(4)
    net = SmallNet(conv=ConvOnBuggyBackend)
    x = torch.randn(2, 3, 8, 8)
    with rkt.audit() as a:
        net(x)
    f = a.first_failure
    assert f is not None and f.name == "SmallNet.c2" and f.verdict == "mismatch" and f.op == "conv2d"
    assert a.calls[0].verdict in ("exact", "rounding")
    assert all(c.verdict in ("exact", "rounding") for c in a.calls if c is not f)  # the rest: still rounding
    assert f"first call beyond exact/rounding: #{f.index} SmallNet.c2 (conv2d): mismatch" in a.report()


def test_audit_table_is_in_call_order_unless_asked_for_worst_first():
    torch.manual_seed(4)
    net = SmallNet(conv=ConvOnBuggyBackend)
    x = torch.randn(2, 3, 8, 8)
    with rkt.audit() as a:
        net(x)
    lines = a.report().splitlines()
    n = len(a.calls)
    assert lines[1] == "calls in call order:" and lines[2].startswith("#  module")
    assert [ln.split()[0] for ln in lines[3:-1]] == [str(i) for i in range(n)]
    assert lines[-1].startswith("(error/noise: ")  # what the columns mean, under the table
    worst = a.report(order="worst").splitlines()
    assert worst[1] == "calls worst first (mismatch, then by bound ratio):"
    assert worst[3].split()[:2] == [str(a.first_failure.index), "SmallNet.c2"]  # the mismatch leads
    assert sorted(int(ln.split()[0]) for ln in worst[3:-1]) == list(range(n))
    with pytest.raises(ValueError, match=r"^audit: unknown order='best'; choose one of 'call', 'worst'\."):
        a.report(order="best")


def test_audit_names_a_stray_autocast():
    class HalfConv(nn.Conv2d):
        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return super().forward(x).float()

    torch.manual_seed(5)
    net = SmallNet(conv=HalfConv)
    x = torch.randn(2, 3, 8, 8)
    with rkt.audit() as a:
        net(x)
    # at the dispatcher autocast is a conversion of c2's inputs to bfloat16 (IEEE-defined, checked bit for bit)
    # and a bfloat16 convolution, correct for the inputs it got: the audit names the lowered precision
    (conv,) = [c for c in a.calls if c.name == "SmallNet.c2" and c.op == "conv2d"]
    assert conv.dtype == "bfloat16" and conv.verdict in ("exact", "rounding")
    assert a.lowered == {("SmallNet.c2", "float32", "bfloat16"): 3}  # input, weight, bias
    assert "precision lowered: SmallNet.c2 float32 -> bfloat16 x3" in a.report()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_audit_half_models(dtype):
    torch.manual_seed(6)
    net = SmallNet().to(dtype)
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    with rkt.audit() as a:
        net(x)
    assert [c.op for c in a.calls] == ["conv2d", "relu", "conv2d", "relu", "linear", "relu", "linear"]
    assert all(c.dtype == str(dtype).removeprefix("torch.") for c in a.calls)
    assert all(c.verdict in ("exact", "rounding") for c in a.calls), a.report()


def test_audit_matmul_family_and_unsupported_calls():
    a_, b_, bias, c_ = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5), torch.randn(3, 5)
    huge = (c_.double(), a_.double() * 1e300, b_.double())
    with rkt.audit() as a:
        _ = a_ @ b_
        _ = torch.mm(a_, b_)
        _ = torch.bmm(a_[None], b_[None])
        _ = torch.addmm(bias, a_, b_)
        _ = torch.addmm(c_, a_, b_)  # a 2-D input: the exact form [mat1 | input] @ [mat2 ; I]
        _ = torch.baddbmm(torch.zeros(1, 3, 5), a_[None], b_[None], beta=0)
        _ = torch.baddbmm(c_[None], a_[None], b_[None], beta=0.5, alpha=-1.25)
        _ = torch.addmm(*huge, alpha=0.1)  # float64 beyond TwoProduct's range
    assert [c.aten.split(".")[1] for c in a.calls] == ["mm", "mm", "bmm", "addmm", "addmm", "baddbmm", "baddbmm",
                                                       "addmm"]  # fmt: skip
    assert [c.op for c in a.calls] == ["matmul", "matmul", "matmul", "linear", "matmul", "matmul", "matmul", "addmm"]
    assert [c.verdict for c in a.calls][:4] == [a.calls[0].verdict] * 4
    assert all(c.verdict in ("exact", "rounding") for c in a.calls[4:7]), a.report()
    assert a.calls[4].shapes == [(3, 5), (3, 4), (4, 5)]  # the call's own operands, not the exact form's
    assert a.calls[7].report is None and "beyond 2**995" in a.calls[7].note
    assert a.unchecked == {"addmm": 1} and a.summary().startswith("7 of 8 ops checked")


def _audit_peak(n_layers):
    torch.manual_seed(7)
    layers = nn.Sequential(*[nn.Linear(512, 512) for _ in range(n_layers)])
    x = torch.randn(256, 512)
    refs = []
    hooks = [m.register_forward_hook(lambda m, i, o: refs.append(weakref.ref(o))) for m in layers]
    tracemalloc.start()
    with torch.no_grad(), rkt.audit() as a:
        out = layers(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    for h in hooks:
        h.remove()
    del out
    gc.collect()
    assert len(a.calls) == n_layers
    return peak, sum(r() is not None for r in refs)


def test_audit_keeps_no_activation_alive():
    """Every output is freed after its call, and the peak memory of the analysis (numpy's buffers,
    which tracemalloc sees) is one call's worth: the same for 50 large calls as for 5."""
    peak5, alive5 = _audit_peak(5)
    peak50, alive50 = _audit_peak(50)
    print(f"\naudit of 256x512 linear calls: peak traced memory {peak5 / 2**20:.1f} MiB for 5 calls, "
          f"{peak50 / 2**20:.1f} MiB for 50; outputs still alive: {alive5}, {alive50}")  # fmt: skip
    assert alive5 == alive50 == 0
    assert peak50 < 1.25 * peak5  # keeping each call's data would grow it tenfold


# ------------------------------------------------------------------------ reference mode


def test_reference_mode_equals_refkern_ops_by_hand():
    torch.manual_seed(8)
    net = SmallNet()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        with rkt.reference_mode() as mode:
            got = net(x)
        h = F.relu(rk.conv2d(x, net.c1.weight, net.c1.bias, padding=1))
        h = F.relu(rk.conv2d(h, net.c2.weight, net.c2.bias, padding=1))
        h = F.relu(rk.linear(torch.flatten(h, 1), net.f1.weight, net.f1.bias))
        want = rk.linear(h, net.f2.weight, net.f2.bias)
    assert mode.replaced == 4
    assert torch.equal(got, want)


def test_compare_outputs_judges_a_candidate():
    torch.manual_seed(9)
    net = SmallNet()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        with rkt.reference_mode():
            ref = net(x)
        eager = net(x)
        res = rkt.compare_outputs(eager, ref, eager)
        assert res.ok and res.ratio == 1.0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = net(x).float()
        res = rkt.compare_outputs(low, ref, eager)
        assert not res.ok and res.candidate_error > 10 * res.baseline_error
        assert "WORSE than the baseline" in str(res)
    with pytest.raises(ValueError, match=r"^compare_outputs: actual, reference and baseline must hold"):
        rkt.compare_outputs(eager, ref[:1], eager)


# ----------------------------------------------------------------- real accelerators only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tf32_on_and_off():
    torch.manual_seed(10)
    x, w = torch.randn(64, 1024), torch.randn(128, 1024)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        on = rkt.check(F.linear, x, w, devices=["cuda"]).rows[0].report
        torch.backends.cuda.matmul.allow_tf32 = False
        off = rkt.check(F.linear, x, w, devices=["cuda"]).rows[0].report
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert (on.verdict, on.precision) == ("reduced-precision", "tf32"), str(on)
    assert off.verdict in ("rounding", "exact"), str(off)


def test_real_directml_if_installed():
    dml = pytest.importorskip("torch_directml")
    if not dml.is_available():
        pytest.skip("torch_directml is installed but no DirectX 12 adapter is available")
    res = rkt.check(F.linear, torch.randn(4, 64), torch.randn(8, 64), devices=["dml"])
    assert res.rows and all(r.report is not None for r in res.rows), str(res)


# ------------------------------------------------- regressions found in review


def _addmm_exact(inp, m1, m2, beta, alpha):
    """beta * input + alpha * mat1 @ mat2 in Fractions, alpha and beta as float32 (torch's opmath for float32)."""
    a, b = (Fraction(float(torch.tensor(float(v), dtype=torch.float32))) for v in (alpha, beta))
    C, A, B = inp.expand(m1.shape[0], m2.shape[1]).tolist(), m1.tolist(), m2.tolist()
    return [[b * Fraction(C[i][j]) + a * sum(Fraction(A[i][k]) * Fraction(B[k][j]) for k in range(len(B)))
             for j in range(len(B[0]))] for i in range(len(A))]  # fmt: skip


def _nearest_float32(got, want):
    """Every element of the float32 tensor ``got`` is a float32 nearest to the Fraction ``want[i][j]``."""
    for i in range(got.shape[0]):
        for j in range(got.shape[1]):
            g = np.float32(got[i, j].item())
            err = abs(Fraction(float(g)) - want[i][j])
            for side in (-np.inf, np.inf):
                assert err <= abs(Fraction(float(np.nextafter(g, np.float32(side)))) - want[i][j]), (i, j)


def test_addmm_with_a_row_bias_is_not_mistaken_for_a_column_bias():
    torch.manual_seed(11)
    inp, m1, m2 = torch.randn(3, 1), torch.randn(3, 4), torch.randn(4, 3)
    with torch.no_grad(), rkt.reference_mode() as mode:
        got = torch.addmm(inp, m1, m2)
    assert mode.replaced == 1 and not mode.passed_through and got.dtype == torch.float32
    _nearest_float32(got, _addmm_exact(inp, m1, m2, 1, 1))  # input (3, 1): a bias per row, not per column
    assert rkt.check(torch.addmm, torch.randn(3), m1, m2, devices="cpu").rows[0].report.verdict in ("exact", "rounding")


@pytest.mark.parametrize("beta, alpha", [(0.7, 0.6), (0, 0.3), (2.5, 0), (-1, 1), (1, -3.1)])
def test_addmm_any_alpha_beta_and_input_is_computed_exactly_and_judged(beta, alpha):
    torch.manual_seed(3)
    inp, m1, m2 = torch.randn(4, 5), torch.randn(4, 6), torch.randn(6, 5)
    with torch.no_grad(), rkt.reference_mode() as mode:
        got = torch.addmm(inp, m1, m2, beta=beta, alpha=alpha)
    assert mode.replaced == 1 and not mode.passed_through
    _nearest_float32(got, _addmm_exact(inp, m1, m2, beta, alpha))
    res = rkt.check(torch.addmm, inp, m1, m2, beta=beta, alpha=alpha, devices="cpu")
    assert res.rows[0].report.verdict in ("exact", "rounding")
    if beta:  # the input scaled by beta * 1.001: a mismatch
        spec = rkt.ops.from_call(torch.addmm, (inp, m1, m2), {"beta": beta, "alpha": alpha})
        wrong = torch.addmm(inp, m1, m2, beta=beta * 1.001, alpha=alpha)
        assert rk.compare(wrong, spec.op, *spec.args).verdict == "mismatch"


def test_audit_says_when_calls_were_not_analysed():
    inp, m1, m2 = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    huge = (inp.double(), m1.double() * 1e300, m2.double())
    with rkt.audit() as a:
        torch.addmm(*huge, alpha=0.1)  # float64 beyond TwoProduct's range
        torch.mm(m1, m2)
    assert a.first_failure is None and len(a.not_analysed) == 1
    lines = a.report().splitlines()
    assert lines[0] == "audit: 1 of 2 ops checked (1 rounding); every checked op is exact or rounding"
    assert lines[1] == "not checked: addmm x1"
    assert lines[2].startswith("  addmm: a form refkern does not reproduce (addmm with alpha=0.1, beta=1: a product")


def test_audit_allow_takes_a_precision():
    x, w = torch.randn(8, 128), torch.randn(8, 128)
    from refkern.accumulate.formats import TFLOAT32, round_array

    def tf32(t):
        return torch.from_numpy(round_array(t.double().numpy(), *TFLOAT32.params, False)).float()

    x, w = tf32(x), tf32(w)
    with rkt.audit(allow=("exact", "rounding", "tf32")) as a:
        F.linear(x, w)
    assert a.calls[0].report.precision is None or a.first_failure is None


def test_check_refuses_an_unknown_module_with_a_clear_message():
    class MyLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            return F.linear(x, self.w)

    with pytest.raises(ValueError, match=r"^check: cannot tell what MyLinear computes, nor its operands"):
        rkt.check(MyLinear(), torch.randn(2, 4), op="linear")


def test_compare_outputs_checks_the_baseline_too():
    with pytest.raises(ValueError, match=r"^compare_outputs: actual, reference and baseline must hold"):
        rkt.compare_outputs(torch.ones(3), torch.ones(3), torch.ones(1))


def test_reference_mode_leaves_out_calls_alone():
    x, w, res = torch.randn(2, 3), torch.randn(3, 4), torch.empty(2, 4)
    with rkt.reference_mode() as mode:
        torch.matmul(x, w, out=res)
    assert torch.equal(res, x @ w) and mode.passed_through == ["matmul with out="]
