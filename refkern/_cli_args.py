"""The ``refkern`` command's argument readers and output helpers (:mod:`refkern.cli` holds the commands):
bad arguments raise :class:`UsageError`, printed as one line with exit status 2."""

import argparse
import ast
import difflib
import json
import os

JSON_VERSION = 1


DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu", "dml")


class UsageError(Exception):
    """A bad argument: printed as one line, exit status 2. ``prog`` is the command it belongs to
    ("refkern check"); main() fills it in when the command raised it."""

    def __init__(self, message, prog=None):
        super().__init__(message)
        self.prog = prog


def _near(word, choices) -> str:
    """'; did you mean 'conv2d'?' for the nearest choice, or ''."""
    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean {near[0]!r}?" if near else ""  # the caller's next word starts a sentence


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)", self.prog)

    def _check_value(self, action, value):  # argparse's, with the nearest valid name suggested
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(repr(c) for c in action.choices)
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{_near(value, action.choices)} (choose from {choices})"
            )


def _shape(text: str) -> tuple:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; write it as 8,3,32,32 or 8x3x32x32") from None
    if not dims or any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r} needs non-negative sizes, e.g. 8,3,32,32")
    return dims


def _positive(what):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer ({what}); got {text!r}")
        return v

    return parse


def _seed(text):
    """torch.Generator.manual_seed's range: -2**63 .. 2**64 - 1."""
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or not -(2**63) <= v < 2**64:
        raise argparse.ArgumentTypeError(f"must be an integer from -2**63 to 2**64 - 1; got {text!r}")
    return v


def _kwargs(items, op) -> dict:
    """--kw name=value items, checked against the arguments ``op`` takes (near names suggested)."""
    from refkern.torch.ops import check_keywords

    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--kw {item!r} must be name=value, e.g. padding=1 or stride=(2,1)")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k.strip()] = v  # a string such as padding=same
    try:
        check_keywords(op, out, "--kw")
    except TypeError as exc:
        raise UsageError(str(exc)) from None
    return out


def _krange(text: str) -> list:
    form = f"--k {text!r} must be START:STOP[:STEP] with integers, e.g. 16:4096:256"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise UsageError(form)
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise UsageError(form) from None
    start, stop = nums[0], nums[1]
    if start < 1:
        raise UsageError(f"--k {text!r}: START must be at least 1 (a reduction of length {start} has no terms)")
    if stop < start:
        raise UsageError(f"--k {text!r}: STOP must not be below START; write {stop}:{start}")
    if len(nums) == 3 and nums[2] < 1:
        raise UsageError(
            f"--k {text!r}: STEP must be a positive integer; got {nums[2]}. Leave it out for about 8 steps"
        )
    step = nums[2] if len(nums) == 3 else max(1, (stop - start) // 8)
    return list(range(start, stop + 1, step))


def _torch():
    try:
        import torch
    except ImportError:
        raise UsageError('this command needs torch: pip install "torch==2.13.0"') from None
    return torch


def _dtype(torch, name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise UsageError(f"--dtype {name!r}: choose one of float16, bfloat16, float32, float64")
    return dt


def _need_matplotlib(option):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{option} needs matplotlib: pip install matplotlib (or the refkern[plot] extra)") from None


def _torch_fn(op):
    """The torch function that computes each refkern op, with every argument the op takes."""
    from refkern.torch.ops import torch_function

    return torch_function(op)


def _check_output(option, path):
    """Fail before the work, not after it, when an output file cannot be written there."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        example = os.path.join(path, "out." + {"--json": "json", "--csv": "csv"}.get(option, "png"))
        raise UsageError(f"{option} {path!r} is a folder; give a file name, e.g. {example}")
    if not os.path.isdir(folder):
        shown = os.path.dirname(path) or folder
        raise UsageError(f"{option} {path!r}: the folder {shown!r} does not exist; create it first (mkdir -p {shown})")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path!r}: no permission to write in {folder!r}; choose another folder")


class _Writing:
    """``with _Writing("--json", path):`` turns an OSError while writing into a one-line error."""

    def __init__(self, option, path):
        self.option, self.path = option, path

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, OSError):
            raise UsageError(f"{self.option} {self.path!r}: cannot write it: {exc.strerror or exc}") from None
        return False


def _write_json(path, data):
    with _Writing("--json", path), open(path, "w") as f:
        json.dump({"version": JSON_VERSION, **data}, f, indent=1)


def _backends(names, option="--device"):
    """The backends named (every available one when none is): one rule for every command, a
    name this machine does not have is a usage error that lists what it has."""
    import refkern.torch as rkt
    from refkern.torch.devices import resolve

    avail = rkt.devices()
    if not names:
        return avail
    here = ", ".join(b.name for b in avail)
    for n in names:
        kind = str(n).strip().lower().split(":")[0].replace("directml", "dml").replace("privateuseone", "dml")
        if kind not in DEVICE_KINDS:
            hint = _near(kind, DEVICE_KINDS)
            how = f"{'C' if hint else '; c'}hoose one of {', '.join(DEVICE_KINDS)}, optionally with an index (cuda:1)"
            raise UsageError(f"{option} {n!r}: unknown device{hint}{' ' if hint else ''}{how}")
    out = []
    for b in resolve(list(names)):
        if isinstance(b, str):
            raise UsageError(f"{option} {b!r} is not available on this machine; it has {here}")
        if all(b.name != o.name for o in out):
            out.append(b)
    return out
