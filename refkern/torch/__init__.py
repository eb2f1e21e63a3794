"""The torch adapter: run ops on any backend and audit whole models against exact references.

Imported only when used (``refkern.torch``); it needs torch. It holds no numerics: tensors
are converted and dispatched to :mod:`refkern`'s kernels and analysis.
"""

from refkern.torch.audit import Audit, AuditCall, BitReport, audit
from refkern.torch.check import CheckResult, CheckRow, check
from refkern.torch.devices import Backend, devices
from refkern.torch.ops import torch_function
from refkern.torch.reference import OutputComparison, compare_outputs, reference_mode

__all__ = [
    "Audit",
    "AuditCall",
    "Backend",
    "BitReport",
    "CheckResult",
    "CheckRow",
    "OutputComparison",
    "audit",
    "check",
    "compare_outputs",
    "devices",
    "reference_mode",
    "torch_function",
]
