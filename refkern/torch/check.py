"""``refkern.torch.check``: one op on every backend, each result against the exact reference."""

import copy
import html
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from refkern.analysis.compare import elements
from refkern.analysis.envelope import OPS as ENVELOPE_OPS
from refkern.analysis.evaluate import OPS as PRODUCT_OPS
from refkern.analysis.evaluate import evaluate
from refkern.analysis.explain import explain_arrays
from refkern.analysis.report import COLUMNS_NOTE
from refkern.torch.devices import Backend, resolve
from refkern.torch.ops import FUNCTIONS, OpCall, check_keywords, from_call, from_module

__all__ = ["check", "CheckResult", "CheckRow"]

OPS = PRODUCT_OPS + ENVELOPE_OPS


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
class CheckResult:
    """``rows``: one CheckRow per backend; ``pairs``: each backend that ran the op against the
    first one, as (name, first name, Explanation): why their outputs differ, in one sentence."""

    op: str
    shapes: list
    dtype: str
    rows: list
    pairs: list = field(default_factory=list)

    HEAD = ["backend", "verdict", "precision", "error/noise", "bound ratio", "max ulp", "note"]

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
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"op": self.op, "shapes": [list(s) for s in self.shapes], "dtype": self.dtype,
                "rows": [{"backend": r.backend, "note": r.note, "error": r.error,
                          "report": r.report.to_dict() if r.report else None} for r in self.rows],
                "pairs": [{"backend": name, "against": first, "within": e.within, "differ": e.differ,
                           "max_pair_ratio": e.max_pair_ratio, "sentence": e.sentence}
                          for name, first, e in self.pairs]}  # fmt: skip

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
        if op not in OPS:
            raise ValueError(f"check: unknown op={op!r}; choose one of {', '.join(repr(o) for o in OPS)}.")
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


def check(fn, *args, devices=None, compile: bool = False, op: str | None = None, **kwargs) -> CheckResult:  # noqa: A002
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
    """
    spec = _spec(fn, args, kwargs, op)
    ref_args, ref_kwargs = spec.on_cpu()
    if spec.op in ENVELOPE_OPS:  # bad shapes or arguments fail here, in refkern's words
        import refkern

        getattr(refkern, spec.op)(*ref_args, **ref_kwargs)
    else:
        evaluate(spec.op, ref_args, ref_kwargs)
    tensors = [t for t in spec.tensors()]
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors}
    rows, ran = [], []
    for b in resolve(devices):
        if isinstance(b, str):
            rows.append(CheckRow(b, None, "not available on this machine"))
            continue
        missing = sorted(dtypes - set(b.dtypes))
        for compiled in (False, True) if compile else (False,):
            name = b.name + ("+compile" if compiled else "")
            if missing:
                rows.append(CheckRow(name, None, f"{b.kind} does not support {', '.join(missing)}"))
                continue
            try:
                out = _run(fn, args, kwargs, b, compiled)
            except Exception as exc:  # the backend could not run it: say why
                msg = str(exc).strip()
                first = msg.splitlines()[0] if msg else ""
                rows.append(CheckRow(name, None, f"failed: {type(exc).__name__}: {first[:160]}",
                                     f"{type(exc).__name__}: {msg}"))  # fmt: skip
                continue
            if isinstance(out, tuple):  # max_pool's (values, indices): the values are judged
                out = out[0]
            e = elements(out, spec.op, *ref_args, **ref_kwargs)
            rows.append(CheckRow(name, e["report"], b.note()))
            ran.append((name, {k: e[k] for k in ("actual", "bound", "report")}))
    pairs = [(name, ran[0][0], explain_arrays(ran[0][1], e, (ran[0][0], name))) for name, e in ran[1:]]
    shapes = [tuple(t.shape) for t in tensors]
    return CheckResult(spec.op, shapes, ", ".join(sorted(dtypes)), rows, pairs)
