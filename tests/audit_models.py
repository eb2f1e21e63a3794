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
