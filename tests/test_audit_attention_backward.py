"""The audit judges scaled_dot_product_attention's fused backward kernels: dq, dk and dv of
``_scaled_dot_product_flash_attention_for_cpu_backward`` (run here by ``loss.backward()``) and of the CUDA
kernels (flash, memory-efficient, cuDNN) and the overrideable one, mapped from their schemas and fed
hand-built calls here (no GPU needed), each gradient against refkern's exact gradient of the tensors the
kernel received; a backward that drops the scale from dk is caught and named by module."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = nn.functional

from audit_models import BrokenKernel, backward_audit  # noqa: E402

import refkern.torch as rkt  # noqa: E402
from refkern.gradients import compare_backward  # noqa: E402
from refkern.torch import dispatch as dsp  # noqa: E402
from refkern.torch import dispatch_backward as dbw  # noqa: E402

aten = torch.ops.aten
OK = ("exact", "rounding")
CPU_KERNEL = "_scaled_dot_product_flash_attention_for_cpu_backward"
OP = "scaled_dot_product_attention backward"


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention: grouped key/value heads, causal or
    with an additive mask, a scale of its own."""

    def __init__(self, d=16, heads=4, kv_heads=2, causal=True, mask=None, scale=None):
        super().__init__()
        self.h, self.kv, self.causal, self.mask, self.scale = heads, kv_heads, causal, mask, scale
        self.q = nn.Linear(d, d)
        self.kv_proj = nn.Linear(d, 2 * d * kv_heads // heads)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        n, t, d = x.shape
        e = d // self.h
        q = self.q(x).view(n, t, self.h, e).transpose(1, 2)
        k, v = self.kv_proj(x).view(n, t, 2 * self.kv, e).transpose(1, 2).chunk(2, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale,
                                           enable_gqa=self.kv != self.h)  # fmt: skip
        return self.out(o.transpose(1, 2).reshape(n, t, d))


def _attention_rows(a):
    return {c.name: c for c in a.calls if c.op == OP}


def test_transformer_layer_attention_backward_judged():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    a, _ = backward_audit(layer, torch.randn(2, 3, 8, requires_grad=True))
    assert a.first_failure is None and not a.not_analysed, a.report()
    assert a.unchecked == {}, a.report()  # the fused attention's backward is judged now, not listed
    rows = _attention_rows(a)
    for n in ("query", "key", "value"):
        c = rows[f"TransformerEncoderLayer.self_attn (backward: grad_{n})"]
        assert c.verdict in OK and c.aten == f"aten.{CPU_KERNEL}.default" and c.phase == "backward", a.report()
    assert len({c.group for c in rows.values()}) == 1 and a.counts[CPU_KERNEL] == [1, 0]
    assert "every op is exact or rounding" in a.summary()
    names = {c.name for c in a.calls if c.phase == "backward"}
    assert {"TransformerEncoderLayer.norm1 (backward: grad_weight)", "TransformerEncoderLayer.linear2 (backward: "
            "grad_weight)", "TransformerEncoderLayer.self_attn (backward: grad_in_proj_weight)"} <= names  # fmt: skip


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
@pytest.mark.parametrize("kind", ("causal", "mask"))
def test_sdpa_module_backward_no_false_alarm(dtype, kind):
    torch.manual_seed(5)
    t = 6
    mask = torch.randn(t, t, generator=torch.Generator().manual_seed(1)).to(dtype) if kind == "mask" else None
    model = SelfAttention(causal=kind == "causal", mask=mask, scale=0.3 if kind == "mask" else None).to(dtype)
    x = torch.randn(2, t, 16, dtype=dtype)
    a, _ = backward_audit(model, x)
    assert a.first_failure is None and not a.not_analysed and CPU_KERNEL not in a.unchecked, a.report()
    rows = _attention_rows(a)
    assert set(rows) == {f"SelfAttention (backward: grad_{n})" for n in ("query", "key", "value")}, a.report()
    assert rows["SelfAttention (backward: grad_key)"].shapes[2] == (2, 2, t, 4)  # the grouped key heads
    assert all(c.verdict in OK and c.dtype == str(dtype)[6:] for c in rows.values()), a.report()


def test_bert_backward_attention_judged_with_a_padding_mask():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation="sdpa")  # fmt: skip
    bert = transformers.BertModel(cfg).train()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[1, 6:] = 0
    with rkt.audit(progress=False) as a:
        bert(ids, attention_mask=pad).last_hidden_state.sum().backward()
    assert a.first_failure is None and CPU_KERNEL not in a.unchecked, a.report()
    rows = _attention_rows(a)
    assert set(rows) == {f"BertModel.encoder.layer.0.attention.self (backward: grad_{n})" for n in
                         ("query", "key", "value")}, a.report()  # fmt: skip
    assert all(c.verdict in OK for c in rows.values())


class _NoScaleInDk:
    """A backend whose attention backward forgets the scale in dk (returns sum_i dS_ij q_i): below the audit,
    as a backend's kernel."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Mode(TorchDispatchMode):
            seen = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if func is aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
                    b = dsp.bind(func, args, kwargs)
                    s = b["scale"] if b["scale"] is not None else b["query"].shape[-1] ** -0.5
                    with torch.no_grad():
                        out[1].div_(s)
                    self.seen += 1
                return out

        return _Mode()


def test_missing_scale_in_dk_caught_and_named():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    a, (bad,) = backward_audit(layer, torch.randn(2, 3, 8), _NoScaleInDk())
    f = a.first_failure
    assert bad.seen == 1 and f is not None, a.report()
    assert f.name == "TransformerEncoderLayer.self_attn (backward: grad_key)" and f.verdict == "mismatch", a.report()
    assert f.op == OP and f.aten == f"aten.{CPU_KERNEL}.default"
    rows = _attention_rows(a)  # dq and dv, from the same kernel, are right
    assert rows["TransformerEncoderLayer.self_attn (backward: grad_query)"].verdict in OK
    assert rows["TransformerEncoderLayer.self_attn (backward: grad_value)"].verdict in OK


def test_broken_dv_in_a_gqa_module_caught():
    torch.manual_seed(6)
    model = SelfAttention(causal=True)
    kernel = getattr(aten, CPU_KERNEL).default
    a, (bad,) = backward_audit(model, torch.randn(2, 6, 16), BrokenKernel(kernel, output=2))
    f = a.first_failure
    assert bad.broken == [0] and f is not None and f.name == "SelfAttention (backward: grad_value)", a.report()
    assert f.verdict == "mismatch"


# ------------------------------------------------------------------ the CUDA kernels, hand-built calls

CUDA_KERNELS = ("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                "_scaled_dot_product_cudnn_attention_backward",
                "_scaled_dot_product_fused_attention_overrideable_backward")  # fmt: skip


def _call(name, q, k, v, g, *, mask=None, causal=False, scale=None, dropout_p=0.0, gqa=False):
    """(func, args, kwargs, outputs) as autograd would call backward kernel ``name``: each argument by its
    schema name, the gradients torch's CPU computes for them."""
    func = getattr(aten, name).default
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    grads = torch.autograd.grad(o, (qq, kk, vv), g)
    L, S = q.shape[-2], k.shape[-2]
    vals = dict(grad_out=g, grad_out_=g, query=q, key=k, value=v, out=o.detach(), logsumexp=torch.zeros(q.shape[:-1]),
                cum_seq_q=None, cum_seq_k=None, max_q=L, max_k=S, dropout_p=dropout_p, is_causal=causal,
                philox_seed=torch.zeros(()), philox_offset=torch.zeros(()), rng_state=torch.zeros(2),
                unused=torch.zeros(()), attn_bias=mask, attn_mask=mask, grad_input_mask=[True, True, True, mask is not None],
                scale=scale)  # fmt: skip
    args = [vals[a.name] for a in func._schema.arguments if not a.kwarg_only]
    kwargs = {a.name: vals[a.name] for a in func._schema.arguments if a.kwarg_only}
    outs = (*grads, torch.zeros_like(mask) if len(func._schema.returns) == 4 and mask is not None else None)
    return func, args, kwargs, outs[: len(func._schema.returns)]


def _qkvg(hq=2, hk=2, L=4, S=5, E=8):
    gen = torch.Generator().manual_seed(7)
    q, g = torch.randn(1, hq, L, E, generator=gen), torch.randn(1, hq, L, E, generator=gen)
    k, v = torch.randn(1, hk, S, E, generator=gen), torch.randn(1, hk, S, E, generator=gen)
    return q, k, v, g


def _spec(func, args, kwargs, outs):
    b = dsp.bind(func, args, kwargs)
    return dbw.backward_call(func, b, None, lambda i: i < len(outs) and isinstance(outs[i], torch.Tensor))


@pytest.mark.parametrize("name", CUDA_KERNELS)
def test_cuda_kernels_mapped_from_their_schema(name):
    q, k, v, g = _qkvg()
    has_mask = "attn_bias" in [a.name for a in getattr(aten, name).default._schema.arguments]
    mask = torch.randn(4, 5, generator=torch.Generator().manual_seed(2)) if has_mask else None
    kw = dict(mask=mask, scale=0.3) if has_mask else dict(causal=True, scale=0.3)  # (flash takes no mask)
    func, args, kwargs, outs = _call(name, q, k, v, g, **kw)
    assert dsp.classify(func, args, kwargs, outs) == "backward"
    spec = _spec(func, args, kwargs, outs)
    assert spec.unsupported is None and spec.op == "scaled_dot_product_attention"
    assert spec.grads == [(0, "query"), (1, "key"), (2, "value")]
    assert spec.kwargs["scale"] == 0.3 and spec.kwargs["is_causal"] == (not has_mask)
    assert (spec.kwargs["attn_mask"] is mask) and spec.grad_output is g and spec.args == (q, k, v)
    assert set(spec.skipped) == ({"grad_attn_bias"} if len(outs) == 4 else set())
    for i, n in spec.grads:  # torch's own gradients: rounding; dk without its scale: a mismatch
        rep = compare_backward({n: outs[i]}, spec.op, spec.grad_output, *spec.args, **spec.kwargs)[n]
        assert rep.verdict in OK, (name, n, rep)
    wrong = compare_backward({"key": outs[1] / 0.3}, spec.op, spec.grad_output, *spec.args, **spec.kwargs)["key"]
    assert wrong.verdict == "mismatch"


def test_cuda_flash_gqa_and_the_efficient_kernels_mask_of_gradients():
    q, k, v, g = _qkvg(hq=4, hk=2)
    func, args, kwargs, outs = _call(CUDA_KERNELS[0], q, k, v, g, gqa=True)
    spec = _spec(func, args, kwargs, outs)
    assert spec.kwargs["enable_gqa"] is True and spec.kwargs["is_causal"] is False and spec.kwargs["scale"] is None
    rep = compare_backward({"key": outs[1]}, spec.op, spec.grad_output, *spec.args, **spec.kwargs)["key"]
    assert rep.verdict in OK
    q, k, v, g = _qkvg()
    func, args, kwargs, outs = _call(CUDA_KERNELS[1], q, k, v, g)
    args[[a.name for a in func._schema.arguments].index("grad_input_mask")] = [False, True, True, False]
    spec = _spec(func, args, kwargs, (None, *outs[1:]))
    assert spec.grads == [(1, "key"), (2, "value")] and spec.skipped == {}


def test_efficient_kernel_through_the_audit_names_the_mask_gradient_unjudged():
    q, k, v, g = _qkvg()
    mask = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    func, args, kwargs, outs = _call(CUDA_KERNELS[1], q, k, v, g, mask=mask)
    a = rkt.audit(progress=False)
    a._backward(func, args, kwargs, outs, None)  # as autograd would call it on a GPU
    rows = [c for c in a.calls if c.op == OP]
    assert len(rows) == 3 and all(c.verdict in OK for c in rows), a.report()
    assert rows[0].parts == {"grad_attn_bias": "the gradient of the additive mask: no refkern op"}
    assert "grad_attn_bias not judged" in a.report() and a.counts[CUDA_KERNELS[1]] == [1, 0]


@pytest.mark.parametrize("name", (CPU_KERNEL, *CUDA_KERNELS))
def test_dropout_and_nested_batches_not_checkable(name):
    q, k, v, g = _qkvg()
    func, args, kwargs, outs = _call(name, q, k, v, g, dropout_p=0.1)
    spec = _spec(func, args, kwargs, outs)
    assert spec.unsupported == "attention with dropout_p=0.1 (a random mask no reference can reproduce)"
    if "cum_seq_q" in [a.name for a in func._schema.arguments]:
        func, args, kwargs, outs = _call(name, q, k, v, g)
        args[[a.name for a in func._schema.arguments].index("cum_seq_q")] = torch.tensor([0, 4])
        assert "nested tensors" in _spec(func, args, kwargs, outs).unsupported
