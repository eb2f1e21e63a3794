"""benchmarks/bench_verdict.py, envelope family: its helpers reproduce torch's pooling windows, and a
fast subset of the calibration holds the rates the verdict promises (no false alarm, every bug of
at least twice the envelope caught, nothing below the envelope called a mismatch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


def test_pool_windows_are_torchs(bv):
    """The windows and divisors the benchmark's own pooling (alternatives and bugs) uses are torch's."""
    for i, (op, _, kw) in enumerate(bv.POOLS):
        _, (x,), kw = bv.pool_call(i, "randn", "float64", "contiguous", 0)
        want = getattr(F, op)(x, **kw)
        xd = x.numpy()
        if op.startswith("avg_pool"):
            wins = bv._windows(xd.shape, tuple(want.shape), kw, op)
            got = bv._gather(xd, wins, 0.0).sum(-1) / bv._divisor(wins, kw)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-300, err_msg=str((op, kw)))
        elif op.startswith("max_pool"):
            wins = bv._windows(xd.shape, tuple(want.shape), kw, op)
            assert np.array_equal(bv._gather(xd, wins, -np.inf).max(-1), want.numpy()), (op, kw)
        else:
            sizes = kw["output_size"]
            sizes = (sizes,) * (1 if op.endswith("1d") else 2) if isinstance(sizes, int) else tuple(sizes)
            np.testing.assert_allclose(bv._adaptive(xd, sizes), want.numpy(), rtol=1e-12, err_msg=str((op, kw)))


def test_float32_algorithms_are_float32(bv):
    """The numpy alternatives stay in float32 and differ from the float64 value by rounding only."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4, 3000, generator=g).numpy()
    exact = X.astype(np.float64).sum(1)
    for how in ("left-to-right", "reversed", "tree", "blocks of 128", "Kahan"):
        s = bv._sums(X, how)
        assert s.dtype == np.float32
        assert np.all(np.abs(s - exact) <= 3000 * 2.0**-24 * np.abs(X).astype(np.float64).sum(1)), how
    m, q = bv._moments(X, "Welford blocks of 64, Chan merge")
    assert m.dtype == q.dtype == np.float32
    np.testing.assert_allclose(q, ((X - X.mean(1, keepdims=True)) ** 2).sum(1), rtol=1e-4)


def test_envelope_calibration_subset(bv):
    rows = bv.run_envelope(
        quick=True,
        ops=("sum", "var", "cumsum", "layer_norm", "batch_norm[eval]"),
        lengths=(7, 300),
        data=("randn", "offset", "constant"),
        dtypes=("float32", "bfloat16", "float64"),
        pools=(2, 16, 20),
        log=lambda *a: None,
    )
    s = bv.summarise_envelope(rows)
    print({k: v for k, v in s.items() if not isinstance(v, (list, dict))})
    assert s["false_alarms"] == 0, s["false_alarm_cases"]
    assert s["caught_ge_2x"] == s["bugs_ge_2x"] > 100, s["missed_ge_2x"]
    # inside the envelope the statistical test decides (refkern.analysis.inside): bugs below 1x the envelope,
    # which the envelope alone passed, are now seen, and none of them is named a precision
    assert 0 < s["caught_below_1x"] <= s["bugs_below_1x"]
    assert s["bugs_named_a_precision"] == 0
    assert s["named_right"] > 20
