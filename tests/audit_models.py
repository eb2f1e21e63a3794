"""Small real models for the audit's tests and benchmark, built here from torch.nn alone.

torchvision's wheel on the CPU test machine is a CUDA build that does not import beside the CPU
torch, so ResNet-18 is written out as torchvision defines it (He et al. 2016, BasicBlock [2, 2, 2, 2])."""

import torch
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision.models.resnet18's layers and forward, randomly initialised (no weights)."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000, width=64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], 2)
        self.layer3 = self._make_layer(4 * width, layers[2], 2)
        self.layer4 = self._make_layer(8 * width, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes=1000, width=64):
    return ResNet((2, 2, 2, 2), num_classes, width)


def randomize_batch_norm(model, seed=0):
    """Running statistics and affine parameters away from their identity defaults, so that an
    eval-mode batch norm computes something (the defaults make it almost the identity)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model


def backward_audit(model, x, *modes):
    """Forward and backward of ``(model(x) * target).sum()`` (a fixed random target) inside the audit, with
    ``modes`` entered first (below it, as a backend's kernels): (the audit, the modes entered)."""
    from contextlib import ExitStack

    import refkern.torch as rkt

    target = torch.randn_like(model(x), generator=torch.Generator().manual_seed(3)).detach()
    model.zero_grad()
    with ExitStack() as stack:
        entered = [stack.enter_context(m) for m in modes]
        a = stack.enter_context(rkt.audit(progress=False))
        (model(x) * target).sum().backward()
    return a, entered


class BrokenKernel:
    """A backend whose kernel for one aten op is broken from its ``nth`` call on (0-based; ``count`` calls):
    the output (``output``: which one, for an op with several, e.g. 1 for convolution_backward's
    grad_weight) is scaled by (1 + 2**-8) at every 7th element, a bug far beyond rounding in float32.

    A ``TorchDispatchMode`` entered *before* the audit sits below it, as a backend's kernels sit below
    torch's dispatcher: the audit sees the op's true inputs and this kernel's output."""

    def __new__(cls, op, nth=0, count=1, output=0):
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Mode(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen = 0
                self.broken = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.overloadpacket is op.overloadpacket:
                    if nth <= self.seen < nth + count:
                        first = out[output] if isinstance(out, (tuple, list)) else out
                        with torch.no_grad():
                            flat = first.clone().reshape(-1)
                            flat[::7] *= 1 + 2**-8
                            first.copy_(flat.view(first.shape))
                        self.broken.append(self.seen)
                    self.seen += 1
                return out

        return _Mode()


# ------------------------------------------------------------------ Hugging Face models (issue 26)

#: the seven models of issue 26, each from a small config with random weights (nothing is downloaded)
HF_MODELS = ("llama", "qwen2", "gpt2", "vit", "bert", "t5", "whisper")


def hf_model(kind, layers=2):
    """(model, inputs): ``kind`` of :data:`HF_MODELS` from a small config, random weights (seeded), and its seeded
    inputs with labels (the training step's loss: a causal LM's ``-100`` on the first two positions and the
    one transformers pads at the end, so that ignore_index is exercised; a class per image)."""
    import warnings

    import transformers as T

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 100, (2, 12), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100
    dec = dict(decoder_start_token_id=0, pad_token_id=0)
    lm = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "llama":
            m = T.LlamaForCausalLM(T.LlamaConfig(**lm))
        elif kind == "qwen2":
            m = T.Qwen2ForCausalLM(T.Qwen2Config(**lm))
        elif kind == "gpt2":
            m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_positions=64, n_embd=64, n_layer=layers, n_head=4))
        elif kind == "vit":
            m = T.ViTForImageClassification(T.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32,
                num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64, num_labels=5))  # fmt: skip
            x = torch.randn(2, 3, 16, 16, generator=g)
            return m, dict(pixel_values=x, labels=torch.tensor([1, 3]))
        elif kind == "bert":
            m = T.BertForMaskedLM(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))  # fmt: skip
        elif kind == "t5":
            m = T.T5ForConditionalGeneration(T.T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128,
                num_layers=layers, num_heads=4, num_decoder_layers=layers, **dec))  # fmt: skip
        elif kind == "whisper":
            m = T.WhisperForConditionalGeneration(T.WhisperConfig(vocab_size=100, num_mel_bins=8,
                encoder_layers=layers, decoder_layers=layers, d_model=32, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
                max_target_positions=32, bos_token_id=1, eos_token_id=2, **{**dec, "decoder_start_token_id": 1}))  # fmt: skip
            return m, dict(input_features=torch.randn(2, 8, 32, generator=g), labels=labels)
        else:
            raise ValueError(f"hf_model: unknown kind {kind!r}; choose one of {', '.join(HF_MODELS)}")
    return m, dict(input_ids=ids, labels=labels)


def hf_audit(model, inputs, mode, **extra):
    """The audit of ``model`` on ``inputs`` (:func:`hf_model`) in ``mode``: "fp32" or "bf16", a forward in eval mode
    under no_grad (the labels dropped; an encoder-decoder given seeded decoder inputs), or "train": the model in
    training mode (its dropout on: random draws), ``loss.backward()`` inside the audit. ``extra``: more inputs."""
    import refkern.torch as rkt

    inputs = {**inputs, **extra}
    if mode == "train":
        model.train()
        with rkt.audit(progress=False) as a:
            model(**inputs).loss.backward()
        return a
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[mode]
    model = model.eval().to(dtype)
    x = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items() if k != "labels"}
    if model.config.is_encoder_decoder:
        x["decoder_input_ids"] = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(5))
    with rkt.audit(progress=False) as a, torch.no_grad():
        model(**x)
    return a


class BadRsqrt(torch.autograd.Function):
    """rsqrt whose gradient is 2% off: ``-0.51 g r**3`` for ``-0.5 g r**3`` (each op of it exact)."""

    @staticmethod
    def forward(ctx, v):
        r = torch.rsqrt(v)
        ctx.save_for_backward(r)
        return r

    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return g * (r * r * r) * -0.51
