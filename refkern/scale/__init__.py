"""Beyond one process, on Dask (the optional extra ``refkern[dask]``).

* :mod:`refkern.scale.array`: ``refkern.sum``, ``mean``, ``var``, ``std``, ``cumsum``, ``dot`` and
  ``matmul`` of Dask arrays, lazily, the same bits for every chunking;
* :mod:`refkern.scale.cluster`: a local cluster of one-thread processes, or a scheduler's address;
* :mod:`refkern.scale.remote`: an audit's ops shipped to the workers and their verdicts collected;
  :mod:`refkern.scale.header` and :mod:`refkern.scale.bits`: what a message of ops is made of;
  :mod:`refkern.scale.worker`: what a worker does with one; :mod:`refkern.scale.sweep`: the sweep's
  points judged on the workers;
* :mod:`refkern.scale.wire`: the bytes a client writes to its cluster, measured at the TCP layer.

Importing this package imports no Dask; what needs it says in one line how to install it.
"""

from refkern.scale._dispatch import dask_in

__all__ = ["dask_in", "INSTALL"]

INSTALL = "pip install 'refkern[dask]'"
