"""compare(): verdicts on outputs whose truth is known, the Report, and the pytest helper."""

import json

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, TFLOAT32

torch = pytest.importorskip("torch")
from torchdata import rounded, seeded  # noqa: E402

F = torch.nn.functional


# ----------------------------------------------------------------- no false alarms


def _random_case(rng, i):
    kind = i % 3
    if kind == 0:  # conv2d
        n, c, h, w = rng.integers(1, 3), rng.integers(1, 9), rng.integers(3, 10), rng.integers(3, 10)
        k = int(rng.integers(1, 4))
        cout = int(rng.integers(1, 9))
        x, wt, b = torch.randn(n, c, h, w), torch.randn(cout, c, k, k), torch.randn(cout)
        kw = dict(stride=int(rng.integers(1, 3)), padding=int(rng.integers(0, 2)))
        return F.conv2d(x, wt, b, **kw), ("conv2d", x, wt, b), kw
    k = int(rng.choice([1, 7, 64, 300, 2048]))
    x, wt, b = torch.randn(int(rng.integers(1, 6)), k), torch.randn(int(rng.integers(1, 12)), k), torch.randn(1)
    b = torch.randn(wt.shape[0])
    if kind == 1:
        return F.linear(x, wt, b), ("linear", x, wt, b), {}
    return x @ wt.T + b, ("linear", x, wt, b), {}  # two roundings: still within the bound


def test_no_false_alarms_on_torch_cpu_float32():
    """torch's own float32 CPU conv2d, linear and x @ W.T + b over 540 random shapes (K up to
    2048) are 'rounding' or 'exact', never anything else. The rate is printed for the record."""
    torch.manual_seed(1234)
    rng = np.random.default_rng(1234)
    verdicts = {}
    bad = []
    for i in range(540):
        out, (op, *args), kw = _random_case(rng, i)
        rep = rk.compare(out, op, *args, **kw)
        verdicts[rep.verdict] = verdicts.get(rep.verdict, 0) + 1
        if rep.verdict not in ("exact", "rounding"):
            bad.append((i, op, tuple(args[0].shape), tuple(args[1].shape), str(rep)))
    print(f"\nverdicts on 540 torch CPU float32 outputs: {verdicts}; false alarms: {len(bad)}")
    assert not bad, bad[:3]


def test_reference_against_itself_is_exact():
    r = seeded("self")
    x, w, b = r(2, 3, 8, 8), r(4, 3, 3, 3), r(4)
    assert rk.compare(rk.conv2d(x, w, b, padding=1), "conv2d", x, w, b, padding=1).verdict == "exact"
    a, bb = np.random.default_rng(0).standard_normal((2, 5, 7)), np.random.default_rng(1).standard_normal((7, 3))
    assert rk.compare(rk.matmul(a, bb), rk.matmul, a, bb).verdict == "exact"
    assert rk.compare(rk.dot(a[0, 0], a[1, 0]), "dot", a[0, 0], a[1, 0]).verdict == "exact"


def test_heavy_cancellation_fails_allclose_but_is_rounding():
    """The classic 'numpy float32 conv2d reference vs torch' question: rtol=1e-4 flags
    elements with cancellation; both are ordinary float32 rounding."""
    r = seeded("cancel")
    x, w, b = r(1, 16, 28, 28), r(8, 16, 5, 5), r(8)
    numpy_like = rk.conv2d(x, w, b, accumulate="naive", accum_dtype="float32")  # a plain float32 loop
    rep = rk.compare(numpy_like, "conv2d", x, w, b, rtol=1e-4, atol=0)
    assert rep.verdict == "rounding"
    assert rep.tolerance["failing"] > 0
    assert rep.tolerance["failing_explained_by_rounding"] == rep.tolerance["failing"]
    torch_out = F.conv2d(x, w, b)
    rep = rk.compare(torch_out, "conv2d", x, w, b, rtol=1e-4, atol=0)
    assert rep.verdict in ("rounding", "exact")


# -------------------------------------------------------------- reduced precision


@pytest.mark.parametrize("k", [96, 2000])
@pytest.mark.parametrize("fmt,name", [(TFLOAT32, "tf32"), (BFLOAT16, "bf16")])
@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("accumulation", ["exact", "fp32"])
def test_reduced_precision_inputs_are_named(k, fmt, name, truncate, accumulation):
    r = seeded("rp", k, name, truncate, accumulation)
    x, w, b = r(16, k), r(24, k), r(24)
    xr, wr = rounded(x, fmt, truncate), rounded(w, fmt, truncate)
    out = rk.linear(xr, wr, b) if accumulation == "exact" else F.linear(xr, wr, b)
    rep = rk.compare(out, "linear", x, w, b)
    assert (rep.verdict, rep.precision) == ("reduced-precision", name), str(rep)


def test_fp16_accumulation_is_not_rounding():
    r = seeded("fp16acc")
    x, w, b = r(8, 256), r(16, 256), r(16)
    out = rk.linear(x, w, b, accumulate="naive", accum_dtype="float16")
    rep = rk.compare(out, "linear", x, w, b)
    assert rep.verdict != "rounding" and rep.verdict != "exact"
    assert (rep.verdict, rep.precision) == ("reduced-precision", "fp16"), str(rep)


def test_half_outputs_are_judged_in_their_own_format():
    r = seeded("half")
    x, w = r(4, 64), r(8, 64)
    out = F.linear(x.bfloat16(), w.bfloat16())  # bf16 in, bf16 out, fp32 accumulation
    assert rk.compare(out, "linear", x.bfloat16(), w.bfloat16()).verdict in ("exact", "rounding")


# --------------------------------------------------------------------- injected bugs


def _conv_case():
    r = seeded("bugs")
    return r(2, 4, 10, 10), r(6, 4, 3, 3), r(6)


def test_missing_input_channel():
    x, w, b = _conv_case()
    out = F.conv2d(x[:, :3], w[:, :3], b, padding=1)
    assert rk.compare(out, "conv2d", x, w, b, padding=1).verdict == "mismatch"


def test_dropped_bias():
    x, w, b = _conv_case()
    rep = rk.compare(F.conv2d(x, w, None, padding=1), "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch"
    assert rep.where["channel"]["text"].startswith("all 6")


def test_output_shifted_by_one_column():
    x, w, b = _conv_case()
    out = torch.roll(F.conv2d(x, w, b, padding=1), shifts=1, dims=3)
    rep = rk.compare(out, "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch"


def test_untransposed_weight():
    r = seeded("untransposed")
    x, w, b = r(5, 32), r(32, 32), r(32)
    rep = rk.compare(x @ w + b, "linear", x, w, b)
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] > 100


@pytest.mark.parametrize("k", [27, 2048])
def test_one_perturbed_element_is_first(k):
    r = seeded("perturb", k)
    x, w, b = r(16, k), r(32, k), r(32)
    out = F.linear(x, w, b)
    out[7, 11] *= 1 + 1e-3
    rep = rk.compare(out, "linear", x, w, b)
    assert rep.verdict == "mismatch"
    assert rep.worst[0] == (7, 11)
    assert rep.counts["mismatch"] == 1


def test_where_shows_a_bad_border():
    x, w, b = _conv_case()
    out = F.conv2d(x, w, b, padding=1)
    out[..., -1] = 1.0  # a border written wrong
    rep = rk.compare(out, "conv2d", x, w, b, padding=1)
    assert rep.verdict == "mismatch"
    assert rep.where["col"]["positions"] == [9]
    assert "col: 9 (of 10)" in str(rep)


# ------------------------------------------------------------------- the report itself


def test_report_fields_and_json():
    x, w, b = _conv_case()
    out = F.conv2d(x, w, b, padding=1)
    out[0, 0, 0, 0] = float("nan")
    rep = rk.compare(out, rk.conv2d, x, w, b, padding=1, rtol=1e-6, atol=1e-6)
    assert rep.verdict == "mismatch" and rep.worst[0] == (0, 0, 0, 0)
    d = rep.to_dict()
    text = json.dumps(d)
    back = json.loads(text)
    assert back["verdict"] == "mismatch" and back["max_ulp"] == "inf"
    assert set(back) >= {"verdict", "precision", "max_ulp", "max_bound_ratio", "worst", "counts", "where", "tolerance"}
    assert set(back["bound_ratios"]) == {"fp64", "fp32", "tf32", "fp16", "bf16"}
    assert sum(back["counts"].values()) == out.numel()
    assert "conv2d on cpu (float32): mismatch" in str(rep)
    assert "<div" in rep._repr_html_()


def test_bound_ratios_order_the_precisions():
    """A TF32 result is beyond the fp32 scale and within the tf32 and bf16 ones."""
    r = seeded("ratios")
    x, w = r(8, 64), r(8, 64)
    out = F.linear(rounded(x, TFLOAT32, False), rounded(w, TFLOAT32, False))
    br = rk.compare(out, "linear", x, w).bound_ratios
    assert br["fp32"]["worst_case"] > 1 >= br["tf32"]["worst_case"] >= br["bf16"]["worst_case"]
    assert br["fp64"]["worst_case"] > br["fp32"]["worst_case"]


def test_assert_matches_reference_message():
    x, w, b = _conv_case()
    out = F.conv2d(x, w, b, padding=1)
    rk.assert_matches_reference(out, "conv2d", x, w, b, padding=1)
    out[0, 3, 7, 1] += 0.5
    with pytest.raises(AssertionError) as e:
        rk.assert_matches_reference(out, "conv2d", x, w, b, padding=1)
    msg = str(e.value)
    assert msg.startswith("conv2d on cpu (float32) does not match the exact reference: mismatch\n")
    assert "Mismatched elements: 1 / 1200 (0.1%) not explained by fp32 rounding" in msg
    assert "Worst: index (0, 3, 7, 1)" in msg


def test_allow_a_precision():
    r = seeded("allow")
    x, w = r(8, 128), r(8, 128)
    out = F.linear(rounded(x, TFLOAT32, False), rounded(w, TFLOAT32, False))
    with pytest.raises(AssertionError):
        rk.assert_matches_reference(out, "linear", x, w)
    rep = rk.assert_matches_reference(out, "linear", x, w, allow=("exact", "rounding", "tf32"))
    assert rep.precision == "tf32"


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: rk.compare(np.ones(3), "conv4d", np.ones(3)), ValueError, r"^compare: unknown op='conv4d'; choose one of 'dot', 'matmul', 'linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d'"),
        (lambda: rk.compare(np.ones((2, 2)), "matmul", np.ones((2, 3)), np.ones((3, 3))), ValueError, r"^compare: actual\.shape=\(2, 2\) differs from the shape matmul gives for these inputs, \(2, 3\)"),
        (lambda: rk.compare(np.ones(2, np.int64), "dot", np.ones(2), np.ones(2)), TypeError, r"^compare: an integer result \(actual\.dtype=int64\) is judged only from integer inputs; argument 0 of dot is float64\.$"),
        (lambda: rk.compare(np.ones(()), "dot", np.ones(2), np.ones(2), accumulate="naive"), ValueError, r"^compare: accumulate= is not an argument of the op"),
        (lambda: rk.compare(np.ones(()), "dot", np.ones(2)), TypeError, r"^compare: dot takes \(x, y\); missing a required argument: 'y'"),
        (lambda: rk.compare(np.ones((1, 1, 3, 3)), "conv2d", np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1)), paddin=1), TypeError, r"^compare: conv2d has no argument 'paddin'\. Did you mean padding=\?$"),
    ],
)  # fmt: skip
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------------- regressions found in review


def test_emulations_take_transposed_and_broadcast_inputs():
    r = seeded("transposed")
    x, w = r(8, 64), r(16, 64)
    out = rounded(x, TFLOAT32, False) @ rounded(w, TFLOAT32, False).T
    rep = rk.compare(out, "matmul", x, w.T)  # a transposed view: the emulation must not need C order
    assert (rep.verdict, rep.precision) == ("reduced-precision", "tf32")


def test_an_outlier_among_exact_elements_is_found():
    r = seeded("outlier-exact")
    x, w = r(32, 2048), r(32, 2048)
    out = rk.linear(x, w).clone()  # every element exact...
    out[3, 5] += 0.1  # ...but one, inside the loose worst-case bound at K = 2048
    rep = rk.compare(out, "linear", x, w)
    assert rep.verdict == "mismatch" and rep.worst[0] == (3, 5) and rep.counts["mismatch"] == 1
    assert rep.counts["exact"] == out.numel() - 1 and "implausible as rounding" in rep.notes[0]


def test_counts_cover_every_element_when_outliers_break_a_reduced_precision_fit():
    r = seeded("counts")
    x, w = r(32, 256), r(32, 256)
    out = F.linear(rounded(x, TFLOAT32, False), rounded(w, TFLOAT32, False))
    out[3, 5] += 0.05
    rep = rk.compare(out, "linear", x, w)
    assert sum(rep.counts.values()) == out.numel()


def test_every_hypothesis_tried_is_reported():
    r = seeded("keys")
    x, w = r(8, 64), r(8, 64)
    rep = rk.compare(F.linear(x, w) + 1.0, "linear", x, w)
    assert rep.verdict == "mismatch"
    assert {"rounding", "tf32", "tf32, ties away", "tf32, truncated", "tf32 tensor cores", "tf32 tensor cores, truncated",
            "fp16 inputs", "bf16 inputs", "bf16 inputs, truncated",
            "fp16 autocast", "bf16 autocast", "fp16 accumulation (left-to-right)", "fp16 accumulation (pairwise)",
            "bf16 accumulation (left-to-right)", "bf16 accumulation (pairwise)"} == set(rep.hypotheses)


def test_axis_names_follow_the_operands():
    r = seeded("axes")
    a, v = r(4, 6, 16), r(16)
    out = (a @ v).clone()
    out[1, 2] += 1.0
    assert list(rk.compare(out, "matmul", a, v).where) == ["batch0", "row"]
    out = F.linear(a, v).clone()
    out[1, 2] += 1.0
    assert list(rk.compare(out, "linear", a, v).where) == ["dim0", "dim1"]


def test_one_bad_element_in_a_tf32_result_is_a_mismatch():
    """TF32 explains every element but one: that one is the anomaly, not fp16 accumulation."""
    r = seeded("tf32-one-bad")
    x, w = r(32, 256), r(32, 256)
    out = F.linear(rounded(x, TFLOAT32, False), rounded(w, TFLOAT32, False))
    out[3, 5] += 0.05
    rep = rk.compare(out, "linear", x, w)
    assert rep.verdict == "mismatch" and rep.worst[0] == (3, 5) and rep.counts["mismatch"] == 1
    assert sum(rep.counts.values()) == out.numel()
