"""The envelope pass of a bound that is +inf everywhere (a norm's rounding envelope once n u > 1/8) takes a
loop of its own (verdict_envelope._vacuous_pass); what it reports must be the full pass's, element by element,
on outputs with equal, unequal and special values."""

import numpy as np
import pytest

from refkern.accumulate.formats import FORMATS
from refkern.analysis import verdict_envelope
from refkern.analysis.verdict_envelope import _envelope_fits


def _data(seed, n):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(n).astype(np.float32)
    act = ref.copy()
    moved = rng.random(n) < 0.5
    act[moved] = np.nextafter(ref[moved], np.float32(np.inf))
    act[rng.random(n) < 0.3] *= np.float32(1.5)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45]
    for k in range(40):  # specials on either side, equal or not
        i, j = rng.integers(n), rng.integers(len(special))
        if k % 3 != 1:
            act[i] = special[j]
        if k % 3 != 0:
            ref[i] = special[rng.integers(len(special))]
    return act, ref


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("n", [7, 5000, 300_001])
def test_an_infinite_bound_reports_what_the_full_pass_reports(n, one_pass, monkeypatch):
    act, ref = _data(n, n)
    out = FORMATS["bfloat16"]
    key = "one-pass" if one_pass else "rounding"
    from refkern.analysis import envelope

    if one_pass:
        key = envelope.ONE_PASS
    with monkeypatch.context() as m:  # the one-value bound takes the vacuous loop, never the full pass
        m.setattr(verdict_envelope, "_envelope_pass", None)
        vac = _envelope_fits(act, out, [(key, None, ref, np.broadcast_to(np.inf, ref.shape))], ulps=True)[0]
    full = _envelope_fits(act, out, [(key, None, ref, np.full(ref.shape, np.inf))], ulps=True)[0]
    assert np.array_equal(vac.state, full.state)
    assert vac.counts == full.counts and vac.blind == full.blind
    assert np.array_equal(vac.top, full.top) and vac.max_ratio == full.max_ratio
    assert vac.max_error_ulps == full.max_error_ulps
    assert vac.median_ulps == full.median_ulps == np.inf and vac.max_ulps == full.max_ulps == np.inf
    assert vac.counts[3] > 0 and vac.counts[2] > 0 and vac.counts[0] > 0  # every state occurs


def test_an_empty_output_has_an_empty_bound():
    """No element, no bound value: the pass must not read one (a layer_norm over 0 rows in bfloat16)."""
    fit = _envelope_fits(np.zeros(0, np.float32), FORMATS["bfloat16"],
                         [("rounding", None, np.zeros(0, np.float32), np.zeros(0))], ulps=True)[0]  # fmt: skip
    assert fit.counts == (0, 0, 0, 0) and fit.median_ulps == 0.0
