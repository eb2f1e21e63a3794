"""The audit's analysis runs torch's own ops on one thread below the filter's PARALLEL_TERMS elements
(refkern.torch.audit._torch_threads), the model's ops on the caller's threads, and restores them."""

import sys

import pytest

torch = pytest.importorskip("torch")

import refkern.torch  # noqa: E402,F401  (refkern.torch.audit the module, not the function of that name)
from refkern.engines.filter import PARALLEL_TERMS  # noqa: E402

audit_mod = sys.modules["refkern.torch.audit"]


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_small_op_analysed_on_one_thread_then_restored(two_threads):
    small = torch.zeros(PARALLEL_TERMS - 1)
    with audit_mod._torch_threads((small,), [torch.zeros(3)]):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_large_op_keeps_the_callers_threads(two_threads):
    big = torch.empty(PARALLEL_TERMS)  # 2**22 elements: the threshold itself is parallel (threads_for's >=)
    with audit_mod._torch_threads((torch.zeros(3),), big):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2


def test_restored_when_the_analysis_raises(two_threads):
    with pytest.raises(RuntimeError), audit_mod._torch_threads(torch.zeros(4)):
        raise RuntimeError("analysis failed")
    assert torch.get_num_threads() == 2


def test_model_ops_run_on_the_callers_threads(two_threads):
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())  # the module's forward: outside any analysis
            return torch.relu(x)

    with torch.no_grad(), refkern.torch.audit(progress=False) as a:
        Probe()(torch.randn(8, 8))
        Probe()(torch.randn(8, 8))
    assert seen == [2, 2]
    assert torch.get_num_threads() == 2
    assert [c.op for c in a.calls] == ["relu", "relu"] and all(c.report.verdict == "exact" for c in a.calls)


def test_a_caller_on_one_thread_stays_on_one_after_numba_ran():
    """Numba's OpenMP layer shares the thread count torch reads: a Numba kernel (a layer_norm's verdict) restoring
    its own count must not move the model's next ops off the one thread the caller set (their reduction order,
    torch's bfloat16 layer_norm gradient buffers per thread, depends on it)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return torch.nn.functional.layer_norm(x, (64,))

    try:
        with refkern.torch.audit(progress=False) as a:
            y = Probe()(torch.randn(4, 64, requires_grad=True))
            seen.append(torch.get_num_threads())
            y.sum().backward()
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
    finally:
        torch.set_num_threads(old)
    assert seen == [1, 1, 1, 1] and a.first_failure is None, (seen, a.report())


_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _fresh(code):
    """Run ``code`` in a new interpreter (Numba's threading layer not started yet); its stdout."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], cwd=_ROOT, check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def test_numba_starting_moves_torchs_count_the_cause():
    """The cause of the guard, Numba's (numba 0.68.1, threading layer "omp"): its start sets the OpenMP count torch
    reads to NUMBA_NUM_THREADS, once. Should a Numba release stop doing so, this fails and the guard can go."""
    out = _fresh("import torch, numba\ntorch.set_num_threads(1)\nassert torch.get_num_threads() == 1\n"
                 "numba.get_num_threads()\nprint(numba.threading_layer(), numba.config.NUMBA_NUM_THREADS, "
                 "torch.get_num_threads())")  # fmt: skip
    layer, n, after = out.split()
    if layer != "omp" or n == "1":
        pytest.skip(f"Numba's {layer} layer on {n} threads: the count cannot move")
    assert after == n


def test_refkern_torch_starts_numba_on_the_callers_count():
    """refkern.torch starts Numba's layer on import with torch's count kept (audit._start_numba_threads): a caller on
    one thread stays on one through the import, a parallel Numba kernel and an audit."""
    out = _fresh("import torch\ntorch.set_num_threads(1)\nassert torch.get_num_threads() == 1\n"
                 "import numpy as np, refkern, refkern.torch\nseen = [torch.get_num_threads()]\n"
                 "refkern.layer_norm(np.ones((64, 64), np.float32), (64,))\nseen.append(torch.get_num_threads())\n"
                 "with refkern.torch.audit(progress=False):\n"
                 "    torch.nn.functional.layer_norm(torch.randn(4, 64), (64,))\n"
                 "seen.append(torch.get_num_threads())\nprint(*seen)")  # fmt: skip
    assert out.split() == ["1", "1", "1"]
