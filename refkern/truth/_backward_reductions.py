"""Ground truth of the gradients of the poolings and of sum, mean, var, std and cumsum
(:func:`refkern.truth.backward`): exact rationals, rounded once."""

import itertools
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
    import refkern.ops as ops
    from refkern.kernels._common import deliver
    from refkern.truth.softmax import _decide, _ivq

    rec = ops.get(name)  # its kind and pooled dimensions (Op.pool, Op.spatial)
    x, ox = _values(a["input"], "input", "truth.backward")
    nd = rec.spatial
    sizes = x.shape[-nd:]
    X = x.reshape(-1, *sizes)
    Gp = G.reshape(X.shape[0], *G.shape[-nd:])
    outs = [range(o) for o in Gp.shape[1:]]

    def tup(v, default):  # an int or tuple as nd values
        v = default if v is None or (isinstance(v, (tuple, list)) and len(v) == 0) else v
        t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd
        return t * (nd // len(t))

    terms = {}  # (plane, *position) -> [(g, d)]

    def put(p, pos, g, d):
        terms.setdefault((p, *pos), []).append((float(g), d))

    for p in range(X.shape[0]):
        for o in itertools.product(*outs):
            if rec.pool == "adaptive_avg":
                box = [(i * L // O, -(-(i + 1) * L // O)) for i, L, O in zip(o, sizes, Gp.shape[1:])]
                for pos in itertools.product(*(range(b, e) for b, e in box)):
                    put(p, pos, Gp[(p, *o)], math.prod(e - b for b, e in box))
            elif rec.pool == "avg":
                k, st, pd = tup(a["kernel_size"], None), tup(a["stride"], a["kernel_size"]), tup(a["padding"], 0)
                box = [(i * t - q, min(i * t - q + kk, L + q)) for i, t, q, kk, L in zip(o, st, pd, k, sizes)]
                if a["count_include_pad"]:
                    cnt = math.prod(e - b for b, e in box)
                else:
                    cnt = math.prod(min(e, L) - max(b, 0) for (b, e), L in zip(box, sizes))
                for pos in itertools.product(*(range(max(b, 0), min(e, L)) for (b, e), L in zip(box, sizes))):
                    put(p, pos, Gp[(p, *o)], a.get("divisor_override") or cnt)
            else:
                k, st, pd = tup(a["kernel_size"], None), tup(a["stride"], a["kernel_size"]), tup(a["padding"], 0)
                dl = tup(a["dilation"], 1)
                axes = [[i * t - q + u * dd for u in range(kk)] for i, t, q, kk, dd in zip(o, st, pd, k, dl)]
                taps = [pos for pos in itertools.product(*axes) if all(0 <= v < L for v, L in zip(pos, sizes))]
                best, at = -math.inf, taps[0]  # row-major tap order
                for pos in taps:
                    v = X[(p, *pos)]
                    if v > best or v != v:
                        best, at = v, pos
                put(p, at, Gp[(p, *o)], 1)
    out = np.zeros(X.shape)
    for at, ts in terms.items():
        if not all(math.isfinite(g) for g, _ in ts):
            acc = 0.0
            with np.errstate(all="ignore"):
                for g, d in ts:
                    acc = float(np.float64(acc) + np.float64(g) / np.float64(d))
            out[at] = _round_float_to(acc, ox.fmt)
            continue
        q = sum((Fraction(g) / d for g, d in ts), Fraction(0))
        out[at] = 0.0 if q == 0 else _decide(ox.fmt, lambda q=q: _ivq(q))
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


