"""Layers point one way: no module imports the package root to reach an op (refkern.ops is the way),
and no import cycle between modules, besides the ones listed here that are still to be broken (issue 25).
The lists may only shrink: a new root import or a new cycle fails."""

import glob
import os

from refkern import _jit

PKG = _jit._PKG
ROOT = os.path.join(PKG, "__init__.py")
# modules that still import the package root to reach refkern.<op> (each should read the registry instead)
STILL_IMPORT_ROOT = set()
# import cycles still to break (none: a module importing the package root would be in one with it)
STILL_CYCLIC = []


def _rel(p):
    return os.path.relpath(p, PKG).replace(os.sep, "/")


def _graph():
    files = sorted(glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True))
    return {f: set(_jit._imports(f)) for f in files}


def _cycles(graph, name=_rel):
    """The strongly connected components of more than one module (Tarjan), as sets of ``name(file)``."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append({name(f) for f in comp})

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_new_module_imports_the_package_root():
    importers = {_rel(f) for f, deps in _graph().items() if ROOT in deps and f != ROOT}
    assert importers <= STILL_IMPORT_ROOT, f"import refkern.<module> or refkern.ops instead: {importers - STILL_IMPORT_ROOT}"


def test_no_new_import_cycle():
    for comp in _cycles(_graph()):
        assert any(comp <= known for known in STILL_CYCLIC), f"a new import cycle: {sorted(comp)}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, name=str) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}, name=str) == []


# modules still over MAX_LINES (each to be split by concept)
STILL_LONG = set()
MAX_LINES = 600


def test_no_new_module_over_600_lines():
    files = glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True)
    long = {_rel(f): n for f in files if (n := sum(1 for _ in open(f, encoding="utf-8"))) > MAX_LINES}
    assert set(long) <= STILL_LONG, f"split these by concept: {dict(sorted(long.items()))}"
