"""The audit on real models, end to end: ResNet-18 (built here), nn.TransformerEncoder, and
transformers' BertModel and ViTModel from tiny random configurations (nothing is downloaded);
healthy, and with one broken kernel injected below the dispatcher: the first failure is named,
everything else stays rounding or exact. Then compiled models, layer by layer."""

import operator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from audit_models import BrokenKernel, randomize_batch_norm, resnet18  # noqa: E402

import refkern.torch as rkt  # noqa: E402

aten = torch.ops.aten
OK = ("exact", "rounding")


def _healthy(a):
    assert a.first_failure is None, a.report()
    assert all(c.verdict in OK for c in a.calls), a.report()
    assert not a.not_analysed, a.report()


def _broken(a, mode, op_name):
    """The first failure is the broken op; every other judged op is still exact or rounding."""
    f = a.first_failure
    assert mode.broken, "the broken kernel never ran"
    assert f is not None and f.aten.split(".")[1] == op_name and f.verdict == "mismatch", a.report()
    assert all(c.verdict in OK for c in a.calls if c is not f), a.report()
    return f


# ------------------------------------------------------------------------------ ResNet-18


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return randomize_batch_norm(resnet18(num_classes=10)).eval()


def test_resnet18_is_audited_op_by_op(resnet):
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), rkt.audit() as a:
        resnet(x)
    _healthy(a)
    assert a.unchecked == {} and a.n_checked == a.n_ops  # every op of a ResNet has a reference or is bitwise
    ops = [c.op for c in a.calls]
    assert ops.count("conv2d") == 20 and ops.count("batch_norm") == 20 and ops.count("linear") == 1
    assert ops.count("relu") == 17 and ops.count("add") == 8 and ops.count("max_pool2d") == 1
    assert "mean" in ops  # the 1x1 adaptive average pool runs as a mean
    names = [c.name for c in a.calls if c.op == "conv2d"]
    assert names[:3] == ["ResNet.conv1", "ResNet.layer1.0.conv1", "ResNet.layer1.0.conv2"]
    assert "ResNet.layer2.0.downsample.0" in names
    assert a.report().startswith(f"audit: {a.n_ops} of {a.n_ops} ops checked (")


def test_resnet18_with_a_broken_convolution(resnet):
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), BrokenKernel(aten.convolution.default, nth=4) as bad, rkt.audit() as a:
        resnet(x)
    f = _broken(a, bad, "convolution")
    assert f.name == "ResNet.layer1.1.conv2" and f.op == "conv2d"  # the 5th convolution
    assert f"first call beyond exact/rounding: #{f.index} ResNet.layer1.1.conv2 (conv2d): mismatch" in a.report()


# ---------------------------------------------------------------------- TransformerEncoder


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def test_transformer_encoder_every_op(encoder):
    x = torch.randn(2, 5, 16)
    with rkt.audit() as a:  # autograd on: torch runs the composed path
        encoder(x)
    _healthy(a)
    assert a.unchecked == {}
    ops = [c.op for c in a.calls]
    assert ops.count("scaled_dot_product_attention") == 2 and ops.count("layer_norm") == 4
    assert ops.count("linear") == 6 and ops.count("matmul") == 2  # out, ffn x2 per layer; packed in-projections
    assert {c.name for c in a.calls if c.op == "scaled_dot_product_attention"} == {
        "TransformerEncoder.layers.0.self_attn", "TransformerEncoder.layers.1.self_attn"}  # fmt: skip


def test_transformer_encoder_fused_path_is_named_not_looked_inside(encoder):
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), rkt.audit() as a:
        encoder(x)
    assert a.unchecked == {"_transformer_encoder_layer_fwd": 2} and a.n_checked == 0
    assert "fused kernel: several ops in one, not looked inside" in a.report()
    assert "every" not in a.summary()  # never 'everything is fine' when nothing was judged


def test_transformer_encoder_with_a_broken_attention(encoder):
    x = torch.randn(2, 5, 16)
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu.default
    with BrokenKernel(sdpa, nth=1) as bad, rkt.audit() as a:
        encoder(x)
    f = _broken(a, bad, "_scaled_dot_product_flash_attention_for_cpu")
    assert f.name == "TransformerEncoder.layers.1.self_attn" and f.op == "scaled_dot_product_attention"


# ------------------------------------------------------------------------------ transformers


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16)  # fmt: skip
    return transformers.BertModel(cfg).eval()


def test_bert_every_op_judged_or_named(bert):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), rkt.audit() as a:
        bert(input_ids=ids)
    _healthy(a)
    assert not a.unchecked  # the FFN activations (gelu) and the pooler (tanh) too: refkern.analysis.elementwise
    ops = [c.op for c in a.calls]
    assert ops.count("scaled_dot_product_attention") == 2 and ops.count("layer_norm") == 5
    assert ops.count("linear") == 2 * 6 + 1  # q, k, v, out, ffn x2 per layer; the pooler
    assert ops.count("gelu") == 2 and ops.count("tanh") == 1
    assert a.summary() == f"{a.n_ops} of {a.n_ops} ops checked ({_how(a)}); every op is exact or rounding"
    assert not any(line.startswith("not checked") for line in a.report().splitlines())


def _how(a):
    v = {}
    for c in a.calls:
        v[c.verdict] = v.get(c.verdict, 0) + 1
    return ", ".join(f"{v[k]} {k}" for k in sorted(v, key=lambda k: (-v[k], k)))


def test_bert_with_a_broken_linear(bert):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), BrokenKernel(aten.addmm.default, nth=4) as bad, rkt.audit() as a:
        bert(input_ids=ids)
    f = _broken(a, bad, "addmm")
    assert (
        f.name == "BertModel.encoder.layer.0.intermediate.dense" and f.op == "linear"
    )  # after q, k, v and the attention output


def test_vit_every_op_judged_or_named():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    cfg = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64)  # fmt: skip
    vit = transformers.ViTModel(cfg).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad(), rkt.audit() as a:
        vit(pixel_values=x)
    _healthy(a)
    assert not a.unchecked  # gelu and the pooler's tanh judged too
    assert [c.op for c in a.calls][0] == "conv2d" and a.calls[
        0
    ].name == "ViTModel.embeddings.patch_embeddings.projection"


# -------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize(
    "op, make",
    [
        ("conv2d", lambda g: ((torch.randn(3, 8, 11, 9, generator=g), torch.randn(12, 4, 3, 3, generator=g),
                               torch.randn(12, generator=g)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                                                                   groups=2))),
        ("conv1d", lambda g: ((torch.randn(2, 5, 30, generator=g), torch.randn(7, 5, 4, generator=g), None),
                              dict(stride=3, padding=2))),
        ("linear", lambda g: ((torch.randn(4, 6, 16, generator=g), torch.randn(9, 16, generator=g),
                               torch.randn(9, generator=g)), {})),
        ("matmul", lambda g: ((torch.randn(3, 10, 16, generator=g), torch.randn(3, 16, 12, generator=g)), {})),
        ("softmax", lambda g: ((torch.randn(4, 7, 9, generator=g),), dict(dim=1))),
        ("layer_norm", lambda g: ((torch.randn(6, 5, 8, generator=g),), dict(normalized_shape=(8,)))),
        ("batch_norm", lambda g: ((torch.randn(3, 6, 7, 5, generator=g), torch.randn(6, generator=g),
                                   torch.rand(6, generator=g) + 0.5), dict(weight=torch.randn(6, generator=g),
                                                                          bias=torch.randn(6, generator=g)))),
    ],
)  # fmt: skip
def test_a_sample_is_the_exact_reference_of_those_elements(op, make):
    """The smaller call's reference equals the full reference at the sampled elements, bit for bit."""
    import refkern as rk
    from refkern.torch.sample import restrict

    args, kw = make(torch.Generator().manual_seed(5))
    full = getattr(rk, op)(*args, **kw)
    marked = torch.arange(full.numel(), dtype=torch.float64).reshape(full.shape)  # which element is which
    got = restrict(op, marked, args, kw, 40)
    assert got is not None
    where, sub_args, sub_kw = got
    assert 0 < where.numel() <= max(40, where.shape[-1] if op in ("softmax", "layer_norm") else 40)
    sub = getattr(rk, op)(*sub_args, **sub_kw)
    assert torch.equal(sub.reshape(-1), full.reshape(-1)[where.reshape(-1).long()])


def test_audit_with_a_sample_judges_fewer_elements_and_still_finds_the_bug(resnet):
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), rkt.audit(sample=256) as a:
        resnet(x)
    _healthy(a)
    convs = [c for c in a.calls if c.op == "conv2d"]
    assert all(0 < c.sampled <= 256 for c in convs)  # every conv output here has more than 256 elements
    assert all(0 < c.sampled <= 256 for c in a.calls if c.op == "batch_norm")  # eval: elementwise per channel
    assert f"{convs[0].sampled} sampled elements" in a.report()
    with torch.no_grad(), BrokenKernel(aten.convolution.default, nth=4) as bad, rkt.audit(sample=256) as a:
        resnet(x)
    assert _broken(a, bad, "convolution").name == "ResNet.layer1.1.conv2"
    with pytest.raises(ValueError, match=r"^audit: sample must be a positive number of elements or None; got "):
        rkt.audit(sample=0)


def test_progress_line_goes_to_stderr_only_when_asked(capsys):
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with rkt.audit(progress=False) as a:
        lin(x)
    assert capsys.readouterr().err == ""
    with rkt.audit(progress=True) as a:
        lin(x)
    out = capsys.readouterr()
    assert out.out == "" and a.n_checked == 1
    with pytest.raises(ValueError, match=r"^audit: progress must be True, False or None"):
        rkt.audit(progress="yes")


# -------------------------------------------------------------------------------- compiled


class ConvLinearModel(nn.Module):
    """The model of the torch.compile question in the seeds (004): conv, conv, linear, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = x.view(x.size(0), -1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


def test_compiled_max_autotune_model_is_audited_layer_by_layer():
    torch.manual_seed(42)
    model = ConvLinearModel()
    compiled = torch.compile(model, mode="max-autotune")
    x = torch.randn(10, 3, 8, 8)
    with rkt.audit() as a:
        out = compiled(x)  # dynamo's "already tracked for mutation" crash, before
    (comp,) = a.compiled
    assert [layer.name for layer in comp.layers] == [f"ConvLinearModel.{n}" for n in ("conv1", "conv2", "fc1", "fc2")]
    assert all(layer.compiled is not None and layer.compiled.verdict in OK for layer in comp.layers), comp.lines()
    assert all(layer.eager in OK for layer in comp.layers) and comp.first_divergence is None
    assert "max_autotune" in comp.backend and comp.end_to_end.ok
    _healthy(a)  # the eager run of the same model, op by op
    assert torch.allclose(out, model(x), rtol=1e-4, atol=1e-5) and not torch.nn.modules.module._has_any_global_hook()


def _buggy_conv(x, w, b=None, *args):
    return torch.conv2d(x[:, :-1], w[:, :-1], b, *args)  # a compiler that drops the last input channel


def test_compiled_model_with_a_broken_compiler_names_the_first_divergent_layer():
    graphs = []

    def broken(gm, example_inputs):  # a backend: the graph as is, its convolutions miscompiled
        graphs.append(gm)
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.conv2d:
                n.target = _buggy_conv
        gm.recompile()
        return gm.forward

    torch.manual_seed(43)
    model = ConvLinearModel()
    x = torch.randn(4, 3, 8, 8)
    with rkt.audit() as a:
        compiled = torch.compile(model, backend=broken)
        compiled(x)
    (comp,) = a.compiled
    assert len(graphs) >= 1 + 4  # the whole model, then each leaf alone
    d = comp.first_divergence
    assert d is not None and d.name == "ConvLinearModel.conv1" and d.eager in OK and d.compiled.verdict == "mismatch"
    assert [layer.compiled.verdict in OK for layer in comp.layers] == [False, False, True, True]
    assert not comp.end_to_end.ok
    lines = "\n".join(comp.lines())
    assert "first divergence beyond exact/rounding: ConvLinearModel.conv1 (conv2d)" in lines
    assert "WORSE than the baseline" in lines


def test_a_module_compiled_inside_the_audit_in_a_fresh_process_is_routed_too():
    """Before torch._dynamo is imported the audit wraps torch.compile, so that a module compiled inside
    it is audited as compiled (dynamo would otherwise run it eagerly under the audit's mode)."""
    import subprocess
    import sys

    code = (
        "import sys, torch, torch.nn as nn\n"
        "import refkern.torch as rkt\n"
        "assert 'torch._dynamo.eval_frame' not in sys.modules\n"
        "m = nn.Sequential(nn.Linear(4, 3))\n"
        "with rkt.audit() as a:\n"
        "    c = torch.compile(m, backend=lambda gm, ex: gm.forward)\n"
        "    c(torch.randn(2, 4))\n"
        "assert torch.compile.__name__ == 'compile' and 'compile_then_route' not in repr(torch.compile)\n"
        "print(len(a.compiled), [layer.compiled.verdict for layer in a.compiled[0].layers])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    n, verdicts = r.stdout.split(" ", 1)
    assert n == "1" and verdicts.strip() in ("['rounding']", "['exact']")


TINY = """
import torch
from torch import nn


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
"""


def test_cli_audit_compile(tmp_path):
    """``refkern audit --compile``, through the real entry point: the compiled model judged layer by layer
    (each leaf compiled alone by inductor), the first divergence (none), end to end, and the JSON."""
    import json
    import subprocess
    import sys

    (tmp_path / "tiny.py").write_text(TINY)
    cmd = [sys.executable, "-m", "refkern", "audit", "tiny:tiny", "--input-shape", "2,8", "--compile", "default",
           "--json", str(tmp_path / "a.json")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("audit: 3 of 3 ops checked (") and "every op is exact or rounding" in out.splitlines()[0]
    assert "compiled Sequential (inductor), layer by layer:" in out
    for leaf in ("Sequential.0 (linear): eager rounding, compiled", "Sequential.1 (ReLU): eager exact, compiled output "
                 "equal to eager, bit for bit", "Sequential.2 (linear): eager rounding, compiled"):  # fmt: skip
        assert leaf in out, out
    assert "first divergence beyond exact/rounding: none" in out and "end to end against the exact-reference" in out
    d = json.loads((tmp_path / "a.json").read_text())
    (comp,) = d["compiled"]
    assert comp["model"] == "Sequential" and comp["first_divergence"] is None
    assert [x["name"] for x in comp["layers"]] == ["Sequential.0", "Sequential.1", "Sequential.2"]
    assert all(x["compiled"]["verdict"] in OK for x in (comp["layers"][0], comp["layers"][2]))


# ---------------------------------------------------- compiled transformers, healthy and miscompiled


def _perturbed(fn, when=lambda *a, **k: True):
    """``fn`` with every 7th output element (of its first output) scaled by (1 + 2**-8) where ``when(*args)``:
    a miscompiled kernel."""

    def broken(*args, **kwargs):
        out = fn(*args, **kwargs)
        if when(*args, **kwargs):
            first = out[0] if isinstance(out, tuple) else out  # (attention output, weights): the first
            flat = first.clone().reshape(-1)
            flat[::7] *= 1 + 2**-8
            first = flat.view(first.shape)
            out = (first, *out[1:]) if isinstance(out, tuple) else first
        return out

    return broken


def _miscompiling(targets, broken, graphs):
    """A backend that runs dynamo's graph as is, with every call of one of ``targets`` replaced by ``broken``."""

    def backend(gm, example_inputs):
        n = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in targets:
                node.target = broken
                n += 1
        gm.recompile()
        graphs.append(n)
        return gm.forward

    return backend


def _compiled_encoder():
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()


ENCODER_LAYERS = [f"TransformerEncoder.layers.0.{n}" for n in ("self_attn", "dropout1", "norm1", "linear1", "dropout",
                                                               "linear2", "dropout2", "norm2")]  # fmt: skip


def test_compiled_transformer_encoder_is_audited_layer_by_layer():
    """inductor (default mode) on a 1-layer encoder, autograd on (torch's composed path, not the fused one).
    The attention calls none of its children (MultiheadAttention owns ``out_proj`` and uses its parameters):
    it is compiled alone as one unit and judged end to end against its exact-reference forward; the layer's
    residual adds and ReLU are judged eagerly op by op and, compiled, only with the whole model."""
    enc = _compiled_encoder()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with rkt.audit() as a:
        out = torch.compile(enc)(x)
    _healthy(a)
    (comp,) = a.compiled
    assert [layer.name for layer in comp.layers] == ENCODER_LAYERS, comp.lines()
    judged = {layer.name.rsplit(".", 1)[1]: layer for layer in comp.layers}
    for n in ("norm1", "linear1", "linear2", "norm2"):  # against the exact reference of the inputs each received
        assert judged[n].compiled is not None and judged[n].compiled.verdict in OK, comp.lines()
        assert judged[n].eager in OK
    assert all(judged[n].same_as_eager for n in ("dropout", "dropout1", "dropout2"))  # eval: the identity
    attn = judged["self_attn"]
    assert attn.module == "MultiheadAttention" and attn.unit.ok and attn.compiled is None and attn.eager in OK
    assert comp.first_divergence is None and comp.end_to_end.ok
    assert torch.allclose(out, enc(x), rtol=1e-4, atol=1e-5)
    lines = "\n".join(comp.lines())
    assert "first divergence beyond exact/rounding: none" in lines
    assert "self_attn (MultiheadAttention): eager rounding, compiled alone as one unit (not op by op)" in lines
    assert comp.outside_leaves == {"TransformerEncoder.layers.0": {"add": 2, "relu": 1}}  # residuals, activation
    assert (
        "not compiled alone (judged eagerly op by op, compiled only end to end): 3 ops outside leaf modules: "
        "TransformerEncoder.layers.0 (add x2, relu)"
    ) in lines
    assert comp.not_called == ["TransformerEncoder.layers.0.self_attn.out_proj"]
    assert a.summary().endswith(
        "; compiled TransformerEncoder: 4 of 7 leaves judged against the exact reference, 1 modules compiled alone "
        "as units judged end to end, first divergence none; 3 ops outside leaves compiled only end to end; end to "
        "end ok"
    )


def test_compiled_transformer_encoder_with_a_miscompiled_attention():
    import torch.nn.functional as F

    graphs = []
    mha = F.multi_head_attention_forward  # dynamo keeps it as one call in the graph
    backend = _miscompiling({mha}, _perturbed(mha), graphs)
    enc = _compiled_encoder()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with rkt.audit() as a:
        torch.compile(enc, backend=backend)(x)
    _healthy(a)
    (comp,) = a.compiled
    assert graphs[:2] == [1, 1]  # the model's attention, then the attention module alone
    d = comp.first_divergence
    assert d is not None and d.name == "TransformerEncoder.layers.0.self_attn" and not d.unit.ok, comp.lines()
    assert all(layer.compiled.verdict in OK for layer in comp.layers if layer.compiled is not None)
    assert not comp.end_to_end.ok
    assert "first divergence beyond exact/rounding: TransformerEncoder.layers.0.self_attn (MultiheadAttention)" in (
        "\n".join(comp.lines())
    )


def test_compiled_transformer_encoder_with_a_miscompiled_layer_norm():
    import torch.nn.functional as F

    graphs = []
    backend = _miscompiling({F.layer_norm, torch.layer_norm}, _perturbed(F.layer_norm), graphs)
    enc = _compiled_encoder()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with rkt.audit() as a:
        torch.compile(enc, backend=backend)(x)
    _healthy(a)  # the eager ops are right: the compiler is what is broken
    (comp,) = a.compiled
    assert graphs[:4] == [2, 0, 0, 1]  # the model's two norms; the attention; dropout1; norm1 (norm2 reuses it)
    d = comp.first_divergence
    assert d is not None and d.name == "TransformerEncoder.layers.0.norm1" and d.op == "layer_norm", comp.lines()
    assert d.eager in OK and d.compiled.verdict == "mismatch"
    bad = [layer.name for layer in comp.layers if layer.compiled is not None and layer.compiled.verdict not in OK]
    assert bad == ["TransformerEncoder.layers.0.norm1", "TransformerEncoder.layers.0.norm2"]
    assert all(layer.compiled.verdict in OK for layer in comp.layers if "linear" in layer.name)
    assert not comp.end_to_end.ok
    assert "first divergence beyond exact/rounding: TransformerEncoder.layers.0.norm1 (layer_norm)" in "\n".join(
        comp.lines()
    )


def _compiled_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16)  # fmt: skip
    return transformers.BertModel(cfg).eval()


def test_compiled_bert_is_audited_layer_by_layer():
    bert = _compiled_bert()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), rkt.audit() as a:
        torch.compile(bert)(input_ids=ids)
    (comp,) = a.compiled
    assert a.first_failure is None and not a.not_analysed, a.report()
    by = {layer.name.removeprefix("BertModel."): layer for layer in comp.layers}
    linears = [n for n, layer in by.items() if layer.op == "linear"]
    assert linears == [
        f"encoder.layer.0.{n}"
        for n in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        )
    ] + ["pooler.dense"]
    judged = [layer for layer in comp.layers if layer.op in ("linear", "layer_norm")]
    assert len(judged) == 7 + 3 and all(layer.compiled.verdict in OK for layer in judged), comp.lines()
    assert by["embeddings.word_embeddings"].same_as_eager  # a gather: bit for bit
    assert comp.first_divergence is None and comp.end_to_end.ok


def test_compiled_bert_with_a_miscompiled_linear():
    """The compiler's linear is wrong only for the FFN's up-projection (out_features 64)."""
    import torch.nn.functional as F

    graphs = []
    broken = _perturbed(F.linear, when=lambda x, w, b=None: w.shape[0] == 64)
    bert = _compiled_bert()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), rkt.audit() as a:
        torch.compile(bert, backend=_miscompiling({F.linear, torch._C._nn.linear}, broken, graphs))(input_ids=ids)
    assert a.first_failure is None, a.report()
    (comp,) = a.compiled
    d = comp.first_divergence
    assert d is not None and d.name == "BertModel.encoder.layer.0.intermediate.dense" and d.op == "linear"
    assert d.compiled.verdict == "mismatch" and d.eager in OK
    assert all(layer.compiled.verdict in OK for layer in comp.layers if layer.compiled is not None and layer is not d)
    assert not comp.end_to_end.ok


def test_a_compiled_function_runs_compiled_and_is_judged_end_to_end():
    """``torch.compile(fn)`` on a plain function: under a dispatch mode dynamo would run it eagerly (the compiled
    code never ran); the audit steps aside for the real compiled call, then judges its ops eagerly one by one
    and the compiled result end to end. A miscompiled function is WORSE end to end; its eager ops stay fine."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(6, 32, generator=g), torch.randn(32, 32, generator=g)

    def block(x, w):
        return torch.relu(x @ w) + x

    graphs = []
    healthy = torch.compile(block, backend=_miscompiling(set(), None, graphs))
    with rkt.audit() as a:
        out = healthy(x, w)
    assert graphs == [0] and torch.equal(out, block(x, w))  # compiled (the backend ran), the caller's output
    _healthy(a)
    (comp,) = a.compiled
    assert comp.kind == "function" and comp.model.endswith("block") and comp.end_to_end.ok
    assert sum(comp.outside_leaves["-"].values()) == a.n_checked == 3  # mm, relu, add
    assert a.summary().endswith(f"; compiled function {comp.model}: 3 ops, compiled, judged only end to end; "
                                "end to end ok")  # fmt: skip
    broken = torch.compile(block, backend=_miscompiling({torch.matmul, torch.Tensor.__matmul__, operator.matmul},
                                                        _perturbed(torch.matmul), graphs))  # fmt: skip
    with rkt.audit() as a:
        broken(x, w)
    _healthy(a)
    (comp,) = a.compiled
    assert graphs[1] == 1 and not comp.end_to_end.ok
    assert "end to end WORSE than eager" in a.summary()


def test_compiled_reduced_resnet_with_one_miscompiled_convolution():
    """ResNet-18's block structure (BasicBlock [2, 2, 2, 2], downsampling, the shared ReLU) at width 8 on a
    32x32 input, compiled by a backend that miscompiles only the 16-to-16-channel 3x3 convolutions: the first
    divergent layer is layer2.0.conv2, every other leaf rounding or exact. Reduced and with a backend that
    generates no code to keep CI cheap: under inductor this audit takes about 60 s on 2 cores (inductor is
    covered by the encoder, BERT and seed-model tests)."""
    graphs = []
    broken = _perturbed(torch.conv2d, when=lambda x, w, *a, **k: tuple(w.shape[:2]) == (16, 16))
    torch.manual_seed(0)
    model = randomize_batch_norm(resnet18(num_classes=10, width=8)).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), rkt.audit() as a:
        torch.compile(model, backend=_miscompiling({torch.conv2d}, broken, graphs))(x)
    _healthy(a)
    (comp,) = a.compiled
    assert graphs[0] == 20  # the whole model's convolutions
    d = comp.first_divergence
    assert d is not None and d.name == "ResNet.layer2.0.conv2" and d.op == "conv2d", comp.lines()
    bad = [layer.name for layer in comp.layers if layer.compiled is not None and layer.compiled.verdict not in OK]
    assert bad == ["ResNet.layer2.0.conv2", "ResNet.layer2.1.conv1", "ResNet.layer2.1.conv2"]
    assert sum(layer.op == "conv2d" for layer in comp.layers) == 20 and len(comp.layers) == 60
    assert comp.outside_leaves == {f"ResNet.layer{i}.{j}": {"add": 1} for i in range(1, 5) for j in range(2)}
    assert not comp.end_to_end.ok
