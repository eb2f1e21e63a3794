"""Ground truth of the gradients of the poolings and of sum, mean, var, std and cumsum
(:func:`refkern.truth.backward`): exact rationals, rounded once."""

import math
from fractions import Fraction

import numpy as np

from refkern.truth._backward_common import _round_float_to, _sqrtq, _square, _values
from refkern.truth.products import _exact_sum_of_products
from refkern.truth.softmax import _decide, _ivq, iv


def _pool_backward(name, G, og, a, wrt):
    """Pooling gradients from the definitions, term by term: an average's window o (torch's: start
    ``o s - p``, end ``min(start + k, L + p)``, divisor its count with or without the padded positions,
    or divisor_override; adaptive: ``floor(o L / O)`` to ``ceil((o + 1) L / O)``) puts ``g_o / d_o`` on
    each input position inside it; a maximum's window puts ``g_o`` on its first maximum in row-major
    tap order (the running maximum starts at -inf and is replaced by a larger value or a NaN; the first
    tap inside the input when nothing replaces it). Each element's terms are summed as Fractions and
    rounded once (mpmath); +0 for a zero sum; terms with a NaN or an infinity: IEEE float64 in output
    order."""
    from refkern.kernels._common import deliver
    from refkern.truth.softmax import _decide, _ivq

    x, ox = _values(a["input"], "input", "truth.backward")
    nd = 2 if name.endswith("2d") else 1
    H, W = (x.shape[-2], x.shape[-1]) if nd == 2 else (1, x.shape[-1])
    X = x.reshape(-1, H, W)
    OW = G.shape[-1]
    OH = G.shape[-2] if nd == 2 else 1
    Gp = G.reshape(-1, OH, OW)

    def pair(v, default, one):  # an int or tuple as (H, W) values, a 1-d one lifted with ``one``
        v = default if v is None or (isinstance(v, (tuple, list)) and len(v) == 0) else v
        t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd
        t = t * (nd // len(t))
        return (one, *t) if nd == 1 else t

    terms = {}  # (plane, h, w) -> [(g, d)]

    def put(p, h, w, g, d):
        terms.setdefault((p, h, w), []).append((float(g), d))

    if name.startswith("adaptive"):
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    hs, he = i * H // OH, -(-(i + 1) * H // OH)
                    ws, we = j * W // OW, -(-(j + 1) * W // OW)
                    for h in range(hs, he):
                        for w in range(ws, we):
                            put(p, h, w, Gp[p, i, j], (he - hs) * (we - ws))
    elif name.startswith("avg_pool"):
        k = pair(a["kernel_size"], None, 1)
        st = pair(a["stride"], a["kernel_size"], 1)
        pd = pair(a["padding"], 0, 0)
        over = a.get("divisor_override")
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    sh, sw = i * st[0] - pd[0], j * st[1] - pd[1]
                    eh, ew = min(sh + k[0], H + pd[0]), min(sw + k[1], W + pd[1])
                    if a["count_include_pad"]:
                        cnt = (eh - sh) * (ew - sw)
                    else:
                        cnt = (min(eh, H) - max(sh, 0)) * (min(ew, W) - max(sw, 0))
                    for h in range(max(sh, 0), min(eh, H)):
                        for w in range(max(sw, 0), min(ew, W)):
                            put(p, h, w, Gp[p, i, j], over or cnt)
    else:
        k = pair(a["kernel_size"], None, 1)
        st = pair(a["stride"], a["kernel_size"], 1)
        pd = pair(a["padding"], 0, 0)
        dl = pair(a["dilation"], 1, 1)
        for p in range(X.shape[0]):
            for i in range(OH):
                for j in range(OW):
                    taps = [(i * st[0] - pd[0] + u * dl[0], j * st[1] - pd[1] + v * dl[1])
                            for u in range(k[0]) for v in range(k[1])]  # fmt: skip
                    taps = [(h, w) for h, w in taps if 0 <= h < H and 0 <= w < W]
                    best, at = -math.inf, taps[0]
                    for h, w in taps:
                        v = X[p, h, w]
                        if v > best or v != v:
                            best, at = v, (h, w)
                    put(p, *at, Gp[p, i, j], 1)
    out = np.zeros(X.shape)
    for (p, h, w), ts in terms.items():
        if not all(math.isfinite(g) for g, _ in ts):
            acc = 0.0
            with np.errstate(all="ignore"):
                for g, d in ts:
                    acc = float(np.float64(acc) + np.float64(g) / np.float64(d))
            out[p, h, w] = _round_float_to(acc, ox.fmt)
            continue
        q = sum((Fraction(g) / d for g, d in ts), Fraction(0))
        out[p, h, w] = 0.0 if q == 0 else _decide(ox.fmt, lambda q=q: _ivq(q))
    return {"input": deliver(out.reshape(x.shape), ox.fmt, og.torch or ox.torch)}


def _reduction_backward(name, G, og, a, wrt):
    """sum, mean, var, std and cumsum from their definitions, element by element: sum ``g`` (converted once
    to x's format), mean ``g / n`` (a Fraction), cumsum ``sum_{j >= i} g_j`` (mpmath, exact precision),
    var ``2 g (x_j - mu) / dof`` (Fractions), std ``g (x_j - mu) / sqrt(dof M2)`` (mpmath intervals, Ziv's
    loop; rational when ``dof M2`` is a square), each rounded once to x's format. Where torch's autograd
    formula has no real value (:mod:`refkern.kernels.reduction_backward`'s rules), its IEEE value."""
    from refkern.kernels._common import deliver
    from refkern.ops._args import correction as _correction
    from refkern.ops._args import dims as reduced_dims

    x, ox = _values(a["x"], "x", "truth.backward")
    fmt = ox.fmt
    tensor = og.torch or ox.torch
    nd = x.ndim
    if name == "cumsum":
        if nd == 0:
            return {"x": deliver(np.array(_round_float_to(float(G), fmt)), fmt, tensor)}
        ax = a["dim"] % nd
        out = np.empty(x.shape)
        for idx in np.ndindex(*x.shape):
            terms = [(float(G[idx[:ax] + (j,) + idx[ax + 1 :]]), 1.0) for j in range(idx[ax], x.shape[ax])]
            out[idx] = _exact_sum_of_products(terms, fmt, None)
        return {"x": deliver(out, fmt, tensor)}
    dims = reduced_dims(a["dim"], nd, "truth.backward")
    n = math.prod(x.shape[d] for d in dims) if nd else 1
    kept = tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    Gb = np.broadcast_to(G.reshape(kept), x.shape)  # each element's grad_output value
    out = np.empty(x.shape)
    if name in ("sum", "mean"):
        for idx in np.ndindex(*x.shape):
            g = float(Gb[idx])
            if name == "sum":
                out[idx] = _round_float_to(g, fmt)
            elif not math.isfinite(g) or g == 0:
                out[idx] = _round_float_to(g / n, fmt)
            else:
                out[idx] = _decide(fmt, lambda q=Fraction(g) / n: _ivq(q))
        return {"x": deliver(out, fmt, tensor)}
    corr = _correction(a["correction"], "truth.backward")
    dof = n - corr
    nodim = a["dim"] is None or nd == 0
    groups = {}  # the elements of each reduced set, keyed by the kept indices
    for idx in np.ndindex(*x.shape):
        groups.setdefault(tuple(i for k, i in enumerate(idx) if k not in dims), []).append(idx)
    for members in groups.values():
        vals = [float(x[i]) for i in members]
        g = float(Gb[members[0]])
        for i, v in zip(members, _var_row(vals, g, dof, name == "std", nodim, fmt)):
            out[i] = v
    return {"x": deliver(out, fmt, tensor)}


def _var_row(vals, g, dof, want_std, nodim, fmt):
    """One reduced set of var (std): torch's ``(2 / dof) * grad_var * (x - mean)``, grad_var = g (var) or
    ``g / (2 std)`` masked to 0 where std is 0 (std), as an extended-real product: exact where every factor
    is a finite real, else IEEE float64 on the factors' signs (their magnitudes do not matter then)."""
    n = len(vals)
    if not all(math.isfinite(v) for v in vals):  # IEEE float64, as torch evaluates the formula
        with np.errstate(all="ignore"):
            xs = np.array(vals)
            if want_std:
                return [math.nan] * n
            mu = xs.mean()
            if nodim and dof <= 0:
                r = np.float64(g) * np.where(xs == mu, np.nan, np.inf)
            else:
                r = np.float64(math.inf if dof == 0 else float(2 / dof)) * np.float64(g) * (xs - mu)
        return [_round_float_to(float(v), fmt) for v in r]
    q = [Fraction(v) for v in vals]
    mu = sum(q, Fraction(0)) / n
    d = [v - mu for v in q]
    m2 = sum((t * t for t in d), Fraction(0))
    sgn = lambda t: 0.0 if t == 0 else math.copysign(1.0, t)  # noqa: E731
    # grad_var: ("real", Fraction or None) for a finite real (None: std's g / (2 s), irrational), or a float
    if not want_std:
        gv = ("real", Fraction(g)) if math.isfinite(g) else g
    elif dof > 0 and m2 == 0:
        gv = 0.0  # masked_fill(result == 0, 0)
    elif dof > 0:
        gv = ("real", None) if math.isfinite(g) else g  # g / (2 s), s finite and positive
    else:
        with np.errstate(all="ignore"):  # the forward is +inf (M2 > 0) or NaN (M2 == 0)
            gv = float(np.float64(g) / np.float64(math.inf if m2 > 0 else math.nan))
    out = []
    for t in d:
        if nodim and dof <= 0:
            r = sgn(gv[1] if gv[1] is not None else g) if isinstance(gv, tuple) else gv
            with np.errstate(all="ignore"):
                out.append(float(np.float64(r) * (math.nan if t == 0 else math.inf)))
            continue
        if isinstance(gv, tuple) and dof != 0:
            if g == 0 or t == 0:
                neg = ((dof < 0) ^ (math.copysign(1.0, g) < 0)) ^ (t < 0)
                out.append(-0.0 if neg else 0.0)
            elif gv[1] is not None:
                out.append(_decide(fmt, lambda v=2 * gv[1] * t / dof: _ivq(v)))
            else:
                out.append(_std_value(Fraction(g) * t, dof * m2, fmt))
            continue
        kf = math.inf if dof == 0 else sgn(dof)
        r = sgn(gv[1] if gv[1] is not None else g) if isinstance(gv, tuple) else gv
        with np.errstate(all="ignore"):
            out.append(float(np.float64(kf) * np.float64(r) * np.float64(sgn(t))))
    return out


def _std_value(num: Fraction, z: Fraction, fmt) -> float:
    """RN(num / sqrt(z)), z > 0: a rational when z is a rational square, else irrational (no midpoint)."""
    if _square(z):
        return _decide(fmt, lambda: _ivq(num / _sqrtq(z)))
    return _decide(fmt, lambda: _ivq(num) / iv.sqrt(_ivq(z)))


