"""Binding a call of an op to its signature (the reference function's), the one way compare, the gradients
and the ground truth's gradients read their arguments: every keyword means the same thing in each, and an
unknown one gets a near-miss hint."""

import difflib
import inspect

__all__ = ["bind", "REFUSED"]

#: how a reference is computed, never an argument of the op: refused wherever a call is bound
REFUSED = ("accumulate", "accum_dtype")
#: the keyword-only arguments a gradient's call takes: those that change the gradient, and engine=, which
#: :func:`refkern.compare` takes too (it says where an exact reference runs: every engine gives the same bits)
_KEYWORDS = ("dtype", "correction", "keepdim", "engine")


def bind(op, args, kwargs, who, *, keywords=_KEYWORDS, why="the gradients are always exact") -> dict:
    """``{parameter: value}`` of ``op(*args, **kwargs)`` bound by the reference's signature, defaults
    applied: the one binder of :func:`refkern.compare` (``keywords=None``: every keyword-only argument), of
    the gradients and of their ground truth (``keywords``: only those). A ValueError starting with ``who``
    for ``accumulate=``/``accum_dtype=`` (``why``: the reference is exact), a TypeError for an unknown keyword
    (with a near miss) or a bad call."""
    import refkern.ops as ops

    for bad in REFUSED:
        if bad in kwargs:
            raise ValueError(f"{who}: {bad}= is not an argument of the op: {why}.")
    fn = ops.get(op, who).reference
    sig = inspect.signature(fn)
    names = [p for p, v in sig.parameters.items() if v.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p, v in sig.parameters.items()
               if v.kind is inspect.Parameter.KEYWORD_ONLY and (keywords is None or p in keywords)]  # fmt: skip
    for k in kwargs:
        if k not in names and k not in keyword:
            near = difflib.get_close_matches(k, names, n=1)
            hint = f" Did you mean {near[0]}=?" if near else f" It takes {', '.join(names)}."
            raise TypeError(f"{who}: {op} has no argument {k!r}.{hint}")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{who}: {op} takes ({', '.join(names)}); {exc}.") from None
    bound.apply_defaults()
    return dict(bound.arguments)
