"""The audit's rows for composed patterns (:mod:`refkern.torch.patterns`: Hugging Face's RMSNorm written as five
small ops, the rotary embedding): each judged whole, forward when the pattern completes and backward when autograd
has computed its gradients, a row per output or gradient that is not counted as an op."""

import functools

import torch
from torch.utils._python_dispatch import _disable_current_modes

from refkern.torch import patterns
from refkern.torch._audit_results import AuditCall
from refkern.torch._threads import torch_threads

__all__ = ["forward_rows", "backward_rows", "not_analysed"]


def not_analysed(exc) -> str:
    """The note of a call whose analysis raised ``exc`` (analysis never breaks the model): its first line."""
    return f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _shapes(*tensors):
    return [tuple(t.shape) for t in tensors if isinstance(t, torch.Tensor)]


def forward_rows(audit, found, judge):
    """A row of ``audit`` per pattern of ``found``, judged whole by ``judge`` (the audit's own, or one that computes
    here when a cluster judges the ops); with autograd recording, its backward hooked (:func:`backward_rows`)."""
    for p in found:
        t = p.out
        m = getattr(p, "module", None)  # an inline rms_norm: named by the module that computed its statistic
        where = audit._where() if m is None else audit._names.get(id(m), type(m).__name__)
        shapes = _shapes(getattr(p, "x", None), getattr(p, "weight", None), getattr(p, "q", None),
                         getattr(p, "theta", None))  # fmt: skip
        call = AuditCall(len(audit.calls), where, p.name, str(t.device), str(t.dtype).removeprefix("torch."),
                         shapes, None, aten=f"pattern {p.kind}", pattern=p.kind)  # fmt: skip
        try:
            call.report, call.sampled = patterns.judge(p, judge, audit.sample)
        except Exception as exc:  # analysis must never break the model
            call.note = not_analysed(exc)
        audit.calls.append(call)
        try:  # with autograd recording: its gradients judged whole too, when a backward pass computes them
            audit._matcher.watch(p, functools.partial(backward_rows, audit, where))
        except Exception as exc:
            audit._matcher.errors.append(f"{p.name}: {type(exc).__name__}: {exc}")


def backward_rows(audit, where, p):
    """A composed pattern's gradients (:meth:`refkern.torch.patterns.Matcher.watch` calls this from an autograd
    hook once the backward pass has computed them): a row of ``audit`` per gradient, judged whole against the exact
    gradient of the one operation the pattern computes; nothing once the audit has closed."""
    if not audit._open:  # a backward pass run after the audit closed
        return
    with _disable_current_modes(), torch.no_grad(), torch_threads(p.grad_output):
        group, why = len(audit.calls), ""
        try:
            reports, sampled = patterns.judge_backward(p, audit.sample)
        except Exception as exc:  # analysis must never break the model
            reports, sampled = {}, 0
            why = not_analysed(exc)
        shapes = _shapes(getattr(p, "x", None), getattr(p, "weight", None), p.grad_output, getattr(p, "theta", None))
        for arg, g in p.grads.items():
            audit.calls.append(AuditCall(len(audit.calls), f"{where} (backward: grad_{arg})", p.name, str(g.device),
                                         str(g.dtype).removeprefix("torch."), shapes, reports.get(arg), note=why,
                                         aten=f"pattern {p.kind}", sampled=sampled, phase="backward", group=group,
                                         pattern=p.kind))  # fmt: skip
