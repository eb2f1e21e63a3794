"""The docs cannot drift: every ```python block runs, and the API reference is a doctest."""

import contextlib
import doctest
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page):
    pytest.importorskip("torch")
    blocks = BLOCK.findall(page.read_text())
    ns = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks):
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"{page.name}:block{i}", "exec"), ns)  # noqa: S102 - the docs' own examples


def test_api_reference_doctests():
    res = doctest.testfile(str(ROOT / "docs" / "api.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 10 and res.failed == 0


def test_every_page_is_linked_from_the_index():
    index = (ROOT / "docs" / "index.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index, page.name
