"""The arguments of nll_loss and cross_entropy as torch reads them, validated once: the logits (or
log-probabilities) as rows ``(R, C)`` with the class axis last, the class-index targets or the
probability targets in the same rows, the class weights, ``ignore_index``, ``label_smoothing`` and the
reduction (torch's legacy ``size_average``/``reduce`` included). The reference kernels
(:mod:`refkern.kernels.loss`), their gradients and the yardstick (:mod:`refkern.analysis.losses`) read a
call through :func:`loss_call`; the ground truth (:mod:`refkern.truth.losses`) keeps its own reading."""

import sys
from dataclasses import dataclass, field

import numpy as np

from refkern._arrays import is_tensor, operand
from refkern.accumulate.formats import Format

__all__ = ["LossCall", "loss_call", "reduction_of", "REDUCTIONS"]

REDUCTIONS = ("none", "mean", "sum")


@dataclass
class LossCall:
    """One validated call: ``raw`` (R, C) input rows (class last) as held (float32 for float16, bfloat16 and
    float32 inputs, widened exactly; float64), ``X`` the same rows as float64 (converted on first use: nll_loss
    reads only its targets' entries), ``target`` (R,) int64 class indices or None, ``probs`` (R, C) float64
    probability targets or None, ``weight`` (C,) float64 or None, the per-sample shape of a
    ``reduction="none"`` result, the result format."""

    op: str
    raw: np.ndarray
    target: np.ndarray | None
    probs: np.ndarray | None
    weight: np.ndarray | None
    ignore_index: int
    label_smoothing: float
    reduction: str
    sample_shape: tuple
    fmt: Format
    tensor: bool
    _x64: np.ndarray | None = field(default=None, repr=False)

    @property
    def X(self) -> np.ndarray:
        """The rows as contiguous float64 (exact), made once."""
        if self._x64 is None:
            self._x64 = np.ascontiguousarray(self.raw, np.float64)
        return self._x64

    @property
    def C(self) -> int:
        return self.raw.shape[1]

    @property
    def valid(self) -> np.ndarray:
        """Rows that count (class targets other than ignore_index; every row of probability targets)."""
        if self.target is None:
            return np.ones(self.raw.shape[0], np.bool_)
        return self.target != self.ignore_index

    @property
    def out_shape(self) -> tuple:
        return self.sample_shape if self.reduction == "none" else ()


def reduction_of(reduction, size_average, reduce, op) -> str:
    """torch's reduction, the legacy arguments read as torch reads them (``reduce=False``: "none";
    else ``size_average=False``: "sum"; else "mean")."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else bool(size_average)
        reduce = True if reduce is None else bool(reduce)
        return "none" if not reduce else ("mean" if size_average else "sum")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of 'none', 'mean', 'sum'; got reduction={reduction!r}.")
    return reduction


def _ints(t, op) -> np.ndarray:
    if is_tensor(t):
        torch = sys.modules["torch"]
        if t.dtype in (torch.bool,) or t.is_floating_point() or t.is_complex():
            raise TypeError(f"{op}: target must hold class indices (an integer tensor) here; "
                            f"got target.dtype={t.dtype}.")
        return t.detach().cpu().numpy().astype(np.int64)
    a = np.asarray(t)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must hold class indices (an integer array) here; got target.dtype={a.dtype}.")
    return a.astype(np.int64)


def _is_float(t) -> bool:
    if is_tensor(t):
        return bool(t.is_floating_point())
    a = np.asarray(t)
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _rows(v: np.ndarray, dtype=np.float64):
    """(R, C) rows of an input of shape (C,) or (N, C, d1, ...), class axis last (in ``dtype``; None: as held, a
    view where the layout allows), and the per-sample shape."""
    if v.ndim == 1:
        return np.asarray(v, dtype).reshape(1, -1), ()
    if v.ndim == 2:  # (N, C): the rows already (no moveaxis, no product of the leading shape: a fixed cost)
        return np.asarray(v, dtype), (v.shape[0],)
    moved = np.moveaxis(v, 1, -1)
    rows = int(np.prod(moved.shape[:-1], dtype=np.int64))  # explicit: reshape(-1, 0) is ambiguous for C = 0
    return np.asarray(moved, dtype).reshape(rows, v.shape[1]), (v.shape[0], *v.shape[2:])


def loss_call(op, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,  # noqa: A002
              reduction="mean", label_smoothing=0.0) -> LossCall:  # fmt: skip
    """Validate a call of nll_loss or cross_entropy (torch's arguments) and read it (module docstring)."""
    red = reduction_of(reduction, size_average, reduce, op)
    o = operand(input, "input", op)
    x = np.asarray(o.values).reshape(o.shape)
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have shape (C,) or (N, C, d1, ...); got a 0-d input.")
    C = x.shape[0] if x.ndim == 1 else x.shape[1]
    if C == 0:
        raise ValueError(f"{op}: input must have at least one class; got input.shape={tuple(x.shape)} (C = 0).")
    X, sample_shape = _rows(x, None)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an int; got ignore_index={ignore_index!r}.")
    eps = label_smoothing
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)) or not 0.0 <= eps <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be a number in [0, 1]; got label_smoothing={label_smoothing!r}.")
    if op == "nll_loss" and eps:
        raise TypeError(f"{op}: has no label_smoothing (cross_entropy has).")
    w = None
    if weight is not None:
        ow = operand(weight, "weight", op)
        if tuple(ow.shape) != (C,):
            raise ValueError(f"{op}: weight must have shape (C,) = ({C},), one weight per class; "
                             f"got weight.shape={tuple(ow.shape)}.")  # fmt: skip
        w = np.asarray(ow.values, np.float64).reshape(C)
    probs = tgt = None
    if op == "cross_entropy" and _is_float(target):
        ot = operand(target, "target", op)
        if tuple(ot.shape) != tuple(x.shape):
            raise ValueError(f"{op}: probability targets must have the input's shape {tuple(x.shape)}; "
                             f"got target.shape={tuple(ot.shape)}.")  # fmt: skip
        probs, _ = _rows(np.asarray(ot.values).reshape(ot.shape))
        probs = np.ascontiguousarray(probs)
    else:
        t = _ints(target, op)
        want = sample_shape
        if tuple(t.shape) != tuple(want):
            raise ValueError(f"{op}: target must have shape {tuple(want)} (the input's shape without the class "
                             f"dimension) for input.shape={tuple(x.shape)}; got target.shape={tuple(t.shape)}.")
        tgt = t.reshape(-1)
        bad = (tgt != ignore_index) & ((tgt < 0) | (tgt >= C))
        if bad.any():
            first = int(tgt[np.flatnonzero(bad)[0]])
            raise IndexError(f"{op}: target {first} is out of bounds: class indices must lie in [0, {C}) or equal "
                             f"ignore_index={ignore_index}.")  # fmt: skip
    tensor = o.torch or is_tensor(target) or is_tensor(weight)
    return LossCall(op, X, tgt, probs, w, int(ignore_index), float(eps), red, tuple(sample_shape), o.fmt, tensor)
