"""refkern sweep and refkern audit with --workers N / --scheduler ADDRESS: the serial CSV and
report, and one line with exit status 2 when Dask is missing or no scheduler answers."""

import json
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("distributed")

MODEL = """
import torch, torch.nn as nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10),
                         nn.LayerNorm(10))
"""


def _run(*args, cwd=None, code=None):
    cmd = [sys.executable, "-c", code, *map(str, args)] if code else [sys.executable, "-m", "refkern", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd)


def _one_line(r, start):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), r.stderr
    assert "Traceback" not in r.stderr


def test_sweep_csv_with_two_workers_is_the_serial_one(tmp_path):
    common = ("sweep", "matmul", "--k", "8:72:16", "--m", "6", "--n", "5", "--device", "cpu", "--seed", "3")
    r1 = _run(*common, "--csv", tmp_path / "serial.csv")
    r2 = _run(*common, "--csv", tmp_path / "dist.csv", "--workers", "2")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    serial = (tmp_path / "serial.csv").read_text()
    assert serial == (tmp_path / "dist.csv").read_text()
    assert serial.count("\n") == 1 + 5  # header and K = 8, 24, 40, 56, 72


def test_audit_with_two_workers_is_the_local_audit(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    base = ("audit", "m:make", "--input-shape", "2,3,6,6", "--no-progress")
    r1 = _run(*base, "--json", tmp_path / "a.json", cwd=tmp_path)
    r2 = _run(*base, "--json", tmp_path / "b.json", "--workers", "2", cwd=tmp_path)
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    assert r1.stdout == r2.stdout
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


def test_no_scheduler_answering_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run("sweep", "dot", "--k", "4:8", "--device", "cpu", "--scheduler", f"tcp://127.0.0.1:{port}")
    _one_line(r, "refkern sweep: error: no Dask scheduler answered at")


def test_no_scheduler_answering_the_audit_is_one_line(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run("audit", "m:make", "--input-shape", "2,3,6,6", "--scheduler", f"tcp://127.0.0.1:{port}", cwd=tmp_path)
    _one_line(r, "refkern audit: error: no Dask scheduler answered at")


def test_missing_dask_is_one_line(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    block = "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None; sys.argv[0] = 'refkern'; "
    code = block + "from refkern.cli import main; sys.exit(main(sys.argv[1:]))"
    r = _run("sweep", "dot", "--k", "4:8", "--device", "cpu", "--workers", "2", code=code)
    _one_line(r, "refkern sweep: error: --workers needs Dask (dask and distributed), an optional extra: pip install")
    r = _run("audit", "m:make", "--input-shape", "2,3,6,6", "--scheduler", "tcp://x:1", code=code, cwd=tmp_path)
    _one_line(r, "refkern audit: error: --scheduler needs Dask")


def test_workers_and_scheduler_exclude_each_other():
    r = _run("sweep", "dot", "--k", "4:8", "--workers", "2", "--scheduler", "tcp://x:1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "not allowed with argument" in r.stderr
