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
import sys
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from refkern.analysis.compare import compare
from refkern.gradients import compare_backward
from refkern.torch import _audit_patterns, patterns
from refkern.torch import dispatch as dsp
from refkern.torch import dispatch_backward as dbw
from refkern.torch._audit_patterns import not_analysed
from refkern.torch._audit_results import AuditCall, AuditResults, BitReport
from refkern.torch._bits import _same_bits, _top_is, reciprocal_product
from refkern.torch._threads import torch_threads as _torch_threads
from refkern.torch.sample import restrict

__all__ = ["audit", "Audit", "AuditCall", "BitReport"]


_tensors = dsp._tensors  # every tensor in a nest of lists and tuples


def _plain(t):
    """``t`` as a plain torch.Tensor, on its device."""
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


def _cpu(a, copy=False):
    """``a`` with every tensor detached, on the CPU, as a plain torch.Tensor (lossless)."""
    if isinstance(a, torch.Tensor):
        return _plain(a.detach().to("cpu", copy=copy))
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


class Audit(AuditResults):
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
        self._matcher = patterns.Matcher()  # composed RMSNorm and rotary embeddings, judged whole
        self._open = False  # inside the with block: a pattern's backward hooks judge only then
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
            with _disable_current_modes(), torch.no_grad(), _torch_threads(output):  # an RMS statistic inside: whole
                self._patterns(self._matcher.done(module, output))
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
        for e in dbw.op_edges(node, func, args, outs):
            if e is None or e >= len(node.next_functions):
                names.append(label(module, node.name()))
                continue
            p = dbw.leaf(node.next_functions[e][0])
            if p is not None and id(p) in self._params:
                owner, attr = self._params[id(p)]
                names.append(label(owner, f"grad_{attr}"))
            else:
                names.append(label(module, f"grad_{dbw.edge_name(node, e)}"))
        return names

    def _memo(self, func, args, kwargs, out):
        """Keep, for the backward of this forward op, what it will not receive (a norm's eps, a softmax's input):
        attached to its autograd node as soon as the node exists (the next op), so that it lives as long as
        the graph does."""
        if not any(t.requires_grad for t in _tensors(args) if isinstance(t, torch.Tensor)):
            return
        memo = dbw.forward_memo(func, dsp.bind(func, args, kwargs))
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
        why = not_analysed(exc)
        self.calls.append(AuditCall(len(self.calls), self._where(), name, "-", "-", [], None, why, str(func),
                                    phase=self._phase))  # fmt: skip
        self._count(name, False, why)

    def _observe(self, func, args, kwargs, out, before):
        self._here, self._phase = None, "forward"
        kind = dsp.classify(func, args, kwargs, out)
        if any(t.device.type == "meta" for t in _tensors(out)):
            return  # nothing computed (a meta tensor has shapes, no values)
        node = torch._C._current_autograd_node()  # not None: autograd's engine runs this op in a backward pass
        found = [] if node is not None else self._matcher.see(func, args, kwargs, out, self._stack[-1] if self._stack
                                                               else None, kind)  # fmt: skip
        if kind == "move":
            return  # nothing computed
        name = dsp.op_name(func)
        if self._remote is not None:
            self._remote.current = name
        if node is not None:
            self._phase = "backward"
            self._names_out = self._backward_names(node, func, args, list(out) if isinstance(out, (tuple, list))
                                                   else [out])  # fmt: skip
            self._here = self._names_out[0]
        elif name in dbw.MEMO and torch.is_grad_enabled():
            self._memo(func, args, kwargs, out)
        if kind == "random" and not self._stack and node is None and func.overloadpacket.__name__.endswith("_"):
            return  # an in-place draw outside any forward: parameters being initialised, a constant
        if kind in ("random", "fused", "unchecked"):
            self._count(name, False, dsp.reason(kind, func))
            if found:  # an inline rms_norm whose output this op consumes (refkern.torch.patterns)
                with _disable_current_modes(), torch.no_grad(), _torch_threads(args, out):
                    self._patterns(found)
            self._show(name)
            return
        with _disable_current_modes(), torch.no_grad(), _torch_threads(args, out):  # the analysis runs no op
            # through any mode, and torch's ops in it on one thread where the op is small (_torch_threads)
            if kind == "defined":
                self._defined(func, args, kwargs, out, before)
            elif kind == "backward":
                self._backward(func, args, kwargs, out, node)
            else:
                self._reference(func, args, kwargs, out, before)
            self._patterns(found)
        self._show(name)

    def _patterns(self, found):
        """A row per composed pattern completed (:func:`refkern.torch._audit_patterns.forward_rows`)."""
        _audit_patterns.forward_rows(self, found, self._judge if self._remote is None else _here)

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
        spec = dbw.backward_call(func, b, memo, lambda i: i < len(outs) and isinstance(outs[i], torch.Tensor))
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
                call.note = not_analysed(exc)
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
        alt = reciprocal_product(name, args, kwargs or {}, out)  # CUDA's a * (1 / b) for a CPU scalar b
        if alt is not None and not _same_bits(_cpu(out), alt)[1]:
            expect = alt
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
            call.report, call.sampled = self._judge(spec, outs[main.index])
        except Exception as exc:  # analysis must never break the model
            call.note = not_analysed(exc)
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
                rep, _ = self._judge(p.call, actual, reshape=ref_shape)
                call.parts[p.label] = rep
            except Exception as exc:
                call.parts[p.label] = f"not analysed ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
        self.calls.append(call)
        self._count(name, True)

    def _judge(self, spec, actual, reshape=None):
        # the backend's tensor stays on its device: the verdict's accuracy classes are that device's (an
        # elementwise result of CUDA's libdevice is judged by CUDA's documented errors, not torch CPU's; seen
        # on an H100: silu and the rotary embedding within 1.04x of the CPU classes' bound, called mismatch)
        actual = _plain(actual.detach()) if self._remote is None else _cpu(actual)
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
        self._open = True
        return self

    def __exit__(self, *exc):
        self._open = False
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
        self._matcher = patterns.Matcher()  # what it followed, released
        self._here = None
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None
        return False

    # while a compiled module runs for real (dynamo does not compile under a dispatch mode), and
    # while its layers are compiled and run on their own, the audit steps aside
    def _suspended(self):
        return _Suspend(self)


def _here(spec, actual):
    """A pattern's verdict computed here, with a cluster too (it is not an op the cluster's jobs count)."""
    return compare(actual, spec.op, *spec.args, **spec.kwargs), 0


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
