"""Each op's call as :mod:`refkern.analysis.envelope` sees it: rows of the values one output
reduces, and the way back to the output's shape."""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from refkern._arrays import operand

__all__ = ["Layout", "layout"]


@dataclass
class Layout:
    kind: str  # "sum", "mean", "cumsum", "var", "std", "norm", "max", "softmax", "log_softmax", "attention"
    X: np.ndarray | None  # float64 (R, n): the values each row of outputs reduces
    n: int  # terms per output element
    back: Callable  # (R, ...) row-layout array -> the output's shape
    rows: Callable = None  # output-shaped array -> row layout
    divisor: object = 1.0
    absmean: np.ndarray | None = None  # mean |x| per output (row layout), for means and pools
    W: np.ndarray | float = 1.0
    B: np.ndarray | float = 0.0
    center: bool = True
    eps: float = 0.0
    given: tuple | None = None
    extra: dict = field(default_factory=dict)

    def ref_rows(self, ref):
        """The reference in row layout; a norm's as it is held (float32 for narrower results: its
        envelope kernel widens each element as it reads it, so no float64 copy is made)."""
        return self.rows(ref, None) if self.kind == "norm" else self.rows(ref)


def _f64(t, name, op):
    return None if t is None else np.asarray(operand(t, name, op).values, np.float64)


def _exact(t, name, op):
    """The operand's values as they are held, float32 (fp16, bf16 and fp32 widened exactly) or float64:
    a norm's input is read element by element by a kernel that widens it to float64 (no copy)."""
    return operand(t, name, op).values


# the layout of an op without an output element: the kind whose envelope is 0 (nothing is reduced)
_EMPTY = Layout("max", None, 1, back=lambda b: b)


def layout(name: str, a: dict, shape: tuple) -> Layout:
    from refkern.kernels.reduction import _input, reduced_dims, rows_of

    if name in ("sum", "mean", "var", "std"):
        if name in ("sum", "mean"):
            _, _, v = _input(a["x"], name, a.get("dtype"))
        else:
            v = _f64(a["x"], "x", name)
        dims = reduced_dims(a.get("dim"), v.ndim, name)
        X, _ = rows_of(v, dims, a.get("keepdim", False))
        n = X.shape[1]
        lay = Layout(name, X, n, back=lambda b: np.asarray(b).reshape(shape), rows=lambda r: np.asarray(r).reshape(-1))
        if name == "mean":
            lay.divisor = max(n, 1)
            lay.absmean = np.abs(X).mean(axis=1) if n else np.zeros(X.shape[0])
        if name in ("var", "std"):
            corr = a.get("correction")
            lay.divisor = n - float(1 if corr is None else corr)  # None: torch's default, Bessel's
        return lay
    if name == "cumsum":
        _, _, v = _input(a["x"], name, a.get("dtype"))
        (axis,) = reduced_dims(a["dim"], v.ndim, name) or (0,)
        moved = np.moveaxis(v, axis, -1) if v.ndim else v.reshape(1)
        X = np.ascontiguousarray(moved, np.float64).reshape(int(np.prod(moved.shape[:-1])), moved.shape[-1])
        return Layout("cumsum", X, X.shape[1],
                      back=lambda b: np.moveaxis(np.asarray(b).reshape(moved.shape), -1, axis) if v.ndim
                      else np.asarray(b).reshape(()))  # fmt: skip
    if name in ("layer_norm", "rms_norm", "group_norm", "batch_norm") and _exact(a["input"], "input", name).size == 0:
        return _EMPTY  # an empty input (torch takes one): no element, no error
    if name in ("layer_norm", "rms_norm"):
        x = _exact(a["input"], "input", name)
        ns = a["normalized_shape"]
        k = 1 if isinstance(ns, (int, np.integer)) else len(tuple(ns))
        n = int(np.prod(x.shape[x.ndim - k :], dtype=np.int64))
        X = x.reshape(-1, n)
        w = _f64(a.get("weight"), "weight", name)
        b = _f64(a.get("bias"), "bias", name) if name == "layer_norm" else None
        eps = a.get("eps")
        if eps is None:  # F.rms_norm's default: the epsilon of torch's opmath type
            eps = 2.0**-52 if operand(a["input"], "input", name).fmt.prec == 53 else 2.0**-23
        return Layout("norm", X, n, back=lambda r: np.asarray(r).reshape(shape),
                      rows=lambda r, dt=np.float64: np.asarray(r, dt).reshape(-1, n),
                      W=1.0 if w is None else w.reshape(1, n), B=0.0 if b is None else b.reshape(1, n),
                      center=name == "layer_norm", eps=float(eps))  # fmt: skip
    if name == "group_norm":
        x = _exact(a["input"], "input", name)
        nb, c = x.shape[:2]
        g = int(a["num_groups"])
        hw = int(np.prod(x.shape[2:], dtype=np.int64))
        n = (c // g) * hw
        X = x.reshape(nb * g, n)

        def per_row(p):
            return np.tile(np.repeat(p, hw).reshape(g, n), (nb, 1)) if p is not None else None

        w, b = per_row(_f64(a.get("weight"), "weight", name)), per_row(_f64(a.get("bias"), "bias", name))
        return Layout("norm", X, n, back=lambda r: np.asarray(r).reshape(shape),
                      rows=lambda r, dt=np.float64: np.asarray(r, dt).reshape(nb * g, n),
                      W=1.0 if w is None else w, B=0.0 if b is None else b, eps=float(a["eps"]))  # fmt: skip
    if name == "batch_norm":
        x = _exact(a["input"], "input", name)
        c = x.shape[1]
        moved_shape = (c, x.shape[0], *x.shape[2:])
        X = np.ascontiguousarray(np.moveaxis(x, 1, 0)).reshape(c, -1)
        w, b = _f64(a.get("weight"), "weight", name), _f64(a.get("bias"), "bias", name)
        given = None
        if not a.get("training", False):
            given = (_f64(a["running_mean"], "running_mean", name), _f64(a["running_var"], "running_var", name))
        return Layout("norm", X, X.shape[1],
                      back=lambda r: np.moveaxis(np.asarray(r).reshape(moved_shape), 0, 1),
                      rows=lambda r, dt=np.float64: np.ascontiguousarray(np.moveaxis(np.asarray(r, dt), 1, 0)).reshape(
                          c, -1),
                      W=1.0 if w is None else w.reshape(c, 1), B=0.0 if b is None else b.reshape(c, 1),
                      eps=float(a["eps"]), given=given)  # fmt: skip
    from refkern.ops import REGISTRY

    rec = REGISTRY.get(name)
    if rec is not None and rec.pool == "max":
        return Layout("max", None, 1, back=lambda b: b)
    if rec is not None and rec.pool in ("avg", "adaptive_avg"):
        # the terms of one output: at most the window's (the record's pooled dimensions, rec.spatial, each
        # ``kernel_size`` long, or at most ``ceil(L / O) + 1`` of an adaptive window over L for output_size O)
        nd, fn = rec.spatial, rec.reference
        x = _f64(next(iter(a.values())), "input", name)
        rest = {k: v for k, v in list(a.items())[1:]}
        absmean = np.asarray(fn(np.abs(x), **rest), np.float64)
        if rec.pool == "adaptive_avg":
            outs = rest["output_size"]
            outs = (outs,) * nd if isinstance(outs, int) else tuple(outs)
            sizes = x.shape[-nd:]
            k = int(np.prod([-(-s // max(o or s, 1)) + 1 for s, o in zip(sizes, outs)]))
            n = min(k, int(np.prod(sizes, dtype=np.int64)))
        else:
            ks = rest["kernel_size"]
            n = int(np.prod((ks,) * nd if isinstance(ks, int) else ks))
        return Layout("mean", absmean.reshape(1, -1), n, back=lambda r: np.asarray(r).reshape(shape),
                      rows=lambda r: np.asarray(r).reshape(-1), divisor=1.0, absmean=absmean.reshape(-1))  # fmt: skip
    if name in ("softmax", "log_softmax"):
        from refkern.kernels.softmax import _axis, convert_input

        _, _, v = convert_input(a["input"], name, a.get("dtype"))
        axis = _axis(a["dim"], v.ndim, name) if v.ndim else 0
        moved = np.moveaxis(v.reshape(v.shape or (1,)), axis, -1)
        X = np.ascontiguousarray(moved, np.float64).reshape(int(np.prod(moved.shape[:-1])), moved.shape[-1])
        return Layout(name, X, X.shape[1],
                      back=lambda r: np.moveaxis(np.asarray(r).reshape(moved.shape), -1, axis).reshape(shape),
                      rows=lambda r: np.ascontiguousarray(np.moveaxis(np.asarray(r, np.float64).reshape(
                          v.shape or (1,)), axis, -1)).reshape(X.shape))  # fmt: skip
    if name == "scaled_dot_product_attention":
        from refkern.kernels.attention import attention_operands

        att = attention_operands(**a)
        rows_shape = (att.iq.size, att.Q.shape[1], att.V.shape[2])
        return Layout("attention", None, att.K.shape[1], back=lambda r: np.asarray(r).reshape(shape),
                      rows=lambda r: np.asarray(r, np.float64).reshape(rows_shape), extra={"a": att})  # fmt: skip
    raise ValueError(f"compare: no envelope for op {name!r}")
