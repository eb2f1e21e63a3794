"""The one way refkern compiles a kernel: ``@jit`` = Numba ``njit`` with fixed options.

* ``fastmath=False`` always: fast-math lets LLVM reassociate, which erases compensation
  (Kahan becomes naive summation) and breaks the error-free transformations.
* ``cache=True``, with the cache keyed on *all* of refkern's sources. Numba stamps a
  cached kernel with the source file of its own Python function only, so a kernel that
  inlines a helper from another module would survive a change of that helper and run the
  old code. The locator below gives every refkern kernel one stamp, a hash of the whole
  package, so that any edit or upgrade recompiles every kernel once. If Numba's cache
  internals ever change shape, caching is switched off rather than trusted.
"""

import hashlib
import os

from numba import njit

__all__ = ["jit", "CACHE"]

_PKG = os.path.dirname(os.path.abspath(__file__))


def _package_stamp() -> str:
    h = hashlib.sha256()
    for root, dirs, files in os.walk(_PKG):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                h.update(os.path.relpath(path, _PKG).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def _install_locators() -> bool:
    try:
        from numba.core import caching

        stamp = _package_stamp()
        bases = [caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator]

        def whole_package(base):
            class Locator(base):
                def get_source_stamp(self):
                    return stamp

                @classmethod
                def from_function(cls, py_func, py_file):
                    if not os.path.abspath(py_file).startswith(_PKG + os.sep):
                        return None
                    return super().from_function(py_func, py_file)

            Locator.__name__ = f"Refkern{base.__name__}"
            return Locator

        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # public name since Numba 0.61
        if not any(c.__name__.startswith("Refkern") for c in impl._locator_classes):
            impl._locator_classes = [whole_package(b) for b in bases] + list(impl._locator_classes)
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
