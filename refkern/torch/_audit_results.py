"""What an audit found (:mod:`refkern.torch.audit`): one judged call (:class:`AuditCall`, whose report is a
:class:`~refkern.analysis.report.Report` or, for an op defined to the bit, a
:class:`~refkern.analysis.report.BitReport`), and the summary, table and dict of a whole audit
(:class:`AuditResults`, which :class:`~refkern.torch.audit.Audit` is); verdicts ranked and passed by
:mod:`refkern.analysis.report`'s one order and rule."""

from dataclasses import dataclass, field

from refkern.analysis.report import COLUMNS_NOTE, BitReport, passes
from refkern.analysis.report import SEVERITY as _SEVERITY

__all__ = ["AuditResults", "AuditCall", "BitReport"]


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
    pattern: str = ""  # "rms_norm", "rotary": a composed pattern judged whole (refkern.torch.patterns), not an op

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


class AuditResults:
    """The results of an audit, read from ``calls``, ``counts``, ``phases``, ``unchecked``, ``reasons``,
    ``lowered``, ``compiled`` and ``allow`` (set by :class:`~refkern.torch.audit.Audit`)."""

    def _allowed(self, c):
        return passes(c.verdict, c.report.precision, self.allow)

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
            if c.pattern:
                continue
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
        head = f"{self.n_checked} of {self.n_ops} ops checked{back}" + (f" ({how})" if how else "") + self._composed()
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

    def _composed(self) -> str:
        """'; 7 composed ops judged whole (5 rms_norm, 2 rotary: 7 rounding)', or '' (:mod:`refkern.torch.patterns`)."""
        rows = {}  # a pattern's backward has a row per gradient (one group): counted once, at its worst verdict
        for c in self.calls:
            k = c.group if c.group >= 0 else c.index
            if c.pattern and (k not in rows or _SEVERITY[c.verdict] < _SEVERITY[rows[k].verdict]):
                rows[k] = c
        if not rows:
            return ""
        kinds, verdicts = {}, {}
        for c in rows.values():
            kinds[c.pattern] = kinds.get(c.pattern, 0) + 1
            v = c.verdict or "not analysed"
            verdicts[v] = verdicts.get(v, 0) + 1
        k = ", ".join(f"{n} {p}" for p, n in kinds.items())
        v = ", ".join(f"{n} {x}" for x, n in sorted(verdicts.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"; {len(rows)} composed ops judged whole ({k}: {v})"

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
                  "pattern": c.pattern, "group": c.group if c.group >= 0 else c.index,
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
