"""Ground truth: every refkern op computed with mpmath from its definition, rounded once.

Nothing here shares numerics with the fast path: values are built by mpmath at a working
precision derived from the inputs (never mpmath's default 53 bits), and the single rounding
to the result format is done on Python integers. One module per family of ops:

* :mod:`refkern.truth.products`: dot, matmul, linear, the convolutions.
* :mod:`refkern.truth.reductions`: sum, mean, var, std, cumsum.
* :mod:`refkern.truth.norms`: layer_norm, rms_norm, group_norm, batch_norm.
* :mod:`refkern.truth.pools`: the poolings.
* :mod:`refkern.truth.softmax`: softmax, log_softmax, scaled_dot_product_attention.
* :mod:`refkern.truth.backward`: the gradients of every op.

``refkern.truth.<op>`` is the function the op's record names (:mod:`refkern.ops`): adding an op's
record exports its ground truth here.
"""

import refkern.ops as _ops
from refkern.truth.backward import backward
from refkern.truth.products import exact_precision, round_exact
from refkern.truth.reductions import round_fraction, round_sqrt_form

globals().update({_name: _rec.truth for _name, _rec in _ops.REGISTRY.items()})

__all__ = ["backward", *_ops.REGISTRY, "exact_precision", "round_exact", "round_fraction", "round_sqrt_form"]
