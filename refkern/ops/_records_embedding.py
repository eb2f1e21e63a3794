"""The record of embedding (issue 26): a lookup, judged bit for bit (error model "gather":
:mod:`refkern.analysis.embedding`), whose gradient is an exact scatter-add (aten's
``embedding_dense_backward``), judged by the envelope of a sum in any order.

The op is this record, its kernel (:mod:`refkern.kernels.embedding`, rule :mod:`refkern.kernels.embedding_grad`)
and truth (:mod:`refkern.truth.embeddings`). The forward reaches torch's dispatcher as ``aten.embedding``,
which only moves values (the audit counts nothing there); the backward kernel is judged."""

from refkern.ops._record import Call, Op
from refkern.ops._records import _backward

_F = "torch.nn.functional."

RECORDS = (
    Op("embedding", "embedding", "refkern.kernels.embedding:embedding", "refkern.truth.embeddings:embedding",
       ("input", "weight"), "gather", required=2, positional=True, differentiable=("weight",),
       torch_function=f"{_F}embedding",
       calls=(Call(f"{_F}embedding", ("input", "weight", "padding_idx", "max_norm", "norm_type",
                                      "scale_grad_by_freq", "sparse")),),
       aten_backward=("embedding_dense_backward",), autograd=(("EmbeddingBackward0", ("weight",)),),
       opinfo=("nn.functional.embedding",),
       backward=_backward("embedding_grad:_embedding", "embedding", "embedding_report", "embedding")),
)  # fmt: skip
