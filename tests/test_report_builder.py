"""One Report builder (issue 25, item 2): every route (compare's statistical test, compare's envelopes,
compare_backward's envelope judges, the elementwise yardstick) builds its Report through
refkern.analysis.report.build, so counts, worst, worst_details, where, tolerance and notes mean the same
thing on each. Checked on inputs whose reports are known by hand: a result equal to the exact one, and
the same result with one element off by 1.0 (0.5 for the gradient)."""

import numpy as np
import pytest

from refkern.analysis import report as rp
from refkern.analysis.compare import compare
from refkern.gradients import compare_backward

_DETAIL = ["index", "actual", "reference", "ulp", "bound_ratio", "test_ratio", "condition"]


def _matmul():  # small integers: every product and sum exact in float32
    a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    b = np.arange(8, dtype=np.float32).reshape(4, 2) - 3
    return "matmul", (a, b), {}, (a.astype(np.float64) @ b).astype(np.float32), (1, 1)


def _sum():
    x = np.arange(15, dtype=np.float32).reshape(3, 5) - 4
    return "sum", (x,), {"dim": 1}, x.astype(np.float64).sum(1).astype(np.float32), (2,)


def _exp():  # exp(0) = 1, sqrt of squares: exact
    x = np.array([[0.0, 1.0, 4.0], [9.0, 16.0, 0.25]], np.float32)
    return "sqrt", (x,), {}, np.sqrt(x), (0, 2)


def _loss():  # |x - t| of small binary fractions: exact in float32 (analysis.losses' envelope)
    x = np.array([[0.0, 0.5, -1.0], [2.0, 0.25, -0.125]], np.float32)
    t = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]], np.float32)
    return "l1_loss", (x, t), {"reduction": "none"}, np.abs(x - t), (1, 2)


ROUTES = {"statistical": _matmul, "envelope": _sum, "elementwise": _exp, "loss": _loss}


def _hand(exact, at, delta):
    bad = exact.copy()
    bad[at] += delta
    return bad


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_exact_result_reads_the_same_on_every_route(route):
    op, args, kw, exact, _ = ROUTES[route]()
    rep = compare(exact, op, *args, rtol=0.0, atol=0.0, **kw)
    assert rep.verdict == "exact" and rep.precision is None
    assert rep.counts == {"exact": exact.size, "rounding": 0, "reduced-precision": 0, "mismatch": 0}
    assert rep.worst == [] and rep.worst_details == [] and rep.where == {}
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.0, "failing": 0, "failing_explained_by_rounding": 0}
    assert rep.max_ulp == 0.0 and rep.max_bound_ratio == 0.0 and rep.max_prob_ratio == 0.0
    assert compare(exact, op, *args, **kw).tolerance is None  # without rtol/atol: no tolerance


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_one_bad_element_reads_the_same_on_every_route(route):
    op, args, kw, exact, at = ROUTES[route]()
    bad = _hand(exact, at, 1.0)
    rep = compare(bad, op, *args, atol=0.5, **kw)
    assert rep.verdict == "mismatch"
    assert rep.counts["mismatch"] == 1 and rep.counts["exact"] == exact.size - 1
    assert rep.worst[0] == at
    w = rep.worst_details[0]
    assert list(w)[: len(_DETAIL)] == _DETAIL
    assert (w["index"], w["actual"], w["reference"]) == (list(at), float(bad[at]), float(exact[at]))
    assert w["bound_ratio"] > 1 and w["test_ratio"] > 1
    # the one tolerance rule: |actual - reference| <= atol + rtol |reference|, elements equal pass
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.5, "failing": 1, "failing_explained_by_rounding": 0}
    assert compare(bad, op, *args, atol=1.0, **kw).tolerance["failing"] == 0
    rel = compare(bad, op, *args, rtol=1.0 / abs(float(exact[at])) * 0.99, **kw).tolerance
    assert rel["failing"] == 1 and rel["rtol"] == pytest.approx(0.99 / abs(float(exact[at])))
    # where: the positions of the unexplained element, along each axis
    assert [v["positions"] for v in rep.where.values()] == [[i] for i in at]
    assert rep.notes[: len(rep.structure)] == [s["text"] for s in rep.structure]  # the structure found first


def test_gradient_route_reads_the_same():
    """mean's gradient g / 4 over 4 columns is exact in float32; one element off by 0.5 is the mismatch."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = np.array([4.0, -8.0, 12.0], np.float32)
    exact = np.repeat(g[:, None] / 4, 4, axis=1).astype(np.float32)
    rep = compare_backward({"x": exact}, "mean", g, x, 1, rtol=0.0, atol=0.0)["x"]
    assert rep.verdict == "exact" and rep.counts["exact"] == 12 and rep.worst == []
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.0, "failing": 0, "failing_explained_by_rounding": 0}
    bad = _hand(exact, (1, 2), 0.5)
    rep = compare_backward({"x": bad}, "mean", g, x, 1, atol=0.25)["x"]
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] == 1 and rep.worst[0] == (1, 2)
    w = rep.worst_details[0]
    assert list(w) == _DETAIL and (w["actual"], w["reference"]) == (-1.5, -2.0)
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.25, "failing": 1, "failing_explained_by_rounding": 0}
    assert rep.where == {}  # the gradients' envelope judges name no axes (yet): no where


def test_tolerance_rule():
    err = rp.errors(np.array([1.0, np.nan, np.inf, 2.0, np.nan]), np.array([1.0, np.nan, 1.0, 1.5, 1.0]),
                    np.array([True, True, False, False, False]))  # fmt: skip
    assert err.tolist() == [0.0, 0.0, np.inf, 0.5, np.inf]
    ref = np.array([1.0, np.nan, 1.0, 1.5, 1.0])
    cls = np.array([0, 0, 3, 1, 3], np.int8)
    assert rp.tolerance(err, ref, cls, None, None) is None
    # allclose's rule (equal_nan=False): a NaN reference fails, NaN or not
    assert rp.tolerance(err, ref, cls, 0.25, None) == {"rtol": 0.25, "atol": 0.0, "failing": 4,
                                                       "failing_explained_by_rounding": 1}  # fmt: skip
    assert rp.tolerance(err, ref, cls, 0.0, 0.5)["failing"] == 3  # 0.5 <= 0.5 passes
    # an infinity equal to its reference passes with rtol=0 (0 * inf is NaN; torch's isclose: equal is close)
    inf = np.array([np.inf, -np.inf, np.inf])
    e = rp.errors(np.array([np.inf, -np.inf, 1e38]), inf, np.array([True, True, False]))
    assert e.tolist() == [0.0, 0.0, np.inf]
    for rt in (None, 0.0, 1e-3):
        assert rp.tolerance(e, inf, np.zeros(3, np.int8), rt, 1.0)["failing"] == 1


def test_an_equal_infinity_passes_the_tolerance_on_every_route():
    x = np.array([1.0, 100.0, 2.0], np.float32)  # exp(100) overflows float32
    with np.errstate(over="ignore"):
        y = np.exp(x.astype(np.float64)).astype(np.float32)
    rep = compare(y, "exp", x, atol=1e-3)
    assert rep.tolerance["failing"] == 0
    s = np.array([[3e38, 3e38], [1.0, 2.0]], np.float32)  # the first row's sum overflows
    rep = compare(np.array([np.inf, 3.0], np.float32), "sum", s, dim=1, atol=1e-3)
    assert rep.tolerance["failing"] == 0


def test_build_fills_every_field_from_the_decision():
    classes = np.array([[0, 1], [3, 1]], np.int8)
    rep = rp.build(op="x", device="numpy", dtype="float32", shape=(2, 2), n_terms=3, verdict="mismatch",
                   precision=None, classes=classes, actual=np.array([[1.0, 2.0], [9.0, 4.0]]),
                   reference=np.array([[1.0, 2.5], [3.0, 4.5]]), top=np.array([2, 1]),
                   at_worst={"ulp": np.array([6.0, 0.5]), "condition": 1.0}, max_ulp=6.0, max_bound_ratio=7.0,
                   max_prob_ratio=8.0, hypotheses={}, bound_ratios={}, alternatives=["fp16", "bf16", "fp16"],
                   structure=[{"kind": "k", "text": "found"}], error=lambda: np.array([[0.0, 0.5], [6.0, 0.5]]),
                   atol=1.0, axes=("row", "col"), notes=["mine"])  # fmt: skip
    assert rep.counts == {"exact": 1, "rounding": 2, "reduced-precision": 0, "mismatch": 1}
    assert rep.worst == [(1, 0), (0, 1)]
    assert rep.worst_details[0] == {"index": [1, 0], "actual": 9.0, "reference": 3.0, "ulp": 6.0, "condition": 1.0}
    assert rep.where["row"]["positions"] == [1] and rep.where["col"]["positions"] == [0]
    assert rep.tolerance == {"rtol": 0.0, "atol": 1.0, "failing": 1, "failing_explained_by_rounding": 0}
    assert rep.notes == ["found", "mine"] and rep.alternatives == ["bf16", "fp16"]
    assert rep.condition == {"median": 1.0, "max": 1.0} and rep.detectable == {} and rep.thresholds == {}
    assert rep.n_terms == 3 and rep.shape == (2, 2)


def test_bit_report_reads_like_a_report():
    """The audit's bit-for-bit result: the same verdicts, counts and pass rule as a Report."""
    ok, bad = rp.BitReport(10, 0, 0.0), rp.BitReport(10, 2, 3.0, (1,))
    assert (ok.verdict, bad.verdict) == (rp.VERDICTS[0], rp.VERDICTS[-1])
    assert ok.counts == {"exact": 10, "rounding": 0, "reduced-precision": 0, "mismatch": 0}
    assert bad.counts == {"exact": 8, "rounding": 0, "reduced-precision": 0, "mismatch": 2}
    assert list(bad.counts) == list(rp.VERDICTS) and bad.n_elements == 10
    assert ok.explained and not bad.explained
    assert rp.passes(ok.verdict, ok.precision, ("exact",)) and not rp.passes(bad.verdict, bad.precision, ("exact",))
    assert bad.to_dict() == {"verdict": "mismatch", "kind": "bitwise", "n": 10, "n_diff": 2, "max_ulp": 3.0,
                             "first": (1,)}  # fmt: skip


_X = np.array([[0.0, 0.5, -1.0], [2.0, 0.25, -0.125]], np.float32)
_T = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, 4.0]], np.float32)
#: the gradient routes that analysis.losses and analysis.elementwise_grad judge: (op, args, kwargs)
GRAD_ROUTES = {
    "mse_loss": ((_X, _T), {"reduction": "none"}),
    "nll_loss": ((_X, np.array([0, 2])), {"reduction": "none"}),
    "tanh": ((_X,), {}),
    "sigmoid": ((_X,), {}),
}


def _grad_case(op, inf_at=None):
    args, kw = GRAD_ROUTES[op]
    g = np.array([[1.0, 2.0, -4.0], [0.5, 0.5, 1.0]] if op != "nll_loss" else [3.0, -2.0], np.float32)
    if inf_at is not None:  # an infinite grad_output: an infinite gradient, the same in the reference
        g[inf_at] = np.inf
    from refkern.gradients import backward

    with np.errstate(all="ignore"):
        exact = backward(op, g, *args, **kw)["input"]
    return g, args, kw, np.asarray(exact)


@pytest.mark.parametrize("op", sorted(GRAD_ROUTES))
def test_loss_and_elementwise_gradients_read_the_same(op):
    """analysis.losses and analysis.elementwise_grad build their Reports with report.from_decision/build:
    the same counts, worst, worst_details and tolerance rule as every route."""
    g, args, kw, exact = _grad_case(op)
    rep = compare_backward({"input": exact}, op, g, *args, rtol=0.0, atol=0.0, **kw)["input"]
    assert rep.verdict == "exact" and rep.counts["exact"] == exact.size and rep.worst == []
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.0, "failing": 0, "failing_explained_by_rounding": 0}
    at = (1, 2)  # nll_loss: the second row's target
    bad = _hand(exact, at, 0.5)
    rep = compare_backward({"input": bad}, op, g, *args, atol=0.25, **kw)["input"]
    assert rep.verdict == "mismatch" and rep.counts["mismatch"] == 1 and rep.worst[0] == at
    w = rep.worst_details[0]
    assert list(w)[: len(_DETAIL)] == _DETAIL and (w["actual"], w["reference"]) == (float(bad[at]), float(exact[at]))
    assert rep.tolerance == {"rtol": 0.0, "atol": 0.25, "failing": 1, "failing_explained_by_rounding": 0}
    assert compare_backward({"input": bad}, op, g, *args, atol=0.75, **kw)["input"].tolerance["failing"] == 0
    assert rep.where == {} or [v["positions"] for v in rep.where.values()] == [[i] for i in at]
    assert rep.notes[: len(rep.structure)] == [s["text"] for s in rep.structure]


@pytest.mark.parametrize("op", sorted(GRAD_ROUTES))
@pytest.mark.parametrize("rtol", [None, 0.0, 1e-3])
def test_an_equal_infinity_passes_the_tolerance_on_the_gradient_routes(op, rtol):
    """torch's isclose: an element equal to its reference passes, an infinity included (0 * inf is NaN: the
    routes' own copies of the rule failed it), whatever rtol; an infinite error fails."""
    g, args, kw, exact = _grad_case(op, inf_at=0 if op == "nll_loss" else (0, 0))
    assert np.isinf(exact).sum() == 1
    rep = compare_backward({"input": exact}, op, g, *args, rtol=rtol, atol=1e-3, **kw)["input"]
    assert rep.verdict == "exact" and rep.tolerance["failing"] == 0
    finite = np.where(np.isinf(exact), np.float32(3e38) * np.sign(exact), exact).astype(np.float32)
    rep = compare_backward({"input": finite}, op, g, *args, rtol=rtol, atol=1e-3, **kw)["input"]
    assert rep.tolerance["failing"] == 1


@pytest.mark.parametrize("rtol", [None, 0.0, 1e-3])
def test_an_equal_infinity_passes_the_tolerance_on_the_loss_route(rtol):
    x = _X.copy()
    x[0, 1] = np.inf
    y = np.abs(x - _T)
    rep = compare(y, "l1_loss", x, _T, reduction="none", rtol=rtol, atol=1e-3)
    assert rep.verdict == "exact" and rep.tolerance["failing"] == 0
