"""The thread count of the audit's own analysis (:func:`torch_threads`), and Numba's threading layer started on
torch's count (:func:`_start_numba_threads`). :mod:`refkern.torch.audit` and :mod:`refkern.torch._audit_patterns`
both import it (the second cannot import the first, which imports it: a cycle)."""

import contextlib

import numba
import torch

from refkern.engines.filter import PARALLEL_TERMS
from refkern.torch.dispatch import _tensors

__all__ = ["torch_threads"]


def _start_numba_threads():
    """Numba's OpenMP layer, when it starts (its first parallel kernel, or ``numba.get_num_threads()``), sets the
    starting thread's OpenMP count, torch's, to NUMBA_NUM_THREADS, once (numba 0.68.1, layer "omp": test_audit_threads).
    Started on import of :mod:`refkern.torch`, on torch's own count, it cannot move a caller's threads later."""
    old = torch.get_num_threads()
    numba.get_num_threads()  # starts the layer (numba.np.ufunc.parallel._launch_threads)
    torch.set_num_threads(old)


_start_numba_threads()


@contextlib.contextmanager
def torch_threads(*objs):
    """torch's own ops inside (the analysis of one op: copies to the CPU and to float64, a defined op
    recomputed, the bit-for-bit comparison) on one thread where the op's largest tensor holds fewer than
    ``PARALLEL_TERMS`` elements, as :func:`~refkern.engines.filter.threads_for` runs Numba's kernels: below
    it a parallel region costs more than it saves (``_same_bits`` on a 64 x 112 x 112 float32 activation at
    load 4 on 2 cores: 8.4 ms of CPU on two threads, 0.43 ms on one, each region waiting for a thread the
    machine is busy with). The model's own ops run outside this, on the threads the caller set."""
    old = torch.get_num_threads()
    n = max((t.numel() for o in objs for t in _tensors(o)), default=0)
    if old != 1 and n < PARALLEL_TERMS:
        torch.set_num_threads(1)
    try:
        yield
    finally:  # always: the caller's count again, whatever ran inside (Numba's start: _start_numba_threads)
        torch.set_num_threads(old)
