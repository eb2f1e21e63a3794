"""refkern.backward for group_norm and batch_norm (training: batch statistics; eval: running statistics):
bit for bit against truth.backward (mpmath, the autograd formula) on hard cases, the fast path against
the exact path, within torch's float64 autograd, no false alarm on torch's CPU gradients in
fp32/fp16/bf16, injected gradient bugs caught, the envelopes' constants by hand, errors, and
refkern.torch.check judging them."""

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FLOAT32, FORMATS
from refkern.analysis import _envelope_backward as envb

torch = pytest.importorskip("torch")
F = torch.nn.functional
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_AND_32 = (torch.float32, torch.float16, torch.bfloat16)
INF = float("inf")


def _bits(t):
    return t.double().numpy().view(np.int64).tolist()


def _same(a, b):
    """Bit for bit, NaNs alike whatever their sign (IEEE leaves a NaN's sign to the order of operations)."""
    a, b = a.double().numpy(), b.double().numpy()
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and _bits(torch.from_numpy(np.where(nan, 0.0, a))) == _bits(
        torch.from_numpy(np.where(nan, 0.0, b))
    )


def _hard_cases(dtype):
    """(op, args, kwargs) with grad_output first: a constant group/channel, huge and tiny magnitudes, a
    large mean with a small spread, one-element groups (HW = 1, G = C), weight None, 2-D batch_norm
    input, eps = 0 (a zero variance: no real value), running_var + eps a rational square (rational
    gradients), a zero running variance, NaN/inf."""
    big = {torch.float16: 3.0e4, torch.bfloat16: 1e30, torch.float32: 1e30, torch.float64: 1e200}[dtype]
    tiny = {torch.float16: 1e-7, torch.bfloat16: 1e-35, torch.float32: 1e-40, torch.float64: 1e-300}[dtype]
    gen = torch.Generator().manual_seed(3)

    def t(v):
        return torch.tensor(v, dtype=torch.float64).to(dtype)

    def rnd(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)

    x = t([[[2.5, 2.5, 2.5], [2.5, 2.5, 2.5], [big, -big, 3.0], [0.5 * big, 1.0, -2.0]],
           [[tiny, -tiny, 0.0], [3 * tiny, 0.0, -2 * tiny], [1000.0, 1000.5, 999.75], [1000.25, 1000.0, 1000.0]]])  # fmt: skip
    g = rnd(2, 4, 3)
    w, b = rnd(4), rnd(4)
    rm, rv = t([0.5, -1.0, 1000.0, 0.0]), t([0.25, 2.0, 0.0, 1e-3])
    cases = [
        ("group_norm", (g, x, 2, w, b), {}),
        ("group_norm", (g, x, 4, None, None), {}),
        ("group_norm", (g, x, 1, w, None), {}),
        ("group_norm", (g[:, :, :1].contiguous(), x[:, :, :1].contiguous(), 4, w, b), {}),  # one element a group
        ("group_norm", (g, x, 2, w, b), {"eps": 0.0}),  # constant groups: 0 / 0
        ("batch_norm", (g, x, rm, rv, w, b), {"training": True}),
        ("batch_norm", (g, x, None, None, None, None), {"training": True}),
        ("batch_norm", (g[:, :, 0].contiguous(), x[:, :, 0].contiguous(), rm, rv, w, b), {"training": True}),  # (N, C)
        ("batch_norm", (g, x, rm, rv, w, b), {"training": True, "eps": 0.0}),
        ("batch_norm", (g, x, rm, rv, w, b), {"training": False}),
        ("batch_norm", (g, x, rm, rv, None, b), {"training": False, "eps": 0.0}),  # rv = 0.25: r = 2; rv = 0: inf
    ]
    xs = x.clone()
    xs[0, 2, 1] = INF
    xs[1, 0, 0] = float("nan")
    cases.append(("group_norm", (g, xs, 2, w, b), {}))
    cases.append(("batch_norm", (g, xs, rm, rv, w, b), {"training": True}))
    cases.append(("batch_norm", (g, xs, rm, rv, w, b), {"training": False}))
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_bit_identical_to_truth_on_hard_cases(dtype):
    for op, args, kw in _hard_cases(dtype):
        fast = rk.backward(op, *args, **kw)
        truth = rk.truth.backward(op, *args, **kw)
        assert set(fast) == set(truth)
        for k in fast:
            assert fast[k].dtype == truth[k].dtype and fast[k].shape == truth[k].shape
            assert _same(fast[k], truth[k]), (op, k, kw)


def test_rational_cases_are_exact():
    """eval mode with rv + eps a rational square: every gradient is a rational, rounded once."""
    x = torch.tensor([[1.0, 3.0], [2.0, -1.0]], dtype=torch.float64)
    g = torch.tensor([[0.5, 1.0], [-0.25, 3.0]], dtype=torch.float64)
    rm, rv = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.25, 4.0], dtype=torch.float64)
    w = torch.tensor([3.0, -1.0], dtype=torch.float64)
    out = rk.backward("batch_norm", g, x, rm, rv, w, None, training=False, eps=0.0)
    assert out["input"].tolist() == [[3.0, -0.5], [-1.5, -1.5]]  # g w / sqrt(rv): r = 2, 1/2
    assert out["weight"].tolist() == [(0.5 * 0 - 0.25 * 1) * 2, (1.0 * 3 + 3.0 * -1) / 2]
    assert out["weight"][1].item() == 0.0


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_fast_path_agrees_with_the_exact_path(dtype):
    from refkern.kernels.norm_backward import norm_backward_rows

    fmt = FORMATS[str(dtype)[6:]]
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(8, 12, generator=gen, dtype=torch.float64) * 5 + 30).to(dtype).double().numpy()
    g = torch.randn(8, 12, generator=gen, dtype=torch.float64).to(dtype).double().numpy()
    w = torch.randn(2, 12, generator=gen, dtype=torch.float64).to(dtype).double().numpy()
    fm = {"input": fmt, "weight": fmt, "bias": fmt}
    wrt = ("input", "weight", "bias")

    def regroup(a):  # group_norm's layout: N = 4, G = 2, C = 6, hw = 4
        return a.reshape(4, 6, 4).transpose(0, 2, 1).reshape(16, 6)

    fast = norm_backward_rows(x, g, w, True, 1e-5, fm, wrt, regroup=regroup)
    slow = norm_backward_rows(x, g, w, True, 1e-5, fm, wrt, force_exact=True, regroup=regroup)
    for k in wrt:
        assert np.array_equal(fast[k], slow[k]), k


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _torch_grads(op, g, x, args, kw):
    """torch's gradients of F.group_norm(x, G, w, b) / F.batch_norm(x, rm, rv, w, b, training)."""
    xl = _leaf(x)
    if op == "group_norm":
        ng, w, b = args
        wl, bl = _leaf(w), _leaf(b)
        F.group_norm(xl, ng, wl, bl, **kw).backward(g)
    else:
        rm, rv, w, b = args
        wl, bl = _leaf(w), _leaf(b)
        rm = None if rm is None else rm.clone()
        rv = None if rv is None else rv.clone()
        F.batch_norm(xl, rm, rv, wl, bl, **kw).backward(g)
    got = {"input": xl.grad}
    got.update({k: v.grad for k, v in (("weight", wl), ("bias", bl)) if v is not None})
    return got


def _cases(dtype, seed):
    """(op, x, args, kwargs) over shapes (4-D, 3-D, 2-D), groups, affine or not, train/eval."""
    gen = torch.Generator().manual_seed(seed)
    scale, off = ((1.0, 0.0), (100.0, 50.0), (1e-3, 0.0))[seed % 3]
    for shape in ((3, 6, 4, 4), (2, 4, 9), (16, 4)):
        c = shape[1]
        x = (torch.randn(shape, generator=gen) * scale + off).to(dtype)
        w, b = torch.randn(c, generator=gen).to(dtype), torch.randn(c, generator=gen).to(dtype)
        rm = (torch.randn(c, generator=gen) * scale + off).to(dtype)
        rv = (torch.rand(c, generator=gen) * scale**2 + 0.1).to(dtype)
        yield "group_norm", x, (2, w, b), {}
        yield "group_norm", x, (c, None, None), {}
        yield "batch_norm", x, (rm, rv, w, b), {"training": True}
        yield "batch_norm", x, (None, None, w, None), {"training": True}
        yield "batch_norm", x, (rm, rv, w, b), {"training": False}


def test_within_torch_float64_autograd():
    """torch's float64 gradients are a correct float64 implementation: within the float64 envelope."""
    n = 0
    for seed in range(2):
        for op, x, args, kw in _cases(torch.float64, seed):
            g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 7), dtype=torch.float64)
            got = _torch_grads(op, g, x, args, kw)
            ref = rk.backward(op, g, x, *args, **kw)
            for k, rep in rk.compare_backward(got, op, g, x, *args, **kw).items():
                assert rep.verdict in ("exact", "rounding"), (op, kw, k, rep.max_bound_ratio)
                assert (ref[k] - got[k]).abs().max().item() <= 1e-9 * max(1.0, ref[k].abs().max().item())
                n += 1
    assert n == 2 * 3 * (3 + 1 + 3 + 2 + 3)


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
def test_no_false_alarms_on_torch_cpu_gradients(dtype):
    """Seeds (data regimes: unit, x100 + 50, x1e-3) x shapes x group_norm (2 groups with affine, one
    group per channel without) x batch_norm (training with and without running statistics, eval):
    every gradient torch's CPU computes is judged exact or rounding."""
    judged = 0
    for seed in range(3):
        for op, x, args, kw in _cases(dtype, seed):
            g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
            got = _torch_grads(op, g, x, args, kw)
            for k, rep in rk.compare_backward(got, op, g, x, *args, **kw).items():
                assert rep.verdict in ("exact", "rounding"), (seed, op, tuple(x.shape), kw, k, rep.max_bound_ratio)
                judged += 1
    assert judged == 3 * 3 * (3 + 1 + 3 + 2 + 3)


def _buggy(op, x, g, args, kw, bug):
    """float64 gradients from the autograd formula with one injected bug."""
    x, g = x.double(), g.double()
    if op == "group_norm":
        ng, w, _ = args
        n, c = x.shape[:2]
        xr, gr = x.reshape(n, ng, -1), g.reshape(n, ng, -1)
        wr = w.double().repeat_interleave(x[0, 0].numel()).reshape(1, ng, -1)
        dims = -1
        if bug == "groups_as_channels":  # a group_norm whose statistics span one channel only
            xr, gr = x.reshape(n, c, -1), g.reshape(n, c, -1)
            wr = w.double().reshape(1, c, 1)
    else:
        rm, rv, w, _ = args
        c = x.shape[1]
        xr = x.transpose(0, 1).reshape(c, -1)
        gr = g.transpose(0, 1).reshape(c, -1)
        wr = w.double().reshape(c, 1)
        dims = -1
    if op == "batch_norm" and not kw["training"] and bug != "batch_stats_in_eval":
        r = (rv.double() + 1e-5).rsqrt().reshape(-1, 1)
        xh = (xr - rm.double().reshape(-1, 1)) * r
        gi = gr * wr * r
    else:
        if bug == "per_sample_stats":  # batch_norm's statistics taken per sample instead of over the batch
            xs = xr.reshape(c, x.shape[0], -1)
            mu = xs.mean(-1, keepdim=True)
            r = (((xs - mu) ** 2).mean(-1, keepdim=True) + 1e-5).rsqrt()
            mu, r = mu.expand_as(xs).reshape(c, -1), r.expand_as(xs).reshape(c, -1)
        else:
            mu = xr.mean(dims, keepdim=True)
            r = (((xr - mu) ** 2).mean(dims, keepdim=True) + 1e-5).rsqrt()
        xh = (xr - mu) * r
        gw = gr * wr
        a = 0.0 if bug == "no_mean" else gw.mean(dims, keepdim=True)
        gi = r * (gw - a - xh * (gw * xh).mean(dims, keepdim=True))
    if op == "group_norm":
        gi = gi.reshape(x.shape)
        gwt = (g * xh.reshape(x.shape)).sum(dim=[0, *range(2, x.ndim)])
        if bug == "first_sample_only":
            gwt = (g[:1] * xh.reshape(x.shape)[:1]).sum(dim=[0, *range(2, x.ndim)])
    else:
        gi = gi.reshape(c, x.shape[0], *x.shape[2:]).transpose(0, 1)
        gwt = (gr * xh).sum(-1)
        if bug == "first_sample_only":  # the batch reduction stopped after the first sample
            gwt = (gr * xh)[:, : gr.shape[1] // x.shape[0]].sum(-1)
    return gi, gwt


BUGS = {
    ("group_norm", None): ("no_mean", "groups_as_channels", "first_sample_only"),
    ("batch_norm", True): ("no_mean", "per_sample_stats", "first_sample_only"),
    ("batch_norm", False): ("batch_stats_in_eval", "first_sample_only"),
}


@pytest.mark.parametrize("dtype", HALF_AND_32, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("which", list(BUGS), ids=lambda w: f"{w[0]}-{w[1]}")
def test_gradient_bugs_are_caught(which, dtype):
    op, training = which
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 6, 3, 3, generator=gen) * 3 + 1).to(dtype)
    g = torch.randn(4, 6, 3, 3, generator=gen).to(dtype)
    w = torch.randn(6, generator=gen).to(dtype)
    if op == "group_norm":
        args, kw = (2, w, None), {}
    else:
        args = (torch.randn(6, generator=gen).to(dtype), (torch.rand(6, generator=gen) + 0.5).to(dtype), w, None)
        kw = {"training": training}
    gi, gwt = _buggy(op, x, g, args, kw, None)
    reps = rk.compare_backward({"input": gi.to(dtype), "weight": gwt.to(dtype)}, op, g, x, *args, **kw)
    assert all(r.verdict in ("exact", "rounding") for r in reps.values())  # the harness itself is sound
    for bug in BUGS[which]:
        gi, gwt = _buggy(op, x, g, args, kw, bug)
        k = "weight" if bug == "first_sample_only" else "input"
        got = {"input": gi.to(dtype)} if k == "input" else {"weight": gwt.to(dtype)}
        assert rk.compare_backward(got, op, g, x, *args, **kw)[k].verdict == "mismatch", bug


def test_envelope_constants_by_hand():
    assert envb.BLOCK_ROUNDINGS == 3
    assert envb.BATCH_INPUT_ROUNDINGS == 9
    assert envb.EVAL_INPUT_ROUNDINGS == 2
    u = 2.0**-24

    def gamma(k, uu):  # refkern.analysis.envelope._gamma: k u / (1 - k u) (1 + 4 k u)
        return k * uu / (1 - k * uu) * (1 + 4 * k * uu)

    def store(E, ref):
        return (E * (1 + 8 * u) + u * (2 * ref * (1 + 2 * u) + E) + 2 * 2.0**-150) * (1.0 + 2.0**-40)

    # batch_norm eval, grad_input of one float32 element: g = 2, w = 3, rv + eps = 4 (eps = 0): r = 1/2,
    # e_z = u * 4 (1 + u), move = e_z / (2 (4 - e_z)**1.5), R1 = r (1 + 2u) + move, e_r = move + 2u R1
    ez = u * 4.0 * (1 + u)
    move = ez / (2 * (4.0 - ez) ** 1.5)
    R1 = 0.5 * (1 + 2 * u) + move
    e_r = move + 2 * u * R1
    E = 6.0 * (e_r + 2 * u * R1) + 2 * 2.0**-126
    fm = {"input": FLOAT32, "weight": FLOAT32, "bias": FLOAT32}
    got = envb.batch_norm_eval_bound("input", np.array([[1.0]]), np.array([[2.0]]), np.array([[3.0]]),
                                     np.array([0.0]), np.array([4.0]), 0.0, np.array([[3.0]]), fm)  # fmt: skip
    assert got[0, 0] == pytest.approx(store(E, 3.0), rel=1e-12, abs=0)
    # its grad_bias over K = 3 terms g = 1, 2, 4: gamma_2(u) * 7
    got = envb.batch_norm_eval_bound("bias", np.zeros((1, 3)), np.array([[1.0, 2.0, 4.0]]), None, np.array([0.0]),
                                     np.array([4.0]), 0.0, np.array([7.0]), fm)  # fmt: skip
    assert got[0] == pytest.approx(store(gamma(2, u) * 7.0, 7.0), rel=1e-12, abs=0)
    # group_norm's grad_bias: the T = N hw terms of a channel, gamma_{T-1}: N = 2, C = 2 (one group each), hw = 2
    X = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])  # rows (n, group), hw = 2
    G = np.array([[1.0, 2.0], [1.0, 1.0], [4.0, 8.0], [1.0, 1.0]])

    def regroup(a):
        return a.reshape(2, 2, 2).transpose(0, 2, 1).reshape(4, 2)

    got = envb.norm_bound("group_norm", "bias", X, G, None, 1e-5, np.array([15.0, 4.0]), fm, regroup=regroup, block=2)
    assert got[0] == pytest.approx(store(gamma(3, u) * 15.0, 15.0), rel=1e-12, abs=0)
    # the same in bfloat16 with the sums in opmath (half_sums=False): (gamma_3(2**-24) + 2**-8) * 15, the
    # store in bfloat16 (u_o = 2**-8, eta_o = 2**-134), the second order in the working unit 2**-24
    from refkern.accumulate.formats import BFLOAT16

    fb = {"input": BFLOAT16, "bias": BFLOAT16}
    E = (gamma(3, u) + 2.0**-8) * 15.0
    want = (E * (1 + 8 * u) + 2.0**-8 * (2 * 15.0 * (1 + 2 * 2.0**-8) + E) + 2 * 2.0**-134) * (1.0 + 2.0**-40)
    got = envb.norm_bound("group_norm", "bias", X, G, None, 1e-5, np.array([15.0, 4.0]), fb, regroup=regroup, block=2,
                          half_sums=False)  # fmt: skip
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)


def test_group_norm_weight_envelope_by_hand():
    """One float32 group of two elements x = (-1, 1) (mean 0, var 1, eps 0: r = 1), g = (2, 3): grad_weight's
    envelope in the raw block form (block = 2, opmath sums) written out step by step (module docstring of
    _envelope_backward, steps 1 and 4 with the block's gamma_{hw+3})."""
    import math

    u = 2.0**-24

    def gamma(k, uu):
        return k * uu / (1 - k * uu) * (1 + 4 * k * uu)

    dmu = gamma(2, u) * 1.0  # gamma_n A, A = mean|x| = 1
    e_m2 = gamma(5, u) * math.sqrt(2.0) * math.sqrt(2.0) + 2 * dmu**2 + 2 * 2.0**-149
    e_w = e_m2 / 2 + u * 1.0 + u * 1.0  # e_v = e_m2 / n + ua var, e_w = e_v + ua z
    e_r = max(1 / math.sqrt(1 - e_w) - 1, 1 - 1 / math.sqrt(1 + e_w)) + 2 * u
    R1, D, xm = 1 + e_r, 1 + dmu, 1 + dmu  # |d| = |x| = 1, mu = 0
    e_xh = e_r * D + dmu + gamma(2 + 3, u) * R1 * xm
    E = 5.0 * e_xh + gamma(2, u) * 5.0 * (1 + e_xh) + 2 * 2 * 2.0**-126
    ref = 1.0  # -2 + 3
    want = (E * (1 + 8 * u) + u * (2 * ref * (1 + 2 * u) + E) + 2 * 2.0**-150) * (1 + 2.0**-40)
    fm = {"input": FLOAT32, "weight": FLOAT32}
    got = envb.norm_bound("group_norm", "weight", np.array([[-1.0, 1.0]]), np.array([[2.0, 3.0]]), None, 0.0,
                          np.array([ref]), fm, regroup=lambda a: a.reshape(1, 1, 2).transpose(0, 2, 1).reshape(2, 1),
                          block=2, half_sums=False)  # fmt: skip
    assert got[0] == pytest.approx(want, rel=1e-9, abs=0)


def test_errors():
    x, g = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match=r"^backward: the 4 channels of input must divide into num_groups=3"):
        rk.backward("group_norm", g, x, 3)
    with pytest.raises(ValueError, match=r"^backward: num_groups must be a positive int; got 0"):
        rk.backward("group_norm", g, x, 0)
    with pytest.raises(ValueError, match=r"^backward: expected weight of shape \(4,\)"):
        rk.backward("group_norm", g, x, 2, torch.ones(3))
    with pytest.raises(ValueError, match=r"^backward: batch_norm expects more than 1 value per channel when training"):
        rk.backward("batch_norm", torch.randn(1, 4), torch.randn(1, 4), None, None, training=True)
    with pytest.raises(ValueError, match=r"^backward: batch_norm needs running_mean and running_var"):
        rk.backward("batch_norm", g, x, None, None, training=False)
    with pytest.raises(ValueError, match=r"^backward: batch_norm has no differentiable argument 'running_mean'"):
        rk.backward("batch_norm", g, x, torch.zeros(4), torch.ones(4), wrt="running_mean")
    with pytest.raises(ValueError, match=r"^backward: grad_output must have the shape of the output of group_norm"):
        rk.backward("group_norm", torch.randn(2, 4), x, 2)


def test_only_the_gradients_asked_for():
    gen = torch.Generator().manual_seed(2)
    x, g = torch.randn(3, 4, 5, generator=gen), torch.randn(3, 4, 5, generator=gen)
    w, b = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    for op, args, kw in (("group_norm", (x, 2, w, b), {}), ("batch_norm", (x, None, None, w, b), {"training": True})):
        out = rk.backward(op, g, *args, wrt=("weight",), **kw)
        assert set(out) == {"weight"}
        full = rk.backward(op, g, *args, **kw)
        assert torch.equal(out["weight"], full["weight"])
        assert torch.equal(full["bias"], rk.sum(g, dim=(0, 2)))  # grad_bias is the exact sum over (N, spatial)


def test_check_judges_group_and_batch_norm_gradients():
    rkt = pytest.importorskip("refkern.torch")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 5, generator=gen)
    w, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    res = rkt.check(F.group_norm, x, 3, w, b, devices=["cpu"], backward=True)
    assert sorted(r.argument for r in res.grads) == ["bias", "input", "weight"]
    assert all(r.report is not None and r.report.verdict in ("exact", "rounding") for r in res.grads)
    for m in (torch.nn.GroupNorm(2, 6), torch.nn.BatchNorm1d(6), torch.nn.BatchNorm1d(6).eval()):
        res = rkt.check(m, x.bfloat16() if isinstance(m, torch.nn.GroupNorm) else x, devices=["cpu"], backward=True)
        assert len(res.grads) == 3, m
        assert all(r.report is not None and r.report.verdict in ("exact", "rounding") for r in res.grads), m


def test_mixed_precision_and_empty_batches():
    """A half input with float32 parameters and running statistics (autocast's BatchNorm, a float32
    GroupNorm on bfloat16 activations): each gradient in its argument's dtype, judged without a false
    alarm; an empty batch gives empty and zero gradients, as torch."""
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 6, 5, generator=gen) * 3 + 2).bfloat16()
    g = torch.randn(4, 6, 5, generator=gen).bfloat16()
    w, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    rm, rv = torch.randn(6, generator=gen), torch.rand(6, generator=gen) + 0.5
    for op, args, kw in (("batch_norm", (rm, rv, w, b), {"training": True}),
                         ("batch_norm", (rm, rv, w, b), {"training": False}), ("group_norm", (3, w, b), {})):  # fmt: skip
        got = _torch_grads(op, g, x, args, kw)
        assert got["input"].dtype == torch.bfloat16 and got["weight"].dtype == torch.float32
        for k, rep in rk.compare_backward(got, op, g, x, *args, **kw).items():
            assert rep.verdict in ("exact", "rounding"), (op, kw, k, rep.max_bound_ratio)
        ref = rk.backward(op, g, x, *args, **kw)
        assert ref["input"].dtype == torch.bfloat16 and ref["weight"].dtype == ref["bias"].dtype == torch.float32
    e = torch.zeros(0, 4, 3)
    for op, args, kw in (("group_norm", (2, torch.ones(4), torch.ones(4)), {}),
                         ("batch_norm", (torch.zeros(4), torch.ones(4), torch.ones(4), None), {"training": False})):  # fmt: skip
        out = rk.backward(op, e, e, *args, **kw)
        assert out["input"].shape == (0, 4, 3) and torch.equal(out["weight"], torch.zeros(4))
