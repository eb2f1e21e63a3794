"""Numba's cache of every jitted module is stamped with the sources its kernels can see
(refkern._jit): editing the torch adapter, the command line or the analysis recompiles no kernel,
and an edit a kernel can see recompiles it."""

import glob
import os
import shutil

import pytest

from refkern import _jit

PKG = _jit._PKG
JITTED = sorted(os.path.relpath(f, PKG) for f in glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True)
                if "from refkern._jit import jit" in open(f, encoding="utf-8").read())  # fmt: skip
NUMERICS = [f for f in JITTED if f.startswith(("kernels", "engines", "accumulate"))]
ANALYSIS = [f for f in JITTED if f.startswith("analysis")]
# modules no jitted module may see: the package root (which reaches every module), the adapter, the command
# line, the reports; for the numerics also the analysis, the ground truth and the gradients' judging
ADAPTER = ("__init__.py", "torch", "cli.py", "_cli_args.py", "demo.py", "__main__.py", "report")
ABOVE_NUMERICS = (*ADAPTER, "analysis", "truth", "gradients.py")
# jitted analysis modules that still reach the package root (and through it the adapter): they read an op
# by name from refkern.<op>; the registry (refkern.ops) is the way (issue 25)
STILL_REACH_ROOT = {}  # compare, gradients and the backward envelopes read refkern.ops now


def _seen(module):
    return sorted(os.path.relpath(f, PKG) for f in _jit.closure(os.path.join(PKG, module)))


def _under(rel, tops):
    return rel in tops or rel.split(os.sep)[0] in tops


@pytest.mark.parametrize("module", NUMERICS)
def test_a_kernel_sees_no_analysis_nor_adapter(module):
    above = [f for f in _seen(module) if _under(f, ABOVE_NUMERICS)]
    assert not above, f"{module}'s kernels are recompiled when any of {above} is edited"


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=STILL_REACH_ROOT[m])) if m in STILL_REACH_ROOT else m
    for m in ANALYSIS])  # fmt: skip
def test_an_analysis_kernel_sees_no_adapter(module):
    above = [f for f in _seen(module) if _under(f, ADAPTER)]
    assert not above, f"{module}'s kernels are recompiled when any of {above} is edited"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the package whose stamps are computed afresh (the caches cleared before and after)."""
    root = tmp_path / "refkern"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(_jit, "_PKG", str(root))
    _jit._imports.cache_clear()
    _jit._closure_stamp.cache_clear()
    yield root
    _jit._imports.cache_clear()
    _jit._closure_stamp.cache_clear()


def _stamps(root):
    _jit._imports.cache_clear()
    _jit._closure_stamp.cache_clear()
    return {m: _jit._closure_stamp(str(root / m)) for m in JITTED}


def test_editing_the_adapter_or_the_analysis_changes_no_kernel_stamp(tree):
    before = _stamps(tree)
    for f in ("torch/audit.py", "torch/_audit_results.py", "torch/dispatch.py", "torch/dispatch_backward.py", "cli.py",
              "_cli_args.py", "__init__.py", "analysis/verdict.py", "analysis/verdict_envelope.py", "analysis/envelope.py",
              "analysis/gradients.py", "gradients.py"):  # fmt: skip
        with open(tree / f, "a", encoding="utf-8") as fh:
            fh.write("\n# an edit\n")
    after = _stamps(tree)
    changed = sorted(m for m in NUMERICS if before[m] != after[m])
    assert not changed, f"these kernels would recompile: {changed}"
    # the stamps do follow edits: the analysis modules that read those files change
    assert before["analysis/verdict.py"] != after["analysis/verdict.py"]
    assert before["analysis/envelope.py"] != after["analysis/envelope.py"]


def test_editing_a_helper_changes_the_stamp_of_every_kernel_that_inlines_it(tree):
    before = _stamps(tree)
    with open(tree / "kernels" / "_element.py", "a", encoding="utf-8") as fh:
        fh.write("\n# an edit\n")
    after = _stamps(tree)
    for m in ("kernels/_gemm_numba.py", "kernels/_conv_numba.py", "kernels/_convt_numba.py", "analysis/evaluate.py"):
        assert before[m] != after[m], m
    assert before["accumulate/superacc.py"] == after["accumulate/superacc.py"]


def test_adding_or_editing_a_record_changes_no_stamp(tree):
    """The registry's records (refkern/ops/_records*.py) reach no kernel: an edit of one, a comment appended or a
    record's field changed, recompiles nothing: refkern._jit does not follow the import of ``RECORDS`` (the
    analysis reads the registry in Python code)."""
    before = _stamps(tree)
    records = sorted(p.name for p in (tree / "ops").glob("_records*.py"))
    assert records == ["_records.py", "_records_elementwise.py", "_records_embedding.py", "_records_losses.py"]
    for f in records:
        with open(tree / "ops" / f, "a", encoding="utf-8") as fh:
            fh.write("\n# an edit\n")
    src = (tree / "ops" / "_records.py").read_text(encoding="utf-8")
    assert src.count('needs="output_size=4"') == 1
    (tree / "ops" / "_records.py").write_text(src.replace('needs="output_size=4"', 'needs="output_size=5"'))
    after = _stamps(tree)
    changed = sorted(m for m in JITTED if before[m] != after[m])
    assert not changed, f"these kernels would recompile: {changed}"


def test_the_records_are_skipped_only_where_no_kernel_can_read_them(tree):
    """The one import the stamps do not follow is ``RECORDS`` from a record module: a tuple of Op records, which
    Numba cannot type (a kernel naming it does not compile). The class of the records and the registry's constants
    (refkern/ops/_record.py: tuples of strings, which a kernel could read) are followed, and so is any other name
    imported from a record module."""
    numba = pytest.importorskip("numba")
    from refkern.ops._records import RECORDS

    with pytest.raises(ValueError, match="Cannot determine Numba type"):
        numba.typeof(RECORDS)
    with pytest.raises(numba.core.errors.TypingError):
        numba.njit(lambda: len(RECORDS))()
    before = _stamps(tree)
    with open(tree / "ops" / "_record.py", "a", encoding="utf-8") as fh:
        fh.write("\n# an edit\n")
    after = _stamps(tree)
    assert before["analysis/compare.py"] != after["analysis/compare.py"]  # it imports the registry
    for line, follows in (("from refkern.ops._records import RECORDS", False), ("from refkern.ops._records import _F", True),
                          ("from refkern.ops._records import RECORDS, _F", True), ("from refkern.ops import _records", True),
                          ("from ..ops._records_losses import RECORDS as L", False)):  # fmt: skip
        probe = tree / "kernels" / "_probe.py"
        probe.write_text(line + "\n", encoding="utf-8")
        _jit._imports.cache_clear()
        seen = {os.path.relpath(f, tree) for f in _jit.closure(str(probe))}
        assert any(f.startswith("ops/_records") for f in seen) == follows, line


@pytest.mark.parametrize("module", NUMERICS)
def test_a_kernel_sees_no_registry(module):
    """The numerics do not import the registry (kernels/_grad.py's Adjoint.run once did, to call an op's reference:
    its caller passes it now), so no edit of refkern/ops recompiles them except of the arguments' semantics they
    share with it (refkern/ops/_args.py)."""
    seen = [f for f in _seen(module) if f.startswith("ops" + os.sep)]
    assert set(seen) <= {os.path.join("ops", "_args.py")}, f"{module}'s kernels are recompiled when {seen} is edited"
