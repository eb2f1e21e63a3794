"""The audit sees the backward pass: ``loss.backward()`` inside ``with rkt.audit()`` has every op autograd
runs judged against the exact gradient of the tensors it received (convolution_backward, the norms'
backward kernels, softmax's, the mm/sum that make a linear layer's gradients), or listed as not checked
with the reason; each named by the module whose parameter it is the gradient of. Small models: the cost
is the analysis, not the model."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from audit_models import BrokenKernel, backward_audit  # noqa: E402

import refkern.torch as rkt  # noqa: E402
from refkern.gradients import OPS  # noqa: E402

aten = torch.ops.aten
OK = ("exact", "rounding")


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


class Attention(nn.Module):
    """One pre-norm self-attention block written out: layer_norm, a qkv projection, softmax(q k^T / 2) v
    (matmul: bmm in the backward), an output projection, the residual."""

    def __init__(self, d=8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        p = torch.softmax(q @ k.transpose(-2, -1) / 2, dim=-1)
        return x + self.out(p @ v)


@pytest.fixture(scope="module")
def convnet():
    torch.manual_seed(0)
    return ConvNet().train()


def test_conv_bn_linear_backward_is_judged(convnet):
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    a, _ = backward_audit(convnet, x)
    back = [c for c in a.calls if c.phase == "backward"]
    assert a.first_failure is None and all(c.verdict in OK for c in back if c.report is not None), a.report()
    names = {c.name: c for c in back}
    for param in ("weight", "bias"):  # every parameter's gradient judged, named by its module
        assert names[f"ConvNet.conv (backward: grad_{param})"].op == "conv2d backward"
        assert f"ConvNet.fc (backward: grad_{param})" in names
        if "batch_norm" in OPS:
            assert names[f"ConvNet.bn (backward: grad_{param})"].aten == "aten.native_batch_norm_backward.default"
    if "batch_norm" not in OPS:
        assert a.unchecked.get("native_batch_norm_backward") == 1, a.report()
    if "max_pool2d" in OPS:
        assert names["ConvNet.pool (backward: grad_input)"].op == "max_pool2d backward"
    assert names["ConvNet.conv (backward: grad_input)"].report is not None  # x requires grad: grad_x too
    assert names["ConvNet.fc (backward: grad_weight)"].op == "matmul"  # the mm of the gradient, its own inputs
    assert names["ConvNet.fc (backward: grad_bias)"].op == "sum"
    # one op, one count: convolution_backward's three gradients are three rows and one checked op
    conv = [c for c in back if c.aten == "aten.convolution_backward.default"]
    assert len(conv) == 3 and len({c.group for c in conv}) == 1 and a.counts["convolution_backward"] == [1, 0]
    bw_checked, bw_unchecked = a.phases["backward"]
    assert bw_checked >= 5  # conv's (bn's, the pool's) backward kernels, fc's mm x2 and sum, relu's threshold_backward
    assert sum(a._verdicts().values()) == a.n_checked  # verdicts count ops, not rows
    assert f", {bw_checked} of {bw_checked + bw_unchecked} in the backward pass" in a.summary()
    for name, n in a.unchecked.items():  # whatever has no reference yet is listed, with its reason
        assert n and a.reasons[name], a.report()


def test_attention_block_backward_every_op_judged_or_listed():
    torch.manual_seed(1)
    block = Attention()
    x = torch.randn(2, 4, 8, requires_grad=True)
    a, _ = backward_audit(block, x)
    assert a.first_failure is None, a.report()
    assert not a.not_analysed, a.report()
    assert a.unchecked == {}, a.report()  # layer_norm, softmax, bmm, mm, sum all have references
    back = {c.name: c for c in a.calls if c.phase == "backward"}
    assert back["Attention.norm (backward: grad_weight)"].op == "layer_norm backward"
    assert back["Attention.norm (backward: grad_input)"].report.verdict in OK
    softmax = [c for c in a.calls if c.op == "softmax backward"]
    assert len(softmax) == 1 and softmax[0].name == "Attention (backward: grad_input)"  # the block's own op
    assert {"Attention.qkv (backward: grad_weight)", "Attention.out (backward: grad_bias)"} <= set(back)
    assert sum(1 for c in a.calls if c.phase == "backward" and c.aten == "aten.bmm.default") == 4


def test_broken_grad_weight_is_the_first_failure(convnet):
    x = torch.randn(2, 3, 5, 5)
    a, (bad,) = backward_audit(convnet, x, BrokenKernel(aten.convolution_backward.default, output=1))
    f = a.first_failure
    assert bad.broken and f is not None, a.report()
    assert f.name == "ConvNet.conv (backward: grad_weight)" and f.verdict == "mismatch", a.report()
    assert f"first call beyond exact/rounding: #{f.index} ConvNet.conv (backward: grad_weight)" in a.summary()
    assert all(c.verdict in OK for c in a.calls if c is not f and c.report is not None), a.report()


def test_backward_without_its_forward_says_what_is_missing():
    torch.manual_seed(4)
    norm = nn.LayerNorm(6)
    loss = norm(torch.randn(3, 6)).sum()  # the forward outside the audit: its eps is not known to it
    with rkt.audit(progress=False) as a:
        loss.backward()
    assert a.unchecked == {"native_layer_norm_backward": 1}
    assert "eps (not an argument of the backward) is known only when the forward ran inside" in a.report()


def test_safe_softmax_backward_is_judged():
    """SDPA's math path (T5's attention, a float mask) computes its softmax as aten._safe_softmax: the audit keeps
    its input as it does _softmax's, so _softmax_backward_data is judged (it was listed as not checked: "the
    forward ran outside the audit"); a row of -inf only (_safe_softmax's zeros, where refkern's softmax has no
    value) is listed with its reason, not judged."""
    torch.manual_seed(5)
    x, w = torch.randn(2, 3, 7, requires_grad=True), torch.randn(2, 3, 7)
    with rkt.audit(progress=False) as a:
        torch._safe_softmax(x, -1).mul(w).sum().backward()
    judged = [c for c in a.calls if c.op == "softmax backward"]
    assert a.unchecked == {} and len(judged) == 1 and judged[0].verdict in OK, a.report()
    m = torch.randn(2, 3, 7)
    m[0, 1] = float("-inf")
    xm = m.requires_grad_()
    with rkt.audit(progress=False) as a:
        torch._safe_softmax(xm, -1).mul(w).sum().backward()
    assert a.unchecked == {"_safe_softmax": 1, "_softmax_backward_data": 1}, a.report()  # as the forward is
    assert "rows of -inf only" in a.report()
