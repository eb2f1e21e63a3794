"""The audit of random-initialised Hugging Face models (issue 26a): what is still "not checked", and whether any
judged op is a false alarm, forward in float32 and bfloat16 and a training step (float32, bfloat16); then the
issue's bugs injected below the audit (a gelu computed in the tanh form where erf was asked, an rsqrt with a stray
epsilon, rotary cos reduced by a float32 2 pi at angles near 1e4, a silu_backward that drops its second term, an
nll_loss that counts ignore_index's targets as class 0, an embedding backward that keeps one of a repeated token's
rows), each of which should be the audit's first failure.

Small configs, nothing downloaded (transformers builds each model from its config with random weights).

    python benchmarks/bench_elementwise_audit.py --json benchmarks/results/elementwise_audit.json [--models llama gpt2]
"""

import argparse
import json
import math
import time
import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import refkern.torch as rkt

warnings.simplefilter("ignore")
import transformers as T  # noqa: E402


def models():
    """(name, model, input kind): the issue's seven, small configs, random weights."""
    yield "llama", T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)), "lm"
    yield "qwen2", T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)), "lm"
    yield "gpt2", T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)), "lm"
    yield "bert", T.BertForMaskedLM(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, vocab_size=128, max_position_embeddings=64)), "lm"
    yield "vit", T.ViTForImageClassification(T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, image_size=32, patch_size=8, num_labels=10)), "img"
    yield "t5", T.T5ForConditionalGeneration(T.T5Config(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, d_kv=16, vocab_size=128, decoder_start_token_id=0, pad_token_id=0)), "s2s"
    yield "whisper", T.WhisperForConditionalGeneration(T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        vocab_size=128, num_mel_bins=16, max_source_positions=32, max_target_positions=32,
        decoder_start_token_id=1, pad_token_id=0)), "audio"

def inputs(kind, dtype):
    """Seeded inputs (and labels, for the training step) of each kind of model."""
    g = torch.Generator().manual_seed(0)
    if kind == "lm":
        ids = torch.randint(0, 128, (2, 16), generator=g)
        return dict(input_ids=ids, labels=ids)
    if kind == "img":
        return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g).to(dtype), labels=torch.tensor([1, 2]))
    if kind == "s2s":
        ids = torch.randint(0, 128, (2, 16), generator=g)
        return dict(input_ids=ids, labels=torch.randint(0, 128, (2, 8), generator=g))
    return dict(input_features=torch.randn(2, 16, 64, generator=g).to(dtype),
                labels=torch.randint(2, 128, (2, 8), generator=g))


MODES = (("fwd-fp32", torch.float32, False), ("fwd-bf16", torch.bfloat16, False), ("train-fp32", torch.float32, True),
         ("train-bf16", torch.bfloat16, True))  # fmt: skip


def _run(m, kind, dtype, train, extra=None):
    m = m.to(dtype)
    m.train(train)
    for mod in m.modules():  # no random draws in a training step (dropout off: nothing else changes)
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    x = {**inputs(kind, dtype), **(extra or {})}
    t = time.perf_counter()
    with rkt.audit(progress=False) as a:
        if train:
            m(**x).loss.backward()
        else:
            with torch.no_grad():
                m(**{k: v for k, v in x.items() if k != "labels" or kind in ("s2s", "audio")})
    return a, time.perf_counter() - t


def audit_models(only=None):
    out = {}
    for name, m, kind in models():
        if only and name not in only:
            continue
        for mode, dtype, train in MODES:
            torch.manual_seed(0)
            a, secs = _run(m, kind, dtype, train)
            bad = [dict(call=c.index, module=c.name, op=c.op, dtype=c.dtype, verdict=c.verdict,
                        precision=c.report.precision)
                   for c in a.calls if c.report is not None and c.verdict not in ("exact", "rounding")]  # fmt: skip
            out[f"{name}/{mode}"] = dict(unchecked=dict(sorted(a.unchecked.items())), reasons=a.reasons,
                                         not_ok=bad, phases=a.phases, seconds=round(secs, 1))  # fmt: skip
            print(name, mode, "unchecked", out[f"{name}/{mode}"]["unchecked"], "not ok", len(bad), flush=True)
    return out


class Replace(TorchDispatchMode):
    """A backend whose kernel for one aten op computes ``fn`` instead (entered before the audit: below it)."""

    def __init__(self, op, fn):
        super().__init__()
        self.op, self.fn, self.ran = op, fn, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is self.op:  # self.op: an overload packet (aten.gelu)
            self.ran += 1
            return self.fn(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


aten = torch.ops.aten


def _nll_ignoring(x, t, w, reduction, ignore_index):
    """nll_loss_forward that ignores ignore_index: the ignored targets (the causal LM's padded last label) counted
    as class 0."""
    return aten.nll_loss_forward(x, torch.where(t == ignore_index, 0, t), w, reduction, ignore_index)


def _keep_one(g, idx, n, padding_idx, scale_grad_by_freq):
    """embedding_dense_backward that writes each token's rows of grad_output instead of adding them: a repeated
    token keeps one (index_put without accumulate)."""
    out = g.new_zeros(n, g.shape[-1])
    out[idx.reshape(-1)] = g.reshape(-1, g.shape[-1])
    if padding_idx >= 0:
        out[padding_idx] = 0
    return out


BUGS = {  # bug -> (model, dtype, training step, the op that must fail first, the broken kernel, extra inputs)
    "gelu tanh where erf asked": ("bert", torch.float32, False, "gelu",
                                  (aten.gelu, lambda x, approximate="none": F.gelu(x, approximate="tanh")), None),
    "rsqrt with a stray eps": ("llama", torch.float32, False, "rsqrt", (aten.rsqrt, lambda x: torch.rsqrt(x + 1e-6)),
                               None),
    "rotary cos reduced by a float32 2 pi": ("llama", torch.float32, False, "cos",
                                             (aten.cos, lambda x: torch.cos(torch.remainder(x, 2 * math.pi))),
                                             {"position_ids": torch.arange(10000, 10016)[None].expand(2, 16)}),
    "silu_backward without its second term": ("llama", torch.float32, True, "silu backward",
                                              (aten.silu_backward, lambda g, x: g * torch.sigmoid(x)), None),
    "nll_loss counting ignore_index as class 0": ("llama", torch.float32, True, "nll_loss",
                                                  (aten.nll_loss_forward, _nll_ignoring), None),
    "embedding backward keeping one of a repeated token's rows": ("llama", torch.float32, True, "embedding backward",
                                                                  (aten.embedding_dense_backward, _keep_one), None),
}  # fmt: skip


def injected(dtypes=(torch.float32, torch.bfloat16)):
    out = {}
    made = {name: (m, kind) for name, m, kind in models() if name in ("bert", "llama")}
    for bug, (model, _, train, want, (op, fn), extra) in BUGS.items():
        for dtype in dtypes:
            m, kind = made[model]
            torch.manual_seed(0)
            with Replace(op, fn) as r:
                a, _ = _run(m, kind, dtype, train, extra)
            f = a.first_failure
            got = dict(op=f.op, verdict=f.verdict, precision=f.report.precision, module=f.name) if f else None
            key = f"{bug} ({str(dtype).removeprefix('torch.')})"
            out[key] = dict(ran=r.ran, first_failure=got, caught=bool(f and f.op == want))
            print(key, out[key], flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--no-bugs", action="store_true")
    args = p.parse_args()
    res = {"torch": torch.__version__, "transformers": T.__version__}
    for part, run in (("bugs", injected), ("models", lambda: audit_models(args.models))):
        if part == "bugs" and args.no_bugs:
            continue
        res[part] = run()
        if args.json:  # written after each part
            with open(args.json, "w") as fh:
                json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
