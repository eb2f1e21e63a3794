"""The audit's reading of the losses' aten ops (:mod:`refkern.torch.dispatch` says what each aten op is), from
the loss records (:mod:`refkern.ops._records_losses`): an aten op a record lists (``aten``) is that record's op on
the aten call's arguments: ``nll_loss_forward`` and ``nll_loss2d_forward`` (what ``F.nll_loss`` and
``F.cross_entropy`` reach the dispatcher as, after ``_log_softmax``) are refkern's nll_loss on the
log-probabilities they received, ``mse_loss`` is refkern's mse_loss on its operands. A loss is added by its
record alone."""

import refkern.ops as _ops
from refkern.torch.ops import OpCall

__all__ = ["loss_parts", "REDUCTIONS"]

#: aten's reduction enum (at::Reduction): 0 none, 1 mean, 2 sum
REDUCTIONS = ("none", "mean", "sum")

#: aten op -> the loss record that reproduces it
_RECORDS = {a: r for r in _ops.REGISTRY.values() if r.error_model == "loss" for a in r.aten}


def loss_parts(name, b, out, Part):  # noqa: N803 - the class refkern.torch.dispatch.Part, given (no import cycle)
    """The parts of the output of aten loss ``name`` (its arguments bound by their schema names, ``b``): the loss,
    refkern's op of the record that lists ``name`` on the call's operands (aten's ``self`` is the record's first,
    ``input``; an operand passed as None at the end is the op's default) and keywords (those of the record's
    signature the aten call has, ``reduction`` read from aten's enum); then the outputs no reference reproduces,
    with the record's reason (nll_loss's total_weight, the sum of the counted targets' weights its backward
    reads)."""
    rec = _RECORDS[name]
    red = b.get("reduction")
    if isinstance(red, bool) or not isinstance(red, int) or not 0 <= red < len(REDUCTIONS):
        return [Part("out", 0, OpCall(name, unsupported=f"{name} with reduction={red!r} (aten's 0, 1 or 2)"))]
    args = [b.get("self" if i == 0 else k) for i, k in enumerate(rec.operands)]
    while args and args[-1] is None:
        args.pop()
    kw = {k: b[k] for k in rec.torch_keywords() if k in b}
    kw["reduction"] = REDUCTIONS[red]
    return [Part("out", 0, OpCall(name, rec.name, tuple(args), kw)),
            *(Part(label, i, why=why) for i, (label, why) in enumerate(rec.aten_unjudged, 1))]  # fmt: skip
