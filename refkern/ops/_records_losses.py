"""The records of the losses (issue 26): nll_loss and cross_entropy, judged by the envelope of torch's
composition (error model "loss": :mod:`refkern.analysis.losses`).

Each op is this record and its kernel (:mod:`refkern.kernels.loss`) and truth (:mod:`refkern.truth.losses`).
cross_entropy never reaches torch's dispatcher whole (it is ``log_softmax`` then ``nll_loss_forward``, or
``nll_loss2d_forward`` for images, plus the smoothing's products and sums): the audit judges those parts;
``compare`` and ``check`` judge the whole. mse_loss is aten's ``mse_loss``; l1_loss reaches the dispatcher as
``sub``, ``abs`` and ``mean`` (each judged there)."""

from dataclasses import replace

from refkern.ops._record import Backward, Call, Op
from refkern.ops._records import _RULE, _TRUTH, _backward

_TARGETS = "refkern.analysis.loss_targets:"  # the judges that route a target's gradient (and the input's on)


def _with_target(rule, truth, judge, audit):
    """The :class:`~refkern.ops.Backward` of a loss differentiable in its target too: the target's gradient judged
    by :mod:`refkern.analysis.loss_targets`, which hands the input's to ``judge``'s usual envelope."""
    return replace(_backward(rule, truth, judge, audit), judge=_TARGETS + judge)


_F = "torch.nn.functional."
_PARAMS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")
_POINTWISE = ("input", "target", "size_average", "reduce", "reduction")

RECORDS = (
    Op("nll_loss", "loss", "refkern.kernels.loss:nll_loss", "refkern.truth.losses:nll_loss",
       ("input", "target", "weight"), "loss", required=2, positional=True, differentiable=("input",),
       torch_function=f"{_F}nll_loss", calls=(Call(f"{_F}nll_loss", _PARAMS),),
       aten=("nll_loss_forward", "nll_loss2d_forward"), aten_backward=("nll_loss_backward", "nll_loss2d_backward"),
       aten_unjudged=(("total_weight", "the sum of the counted targets' weights (for the backward): not judged"),),
       autograd=(("NllLossBackward0", ("input",)), ("NllLoss2DBackward0", ("input",))),
       opinfo=("nn.functional.nll_loss",), backward=_backward("loss_grad:_nll_loss", "nll_loss", "nll_loss_report",
                                                             "nll_loss")),
    Op("cross_entropy", "loss", "refkern.kernels.loss:cross_entropy", "refkern.truth.losses:cross_entropy",
       ("input", "target", "weight"), "loss", required=2, positional=True, differentiable=("input", "target"),
       torch_function=f"{_F}cross_entropy", calls=(Call(f"{_F}cross_entropy", (*_PARAMS, "label_smoothing")),),
       opinfo=("nn.functional.cross_entropy",),
       backward=Backward(_RULE + "loss_ce_grad:_cross_entropy", _TRUTH + "cross_entropy",
                         "refkern.analysis.loss_ce_grad:ce_report")),
    Op("mse_loss", "loss", "refkern.kernels.loss_pointwise:mse_loss", "refkern.truth.losses:mse_loss",
       ("input", "target"), "loss", required=2, positional=True, differentiable=("input", "target"),
       torch_function=f"{_F}mse_loss", calls=(Call(f"{_F}mse_loss", _POINTWISE),), aten=("mse_loss",),
       aten_backward=("mse_loss_backward",), autograd=(("MseLossBackward0", ("input", "target")),),
       opinfo=("nn.functional.mse_loss",), backward=_with_target("loss_grad:_mse_loss", "mse_loss", "mse_loss_report",
                                                                 "mse_loss")),
    Op("l1_loss", "loss", "refkern.kernels.loss_pointwise:l1_loss", "refkern.truth.losses:l1_loss",
       ("input", "target"), "loss", required=2, positional=True, torch_function=f"{_F}l1_loss",
       calls=(Call(f"{_F}l1_loss", _POINTWISE),), opinfo=("nn.functional.l1_loss",)),
    Op("binary_cross_entropy", "loss", "refkern.kernels.loss_binary:binary_cross_entropy",
       "refkern.truth.losses:binary_cross_entropy", ("input", "target", "weight"), "loss", required=2,
       positional=True, differentiable=("input", "target"), torch_function=f"{_F}binary_cross_entropy",
       calls=(Call(f"{_F}binary_cross_entropy", ("input", "target", "weight", "size_average", "reduce",
                                                   "reduction")),),
       aten=("binary_cross_entropy",), aten_backward=("binary_cross_entropy_backward",),
       autograd=(("BinaryCrossEntropyBackward0", ("input", "target")),),
       opinfo=("nn.functional.binary_cross_entropy",),
       backward=_with_target("loss_grad:_bce", "binary_cross_entropy", "bce_report", "binary_cross_entropy")),
    Op("binary_cross_entropy_with_logits", "loss", "refkern.kernels.loss_binary:binary_cross_entropy_with_logits",
       "refkern.truth.losses:binary_cross_entropy_with_logits", ("input", "target", "weight"), "loss", required=2,
       positional=True, differentiable=("input", "target"), torch_function=f"{_F}binary_cross_entropy_with_logits",
       calls=(Call(f"{_F}binary_cross_entropy_with_logits", ("input", "target", "weight", "size_average", "reduce",
                                                               "reduction", "pos_weight")),),
       aten=("binary_cross_entropy_with_logits",), opinfo=("nn.functional.binary_cross_entropy_with_logits",),
       backward=Backward(_RULE + "loss_logits_grad:_bce_logits", _TRUTH + "binary_cross_entropy_with_logits",
                         "refkern.analysis.loss_logits:logits_report")),
)  # fmt: skip
