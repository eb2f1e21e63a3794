"""The scale and offset tests of the verdict (issue 24: "test what the residuals correlate with"), by hand:
a group's residuals weighted by ``w = y / sigma**2``, ``T = sum r w / sqrt(sum sigma**2 w**2 + shared)``
against ``lam`` (plus the most a bounded shared error moves it), and the whole output's residual sum."""

import math

import numpy as np
import pytest

from refkern.analysis.noise_rows import RowShared
from refkern.analysis.verdict import _axis_scale_failures, _offset_failure, _row_scale_failures, n_rows

ONES = np.ones((2, 2))


def test_offset_test_by_hand():
    """Four residuals of 1 with sigma 1: T = 4 / 2 = 2, mean 1; it fails at lam 1.9 and passes at 2.1."""
    r, keep = np.ones(4), np.ones(4, bool)
    (g,) = _offset_failure(r, np.ones(4), keep, 1.9)
    assert (g["axis"], g["z"], g["mean"]) == ("offset", pytest.approx(2.0, abs=0), pytest.approx(1.0, abs=0))
    assert g["mask"].all()
    assert _offset_failure(r, np.ones(4), keep, 2.1) == []


def test_axis_scale_test_by_hand():
    """y = [[1, -1], [2, 2]], sigma 1, r = [[0.5, -0.5], [0, 0]] (row 0 scaled by 1.5): row 0's sum is 0, its
    scale test w = (1, -1): T = (0.5 + 0.5) / sqrt(2) = 0.7071, slope 1 / 2; row 1 and both columns
    (T = 0.5 / sqrt(5) = 0.2236) pass at lam 0.7."""
    y = np.array([[1.0, -1.0], [2.0, 2.0]])
    r = np.array([[0.5, -0.5], [0.0, 0.0]])
    out = _axis_scale_failures(r, ONES, ONES.astype(bool), y, 0.7, ("row", "col"))
    assert len(out) == 1
    (g,) = out
    assert (g["axis"], g["ax"], g["index"], g["scale"]) == ("row", 0, 0, True)
    assert g["z"] == pytest.approx(1 / math.sqrt(2), abs=1e-15) and g["mean"] == pytest.approx(0.5, abs=0)
    assert _axis_scale_failures(r, ONES, ONES.astype(bool), y, 0.71, ("row", "col")) == []


def test_axis_scale_test_counts_repeated_pairs_once():
    """The same (centre, actual) pair in both elements of row 0 is one error counted once: w = (1, 1),
    T = 0.5 / 1 instead of 1 / sqrt(2), which passes at lam 0.6 where the count of two failed."""
    y = np.array([[1.0, 1.0], [2.0, 3.0]])
    r = np.array([[0.5, 0.5], [0.0, 0.0]])
    a = y + r
    assert _axis_scale_failures(r, ONES, ONES.astype(bool), y, 0.6, ("row", "col"))  # counted twice: 1 / sqrt(2)
    assert _axis_scale_failures(r, ONES, ONES.astype(bool), y, 0.6, ("row", "col"), c=y, a=a) == []


def test_row_scale_test_by_hand():
    """Rows of 2, y = [[1, -1], [2, 2]], r = [[0.5, -0.5], [0, 0]], sigma 1: row 0's w = (1, -1), num 1,
    sum sigma**2 w**2 = 2; a shared error of variance 0.25 loading (1, 1) adds 0.25 (0**2 - 2) = -0.5:
    T = 1 / sqrt(1.5) = 0.8165, fails at lam 0.8. A bounded error B = 0.1 loading (1, 0) moves the sum by at
    most 0.1 |1| and is added to the threshold: 0.8 sqrt(1.5) + 0.1 = 1.0798 > 1 passes."""
    rows = lambda v: np.asarray(v, np.float64).reshape(2, 2)  # noqa: E731
    back = lambda v: np.asarray(v).reshape(2, 2)  # noqa: E731
    y = np.array([[1.0, -1.0], [2.0, 2.0]])
    r = np.array([[0.5, -0.5], [0.0, 0.0]])
    keep = ONES.astype(bool)
    coh = RowShared(rows, back, 2, [(np.array([0.25, 0.0]), ONES)])
    assert n_rows(coh) == 2 and n_rows(RowShared(rows, back, 1)) == 0 and n_rows(None) == 0
    (g,) = _row_scale_failures(r, ONES, keep, y, 0.8, coh)
    assert (g["axis"], g["index"]) == ("row scale", 0)
    assert g["z"] == pytest.approx(1 / math.sqrt(1.5), abs=1e-15) and g["mean"] == pytest.approx(0.5, abs=0)
    assert g["mask"].tolist() == [[True, True], [False, False]]
    bounded = RowShared(rows, back, 2, [(np.array([0.25, 0.0]), ONES)],
                        bounds=[(np.array([0.1, 0.0]), np.array([[1.0, 0.0], [1.0, 0.0]]))])  # fmt: skip
    assert bounded.bound(np.array([[1.0, -1.0], [0.5, 0.5]])).tolist() == pytest.approx([0.1, 0.0], abs=0)
    assert _row_scale_failures(r, ONES, keep, y, 0.8, bounded) == []
