"""``refkern.torch.check``: one op on every backend, each result against the exact reference; with
``backward=True`` also each gradient against the exact gradient (:mod:`refkern.gradients`)."""

import copy
import html
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import refkern.ops as _ops
from refkern.analysis.compare import elements
from refkern.analysis.evaluate import evaluate
from refkern.analysis.explain import explain_arrays
from refkern.analysis.report import COLUMNS_NOTE
from refkern.torch.devices import Backend, resolve
from refkern.torch.ops import FUNCTIONS, OpCall, check_keywords, from_call, from_module

__all__ = ["check", "CheckResult", "CheckRow", "GradRow"]

OPS = tuple(_ops.REGISTRY)


@dataclass
class CheckRow:
    backend: str  # "cpu", "cuda:0", "cpu+compile", ...
    report: object  # the Report, or None when the backend could not run the op
    note: str  # why not, or the settings that matter
    error: str = ""  # the backend's whole error message when it failed to run the op (note has its start)

    def cells(self):
        r = self.report
        if r is None:
            return [self.backend, "-", "", "", "", "", self.note]
        prec = r.precision or ""
        ratios = [f"{r.max_prob_ratio:.3g}", f"{r.max_bound_ratio:.3g}", f"{r.max_ulp:.3g}"]
        return [self.backend, r.verdict, prec, *ratios, self.note]


@dataclass
class GradRow:
    """One gradient on one backend: ``argument`` is the op's argument name (``x``, ``weight``,
    ``bias``, ``a``, ``b``, ``input``), or, for a tensor with no backward reference, the caller's
    name for it (``args[1]``, a keyword, a module parameter's name); ``report`` is the Report of
    :func:`refkern.compare_backward`, or None with ``note`` saying why there is none."""

    backend: str
    argument: str
    report: object
    note: str

    def cells(self):
        r = self.report
        if r is None:
            return [self.backend, self.argument, "-", "", "", "", "", self.note]
        ratios = [f"{r.max_prob_ratio:.3g}", f"{r.max_bound_ratio:.3g}", f"{r.max_ulp:.3g}"]
        return [self.backend, self.argument, r.verdict, r.precision or "", *ratios, self.note]


@dataclass
class CheckResult:
    """``rows``: one CheckRow per backend; ``pairs``: each backend that ran the op against the
    first one, as (name, first name, Explanation): why their outputs differ, in one sentence.
    With ``backward=True``: ``grads``, one GradRow per backend and gradient (rows without a
    report say why: a backend that failed, a gradient refkern has no reference for);
    ``grad_output``: how the gradient fed to every backend was made."""

    op: str
    shapes: list
    dtype: str
    rows: list
    pairs: list = field(default_factory=list)
    grads: list = field(default_factory=list)
    grad_output: str = ""

    HEAD = ["backend", "verdict", "precision", "error/noise", "bound ratio", "max ulp", "note"]
    GRAD_HEAD = ["backend", "gradient", "verdict", "precision", "error/noise", "bound ratio", "max ulp", "note"]

    def __str__(self) -> str:
        table = [self.HEAD] + [row.cells() for row in self.rows]
        widths = [max(len(str(r[i])) for r in table) for i in range(len(self.HEAD) - 1)]
        lines = [f"{self.op} {' x '.join(str(tuple(s)) for s in self.shapes)} ({self.dtype})"]
        for r in table:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
        if any(row.report is not None for row in self.rows):
            lines.append(f"  ({COLUMNS_NOTE})")
        for name, first, e in self.pairs:
            lines.append(f"  {name} against {first}: {e.sentence}")
        if self.grad_output:
            lines.append(f"backward ({self.grad_output})")
            table = [self.GRAD_HEAD] + [row.cells() for row in self.grads]
            widths = [max(len(str(r[i])) for r in table) for i in range(len(self.GRAD_HEAD) - 1)]
            for r in table:
                lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + str(r[-1]))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"op": self.op, "shapes": [list(s) for s in self.shapes], "dtype": self.dtype,
                "rows": [{"backend": r.backend, "note": r.note, "error": r.error,
                          "report": r.report.to_dict() if r.report else None} for r in self.rows],
                "pairs": [{"backend": name, "against": first, "within": e.within, "differ": e.differ,
                           "max_pair_ratio": e.max_pair_ratio, "sentence": e.sentence}
                          for name, first, e in self.pairs],
                "grad_output": self.grad_output,
                "grads": [{"backend": r.backend, "argument": r.argument, "note": r.note,
                           "report": r.report.to_dict() if r.report else None} for r in self.grads]}  # fmt: skip

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self.HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r.cells()) + "</tr>" for r in self.rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"


def _spec(fn, args, kwargs, op):
    """(OpCall of the reference, a callable fn(*args) to run) for a function, a module or op=."""
    if isinstance(fn, torch.nn.Module):
        if len(args) != 1 or kwargs:
            raise TypeError(
                f"check: a module takes one input tensor; got {len(args)} positional "
                f"and {sorted(kwargs)} keyword arguments."
            )
        spec = from_module(fn, args[0])
        if spec is None:
            raise ValueError(
                f"check: cannot tell what {type(fn).__name__} computes, nor its operands; pass a function and the "
                "op's own arguments, e.g. check(lambda x, w: module(x), x, module.weight, op='linear')."
            )
        return spec
    if op is not None:
        _ops.get(op, "check")  # an unknown name: one error listing the valid ones
        check_keywords(op, kwargs, "check")
        return OpCall(getattr(fn, "__name__", "fn"), op, args, kwargs)
    if fn in (F.conv1d, F.conv2d, F.conv3d) and "padding_mode" in kwargs:
        nd = (F.conv1d, F.conv2d, F.conv3d).index(fn) + 1
        raise TypeError(
            f"check: F.conv{nd}d takes no padding_mode (nn.Conv{nd}d does); got padding_mode="
            f"{kwargs['padding_mode']!r}. Check an nn.Conv{nd}d module, or pass "
            f"refkern.torch.torch_function('conv{nd}d') with op='conv{nd}d'."
        )
    spec = from_call(fn, args, kwargs)
    if spec is not None and spec.op is not None and (spec.op == "linear" or spec.op.startswith("conv")):
        check_keywords(spec.op, [k for k in kwargs if k not in ("input", "weight", "bias")], "check")
    elif spec is not None and spec.op is not None and not spec.unsupported:
        check_keywords(spec.op, spec.kwargs, "check")
    if spec is None:
        known = sorted({f"{getattr(f, '__module__', '') or 'torch.Tensor'}.{f.__name__}" for f in FUNCTIONS})
        raise ValueError(f"check: cannot tell what {getattr(fn, '__name__', fn)!r} computes; pass op= "
                         f"(one of {', '.join(OPS)}) or one of {', '.join(known[:6])}, ...")  # fmt: skip
    if spec.unsupported:
        raise ValueError(f"check: {spec.unsupported}.")
    return spec


def _to(a, device):
    """A copy on ``device``, never the caller's tensor itself: an op that writes into an argument
    (batch_norm's running statistics in training) leaves the caller's untouched."""
    return a.to(device, copy=True) if isinstance(a, torch.Tensor) else a


def _run(fn, args, kwargs, backend: Backend, compiled: bool):
    if isinstance(fn, torch.nn.Module):
        target = copy.deepcopy(fn).to(backend.device)
    else:
        target = fn
    if compiled:
        target = torch.compile(target)
    with torch.no_grad():
        return target(*[_to(a, backend.device) for a in args], **{k: _to(v, backend.device) for k, v in kwargs.items()})


def _floating(a) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


class _GradOutputError(ValueError):
    """The caller's grad_output does not fit the output: raised by check, never a backend's failure."""


@dataclass
class _Target:
    """A floating-point tensor the caller gave: ``where`` finds it in a run (("arg", i), ("kw", k) or
    ("param", name)); ``name``: the op's argument it is, or None with ``why`` saying why it has no
    backward reference."""

    label: str
    where: tuple
    name: str | None
    why: str = ""


def _targets(fn, args, kwargs, spec) -> list:
    """Every floating-point tensor of the call (and parameter of the module), matched by identity
    to the op's differentiable arguments."""
    from refkern.gradients import OPS as GRAD_OPS
    from refkern.gradients import differentiable

    found = []
    if isinstance(fn, torch.nn.Module):
        found.append(("input", ("arg", 0), args[0]))
        found += [(k, ("param", k), p) for k, p in fn.named_parameters() if p.is_floating_point()]
    else:
        found += [(f"args[{i}]", ("arg", i), a) for i, a in enumerate(args) if _floating(a)]
        found += [(k, ("kw", k), a) for k, a in kwargs.items() if _floating(a)]
    seen = set()
    found = [f for f in found if not (id(f[2]) in seen or seen.add(id(f[2])))]  # one row per tensor, first place
    own = {id(t): n for t, n in spec.gradient_names()}  # addmm, baddbmm: each tensor's gradient its own call
    if own:
        return [_Target(own[id(a)], where, own[id(a)]) if id(a) in own else
                _Target(label, where, None, f"no backward reference: it is not a tensor of {spec.torch_name}")
                for label, where, a in found]  # fmt: skip
    if spec.op not in GRAD_OPS:
        why = f"no backward reference for {spec.op} (refkern has them for {', '.join(GRAD_OPS)})"
        return [_Target(label, where, None, why) for label, where, _ in found]
    names = differentiable(spec.op, spec.args, spec.kwargs, "check")
    out = []
    for label, where, a in found:
        mine = [k for k, v in names.items() if v is a]
        if len(mine) == 1:
            out.append(_Target(mine[0], where, mine[0]))
        elif mine:
            out.append(_Target(label, where, None, f"no backward reference: it is {' and '.join(mine)} of {spec.op} "
                               "at once (its gradient is the sum of theirs)"))  # fmt: skip
        elif named := [k for k, v in zip(_ops.get(spec.op).operands, spec.args) if v is a]:
            out.append(_Target(label, where, None, f"no backward reference: refkern computes no gradient with "
                               f"respect to {spec.op}'s {named[0]}"))  # fmt: skip
        else:
            out.append(_Target(label, where, None, f"no backward reference: it reaches {spec.op} transformed, not as "
                               "one of its arguments"))  # fmt: skip
    return out


def _leaf(a, device, grad):
    t = _to(a, device)
    return t.detach().requires_grad_(True) if grad and _floating(t) else t


def _run_backward(fn, args, kwargs, backend: Backend, compiled: bool, targets, grad_output):
    """Forward with autograd on ``backend``, then ``backward(grad_output)`` (made by ``grad_output(out)``
    from the first output): (output, grad_output used, {label: gradient or None}, the backward's
    exception or None)."""
    dev = backend.device
    judged = {t.where for t in targets if t.name is not None}  # only these need a gradient (nll_loss's class
    # weights, for one, are not differentiable in torch: asking would fail the forward)
    leaf_args = [_leaf(a, dev, ("arg", i) in judged) for i, a in enumerate(args)]
    leaf_kw = {k: _leaf(v, dev, ("kw", k) in judged) for k, v in kwargs.items()}
    if isinstance(fn, torch.nn.Module):
        target = copy.deepcopy(fn).to(dev)
        for p in target.parameters():
            if p.is_floating_point():
                p.requires_grad_(True)
    else:
        target = fn
    params = dict(target.named_parameters()) if isinstance(target, torch.nn.Module) else {}
    if compiled:
        target = torch.compile(target)
    with torch.enable_grad():
        out = target(*leaf_args, **leaf_kw)
        if isinstance(out, tuple):  # max_pool's (values, indices): the values
            out = out[0]
        g = grad_output(out)
        try:
            out.backward(g.to(dev))
        except Exception as exc:  # the forward ran, the backward did not: the forward is still judged
            return out.detach(), g, {}, exc
    where = {"arg": lambda i: leaf_args[i], "kw": lambda k: leaf_kw[k], "param": lambda k: params[k]}
    grads = {t.label: where[t.where[0]](t.where[1]).grad for t in targets if t.name is not None}
    return out.detach(), g, grads, None


def _grad_output_maker(given):
    """grad_output for an output: the given tensor (checked), or standard normal values drawn from a
    torch.Generator seeded with 0 (in float64, rounded to the output's dtype), made once."""
    made = {}

    def make(out):
        if "g" in made:
            return made["g"]
        if given is None:
            gen = torch.Generator().manual_seed(0)
            g = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float64).to(out.dtype)
        else:
            if tuple(given.shape) != tuple(out.shape) or given.dtype != out.dtype:
                raise _GradOutputError(
                    f"check: grad_output must have the output's shape and dtype, {tuple(out.shape)} "
                    f"{str(out.dtype).removeprefix('torch.')}; got {tuple(given.shape)} "
                    f"{str(given.dtype).removeprefix('torch.')}."
                )
            g = given.detach().to("cpu", copy=True)
        made["g"] = g
        return g

    return make


def _judge_grads(name, spec, targets, grads, g, ref_args, ref_kwargs) -> list:
    """One GradRow per target: each gradient with a reference judged by compare_backward on its own
    (one gradient refkern cannot compute leaves the others judged)."""
    from refkern.analysis.compare import compare
    from refkern.gradients import compare_backward

    calls = {n: adj for _, n, adj in spec.gradient_calls(g)}  # addmm's, baddbmm's (refkern.torch.ops)
    rows = []
    for t in targets:
        if t.name is None:
            continue
        got = grads.get(t.label)
        if got is None:
            rows.append(GradRow(name, t.label, None, "no gradient: the output does not depend on it"))
            continue
        if t.name in calls:  # the forward call whose exact result the gradient is
            adj = calls[t.name]
            rows.append(GradRow(name, t.label, compare(adj.from_grad(got), adj.op, *adj.args, **adj.kwargs), ""))
            continue
        try:
            rep = compare_backward({t.name: got}, spec.op, g, *ref_args, **ref_kwargs)[t.name]
        except NotImplementedError as exc:
            rows.append(GradRow(name, t.label, None, f"no backward reference: {str(exc).split(': ', 1)[-1]}"))
            continue
        rows.append(GradRow(name, t.label, rep, ""))
    return rows


def check(
    fn,
    *args,
    devices=None,
    compile: bool = False,  # noqa: A002
    op: str | None = None,
    backward: bool = False,
    grad_output=None,
    **kwargs,
) -> CheckResult:
    """Run ``fn(*args, **kwargs)`` on each backend and compare every result with the exact reference.

    ``fn``: ``F.conv1d``/``conv2d``/``conv3d``, ``F.conv_transpose1d``/``2d``/``3d``, ``F.linear``,
    ``torch.matmul`` (and ``mm``/``bmm``/``addmm``), an ``nn.Conv1d``/``2d``/``3d``,
    ``nn.ConvTranspose1d``/``2d``/``3d`` or ``nn.Linear`` module (then ``args`` is its input), or any
    callable with ``op=`` naming what it computes (it must take that op's arguments).
    ``devices``: names such as "cpu", "cuda", "cuda:1", "mps", "xpu", "dml" (all available by
    default). ``compile=True`` adds each backend's ``torch.compile``d form ("cpu+compile").
    The reference is computed once from the CPU copies of the very inputs, which move to
    each device without loss. A backend that cannot take a dtype, or fails, gets a row
    that says why instead of failing the check (``error`` holds the whole message); a device
    name this machine lacks gets a "not available on this machine" row. Arguments the op does
    not take raise a TypeError that names the nearest valid one. Each backend that ran is also
    judged against the first (``pairs``, via :func:`refkern.explain`): one sentence says why
    their outputs differ.

    ``backward=True``: the forward pass runs with autograd, then ``out.backward(grad_output)`` on
    each backend (``grad_output``: the given tensor, of the output's shape and dtype, or standard
    normal values from a ``torch.Generator`` seeded with 0, rounded to the output's dtype: the same
    on every backend). Every floating-point tensor argument (and every parameter of a module) gets
    a row in ``grads`` per backend, its gradient judged by :func:`refkern.compare_backward` against
    the exact gradient of the very inputs (verdicts as the forward's). A tensor without a backward
    reference (an op refkern has no gradient for, a tensor that reaches the op transformed, as
    addmm's ``mat2``, or a gradient refkern does not compute) gets one row saying so.
    """
    spec = _spec(fn, args, kwargs, op)
    ref_args, ref_kwargs = spec.on_cpu()
    if _ops.get(spec.op).error_model != "sum":  # bad shapes or arguments fail here, in refkern's words
        _ops.get(spec.op).reference(*ref_args, **ref_kwargs)
    else:
        evaluate(spec.op, ref_args, ref_kwargs)
    if grad_output is not None and not backward:
        raise TypeError("check: grad_output= is the gradient fed to the backward pass; pass backward=True with it.")
    if grad_output is not None and not isinstance(grad_output, torch.Tensor):
        raise TypeError(f"check: grad_output must be a tensor of the output's shape; got {type(grad_output).__name__}.")
    targets = _targets(fn, args, kwargs, spec) if backward else []
    run_grads = any(t.name is not None for t in targets)
    make_g = _grad_output_maker(grad_output)
    tensors = [t for t in spec.tensors()]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors}
    values = {str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()}  # not targets, indices
    rows, ran, grads = [], [], []
    for b in resolve(devices):
        if isinstance(b, str):
            rows.append(CheckRow(b, None, "not available on this machine"))
            continue
        missing = sorted(values - set(b.dtypes))
        for compiled in (False, True) if compile else (False,):
            name = b.name + ("+compile" if compiled else "")
            if missing:
                rows.append(CheckRow(name, None, f"{b.kind} does not support {', '.join(missing)}"))
                continue
            try:
                if run_grads:
                    out, g, got, failed = _run_backward(fn, args, kwargs, b, compiled, targets, make_g)
                else:
                    out = _run(fn, args, kwargs, b, compiled)
            except _GradOutputError:
                raise
            except Exception as exc:  # the backend could not run it: say why
                out = exc
            if isinstance(out, Exception):
                msg = str(out).strip()
                first = msg.splitlines()[0] if msg else ""
                rows.append(CheckRow(name, None, f"failed: {type(out).__name__}: {first[:160]}",
                                     f"{type(out).__name__}: {msg}"))  # fmt: skip
                grads += [GradRow(name, t.label, None, "failed: the forward pass did not run")
                          for t in targets if t.name]  # fmt: skip
                continue
            if isinstance(out, tuple):  # max_pool's (values, indices): the values are judged
                out = out[0]
            e = elements(out, spec.op, *ref_args, **ref_kwargs)
            rows.append(CheckRow(name, e["report"], b.note()))
            ran.append((name, {k: e.get(k) for k in ("actual", "bound", "report")}))
            if run_grads and failed is not None:
                msg = str(failed).strip().splitlines()
                note = f"failed: backward: {type(failed).__name__}: {(msg[0] if msg else '')[:160]}"
                grads += [GradRow(name, t.label, None, note) for t in targets if t.name]
            elif run_grads:
                grads += _judge_grads(name, spec, targets, got, g, ref_args, ref_kwargs)
    grads += [GradRow("-", t.label, None, t.why) for t in targets if t.name is None]
    pairs = [(name, ran[0][0], explain_arrays(ran[0][1], e, (ran[0][0], name))) for name, e in ran[1:]]
    shapes = [tuple(t.shape) for t in tensors]
    how = ""
    if backward:
        how = "grad_output: given" if grad_output is not None else "grad_output: standard normal, generator seed 0"
    return CheckResult(spec.op, shapes, ", ".join(sorted(dtypes)), rows, pairs, grads, how)
