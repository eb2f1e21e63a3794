"""``reference_mode``: a model's output with every op refkern has a reference for computed exactly, and
``compare_outputs``: judge a candidate (compiled, other device) against it end to end."""

import math
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

import refkern.ops as _ops
from refkern.torch.ops import COMPOSITES, composite_body, from_call

__all__ = ["reference_mode", "compare_outputs", "OutputComparison"]


class _Reference(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.replaced = 0
        self.passed_through = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in COMPOSITES:  # made of calls refkern replaces: replace each of them
            with _Nested(self):
                return composite_body(func)(*args, **kwargs)
        spec = from_call(func, args, kwargs)
        if spec is None:
            return func(*args, **kwargs)
        if kwargs.get("out") is not None:  # the result must land in a given tensor: leave the call alone
            self.passed_through.append(f"{spec.torch_name} with out=")
            return func(*args, **kwargs)
        if spec.unsupported:
            self.passed_through.append(spec.unsupported)
            return func(*args, **kwargs)
        cpu_args, cpu_kwargs = spec.on_cpu()
        dev = next(t.device for t in spec.tensors())
        if spec.op == "batch_norm" and cpu_kwargs.get("training"):  # torch updates the running statistics
            batch_norm = _ops.get("batch_norm").reference
            out, mean, var = batch_norm(*cpu_args, **cpu_kwargs, return_running_stats=True)
            for key, new in (("running_mean", mean), ("running_var", var)):
                given = spec.kwargs.get(key)  # the model's own buffer, on its device
                if given is not None:
                    with torch.no_grad():
                        given.copy_(new)
            self.replaced += 1
            return out.to(dev)
        if spec.dtype is not None:  # an exact form with wider operands (addmm): rounded once to the result dtype
            from refkern.accumulate.formats import FORMATS
            from refkern.analysis.evaluate import evaluate

            fmt = FORMATS[str(spec.dtype).removeprefix("torch.")]
            values = evaluate(spec.op, cpu_args, cpu_kwargs, out=fmt).values
            self.replaced += 1
            return torch.from_numpy(values).to(spec.dtype).to(dev)  # values of fmt: the conversion is exact
        out = _ops.get(spec.op).reference(*cpu_args, **cpu_kwargs)  # exact, rounded once, CPU tensor(s)
        self.replaced += 1
        if isinstance(out, tuple):  # max_pool's (values, indices)
            return tuple(t.to(dev) for t in out)
        return out.to(dev)


class _Nested(TorchFunctionMode):
    """The replacing mode again, inside a composite call, counting into the outer one."""

    def __init__(self, outer):
        super().__init__()
        self.outer = outer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.outer.__torch_function__(func, types, args, kwargs)


def reference_mode():
    """Context manager: inside it every call a model makes that refkern has a reference for
    (:data:`refkern.torch.ops.FUNCTIONS`: the products and convolutions, sum/mean/var/std/cumsum, the
    norms, the pools, softmax, log_softmax, scaled_dot_product_attention, and those inside
    nn.MultiheadAttention) is computed by refkern's kernel (correctly rounded to the result dtype)
    on the CPU, and moved back to the input's device; batch_norm in training also writes the
    running statistics torch would store. Everything else runs as usual. The mode object counts
    ``replaced`` calls and lists those ``passed_through`` (not expressible exactly)."""
    return _Reference()


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return []


def _rmse(a, ref):
    d = [(t.detach().cpu().double() - r.detach().cpu().double()).reshape(-1) for t, r in zip(a, ref)]
    d = torch.cat(d) if d else torch.zeros(1)
    return math.sqrt(float((d * d).mean())) if d.numel() else 0.0


@dataclass
class OutputComparison:
    candidate_error: float  # rms error of the candidate against the exact-accumulation output
    baseline_error: float  # rms error of the baseline (eager fp32) against it
    ratio: float
    multiplier: float
    tol: float
    ok: bool

    def __str__(self):
        verdict = "ok" if self.ok else "WORSE than the baseline"
        return (f"candidate rms error {self.candidate_error:.3g}, baseline {self.baseline_error:.3g} "
                f"({self.ratio:.3g}x; allowed {self.multiplier}x + {self.tol / 10:.1g}): {verdict}")  # fmt: skip


def compare_outputs(actual, reference, baseline, *, multiplier: float = 2.0, tol: float = 1e-4) -> OutputComparison:
    """End-to-end accuracy the way torch._dynamo judges a compiled model, against an exact reference.

    ``reference``: the model's output under :func:`reference_mode` (exact accumulation);
    ``baseline``: eager fp32; ``actual``: the candidate (compiled, another device or dtype).
    As dynamo's ``same(..., fp64_ref=...)``: ok when the candidate's rms error is at most
    ``multiplier`` times the baseline's, plus ``tol / 10``. Tensors or nested tuples/lists/dicts.
    """
    a, r, b = _flat(actual), _flat(reference), _flat(baseline)
    if not (len(a) == len(r) == len(b)) or any(x.shape != y.shape or z.shape != y.shape for x, y, z in zip(a, r, b)):
        raise ValueError(
            f"compare_outputs: actual, reference and baseline must hold tensors of the same shapes; got "
            f"{[tuple(t.shape) for t in a]}, {[tuple(t.shape) for t in r]} and {[tuple(t.shape) for t in b]}."
        )
    ce, be = _rmse(a, r), _rmse(b, r)
    ok = ce <= multiplier * be + tol / 10.0
    return OutputComparison(ce, be, ce / be if be else (0.0 if ce == 0 else math.inf), multiplier, tol, ok)
