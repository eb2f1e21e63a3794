"""The GEMMs' order term (refkern.analysis.partials): the block bound against partial sums formed one by
one (an independent loop per element), the lane check, and the verdict's power and false alarms with it."""

import numpy as np
import pytest
import torch

import refkern as rk
from refkern.analysis.evaluate import problem
from refkern.analysis.partials import (
    BLOCK_MAX,
    BLOCK_MIN,
    CHECK_SAMPLE,
    LANES,
    SPLITS,
    _other_sq,
    _partials,
    block_size,
    gemm_partials,
    order_bound,
    partials_and_magnitudes,
    reference_and_partials,
)
from refkern.analysis.verdict import sample_indices


def test_constants_are_pinned():
    assert (BLOCK_MIN, BLOCK_MAX) == (4, 32)
    # the power of two nearest sqrt(K) / 2: K = 100 -> 5 -> 4; 320 -> 8.9 -> 8; 1024 -> 16; 4096 -> 32; 10**6 -> 32
    assert [block_size(k) for k in (1, 16, 100, 320, 1024, 4096, 10**6)] == [4, 4, 4, 8, 16, 32, 32]
    assert LANES == (2, 4, 8, 16, 32, 64)
    assert SPLITS == (2, 4, 8)
    assert CHECK_SAMPLE == 256


def test_hand_example():
    # a = b = (1, 1, 1, 1), blocks of 2: S = (2, 2), A = (2, 2); left = (0 + 2)**2 + (2 + 2)**2 = 20, right the
    # same; 2 * 20 + sum t**2 (4) + M**2 (16) = 60, under the order-free (n + 1) M**2 = 80
    a, b = np.ones((1, 4), np.float32), np.ones((4, 1), np.float32)
    pr = problem("matmul", (a, b), {})
    _, mag = pr.run(want_mag=True)
    assert gemm_partials(pr, mag, block=2).item() == pytest.approx(60.0, abs=0)
    assert gemm_partials(pr, mag, block=32).item() == pytest.approx(80.0, abs=0)  # one padded block: 32 * 32 > 80
    assert gemm_partials(pr, mag).item() == pytest.approx(80.0, abs=0)  # B = 4: 4 * 16 + 4 + 16 = 84 > 80


def _sq_partials(t, order):
    """sum of squares of every rounded value of a float64-exact run over the products ``t``: products, then the
    partial sums of ``order`` (a list of index arrays summed left to right, their results summed in turn)."""
    total = float((t * t).sum())
    results = []
    for chunk in order:
        s = 0.0
        for i, k in enumerate(chunk):
            s += t[k]
            if i:
                total += s * s
        results.append(s)
    s = results[0]
    for r in results[1:]:
        s += r
        total += s * s
    return total


@pytest.mark.parametrize("data", ["randn", "relu", "positive", "offset"])
def test_bound_holds_for_the_orders_backends_use(data):
    g = np.random.default_rng(7)
    K = 700
    a = {
        "randn": g.standard_normal((6, K)),
        "relu": np.maximum(g.standard_normal((6, K)), 0),
        "positive": g.random((6, K)),
        "offset": 300 + g.standard_normal((6, K)),
    }[data].astype(np.float32)
    b = g.standard_normal((K, 5)).astype(np.float32)
    pr = problem("matmul", (a, b), {})
    _, mag = pr.run(want_mag=True)
    bound = gemm_partials(pr, mag)
    ks = np.arange(K)
    orders = {"left to right": [ks], "right to left": [ks[::-1]],
              "split-K 256": [ks[i : i + 256] for i in range(0, K, 256)],
              "blocks of 32 reversed inside": [ks[i : i + 32][::-1] for i in range(0, K, 32)]}  # fmt: skip
    for i in range(6):
        for j in range(5):
            t = a[i].astype(np.float64) * b[:, j].astype(np.float64)
            for name, order in orders.items():
                assert _sq_partials(t, order) <= bound[i, j], (data, name, i, j)
            assert bound[i, j] <= (K + 1) * mag[i, j] ** 2  # never above the order-free bound
    if data == "randn":  # where signs mix, the bound is far under the order-free one
        assert np.median(bound / ((K + 1) * mag**2)) < 0.05


def test_other_orders_by_hand():
    # t = (1, -1, 1, -1): 2 lanes left to right hold (1, 2) and (-1, -2): 1 + 4 + 1 + 4 = 10, their totals (2, -2)
    # by a tree 0, in order 4 + 0 = 4 -> 14; right to left the same; split in 2: (1, 0) and (1, 0) -> 2, then the
    # chunks' results (0, 0) -> 0; the terms' own order: (1, 0, 1, 0) -> 2; the largest is 14
    assert _other_sq(np.array([[1.0, -1.0, 1.0, -1.0]]), (2,)).tolist() == [14.0]


def _other_sq_by_hand(t, lanes, splits):
    """Every order of _other_sq's docstring run one addition at a time (Python floats), the squares of the
    partial sums listed and summed with math.fsum."""
    import math

    K = len(t)
    runs = []
    for seq in (list(t), list(t[::-1])):
        p, sq = 0.0, []
        for v in seq:
            p += v
            sq.append(p * p)
        runs.append(sq)
    for L in lanes:
        if L >= K:
            break
        for seq in (list(t), list(t[::-1])):
            seq = seq + [0.0] * (-K % L)
            acc, sq = [0.0] * L, []
            for k, v in enumerate(seq):
                acc[k % L] += v
                sq.append(acc[k % L] ** 2)
            c, inorder = 0.0, []
            for v in acc:
                c += v
                inorder.append(c * c)
            v, tree = acc, []
            while len(v) > 1:
                v = [v[i] + (v[i + 1] if i + 1 < len(v) else 0.0) for i in range(0, len(v), 2)]
                tree += [x * x for x in v]
            runs.append(sq + max(inorder, tree, key=math.fsum))
    for c in splits:
        if c >= K:
            break
        seq = list(t) + [0.0] * (-K % c)
        w = len(seq) // c
        sq, res, r = [], [], 0.0
        for i in range(c):
            p = 0.0
            for v in seq[i * w : (i + 1) * w]:
                p += v
                sq.append(p * p)
            r += p
            res.append(r * r)
        runs.append(sq + res)
    return max(math.fsum(x) for x in runs)


@pytest.mark.parametrize("K", [3, 5, 8, 37, 64, 65, 130])
def test_other_orders_against_one_addition_at_a_time(K):
    # the jitted check against the orders run one addition at a time: the same partial sums, their squares
    # summed in another order (within a few units of float64)
    g = np.random.default_rng(K)
    T = g.standard_normal((6, K)) * 2.0 ** g.integers(-8, 8, (6, K))
    T[0] = (-1.0) ** np.arange(K) * (1 + 0.1 * g.standard_normal(K))  # signs repeating with the lanes
    got = _other_sq(T, LANES)
    for r in range(T.shape[0]):
        assert got[r] == pytest.approx(_other_sq_by_hand(T[r], LANES, SPLITS), rel=1e-13), (K, r)


def test_order_check_sees_structure():
    g = np.random.default_rng(3)
    K = 1024
    alt = (((-1.0) ** np.arange(K)) * (1 + 0.1 * g.standard_normal((16, K)))).astype(np.float32)
    ones = (1 + 0.01 * g.standard_normal((K, 16))).astype(np.float32)
    rnd = g.standard_normal((16, K)).astype(np.float32)
    for a, structured in ((alt, True), (rnd, False)):
        pr = problem("matmul", (a, ones), {})
        ref, mag = pr.run(want_mag=True)
        got = order_bound(pr, mag, sample_indices(ref.size, pr.n_terms))
        assert (got is None) is structured
        if not structured:  # scaled, if at all, by a sampled element's fluctuation: never below the bound
            assert np.all(got >= gemm_partials(pr, mag))


def _f32(x):
    return np.asarray(x, np.float32)


def _lanes(a, b, L):
    """L float32 accumulators over k = l (mod L), then summed in order: sdot's structure."""
    acc = np.zeros((L, a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc[k % L] = _f32(acc[k % L] + _f32(np.outer(a[:, k], b[k])))
    out = acc[0]
    for lane in acc[1:]:
        out = _f32(out + lane)
    return out


def _sequential(a, b):
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = _f32(acc + _f32(np.outer(a[:, k], b[k])))
    return acc


@pytest.mark.parametrize("data", ["randn", "alternating"])
def test_correct_kernels_are_rounding(data):
    g = np.random.default_rng(11)
    K = 1024
    if data == "randn":
        a, b = _f32(g.standard_normal((16, K))), _f32(g.standard_normal((K, 16)))
    else:  # signs that repeat with the lanes: the contiguous bound does not hold for lanes; the check sees it
        a = _f32(((-1.0) ** np.arange(K)) * (1 + 0.1 * g.standard_normal((16, K))))
        b = _f32(1 + 0.01 * g.standard_normal((K, 16)))
    outs = {
        "torch": (torch.from_numpy(a) @ torch.from_numpy(b)).numpy(),
        "sequential": _sequential(a, b),
        "reversed": _sequential(a[:, ::-1], b[::-1]),
        "2 lanes": _lanes(a, b, 2),
        "16 lanes": _lanes(a, b, 16),
    }
    for name, out in outs.items():
        assert rk.compare(out, "matmul", a, b).verdict == "rounding", name


def test_one_element_at_eight_spreads_is_a_mismatch():
    # K = 1024 float32 randn: the spread of torch, a sequential loop and 16 lanes is about 1e-4; the order-free
    # scale put one element's threshold at 80 spreads (8.6e-3), the block bound at about 4
    g = np.random.default_rng(5)
    K = 1024
    a, b = _f32(g.standard_normal((32, K))), _f32(g.standard_normal((K, 32)))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    outs = [(torch.from_numpy(a) @ torch.from_numpy(b)).numpy(), _sequential(a, b), _lanes(a, b, 16)]
    spread = max(float(np.abs(o - exact).max()) for o in outs)
    bad = outs[0].astype(np.float64)
    bad[3, 5] += 8 * spread
    rep = rk.compare(_f32(bad), "matmul", a, b)
    assert rep.verdict == "mismatch"
    assert rep.detectable["element"] < 8 * spread


def test_convolution_bound_holds_in_its_orders():
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(1, 20, 7, 7, generator=g), torch.randn(3, 20, 3, 3, generator=g), torch.randn(3, generator=g)
    pr = problem("conv2d", (x, w, b), {"padding": 1})
    _, mag = pr.run(want_mag=True)
    bound = gemm_partials(pr, mag).reshape(-1)  # B = 8 (the power of two nearest sqrt(181) / 2): cells of 8 channels
    checked = order_bound(pr, mag, np.arange(bound.size)).reshape(-1)  # every element sampled (147 <= 256)
    idx = np.arange(bound.size)
    L, R, bias, _ = pr.terms(idx)
    chan = np.arange(180)  # the terms come as (c, ky, kx)
    tap = chan.reshape(20, 9).T.reshape(-1)  # (ky, kx, c)
    blocked = np.concatenate(
        [chan.reshape(20, 9)[c0 : c0 + 8].T.reshape(-1) for c0 in (0, 8, 16)]
    )  # (c_o, ky, kx, c_i)
    for i in idx:
        t = np.concatenate([[bias[i]], L[i] * R[i]])  # the bias first: every partial sum carries it
        for order in (tap, tap[::-1], blocked, blocked[::-1]):
            assert _sq_partials(t, [np.concatenate([[0], order + 1])]) <= bound[i]
        for order in (chan, chan[::-1]):  # im2col's order: covered through the check's scaling
            assert _sq_partials(t, [np.concatenate([[0], order + 1])]) <= checked[i]
        assert bound[i] <= 182 * mag.reshape(-1)[i] ** 2


def _conv_sequential(x, w, groups, padding, reverse=False):
    """A float32 loop over k = (c, ky, kx) of each group, one rounding per product and per addition (torch
    float32 tensors; conv1d as a conv2d of height 1): the noisiest correct order on these inputs."""
    F = torch.nn.functional
    x4, w4 = (x, w) if x.dim() == 4 else (x[:, :, None], w[:, :, None])
    pad = (padding, padding) if isinstance(padding, int) and x.dim() == 4 else (0, padding)
    cols = F.unfold(x4, w4.shape[2:], padding=pad)  # (N, C k, L), rows in (c, ky, kx) order
    co, cg = w4.shape[0], w4.shape[1]
    kk = cg * w4.shape[2] * w4.shape[3]
    outs = []
    for g in range(groups):
        P = cols[:, g * kk : (g + 1) * kk]
        W = w4[g * (co // groups) : (g + 1) * (co // groups)].reshape(co // groups, kk)
        acc = torch.zeros(x.shape[0], co // groups, P.shape[2])
        for k in range(kk - 1, -1, -1) if reverse else range(kk):
            acc = acc + W[:, k, None] * P[:, None, k]
        outs.append(acc)
    return torch.cat(outs, 1)


@pytest.mark.parametrize("case", ["conv2d", "conv1d groups"])
def test_convolutions_correct_and_eight_spreads(case):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(4)
    if case == "conv2d":
        args = (torch.randn(2, 32, 10, 10, generator=g), torch.randn(8, 32, 3, 3, generator=g))
        kw, fn, op, groups, pad = {"padding": 1}, F.conv2d, "conv2d", 1, 1
    else:
        args = (torch.randn(2, 128, 40, generator=g), torch.randn(8, 64, 5, generator=g))  # 320 terms per group
        kw, fn, op, groups, pad = {"groups": 2}, F.conv1d, "conv1d", 2, 0
    exact = fn(*(a.double() for a in args), **kw)
    outs = [fn(*args, **kw), _conv_sequential(*args, groups, pad), _conv_sequential(*args, groups, pad, True)]
    outs = [o.reshape(exact.shape) for o in outs]
    for out in outs:
        assert rk.compare(out, op, *args, **kw).verdict in ("exact", "rounding")
    spread = max(float((o.double() - exact).abs().max()) for o in outs)
    bad = outs[0].double().clone().reshape(-1)
    bad[7] += 8 * spread
    assert rk.compare(bad.reshape(exact.shape).float(), op, *args, **kw).verdict == "mismatch"


def _block_bound_by_hand(t, bias, cells, block):
    """The module docstring's bound for one element, from its products ``t`` laid out as ``cells`` (a list of
    index arrays, in the order run), plus sum t**2 (no M**2, no cap): block max(sum_b (|P_b| + A_b + |bias|)**2,
    sum_b (|Q_b| + A_b + |bias|)**2)."""
    S = np.array([t[c].sum() for c in cells])
    A = np.array([np.abs(t[c]).sum() for c in cells])
    P = np.concatenate([[0.0], np.cumsum(S)[:-1]])
    Q = S.sum() - P - S
    return block * max(((np.abs(P) + A + bias) ** 2).sum(), ((np.abs(Q) + A + bias) ** 2).sum()) + (t * t).sum()


@pytest.mark.parametrize(
    "case",
    ["strided groups dilation bias", "stride 1 bias", "conv1d", "linear bias", "rgb", "6 channels", "5 channels"],
)
def test_fused_pass_is_the_formula(case):
    # the fused pass (products, cells and both orders in one jitted task) against the formula evaluated per element;
    # cells of 8, 4, 3, 2 and 1 channels (each sweep width of the pass)
    g = torch.Generator().manual_seed(9)
    if case == "rgb":  # 3 channels, 7 x 7 taps, stride 2: K = 147, B = 8, cells of 3 channels, one channel block
        args = (torch.randn(1, 3, 20, 20, generator=g), torch.randn(4, 3, 7, 7, generator=g))
        op, kw = "conv2d", {"stride": 2, "padding": 3}
    elif case == "6 channels":  # K = 54, B = 4: cells of 4 and 2 channels
        args = (torch.randn(2, 6, 9, 9, generator=g), torch.randn(3, 6, 3, 3, generator=g))
        op, kw = "conv2d", {}
    elif case == "5 channels":  # K = 45, B = 4: cells of 4 and 1 channels
        args = (torch.randn(2, 5, 9, 9, generator=g), torch.randn(3, 5, 3, 3, generator=g))
        op, kw = "conv2d", {"padding": 1}
    elif case == "strided groups dilation bias":  # 12 / 3 = 4 channels per group, 3 x 2 taps: K = 24, B = 4
        args = (
            torch.randn(2, 12, 11, 13, generator=g),
            torch.randn(6, 4, 3, 2, generator=g),
            torch.randn(6, generator=g),
        )
        op, kw = "conv2d", {"groups": 3, "stride": (2, 3), "dilation": (1, 2), "padding": 1}
    elif case == "stride 1 bias":  # 19 channels, 9 taps: K = 171, B = 8 (cells of 8, 8 and 3 channels)
        args = (
            torch.randn(1, 19, 9, 10, generator=g),
            torch.randn(5, 19, 3, 3, generator=g),
            torch.randn(5, generator=g),
        )
        op, kw = "conv2d", {"padding": 1}
    elif case == "conv1d":  # 2 groups of 40 channels, 5 taps: K = 200, B = 8
        args = (torch.randn(2, 80, 30, generator=g), torch.randn(4, 40, 5, generator=g))
        op, kw = "conv1d", {"groups": 2}
    else:  # K = 300, B = 8, 38 blocks (the last of 4)
        args = (torch.randn(3, 7, 300, generator=g), torch.randn(9, 300, generator=g), torch.randn(9, generator=g))
        op, kw = "linear", {}
    pr = problem(op, args, kw)
    _, mag = pr.run(want_mag=True)
    got = gemm_partials(pr, mag).reshape(-1)
    B = block_size(pr.n_terms)
    idx = np.arange(got.size)
    L, R, bias, _ = pr.terms(idx)
    if pr.kind == "conv":  # terms in (c, ky, kx) order; cells of cb channels at one tap, tap-major and blocked
        cin, taps = args[1].shape[1], int(np.prod(args[1].shape[2:]))
        cb = min(cin, B)
        k = np.arange(cin * taps).reshape(cin, taps)
        cell = [[k[c0 : c0 + cb, t] for c0 in range(0, cin, cb)] for t in range(taps)]
        orders = [[c for row in cell for c in row], [cell[t][j] for j in range(len(cell[0])) for t in range(taps)]]
    else:
        cb = B
        orders = [[np.arange(c0, min(c0 + B, L.shape[1])) for c0 in range(0, L.shape[1], B)]]
    for i in idx:
        t = L[i] * R[i]
        want = max(_block_bound_by_hand(t, abs(bias[i]), o, cb) for o in orders) + mag.reshape(-1)[i] ** 2
        want = min(want, (pr.n_terms + 1) * mag.reshape(-1)[i] ** 2)
        assert got[i] == pytest.approx(want, rel=1e-12), (case, i)


@pytest.mark.parametrize("case", ["conv2d", "linear bias"])
def test_magnitudes_from_the_pass(case):
    # the pass's own magnitudes (the sums of its cells') are those of the reference run, within gamma_K, and give
    # the same bound
    g = torch.Generator().manual_seed(12)
    if case == "conv2d":
        args, op, kw = (torch.randn(2, 19, 9, 10, generator=g), torch.randn(5, 19, 3, 3, generator=g)), "conv2d", {}
    else:
        args = (torch.randn(3, 7, 300, generator=g), torch.randn(9, 300, generator=g), torch.randn(9, generator=g))
        op, kw = "linear", {}
    pr = problem(op, args, kw)
    _, mag = pr.run(want_mag=True)
    bound, own = partials_and_magnitudes(pr)
    gamma = pr.n_terms * 2.0**-53 / (1 - pr.n_terms * 2.0**-53)
    assert np.all(np.abs(own - mag) <= 2 * gamma * mag)  # each within gamma_K of the exact sum
    np.testing.assert_allclose(bound, gemm_partials(pr, mag), rtol=1e-12)
    f64 = problem(op, tuple(a.double() for a in args), kw)
    assert partials_and_magnitudes(f64) == (None, None)  # a float64 result keeps the order-free scale


def test_order_bound_takes_the_bound_it_is_given():
    g = torch.Generator().manual_seed(13)
    pr = problem("conv2d", (torch.randn(2, 19, 9, 10, generator=g), torch.randn(5, 19, 3, 3, generator=g)), {})
    ref, mag = pr.run(want_mag=True)
    bound, own = partials_and_magnitudes(pr)
    idx = sample_indices(ref.size, pr.n_terms)
    np.testing.assert_allclose(order_bound(pr, own, idx, bound=bound), order_bound(pr, mag, idx), rtol=1e-12)


FUSED_KINDS = ["normal", "spread", "cancel", "subnormal", "special", "zeros"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", FUSED_KINDS)
@pytest.mark.parametrize("case", ["conv2d bias", "conv2d strided groups", "linear bias", "matmul batched"])
def test_reference_from_the_pass_is_truth(case, kind, dtype):
    # reference_and_partials' values (the filter's test on the pass's own float64 sums, the undecided elements
    # exact one by one, or the reference run where most are undecided) are refkern.truth's, bit for bit, on the
    # engines' adversarial inputs; its magnitudes within gamma_K of the reference run's
    from test_engines import _all_same, _data

    from refkern import truth

    rng = np.random.default_rng(FUSED_KINDS.index(kind) + 7 * len(case))
    if case.startswith("conv2d"):
        groups = 2 if "groups" in case else 1
        x, w = _data(rng, (2, 6, 7, 8), dtype, kind), _data(rng, (4, 6 // groups, 3, 3), dtype, "normal")
        b = _data(rng, (4,), dtype, "normal") if "bias" in case else None
        kw = dict(stride=2, padding=1, groups=2) if "strided" in case else {}
        op, args, want = "conv2d", (x, w, b), lambda: truth.conv2d(x, w, b, **kw)
    elif case == "linear bias":
        x, w, b = (
            _data(rng, (3, 5, 40), dtype, kind),
            _data(rng, (6, 40), dtype, "normal"),
            _data(rng, (6,), dtype, kind),
        )
        op, args, kw, want = "linear", (x, w, b), {}, lambda: truth.linear(x, w, b)
    else:
        a, b = _data(rng, (2, 9, 40), dtype, kind), _data(rng, (2, 40, 7), dtype, "normal")
        op, args, kw, want = "matmul", (a, b), {}, lambda: truth.matmul(a, b)
    pr = problem(op, args, kw)
    got, mag = reference_and_partials(pr)
    _all_same(torch.from_numpy(got).to(getattr(torch, dtype)), want(), f"{case} {kind}")
    _, ref_mag = pr.run(want_mag=True)
    gamma = pr.n_terms * 2.0**-53 / (1 - pr.n_terms * 2.0**-53)
    fin = np.isfinite(ref_mag)
    assert np.array_equal(fin, np.isfinite(mag))
    assert np.all(np.abs(mag[fin] - ref_mag[fin]) <= 2 * gamma * ref_mag[fin])
    assert gemm_partials(pr, mag) is pr.partials[1]  # the verdict's order term: the pass's bound, not a second pass


def test_reference_from_the_pass_paths():
    # a few undecided elements (the exact path one by one) and most of them undecided (the reference run): the
    # first a conv whose outputs cancel on one channel only, the second a matmul whose every output cancels to 0
    g = torch.Generator().manual_seed(21)
    x, w = torch.randn(1, 4, 6, 6, generator=g), torch.randn(3, 4, 1, 1, generator=g)
    w[0, 2:] = -w[0, :2]
    x[:, 2:] = x[:, :2]  # channel 0: every output the sum of two pairs that cancel exactly, 0
    pr = problem("conv2d", (x, w), {})
    und = int(np.isnan(_partials(pr, None, None, values=True)[2]).sum())
    assert und == 36  # one channel of three: under TILE_EXACT_MIN (0.35) of the output
    from test_engines import _all_same

    from refkern import truth

    _all_same(torch.from_numpy(reference_and_partials(pr)[0]).float(), truth.conv2d(x, w), "few undecided")
    a, b = torch.randn(5, 8, generator=g), torch.randn(8, 3, generator=g)
    a[:, 4:], b[4:] = -a[:, :4], b[:4]
    pr = problem("matmul", (a, b), {})
    assert int(np.isnan(_partials(pr, None, None, values=True)[2]).sum()) == 15  # all: the reference runs
    _all_same(torch.from_numpy(reference_and_partials(pr)[0]).float(), truth.matmul(a, b), "all undecided")
    f64 = problem("matmul", (a.double(), b.double()), {})
    assert reference_and_partials(f64) is None  # a float64 result: no order term, the reference run as before
