"""Where the work runs: a local cluster of one-thread processes by default, or a scheduler's address.

Dask's nanny caps the BLAS and OpenMP threads of each worker process, not numba's: numba would
start one thread per core in every worker (2 workers x 2 threads on a 2-core machine). The
workers refkern starts get ``REFKERN_NUMBA_THREADS`` (one unless asked otherwise), which every
refkern task applies with ``numba.set_num_threads`` in the thread it runs in, so that
workers x threads never exceeds the cores.
"""

import os

from refkern.scale import INSTALL
from refkern.scale._states import THREADS_VAR

__all__ = ["local_client", "connect", "client_for"]


def _distributed(what):
    try:
        import distributed
    except ImportError:
        raise ImportError(f"{what} needs dask.distributed, an optional extra: {INSTALL}") from None
    return distributed


def local_client(n_workers: int = 2, *, numba_threads: int = 1, memory_limit="auto", **kwargs):
    """A ``Client`` of a new ``LocalCluster``: ``n_workers`` processes of one thread each, and
    ``numba_threads`` numba threads per worker (``client.cluster.close()`` ends it)."""
    distributed = _distributed("a local cluster")
    if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1:
        raise ValueError(f"local_client: n_workers must be an int >= 1; got {n_workers!r}.")
    # numba's own NUMBA_NUM_THREADS cannot be given to the workers: Dask sets pre-spawn variables in
    # this process too (numba here would then refuse its next compile), and a value set after the
    # spawn comes after numba's import. refkern's tasks read this one and call numba.set_num_threads.
    env = {THREADS_VAR: str(int(numba_threads))}
    cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", memory_limit=memory_limit, silence_logs=40, env=env,
                                       **kwargs)  # fmt: skip
    return distributed.Client(cluster)


def connect(address: str, *, timeout: float = 5.0):
    """A ``Client`` of the scheduler at ``address``; a ConnectionError in one line if none answers."""
    distributed = _distributed("a scheduler")
    try:
        return distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        why = type(exc).__name__
        raise ConnectionError(f"no Dask scheduler answered at {address!r} within {timeout:g} s ({why}).") from None


def client_for(workers=None, scheduler=None):
    """The client the CLI's ``--workers N`` / ``--scheduler ADDRESS`` name (None for neither)."""
    if workers is not None and scheduler is not None:
        raise ValueError("--workers and --scheduler exclude each other; give one.")
    if scheduler is not None:
        return connect(scheduler)
    if workers is not None:
        return local_client(workers)
    return None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
