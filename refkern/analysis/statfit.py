"""One model of the statistical test inside the envelope, tested on every element: the record that
:mod:`refkern.analysis.inside` and its quick path (:mod:`refkern.analysis._healthy`) both build, a leaf
so that neither imports the other for it."""

from dataclasses import dataclass

import numpy as np

from refkern.analysis.hypotheses import Model

__all__ = ["INSIDE", "StatFit", "unexplained"]

INSIDE = "statistical, inside the envelope"  #: the ``test`` of the thresholds and detectable of these reports


def unexplained(fails, groups) -> np.ndarray:
    """Elements beyond the element test (``fails``) and the elements of the failing groups; of a failing
    scale test (``ax`` None), those whose residual has the scale's sign (its ``mask``; the row scale
    tests' first group holds every failing row's, the others None)."""
    out = fails.copy()
    for g in groups:
        if g["ax"] is None:
            if g["mask"] is not None:
                out |= g["mask"]
            continue
        sl = [slice(None)] * out.ndim
        sl[g["ax"]] = g["index"]
        out[tuple(sl)] = True
    return out


@dataclass
class StatFit:
    """One model of the statistical test, tested on every element."""

    model: Model
    centre: np.ndarray
    var: np.ndarray
    z: np.ndarray
    fails: np.ndarray
    groups: list
    lam: float

    @property
    def explains(self) -> bool:
        return not self.fails.any() and not self.groups

    def unexplained(self) -> np.ndarray:
        return unexplained(self.fails, self.groups)

    @property
    def max_z(self) -> float:
        return float(self.z.max()) if self.z.size else 0.0

    def summary(self, lam_el=None) -> dict:
        return {"kind": self.model.kind, "precision": self.model.precision, "explains": self.explains,
                "tested_on": "every element", "unexplained": int(self.unexplained().sum()),
                "failing_groups": len(self.groups), "max_ratio": self.max_z / self.lam,
                "test": INSIDE}  # fmt: skip
