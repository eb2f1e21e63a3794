"""The audit's reading of the losses' aten ops (:mod:`refkern.torch.dispatch` says what each aten op is):
``nll_loss_forward`` and ``nll_loss2d_forward`` (what ``F.nll_loss`` and ``F.cross_entropy`` reach the
dispatcher as, after ``_log_softmax``) are refkern's nll_loss on the log-probabilities they received;
``mse_loss`` is refkern's mse_loss on its operands."""

from refkern.torch.ops import OpCall

__all__ = ["loss_parts", "REDUCTIONS"]

#: aten's reduction enum (at::Reduction): 0 none, 1 mean, 2 sum
REDUCTIONS = ("none", "mean", "sum")


def loss_parts(name, b, out, Part):  # noqa: N803 - the class refkern.torch.dispatch.Part, given (no import cycle)
    """The parts of an nll_loss_forward / nll_loss2d_forward output: the loss, and total_weight (the sum of
    the counted targets' weights, which its backward reads), not judged."""
    red = b["reduction"]
    if isinstance(red, bool) or not isinstance(red, int) or not 0 <= red < len(REDUCTIONS):
        return [Part("out", 0, OpCall(name, unsupported=f"{name} with reduction={red!r} (aten's 0, 1 or 2)"))]
    if name in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        kw = {"weight": b.get("weight"), "reduction": REDUCTIONS[red]}
        if name == "binary_cross_entropy_with_logits":
            kw["pos_weight"] = b.get("pos_weight")
        return [Part("out", 0, OpCall(name, name, (b["self"], b["target"]), kw))]
    if name == "mse_loss":
        return [Part("out", 0, OpCall(name, "mse_loss", (b["self"], b["target"]), {"reduction": REDUCTIONS[red]}))]
    kw = {"reduction": REDUCTIONS[red], "ignore_index": int(b["ignore_index"])}
    return [Part("out", 0, OpCall(name, "nll_loss", (b["self"], b["target"], b["weight"]), kw)),
            Part("total_weight", 1, why="the sum of the counted targets' weights (for the backward): not judged")]
