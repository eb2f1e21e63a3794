"""Composed RMSNorm and rotary embeddings judged whole by the audit (issue 26, item 3;
refkern.torch.patterns, refkern.analysis.rotary).

The rotary reference is checked against an independent truth (mpmath at 300 bits, rounded to the
format with Fraction arithmetic here); the yardstick against torch's own rotation (Hugging Face's
``apply_rotary_pos_emb``) in four dtypes and at angles up to 2**20, and against bugs; the audit on
random-initialised Hugging Face models (small configs, nothing downloaded) for the pattern rows, no
false alarm, and bugs that spread over the small ops (each of which stays exact) named at the pattern."""

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mpmath = pytest.importorskip("mpmath")

from audit_models import BadRsqrt  # noqa: E402

import refkern.torch as rkt  # noqa: E402
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64  # noqa: E402
from refkern.analysis.rotary import compare_rotary, reference, rotate  # noqa: E402

OK = ("exact", "rounding")
_FMT = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: FLOAT32, torch.float64: FLOAT64}


# ---------------------------------------------------------------- the truth, independent of refkern


def _round_fraction(q: Fraction, prec: int, emin: int) -> float:
    """q rounded to nearest, ties to even, to ``prec`` significant bits (subnormals below 2**emin)."""
    if q == 0:
        return 0.0
    sign = -1 if q < 0 else 1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, emin)
    scaled = a / Fraction(2) ** (e - prec + 1)
    n = scaled.numerator // scaled.denominator
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    return sign * math.ldexp(n, e - prec + 1)


def _truth(q, theta, scale, fmt, convention):
    """s (q cos theta + rotate(q) sin theta) per element with mpmath at 300 bits, rounded once to fmt."""
    qf = np.asarray(q, np.float64).reshape(-1, q.shape[-1])
    th = np.broadcast_to(theta, q.shape).reshape(-1, q.shape[-1])
    h = q.shape[-1] // 2
    out = np.empty_like(qf)
    with mpmath.workprec(300):
        for i in range(qf.shape[0]):
            for j in range(qf.shape[1]):
                if convention == "half":
                    r = -qf[i, j + h] if j < h else qf[i, j - h]
                else:
                    r = -qf[i, j + 1] if j % 2 == 0 else qf[i, j - 1]
                t = mpmath.mpf(float(th[i, j]))
                y = mpmath.mpf(scale) * (mpmath.mpf(float(qf[i, j])) * mpmath.cos(t) + mpmath.mpf(r) * mpmath.sin(t))
                m, e = abs(y).man_exp if y != 0 else (0, 0)
                exact = Fraction(int(m)) * Fraction(2) ** int(e) * (-1 if y < 0 else 1)
                out[i, j] = _round_fraction(exact, fmt.prec, fmt.emin)
    return out.reshape(q.shape)


@pytest.mark.parametrize("dtype", list(_FMT), ids=str)
@pytest.mark.parametrize("convention", ("half", "interleaved"))
def test_rotary_reference_is_the_correctly_rounded_rotation(dtype, convention):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 2, 8, generator=g).to(dtype)
    theta = torch.tensor([0.0, 1e-3, 1.5707964, 3.1415927, 1e5, 123456.78, 2.0**20, 7e6], dtype=torch.float32)
    theta = theta.expand(3, 2, 8).contiguous()
    theta[2] = torch.rand(2, 8, generator=g) * 1e4
    q64 = q.double().numpy()
    # hard cases: q[..., j] cos + r sin close to 0 (the two products cancel), and an exact zero
    q64[0, 0, 0], q64[0, 0, 4] = 0.0, 0.0
    qt = torch.from_numpy(q64).to(dtype)
    q64 = qt.double().numpy()
    fmt = _FMT[dtype]
    for scale in (1.0, 0.7071):
        ref = reference(q64, theta.double().numpy(), scale, fmt, convention)[0]
        np.testing.assert_array_equal(ref, _truth(q64, theta.double().numpy(), scale, fmt, convention))


def test_rotate_conventions_by_hand():
    q = np.arange(1.0, 7.0)
    np.testing.assert_array_equal(rotate(q, "half"), [-4, -5, -6, 1, 2, 3])
    np.testing.assert_array_equal(rotate(q, "interleaved"), [-2, 1, -4, 3, -6, 5])
    with pytest.raises(ValueError, match=r"^rotary: unknown convention='pairs'"):
        rotate(q, "pairs")


def _hf_rotary(q, pos, dim, dtype, scale=1.0, reduce=None):
    """Hugging Face's Llama rotary (LlamaRotaryEmbedding.forward and apply_rotary_pos_emb, written out)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    emb = torch.cat([pos[..., None].float() * inv] * 2, dim=-1)
    ang = emb if reduce is None else reduce(emb)
    cos, sin = (ang.cos() * scale).to(dtype)[:, None], (ang.sin() * scale).to(dtype)[:, None]
    h = dim // 2
    return q * cos + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * sin, emb[:, None]


def _reduced(emb):  # a cosine's range reduction by a float32 2 pi: wrong for large angles
    two_pi = torch.tensor(2 * math.pi, dtype=torch.float32)
    return emb - two_pi * torch.round(emb / two_pi)


@pytest.mark.parametrize("dtype", list(_FMT), ids=str)
@pytest.mark.parametrize("start", (0, 100_000, 2**20))
def test_torch_rotation_is_no_false_alarm_and_bugs_are_mismatches(dtype, start):
    g = torch.Generator().manual_seed(start)
    dim = 32
    pos = torch.arange(start, start + 64)[None]
    q = (torch.randn(2, 4, 64, dim, generator=g) * torch.exp(torch.randn(2, 4, 64, 1, generator=g))).to(dtype)
    for scale in (1.0, 0.8):
        y, theta = _hf_rotary(q, pos, dim, dtype, scale)
        rep = compare_rotary(y, q, theta, scale=scale)
        assert rep.verdict in OK, rep
        assert rep.max_bound_ratio <= 1.0
    y, theta = _hf_rotary(q, pos, dim, dtype)
    swapped = q * torch.cat((-q[..., dim // 2 :], q[..., : dim // 2]), -1)  # nonsense: a product for the rotation
    assert compare_rotary(swapped, q, theta).verdict == "mismatch"
    assert compare_rotary(y, q, theta + 1e-2).verdict == "mismatch"  # angles shifted (a wrong position)
    assert compare_rotary(y, q, theta, convention="interleaved").verdict == "mismatch"
    if start:  # 2 pi in float32 is off by 1.7e-7: k of them shift the angle by k 1.7e-7 (k = 16000 at 1e5)
        bad, _ = _hf_rotary(q, pos, dim, dtype, reduce=_reduced)
        assert compare_rotary(bad, q, theta).verdict == "mismatch"
    if dtype is torch.float32:  # cos and sin rounded to bfloat16 in a float32 rotation: far beyond float32's
        low = q * theta.cos().bfloat16().float() + torch.cat((-q[..., dim // 2 :], q[..., : dim // 2]), -1) * (
            theta.sin().bfloat16().float()
        )
        assert compare_rotary(low, q, theta).verdict == "mismatch"


def test_rotary_errors():
    q = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"^rotary: actual.shape=\(2, 4\) differs from q.shape=\(2, 8\)"):
        compare_rotary(torch.randn(2, 4), q, torch.zeros(8))
    with pytest.raises(ValueError, match=r"^rotary: theta.shape=\(3,\) does not broadcast"):
        compare_rotary(q, q, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^rotary: the last axis of q must have an even size"):
        compare_rotary(torch.randn(2, 7), torch.randn(2, 7), torch.zeros(7))


# ---------------------------------------------------------------- the audit: a model without transformers


class _RMSNorm(torch.nn.Module):
    """Llama's RMSNorm as transformers writes it."""

    def __init__(self, d, eps=1e-6, bug=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.variance_epsilon = eps
        self.bug = bug

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        eps = self.variance_epsilon + (1e-2 if self.bug == "eps" else 0.0)
        h = h * (BadRsqrt.apply(var + eps) if self.bug == "rsqrt grad" else torch.rsqrt(var + eps))
        w = self.weight + 1 if self.bug == "w+1" else self.weight
        return w * h.to(dtype)


def _audit(f, *args):
    with rkt.audit() as a, torch.no_grad():
        f(*args)
    return a


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_composed_rms_norm_is_one_pattern_row(dtype):
    x = (torch.randn(4, 32, generator=torch.Generator().manual_seed(0)) * 0.05).to(dtype)
    norm = _RMSNorm(32).to(dtype)
    a = _audit(norm, x)
    rows = [c for c in a.calls if c.pattern]
    assert [c.pattern for c in rows] == ["rms_norm"]
    assert rows[0].op.startswith("rms_norm (composed: pow, mean, add, rsqrt, mul")
    assert rows[0].verdict in OK and rows[0].name == "_RMSNorm"
    assert a.n_ops == sum(a + b for a, b in a.counts.values()) and "rms_norm" not in a.counts  # not an op
    assert "1 composed ops judged whole (1 rms_norm" in a.summary()
    for bug in ("eps", "w+1"):
        a = _audit(_RMSNorm(32, bug=bug).to(dtype), x)
        ops = [c for c in a.calls if not c.pattern]
        assert all(c.verdict in OK for c in ops), a.report()  # every small op is right
        f = a.first_failure
        assert f is not None and f.pattern == "rms_norm" and f.verdict == "mismatch", a.report()


def _train(f, *args, other=None):
    """An audited training step: ``(f(*args) * t).sum()`` (t fixed) plus ``other`` (another use of an input),
    backward."""
    with rkt.audit() as a:
        y = f(*args)
        t = torch.randn(y.shape, generator=torch.Generator().manual_seed(9)).to(y.dtype)
        loss = (y * t).sum() + (0.0 if other is None else other)
        loss.backward()
    return a


def _rows(a, phase):
    return [c for c in a.calls if c.pattern and c.phase == phase]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_composed_rms_norm_backward_is_judged_whole(dtype):
    """In a training step the composed RMSNorm's gradients of x and of its weight are judged as rms_norm's (one row
    each), x's being the pattern's own contribution: x's other use (the residual: ``3 x``) is not in it."""
    x = (torch.randn(4, 10, 32, generator=torch.Generator().manual_seed(0)) * 0.5).to(dtype).requires_grad_()
    a = _train(_RMSNorm(32).to(dtype), x, other=(x.float() * 3).sum())
    rows = _rows(a, "backward")
    assert [c.name for c in rows] == ["_RMSNorm (backward: grad_input)", "_RMSNorm (backward: grad_weight)"]
    assert all(c.op.startswith("rms_norm backward (composed: pow, mean, add, rsqrt, mul") for c in rows)
    assert all(c.verdict in OK and c.dtype == str(dtype)[6:] for c in rows), a.report()
    assert len({c.group for c in rows}) == 1 and a.first_failure is None, a.report()
    assert "rms_norm" not in a.counts and a.phases["backward"][1] == 0  # pattern rows are not ops


def test_rms_norm_with_rsqrt_gradient_off_is_the_backward_pattern_mismatch():
    """rsqrt's gradient 2% off (every op of the backward exact, the forward right): the pattern's grad_input is
    the first failure, a mismatch; its grad_weight (which does not pass through rsqrt) is right."""
    x = torch.randn(4, 10, 32, generator=torch.Generator().manual_seed(0)).requires_grad_()
    a = _train(_RMSNorm(32, bug="rsqrt grad"), x)
    assert all(c.verdict in OK for c in a.calls if not c.pattern), a.report()  # every op, forward and backward
    assert [c.verdict in OK for c in _rows(a, "forward")] == [True]
    f = a.first_failure
    assert f is not None and f.pattern == "rms_norm" and f.phase == "backward" and f.verdict == "mismatch", a.report()
    assert f.name.endswith("(backward: grad_input)"), a.report()
    assert [c.verdict in OK for c in _rows(a, "backward")] == [False, True], a.report()


def test_pattern_backward_holds_no_graph_and_ends_with_the_audit():
    """The hooks hold no reference to the graph (an output dropped unbackwarded frees it without the garbage
    collector), and a backward pass run after the audit closed adds no row."""
    import gc
    import weakref

    class Probe:  # lives as long as the output's autograd node
        pass

    x = torch.randn(4, 32, requires_grad=True)
    gc.disable()
    try:
        for hooked in (False, True):  # without the audit's hooks, then with them: the same release
            with rkt.audit() if hooked else torch.enable_grad():
                y = _RMSNorm(32)(x * 1.0)
                probe = Probe()
                y.grad_fn.metadata["probe"], ref = probe, weakref.ref(probe)
                del probe, y
            assert ref() is None
    finally:
        gc.enable()
    with rkt.audit() as a:
        y = _RMSNorm(32)(x)
    y.sum().backward()
    assert [c.phase for c in a.calls if c.pattern] == ["forward"]


def test_an_rms_statistic_not_returned_is_no_pattern():
    class Gate(torch.nn.Module):
        def forward(self, x):  # the statistic scales another tensor: not a normalisation of x
            return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6).expand(-1, 3) * 2.0

    a = _audit(Gate(), torch.randn(4, 8))
    assert not [c for c in a.calls if c.pattern]


class _InlineNorm(torch.nn.Module):
    """An RMSNorm written out inside a larger module (the projection consumes it; the module returns something
    else); ``upcast=False``: the statistic in the input's dtype (float16: x**2 overflows beyond |x| = 256)."""

    def __init__(self, d, upcast=True):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.proj = torch.nn.Linear(d, d)
        self.upcast = upcast

    def forward(self, x):
        h = x.to(torch.float32) if self.upcast else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj(self.w * h.to(x.dtype))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_an_inline_rms_norm_is_one_pattern_row(dtype):
    torch.manual_seed(0)
    m = _InlineNorm(64).to(dtype)
    x = torch.randn(4, 10, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    a = _audit(m, x)
    rows = [c for c in a.calls if c.pattern]
    assert [c.pattern for c in rows] == ["rms_norm"] and rows[0].name == "_InlineNorm", a.report()
    assert rows[0].op.endswith("; inline, weight from the stream)") and rows[0].shapes == [(4, 10, 64), (64,)]
    assert a.first_failure is None, a.report()


def test_an_inline_float16_statistic_that_overflows_is_the_pattern_mismatch():
    """x**2 in float16 beyond |x| = 256 is infinite, rsqrt(inf) = 0, the output 0: every op is exact, the
    normalisation is not; with the statistic in float32 it is right."""
    torch.manual_seed(0)
    x = (torch.randn(4, 10, 64, generator=torch.Generator().manual_seed(1)) * 300).half()
    a = _audit(_InlineNorm(64).half(), x)
    assert a.first_failure is None, a.report()
    a = _audit(_InlineNorm(64, upcast=False).half(), x)
    assert all(c.verdict in OK for c in a.calls if not c.pattern), a.report()
    f = a.first_failure
    assert f is not None and f.pattern == "rms_norm" and f.verdict == "mismatch", a.report()


def test_a_statistic_scaling_another_tensor_inline_is_no_pattern():
    class Mix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x, z):  # z scaled by x's statistic: not a normalisation of x
            return self.proj(z * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    a = _audit(Mix(), torch.randn(4, 8), torch.randn(4, 8))
    assert not [c for c in a.calls if c.pattern], a.report()


class _Rotary(torch.nn.Module):
    """Llama's rotary, written out: angles position * inv_freq, q * cos + rotate_half(q) * sin."""

    def __init__(self, reduce=None):
        super().__init__()
        self.reduce = reduce

    def forward(self, pos, q):
        d = q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        emb = torch.cat([pos[..., None].float() * inv] * 2, -1)
        if self.reduce is not None:
            emb = self.reduce(emb)
        c, s = emb.cos().to(q.dtype)[:, None], emb.sin().to(q.dtype)[:, None]
        return q * c + torch.cat((-q[..., d // 2 :], q[..., : d // 2]), -1) * s


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_rotary_pattern_sampled_and_a_reduction_found(dtype):
    g = torch.Generator().manual_seed(5)
    pos, q = torch.arange(100_000, 100_064)[None], torch.randn(1, 4, 64, 32, generator=g).to(dtype)
    for reduce, want in ((None, OK), (_reduced, ("mismatch",))):
        with rkt.audit(sample=320) as a, torch.no_grad():
            _Rotary(reduce)(pos, q)
        rows = [c for c in a.calls if c.pattern]
        assert [c.pattern for c in rows] == ["rotary"] and rows[0].sampled == 320  # 10 rows of 32
        assert rows[0].verdict in want, a.report()
        assert all(c.verdict in OK for c in a.calls if not c.pattern and c.report is not None), a.report()


class _SinGrad(torch.autograd.Function):
    """``r * s`` whose gradient of r is 1% off (``1.01 g s``)."""

    @staticmethod
    def forward(ctx, r, s):
        ctx.save_for_backward(s)
        return r * s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return g * s * 1.01, None


class _RotaryGrad(torch.nn.Module):
    """Llama's rotary (as _Rotary), ``bug``: the sine branch's gradient 1% off."""

    def forward(self, pos, q, bug=False):
        d = q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        emb = torch.cat([pos[..., None].float() * inv] * 2, -1)
        c, s = emb.cos().to(q.dtype)[:, None], emb.sin().to(q.dtype)[:, None]
        r = torch.cat((-q[..., d // 2 :], q[..., : d // 2]), -1)
        return q * c + (_SinGrad.apply(r, s) if bug else r * s)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_rotary_backward_is_judged_whole(dtype):
    """The gradient of q through the rotary's ops is the rotation of the output's gradient by -theta (the angles
    equal within each pair): judged so, right for autograd's own, a mismatch with the sine branch 1% off."""
    g = torch.Generator().manual_seed(5)
    pos, q = torch.arange(100_000, 100_064)[None], torch.randn(1, 4, 64, 32, generator=g).to(dtype)
    for bug, want in ((False, OK), (True, ("mismatch",))):
        a = _train(_RotaryGrad(), pos, q.clone().requires_grad_(), bug)
        rows = _rows(a, "backward")
        assert [c.name for c in rows] == ["_RotaryGrad (backward: grad_input)"], a.report()
        assert rows[0].op == "rotary backward (composed: cos, sin, mul, neg, mul, add)"
        assert rows[0].verdict in want, a.report()
        assert all(c.verdict in OK for c in a.calls if not c.pattern), a.report()
        assert bug or a.first_failure is None, a.report()


class _Interleaved(torch.nn.Module):
    """GPT-J's convention: pairs (q[2i], q[2i+1]) rotated by angle i, the angles repeated pairwise."""

    def forward(self, pos, q, bug=False):
        d = q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        emb = (pos[..., None].float() * inv).repeat_interleave(2, -1)
        c, s = emb.cos()[:, None], emb.sin()[:, None]
        r = torch.stack((-q[..., 1::2], q[..., ::2]), -1).flatten(-2)
        return q * c + r * (s if not bug else c)


class _NotRotary(torch.nn.Module):
    """Cosines and sines of angles mixing q with something that is not its rotation: no rotary."""

    def forward(self, pos, q, how):
        d = q.shape[-1]
        emb = torch.cat([pos[..., None].float() * (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))] * 2, -1)
        c, s = emb.cos()[:, None], emb.sin()[:, None]
        if how == "roll":
            return q * c + q.roll(1, -1) * s
        return q * c + torch.cat((q[..., d // 2 :], -q[..., : d // 2]), -1) * s  # a rotation by -theta


def test_a_mix_that_is_not_a_rotation_is_no_pattern():
    q = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(7))
    for how in ("roll", "minus"):
        with rkt.audit() as a, torch.no_grad():
            _NotRotary()(torch.arange(16)[None], q, how)
        assert not [c for c in a.calls if c.pattern], a.report()
        assert all(c.verdict in OK for c in a.calls if c.report is not None), a.report()


def test_interleaved_rotary_is_read_from_the_stream():
    q = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(6))
    for bug, want in ((False, OK), (True, ("mismatch",))):
        with rkt.audit() as a, torch.no_grad():
            _Interleaved()(torch.arange(16)[None], q, bug)
        rows = [c for c in a.calls if c.pattern]
        assert [c.pattern for c in rows] == ["rotary"] and rows[0].verdict in want, a.report()
        if not bug:
            assert "rotary (interleaved convention)" in " ".join(rows[0].report.notes)


# ---------------------------------------------------------------- the audit: Hugging Face models


def _model(kind, dtype, layers=2):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "llama":
            m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
        elif kind == "qwen2":
            m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
        else:
            m = transformers.T5ForConditionalGeneration(transformers.T5Config(
                vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=layers, num_heads=4,
                num_decoder_layers=layers))  # fmt: skip
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():  # away from the initial ones, so that w + 1 for w is not a scaling by 2 only
        if type(mod).__name__.endswith(("RMSNorm", "LayerNorm")):
            with torch.no_grad():
                mod.weight.copy_(1 + 0.2 * torch.randn(mod.weight.shape, generator=g))
    return m.eval().to(dtype)


def _run(m, kind, start=0):
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    with rkt.audit() as a, torch.no_grad():
        if kind == "t5":
            m(input_ids=ids, decoder_input_ids=ids)
        else:
            m(input_ids=ids, position_ids=torch.arange(start, start + 12)[None].expand(2, -1))
    return a


@pytest.fixture(scope="module")
def llama():
    return _model("llama", torch.float32)


@pytest.mark.parametrize("kind, dtype, start", [("llama", torch.float32, 0), ("llama", torch.bfloat16, 100_000),
                                                ("qwen2", torch.float32, 100_000), ("qwen2", torch.bfloat16, 0),
                                                ("t5", torch.float32, 0), ("t5", torch.bfloat16, 0)],
                         ids=str)  # fmt: skip
def test_hf_models_show_the_patterns_without_false_alarm(kind, dtype, start):
    layers = 2 if kind == "llama" else 1
    a = _run(_model(kind, dtype, layers), kind, start)
    rows = [c for c in a.calls if c.pattern]
    kinds = [c.pattern for c in rows]
    if kind == "t5":  # encoder: 2 per block + final; decoder: 3 per block + final
        assert kinds == ["rms_norm"] * (5 * layers + 2)
    else:  # two per decoder layer and the final norm; q and k rotated in each layer
        assert kinds.count("rms_norm") == 2 * layers + 1 and kinds.count("rotary") == 2 * layers
        assert {c.op for c in rows if c.pattern == "rotary"} == {"rotary (composed: cos, sin, mul, neg, mul, add)"}
    assert all(c.report is not None for c in rows), a.report()
    assert a.first_failure is None, a.report()


def _stray_eps(self, x):
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    return self.weight * (h * torch.rsqrt(var + self.variance_epsilon + 1e-3)).to(dtype)


def _w_plus_1(self, x):
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return (self.weight + 1) * h.to(dtype)


def _cos_for_sin(q, k, cos, sin, unsqueeze_dim=1):
    from transformers.models.llama.modeling_llama import rotate_half

    cos = cos.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * cos, k * cos + rotate_half(k) * cos  # the cosine where the sine belongs


@pytest.mark.parametrize("bug", ("stray eps", "w + 1", "range reduction", "cos for sin"))
def test_hf_llama_bugs_over_small_ops_are_the_pattern_mismatch(llama, monkeypatch, bug):
    from transformers.models.llama import modeling_llama as ml

    start = 0
    if bug == "stray eps":
        monkeypatch.setattr(ml.LlamaRMSNorm, "forward", _stray_eps)
    elif bug == "w + 1":
        monkeypatch.setattr(ml.LlamaRMSNorm, "forward", _w_plus_1)
    elif bug == "range reduction":  # the rotary embedding reduces its angles by a float32 2 pi itself
        start = 100_000
        forward = ml.LlamaRotaryEmbedding.forward

        def reduced(self, x, position_ids):
            freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
            emb = _reduced(torch.cat((freqs, freqs), dim=-1))
            return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

        monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", reduced)
        del forward
    else:
        monkeypatch.setattr(ml, "apply_rotary_pos_emb", _cos_for_sin)
    a = _run(llama, "llama", start)
    assert all(c.verdict in OK for c in a.calls if not c.pattern), a.report()  # every small op is right
    f = a.first_failure
    want = "rms_norm" if bug in ("stray eps", "w + 1") else "rotary"
    assert f is not None and f.pattern == want and f.verdict == "mismatch", a.report()


class _BrokenKernel(torch.utils._python_dispatch.TorchDispatchMode):
    """A backend whose rsqrt adds a stray epsilon, or whose cos reduces its argument by a float32 2 pi:
    below the audit on the mode stack, so the audit sees the broken kernel's output."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.op == "rsqrt" and func is torch.ops.aten.rsqrt.default:
            return func(args[0] + 1e-5)
        if self.op == "cos" and func is torch.ops.aten.cos.default:
            return func(_reduced(args[0]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", ("rsqrt", "cos"))
def test_a_broken_kernel_is_named_at_the_op_and_at_the_pattern(llama, op):
    with _BrokenKernel(op):
        a = _run(llama, "llama", 100_000)
    f = a.first_failure
    assert f is not None and f.op == op and f.verdict == "mismatch", a.report()  # the kernel itself, first
    pattern = "rms_norm" if op == "rsqrt" else "rotary"
    rows = [c for c in a.calls if c.pattern == pattern]
    assert rows and all(c.verdict == "mismatch" for c in rows), a.report()  # the pattern's truth is its own


def test_hf_t5_bfloat16_with_w_plus_1_is_the_pattern_mismatch(monkeypatch):
    from transformers.models.t5 import modeling_t5 as mt

    def forward(self, h):  # T5LayerNorm with the weight offset by one: every op still exact
        variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = (h * torch.rsqrt(variance + self.variance_epsilon)).to(self.weight.dtype)
        return (self.weight + 1) * h

    model = _model("t5", torch.bfloat16, 1)
    monkeypatch.setattr(mt.T5LayerNorm, "forward", forward)
    a = _run(model, "t5")
    assert all(c.verdict in OK for c in a.calls if not c.pattern), a.report()
    f = a.first_failure
    assert f is not None and f.pattern == "rms_norm" and f.verdict == "mismatch", a.report()
    assert f.name.endswith("layer_norm") and "add" in f.op
