"""The docs cannot drift: every ```python block runs, and the API reference is a doctest."""

import contextlib
import doctest
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", re.S | re.M)
BLOCKS = [(page, i, code) for page in PAGES for i, code in enumerate(BLOCK.findall(page.read_text()))]


@pytest.mark.parametrize("page,i,code", BLOCKS, ids=[f"{p.name}:block{i}" for p, i, _ in BLOCKS])
def test_python_blocks_run_each_on_its_own(page, i, code):
    """A reader copies one block, not the page: each ```python / ```py block runs in a fresh namespace."""
    pytest.importorskip("torch")
    ns = {"__name__": f"docs_{page.stem}_{i}"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, f"{page.name}:block{i}", "exec"), ns)  # noqa: S102 - the docs' own examples


def test_every_code_block_is_run_or_marked_as_output():
    """A code block is ```python/```py (run above), ```bash or ```text/``` (shown, not run)."""
    for page in PAGES:
        for lang in re.findall(r"^```(\w*)\n", page.read_text(), re.M):
            assert lang in ("python", "py", "bash", "text", ""), (page.name, lang)


def test_api_reference_doctests():
    res = doctest.testfile(str(ROOT / "docs" / "api.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 10 and res.failed == 0


def test_every_page_is_linked_from_the_index():
    index = (ROOT / "docs" / "index.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index, page.name
