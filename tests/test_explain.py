"""refkern.explain: two outputs of the same op, against the exact result and against each other."""

import doctest
import json

import numpy as np
import pytest

import refkern as rk
import refkern.analysis.explain as explain_module

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _linear_inputs(seed=1, m=16, k=512, n=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)


def test_fused_linear_against_matmul_plus_bias_is_rounding_within_both_bounds():
    x, w, b = _linear_inputs()
    e = rk.explain(F.linear(x, w, b), x @ w.T + b, "linear", x, w, b, names=("F.linear", "x @ W.T + b"))
    assert e.first.verdict in ("exact", "rounding") and e.second.verdict in ("exact", "rounding")
    assert e.within and 0 < e.differ < e.n_elements and 0 < e.max_pair_ratio <= 1
    assert e.sentence.startswith("F.linear is rounding and x @ W.T + b is rounding against the exact result")
    assert e.sentence.endswith("neither is a mistake.")
    text = str(e)
    assert text.splitlines()[0].startswith("F.linear     rounding")
    assert f"they differ in {e.differ} of {e.n_elements} elements" in text and "within the sum" in text
    assert text.splitlines()[-1] == f"why: {e.sentence}"


def test_bias_inside_or_after_the_sum():
    g = torch.Generator().manual_seed(23)
    x, w, b = torch.rand(1000, 1, 1, 1, generator=g), torch.rand(1, 1, 1, 1, generator=g), torch.rand(1, generator=g)
    e = rk.explain(F.conv2d(x, w, b), F.conv2d(x, w) + b, "conv2d", x, w, b, names=("inside", "after"))
    assert e.first.verdict == "exact" and e.second.verdict == "rounding" and e.within and e.differ > 0
    assert e.sentence.startswith("inside is exact and after is rounding against the exact result")


def test_a_wrong_output_takes_the_blame():
    x, w, b = _linear_inputs()
    good = F.linear(x, w, b)
    bad = good.clone()
    bad[3, 7] += 1.0
    e = rk.explain(good, bad, "linear", x, w, b, names=("cpu", "mine"))
    assert e.second.verdict == "mismatch" and not e.within and e.differ == 1
    assert e.sentence.startswith("the difference is mine's: mine is a mismatch against the exact result (1 element beyond")
    assert e.sentence.endswith("look for a bug in mine.")
    both = rk.explain(bad, bad + 0.5, "linear", x, w, b)
    assert both.sentence.startswith("neither computes this op on these inputs")


def test_reduced_precision_is_named_not_blamed():
    from refkern.accumulate.formats import TFLOAT32, round_array

    def tf32(t):
        return torch.from_numpy(round_array(t.double().numpy(), *TFLOAT32.params, False)).float()

    g = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(64, 1024, generator=g), torch.randn(128, 1024, generator=g), torch.randn(128, generator=g)
    e = rk.explain(F.linear(tf32(x), tf32(w), b), F.linear(x, w, b), "linear", x, w, b, names=("gpu", "cpu"))
    assert (e.first.verdict, e.first.precision) == ("reduced-precision", "tf32")
    assert e.sentence.startswith("gpu (tf32) computes in a reduced precision while cpu is rounding")
    assert "not a bug" in e.sentence


def test_identical_outputs():
    x, w, b = _linear_inputs(m=2, k=8, n=3)
    out = rk.linear(x, w, b)
    e = rk.explain(out, out.clone(), "linear", x, w, b)
    assert e.differ == 0 and e.max_diff == 0 and e.max_pair_ratio == 0 and e.within
    assert e.sentence == "a and b are identical, element for element; both are the correctly rounded result."


def test_numpy_outputs_and_json():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 256)).astype(np.float32), rng.standard_normal((4, 256)).astype(np.float32)
    e = rk.explain(rk.linear(x, w, accumulate="naive"), rk.linear(x, w, accumulate="pairwise"), "linear", x, w)
    d = json.loads(json.dumps(e.to_dict()))
    assert d["names"] == ["a", "b"] and d["within"] is True and d["first"]["verdict"] == "rounding"
    assert d["sentence"] == e.sentence


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda x, w: rk.explain(rk.linear(x, w), rk.linear(x[:1], w), "linear", x, w), ValueError, r"^explain: the two outputs must have the same shape; got a\.shape=\(2, 3\) and b\.shape=\(1, 3\)\. Pass two results of the same call\."),
        (lambda x, w: rk.explain(rk.linear(x, w), rk.linear(x, w), "linear", x, w, names="ab"), TypeError, r"^explain: names must be a pair of strings; got names='ab'\."),
    ],
)  # fmt: skip
def test_errors(call, exc, match):
    x, w = np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(exc, match=match):
        call(x, w)


def test_exported_and_docstring_example_runs():
    assert "explain" in rk.__all__ and rk.explain is explain_module.explain
    res = doctest.testmod(explain_module)
    assert res.attempted >= 5 and res.failed == 0
