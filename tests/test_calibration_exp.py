"""The statistical scale's exp and log constants and the measurement behind the exp's
(benchmarks/calibrate_exp_u20.py: torch's Vectorized<float>::exp_u20 emulated bit for bit)."""

import os
import sys

import numpy as np
import pytest

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis._envelope_softmax import (
    EXP_SCALE_BINADES,
    EXP_SCALE_ULPS,
    EXP_ULPS,
    LOG_SCALE_ULPS,
    exp_scale_ulps,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import calibrate_exp_u20 as cal  # noqa: E402

# the exhaustive scan per binade of |x| (calibrate_exp_u20.py --binades, 589 s): 1.878, 1.848, 1.843, 1.914,
# 2.056, 2.301, 2.839, 3.946, 4.702 ulp; rounded up to a quarter, at least CUDA's expf's 2
MEASURED = (1.8783911895006895, 1.8477880246937275, 1.8433260638266802, 1.9142064787447453, 2.05596730299294,
            2.300635140389204, 2.838967079296708, 3.946111489087343, 4.702169083058834)  # fmt: skip


def test_constants_by_hand():
    assert [b for _, b in EXP_SCALE_BINADES] == pytest.approx([2, 2, 2, 2, 2.25, 2.5, 3, 4, 4.75], abs=0)
    assert [t for t, _ in EXP_SCALE_BINADES] == pytest.approx([0.5, 1, 2, 4, 8, 16, 32, 64, np.inf], abs=0)
    assert all(m <= b for m, (_, b) in zip(MEASURED, EXP_SCALE_BINADES))
    assert EXP_SCALE_ULPS == pytest.approx(4.75, abs=0)  # 4.70 measured, rounded up to a quarter
    assert LOG_SCALE_ULPS == pytest.approx(1.0, abs=0)  # SLEEF u10, glibc, CUDA logf: 1 ulp documented
    assert EXP_ULPS == pytest.approx(20, abs=0)  # the envelope keeps torch's documented bound


def test_the_bound_per_argument():
    x = np.array([0.0, -0.3, -3.9, -4.0, -9.0, -40.0, -70.0, -np.inf, np.nan])
    assert exp_scale_ulps(x, FLOAT32.u).tolist() == [2, 2, 2, 2.25, 2.5, 4, 4.75, 4.75, 4.75]
    assert exp_scale_ulps(x, FLOAT64.u).tolist() == [1.0] * 9


def test_a_strided_sample_per_binade_stays_within_the_measured_maxima():
    got = cal.binades(-88.0, 0.0, stride=8191)
    assert all(g <= m for (_, g), m in zip(got, MEASURED))


def test_fma32_rounds_once():
    one = np.float32(1.0)
    a = np.float32(1 + 2.0**-12)  # a * a = 1 + 2**-11 + 2**-24: a float32 midpoint
    assert cal.fma32(a, a, np.float32(0.0)) == np.float32(1 + 2.0**-11)  # a tie: to even
    # 2**-60 above the midpoint: float64 loses it (s is the midpoint), the exact sum rounds up
    assert cal.fma32(a, a, np.float32(2.0**-60)) == np.float32(1 + 2.0**-11 + 2.0**-23)
    assert cal.fma32(a, a, np.float32(-(2.0**-60))) == np.float32(1 + 2.0**-11)
    assert cal.fma32(one, one, one) == np.float32(2.0)


def test_exp_u20_emulation_at_hand_points():
    assert cal.exp_u20(np.float32(0.0)) == np.float32(1.0)  # exp(0) = 1 exactly
    assert cal.exp_u20(np.float32(-100.0)) == np.float32(0.0)  # below ln FLT_MIN: flushed
    x = np.float32(-1.0)
    assert abs(float(cal.exp_u20(x)) - np.exp(-1.0)) <= 4.75 * 2.0**-25  # ulp of [0.25, 0.5) is 2**-25


def test_the_measured_maximum_near_the_underflow():
    """Every float32 in [-88, -80]: the largest error where the result is at least 4 FLT_MIN, and the flush."""
    r = cal.scan(-88.0, -80.0)
    assert r["arguments"] == 779912
    assert r["max_ulp"] == pytest.approx(4.702169083058834, abs=0)
    assert r["at"] == pytest.approx(-85.55904388427734, abs=0)
    assert r["flush_abs_in_flt_min"] == pytest.approx(1.41420816671628, abs=0)
    assert r["max_ulp"] <= EXP_SCALE_ULPS


def test_a_sample_of_the_rest_stays_below():
    """Every 1021st float32 in [-80, 0) (the exhaustive scan's largest is 4.4696 ulp, at -79.311874)."""
    r = cal.scan(-80.0, 0.0, stride=1021)
    assert r["arguments"] > 10**6
    assert r["max_ulp"] <= 4.4696
    assert r["rms_ulp"] < 0.5
