"""Backward rule of embedding: the gradient of ``weight`` is an exact scatter-add of grad_output's rows
(:func:`refkern.kernels.embedding.grad_weight`); the indices have no gradient."""

from refkern.kernels._common import deliver
from refkern.kernels._grad import Adjoint

__all__ = ["_embedding", "call_of"]


def call_of(g, a, who):
    """The validated backward call of ``embedding(**a)`` for grad_output ``g`` (its shape and dtype: the
    lookup's, ``input.shape + (D,)`` in weight's dtype)."""
    from refkern._arrays import operand
    from refkern.kernels.embedding import embedding_grad_call

    ow = operand(a["weight"], "weight", who)
    if len(ow.shape) != 2:
        raise ValueError(f"{who}: weight must have shape (num_embeddings, embedding_dim); got weight.shape="
                         f"{tuple(ow.shape)}.")  # fmt: skip
    return embedding_grad_call(g, a["input"], ow.shape[0], a.get("padding_idx"), a.get("scale_grad_by_freq"), who,
                               weight=ow)  # fmt: skip


def _embedding(op, g, a, wrt, who):
    from refkern.kernels.embedding import grad_weight

    c = call_of(g, a, who)
    return {"weight": Adjoint("weight", op, (), compute=lambda: deliver(grad_weight(c), c.fmt, c.tensor))}
