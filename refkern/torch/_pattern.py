"""The record of a composed pattern that :mod:`refkern.torch.patterns` finds in the forward stream and
:mod:`refkern.torch.patterns_backward` follows into the backward pass, and its forward judgement (a leaf both
import)."""

import torch

__all__ = ["Pattern", "cpu_of", "judge"]


class Pattern:
    """A composed operation found: ``kind`` ("rms_norm", "rotary"), its name in the audit ("rms_norm
    (composed: pow, mean, add, rsqrt, mul, mul)"), the tensors it is judged on, and where it ran."""

    def __init__(self, kind, name, out, **kw):
        self.kind, self.name, self.out = kind, name, out
        self.__dict__.update(kw)


def cpu_of(t):
    """A tensor detached on the CPU as a plain torch.Tensor (a subclass unwrapped), or None."""
    if t is None:
        return None
    t = t.detach().to("cpu")
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


def judge(p, judge_norm, sample=None):
    """(Report, number of elements sampled or 0) of pattern ``p``: an rms_norm through ``judge_norm(OpCall,
    actual)`` (the audit's :meth:`~refkern.torch.audit.Audit._judge`: its sampling applies), a rotary by
    :mod:`refkern.analysis.rotary` in the convention the stream rotates q by, with ``sample`` on at most that
    many elements: whole rows (the last axis, which the rotation mixes) evenly spaced, exact for them."""
    from refkern.torch.ops import OpCall

    cpu = cpu_of
    if p.kind == "rms_norm":
        spec = OpCall("rms_norm", "rms_norm", (cpu(p.x),), dict(normalized_shape=(p.d,), weight=cpu(p.weight),
                                                                 eps=p.eps))  # fmt: skip
        return judge_norm(spec, cpu(p.out))
    from refkern.analysis.rotary import compare_rotary

    # the output on its device: the rotation's cos and sin are judged by that device's accuracy classes
    out, q, theta, sampled = p.out.detach().as_subclass(torch.Tensor), cpu(p.q), cpu(p.theta), 0
    d = q.shape[-1]
    if sample is not None and q.numel() > sample and q.dim() > 1:
        n = q.numel() // d
        rows = torch.linspace(0, n - 1, max(1, sample // d)).round().long().unique()
        at = torch.unravel_index(rows, tuple(q.shape[:-1]))
        out, q, theta = out[at], q[at], torch.broadcast_to(theta, q.shape)[at]
        sampled = out.numel()
    return compare_rotary(out, q, theta, scale=p.scale, convention=p.convention), sampled
