"""Ground truth: every refkern op computed with mpmath from its definition, rounded once.

Nothing here shares numerics with the fast path: values are built by mpmath at a working
precision derived from the inputs (never mpmath's default 53 bits), and the single rounding
to the result format is done on Python integers. One module per family of ops:

* :mod:`refkern.truth.products`: dot, sum, matmul, linear, the convolutions.
* :mod:`refkern.truth.backward`: the gradients of the products and convolutions.
"""

from refkern.truth.backward import backward
from refkern.truth.products import *  # noqa: F403
from refkern.truth.products import __all__ as _products
from refkern.truth.reductions import *  # noqa: F403 (after products: its sum replaces products' sum)
from refkern.truth.reductions import __all__ as _reductions
from refkern.truth.softmax import *  # noqa: F403
from refkern.truth.softmax import __all__ as _softmax

__all__ = ["backward", *_products, *(n for n in _reductions if n not in _products), *_softmax]
