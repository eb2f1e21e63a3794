"""The docs' lists of ops are the registry's (refkern.ops): the command line's `refkern check OP` choices in
docs/cli.md, the poolings whose gradients docs/backward.md describes."""

import pathlib
import re

import refkern.ops as ops

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _names(text):
    return tuple(re.findall(r"`(\w+)`", text))


def test_cli_check_lists_every_registered_op():
    row = next(line for line in (DOCS / "cli.md").read_text().splitlines() if line.startswith("| `refkern check OP"))
    listed = row.split("`refkern.ops.REGISTRY`: ", 1)[1].split(") on random inputs", 1)[0]
    assert _names(listed) == tuple(ops.REGISTRY)


def test_backward_lists_every_registered_pooling():
    page = (DOCS / "backward.md").read_text()
    section = page.split("## Poolings", 1)[1].split("returns", 1)[0]
    pools = ops.names(family="pool")
    assert tuple(n for n in _names(section) if n in ops.REGISTRY) == pools
    intro = page.split("## ", 1)[0]  # the page's first paragraph names them in short: avg_pool1d/2d/3d, ...
    short = re.search(r"the poolings \(([^)]*)\)", intro).group(1)
    expanded = set()
    for part in short.split(", "):  # "avg_pool1d/2d/3d": avg_pool1d, avg_pool2d, avg_pool3d
        first, *more = part.split("/")
        expanded |= {first, *(first[:-2] + d for d in more)}
    assert expanded == set(pools)
