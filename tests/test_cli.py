"""The command line, through its real entry points."""

import subprocess
import sys

import refkern


def _run(*args):
    return subprocess.run([sys.executable, "-m", "refkern", *args], capture_output=True, text=True, timeout=600)


def test_version():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"refkern {refkern.__version__}"


def test_demo_answers_every_case():
    r = _run("demo")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("mpmath ground truth agrees bit for bit") == 4
    assert "1e30 + 1 - 1e30" in out and "massive cancellation" in out and "length 10^6" in out
    # the exact row of every case has zero error
    assert out.count("exact") >= 4


def test_no_command_prints_help_and_fails():
    r = _run()
    assert r.returncode == 2 and "usage: refkern" in r.stdout


def test_unknown_command():
    r = _run("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
