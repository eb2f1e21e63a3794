"""The forward envelope of an average pool counts every term of a window in every pooled dimension: the
record's (``Op.spatial``), not the op's name. avg_pool3d with ``kernel_size=3`` once counted 3 * 3 terms and
adaptive_avg_pool2d with ``output_size=1`` only the last dimension's, so torch's own float32 results on windows
whose every addition rounds up were called mismatches while the tuple forms of the same calls were rounding."""

import numpy as np
import pytest

import refkern
import refkern.ops as ops
from refkern.analysis._envelope_ops import layout

U = 2.0**-24  # float32's unit roundoff


def _window_that_rounds_up(shape):
    """1 followed by terms just over half an ulp of 1: every float32 addition of a left-to-right sum rounds up, an
    error of about u per term (the worst case the envelope's gamma_{n-1} must cover)."""
    w = np.full(int(np.prod(shape)), np.float32(U * (1 + 2.0**-10)), np.float32)
    w[0] = 1.0
    return w.reshape(shape)


def _sequential_mean(x):
    """A correct float32 kernel's average of one whole window: left to right in float32, then one division."""
    acc = np.float32(0)
    for v in x.reshape(-1):
        acc = np.float32(acc + v)
    return np.float32(acc / np.float32(x.size))


CALLS = [  # (op, input shape, the keywords as int, the same as a tuple, the terms of a window written out)
    ("avg_pool1d", (1, 1, 9), dict(kernel_size=9), dict(kernel_size=(9,)), 9),
    ("avg_pool2d", (1, 1, 5, 5), dict(kernel_size=5), dict(kernel_size=(5, 5)), 25),
    ("avg_pool3d", (1, 1, 3, 3, 3), dict(kernel_size=3), dict(kernel_size=(3, 3, 3)), 27),
    ("adaptive_avg_pool1d", (1, 1, 9), dict(output_size=1), dict(output_size=(1,)), 9),
    ("adaptive_avg_pool2d", (1, 1, 5, 5), dict(output_size=1), dict(output_size=(1, 1)), 25),
]


def test_every_average_pool_is_covered():
    assert sorted(c[0] for c in CALLS) == sorted(n for n in ops.names(family="pool") if ops.get(n).pool != "max")


@pytest.mark.parametrize("op, shape, as_int, as_tuple, terms", CALLS, ids=[c[0] for c in CALLS])
def test_a_window_has_its_terms_in_every_pooled_dimension(op, shape, as_int, as_tuple, terms):
    x = np.ones(shape, np.float32)
    out = ops.get(op).reference(x, **as_int).shape
    # adaptive windows over L for output O: at most ceil(L / O) + 1 per dimension, at most the input's L
    assert layout(op, dict(input=x, **as_int), out).n == terms
    assert layout(op, dict(input=x, **as_tuple), out).n == terms


@pytest.mark.parametrize("op, shape, as_int, as_tuple, terms", CALLS, ids=[c[0] for c in CALLS])
def test_torch_and_a_sequential_float32_kernel_are_rounding_on_windows_that_round_up(op, shape, as_int, as_tuple,
                                                                                      terms):  # fmt: skip
    """One window holds the whole input: torch's CPU result and the left-to-right emulation are correct
    implementations, within gamma_{n-1} of the exact mean; a window that drops its last (largest after the first)
    term is a mismatch either way (the envelope is still tight enough to see a bug of one term)."""
    torch = pytest.importorskip("torch")
    x = _window_that_rounds_up(shape)
    emulated = np.full((1,) * len(shape), _sequential_mean(x), np.float32)
    assert float(emulated.reshape(-1)[0]) != float(ops.get(op).reference(x, **as_int).reshape(-1)[0])  # not exact
    got = getattr(torch.nn.functional, op)(torch.from_numpy(x), **as_int)
    for kw in (as_int, as_tuple):
        assert refkern.compare(got, op, x, **kw).verdict == "rounding"
        assert refkern.compare(emulated, op, x, **kw).verdict == "rounding"
    rng = np.random.default_rng(terms)
    y = rng.uniform(1, 2, shape).astype(np.float32)
    short = np.full((1,) * len(shape), np.float32(y.reshape(-1)[:-1].sum(dtype=np.float64) / y.size), np.float32)
    for kw in (as_int, as_tuple):
        assert refkern.compare(short, op, y, **kw).verdict == "mismatch"
