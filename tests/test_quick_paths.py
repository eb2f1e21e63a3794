"""The quick paths of compare give what the full ones give: the one-pass test of a healthy result
(inside._healthy) against the element and group tests (inside._test), the bracketed median of a bracket
of one value, and each input tensor converted once per compare."""

import numpy as np
import pytest

from refkern import _arrays
from refkern.accumulate.formats import BFLOAT16, FLOAT32
from refkern.analysis import inside
from refkern.analysis.hypotheses import Model
from refkern.analysis.passes import median_in_bracket
from refkern.analysis.stats import level


def _case(seed, shape, dtype=np.float32, scale=1.0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal(shape).astype(dtype)
    var = (1e-3 * (1.0 + rng.random(shape))) ** 2
    a = (c + (np.sqrt(var) * rng.standard_normal(shape)).astype(dtype)).astype(dtype)
    return a, c, var


@pytest.mark.parametrize("shape,only", [((64, 48), (1,)), ((6, 7, 40), (2,)), ((5, 6, 7), (0, 1, 2)), ((300,), ())])
@pytest.mark.parametrize("scale", [1.0, "array"])
def test_healthy_pass_is_the_element_and_group_test(shape, only, scale):
    a, c, var = _case(1, shape)
    if scale == "array":
        scale = np.ldexp(1.0, np.random.default_rng(2).integers(-3, 4, shape))
        var = var * scale**2
    m = Model("rounding", None, "t", FLOAT32, FLOAT32)
    lam_el, lam_grp = level(c.size), level(sum(shape[ax] for ax in only) or 1)
    quick = inside._healthy(m, a, c, var, lam_el, lam_grp, only, scale, FLOAT32)
    a64, c64 = a.astype(np.float64), c.astype(np.float64)
    full = inside._test(m, a64, c64, var, np.zeros(shape, bool), lam_el, lam_grp, tuple(f"d{i}" for i in range(len(shape))),
                        only, scale)  # fmt: skip
    assert full.explains and quick is not None
    np.testing.assert_array_equal(quick.z, full.z)
    assert not quick.fails.any()
    peak = inside._power_max(var.reshape(-1), c64.reshape(-1), np.broadcast_to(np.asarray(scale, np.float64), shape)
                             .reshape(-1).copy(), lam_el, FLOAT32.prec, FLOAT32.emin)  # fmt: skip
    assert quick.peak == pytest.approx(peak, abs=0)


def test_healthy_pass_declines_an_element_or_a_group_that_fails():
    m = Model("rounding", None, "t", FLOAT32, FLOAT32)
    a, c, var = _case(3, (200, 30))
    lam_el, lam_grp = level(c.size), level(30)
    assert inside._healthy(m, a, c, var, lam_el, lam_grp, (1,), 1.0, FLOAT32) is not None
    one = a.copy()
    one[7, 3] = c[7, 3] + np.float32(50 * np.sqrt(var[7, 3]))  # one element at 50 sigma
    assert inside._healthy(m, one, c, var, lam_el, lam_grp, (1,), 1.0, FLOAT32) is None
    col = a.copy()
    col[:, 5] = (c[:, 5] + np.float32(1.0) * np.sqrt(var[:, 5]).astype(np.float32)).astype(np.float32)  # 1 sigma each
    assert inside._test(m, col.astype(np.float64), c.astype(np.float64), var, np.zeros(c.shape, bool), lam_el, lam_grp,
                        ("r", "c"), (1,)).groups  # fmt: skip
    assert inside._healthy(m, col, c, var, lam_el, lam_grp, (1,), 1.0, FLOAT32) is None


def test_median_of_a_bracket_of_one_value_needs_no_kept_value():
    # 3 chunks, room for 2 values each, every value in the bracket [inf, inf]: the room overflowed
    kept = np.full((3, 2), np.inf)
    n_kept, n_below = np.array([5, 5, 4]), np.array([1, 0, 0])
    assert median_in_bracket(kept, n_kept, n_below, 15) is None  # without the bracket: the overflow forbids
    assert median_in_bracket(kept, n_kept, n_below, 15, np.inf, np.inf) == np.inf
    assert median_in_bracket(kept, n_kept, n_below, 15, 2.0, 2.0) == 2.0
    assert median_in_bracket(kept, n_kept, np.array([9, 0, 0]), 15, 2.0, 2.0) is None  # the middle rank below it


def test_each_tensor_is_converted_once_per_block(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = []
    real = _arrays._from_tensor
    monkeypatch.setattr(_arrays, "_from_tensor", lambda x, n, o: calls.append(n) or real(x, n, o))
    x = torch.randn(4, 8).bfloat16()
    with _arrays.converted_once():
        first = _arrays.operand(x, "input", "t")
        assert _arrays.operand(x, "input", "t") is first
        x.mul_(2)  # written in place: read again
        again = _arrays.operand(x, "input", "t")
    assert len(calls) == 2 and again.fmt is BFLOAT16
    np.testing.assert_array_equal(again.values, 2 * first.values)
    _arrays.operand(x, "input", "t")  # outside a block: every call converts
    assert len(calls) == 3


def test_class_counts_as_bincount():
    from refkern.analysis.report import VERDICTS, counts

    c = np.random.default_rng(4).integers(0, 4, 1000).astype(np.int8)
    assert counts(c) == dict(zip(VERDICTS, np.bincount(c, minlength=4).tolist()))
    assert counts(np.zeros((2, 0), np.int8)) == dict.fromkeys(VERDICTS, 0)
