"""refkern: exact reference kernels for deep learning, and the proof of what a backend got wrong.

``import refkern`` loads numpy and numba only; torch is used when a tensor is passed, mpmath
when :mod:`refkern.truth` is first touched.
"""

from refkern._version import __version__
from refkern.analysis.compare import assert_matches_reference, compare
from refkern.analysis.explain import Explanation, explain
from refkern.analysis.report import Report
from refkern.gradients import backward, compare_backward
from refkern.kernels.attention import scaled_dot_product_attention
from refkern.kernels.conv import conv1d, conv2d, conv3d
from refkern.kernels.conv_transpose import conv_transpose1d, conv_transpose2d, conv_transpose3d
from refkern.kernels.elementwise import (
    cos,
    erf,
    exp,
    exp2,
    expm1,
    gelu,
    log,
    log1p,
    log2,
    pow,  # noqa: A004
    reciprocal,
    rsqrt,
    sigmoid,
    silu,
    sin,
    softplus,
    sqrt,
    tanh,
)
from refkern.kernels.embedding import embedding, embedding_dense_backward
from refkern.kernels.gemm import linear, matmul
from refkern.kernels.loss import cross_entropy, nll_loss
from refkern.kernels.loss_binary import binary_cross_entropy, binary_cross_entropy_with_logits
from refkern.kernels.loss_pointwise import l1_loss, mse_loss
from refkern.kernels.norm import batch_norm, group_norm, layer_norm, rms_norm
from refkern.kernels.pool import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    avg_pool1d,
    avg_pool2d,
    max_pool1d,
    max_pool2d,
)
from refkern.kernels.pool3d import avg_pool3d
from refkern.kernels.reduction import cumsum, mean, std, sum, var  # noqa: A004
from refkern.kernels.softmax import log_softmax, softmax
from refkern.reduce import METHODS, dot

__all__ = [
    "__version__",
    "METHODS",
    "Explanation",
    "Report",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "assert_matches_reference",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "backward",
    "batch_norm",
    "compare",
    "compare_backward",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "cos",
    "cumsum",
    "dot",
    "erf",
    "exp",
    "exp2",
    "explain",
    "expm1",
    "gelu",
    "group_norm",
    "layer_norm",
    "linear",
    "log",
    "log1p",
    "log2",
    "log_softmax",
    "nll_loss",
    "cross_entropy",
    "embedding",
    "embedding_dense_backward",
    "mse_loss",
    "l1_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "matmul",
    "max_pool1d",
    "max_pool2d",
    "mean",
    "pow",
    "reciprocal",
    "rms_norm",
    "rsqrt",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "sin",
    "softmax",
    "softplus",
    "sqrt",
    "std",
    "sum",
    "tanh",
    "torch",
    "truth",
    "var",
]


def __getattr__(name):
    if name == "truth":  # lazy: it imports mpmath
        import refkern.truth

        return refkern.truth
    if name == "torch":  # lazy: it imports torch
        import refkern.torch

        return refkern.torch
    raise AttributeError(f"module 'refkern' has no attribute {name!r}")
