"""The command line, through its real entry point (a subprocess per call)."""

import json
import re
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
    one = r"(exact|rounding|reduced-precision \((tf32|fp16|bf16)\)|mismatch)"
    for case in d["cases"]:  # every verdict printed is one of the four (the chain case counts them)
        pattern = rf"^\d+ {one}(, \d+ {one})*$" if case["id"] == "matmul-chain" else rf"^{one}$"
        for label, v in case["verdicts"].items():
            assert re.match(pattern, v), (case["id"], label, v)
            assert f"    {label}" in r.stdout
    assert list(by_id["compile"]["verdicts"]) == ["eager conv1", "eager conv2", "eager fc1", "eager fc2",
                                                  "eager relu x3 (in the model's forward)",
                                                  "compiled vs exact (end to end)"]  # fmt: skip
    assert by_id["compile"]["verdicts"]["eager relu x3 (in the model's forward)"] == "exact"  # bit for bit


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
        (("check", "conv4d", "--shape", "1"), "refkern check: error: argument op: invalid choice: 'conv4d'; did you mean 'conv3d'? (choose from"),
        (("chek",), "refkern: error: argument COMMAND: invalid choice: 'chek'; did you mean 'check'? (choose from"),
        (("check", "conv2d", "--shape", "2,3,a"), "refkern check: error: argument --shape: '2,3,a' is not a shape"),
        (("check", "linear", "--shape", "4,3", "5,4"), "refkern check: error: linear: the last dimension of x must equal in_features"),
        (("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "--kw", "stride=0"), "refkern check: error: conv2d: stride must be positive"),
        (("check", "conv2d", "--shape", "1,3,8,8"), "refkern check: error: conv2d takes 2 or 3 shapes"),
        (("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "--kw", "padding"), "refkern check: error: --kw 'padding' must be name=value"),
        (("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "--kw", "paddin=1"), "refkern check: error: --kw: conv2d takes no argument 'paddin'; did you mean 'padding'? conv2d takes stride, padding, dilation, groups, padding_mode."),
        (("check", "matmul", "--shape", "2,3", "3,4", "--kw", "stride=1"), "refkern check: error: --kw: matmul takes no keyword arguments; got 'stride'. Drop it."),
        (("check", "linear", "--shape", "2,3", "4,3", "--dtype", "int8"), "refkern check: error: --dtype 'int8'"),
        (("check", "linear"), "refkern check: error: give --shape for x, weight [and bias] or --input FILE"),
        (("check", "linear", "--shape", "2,3", "4,3", "--device", "quantum"), "refkern check: error: --device 'quantum': unknown device; choose one of cpu, cuda, mps, xpu, dml"),
        (("check", "linear", "--shape", "2,3", "4,3", "--device", "cdua"), "refkern check: error: --device 'cdua': unknown device; did you mean 'cuda'? Choose one of"),
        (("check", "linear", "--input", "nosuchfile.npz"), "refkern check: error: --input 'nosuchfile.npz': no such file"),
        (("sweep", "conv2d", "--k", "1:4"), "refkern sweep: error: argument op: invalid choice: 'conv2d'"),
        (("sweep", "linear", "--k", "a:b"), "refkern sweep: error: --k 'a:b' must be START:STOP[:STEP]"),
        (("sweep", "linear", "--k", "16:64:0"), "refkern sweep: error: --k '16:64:0': STEP must be a positive integer; got 0."),
        (("sweep", "linear", "--k", "16:64:-2"), "refkern sweep: error: --k '16:64:-2': STEP must be a positive integer"),
        (("sweep", "linear", "--k", "16:64:8:2"), "refkern sweep: error: --k '16:64:8:2' must be START:STOP[:STEP]"),
        (("sweep", "linear", "--k", "64:16"), "refkern sweep: error: --k '64:16': STOP must not be below START; write 16:64"),
        (("sweep", "linear", "--k", "0:16"), "refkern sweep: error: --k '0:16': START must be at least 1"),
        (("sweep", "linear", "--k", "16:64", "--m", "0"), "refkern sweep: error: argument --m: must be a positive integer (rows); got '0'"),
        (("sweep", "dot", "--k", "16:32", "--seed", "99999999999999999999999"), "refkern sweep: error: argument --seed: must be an integer from -2**63 to 2**64 - 1; got '99999999999999999999999'"),
        (("check", "linear", "--shape", "2,3", "4,3", "--seed", "x"), "refkern check: error: argument --seed: must be an integer"),
        (("sweep", "matmul", "--k", "16:64", "--n", "-3"), "refkern sweep: error: argument --n: must be a positive integer (columns); got '-3'"),
        (("audit", "nosuch:make", "--input-shape", "1,3"), "refkern audit: error: cannot import 'nosuch'"),
        (("audit", "./nosuch.py:make", "--input-shape", "1,3"), "refkern audit: error: './nosuch.py': no such file"),
        (("audit", "json", "--input-shape", "1,3"), "refkern audit: error: 'json' must be MODULE:FACTORY"),
        (("audit", "json:dumps", "--input-shape", "1,3"), "refkern audit: error: json:dumps() raised TypeError"),
        (("audit", "json:JSONDecodeError.__name__", "--input-shape", "1,3"), "refkern audit: error: 'json' has no callable"),
        (("frobnicate",), "refkern: error: argument COMMAND: invalid choice: 'frobnicate' (choose from"),
    ],
)  # fmt: skip
def test_bad_arguments(args, start):
    _usage_error(_run(*args), start)


@pytest.mark.parametrize(
    "args",
    [
        ("check", "linear", "--shape", "2,3", "4,3", "--device", "cuda"),
        ("check", "linear", "--shape", "2,3", "4,3", "--device", "cpu", "cuda"),
        ("sweep", "linear", "--k", "16:32", "--device", "cuda"),
        ("audit", "models:good", "--input-shape", "1,3,6,6", "--device", "cuda"),
    ],
    ids=["check", "check-two", "sweep", "audit"],
)
def test_a_missing_device_is_one_rule_in_every_command(args, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    (tmp_path / "models.py").write_text(MODELS)
    r = _run(*args, cwd=tmp_path)
    _usage_error(r, f"refkern {args[0]}: error: --device 'cuda' is not available on this machine; it has cpu")


OUTPUTS = [
    ("demo", "--json"),
    ("demo", "--sums", "--json"),
    ("check", "linear", "--shape", "2,3", "4,3", "--json"),
    ("check", "linear", "--shape", "2,3", "4,3", "--plot"),
    ("sweep", "linear", "--k", "16:32", "--json"),
    ("sweep", "linear", "--k", "16:32", "--csv"),
    ("sweep", "linear", "--k", "16:32", "--png"),
    ("audit", "models:good", "--input-shape", "2,3,6,6", "--json"),
    ("doctor", "--json"),
]


@pytest.mark.parametrize("args", OUTPUTS, ids=lambda a: f"{a[0]}{a[-1]}")
def test_an_output_in_a_missing_folder_is_a_one_line_error(args, tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    r = _run(*args, "nodir/out.file", cwd=tmp_path)
    _usage_error(r, f"refkern {args[0]}: error: {args[-1]} 'nodir/out.file': the folder 'nodir' does not exist")
    r = _run(*args, tmp_path, cwd=tmp_path)
    _usage_error(r, f"refkern {args[0]}: error: {args[-1]} '{tmp_path}' is a folder; give a file name")


def test_bad_input_files(tmp_path):
    (tmp_path / "garbage.npz").write_text("garbage")
    (tmp_path / "garbage.pt").write_text("garbage")
    np.save(tmp_path / "one.npy", np.ones(3))
    np.savez(tmp_path / "ok.npz", x=np.ones((2, 3), np.float64), weight=np.ones((4, 3), np.float64))
    for args, start in [
        (("--input", "garbage.npz"), "--input 'garbage.npz' is not an .npz file written by numpy.savez: ValueError: This file contains pickled (object) data"),
        (("--input", "garbage.pt"), "--input 'garbage.pt' is not a .pt file written by torch.save: UnpicklingError"),
        (("--input", "one.npy"), "--input 'one.npy' holds a single array; save the operands in one file with np.savez(FILE.npz, x=..., weight=...)"),
        (("--input", str(tmp_path)), f"--input '{tmp_path}' is a folder"),
        (("--input", "ok.npz", "--shape", "2,3", "4,3"), "--input 'ok.npz' and --shape both give the operands; keep one of them"),
    ]:  # fmt: skip
        _usage_error(_run("check", "linear", *args, cwd=tmp_path), f"refkern check: error: {start}")
        assert "allow_pickle" not in start and "weights_only" not in start  # never advise unsafe loading
    r = _run("check", "linear", "--input", "ok.npz", "--dtype", "float32", cwd=tmp_path)  # --dtype converts
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("linear (2, 3) x (4, 3) (float32)")
    r = _run("check", "linear", "--input", "ok.npz", cwd=tmp_path)  # the file's own dtype otherwise
    assert r.returncode == 0 and r.stdout.startswith("linear (2, 3) x (4, 3) (float64)")


def test_every_keyword_of_the_op_works_from_the_command_line():
    r = _run("check", "conv2d", "--shape", "1,3,8,8", "4,3,3,3", "4", "--device", "cpu",
             "--kw", "padding_mode=reflect", "padding=1", "stride=(2,)")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "conv2d (1, 3, 8, 8) x (4, 3, 3, 3) x (4,) (float32)"
    assert lines[2].split()[:2] == ["cpu", "rounding"] or lines[2].split()[:2] == ["cpu", "exact"]
    r = _run("check", "conv1d", "--shape", "1,3,8", "4,3,3", "--device", "cpu", "--kw", "padding_mode=circular",
             "padding=same", "dilation=2")  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_check_exits_1_and_prints_the_whole_message_when_a_backend_fails(monkeypatch, capsys):
    import refkern.torch.ops as ops
    from refkern.cli import main

    def broken(x, weight, bias=None):
        raise RuntimeError("backend kernel failed: " + "detail " * 40)

    monkeypatch.setitem(ops._TORCH_FUNCTIONS, "linear", broken)
    assert main(["check", "linear", "--shape", "2,3", "4,3", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "cpu failed: RuntimeError: backend kernel failed: " + ("detail " * 40).strip()


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

class _Buggy(torch.Tensor):  # a backend (below the dispatcher) whose addmm kernel drops a feature
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = [a.elem if isinstance(a, cls) else a for a in args]
        if func is torch.ops.aten.addmm.default:
            args = (args[0], args[1][:, :-1], args[2][:-1], *args[3:])
        return func(*args, **(kwargs or {}))

class BuggyLinear(nn.Linear):
    def forward(self, x):
        return F.linear(_Buggy(x), self.weight, self.bias)

def buggy():
    torch.manual_seed(0)  # no ReLU before the buggy layer: the feature it drops is never zero
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 16), BuggyLinear(16, 4))
"""


def test_audit_command(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    r = _run("audit", "models:good", "--input-shape", "2,3,6,6", "--json", tmp_path / "a.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert head.startswith("audit: 3 of 3 ops checked (") and head.endswith("; every op is exact or rounding")
    assert "Sequential.0" in r.stdout and "Sequential.3" in r.stdout
    d = json.loads((tmp_path / "a.json").read_text())
    assert d["version"] == 1 and d["command"] == "audit" and d["first_failure"] is None
    assert [c["name"] for c in d["calls"]] == ["Sequential.0", "Sequential.1", "Sequential.3"]
    assert [c["op"] for c in d["calls"]] == ["conv2d", "relu", "linear"] and (d["ops"], d["checked"]) == (3, 3)
    r = _run("audit", "models:buggy", "--input-shape", "2,4,3,3", "--strict", cwd=tmp_path)
    assert r.returncode == 1
    assert "first call beyond exact/rounding: #1 Sequential.2 (linear): mismatch" in r.stdout


def test_audit_by_path_and_a_rejected_input(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mymodel.py").write_text(MODELS)
    for target in ("./sub/mymodel.py:good", "sub/mymodel.py:good", str(tmp_path / "sub" / "mymodel.py") + ":good"):
        r = _run("audit", target, "--input-shape", "2,3,6,6", cwd=tmp_path)
        assert r.returncode == 0, (target, r.stderr)
        assert r.stdout.startswith("audit: 3 of 3 ops checked")
    r = _run("audit", "./sub/mymodel.py:good", "--input-shape", "1,3,16,16", cwd=tmp_path)
    _usage_error(r, "refkern audit: error: the model rejected an input of shape (1, 3, 16, 16) (float32 on cpu): "
                 "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x2048 and 288x10). "
                 "Give the shape it takes with --input-shape")  # fmt: skip
    (tmp_path / "broken.py").write_text("import torch\nraise RuntimeError('no weights here')\n")
    _usage_error(_run("audit", "broken:make", "--input-shape", "1,3", cwd=tmp_path),
                 "refkern audit: error: importing 'broken' raised RuntimeError: no weights here")  # fmt: skip


def test_audit_lists_calls_in_call_order_or_worst_first(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    r = _run("audit", "models:buggy", "--input-shape", "2,4,3,3", cwd=tmp_path)
    lines = r.stdout.splitlines()
    assert lines[1] == "calls in call order:" and [ln.split()[0] for ln in lines[3:-1]] == ["0", "1"]
    assert lines[-1].startswith("(error/noise: ")
    r = _run("audit", "models:buggy", "--input-shape", "2,4,3,3", "--worst-first", cwd=tmp_path)
    lines = r.stdout.splitlines()
    assert lines[1].startswith("calls worst first") and [ln.split()[0] for ln in lines[3:-1]] == ["1", "0"]


def test_bench_reports_or_fails_on_a_missed_target(tmp_path):
    from refkern.cli import run_benchmarks

    script = tmp_path / "b.py"
    script.write_text("print('target: speed: 9.00 (<= 3) MISSED')\nprint('target: start: 1.00 (<= 2) met')\n")
    lines = []
    assert run_benchmarks([[sys.executable, str(script)]], strict=False, out=lines.append) == 0
    assert lines[-1] == "bench: 1 target missed (reported only; --strict makes a missed target exit 1)"
    lines = []
    assert run_benchmarks([[sys.executable, str(script)]], strict=True, out=lines.append) == 1
    assert (
        lines[0] == "target: speed: 9.00 (<= 3) MISSED"
        and lines[-1] == "bench: 1 target missed; exit status 1 (--strict)"
    )
    script.write_text("print('target: speed: 1.00 (<= 3) met')\n")
    assert run_benchmarks([[sys.executable, str(script)]], strict=True, out=lines.append) == 0
    assert "--strict" in _run("bench", "--help").stdout


def test_doctor(tmp_path):
    r = _run("doctor", "--json", tmp_path / "d.json")
    assert r.returncode == 0, r.stderr
    assert "numba_threads" in r.stdout and "device cpu" in r.stdout
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["version"] == 1 and d["refkern"] == refkern.__version__ and d["devices"][0]["name"] == "cpu"
    assert d["numba_cache"].startswith("on")
    assert d["engines"]["numba"]["usable"] and "cpu" in d["engines"]["blas"]["devices"]
    assert "engine numba     usable on cpu; numba " in r.stdout and "engine blas      usable on cpu" in r.stdout


@pytest.mark.slow
def test_bench_quick():
    r = _run("bench", "--quick", timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "target: exact float32 matmul 512^3 vs numpy float64" in r.stdout
    assert "exact float32 n=1e6 normal" in r.stdout


def test_audit_strict_fails_on_a_compiled_divergence(tmp_path, monkeypatch, capsys):
    """--strict with --compile: a backend that miscompiles a convolution makes the exit status 1 (the eager
    ops are all fine; before, only they counted), and the same model compiled correctly exits 0."""
    import torch

    from refkern.cli import main

    (tmp_path / "convnet.py").write_text(
        "import torch\n\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),\n"
        "                               torch.nn.Linear(4 * 6 * 6, 5))\n"
    )  # fmt: skip

    def dropped_channel(x, w, b=None, *args):
        return torch.conv2d(x[:, :-1], w[:, :-1], b, *args)  # a compiler that drops the last input channel

    def broken(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.conv2d:
                node.target = dropped_channel
        gm.recompile()
        return gm.forward

    real = torch.compile
    argv = ["audit", f"{tmp_path / 'convnet.py'}:make", "--input-shape", "2,3,6,6", "--compile", "default", "--strict",
            "--no-progress"]  # fmt: skip
    for backend, status in ((lambda gm, ex: gm.forward, 0), (broken, 1)):
        monkeypatch.setattr(torch, "compile", lambda m, mode=None, b=backend, **kw: real(m, **{"backend": b, **kw}))
        torch._dynamo.reset()
        assert main(argv) == status
        out = capsys.readouterr().out
        assert "compiled Sequential: 2 of 4 leaves judged" in out, out  # conv and linear, each compiled alone
        assert ("first divergence none" in out) == (status == 0), out
        assert ("first divergence Sequential.0" in out) == (status == 1), out
