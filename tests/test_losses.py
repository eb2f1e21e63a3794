"""nll_loss and cross_entropy: the references against the mpmath truth, the yardstick against torch's CPU
results (no false alarm) and against injected bugs, its bound written by hand, errors."""

import math

import numpy as np
import pytest

import refkern as rk
from refkern.truth import losses as truth

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPTIONS = ({}, {"weight": True}, {"label_smoothing": 0.1}, {"weight": True, "label_smoothing": 0.3})


def _data(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    C = shape[0] if len(shape) == 1 else shape[1]
    t = torch.randint(0, C, () if len(shape) == 1 else (shape[0], *shape[2:]), generator=g)
    if t.dim():
        t.view(-1)[::3] = -100
    w = torch.rand(C, generator=g).to(dtype)
    p = torch.softmax(torch.randn(*shape, generator=g), 0 if len(shape) == 1 else 1).to(dtype)
    return x, t, w, p


def _kw(opt, w):
    return {k: (w if k == "weight" else v) for k, v in opt.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 2), (5,)])
def test_references_equal_the_truth(dtype, shape):
    x, t, w, p = _data(dtype, shape)
    for target in (t, p):
        for opt in OPTIONS:
            for red in ("mean", "sum", "none"):
                kw = _kw(opt, w)
                got = np.asarray(rk.cross_entropy(x, target, reduction=red, **kw).double())
                assert np.array_equal(got, truth.cross_entropy(x, target, reduction=red, **kw), equal_nan=True)
    lp = torch.log_softmax(x.float(), -1 if len(shape) == 1 else 1).to(dtype)
    for red in ("mean", "sum", "none"):
        for kw in ({}, {"weight": w}):
            got = np.asarray(rk.nll_loss(lp, t, reduction=red, **kw).double())
            assert np.array_equal(got, truth.nll_loss(lp, t, reduction=red, **kw), equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES[:3])
def test_nll_loss_sum_and_mean_of_many_rows_equal_the_truth(dtype):
    """The float32-held path (exact float64 products, a float64 mean bracketed, the exact path where the bracket
    straddles a rounding boundary) against mpmath: 2000 rows, weights of both signs, ignored rows."""
    g = torch.Generator().manual_seed(5)
    lp = (torch.randn(2000, 7, generator=g) * torch.exp(torch.randn(2000, 1, generator=g) * 2)).to(dtype)
    t = torch.randint(0, 7, (2000,), generator=g)
    t[::5] = -100
    w = torch.randn(7, generator=g).to(dtype)
    assert torch.isfinite(lp).all()  # every value finite: the path under test, not IEEE's special sums
    for red in ("sum", "mean"):
        for kw in ({}, {"weight": w}):
            got = np.asarray(rk.nll_loss(lp, t, reduction=red, **kw).double())
            assert np.array_equal(got, truth.nll_loss(lp, t, reduction=red, **kw))


def test_nll_loss_mean_at_a_tie_is_rounded_to_even():
    """-x_t = 1 and 1 + 2**-23 (float32): the mean 1 + 2**-24 is the midpoint of 1 and 1 + 2**-23, which the
    float64 quotient holds exactly: the bracket straddles it, the exact path rounds it to even, 1.0; with
    1 + 2**-23 twice and 1 + 2**-22 once the mean is 1 + (2**-22 + 2**-22) / 3 = 1 + 4/3 2**-23, nearest
    1 + 2**-23 (the fast path decides it)."""
    one_up = 1 + 2.0**-23
    lp = torch.tensor([[-1.0, 0.0], [0.0, -one_up]])
    assert rk.nll_loss(lp, torch.tensor([0, 1])).item() == 1.0
    lp = torch.tensor([[-one_up], [-one_up], [-(1 + 2.0**-22)]])
    assert rk.nll_loss(lp, torch.tensor([0, 0, 0])).item() == 1 + 2.0**-23


def test_special_values_as_torch():
    x = torch.tensor([[0.0, 1.0, -math.inf], [math.nan, 0.0, 1.0], [2.0, 2.0, 2.0], [5.0, -math.inf, -math.inf]])
    t = torch.tensor([2, 0, 1, 0])
    for red in ("none", "sum", "mean"):
        want = np.asarray(F.cross_entropy(x, t, reduction=red))
        got = np.asarray(rk.cross_entropy(x, t, reduction=red).double())
        assert np.array_equal(got, truth.cross_entropy(x, t, reduction=red), equal_nan=True), red
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want)), red
    t_ign = torch.full((4,), -100)  # every row ignored: 0 rows, a mean of 0 / 0
    assert rk.cross_entropy(x, t_ign, reduction="sum").item() == 0.0
    assert math.isnan(rk.cross_entropy(x, t_ign).item()) and math.isnan(truth.cross_entropy(x, t_ign))
    # log(3) exactly for equal logits, 0 for one finite logit
    assert rk.cross_entropy(x[2:], t[2:], reduction="none", ).tolist() == [np.float32(math.log(3)), 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_is_no_false_alarm(dtype):
    x, t, w, p = _data(dtype, (64, 40), seed=1)
    for target in (t, p):
        for opt in OPTIONS:
            for red in ("mean", "sum", "none"):
                kw = _kw(opt, w)
                rep = rk.compare(F.cross_entropy(x, target, reduction=red, **kw), "cross_entropy", x, target,
                                 reduction=red, **kw)  # fmt: skip
                assert rep.verdict in ("exact", "rounding"), (target.dtype, opt, red, str(rep))
    lp = torch.log_softmax(x.float(), 1).to(dtype)
    for red in ("mean", "sum", "none"):
        rep = rk.compare(F.nll_loss(lp, t, weight=w, reduction=red), "nll_loss", lp, t, weight=w, reduction=red)
        assert rep.verdict in ("exact", "rounding"), (red, str(rep))


def test_float16_smoothing_overflow_is_accepted_and_named():
    x, t, _, _ = _data(torch.float16, (256, 100), seed=2)
    y = F.cross_entropy(x, t, label_smoothing=0.1)
    assert torch.isinf(y)  # torch's smooth_loss.sum() overflows float16
    rep = rk.compare(y, "cross_entropy", x, t, label_smoothing=0.1)
    assert rep.verdict == "rounding" and any("exceeds its range" in n for n in rep.notes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bugs_are_mismatches(dtype):
    x, t, w, _ = _data(dtype, (128, 30), seed=3)
    ign = t == -100
    x[ign] = (x[ign].float() * 4).to(dtype)  # padding positions: logits unlike the others (as in a language model)
    for red in ("mean", "sum"):
        t0 = torch.where(ign, 0, t)  # nll_loss that ignores ignore_index: the ignored rows counted as class 0
        assert rk.compare(F.cross_entropy(x, t0, reduction=red), "cross_entropy", x, t, reduction=red).verdict == \
            "mismatch"  # fmt: skip
        lp = torch.log_softmax(x.float(), 1).to(dtype)
        assert rk.compare(F.nll_loss(lp, t0, reduction=red), "nll_loss", lp, t, reduction=red).verdict == "mismatch"
    over_all = (F.cross_entropy(x, t, reduction="sum").float() / t.numel()).to(dtype)  # mean over every row
    assert rk.compare(over_all, "cross_entropy", x, t).verdict == "mismatch"
    none = F.cross_entropy(x, t, reduction="none")
    none[ign] = 0.5  # an ignored row must be exactly 0
    assert rk.compare(none, "cross_entropy", x, t, reduction="none").verdict == "mismatch"


def test_bound_written_by_hand():
    """nll_loss float32 sum of three products: gamma_2(u) (1 + 8u) sum|w x| * 1.01 + u_out |y| + eta."""
    from refkern.analysis.losses import envelope
    from refkern.kernels._loss_call import loss_call

    x = np.array([[-1.0, -2.0], [-0.5, -3.0], [-4.0, -0.25]], np.float32)
    t = np.array([0, 1, 1])
    c = loss_call("nll_loss", x, t, reduction="sum")
    b, notes, over = envelope(c, c.fmt)
    u = 2.0**-24
    mag = 1.0 + 3.0 + 0.25
    g2 = 2 * u / (1 - 2 * u) * (1 + 8 * u)
    # per row: ua |nll| (the product); the sum: gamma_2 sum |nll|; y = 4.25, stored once (float32)
    want = (u * mag + g2 * mag) * 1.01 + (u * 4.25 + 2.0**-150)
    assert float(b) == pytest.approx(want, abs=0)
    assert not notes and not over


def _softmax_envelope(X, fmt):
    """The log_softmax envelope of :mod:`refkern.analysis._envelope_softmax` (with its centre's rounding and
    store), from the correctly rounded log_softmax: what cross_entropy's yardstick charged before its one-pass
    kernel."""
    from refkern.analysis._envelope_ops import layout
    from refkern.analysis.envelope import _one
    from refkern.analysis.losses import _units
    from refkern.kernels.softmax import softmax_rows

    u, u_m, _ = _units(fmt)
    ref, _ = softmax_rows(X, fmt, True)
    lay = layout("log_softmax", {"input": X, "dim": 1}, X.shape)
    return np.asarray(_one(lay, u + u_m, u_m, False, ref, fmt, store=True), np.float64).reshape(X.shape)


@pytest.mark.parametrize("fmt_name", ["float32", "bfloat16", "float16", "float64"])
def test_one_pass_log_softmax_envelope_is_the_softmax_envelope(fmt_name):
    """The per-row kernel (:mod:`refkern.kernels._loss_bound`) charges what the log_softmax envelope charges,
    element by element, within the float64 evaluation of either (never below it by more than that): rows with
    -inf entries, NaN and +inf, ties, one finite logit, only -inf, long rows (every radix digit moves)."""
    from refkern.accumulate import formats
    from refkern.kernels import _loss_bound as lb
    from refkern.kernels.loss import log_sums

    fmt = getattr(formats, fmt_name.upper())
    rng = np.random.default_rng(3)
    X = rng.standard_normal((24, 2500)) * np.array([0.01, 2.0, 40.0])[np.arange(24) % 3, None]
    X = formats.round_array(np.ascontiguousarray(X), *fmt.params)
    X[3, 5] = -np.inf
    X[4] = -np.inf
    X[5, 7] = np.nan
    X[6, 9] = np.inf
    X[7] = 0.0
    X[8, :100] = X[8, 0]
    X[9] = -np.inf
    X[9, 3] = 1.5
    X[10, ::2] = -X[10, 1::2]
    old = _softmax_envelope(X, fmt)
    stats = lb.logsoftmax_rows(X, log_sums(X), fmt)
    new = np.stack([lb.pick_bounds(X, stats, np.full(X.shape[0], j), fmt) for j in range(X.shape[1])], axis=1)
    fin = np.isfinite(old)
    assert np.array_equal(np.isfinite(new), fin)
    assert np.all(np.abs(new[fin] / old[fin] - 1) <= 1e-12)
    w = rng.random(X.shape[1])
    with np.errstate(invalid="ignore"):
        want = (w[None, :] * old).sum(axis=1)
    got = lb.row_sums(X, *log_sums(X)[:2], stats, w, None, 0.0, fmt)[:, 2]
    ok = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), ok)
    assert np.all(np.abs(got[ok] / want[ok] - 1) <= 1e-12)


def test_one_pass_log_softmax_envelope_written_by_hand():
    """Two equal float32 logits (0, 0): log p = -log 2 each. M = 0, gap 0, dl = 2**-52, top = 2**-52, theta =
    dl + 3u (top + dl), rank 1 for both (ties), lam_d = theta + lg(2 (40u) + (1 + 2 - 1) u), lam_n = theta +
    lg(2 (40u) + 3u), D = 2, ED = 2 expm1(lam_d), a = 6 n eta e**(2 lam_n) D, ell = lg((ED + a) / D), err_l =
    ell + 8u (log 2 + ell) + eta, c = u (log 2 + err_l), o = (RN32(log 2) + h) / (1 - u), b = (err_l + c + u (o
    + err_l + c)) (1 + 66 2**-50) + 3 dl + (u o + h) + (u RN32(log 2) + h), u = 2**-24, eta = 2**-126, h =
    2**-149."""
    from refkern.accumulate.formats import FLOAT32
    from refkern.kernels import _loss_bound as lb
    from refkern.kernels.loss import log_sums

    u, eta, h, dl = 2.0**-24, 2.0**-126, 2.0**-149, 2.0**-52

    def lg(s):
        return -math.log1p(-s)

    theta = dl + 3 * u * (2 * dl)
    lam_d, lam_n = theta + lg(80 * u + 2 * u), theta + lg(80 * u + 3 * u)
    ED, a = 2 * math.expm1(lam_d), 6 * 2 * eta * math.exp(2 * lam_n) * 2
    ell = lg((ED + a) / 2)
    err_l = ell + 8 * u * (math.log(2) + ell) + eta
    c = u * (math.log(2) + err_l)
    ref = float(np.float32(math.log(2)))
    o = (ref + h) / (1 - u)
    want = (err_l + c + u * (o + err_l + c)) * (1 + 66 * 2.0**-50) + 3 * dl + (u * o + h) + (u * ref + h)
    X = np.zeros((1, 2))
    got = lb.pick_bounds(X, lb.logsoftmax_rows(X, log_sums(X), FLOAT32), np.array([1]), FLOAT32)[0]
    assert got == pytest.approx(want, rel=1e-14)


def test_errors_name_the_argument():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"^cross_entropy: reduction must be one of"):
        rk.cross_entropy(x, torch.tensor([0, 1, 2, 0]), reduction="avg")
    with pytest.raises(IndexError, match=r"^nll_loss: target 3 is out of bounds"):
        rk.nll_loss(x, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match=r"^cross_entropy: target must have shape \(4,\)"):
        rk.cross_entropy(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^cross_entropy: weight must have shape \(C,\) = \(3,\)"):
        rk.cross_entropy(x, torch.tensor([0, 1, 2, 0]), weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"^cross_entropy: label_smoothing must be a number in \[0, 1\]"):
        rk.cross_entropy(x, torch.tensor([0, 1, 2, 0]), label_smoothing=1.5)
    with pytest.raises(TypeError, match=r"^nll_loss: target must hold class indices"):
        rk.nll_loss(x, torch.rand(4, 3))
    with pytest.raises(ValueError, match=r"^cross_entropy: input must have at least one class"):
        rk.cross_entropy(torch.zeros(3, 0), torch.full((3,), -100))


def test_the_audit_judges_nll_loss_forward():
    from refkern.torch import audit

    x, t, _, _ = _data(torch.float32, (16, 10), seed=4)
    with audit() as a:
        F.cross_entropy(x, t)
    names = {c.op for c in a.calls if c.verdict is not None}
    assert "nll_loss" in names and "log_softmax" in names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 10), (4, 10, 3), (10,)])
def test_nll_loss_gradient(dtype, shape):
    """Reference == truth; torch's CPU gradient exact or rounding; ignore_index ignored in the backward a
    mismatch."""
    import refkern.truth

    g0 = torch.Generator().manual_seed(5)
    x = torch.log_softmax(torch.randn(*shape, generator=g0), 0 if len(shape) == 1 else 1).to(dtype)
    C = shape[0] if len(shape) == 1 else shape[1]
    t = torch.randint(0, C, () if len(shape) == 1 else (shape[0], *shape[2:]), generator=g0)
    if t.dim():
        t.view(-1)[::4] = -100
    w = torch.rand(C, generator=g0).to(dtype)
    for red in ("none", "sum", "mean"):
        def grad(target, red=red):
            xx = x.clone().requires_grad_()
            y = F.nll_loss(xx, target, weight=w, reduction=red)
            gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
            y.backward(gy)
            return xx.grad, gy

        got, g = grad(t)
        kw = dict(weight=w, reduction=red)
        ref = rk.backward("nll_loss", g, x, t, **kw)["input"]
        assert np.array_equal(ref.double().numpy(), refkern.truth.backward("nll_loss", g, x, t, **kw)["input"])
        rep = rk.compare_backward({"input": got}, "nll_loss", g, x, t, **kw)["input"]
        assert rep.verdict in ("exact", "rounding"), str(rep)
        if t.dim():
            bug, _ = grad(torch.where(t == -100, 0, t))
            assert rk.compare_backward({"input": bug}, "nll_loss", g, x, t, **kw)["input"].verdict == "mismatch"


def test_nll_gradient_bound_written_by_hand():
    """mean over two counted rows of weights 1 and 3 (float32): |y| (e_D / (D - e_D) + gamma_2(u)) * 1.01 + u |y|
    + eta, e_D = gamma_1(u) (1 + 3)."""
    from refkern.analysis.losses import grad_bound
    from refkern.kernels.loss_grad import nll_grad, nll_grad_call

    x = np.zeros((3, 2), np.float32)
    t = np.array([0, 1, -100])
    w = np.array([1.0, 3.0], np.float32)
    c, G = nll_grad_call(np.float32(1.0), dict(input=x, target=t, weight=w), "test")
    ref = nll_grad(c, G)
    b = grad_bound(c, G, ref)
    u = 2.0**-24
    g1, g2 = u / (1 - u) * (1 + 4 * u), 2 * u / (1 - 2 * u) * (1 + 8 * u)
    eD = g1 * 4.0
    y = 3.0 / 4.0
    assert ref[1, 1] == -0.75 and ref[2].tolist() == [0.0, 0.0] and ref[0, 1] == 0.0
    assert b[1, 1] == pytest.approx(y * (eD / (4.0 - eD) + g2) * 1.01 + u * y + 2.0**-150, abs=0)
    assert b[0, 1] == 0.0 and b[2, 0] == 0.0


def test_the_audit_judges_nll_loss_backward():
    from refkern.torch import audit

    x, t, _, _ = _data(torch.float32, (16, 10), seed=4)
    x.requires_grad_()
    with audit() as a:
        F.cross_entropy(x, t).backward()
    judged = {c.op: c.verdict for c in a.calls}
    assert judged.get("nll_loss backward") in ("exact", "rounding"), judged
