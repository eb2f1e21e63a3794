"""benchmarks/bench_verdict.py, power family: its correct implementations are correct (float32 emulations
within a few ulps of the float64 result), its bugs have the size they claim in spreads of correct
implementations, and a handful of cases hold what issue 24 asks of the verdict: no false alarm, every
bug of at least 8x the spread of correct implementations a mismatch, nothing below 1x named a precision.

Cases the verdict fails today are marked ``xfail(strict=True)`` one by one (the benchmark is not
weakened): a fix of the verdict turns them into XPASS, which fails, so that the mark is removed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


def test_ulp_of_is_the_spacing(bv):
    """ulp_of gives each dtype's spacing at the value (normal and subnormal), as torch's nextafter does."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1000, generator=g, dtype=torch.float64) * torch.exp(
        8 * torch.randn(1000, generator=g, dtype=torch.float64)
    )
    for dtype in ("float32", "bfloat16", "float16"):
        x = v.to(bv.DT[dtype]).abs()
        x = x[(x > 0) & torch.isfinite(x)]
        up = torch.nextafter(x, torch.full_like(x, float("inf")))
        want = (up.double() - x.double()).numpy()
        # at a power of two the ulp below is half the one above; ulp_of gives the one above, as nextafter up
        np.testing.assert_array_equal(bv.ulp_of(x.double().numpy(), dtype), want, err_msg=dtype)


def test_emulations_are_float32_and_accurate(bv):
    """SIMD-lane sums, the online softmax and the tiled attentions agree with float64 to float32 rounding."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 5000, generator=g).numpy()
    for lanes, block in ((8, 128), (16, 4096)):
        s = bv._lanes(X, lanes, block)
        assert s.dtype == np.float32
        exact = X.astype(np.float64).sum(1)
        assert np.all(np.abs(s - exact) <= 64 * 2.0**-24 * np.abs(X).astype(np.float64).sum(1))
    L = 3 * torch.randn(3, 1000, generator=g).numpy()
    for log in (False, True):
        want = (F.log_softmax if log else F.softmax)(torch.from_numpy(L).double(), -1).numpy()
        got = bv._online_softmax(L, 128, log)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    q, k, v = (torch.randn(1, 2, s, 64, generator=g) for s in (16, 300, 300))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).numpy()
    for got in (bv._attn_np(q, k, v), bv._attn_np(q, k, v, 128), bv._attn_np_tiles_p(q, k, v, 128, torch.float32)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # P rounded to bfloat16 before P V moves the output by about bf16's u times |V|, not more
    got = bv._attn_np(q, k, v, p_dtype=torch.bfloat16)
    assert 1e-5 < np.abs(got - want).max() < 2.0**-8


def test_bugs_have_their_size(bv):
    """Each injected bug moves torch's output by s x spread at most (and at least, where rounding to the
    dtype does not swallow it), in every kind."""
    args, kw = bv.pw_call("layer_norm", 256, "offset", "float32", 0)
    good = F.layer_norm(*args, **bv._pw_kw(kw))
    spread = 3e-5
    ulp = float(bv.ulp_of(good.abs().max().item(), "float32"))
    kinds = set()
    for kind, s, out in bv.pw_bugs("layer_norm", good, spread, (2, 8), torch.Generator().manual_seed(0)):
        kinds.add(kind)
        d = (out.double() - good.double()).abs().max().item()
        assert d == pytest.approx(s * spread, abs=ulp), kind  # rounded to float32: within an ulp
    assert kinds == {
        "whole tensor scaled",
        "constant offset",
        "one row scaled",
        "one feature offset",
        "one element off",
    }


# (op, n, data, dtype): a handful of cases, about 40 s together on two loaded cores
CASES = [
    ("layer_norm", 4096, "offset", "bfloat16"),
    ("rms_norm", 1024, "randn", "float16"),
    # the rows' statistics emulated as members (noise_norm_chains): the whole tensor and one row scaled by 8x, one
    # element off by 8x, and one row of quantized rows scaled by 8x passed before
    ("rms_norm", 4096, "randn", "float32"),
    ("layer_norm", 4096, "offset", "float32"),
    ("layer_norm", 64, "offset", "bfloat16"),
    ("softmax", 64, "randn", "float32"),
    ("log_softmax", 64, "randn", "float32"),
    ("log_softmax", 64, "randn", "bfloat16"),
    ("scaled_dot_product_attention", 64, "randn", "bfloat16"),
    ("scaled_dot_product_attention", 64, "randn", "float32"),
    ("sum", 100_000, "randn", "float32"),
    ("var", 1000, "offset", "bfloat16"),
    ("cumsum", 1000, "randn", "float32"),
]
SCALES = (0.5, 8, 32)

# what the verdict fails today, measured (docs/analysis.md, "Power in absolute units"); the lead fixes the verdict
FALSE_ALARMS = {}  # sequential Welford on quantized offset rows: now a member of the rounding family (noise._norm)
MISSES = {
    ("softmax", 64, "randn", "float32"): "one row scaled by 8x the spread (19.3 u relative) is rounding: D's "
    "long chains are members now (noise_softmax_chains), but an online kernel's rescales, their exps charged the "
    "documented 2-2.25 ulps, leave a row 3.0-5.2 u of shared scale (the rest's additions 1.9-2.1 u): z 4.35 "
    "against the row test's level 6.4",
}
NAMED_BELOW = {}


def _id(c):
    return f"{c[0]}-{c[1]}-{c[2]}-{c[3]}"


def _case(c, known):
    if c in known:
        return pytest.param(c, id=_id(c), marks=pytest.mark.xfail(strict=True, reason=known[c]))
    return pytest.param(c, id=_id(c))


_ROWS = {}


def _rows(bv, c):
    if c not in _ROWS:
        op, n, data, dtype = c
        _ROWS[c] = bv.pw_case(op, n, data, dtype, 0, SCALES, log=lambda *a: None)
    return _ROWS[c]


def _text(rows):
    return [f"{r['name']}: {r['verdict']} {r['precision'] or ''} size {r.get('size', r.get('err')):.3g}" for r in rows]


@pytest.mark.parametrize("c", [_case(c, FALSE_ALARMS) for c in CASES])
def test_no_false_alarm(bv, c):
    rows = [r for r in _rows(bv, c) if r["truth"] == "correct"]
    assert len(rows) >= 4
    bad = [r for r in rows if r["verdict"] in ("mismatch", "reduced-precision")]
    assert not bad, _text(bad)


@pytest.mark.parametrize("c", [_case(c, MISSES) for c in CASES])
def test_bugs_from_8x_the_spread_are_mismatches(bv, c):
    rows = [r for r in _rows(bv, c) if r["truth"] == "bug" and r["size"] >= 8]
    assert rows
    bad = [r for r in rows if r["verdict"] != "mismatch"]
    assert not bad, _text(bad)


@pytest.mark.parametrize("c", [_case(c, NAMED_BELOW) for c in CASES])
def test_nothing_below_the_spread_is_named_a_precision(bv, c):
    rows = [r for r in _rows(bv, c) if r["truth"] == "bug" and r["size"] < 1]
    if not rows:  # one half-precision output: the bugs below the spread round back to the correct value
        pytest.skip("rounding to the dtype swallows every bug below 1x the spread")
    bad = [r for r in rows if r["verdict"] == "reduced-precision"]
    assert not bad, _text(bad)
