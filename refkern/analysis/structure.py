"""Where residuals line up: group tests along the output axes, the signatures of common bugs,
and the smallest errors the tests would have seen.

Bugs have structure. A dropped bias is a constant offset per output channel; a missing input
channel, a missing kernel tap or a dropped tail of K removes the same terms from many elements;
a shift moves the whole output by one position; a padding bug lives on the border. The group
test sums the residuals ``r = actual - centre`` of every index along every output axis (batch,
channel, row, column) and compares the sum with its own standard error
``sqrt(sum of sigma**2)`` (:mod:`refkern.analysis.stats`): a whole channel off by an amount far
below the per-element threshold is found, at a level lam(number of groups) that keeps the
false-alarm budget. The signatures then say in words what the residuals fit; each is checked
against the same per-element threshold, never accepted by eye.
"""

import numpy as np

from refkern.analysis.stats import distinct, group_sums, repeated

__all__ = ["group_failures", "n_groups", "signatures", "detectable"]


def n_groups(shape, only=None) -> int:
    """The number of group tests: one per index of every axis longer than 1 (of the axes ``only``)."""
    return int(sum(s for ax, s in enumerate(shape) if s >= 2 and (only is None or ax in only)))


def _z(g, v):
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(g) / np.sqrt(v)
    return np.where(g == 0, 0.0, np.where(np.isnan(z), np.inf, z))


_PEELS = 64  # groups removed one at a time before the rest are reported together


def group_failures(r, var, keep, c, a, axes, lam, only=None) -> list:
    """Groups along each axis (of the axes ``only``, every axis when None) whose residual sum is
    beyond lam standard errors. ``keep``: the elements that passed the per-element test; repeated
    (centre, actual) pairs count once.

    The most significant group is taken out first and the tests are run again without its
    elements, so that one bad channel is not also reported as every row and column it crosses.
    Repeated pairs are looked for only when a group fails counting them all, which saves a sort
    on healthy outputs; a group reported has failed both ways (a little power lost where only
    the count-once test would fail, never an alarm added)."""
    shape = r.shape
    if r.ndim == 0:
        return []
    plain = _peel(r, var, keep, {}, axes, lam, only)
    if not plain:
        return plain
    ids = counted_once(c, a, [ax for ax in range(r.ndim) if shape[ax] >= 2])
    if not ids:
        return plain
    return _peel(r, var, keep, ids, axes, lam, only)


def counted_once(c, a, axes) -> dict:
    """Per axis of ``axes``, the mask (of ``c``'s shape) of the elements a group along it counts when each
    repeated (centre, actual) pair counts once in its group (a deterministic backend gives repeated inputs
    one error); {} where no pair repeats."""
    rep = repeated(c, a)
    if not rep.any():
        return {}
    shape = np.shape(c)
    where = np.flatnonzero(rep.reshape(-1))
    sub_c, sub_a = c.reshape(-1)[where], a.reshape(-1)[where]
    ids = {}
    for ax in axes:
        first = np.ones(rep.size, bool)
        first[where] = distinct(sub_c, sub_a, group=np.unravel_index(where, shape)[ax])
        ids[ax] = first.reshape(shape)
    return ids


def _peel(r, var, keep, ids, axes, lam, only=None) -> list:
    shape = r.shape
    out = []
    keep = keep.copy()
    r, var = np.where(keep, r, 0.0), np.where(keep, var, 0.0)  # zero outside keep, as group_sums wants
    for peel in range(_PEELS + 1):
        found = []
        for ax in range(r.ndim):
            if shape[ax] < 2 or (only is not None and ax not in only):
                continue
            if ax in ids:
                g, v, cnt = group_sums(r * ids[ax], var * ids[ax], keep & ids[ax], ax)
            else:
                g, v, cnt = group_sums(r, var, keep, ax)
            z = _z(g, v)
            for i in np.flatnonzero(z > lam):
                found.append({"axis": axes[ax], "ax": ax, "index": int(i), "z": float(z[i]),
                              "mean": float(g[i] / cnt[i])})  # fmt: skip
        if not found:
            break
        if peel == _PEELS:
            out += found
            break
        worst = max(found, key=lambda f: f["z"])
        out.append(worst)
        sl = [slice(None)] * r.ndim
        sl[worst["ax"]] = worst["index"]
        keep[tuple(sl)] = False
        r[tuple(sl)] = 0.0
        var[tuple(sl)] = 0.0
    return out


def detectable(var0, scale, shape, axes, lam_el, lam_grp, idx=None) -> dict:
    """The minimum detectable effect: the smallest error of one element, and the smallest constant
    offset of a whole group along each axis, that the tests flag (medians over elements, taken on
    the sample ``idx`` when given, and over groups). ``scale`` is sqrt(n) u M, the unit of the
    issue's power criterion."""
    sd, sc = np.sqrt(var0).reshape(-1), scale.reshape(-1)
    if idx is not None:
        sd, sc = sd[idx], sc[idx]
    finite = np.isfinite(sd) & (sc > 0)
    out = {"element": float(np.median(lam_el * sd[finite])) if finite.any() else 0.0,
           "element_in_scale_units": float(np.median(lam_el * sd[finite] / sc[finite])) if finite.any() else 0.0,
           "groups": {}}  # fmt: skip
    v = np.where(np.isfinite(var0), var0, 0.0)
    size = max(int(np.prod(shape)), 1)
    for ax, name in enumerate(axes):
        if shape[ax] < 2:
            continue
        per = np.sum(v, axis=tuple(i for i in range(len(shape)) if i != ax))
        out["groups"][name] = float(np.median(lam_grp * np.sqrt(per) / (size // shape[ax])))
    return out


def _list(idx) -> str:
    return ", ".join(str(int(i)) for i in idx[:8]) + (f" and {len(idx) - 8} more" if len(idx) > 8 else "")


def _ok(r, var, lam):
    """Every element of r within lam standard deviations (specials excluded by the caller)."""
    with np.errstate(invalid="ignore"):
        return bool(np.all(r * r <= lam * lam * var))


def _offsets(r, var, flagged, axes, bias, bias_axis, lam):
    """A constant offset per index along one axis that explains every element."""
    order = ([bias_axis] if bias_axis is not None else []) + [ax for ax in range(r.ndim) if ax != bias_axis]
    for ax in order:
        if r.shape[ax] < 2:
            continue
        other = tuple(i for i in range(r.ndim) if i != ax)
        bad = np.any(flagged, axis=other)
        if bad.all() and ax != bias_axis:
            continue  # every index off: a constant per index of this axis says nothing about it
        mu = np.mean(r, axis=other)
        mu = np.where(bad, mu, 0.0)
        view = [-1 if i == ax else 1 for i in range(r.ndim)]
        if not _ok(r - mu.reshape(view), var, lam):
            continue
        sd = np.sqrt(np.max(var, axis=other))
        idx = np.flatnonzero(bad)
        match = {}
        if ax == bias_axis and bias is not None:
            for sign, what in ((-1.0, "dropped"), (1.0, "added twice")):
                if all(abs(mu[g] - sign * bias[g]) <= lam * sd[g] for g in idx):
                    match = {"sign": sign, "what": what}
                    break
        name = axes[ax]
        if match:
            sign = "-" if match["sign"] < 0 else "+"
            who = (f"every {name}" if len(idx) == r.shape[ax] else f"{name} {idx[0]}" if len(idx) == 1
                   else f"{name}s {_list(idx)}")  # fmt: skip
            text = f"{who} off by a constant {sign}bias[{name}]: bias {match['what']}?"
        else:
            parts = [f"{name} {g} is off by a constant {mu[g]:+.4g}" for g in idx[:5]]
            head = [f"{len(idx)} of {r.shape[ax]} {name}s each off by a constant"] if len(idx) > 5 else []
            text = "; ".join(head + parts)
        return {"kind": "offset", "axis": name, "indices": [int(g) for g in idx][:64],
                "offsets": [float(mu[g]) for g in idx][:64], "bias": match.get("what"), "text": text}  # fmt: skip
    return None


def _shift(a, c, var, axes, lam):
    """The output moved by one position along an axis: actual[i] matches centre[i - s]."""
    for ax in range(a.ndim):
        if a.shape[ax] < 3:
            continue
        for s in (1, -1):
            inner = [slice(None)] * a.ndim
            inner[ax] = slice(1, None) if s == 1 else slice(0, -1)
            inner = tuple(inner)
            moved = np.roll(c, s, axis=ax)[inner]
            with np.errstate(invalid="ignore"):
                if _ok(a[inner] - moved, var[inner], lam) and not _ok(a[inner] - c[inner], var[inner], lam):
                    return {"kind": "shift", "axis": axes[ax], "by": s,
                            "text": f"the output is shifted by {s:+d} along {axes[ax]}: element i holds the "
                                    f"value of element i{-s:+d}"}  # fmt: skip
    return None


_SPATIAL = ("row", "col", "position")


def _border(flagged, axes):
    """Every unexplained element on the first or last index of one spatial axis: a padding bug?"""
    idx = np.argwhere(flagged)
    for ax, name in enumerate(axes):
        size = flagged.shape[ax]
        if name not in _SPATIAL or size < 3 or not len(idx):
            continue
        pos = np.unique(idx[:, ax])
        if set(pos.tolist()) <= {0, size - 1}:
            where = " and ".join(("first" if p == 0 else "last") + f" {name} ({p})" for p in pos)
            return {"kind": "border", "axis": name, "positions": [int(p) for p in pos],
                    "text": f"only the {where} of {size} are wrong: padding at the border?"}  # fmt: skip
    return None


def _missing_terms(r_s, var_s, L, R, kind, conv_shape, lam):
    """Some of the terms missing from (or added twice to) the sum, the same ones for every element:
    one term (an input feature), one input channel or one kernel tap of a convolution, or the last
    terms of K. ``r_s``, ``var_s``, ``L``, ``R``: the sampled elements that fail the test."""
    T = L * R
    K = T.shape[1]
    tol = lam * np.sqrt(var_s)[:, None]
    families = []
    if kind == "conv" and conv_shape is not None:
        cin, kh, kw = conv_shape
        B = T.reshape(-1, cin, kh * kw)
        if cin > 1:
            families.append(("input channel", B.sum(axis=2), lambda i: f"input channel {i} (within its group)"))
        if kh * kw > 1:
            families.append(("kernel tap", B.sum(axis=1), lambda i: f"kernel tap {divmod(int(i), kw)}"))
    else:
        families.append(("term", T, lambda i: f"input feature {i}"))
    tail = np.cumsum(T[:, ::-1], axis=1)[:, :-1]  # tail[:, m - 1] = sum of the last m terms
    families.append(("tail", tail, lambda i: f"the last {int(i) + 1} of {K} terms"))
    for _, C, name in families:
        for sign, what in ((-1.0, "missing from the sum"), (1.0, "added twice")):
            with np.errstate(invalid="ignore"):
                fits = np.all(np.abs(r_s[:, None] - sign * C) <= tol, axis=0) & np.any(C != 0, axis=0)
            if fits.any():
                i = int(np.flatnonzero(fits)[0])
                return {"kind": "terms", "text": f"the residuals fit {name(i)} {what}"}
    return None


def signatures(a, c, var, flagged, pr, lam, sample=None) -> list:
    """Findings, in words, about the unexplained elements ``flagged`` of ``actual - centre``.

    ``sample``: (idx, L, R) of sampled elements, for the missing-terms signatures."""
    if a.ndim == 0 or not flagged.any():
        return []
    finite = np.isfinite(a) & np.isfinite(c)
    r = np.where(finite, a - c, 0.0)
    found = []
    if finite.all():
        off = _offsets(r, var, flagged, pr.axes, pr.bias, pr.bias_axis, lam)
        if off is not None:
            found.append(off)
        sh = _shift(a, c, var, pr.axes, lam)
        if sh is not None:
            found.append(sh)
    bo = _border(flagged, pr.axes)
    if bo is not None:
        found.append(bo)
    if sample is not None and not found and pr.kind != "dot":
        idx, L, R = sample
        sel = flagged.reshape(-1)[idx] & finite.reshape(-1)[idx]
        if sel.sum() >= 3:
            conv_shape = tuple(pr.ops[0].W.shape[1:]) if pr.kind == "conv" else None
            mt = _missing_terms(r.reshape(-1)[idx][sel], var.reshape(-1)[idx][sel], L[sel], R[sel], pr.kind,
                                conv_shape, lam)  # fmt: skip
            if mt is not None:
                found.append(mt)
    return found
