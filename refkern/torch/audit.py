"""``refkern.torch.audit``: every op a model runs, as torch's dispatcher runs it, against refkern's
references; and what was not checked, with the reason.

The audit records at torch's dispatch level (a ``TorchDispatchMode``): every aten op that executes
is seen, whether it came from a module, a functional call, the inside of
``F.multi_head_attention_forward``, a decomposition or a fused fast path, and nothing the model
runs is changed by the audit (a function-level mode would turn torch's fused fast paths off; a
dispatch mode does not). Each op is named by the innermost module whose forward ran it (global
module forward pre/post hooks keep a stack). See :mod:`refkern.torch.dispatch` for what each op is.
"""

import bisect
import math
import sys
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from refkern.analysis.compare import compare
from refkern.analysis.report import COLUMNS_NOTE
from refkern.gradients import compare_backward
from refkern.torch import dispatch as dsp
from refkern.torch._bits import _same_bits, _top_is
from refkern.torch.sample import restrict

__all__ = ["audit", "Audit", "AuditCall", "BitReport"]

_SEVERITY = {"mismatch": 0, "reduced-precision": 1, "rounding": 2, "exact": 3, None: -1}


class BitReport:
    """The verdict of an op whose result is defined to the bit (IEEE 754 add, mul, div, sqrt,
    comparisons, selections, integer arithmetic): recomputed on the CPU in the same dtype, from the
    same inputs; ``exact`` when every element is the same (NaN matching NaN), else ``mismatch``."""

    precision = None
    notes = ()

    def __init__(self, n, n_diff, max_ulp, first=None):
        self.n = n
        self.n_diff = n_diff
        self.max_ulp = max_ulp
        self.first = first  # index of the first differing element
        self.verdict = "exact" if n_diff == 0 else "mismatch"
        self.max_bound_ratio = math.inf if n_diff else 0.0
        self.max_prob_ratio = math.inf if n_diff else 0.0

    def to_dict(self):
        return {"verdict": self.verdict, "kind": "bitwise", "n": self.n, "n_diff": self.n_diff,
                "max_ulp": self.max_ulp, "first": self.first}  # fmt: skip

    def __str__(self):
        if not self.n_diff:
            return f"exact: all {self.n} elements equal the CPU's IEEE result"
        return (f"mismatch: {self.n_diff} of {self.n} elements differ from the CPU's IEEE result (first at index "
                f"{self.first}, up to {self.max_ulp:.3g} ulp)")  # fmt: skip


@dataclass
class AuditCall:
    index: int  # order among the judged calls
    name: str  # module path ("ResNet.layer1.0.conv1"), or "-" where no module ran the op
    op: str  # the refkern op it was judged as ("conv2d", "linear"), or the aten op's name ("relu", "add")
    device: str
    dtype: str
    shapes: list
    report: object  # Report or BitReport; None when the call could not be analysed
    note: str = ""
    aten: str = ""  # "aten.convolution.default"
    parts: dict = field(default_factory=dict)  # extra outputs: label -> Report, or the reason it is not judged
    sampled: int = 0  # with a sample: how many output elements were judged (0: all)
    phase: str = "forward"  # "backward": an op run by autograd's backward pass (loss.backward() inside the audit)
    group: int = -1  # the index of the first call of the same op (a backward kernel: one call per gradient)

    @property
    def verdict(self):
        if self.report is None:
            return None
        worst = self.report.verdict
        for r in self.parts.values():
            if not isinstance(r, str) and _SEVERITY[r.verdict] < _SEVERITY[worst]:
                worst = r.verdict
        return worst

    def cells(self):
        r = self.report
        shapes = " x ".join(str(tuple(s)) for s in self.shapes)
        head = [str(self.index), self.name, self.op, shapes, self.device, self.dtype]
        note = self.note
        extra = [f"{k}: {v.verdict}" if not isinstance(v, str) else f"{k} not judged" for k, v in self.parts.items()]
        if extra:
            note = "; ".join([*([note] if note else []), *extra])
        if self.sampled:
            note = "; ".join([*([note] if note else []), f"{self.sampled} sampled elements"])
        if r is None:
            return [*head, "-", "", "", "", note]
        if isinstance(r, BitReport):
            return [*head, r.verdict + " (bitwise)", "", "", f"{r.max_ulp:.3g}" if r.n_diff else "0", note]
        verdict = self.verdict
        prec = f" ({r.precision})" if r.precision and verdict == r.verdict else ""
        return [*head, verdict + prec, f"{r.max_prob_ratio:.3g}", f"{r.max_bound_ratio:.3g}", f"{r.max_ulp:.3g}", note]


def _tensors(x):
    return dsp._tensors(x)


def _cpu(a, copy=False):
    """``a`` with every tensor detached, on the CPU, as a plain torch.Tensor (lossless)."""
    if isinstance(a, torch.Tensor):
        t = a.detach().to("cpu", copy=copy)
        return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
    if isinstance(a, (list, tuple)):
        return type(a)(_cpu(v, copy) for v in a)
    if isinstance(a, torch.device):
        return torch.device("cpu")
    return a


class _Mode(TorchDispatchMode):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.owner._pending:  # the previous op's autograd node exists now: attach what its backward needs
            self.owner._attach()
        name = dsp.op_name(func)
        before = None
        if (name in dsp._DEFINED or name in dsp._REFERENCED) and dsp.mutated(func):
            # it writes into an argument (relu_, add_, a batch norm's running statistics): keep what it read
            b = dsp.bind(func, args, kwargs)
            before = {k: _cpu(b[k], copy=True) for k in dsp.mutated(func) if isinstance(b.get(k), torch.Tensor)}
        out = func(*args, **kwargs)
        try:
            self.owner._observe(func, args, kwargs, out, before)
        except Exception as exc:  # the audit must never break the model
            self.owner._failed(func, exc)
        return out


class Audit:
    """Context manager: every op the code inside it runs (at torch's dispatch level), judged:

    - ops that compute a refkern op (convolutions, transposed too; mm, bmm, addmm, baddbmm, mv, dot;
      sum, mean, var, std, cumsum; softmax, log_softmax; layer/group/batch/rms norm, with their
      extra outputs such as the mean; avg/max/adaptive pools; scaled-dot-product attention, every
      backend kernel of it) against the exact reference of their own inputs: a verdict;
    - ops whose IEEE result is defined to the bit (add, sub, mul, div, sqrt, relu, neg, where,
      comparisons, selections, conversions to a narrower float, integer arithmetic) recomputed on
      the CPU in the same dtype and compared bit for bit (exact, or mismatch). On the CPU itself this
      re-runs the same kernel: it checks what ran on another device, under a tensor subclass, a
      mode or a compiler, not the CPU's own kernel;
    - everything else is listed as not checked, with the reason: no reference (gelu, exp, tanh:
      results that libm and each backend round their own way), a random draw (dropout's mask), or a
      fused kernel (``_transformer_encoder_layer_fwd`` under ``torch.no_grad()``), not looked inside.
      Views, copies, concatenation and constants compute nothing and are not counted.

    ``loss.backward()`` called inside the block is audited too (autograd's engine runs each node's
    formula as aten ops through the same mode): backward kernels (``convolution_backward``, the
    norms', softmax's and pools' backward, scaled-dot-product attention's fused ones: dq, dk, dv)
    judged per gradient by :func:`refkern.compare_backward` on
    the tensors they received, the ``mm``/``sum`` a gradient is made of judged as forward ops, each
    named by the module whose parameter it is the gradient of ("ResNet.fc (backward: grad_weight)")
    or whose forward made the autograd node; ``AuditCall.phase`` is "backward" and ``phases`` counts
    [checked, not checked] per phase (docs/torch.md, "The backward pass").

    Each op is analysed as it runs, from its own inputs, and only the verdict is kept: no
    activation stays alive (a softmax's input is kept on its autograd node for its backward, where
    autograd itself keeps only the output). ``calls``: one AuditCall per judged op (and per op that could not be
    analysed, with a note); ``counts``: per op name, [checked, not checked]; ``unchecked``: op name ->
    number of ops not checked; ``first_failure``; ``report()``.

    Options: ``allow`` the verdicts (and precisions, e.g. "tf32") that pass; ``sample``: judge at most
    this many output elements of each large op, a deterministic sub-grid (exact for those elements;
    the verdict's statistics are those of the sample); ``progress``: a live line on stderr (default:
    when stderr is a terminal). A ``torch.compile``d module called inside the audit is audited layer
    by layer (:mod:`refkern.torch.compiled`): ``compiled`` holds those results.
    """

    def __init__(self, allow=("exact", "rounding"), *, sample=None, progress=None, client=None, budget=None):
        if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
            raise ValueError(f"audit: sample must be a positive number of elements or None; got sample={sample!r}.")
        if progress not in (None, True, False):
            raise ValueError(f"audit: progress must be True, False or None (on a terminal); got {progress!r}.")
        self.allow = tuple(allow)
        self.sample = sample
        self._remote = None  # with a dask.distributed client: verdicts computed on its workers (refkern.scale)
        if client is not None:
            from refkern.scale.remote import remote_for

            self._remote = remote_for(client, budget)
        self.progress = progress
        self.calls: list[AuditCall] = []
        self.counts: dict[str, list] = {}
        self.unchecked: dict[str, int] = {}
        self.reasons: dict[str, str] = {}
        self.compiled = []  # CompiledAudit, one per compiled module called inside
        self.lowered: dict[tuple, int] = {}  # (module, from dtype, to dtype) -> conversions to a narrower float
        self._stack = []
        self._names = {}
        self._hooks = []
        self._mode = None
        self._live = None
        self._shown = 0.0
        self._patch = None
        self.phases: dict[str, list] = {}  # "forward" / "backward" -> [checked, not checked]
        self._phase = "forward"
        self._here = None  # the name of the backward op being observed (module hooks do not run in backward)
        self._names_out = []  # with it, the name of each of its outputs' gradients
        self._params = {}  # id(parameter) -> (module path, attribute name)
        self._pending = []  # (weakref to a forward op's output, what its backward will need): see _attach
        # module forward calls as intervals of autograd's sequence numbers (a node created while a module ran
        # belongs to it): starts, ends (None while running), parent interval, module name
        self._starts, self._ends, self._parents, self._inames, self._istack = [], [], [], [], []

    # module names: the innermost module in forward when an op runs
    def _pre(self, module, inputs):
        if not self._stack and id(module) not in self._names:
            root = type(module).__name__
            for n, m in module.named_modules():
                path = f"{root}.{n}" if n else root
                self._names[id(m)] = path
                for pn, p in m.named_parameters(recurse=False):
                    self._params.setdefault(id(p), (path, pn))
                if self._remote is not None:  # shipped once, when first read
                    for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)):
                        self._remote.register(t)
        self._stack.append(module)
        self._starts.append(torch.autograd._get_sequence_nr())
        self._ends.append(None)
        self._parents.append(self._istack[-1] if self._istack else -1)
        self._inames.append(self._names.get(id(module), type(module).__name__))
        self._istack.append(len(self._starts) - 1)

    def _post(self, module, inputs, output):
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
            if self._istack:
                self._ends[self._istack.pop()] = torch.autograd._get_sequence_nr()

    def _where(self):
        if self._here is not None:
            return self._here
        if not self._stack:
            return "-"
        return self._names.get(id(self._stack[-1]), type(self._stack[-1]).__name__)

    # the backward pass: autograd's nodes, their modules and the parameters whose gradients they produce
    def _node_module(self, node):
        """The innermost module whose forward created autograd ``node`` (by its sequence number), or "-"."""
        s = node._sequence_nr()
        i = bisect.bisect_right(self._starts, s) - 1
        while i >= 0:
            end = self._ends[i]
            if end is None or end > s:
                return self._inames[i]
            i = self._parents[i]  # this call ended before the node was made: an enclosing call may hold it
        return "-"

    def _backward_names(self, node, func, args, outs):
        """'ResNet.layer1.0.conv1 (backward: grad_weight)' for each output of a backward op: the module whose
        parameter the gradient is for, or the module whose forward made the node and the node's input."""
        module = self._node_module(node)

        def label(where, what):
            return f"{where} (backward: {what})" if where != "-" else f"(backward: {what})"

        names = []
        for e in dsp.op_edges(node, func, args, outs):
            if e is None or e >= len(node.next_functions):
                names.append(label(module, node.name()))
                continue
            p = dsp.leaf(node.next_functions[e][0])
            if p is not None and id(p) in self._params:
                owner, attr = self._params[id(p)]
                names.append(label(owner, f"grad_{attr}"))
            else:
                names.append(label(module, f"grad_{dsp.edge_name(node, e)}"))
        return names

    def _memo(self, func, args, kwargs, out):
        """Keep, for the backward of this forward op, what it will not receive (a norm's eps, a softmax's input):
        attached to its autograd node as soon as the node exists (the next op), so that it lives as long as
        the graph does."""
        if not any(t.requires_grad for t in _tensors(args) if isinstance(t, torch.Tensor)):
            return
        memo = dsp.forward_memo(func, dsp.bind(func, args, kwargs))
        outs = _tensors(out)
        if memo is not None and outs:
            self._pending.append((weakref.ref(outs[0]), memo))

    def _attach(self):
        pending, self._pending = self._pending, []
        for ref, memo in pending:
            t = ref()
            fn = t.grad_fn if t is not None else None
            if fn is not None:
                fn.metadata["refkern"] = memo

    def _count(self, name, checked, why=None):
        c = self.counts.setdefault(name, [0, 0])
        c[0 if checked else 1] += 1
        self.phases.setdefault(self._phase, [0, 0])[0 if checked else 1] += 1
        if not checked:
            self.unchecked[name] = self.unchecked.get(name, 0) + 1
            if why and name not in self.reasons:
                self.reasons[name] = why

    def _failed(self, func, exc):
        name = dsp.op_name(func)
        why = f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        self.calls.append(AuditCall(len(self.calls), self._where(), name, "-", "-", [], None, why, str(func),
                                    phase=self._phase))  # fmt: skip
        self._count(name, False, why)

    def _observe(self, func, args, kwargs, out, before):
        self._here, self._phase = None, "forward"
        kind = dsp.classify(func, args, kwargs, out)
        if kind == "move" or any(t.device.type == "meta" for t in _tensors(out)):
            return  # nothing computed (a meta tensor has shapes, no values)
        name = dsp.op_name(func)
        node = torch._C._current_autograd_node()  # not None: autograd's engine runs this op in a backward pass
        if self._remote is not None:
            self._remote.current = name
        if node is not None:
            self._phase = "backward"
            self._names_out = self._backward_names(node, func, args, list(out) if isinstance(out, (tuple, list))
                                                   else [out])  # fmt: skip
            self._here = self._names_out[0]
        elif name in dsp.MEMO and torch.is_grad_enabled():
            self._memo(func, args, kwargs, out)
        if kind == "random" and not self._stack and node is None and func.overloadpacket.__name__.endswith("_"):
            return  # an in-place draw outside any forward: parameters being initialised, a constant
        if kind in ("random", "fused", "unchecked"):
            self._count(name, False, dsp.reason(kind, func))
            self._show(name)
            return
        with _disable_current_modes(), torch.no_grad():  # the analysis runs no op through any mode
            if kind == "defined":
                self._defined(func, args, kwargs, out, before)
            elif kind == "backward":
                self._backward(func, args, kwargs, out, node)
            else:
                self._reference(func, args, kwargs, out, before)
        self._show(name)

    def _new_call(self, func, op, out, shapes):
        t = _tensors(out)[0]
        return AuditCall(len(self.calls), self._where(), op, str(t.device), str(t.dtype).removeprefix("torch."),
                         shapes, None, aten=str(func), phase=self._phase)  # fmt: skip

    def _backward(self, func, args, kwargs, out, node):
        """A backward kernel (convolution_backward, native_layer_norm_backward...): each gradient it returns
        judged by :func:`refkern.compare_backward` against the exact gradient of the tensors it received."""
        name = dsp.op_name(func)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        memo = node.metadata.get("refkern") if node is not None else None
        b = dsp.bind(func, _cpu(args), _cpu(kwargs))
        spec = dsp.backward_call(func, b, memo, lambda i: i < len(outs) and isinstance(outs[i], torch.Tensor))
        group = len(self.calls)
        if spec.unsupported:
            call = self._new_call(func, name, out, [tuple(t.shape) for t in _tensors(args)])
            call.note, call.group = spec.unsupported, group
            self.calls.append(call)
            self._count(name, False, spec.unsupported)
            return
        if not spec.grads:
            return  # no gradient asked for: nothing computed
        shapes = [tuple(t.shape) for t in spec.tensors()]
        why = None
        try:  # every gradient of the kernel in one call (attention: one exact backward pass for dq, dk, dv)
            if self._remote is not None:
                reports = self._remote.compare_backward({arg: _cpu(outs[i]) for i, arg in spec.grads}, spec.op,
                                                        spec.grad_output, spec.args, spec.kwargs)  # fmt: skip
            else:
                reports = compare_backward({arg: _cpu(outs[i]) for i, arg in spec.grads}, spec.op, spec.grad_output,
                                           *spec.args, **spec.kwargs)  # fmt: skip
        except Exception:  # judged one by one below, so that one gradient's failure is its own
            reports = {}
        for i, arg in spec.grads:
            got = outs[i]
            where = self._names_out[i] if i < len(self._names_out) else self._where()
            call = AuditCall(len(self.calls), where, f"{spec.op} backward", str(got.device),
                             str(got.dtype).removeprefix("torch."), shapes, None, aten=str(func), phase="backward",
                             group=group)  # fmt: skip
            try:
                call.report = reports[arg] if arg in reports else compare_backward(
                    {arg: _cpu(got)}, spec.op, spec.grad_output, *spec.args, **spec.kwargs)[arg]  # fmt: skip
            except Exception as exc:  # analysis must never break the model
                call.note = f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                why = why or call.note
            if i == spec.grads[0][0]:  # what the kernel computed and nothing judges: beside its first gradient
                call.parts.update(spec.skipped)
            self.calls.append(call)
        if memo is not None and memo.get("input") is not None:  # the softmax's input: released once used
            memo["input"], memo["released"] = None, True
        self._count(name, why is None, why)

    def _defined(self, func, args, kwargs, out, before):
        name = dsp.op_name(func)
        cargs, ckw = _cpu(args), _cpu(kwargs)
        if before:  # the op wrote into these: recompute from what it read
            b = dsp.bind(func, args, kwargs)
            for k, v in before.items():
                pos = [a.name for a in func._schema.arguments].index(k)
                if pos < len(cargs):
                    cargs = (*cargs[:pos], v, *cargs[pos + 1 :])
                else:
                    ckw[k] = v
            del b
        if "device" in ckw:
            ckw["device"] = torch.device("cpu")
        expect = func(*cargs, **ckw)
        got, want = _tensors(out), _tensors(expect)
        shapes = [tuple(t.shape) for t in _tensors(args)]
        call = self._new_call(func, name, out, shapes)
        n = nd = 0
        ulp, first = 0.0, None
        for g, w in zip(got, want):
            gn, gd, gu, gf = _same_bits(_cpu(g), w)
            if gd and first is None:
                first = gf
            n, nd, ulp = n + gn, nd + gd, max(ulp, gu)
        call.report = BitReport(n, nd, ulp, first)
        src = next((t for t in _tensors(args)), None)
        if name == "_to_copy" and src is not None and src.is_floating_point() and got[0].is_floating_point():
            key = (call.name, str(src.dtype).removeprefix("torch."), call.dtype)
            self.lowered[key] = self.lowered.get(key, 0) + 1
        self.calls.append(call)
        self._count(name, True)

    def _reference(self, func, args, kwargs, out, before):
        name = dsp.op_name(func)
        cargs, ckw = _cpu(args), _cpu(kwargs)
        b = dsp.bind(func, cargs, ckw)
        if before:
            b.update(before)
        parts = dsp.references(func, b, out)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        main = parts[0]
        spec = main.call
        shapes = [tuple(t.shape) for t in spec.tensors()] if spec is not None and not spec.unsupported else []
        op = spec.op if spec is not None and spec.op else name
        call = self._new_call(func, op, out, shapes)
        if spec is None or spec.unsupported:
            call.note = spec.unsupported if spec is not None else main.why
            self.calls.append(call)
            self._count(name, False, f"a form refkern does not reproduce ({call.note})")
            return
        try:
            call.report, call.sampled = self._judge(spec, _cpu(outs[main.index]))
        except Exception as exc:  # analysis must never break the model
            call.note = f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            self.calls.append(call)
            self._count(name, False, call.note)
            return
        for p in parts[1:]:
            if p.call is None:
                call.parts[p.label] = p.why
                continue
            actual = outs[p.index] if p.index is not None and p.index < len(outs) else None
            if not isinstance(actual, torch.Tensor) or actual.numel() == 0:
                continue
            try:
                ref_shape = None
                rep, _ = self._judge(p.call, _cpu(actual), reshape=ref_shape)
                call.parts[p.label] = rep
            except Exception as exc:
                call.parts[p.label] = f"not analysed ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
        self.calls.append(call)
        self._count(name, True)

    def _judge(self, spec, actual, reshape=None):
        args, kwargs = spec.args, spec.kwargs
        sampled = 0
        if self.sample is not None and actual.numel() > self.sample:
            got = restrict(spec.op, actual, args, kwargs, self.sample)
            if got is not None:
                actual, args, kwargs = got
                sampled = actual.numel()
        if spec.op in ("mean",) and actual.dim() != _mean_dims(args[0], kwargs):
            actual = actual.reshape(_mean_shape(args[0], kwargs))
        if self._remote is not None:  # the sub-grid is cut here, before shipping
            return self._remote.compare(actual, spec.op, args, kwargs), sampled
        return compare(actual, spec.op, *args, **kwargs), sampled

    # progress on stderr
    def _show(self, op):
        if self._live is None:
            return
        now = time.monotonic()
        if now - self._shown < 0.1:
            return
        self._shown = now
        checked = sum(c[0] for c in self.counts.values())
        total = checked + sum(c[1] for c in self.counts.values())
        from rich.text import Text

        self._live.update(Text(f"audit: {total} ops, {checked} checked; {self._where()} ({op})", overflow="ellipsis"))

    def __enter__(self):
        reg = torch.nn.modules.module
        self._hooks = [reg.register_module_forward_pre_hook(self._pre),
                       reg.register_module_forward_hook(self._post, always_call=True)]  # fmt: skip
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        if show:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            self._live = Live(Text("audit: starting"), console=Console(file=sys.stderr), transient=True,
                              auto_refresh=True, refresh_per_second=8)  # fmt: skip
            self._live.__enter__()
        from refkern.torch import compiled

        self._patch = compiled.intercept(self)
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        if self._remote is not None:  # every verdict in from the cluster
            from refkern.scale.remote import resolve_audit

            resolve_audit(self)
        if self._patch is not None:
            self._patch()
            self._patch = None
        for h in self._hooks:
            h.remove()
        self._stack.clear()
        self._istack.clear()
        self._pending.clear()
        self._here = None
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None
        return False

    # while a compiled module runs for real (dynamo does not compile under a dispatch mode), and
    # while its layers are compiled and run on their own, the audit steps aside
    def _suspended(self):
        return _Suspend(self)

    def _allowed(self, c):
        r = c.report
        v = c.verdict
        return v in self.allow or (v == "reduced-precision" and r.precision in self.allow)

    @property
    def first_failure(self):
        """The first judged op whose verdict is not in ``allow`` (default: exact, rounding; a
        precision such as "tf32" admits that reduced precision), or None."""
        for c in self.calls:
            if c.report is not None and not self._allowed(c):
                return c
        return None

    @property
    def not_analysed(self):
        """Ops that map to a refkern op but could not be analysed (an unsupported form, an error)."""
        return [c for c in self.calls if c.report is None]

    @property
    def n_ops(self) -> int:
        """Every op that computed something (views, copies and constants are not counted)."""
        return sum(a + b for a, b in self.counts.values())

    @property
    def n_checked(self) -> int:
        return sum(a for a, _ in self.counts.values())

    def _verdicts(self) -> dict:
        """verdict -> number of ops judged so (a backward kernel's gradients count once: its worst verdict;
        an op with a gradient that could not be analysed is not checked, and not counted here)."""
        worst = {}
        for c in self.calls:
            k = c.group if c.group >= 0 else c.index
            if c.report is None:
                worst[k] = False
            elif k not in worst or (worst[k] is not False and _SEVERITY[c.verdict] < _SEVERITY[worst[k]]):
                worst[k] = c.verdict if worst.get(k) is not False else False
        verdicts = {}
        for v in worst.values():
            if v is not False:
                verdicts[v] = verdicts.get(v, 0) + 1
        return verdicts

    def summary(self) -> str:
        """'37 of 52 ops checked (30 rounding, 7 exact); first call beyond ...' or '...; every checked op
        is exact or rounding'; with a backward pass audited, '52 of 70 ops checked, 20 of 31 in the backward
        pass (...)'. A compiled module called inside adds its own clause (:meth:`CompiledAudit.summary`): the
        ops counted first are the eager ones, and compiled code outside its leaf modules is judged only end
        to end."""
        verdicts = self._verdicts()
        order = sorted(verdicts, key=lambda v: (-verdicts[v], v))
        how = ", ".join(f"{verdicts[v]} {v}" for v in order)
        bw = self.phases.get("backward")
        back = f", {bw[0]} of {sum(bw)} in the backward pass" if bw else ""
        head = f"{self.n_checked} of {self.n_ops} ops checked{back}" + (f" ({how})" if how else "")
        f = self.first_failure
        if f is not None:
            prec = f" ({f.report.precision})" if f.report.precision and f.verdict == f.report.verdict else ""
            out = f"{head}; first call beyond {'/'.join(self.allow)}: #{f.index} {f.name} ({f.op}): {f.verdict}{prec}"
        elif self.n_checked == 0:
            out = f"{head}; nothing was judged"
        elif self.n_checked == self.n_ops:
            out = f"{head}; every op is {' or '.join(self.allow)}"
        else:
            out = f"{head}; every checked op is {' or '.join(self.allow)}"
        # the ops above ran eagerly; what the compiled code did is judged per leaf and end to end, said apart
        return "; ".join([out, *(c.summary() for c in self.compiled)])

    def report(self, order: str = "call") -> str:
        """The summary, what was not checked and why, then a table with a row per judged op, in call
        order (``order="worst"``: worst first, as the header then says)."""
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
        out = [f"audit: {self.summary()}"]
        if self.unchecked:
            out.append(f"not checked: {self.unchecked_summary()}")
            why = {}
            for k, _ in sorted(self.unchecked.items(), key=lambda kv: (-kv[1], kv[0])):
                why.setdefault(self.reasons.get(k, "no reference"), []).append(k)
            out += [f"  {', '.join(names)}: {r}" for r, names in why.items()]
        if self.lowered:
            low = [f"{m} {a} -> {b} x{n}" for (m, a, b), n in self.lowered.items()]
            out.append(f"precision lowered: {', '.join(low)}")
        for comp in self.compiled:
            out += comp.lines()
        listed = "calls in call order" if order == "call" else "calls worst first (mismatch, then by bound ratio)"
        return "\n".join([*out, f"{listed}:", *lines, f"({COLUMNS_NOTE})"])

    def unchecked_summary(self) -> str:
        """'gelu x4, bernoulli x2': the ops not checked, most frequent first ('' when there are none)."""
        items = sorted(self.unchecked.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} x{v}" for k, v in items)

    def to_dict(self) -> dict:
        f = self.first_failure
        calls = [{"index": c.index, "name": c.name, "op": c.op, "aten": c.aten, "device": c.device, "dtype": c.dtype,
                  "shapes": [list(s) for s in c.shapes], "note": c.note, "sampled": c.sampled,
                  "verdict": c.verdict, "report": c.report.to_dict() if c.report else None, "phase": c.phase,
                  "group": c.group if c.group >= 0 else c.index,
                  "parts": {k: (v if isinstance(v, str) else v.to_dict()) for k, v in c.parts.items()}}
                 for c in self.calls]  # fmt: skip
        return {"ops": self.n_ops, "checked": self.n_checked, "summary": self.summary(),
                "counts": {k: {"checked": v[0], "not_checked": v[1]} for k, v in self.counts.items()},
                "not_checked": {k: {"count": v, "reason": self.reasons.get(k, "")} for k, v in self.unchecked.items()},
                "calls": calls, "first_failure": f.index if f else None,
                "phases": {k: {"checked": v[0], "not_checked": v[1]} for k, v in self.phases.items()},
                "compiled": [c.to_dict() for c in self.compiled]}  # fmt: skip

    def __str__(self):
        return self.report()


def _mean_dims(x, kw):
    dim = kw.get("dim")
    if dim is None:
        return 0 if not kw.get("keepdim") else x.dim()
    n = len(dim) if isinstance(dim, (tuple, list)) else 1
    return x.dim() if kw.get("keepdim") else x.dim() - n


def _mean_shape(x, kw):
    dim = kw.get("dim")
    dims = range(x.dim()) if dim is None else (dim if isinstance(dim, (tuple, list)) else (dim,))
    dims = {d % x.dim() for d in dims}
    if kw.get("keepdim"):
        return tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    return tuple(s for i, s in enumerate(x.shape) if i not in dims)


class _Suspend:
    """The audit's mode and hooks off for a while (a compiled module running for real)."""

    def __init__(self, owner):
        self.owner = owner

    def __enter__(self):
        from torch.utils._python_dispatch import _pop_mode_temporarily

        o = self.owner
        self._stack, self._istack = list(o._stack), list(o._istack)
        for h in o._hooks:
            h.remove()
        self._pop = _pop_mode_temporarily() if _top_is(o._mode) else None
        if self._pop is not None:
            self._pop.__enter__()
        return self

    def __exit__(self, *exc):
        o = self.owner
        if self._pop is not None:
            self._pop.__exit__(*exc)
        reg = torch.nn.modules.module
        o._hooks = [reg.register_module_forward_pre_hook(o._pre),
                    reg.register_module_forward_hook(o._post, always_call=True)]  # fmt: skip
        o._stack[:] = self._stack
        o._istack[:] = self._istack
        return False


def audit(allow=("exact", "rounding"), *, sample=None, progress=None, client=None, budget=None) -> Audit:
    """``with refkern.torch.audit() as a: model(x)`` then ``print(a.report())`` (see :class:`Audit`).

    ``client``: a ``dask.distributed.Client``; each op's reference and verdict are then computed on
    its workers (the model runs here), with at most ``budget`` bytes of operands in flight
    (default 1 GiB); the verdicts are a local audit's (:mod:`refkern.scale.remote`)."""
    return Audit(allow, sample=sample, progress=progress, client=client, budget=budget)
