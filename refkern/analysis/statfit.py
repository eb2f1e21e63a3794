"""One model of the statistical test inside the envelope, tested on every element: the record that
:mod:`refkern.analysis.inside` and its quick path (:mod:`refkern.analysis._healthy`) both build, a leaf
so that neither imports the other for it."""

from dataclasses import dataclass

import numpy as np

from refkern.analysis.hypotheses import Model

__all__ = ["INSIDE", "StatFit"]

INSIDE = "statistical, inside the envelope"  #: the ``test`` of the thresholds and detectable of these reports


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
        out = self.fails.copy()
        for g in self.groups:
            if g["ax"] is None:  # a scale test: the elements whose residual has the scale's sign
                if g["mask"] is not None:  # the row scale tests' first group holds every failing row's
                    out |= g["mask"]
                continue
            sl = [slice(None)] * out.ndim
            sl[g["ax"]] = g["index"]
            out[tuple(sl)] = True
        return out

    @property
    def max_z(self) -> float:
        return float(self.z.max()) if self.z.size else 0.0

    def summary(self, lam_el=None) -> dict:
        return {"kind": self.model.kind, "precision": self.model.precision, "explains": self.explains,
                "tested_on": "every element", "unexplained": int(self.unexplained().sum()),
                "failing_groups": len(self.groups), "max_ratio": self.max_z / self.lam,
                "test": INSIDE}  # fmt: skip
