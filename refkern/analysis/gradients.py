"""The judging of gradients (:func:`refkern.compare_backward`): a gradient of a product or a convolution
by :func:`refkern.compare` on its adjoint call; softmax, the norms, the poolings, attention and the
reductions by their envelopes (:mod:`refkern.analysis._envelope_backward`) and noise models
(:mod:`refkern.analysis.noise_backward`), the inside test and the verdict."""

import math

import numpy as np

import refkern.ops as _ops
from refkern.kernels.attention_grad import _attn_call, _attn_grads
from refkern.kernels.norm_grad import _NORM_CALLS
from refkern.kernels.pool_grad import _pool_call, _pool_grads
from refkern.kernels.reduction_grad import _cumsum_values, _red_call, _red_grad, _reversed_cumsum, _to_rows
from refkern.kernels.softmax_grad import _softmax_call

__all__ = ["judge", "adjoint_report", "cumsum_report", "reduction_report", "softmax_report", "norm_report",
           "pool_report", "attention_report", "embedding_report", "nll_loss_report", "mse_loss_report",
           "bce_report"]  # fmt: skip


def _with_family(members, centre, v):
    """weight_members' batches, then the whole family's scale as one more member: the exact gradient with the
    variance ``v`` of :func:`~refkern.analysis.noise_backward.norm_param_noise` (the half statistics and sums charged
    as noise) before the store. A half kernel that none of the members emulates stays within that scale: torch
    2.13's CPU batch_norm backward for a bfloat16 OpInfo sample (3, 2, 3, 4), eps 0.5, stores its bf16 mean and
    invstd, and its grad_weight, -0.4277 where the exact value -0.42898 rounds to -0.4297, is none of the members
    (421 sigma from the nearest) but 0.37 sigma of that scale: a member, never a false alarm."""

    def thunk():
        yield from members()
        y, err = centre()
        vf = np.asarray(v, np.float64).reshape(-1)
        if vf.size == np.size(y):
            yield y[None], err[None], np.where(np.isfinite(vf), vf, np.inf)[None]

    return thunk


def judge(name, k, adj, got, grad_output, bound, *, rtol=None, atol=None, who="compare_backward"):
    """The Report of one gradient ``got`` of argument ``k`` of op ``name`` (its :class:`Adjoint` ``adj``,
    the call bound as ``bound``), by the judge its record names (:class:`refkern.ops.Backward`): one of this
    module's (each with the signature ``(name, k, adj, got, grad_output, bound, who, rtol, atol)``), or the
    elementwise ops' (:func:`refkern.analysis.elementwise_grad.judge`)."""
    fn = _ops.resolve_path(_ops.get(name).backward.judge)
    return fn(name, k, adj, got, grad_output, bound, who, rtol, atol)


def adjoint_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """The products', convolutions' and dot's gradients: :func:`refkern.compare` on the adjoint call (and on
    its second formulation, the better fit the verdict)."""
    from refkern.analysis.compare import compare
    from refkern.analysis.report import VERDICTS

    a = adj.judge() if adj.judge is not None and adj.op != "sum" else adj
    rep = compare(a.from_grad(got), a.op, *a.args, rtol=rtol, atol=atol, **a.kwargs)
    if adj.judge_alt is not None and rep.verdict not in ("exact", "rounding") and _alt_applies(adj, a, rep):
        b = adj.judge_alt()  # the other structure of a correct backend: the better fit is the verdict
        alt = compare(b.from_grad(got), b.op, *b.args, rtol=rtol, atol=atol, **b.kwargs)
        if VERDICTS.index(alt.verdict) < VERDICTS.index(rep.verdict):  # a better fit ranks lower
            rep, a = alt, b
    return _named(rep, name, k, a.op)


def _named(rep, name, k, judged_as):
    """The Report of gradient ``k`` of ``name`` headed by what it judges (``conv2d backward (weight)``), not by the
    adjoint call that judged it (a conv2d's grad_weight is one conv_transpose1d whose taps are the images), which a
    note names; its indices stay the adjoint call's output's (the gradient, or its transpose)."""
    label = f"{name} backward ({k})"
    if rep.op != label:
        rep.notes = [*rep.notes, f"judged as one {judged_as} call (the adjoint of {name}'s forward for {k}): its "
                     "bounds, emulated precisions and structure tests; indices are that call's output's"]
        rep.op = label
    return rep


def _alt_applies(adj, a, rep) -> bool:
    """Is the second formulation of a gradient judged as a sum another correct structure? A bias gradient is a
    sum over the batch (and positions): :func:`adjoint_report` judges it by the sum's own statistical test
    (:mod:`refkern.analysis.noise`: its partial sums with the terms' actual signs, the float32 orders emulated),
    not by the GEMM test of ``matmul(ones, g)`` (``adj.judge``), whose scale ``sqrt(n) u sum |terms|`` is blind on
    random-sign terms (a float32 conv2d grad_bias over 256 terms: 60x the spread of correct kernels, a constant
    offset of 8x that spread called rounding) and whose half-accumulation models name a bf16 linear grad_bias
    scaled by 8x the spread ``reduced-precision``. The images-as-taps judge (``adj.judge_alt``) models torch's
    CPU half kernels, which store each image's sum in the result format and add the images in it: a half result
    only. A float32 result's every order is the sum's family already, and the GEMM scale there would excuse
    what the sum's test refuses."""
    return a is not adj or rep.dtype in ("float16", "bfloat16")


def cumsum_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """cumsum's gradient: compare's cumsum on the flipped grad_output (its adjoint call), or, where no adjoint
    call runs (``adj.compute``: a dtype conversion, a 0-d input), the envelope of :func:`reduction_report`."""
    if adj.compute is not None:
        return reduction_report(name, k, adj, got, grad_output, bound, who, rtol, atol)
    return adjoint_report(name, k, adj, got, grad_output, bound, who, rtol, atol)


def embedding_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """embedding's gradient, a scatter-add: the envelope of a sum in any order (:mod:`refkern.analysis.embedding`)."""
    from refkern.analysis.embedding import grad_report

    return grad_report(got, grad_output, bound, who, rtol, atol)


def nll_loss_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """nll_loss's gradient, ``-w_t g (/ D)`` at the targets: its envelope (:mod:`refkern.analysis.losses`)."""
    from refkern.analysis.losses import grad_report

    return grad_report(got, grad_output, bound, who, rtol, atol)


def mse_loss_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """mse_loss's gradient, ``2 (x - t) g (/ n)``: its envelope (:mod:`refkern.analysis.losses`)."""
    from refkern.analysis.losses import mse_grad_report

    return mse_grad_report(got, grad_output, bound, who, rtol, atol)


def bce_report(name, k, adj, got, grad_output, bound, who="compare_backward", rtol=None, atol=None):
    """binary_cross_entropy's gradient, ``g w (p - y) / max(p (1 - p), 1e-12)``: its envelope
    (:mod:`refkern.analysis.losses`)."""
    from refkern.analysis.losses import bce_grad_report

    return bce_grad_report(got, grad_output, bound, who, rtol, atol)


def softmax_report(op, k, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for a softmax's or log_softmax's gradient, judged by
    :mod:`refkern.analysis._envelope_backward`
    (with ``dtype=``: the envelope of the computation in that dtype, then the conversion back,
    :func:`~refkern.analysis._envelope_backward.converted_bound`)."""
    from refkern.analysis._envelope_backward import bound, converted_bound
    from refkern.analysis.compare import _actual_grad
    from refkern.kernels.softmax_backward import softmax_backward_rows

    xr, gr, back, fmt, _, fmt_c = _softmax_call(op, g, a, who)
    act, device = _actual_grad(got, "input", fmt, who)
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward import converted, softmax_noise

    ref_rows, _ = softmax_backward_rows(xr, gr, fmt, op == "log_softmax")
    v, sc = softmax_noise(xr, gr, fmt_c, op == "log_softmax")
    if fmt_c.name == fmt.name:
        b_rows = bound(op, xr, gr, ref_rows, fmt)
    else:
        ref_c, _ = softmax_backward_rows(xr, gr, fmt_c, op == "log_softmax")
        b_rows = converted_bound(bound(op, xr, gr, ref_c, fmt_c), ref_c, fmt_c, fmt)
        v = converted(v, ref_rows * sc, fmt)
    ref = np.asarray(back(ref_rows), np.float64)
    b = np.asarray(back(b_rows), np.float64)
    axis = int(a["dim"]) % max(ref.ndim, 1)
    nz = Noise(np.asarray(back(v), np.float64), [], (axis,) if ref.ndim else (),
               np.asarray(back(sc), np.float64) if np.ndim(sc) else 1.0)  # fmt: skip
    return _envelope_finish(f"{op} backward", act.reshape(ref.shape), ref, b, fmt, device, int(xr.shape[1]), op, nz,
                            rtol, atol)


def _envelope_finish(label, act, ref, b, fmt, device, n_terms, op, nz=None, rtol=None, atol=None):
    """The Report of a gradient ``act`` judged against the reference ``ref`` by the envelope ``b`` and,
    inside it, with ``nz`` (a :class:`~refkern.analysis.noise.Noise` of
    :mod:`refkern.analysis.noise_backward`), by the statistical test of :mod:`refkern.analysis.inside`. With
    ``rtol``/``atol``, its ``tolerance`` as :func:`refkern.compare` reports it for any op."""
    from refkern.analysis.compare import _ulps
    from refkern.analysis.inside import decide_inside
    from refkern.analysis.report import envelope_hypotheses, errors, from_decision, peak, worst_of
    from refkern.analysis.verdict_envelope import decide_envelope

    d = decide_envelope(act, ref, [("rounding", None, ref, b)], fmt)
    if nz is not None:
        axes = tuple(f"dim{i}" for i in range(ref.ndim))
        d = decide_inside(act, ref, [], d, label, {}, fmt, axes, nz=nz)
    ulps = _ulps(act, ref, fmt)
    f0 = d.fits[0]
    r0 = f0.ratio
    stat = nz is not None and d.z is not None
    lam = d.thresholds.get("element", 1.0) if stat else 1.0
    ratio = d.z / lam if stat else r0
    eligible = d.unexplained if d.verdict == "mismatch" else f0.state != 0
    top, _ = worst_of(eligible, ratio, ref.shape)
    det = d.detectable["element"]
    if stat:
        note = (f"the gradient of {label} judged by the statistical test inside its worst-case envelope "
                f"(refkern.analysis.noise_backward): an error of one element from {det['median_ulps']:.3g} ulp "
                "(median) is seen")  # fmt: skip
    else:
        note = (f"the gradient of {label} judged by its worst-case envelope (refkern.analysis._envelope_backward): "
                f"an error below it, median {det['median_ulps']:.3g} ulp here, cannot be told from rounding")
    hyps, ratios = envelope_hypotheses(d.fits)
    return from_decision(
        d, op=label, device=device, dtype=fmt.name, shape=ref.shape, n_terms=n_terms, actual=act, reference=ref,
        top=top, at_worst={"ulp": ulps.reshape(-1)[top], "bound_ratio": r0.reshape(-1)[top],
                           "test_ratio": ratio.reshape(-1)[top], "condition": 1.0},
        max_ulp=peak(ulps), max_bound_ratio=f0.max_ratio, max_prob_ratio=peak(ratio), hypotheses=hyps,
        bound_ratios=ratios, error=lambda: errors(act, ref, f0.state == 0), rtol=rtol, atol=atol, notes=[note],
    )  # fmt: skip


def norm_report(op, name, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for one gradient of a norm, judged by its envelope."""
    from refkern.analysis._envelope_backward import BATCH_INPUT_ROUNDINGS, batch_norm_eval_bound, norm_bound
    from refkern.analysis.compare import _actual_grad

    c = _NORM_CALLS[op](op, g, a, who)
    fmt = c.fmts[name]
    act, device = _actual_grad(got, name, fmt, who)
    if c.given is not None:
        from refkern.kernels.batch_norm_backward import batch_norm_eval_backward

        ref = batch_norm_eval_backward(c.X, c.G, c.W, c.given[0], c.given[1], c.eps, c.fmts, (name,))[name]
        b = batch_norm_eval_bound(name, c.X, c.G, c.W, c.given[0], c.given[1], c.eps, ref, c.fmts)
    else:
        from refkern.kernels.norm_backward import norm_backward_rows

        ref = norm_backward_rows(c.X, c.G, c.W, c.center, c.eps, c.fmts, (name,), regroup=c.regroup)[name]
        kw = {**c.bound_kw, **({"input_roundings": BATCH_INPUT_ROUNDINGS} if op == "batch_norm" else {})}
        b = norm_bound(op, name, c.X, c.G, c.W, c.eps, ref, c.fmts, **kw)
    from refkern.analysis import noise_backward as nb
    from refkern.analysis.noise import Noise

    precs, axes, coherent, st, mb = [], (), None, None, None
    if name == "input":
        v = nb.norm_input_noise(c.X, c.G, c.W, c.center, c.eps, c.fmts, c.bound_kw.get("half_steps", False), c.given)
        nd = len(c.shapes["input"])
        if op in ("layer_norm", "rms_norm") and c.X.shape[1] == c.shapes["input"][-1] and nd:
            axes = (nd - 1,)  # one normalised dimension: a group along it holds one element per row
    else:
        v, half, coherent = nb.norm_param_noise(name, c.X, c.G, c.center, c.eps, c.fmts, c.regroup, c.given)
        if name == "bias":
            st = nb.bias_straddle(c.X, c.G, c.fmts, c.regroup)
            if c.given is None:
                mb = nb.bias_chains(c.X, c.G, c.fmts, c.regroup)
        elif c.given is None:
            mb = nb.weight_members(c.X, c.G, c.center, c.eps, c.fmts, c.regroup)
            if mb is not None:  # the float32 kernels' store known, the half statistics' members emulated
                st, mb = mb[0], (None, _with_family(mb[1], mb[0][1], v))
        if half is not None:
            p = {"bfloat16": "bf16", "float16": "fp16"}[c.fmts["input"].name]
            precs = [(p, f"{p} accumulation", f"the running sums over the rows rounded to {p} (torch's CPU kernels "
                      "for half inputs)", half)]  # fmt: skip
    if name == "input" and c.back is not None:
        ref, b, v = c.back(ref), c.back(b), c.back(v)
    shape = c.shapes[name]
    R, n = c.X.shape
    n_terms = n if name == "input" else (R * n) // max(math.prod(shape), 1)
    nz = Noise(np.asarray(v, np.float64).reshape(shape), [], axes, coherent=coherent, precisions=precs, straddle=st,
               members=mb)  # fmt: skip
    return _envelope_finish(f"{op} backward ({name})", np.asarray(act, np.float64).reshape(shape), ref.reshape(shape),
                            b.reshape(shape), fmt, device, int(n_terms), op, nz, rtol, atol)  # fmt: skip


def pool_report(op, k, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for a pooling's gradient, judged by its envelope."""
    from refkern.analysis._envelope_backward import pool_bound
    from refkern.analysis.compare import _actual_grad

    c = _pool_call(op, g, a, who)
    act, device = _actual_grad(got, "input", c.fmt, who)
    ref, asum, cnt = _pool_grads(c)
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward_reductions import avg_pool_partials, pool_noise

    b = pool_bound(asum, cnt, ref, c.fmt, exact_terms=c.idx is not None)
    sq = avg_pool_partials(c.G, c.spans, c.dconst, c.plane) if c.idx is None and c.G.size else None
    nz = Noise(pool_noise(asum, cnt, ref, c.fmt, c.idx is not None, sq).reshape(c.shape))
    n_terms = int(cnt.max()) if cnt.size else 0
    return _envelope_finish(f"{op} backward (input)", np.asarray(act, np.float64).reshape(c.shape),
                            ref.reshape(c.shape), b.reshape(c.shape), c.fmt, device, n_terms, op, nz, rtol,
                            atol)  # fmt: skip


def attention_report(op, name, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for one gradient of scaled_dot_product_attention, judged by its envelope."""
    from refkern.analysis._envelope_backward import attention_bound
    from refkern.analysis.compare import _actual_grad

    c = _attn_call(op, g, a, who)
    act, device = _actual_grad(got, name, c.fmt(name), who)
    ref = _attn_grads(c, (name,))[name]
    stack = {"query": c.a.Q, "key": c.a.K, "value": c.a.V, "attn_mask": c.a.mask}[name].shape
    from refkern.analysis.noise import Noise
    from refkern.analysis.noise_backward_attention import AttentionShared, attention_noise

    b, n_terms = attention_bound(c.a, c.G, name, ref.reshape(stack), c.mask_fmt)
    nz = None  # the mask's gradient: no noise model yet (noise_backward), judged by its envelope alone
    if name != "attn_mask":
        parts = []  # the errors several elements share, per head: the scale tests (AttentionShared)
        v = attention_noise(c.a, c.G, name, ref.reshape(stack), parts)
        coh = AttentionShared(parts, stack, name, c.a.scale) if parts else None
        nz = Noise(v.reshape(ref.shape), coherent=coh)
    return _envelope_finish(f"{op} backward ({name})", np.asarray(act, np.float64).reshape(ref.shape), ref,
                            b.reshape(ref.shape), c.fmt(name), device, n_terms, op, nz, rtol, atol)  # fmt: skip


def reduction_report(op, name, adj, got, g, a, who="compare_backward", rtol=None, atol=None):
    """compare_backward's Report for the gradient of sum, mean, var, std (and cumsum's ``compute`` cases),
    judged by its envelope: sum's and a 0-d cumsum's is 0 (a correct backend copies or converts g once:
    ``exact`` or ``mismatch``, as max_pool's forward), mean's :func:`~refkern.analysis._envelope_backward.mean_bound`
    (with ``dtype=``: computed in that dtype, then converted back, ``converted_bound``), var's and std's
    ``var_bound``, cumsum's the forward cumsum envelope of the converted grad_output around its own exact
    reference, plus the known distance between the two references."""
    from refkern.analysis import _envelope_backward as envb
    from refkern.analysis.compare import _actual_grad

    c = _red_call(op, g, a, who)
    act, device = _actual_grad(got, "x", c.fmt, who)
    from refkern.analysis import noise_backward as nb
    from refkern.analysis import noise_backward_reductions as nbr

    n_terms, blind, v, members = 1, 0, None, None
    if op == "sum" or (op == "cumsum" and not (c.x.ndim and c.x.size)):
        ref = _red_grad("sum", c, a) if op == "sum" else _cumsum_values(c)
        b = np.zeros(ref.shape)
    elif op == "mean":
        from refkern.kernels.reduction_backward import mean_backward_values

        n = max(c.n, 1)
        ref = _red_grad(op, c, a)
        if c.fmt_c is c.fmt:
            ref_c = mean_backward_values(c.G, n, c.fmt)
            b = c.broadcast(envb.mean_bound(np.abs(c.G) / n, ref_c, c.fmt))
            v = c.broadcast(nbr.mean_noise(c.G, n, ref_c, c.fmt))
        else:
            ref_c = mean_backward_values(c.G, n, c.fmt_c)
            b = c.broadcast(envb.converted_bound(envb.mean_bound(np.abs(c.G) / n, ref_c, c.fmt_c), ref_c, c.fmt_c,
                                                 c.fmt))  # fmt: skip
            v = c.broadcast(nb.converted(nbr.mean_noise(c.G, n, ref_c, c.fmt_c), ref_c, c.fmt))
    elif op == "cumsum":
        from refkern.accumulate.formats import round_array

        axis = c.dims[0]
        ref = _reversed_cumsum(c.G, axis, c.fmt)
        gp = round_array(np.ascontiguousarray(c.G), *c.fmt.params) if c.G.size else c.G  # grad.to(x.dtype)
        ref_p = _reversed_cumsum(gp, axis, c.fmt)
        b = envb.cumsum_converted_bound(gp, axis, ref_p, ref, c.fmt)
        n_terms = c.x.shape[axis]
    else:
        from refkern.analysis.noise_var_means import var_mean_chains
        from refkern.ops._args import correction as _correction

        X, back = c.rows()
        nodim = a["dim"] is None or c.x.ndim == 0
        corr = _correction(a["correction"], who)
        ref = _red_grad(op, c, a)
        b = back(envb.var_bound(X, c.G.reshape(-1), corr, _to_rows(c, ref), c.fmt, op == "std", nodim))
        v = back(nbr.var_noise(X, c.G.reshape(-1), corr, _to_rows(c, ref), c.fmt, op == "std"))
        if X.size:  # the rows' shared errors fitted per row, the mean stored in a half result known exactly
            shape = c.x.shape
            chains = var_mean_chains(X) if c.fmt.name == "float32" else None  # the mean's long chains: members
            v_el = np.asarray(back(nbr.var_noise(X, c.G.reshape(-1), corr, _to_rows(c, ref), c.fmt, op == "std",
                                                own=True, smu2=None if chains is None else chains[0])),
                              np.float64).reshape(shape)  # fmt: skip

            def batches(X=X, shape=shape, chains=chains):
                rows = _to_rows(c, act.reshape(shape))
                for arr3 in nbr.var_members(X, c.G.reshape(-1), corr, c.fmt, op == "std", rows, chains):
                    yield tuple(np.stack([np.asarray(back(t), np.float64).reshape(shape) for t in arr]) for arr in arr3)

            members = (v_el, batches)
        n_terms = X.shape[1]
        dof = n_terms - corr
        if op == "var" and n_terms and (dof == 0 or (dof < 0 and nodim)):
            # torch's IEEE rule (NaN or an infinity) reads the sign of x - mean^ (or x == mean^): where the exact
            # x - mu lies within the stored mean's error, each of NaN, +inf, -inf is a correct backend's value
            fin = np.isfinite(X).all(axis=1, keepdims=True) & np.isfinite(c.G.reshape(-1, 1))
            d, e_d, slack = envb.centred(np.where(fin, X, 0.0), c.fmt)
            amb = back(fin & (np.abs(d) <= e_d + slack)).reshape(c.x.shape) & ~np.isfinite(act.reshape(c.x.shape))
            ref = np.where(amb, act.reshape(c.x.shape), np.asarray(ref, np.float64).reshape(c.x.shape))
            blind = int(amb.sum())
    from refkern.analysis.noise import Noise

    nz = None if v is None else Noise(np.asarray(v, np.float64).reshape(c.x.shape), members=members)
    rep = _envelope_finish(f"{op} backward (x)", act.reshape(c.x.shape), np.asarray(ref, np.float64).reshape(
        c.x.shape), np.asarray(b, np.float64).reshape(c.x.shape), c.fmt, device, int(n_terms), op, nz, rtol,
        atol)  # fmt: skip
    if blind:
        why = "the sign of x - mean there depends on the rounding of the mean (torch's rule inf * g * (x - mean))"
        rep.notes.append(f"{blind} elements of a zero-dof row take the backend's NaN or infinity: {why}")
    return rep
