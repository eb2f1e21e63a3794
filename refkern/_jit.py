"""The one way refkern compiles a kernel: ``@jit`` = Numba ``njit`` with fixed options.

* ``fastmath=False`` always: fast-math lets LLVM reassociate, which erases compensation
  (Kahan becomes naive summation) and breaks the error-free transformations.
* ``cache=True``, with the cache keyed on the sources a kernel can see. Numba stamps a
  cached kernel with the source file of its own Python function only, so a kernel that
  inlines a helper (or reads a constant) from another module would survive a change of that
  helper and run the old code. The locator below stamps each kernel with a hash of its
  module's import closure within refkern: every refkern module that module imports, at any
  depth, by any ``import`` statement anywhere in its source (inside functions too), which is
  everything its kernels can call or read. An edit recompiles exactly the kernels that can
  see it (editing the torch adapter or the verdict's envelopes recompiles none); an upgrade
  changes the sources and recompiles them all. If Numba's cache internals ever change shape,
  caching is switched off rather than trusted.
* One import is not followed: ``RECORDS`` from a record module of the op registry
  (``refkern/ops/_records*.py``). It is a tuple of :class:`refkern.ops.Op` records, which Numba
  cannot type (a kernel that names it does not compile), so no kernel can read a record: Python
  code reads them and hands a kernel their values as arguments at most. Adding or editing a
  record therefore recompiles no kernel. Any other name imported from a record module is
  followed as usual.
"""

import ast
import functools
import hashlib
import os

from numba import njit

__all__ = ["jit", "CACHE"]

_PKG = os.path.dirname(os.path.abspath(__file__))


def _module_file(dotted: str) -> str | None:
    """The source file of the refkern module ``dotted`` (a package's ``__init__.py``), or None."""
    parts = dotted.split(".")
    if parts[0] != "refkern":
        return None
    base = os.path.join(_PKG, *parts[1:])
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _records_only(module: str, aliases) -> bool:
    """Whether ``from module import <aliases>`` imports only the ``RECORDS`` of a record module of the op
    registry: Op records, which no kernel can read (module docstring)."""
    return module.startswith("refkern.ops._records") and all(a.name == "RECORDS" for a in aliases)


@functools.cache  # a kernel module's closure shares most files with the others': each is parsed once
def _imports(path: str) -> frozenset:
    """The refkern source files ``path`` imports by name, by any import statement in it (inside
    functions too): for ``from a.b import c`` the file of ``a.b`` (where ``c`` is defined or
    re-exported) unless every name imported is a module of ``a.b``, and the file of each such module.
    A kernel reads only the globals of its own module and, through the jitted functions and constants
    it names, theirs: a package's ``__init__`` that Python runs on the way is not among them unless
    something is imported from it (``from refkern import engines`` reads refkern/engines, not the
    package root, which defines no ``engines`` of its own). An import of only a record module's ``RECORDS``
    is not followed (:func:`_records_only`)."""
    with open(path, "rb") as fh:
        tree = ast.parse(fh.read(), path)
    rel = os.path.relpath(path, _PKG)[: -len(".py")].split(os.sep)
    here = ["refkern", *rel[:-1]]  # the package a relative import starts from
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(here[: len(here) - node.level + 1] + ([mod] if mod else []))
            if _records_only(mod, node.names):
                continue
            subs = [f"{mod}.{a.name}" for a in node.names]
            names += subs if all(map(_module_file, subs)) else [mod, *subs]
    return frozenset(f for f in map(_module_file, names) if f)


def closure(path: str) -> set:
    """The refkern source files ``path`` can reach by imports, itself included."""
    seen, todo = set(), [os.path.abspath(path)]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _imports(f)
    return seen


@functools.cache
def _closure_stamp(path: str) -> str:
    """A hash of the sources of ``path``'s import closure within refkern (module docstring)."""
    h = hashlib.sha256()
    for f in sorted(closure(path)):
        h.update(os.path.relpath(f, _PKG).encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def _install_locators() -> bool:
    try:
        from numba.core import caching

        bases = [caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator]

        def import_closure(base):
            class Locator(base):
                def get_source_stamp(self):
                    return _closure_stamp(self._refkern_file)

                @classmethod
                def from_function(cls, py_func, py_file):
                    if not os.path.abspath(py_file).startswith(_PKG + os.sep):
                        return None
                    loc = super().from_function(py_func, py_file)
                    if loc is not None:
                        loc._refkern_file = os.path.abspath(py_file)
                    return loc

            Locator.__name__ = f"Refkern{base.__name__}"
            return Locator

        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # public name since Numba 0.61
        if not any(c.__name__.startswith("Refkern") for c in impl._locator_classes):
            impl._locator_classes = [import_closure(b) for b in bases] + list(impl._locator_classes)
        return True
    except Exception:  # pragma: no cover - a Numba without these internals
        return False


CACHE = _install_locators()


def jit(fn=None, **options):
    """``numba.njit(fastmath=False, cache=CACHE, **options)``; usable bare or with options."""
    options = {"fastmath": False, "cache": CACHE, **options}
    if fn is None:
        return lambda f: njit(**options)(f)
    return njit(**options)(fn)
