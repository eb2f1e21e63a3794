"""The command line, through its real entry point (a subprocess per call)."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import refkern

pytest.importorskip("torch")


def _run(*args, cwd=None, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "refkern", *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def _usage_error(r, start):
    """A bad argument: exit status 2, one line on stderr, no traceback."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), r.stderr
    assert "Traceback" not in r.stderr


def _png_size(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return len(data), w, h


def test_version_and_help():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"refkern {refkern.__version__}"
    r = _run()
    assert r.returncode == 2 and "usage: refkern" in r.stdout
    for cmd in ("demo", "check", "sweep", "audit", "doctor", "bench"):
        r = _run(cmd, "--help")
        assert r.returncode == 0 and f"usage: refkern {cmd}" in r.stdout


def test_demo_answers_the_six_questions(tmp_path):
    r = _run("demo", "--json", tmp_path / "demo.json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("answer: ") == 6
    for q in (
        "numpy conv2d",
        "F.linear(x, W, b)",
        "with and without bias",
        "torch.compile",
        "100 float32 matmuls",
        "TF32",
    ):
        assert q in r.stdout
    d = json.loads((tmp_path / "demo.json").read_text())
    assert d["version"] == 1 and d["command"] == "demo"
    assert [c["id"] for c in d["cases"]] == [
        "numpy-conv2d",
        "linear-vs-matmul",
        "bias",
        "compile",
        "matmul-chain",
        "tf32",
    ]
    by_id = {c["id"]: c for c in d["cases"]}
    assert by_id["numpy-conv2d"]["verdicts"] == {"float32 loop (numpy style)": "rounding", "torch conv2d": "rounding"}
    assert by_id["tf32"]["verdicts"]["inputs rounded to TF32 (emulated)"] == "reduced-precision (tf32)"
    assert set(by_id["bias"]["verdicts"].values()) <= {"exact", "rounding"}


def test_demo_sums():
    r = _run("demo", "--sums")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("mpmath ground truth agrees bit for bit") == 4
    assert "1e30 + 1 - 1e30" in r.stdout


def test_check_table_json_and_plot(tmp_path):
    r = _run("check", "conv2d", "--shape", "2,3,16,16", "4,3,3,3", "4", "--kw", "padding=1", "stride=(1,2)",
             "--json", tmp_path / "c.json", "--plot", tmp_path / "c.png")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "conv2d (2, 3, 16, 16) x (4, 3, 3, 3) x (4,) (float32)"
    assert "cpu" in r.stdout and "rounding" in r.stdout
    d = json.loads((tmp_path / "c.json").read_text())
    assert d["version"] == 1 and d["command"] == "check" and d["op"] == "conv2d"
    assert d["shapes"] == [[2, 3, 16, 16], [4, 3, 3, 3], [4]]
    row = d["rows"][0]
    assert row["backend"] == "cpu" and row["report"]["verdict"] in ("exact", "rounding")
    assert row["report"]["shape"] == [2, 4, 16, 8]
    size, w, h = _png_size(tmp_path / "c.png")
    assert size > 20_000 and w >= 800 and h >= 300


def test_check_input_file(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "in.npz",
        a=rng.standard_normal((4, 8)).astype(np.float32),
        b=rng.standard_normal((8, 3)).astype(np.float32),
    )
    r = _run("check", "matmul", "--input", tmp_path / "in.npz", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("matmul (4, 8) x (8, 3) (float32)")


@pytest.mark.parametrize(
    "args,start",
    [
        (("check", "conv3d", "--shape", "1"), "refkern: error: argument op: invalid choice: 'conv3d'"),
        (("check", "conv2d", "--shape", "2,3,a"), "refkern: error: --shape '2,3,a' is not a shape"),
        (("check", "linear", "--shape", "4,3", "5,4"), "refkern check: error: linear: the last dimension of x must equal in_features"),
        (("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "--kw", "stride=0"), "refkern check: error: conv2d: stride must be positive"),
        (("check", "conv2d", "--shape", "1,3,8,8"), "refkern check: error: conv2d takes 2 or 3 shapes"),
        (("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "--kw", "padding"), "refkern check: error: --kw 'padding' must be name=value"),
        (("check", "linear", "--shape", "2,3", "4,3", "--dtype", "int8"), "refkern check: error: --dtype 'int8'"),
        (("check", "linear"), "refkern check: error: give --shape for x, weight [and bias] or --input FILE"),
        (("check", "linear", "--shape", "2,3", "4,3", "--device", "tpu"), "refkern check: error: check: unknown device 'tpu'"),
        (("sweep", "conv2d", "--k", "1:4"), "refkern: error: argument op: invalid choice"),
        (("sweep", "linear", "--k", "a:b"), "refkern sweep: error: --k 'a:b' must be START:STOP[:STEP]"),
        (("audit", "nosuch:make", "--input-shape", "1,3"), "refkern audit: error: cannot import 'nosuch'"),
        (("audit", "json", "--input-shape", "1,3"), "refkern audit: error: 'json' must be MODULE:FACTORY"),
        (("audit", "json:dumps", "--input-shape", "1,3"), "refkern audit: error: json:dumps() raised TypeError"),
        (("audit", "json:JSONDecodeError.__name__", "--input-shape", "1,3"), "refkern audit: error: 'json' has no callable"),
        (("frobnicate",), "refkern: error: argument COMMAND: invalid choice: 'frobnicate'"),
    ],
)  # fmt: skip
def test_bad_arguments(args, start):
    _usage_error(_run(*args), start)


def test_sweep_outputs(tmp_path):
    r = _run("sweep", "linear", "--k", "8:520:256", "--device", "cpu", "--json", tmp_path / "s.json",
             "--csv", tmp_path / "s.csv", "--png", tmp_path / "s.png")  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "s.json").read_text())
    assert d["version"] == 1 and d["command"] == "sweep" and [row["k"] for row in d["rows"]] == [8, 264, 520]
    assert set(d["rows"][0]) >= {"k", "backend", "verdict", "max_rel_error", "median_rel_error", "max_ulp"}
    assert (tmp_path / "s.csv").read_text().splitlines()[0].startswith("k,backend,verdict")
    size, w, h = _png_size(tmp_path / "s.png")
    assert size > 20_000 and w >= 600


MODELS = """
import torch, torch.nn as nn, torch.nn.functional as F

def good():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))

class _Buggy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.linear:
            args = (args[0][:, :-1], args[1][:, :-1], *args[2:])  # a kernel that drops a feature
        with torch._C.DisableTorchFunctionSubclass():
            return func(*[a.as_subclass(torch.Tensor) if isinstance(a, torch.Tensor) else a for a in args], **(kwargs or {}))

class BuggyLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x.as_subclass(_Buggy), self.weight, self.bias)

def buggy():
    torch.manual_seed(0)  # no ReLU before the buggy layer: the feature it drops is never zero
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 16), BuggyLinear(16, 4))
"""


def test_audit_command(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    r = _run("audit", "models:good", "--input-shape", "2,3,6,6", "--json", tmp_path / "a.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("audit: 2 calls") and "Sequential.0" in r.stdout and "Sequential.3" in r.stdout
    d = json.loads((tmp_path / "a.json").read_text())
    assert d["version"] == 1 and d["command"] == "audit" and d["first_failure"] is None
    assert [c["name"] for c in d["calls"]] == ["Sequential.0", "Sequential.3"]
    r = _run("audit", "models:buggy", "--input-shape", "2,4,3,3", "--strict", cwd=tmp_path)
    assert r.returncode == 1
    assert "first call beyond exact/rounding: #1 Sequential.2 (linear): mismatch" in r.stdout


def test_doctor(tmp_path):
    r = _run("doctor", "--json", tmp_path / "d.json")
    assert r.returncode == 0, r.stderr
    assert "numba_threads" in r.stdout and "device cpu" in r.stdout
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["version"] == 1 and d["refkern"] == refkern.__version__ and d["devices"][0]["name"] == "cpu"
    assert d["numba_cache"].startswith("on")


@pytest.mark.slow
def test_bench_quick():
    r = _run("bench", "--quick", timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "target: exact float32 matmul 512^3 vs numpy float64" in r.stdout
    assert "exact float32 n=1e6 normal" in r.stdout
