"""The audit of a ``torch.compile``d module, layer by layer.

Compiled code is not made of aten ops the dispatcher shows one by one: inductor fuses them into
kernels of its own, and dynamo does not compile at all while a dispatch mode is active (it runs the
frame eagerly: an audit that watched ``compiled(x)`` through its mode would judge the eager model
and call it compiled). So, when a compiled module is called inside an audit:

1. the compiled module runs for real, the audit stepped aside (its mode and hooks off): its output
   is what the caller gets;
2. the original module runs eagerly under the audit, every op judged as usual; at each leaf module
   (one with no children: a Conv2d, a Linear, a LayerNorm, a ReLU...) the inputs it received are
   kept until it returns, and the leaf, compiled on its own with the same backend and options
   (``mode="max-autotune"`` included), runs on those very inputs. Its output is judged against the
   exact reference of the leaf's op (:func:`refkern.torch.ops.from_module`), or, for a leaf refkern
   has no reference for (GELU, Dropout, a custom module), compared with the eager output bit for bit;
3. end to end, the compiled output is judged against the model's output under
   :func:`refkern.torch.reference_mode` with eager as the baseline (:func:`compare_outputs`).

The first leaf whose compiled verdict is beyond the audit's ``allow`` while its eager ops are
within it is where eager and compiled diverge beyond rounding. A module with children that calls
none of them (a MultiheadAttention uses its ``out_proj``'s parameters without calling it) is compiled
alone as one unit and judged end to end against its forward under reference_mode. The rest of the
code outside the leaves (``torch.relu(x)`` or ``x + identity`` in a container's forward) is compiled
and judged with the whole model, end to end; per op it is judged in eager form only. The result says which ops those are
(``CompiledAudit.outside_leaves``) and the audit's summary counts them, so that nothing is
claimed checked per layer that was not.

A ``torch.compile``d plain function is routed as well (:class:`_FunctionRoute`): run compiled for real,
then eagerly under the audit, then judged end to end (no layer of it compiled alone).
"""

import sys
from dataclasses import dataclass, field

import torch

from refkern.analysis.compare import compare
from refkern.analysis.report import SEVERITY as _SEVERITY  # the one order of verdicts
from refkern.analysis.report import passes
from refkern.torch.ops import from_module

__all__ = ["CompiledAudit", "LayerVerdict", "intercept"]


@dataclass
class LayerVerdict:
    name: str  # "ConvLinearModel.conv1"
    module: str  # "Conv2d"
    op: str  # refkern op ("conv2d"), or "" where there is none
    eager: str | None  # worst verdict of the eager ops inside the leaf (None: none judged)
    compiled: object  # Report of the compiled leaf against the exact reference, or None
    same_as_eager: bool | None  # bitwise, for leaves with no reference
    note: str = ""
    # a module with children that calls none of them (MultiheadAttention: its forward computes with out_proj's
    # parameters): compiled alone as one unit, its output judged against its forward under reference_mode
    # with eager as the baseline (compare_outputs), not op by op
    unit: object = None

    @property
    def verdict(self):
        if self.compiled is not None:
            return self.compiled.verdict
        if self.unit is not None:
            return None
        if self.same_as_eager is None:
            return None
        return "exact" if self.same_as_eager else None

    def to_dict(self):
        return {"name": self.name, "module": self.module, "op": self.op, "eager": self.eager,
                "compiled": self.compiled.to_dict() if self.compiled is not None else None,
                "same_as_eager": self.same_as_eager, "note": self.note,
                "unit": vars(self.unit) if self.unit is not None else None}  # fmt: skip


@dataclass
class CompiledAudit:
    model: str
    backend: str
    layers: list = field(default_factory=list)
    kind: str = "module"  # or "function": a torch.compile'd plain function (no leaves compiled alone)
    end_to_end: object = None  # OutputComparison
    note: str = ""
    allow: tuple = ("exact", "rounding")
    # the eager ops run outside every leaf (a container's ``x + identity``, the inside of a MultiheadAttention,
    # which owns ``out_proj`` and never calls it): module name -> {op: count}. Judged op by op in eager form;
    # compiled, they are inside the whole model's graph only, judged end to end, not one by one.
    outside_leaves: dict = field(default_factory=dict)
    not_called: list = field(default_factory=list)  # leaf modules the forward never called (their parent used them)

    @property
    def n_outside(self):
        return sum(sum(ops.values()) for ops in self.outside_leaves.values())

    def summary(self):
        """'compiled TransformerEncoder: 4 of 7 leaves judged against the exact reference, first divergence none;
        7 ops outside leaves compiled only end to end; end to end ok'."""
        judged = sum(layer.compiled is not None for layer in self.layers)
        units = [layer for layer in self.layers if layer.unit is not None]
        d = self.first_divergence
        if self.kind == "function":
            out = f"compiled function {self.model}: {self.n_outside} ops, compiled, judged only end to end"
        else:
            leaves = len(self.layers) - len(units)
            out = f"compiled {self.model}: {judged} of {leaves} leaves judged against the exact reference"
            if units:
                out += f", {len(units)} modules compiled alone as units judged end to end"
            out += f", first divergence {d.name if d else 'none'}"
        if self.n_outside and self.kind != "function":
            out += f"; {self.n_outside} ops outside leaves compiled only end to end"
        if self.end_to_end is not None:
            out += "; end to end " + ("ok" if self.end_to_end.ok else "WORSE than eager")
        return out

    def _ok(self, v, prec=None):
        return passes(v, prec, self.allow)

    @property
    def first_divergence(self):
        """The first leaf where compiled is beyond ``allow`` while eager is within it (or has no reference
        and differs from eager), or None."""
        for layer in self.layers:
            c = layer.compiled
            eager_ok = layer.eager is None or self._ok(layer.eager)
            if c is not None and not self._ok(c.verdict, c.precision) and eager_ok:
                return layer
            if layer.unit is not None and not layer.unit.ok and eager_ok:
                return layer
        return None

    def lines(self):
        if self.kind == "function":
            out = [f"compiled function {self.model} ({self.backend}): judged end to end only (its ops eagerly, one by "
                   "one, above; the compiled code as a whole)"]  # fmt: skip
        else:
            out = [f"compiled {self.model} ({self.backend}), layer by layer:"]
        for layer in self.layers:
            c = layer.compiled
            if c is not None:
                prec = f" ({c.precision})" if c.precision else ""
                what = f"compiled {c.verdict}{prec}, max {c.max_ulp:.3g} ulp"
            elif layer.unit is not None:
                what = f"compiled alone as one unit (not op by op), against its exact-reference forward: {layer.unit}"
            elif layer.same_as_eager is not None:
                what = "compiled output " + ("equal to eager, bit for bit" if layer.same_as_eager else "differs from "
                                             "eager (no reference: not judged)")  # fmt: skip
            else:
                what = "not judged"
            note = f"; {layer.note}" if layer.note else ""
            out.append(f"  {layer.name} ({layer.op or layer.module}): eager {layer.eager or '-'}, {what}{note}")
        d = self.first_divergence
        if self.kind != "function":
            out.append("  first divergence beyond " + "/".join(self.allow) + ": "
                       + (f"{d.name} ({d.op or d.module})" if d else "none"))  # fmt: skip
        if self.outside_leaves:
            where = "; ".join(f"{name} ({', '.join(k + (f' x{v}' if v > 1 else '') for k, v in ops.items())})"
                              for name, ops in self.outside_leaves.items())  # fmt: skip
            if self.kind == "function":
                out.append(f"  judged eagerly op by op, compiled only end to end: {self.n_outside} ops: {where}")
            else:
                out.append("  not compiled alone (judged eagerly op by op, compiled only end to end): "
                           f"{self.n_outside} ops outside leaf modules: {where}")  # fmt: skip
        if self.not_called:
            never = ", ".join(self.not_called)
            out.append(f"  leaf modules never called (their parent used their parameters): {never}")
        if self.end_to_end is not None:
            out.append(f"  end to end against the exact-reference model: {self.end_to_end}")
        if self.note:
            out.append(f"  {self.note}")
        return out

    def to_dict(self):
        d = self.first_divergence
        return {"model": self.model, "kind": self.kind, "backend": self.backend,
                "layers": [x.to_dict() for x in self.layers],
                "first_divergence": d.name if d else None, "outside_leaves": self.outside_leaves,
                "not_called": self.not_called,
                "end_to_end": vars(self.end_to_end) if self.end_to_end is not None else None}  # fmt: skip


def _backend(cm):
    """The backend ``cm`` was compiled with (inductor with its mode's options, or another), unwrapped."""
    return _unwrap(cm.dynamo_ctx.callback)


def _unwrap(b):
    while hasattr(b, "_torchdynamo_orig_backend"):
        b = b._torchdynamo_orig_backend
    return b


def _backend_name(b):
    cfg = getattr(b, "config", None)
    name = getattr(b, "compiler_name", None) or getattr(b, "__name__", None) or type(b).__name__
    if type(b).__name__ == "_TorchCompileInductorWrapper":
        name = "inductor"
    on = sorted(k for k, v in (cfg or {}).items() if v is True)
    return name + (f" {', '.join(on)}" if on else "")


def intercept(audit):
    """Route calls of compiled modules inside ``audit`` to :func:`run`; returns the undo.

    While torch._dynamo has not been imported nothing compiled exists yet: ``torch.compile`` is
    wrapped for the audit's duration instead, and the first module compiled inside installs the
    route (importing dynamo on every audit would cost seconds)."""
    undo = []
    routed = []

    def install(ev):
        cls = ev.OptimizedModule
        original = cls.__call__

        def call(self, *args, **kwargs):
            return run(audit, self, original, args, kwargs)

        cls.__call__ = call
        routed.append(cls)
        undo.append(lambda: setattr(cls, "__call__", original))
        real = ev._maybe_set_eval_frame
        ev._maybe_set_eval_frame = _FunctionRoute(audit, ev, real)
        undo.append(lambda: setattr(ev, "_maybe_set_eval_frame", real))

    ev = sys.modules.get("torch._dynamo.eval_frame")
    if ev is not None:
        install(ev)
    else:
        real = torch.compile

        def compile_then_route(*args, **kwargs):
            out = real(*args, **kwargs)
            if not routed:
                install(sys.modules["torch._dynamo.eval_frame"])
            return out

        compile_then_route.__wrapped__ = real
        torch.compile = compile_then_route
        undo.append(lambda: setattr(torch, "compile", real))

    def restore():
        for u in reversed(undo):
            u()

    return restore


class _Leaves:
    """Forward pre/post hooks on the leaves of the eager run: compile each on its own and judge it."""

    def __init__(self, audit, result, backend, original_call):
        self.audit = audit
        self.result = result
        self.backend = backend
        self.call = original_call
        self.pending = {}
        self.compiled = {}
        self.handles = []

    def attach(self, model):
        self.running = []  # modules of the model in forward, innermost last: [module, called a child?]
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(self.pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self.post, always_call=True))

    def detach(self):
        for h in self.handles:
            h.remove()

    def pre(self, module, inputs, kwargs=None):
        root = not self.running
        if not root:
            self.running[-1][1] = True
        self.running.append([module, False])
        leaf = next(module.children(), None) is None
        if not leaf and (root or not all(isinstance(t, torch.Tensor) for t in inputs)):
            return  # the whole model is judged end to end; a container's inputs are kept only while it runs
        with self.audit._suspended(), torch.no_grad():
            kept = tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs)
            kw = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in (kwargs or {}).items()}
        self.pending[id(module)] = (kept, len(self.audit.calls), kw)

    def post(self, module, inputs, output):
        called_child = False
        if self.running and self.running[-1][0] is module:
            called_child = self.running.pop()[1]
        kept, first, kw = self.pending.pop(id(module), (None, 0, {}))
        leaf = next(module.children(), None) is None
        if kept is None or (leaf and not isinstance(output, torch.Tensor)) or (not leaf and called_child):
            return
        name = self.audit._names.get(id(module), type(module).__name__)
        eager = [c.verdict for c in self.audit.calls[first:] if c.name == name and c.report is not None]
        worst = min(eager, key=lambda v: _SEVERITY[v]) if eager else None
        with self.audit._suspended(), torch.no_grad():
            if leaf:
                self.result.layers.append(self.judge(module, name, kept, output.detach(), worst))
            else:
                self.result.layers.append(self.unit(module, name, kept, kw, output, worst))

    def unit(self, module, name, inputs, kwargs, eager_out, eager_worst):
        """A module with children that called none of them: compiled alone, run on the arguments it received,
        judged end to end against its forward under reference_mode, with its eager output as the baseline."""
        from refkern.torch.reference import compare_outputs, reference_mode

        layer = LayerVerdict(name, type(module).__name__, "", eager_worst, None, None)
        try:
            fn = self.compiled.get(id(module))
            if fn is None:
                fn = self.compiled[id(module)] = torch.compile(module.forward, backend=self.backend)
            out = fn(*inputs, **kwargs)
            with reference_mode():
                ref = module.forward(*inputs, **kwargs)
            layer.unit = compare_outputs(out, ref, eager_out)
        except Exception as exc:
            layer.note = f"compiling it alone failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return layer

    def judge(self, module, name, inputs, eager_out, eager_worst):
        spec = from_module(module, inputs[0]) if inputs and isinstance(inputs[0], torch.Tensor) else None
        op = spec.op if spec is not None and spec.op else ""
        layer = LayerVerdict(name, type(module).__name__, op, eager_worst, None, None)
        saved = {k: b.clone() for k, b in module.named_buffers()}  # a batch norm in training updates them again
        try:
            fn = self.compiled.get(id(module))
            if fn is None:  # its forward, not the module: the audit's hooks on it stay out of the graph
                fn = self.compiled[id(module)] = torch.compile(module.forward, backend=self.backend)
            out = fn(*inputs)
        except Exception as exc:
            layer.note = f"compiling it alone failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            return layer
        finally:
            for k, b in module.named_buffers():
                b.copy_(saved[k])
        if not isinstance(out, torch.Tensor):
            layer.note = "its output is not one tensor: not judged"
            return layer
        if spec is not None and not spec.unsupported:
            args, kwargs = spec.on_cpu()
            try:
                layer.compiled = compare(out.detach().cpu(), spec.op, *args, **kwargs)
            except Exception as exc:
                layer.note = f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            return layer
        from refkern.torch._bits import _same_bits

        n, nd, ulp, _ = _same_bits(out.detach().cpu(), eager_out.cpu())
        layer.same_as_eager = nd == 0
        if nd:
            layer.note = f"{nd} of {n} elements differ from eager, up to {ulp:.3g} ulp"
        return layer


def _outside(audit, model, result, first):
    """What of the eager run was not inside a leaf (so not compiled alone), and which leaves never ran."""
    root = audit._names.get(id(model), type(model).__name__)
    leaves = [audit._names.get(id(m), type(m).__name__) for m in model.modules() if next(m.children(), None) is None]
    inside = set(leaves)
    for c in audit.calls[first:]:
        if c.phase != "forward" or c.name in inside or not (c.name == root or c.name.startswith(root + ".")):
            continue
        ops = result.outside_leaves.setdefault(c.name, {})
        ops[c.op] = ops.get(c.op, 0) + 1
    ran = {layer.name for layer in result.layers}
    for layer in result.layers:
        if layer.unit is not None:
            result.outside_leaves.pop(layer.name, None)  # compiled alone, as one unit
    result.not_called = [n for n in leaves if n not in ran and n != root]


def run(audit, cm, original_call, args, kwargs):
    """``cm(*args, **kwargs)`` for real, then the layer-by-layer audit of it (see the module's doc)."""
    import torch._dynamo

    from refkern.torch.reference import compare_outputs, reference_mode

    model = cm._orig_mod
    backend = _backend(cm)
    result = CompiledAudit(type(model).__name__, _backend_name(backend), allow=audit.allow)
    limits = dict(recompile_limit=10**6, accumulated_recompile_limit=10**6)
    with torch._dynamo.config.patch(**limits):
        with audit._suspended():
            out = original_call(cm, *args, **kwargs)  # the compiled model, for real: what the caller gets
        leaves = _Leaves(audit, result, backend, original_call)
        leaves.attach(model)
        saved = {k: b.clone() for k, b in model.named_buffers()}
        first = len(audit.calls)
        try:
            eager = model(*args, **kwargs)  # under the audit: every eager op judged, every leaf compiled alone
        finally:
            leaves.detach()
        _outside(audit, model, result, first)
        with audit._suspended(), torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])
            with reference_mode():
                ref = model(*args, **kwargs)
            for k, b in model.named_buffers():
                b.copy_(saved[k])
            try:
                result.end_to_end = compare_outputs(out, ref, eager)
            except ValueError as exc:
                result.note = f"end to end not compared: {exc}"
    audit.compiled.append(result)
    return out


class _FunctionRoute:
    """Stands in for ``torch._dynamo.eval_frame._maybe_set_eval_frame`` during an audit, to route calls of a
    ``torch.compile``d plain function (dynamo would otherwise run it eagerly under the audit's dispatch mode,
    and the compiled code would never run). The wrapper dynamo returns (``compile_wrapper``) turns its frame
    callback on at entry and restores the prior one at exit, through this function: at entry, with the audit
    active, the audit steps aside and the compiled function runs for real (what the caller gets); at exit,
    the audit back on, the function runs again eagerly under it (every op judged) and under
    :func:`refkern.torch.reference_mode`, and the compiled result is judged end to end."""

    def __init__(self, audit, ev, real):
        self.audit = audit
        self.file = ev.__file__
        self.real = real
        self.open = {}

    def __call__(self, callback):
        f = sys._getframe(1)
        if f.f_code.co_name != "compile_wrapper" or f.f_code.co_filename != self.file:
            return self.real(callback)
        key = id(f)
        if key in self.open:  # the exit of a routed call
            suspend, fn, ctx, args, kwargs = self.open.pop(key)
            suspend.__exit__(None, None, None)
            loc = f.f_locals
            if "result" in loc:
                try:
                    _judge_function(self.audit, fn, ctx, args, kwargs, loc["result"])
                except Exception as exc:  # the audit must never break the model
                    name = getattr(fn, "__qualname__", type(fn).__name__)
                    res = CompiledAudit(name, "?", kind="function", allow=self.audit.allow)
                    res.note = f"not judged: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
                    self.audit.compiled.append(res)
            return self.real(callback)
        from refkern.torch._bits import _top_is

        if callback not in (None, False) and self.audit._mode is not None and _top_is(self.audit._mode):
            loc = f.f_locals
            suspend = self.audit._suspended()
            suspend.__enter__()
            self.open[key] = (suspend, loc["fn"], loc["self"], loc["args"], loc["kwargs"])
        return self.real(callback)


def _judge_function(audit, fn, ctx, args, kwargs, out):
    import torch._dynamo

    from refkern.torch.reference import compare_outputs, reference_mode

    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    result = CompiledAudit(name, _backend_name(_unwrap(ctx.callback)), kind="function", allow=audit.allow)
    first = len(audit.calls)
    with torch._dynamo.config.patch(recompile_limit=10**6, accumulated_recompile_limit=10**6):
        eager = fn(*args, **kwargs)  # the eval frame is off here: eagerly, under the audit, every op judged
    for c in audit.calls[first:]:
        if c.phase == "forward":
            ops = result.outside_leaves.setdefault(c.name, {})
            ops[c.op] = ops.get(c.op, 0) + 1
    with audit._suspended(), torch.no_grad():
        with reference_mode():
            ref = fn(*args, **kwargs)
        try:
            result.end_to_end = compare_outputs(out, ref, eager)
        except ValueError as exc:
            result.note = f"end to end not compared: {exc}"
    audit.compiled.append(result)
