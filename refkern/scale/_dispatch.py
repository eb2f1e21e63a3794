"""The one hook the public reductions and products call first: is any argument a Dask array?

Nothing here imports dask (a Dask array can only exist if the caller imported it, so the type
is found through ``sys.modules``) or any other refkern module: the kernels' cache stamps read
their import closure, and this file keeps refkern.scale out of it.
"""

import importlib
import sys

__all__ = ["dask_in", "to_dask", "computed"]


def dask_in(*xs) -> bool:
    """Whether any of ``xs`` is a ``dask.array.Array``."""
    mod = sys.modules.get("dask.array")
    if mod is None:
        return False
    t = getattr(mod, "Array", None)
    return t is not None and any(isinstance(x, t) for x in xs)


def to_dask(op: str, *args, **kwargs):
    """``refkern.scale.array.<op>(*args, **kwargs)``: the lazy, chunking-invariant form."""
    return getattr(importlib.import_module("refkern.scale.array"), op)(*args, **kwargs)


def computed(actual, args, kwargs):
    """``compare``'s Dask arguments computed, all in one ``dask.compute`` call (shared chunks
    computed once): the verdict reads every element, so it needs them in memory."""
    dask = importlib.import_module("dask")
    actual, args, kwargs = dask.compute(actual, list(args), dict(kwargs))
    return actual, tuple(args), kwargs
