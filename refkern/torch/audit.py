"""``refkern.torch.audit``: every call of a model that refkern has an exact reference for (products,
convolutions, reductions, norms, pools, softmax, attention), against that reference."""

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from refkern.analysis.compare import compare
from refkern.analysis.report import COLUMNS_NOTE
from refkern.torch.ops import COMPOSITES, composite_body, from_call

__all__ = ["audit", "Audit", "AuditCall"]

_SEVERITY = {"mismatch": 0, "reduced-precision": 1, "rounding": 2, "exact": 3, None: -1}


@dataclass
class AuditCall:
    index: int  # call order
    name: str  # module path ("features.0"), or the op where no module made the call
    op: str  # the torch function ("conv2d", "linear", "matmul", "addmm", ...)
    device: str
    dtype: str
    shapes: list
    report: object  # Report, or None when the call could not be analysed
    note: str = ""

    @property
    def verdict(self):
        return self.report.verdict if self.report is not None else None

    def cells(self):
        r = self.report
        shapes = " x ".join(str(tuple(s)) for s in self.shapes)
        if r is None:
            return [str(self.index), self.name, self.op, shapes, self.device, self.dtype, "-", "", "", "", self.note]
        prec = f" ({r.precision})" if r.precision else ""
        return [str(self.index), self.name, self.op, shapes, self.device, self.dtype, r.verdict + prec,
                f"{r.max_prob_ratio:.3g}", f"{r.max_bound_ratio:.3g}", f"{r.max_ulp:.3g}", self.note]  # fmt: skip


class _Mode(TorchFunctionMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in COMPOSITES:  # made of audited calls: record each of them
            with _Mode(self.owner):
                return composite_body(func)(*args, **kwargs)
        spec = from_call(func, args, kwargs)
        if spec is not None and spec.op == "batch_norm":  # it writes into its running statistics: keep the inputs
            spec.args, spec.kwargs = spec.on_cpu(copy=True)
        out = func(*args, **kwargs)
        value = out[0] if isinstance(out, tuple) and out and spec is not None else out  # max_pool's (values, indices)
        if spec is not None and isinstance(value, torch.Tensor):
            self.owner._record(spec, value)
        elif spec is None:
            self.owner._skip(func, out)
        return out


# Calls that only move, select or restate values (views, copies, concatenation, constants, random
# draws): nothing is computed from an input, so nothing can be rounded or wrong in arithmetic. Any other call that
# returns a floating-point tensor and has no reference in refkern is counted as not checked.
_MOVES = frozenset(
    "view view_as reshape reshape_as flatten unflatten permute transpose t T mT contiguous expand expand_as squeeze "
    "unsqueeze clone detach __getitem__ chunk split unbind narrow select cat concat concatenate stack index_select "
    "gather to type float half bfloat16 double cpu cuda zeros_like ones_like empty_like full_like new_zeros "
    "new_ones new_empty new_full zeros ones empty full arange tensor as_tensor requires_grad_ __get__ "
    "repeat tile roll flip movedim swapaxes pad randn rand randint randn_like rand_like randint_like normal_ "
    "uniform_ bernoulli_".split()
)  # fmt: skip


def _call_name(func) -> str:
    """'add' for torch.add, Tensor.add, Tensor.__add__, __radd__ and __iadd__; 'relu' for F.relu."""
    name = getattr(func, "__name__", None) or str(func)
    if name.startswith("__") and name.endswith("__") and name not in ("__getitem__", "__get__"):
        name = name[2:-2]
        name = name[1:] if name[:1] in "ri" and name[1:] in _DUNDER_OPS else name
    return name


# In-place writes of constants or random draws (parameter initialisation, buffers reset).
_WRITES = frozenset("fill_ zero_ copy_ uniform_ normal_ bernoulli_ exponential_ random_ set_ resize_".split())
_DUNDER_OPS = frozenset("add sub mul truediv floordiv matmul pow mod neg and or xor lshift rshift".split())


class Audit:
    """Context manager: records and analyses every call made inside it that refkern has a
    reference for (:data:`refkern.torch.ops.FUNCTIONS`: conv1d/2d/3d, conv_transpose1d/2d/3d, linear,
    matmul / @, mm, bmm, addmm, baddbmm, sum, mean, var, std, cumsum, layer_norm, rms_norm,
    group_norm, batch_norm, the pools, softmax, log_softmax, scaled_dot_product_attention; inside
    nn.MultiheadAttention, each projection and the attention), on whatever device the model runs.
    torch turns its fused fast paths off while a function mode is active (the
    TransformerEncoderLayer and MultiheadAttention inference kernels): under audit a model runs
    the composed ops those kernels stand for, and those are what is judged.

    Each call is analysed as it happens, from its own inputs, and only the Report is kept, so
    the audit holds no activation alive. ``calls``: one AuditCall per call; ``first_failure``:
    the first call whose verdict is neither exact nor rounding; ``report()``: a table in call order
    (``report(order="worst")``: worst first).
    """

    def __init__(self, allow=("exact", "rounding")):
        self.allow = tuple(allow)
        self.calls: list[AuditCall] = []
        self.unchecked: dict[str, int] = {}
        self._stack = []
        self._names = {}
        self._hooks = []
        self._mode = None

    # module names: the innermost module in forward when a call is made
    def _pre(self, module, inputs):
        if not self._stack and id(module) not in self._names:
            root = type(module).__name__
            self._names.update({id(m): (f"{root}.{n}" if n else root) for n, m in module.named_modules()})
        self._stack.append(module)

    def _post(self, module, inputs, output):
        if self._stack and self._stack[-1] is module:
            self._stack.pop()

    def _skip(self, func, out):
        """Count a call with no reference in refkern that computed floating-point values."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in outs):
            return
        name = _call_name(func)
        if name in _MOVES or name.endswith("_") and name[:-1] in _MOVES or name in _WRITES:
            return
        if getattr(func, "__module__", "") == "torch.nn.init":  # a module's parameters being initialised
            return
        self.unchecked[name] = self.unchecked.get(name, 0) + 1

    def _record(self, spec, out):
        name = self._names.get(id(self._stack[-1]), type(self._stack[-1]).__name__) if self._stack else spec.torch_name
        shapes = [tuple(t.shape) for t in spec.tensors()] if not spec.unsupported else []
        call = AuditCall(len(self.calls), name, spec.torch_name, str(out.device), str(out.dtype).removeprefix("torch."),
                         shapes, None)  # fmt: skip
        if spec.unsupported:
            call.note = spec.unsupported
        else:
            try:
                args, kwargs = spec.on_cpu()
                call.report = compare(out.detach(), spec.op, *args, **kwargs)
            except Exception as exc:  # analysis must never break the model
                call.note = f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        self.calls.append(call)

    def __enter__(self):
        reg = torch.nn.modules.module
        self._hooks = [reg.register_module_forward_pre_hook(self._pre), reg.register_module_forward_hook(self._post)]
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        self._stack.clear()
        return False

    def _allowed(self, c):
        r = c.report
        return r.verdict in self.allow or (r.verdict == "reduced-precision" and r.precision in self.allow)

    @property
    def first_failure(self):
        """The first analysed call whose verdict is not in ``allow`` (default: exact, rounding; a
        precision such as "tf32" admits that reduced precision), or None."""
        for c in self.calls:
            if c.report is not None and not self._allowed(c):
                return c
        return None

    @property
    def not_analysed(self):
        """Calls that could not be analysed (an unsupported form, or an error in the analysis)."""
        return [c for c in self.calls if c.report is None]

    def report(self, order: str = "call") -> str:
        """A table with a row per call, in call order (``order="worst"``: worst first, as the
        header then says), under a line that names the first failing call."""
        if order not in ("call", "worst"):
            raise ValueError(f"audit: unknown order={order!r}; choose one of 'call', 'worst'.")
        head = ["#", "module", "op", "shapes", "device", "dtype", "verdict", "error/noise", "bound ratio", "max ulp",
                "note"]  # fmt: skip
        rows = list(self.calls)
        if order == "worst":
            rows.sort(key=lambda c: (_SEVERITY[c.verdict], -(c.report.max_bound_ratio if c.report else 0)))
        table = [head] + [c.cells() for c in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in table]
        f = self.first_failure
        counts = {}
        for c in self.calls:
            counts[c.verdict or "not analysed"] = counts.get(c.verdict or "not analysed", 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in counts.items())
        skipped = len(self.not_analysed)
        partial = skipped or self.unchecked
        if f is None:
            first = ("every analysed call is " if partial else "every call is ") + " or ".join(self.allow)
            if skipped:
                first += f"; {skipped} not analysed (see note)"
        else:
            prec = f" ({f.report.precision})" if f.report.precision else ""
            first = f"first call beyond {'/'.join(self.allow)}: #{f.index} {f.name} ({f.op}): {f.verdict}{prec}"
        listed = "calls in call order" if order == "call" else "calls worst first (mismatch, then by bound ratio)"
        out = [f"audit: {len(self.calls)} calls ({summary}); {first}"]
        if self.unchecked:
            out.append(f"not checked (no reference in refkern): {self.unchecked_summary()}")
        return "\n".join([*out, f"{listed}:", *lines, f"({COLUMNS_NOTE})"])

    def unchecked_summary(self) -> str:
        """'relu x4, add x2, gelu x1': the calls that computed values refkern has no reference
        for, most frequent first ('' when there are none)."""
        items = sorted(self.unchecked.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} x{v}" for k, v in items)

    def __str__(self):
        return self.report()


def audit(allow=("exact", "rounding")) -> Audit:
    """``with refkern.torch.audit() as a: model(x)`` then ``print(a.report())``."""
    return Audit(allow)
