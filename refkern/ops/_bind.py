"""Binding a call of an op to its signature (the reference function's), the one way the gradients and
the ground truth's gradients read their arguments: unknown keywords get a near-miss hint."""

import difflib
import inspect

__all__ = ["bind"]

_KEYWORDS = ("dtype", "correction", "keepdim")  # the keyword-only arguments of an op that change its gradient


def bind(op, args, kwargs, who) -> dict:
    """``{parameter: value}`` of ``op(*args, **kwargs)`` bound by the reference's signature, defaults
    applied; a TypeError starting with ``who`` for an unknown keyword (with a near miss) or a bad call.
    Of the keyword-only arguments only those that change a gradient (``_KEYWORDS``) are taken."""
    from refkern import ops

    fn = ops.get(op, who).reference
    sig = inspect.signature(fn)
    names = [p for p, v in sig.parameters.items() if v.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p, v in sig.parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p in _KEYWORDS]
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
