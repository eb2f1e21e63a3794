"""benchmarks/bench_verdict.py, power family for the gradients (``--family power-backward``): its emulated correct
backward kernels are correct, its exact gradients are exact, its bugs have the size they claim in spreads of correct
implementations, and a handful of quick cases hold what issue 24 asks of ``compare_backward``: no false alarm, every
bug of at least 8x the spread of correct implementations a mismatch, nothing below 1x named a precision.

What the verdict fails today is marked ``xfail(strict=True)`` per (case, gradient), with the measured reason (the
benchmark is not weakened): a fix of the verdict turns the mark into XPASS, which fails, so that it is removed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- the benchmark's own parts


# (family, size) of small calls: every family, the emulations checked against the exact gradient
SMALL = [
    ("softmax", 256),
    ("log_softmax", 256),
    ("layer_norm", 256),
    ("rms_norm", 256),
    ("group_norm", 512),
    ("batch_norm[train]", 2048),
    ("avg_pool2d", 3),
    ("mean", 1000),
    ("var", 1000),
    ("std", 1000),
    ("sdpa", 64),
    ("linear", 64),
    ("matmul", 64),
    ("conv2d", 256),
]


@pytest.mark.parametrize("fam,n", SMALL, ids=[f"{f}-{n}" for f, n in SMALL])
def test_emulated_backward_kernels_are_correct(bv, fam, n):
    """Every correct implementation of pb_correct (float32 emulations, torch in float64 and float32) gives every
    gradient of the call within float32 rounding of the exact one: max |error| <= 2**-14 max |exact| (a dropped
    term or a wrong form is off by far more), in float32 and in bfloat16 (within 2**-6: a few bf16 ulps)."""
    for dtype, tol in (("float32", 2.0**-14), ("bfloat16", 2.0**-6)):
        call, gout = bv.pb_call(fam, n, "randn", dtype, 0)
        exact = bv.pb_exact(call, gout)
        kernels = bv.pb_correct(fam, call, gout, dtype, "randn")
        assert len(kernels) >= 3
        for name, grads, _ in kernels:
            assert set(grads) <= set(call["diff"]), name
            for g, v in grads.items():
                assert v.dtype == bv.DT[dtype] and tuple(v.shape) == tuple(call["args"][call["diff"][g]].shape)
                ex = exact[g].reshape(v.shape)
                err = np.abs(v.double().numpy() - ex).max()
                assert err <= tol * np.abs(ex).max(), (dtype, name, g, err, np.abs(ex).max())


def test_attention_exact_is_refkern_correctly_rounded(bv):
    """pb_exact's attention gradients (torch's float64 autograd: refkern's float64 attention backward takes minutes)
    round to refkern's correctly rounded float32 gradients, to the ulp."""
    call, gout = bv.pb_call("sdpa", 64, "randn", "float32", 0)
    exact = bv.pb_exact(call, gout)
    ref = bv.rk.backward(call["op"], gout, *call["args"], **call["kw"])
    for g in ("query", "key", "value"):
        r = ref[g].double().numpy()
        e = torch.from_numpy(exact[g]).float().double().numpy()
        ulp = bv.ulp_of(r, "float32")
        assert np.abs(e - r).max() <= ulp.max(), g
        assert np.mean(e == r) > 0.999, g  # a float64 result rounds differently only next to a midpoint


def test_bugs_have_their_size(bv):
    """Each injected bug moves the correct gradient by s x spread at most (and at least, where rounding to the dtype
    does not swallow it), with the structured kinds of the gradient's shape."""
    call, gout = bv.pb_call("group_norm", 4096, "randn", "float32", 0)
    good = bv._autograd(call, gout)
    spread = 3e-5
    for name, want in (
        ("input", {"one sample scaled", "one channel offset"}),
        ("weight", set()),
    ):
        base = good[name]
        structure = bv.pb_structure("group_norm", name, tuple(base.shape))
        assert {k for k, _ in structure} == want
        ulp = float(bv.ulp_of(base.abs().max().item(), "float32"))
        kinds = set()
        for kind, s, out in bv.pw_bugs("group_norm", base, spread, (2, 8), torch.Generator().manual_seed(0), structure):
            kinds.add(kind)
            d = (out.double() - base.double()).abs().max().item()
            assert d == pytest.approx(s * spread, abs=ulp), (name, kind)
        assert kinds == {"whole tensor scaled", "constant offset", "one element off"} | want


def test_named_bugs_are_bugs(bv):
    """The dropped-term bugs differ from the exact gradient by far more than float32 rounding."""
    for fam, n in (("layer_norm", 256), ("softmax", 256), ("sdpa", 64), ("batch_norm[train]", 2048)):
        call, gout = bv.pb_call(fam, n, "randn", "float32", 0)
        good = bv._autograd(call, gout)
        exact = bv.pb_exact(call, gout)
        named = bv.pb_named(fam, call, gout, good)
        assert len(named) >= 3, fam
        for g, kind, out in named:
            ex = exact[g].reshape(out.shape)
            assert np.abs(out.double().numpy() - ex).max() > 1e-3 * np.abs(ex).max(), (fam, g, kind)


# ---------------------------------------------------------------- what the verdict must hold

# (family, n, data, dtype): quick cases (the module: 45 s on two cores at load 1.4), and the gradients judged per
# family (all, or those named where compare_backward is slow)
CASES = [
    ("softmax", 1024, "randn", "bfloat16"),
    ("softmax", 1024, "randn", "float32"),
    ("log_softmax", 1024, "randn", "float32"),
    ("layer_norm", 1024, "randn", "bfloat16"),
    ("layer_norm", 1024, "offset", "float32"),
    ("rms_norm", 1024, "randn", "float16"),
    ("group_norm", 1024, "randn", "bfloat16"),
    ("batch_norm[train]", 2048, "randn", "float16"),
    ("avg_pool2d", 3, "randn", "float32"),
    ("mean", 10_000, "randn", "bfloat16"),
    ("var", 4096, "offset", "bfloat16"),
    ("std", 10_000, "randn", "float32"),
    ("sdpa", 64, "randn", "bfloat16"),
    ("linear", 128, "randn", "bfloat16"),
    ("conv2d", 256, "randn", "float32"),
]
GRADS = {
    "softmax": ("input",),
    "log_softmax": ("input",),
    "layer_norm": ("input", "weight", "bias"),
    "rms_norm": ("input", "weight"),
    "group_norm": ("input", "weight", "bias"),
    "batch_norm[train]": ("input", "weight", "bias"),
    "avg_pool2d": ("input",),
    "mean": ("x",),
    "var": ("x",),
    "std": ("x",),
    "sdpa": ("key", "value"),
    "linear": ("weight", "bias"),
    "conv2d": ("bias",),
}
SCALES = (0.5, 8, 64)

# what the verdict fails today, measured (docs/analysis.md, "Power in absolute units", gradients): each a gap the
# benchmark shows, for the verdict to close
FALSE_ALARMS = {}
MISSES = {
    (CASES[7], "weight"): "one element off by 8.8x the spread is rounding: the half kernel's grad_weight is tested "
    "against the whole family's scale too (gradients._with_family), since torch's CPU bf16 batch_norm backward on an "
    "OpInfo sample is none of weight_members' emulations (421 sigma from the nearest, 0.37 sigma of that scale)",
    (CASES[1], "input"): "one row scaled by 8x and 16x the spread, the gradient by 16x, are rounding (detectable "
    "129 ulps over a spread of 116; 81 with the forward's half-ulp shared scale, the same misses)",
}
NAMED_BELOW = {}  # (linear bf16's weight: a constant offset of 0.5x named bf16 until the sign test, stats.asymmetric)


def _id(c, g):
    return f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{g}"


def _params(known):
    out = []
    for c in CASES:
        for g in GRADS[c[0]]:
            marks = [pytest.mark.xfail(strict=True, reason=known[c, g])] if (c, g) in known else []
            out.append(pytest.param(c, g, id=_id(c, g), marks=marks))
    return out


_ROWS = {}


def _rows(bv, c, g):
    if c not in _ROWS:
        fam, n, data, dtype = c
        _ROWS[c] = bv.pb_case(fam, n, data, dtype, 0, SCALES, log=lambda *a: None, grads=GRADS[fam])
    return [r for r in _ROWS[c] if r["grad"] == g]


def _text(rows):
    return [f"{r['name']}: {r['verdict']} {r['precision'] or ''} size {r.get('size', r.get('err')):.3g}" for r in rows]


@pytest.mark.parametrize("c,g", _params(FALSE_ALARMS))
def test_no_false_alarm(bv, c, g):
    rows = [r for r in _rows(bv, c, g) if r["truth"] == "correct"]
    assert len(rows) >= 4
    bad = [r for r in rows if bv._pb_alarm(r)]
    assert not bad, _text(bad)


@pytest.mark.parametrize("c,g", _params(MISSES))
def test_bugs_from_8x_the_spread_are_mismatches(bv, c, g):
    rows = [r for r in _rows(bv, c, g) if r["truth"] in ("bug", "named") and r["size"] >= 8]
    assert rows
    bad = [r for r in rows if r["verdict"] != "mismatch"]
    assert not bad, _text(bad)


@pytest.mark.parametrize("c,g", _params(NAMED_BELOW))
def test_nothing_below_the_spread_is_named_a_precision(bv, c, g):
    rows = [r for r in _rows(bv, c, g) if r["truth"] in ("bug", "named") and r["size"] < 1]
    if not rows:
        pytest.skip("rounding to the dtype swallows every bug below 1x the spread")
    bad = [r for r in rows if r["verdict"] == "reduced-precision"]
    assert not bad, _text(bad)
