"""``refkern sweep`` and ``refkern audit`` on a cluster: the client the options name, and the sweep's
points judged where the client says.

A sweep point's backend output is computed here, in the order the serial sweep draws its inputs
(one generator), so the inputs are the serial sweep's; its analysis (the reference, the errors,
the verdict) runs on a worker, from the raw bits, and the rows come back in the serial order: the
CSV is the serial one. Points in flight are bounded by bytes, as the audit's ops are.
"""

import atexit

import numpy as np

from refkern.scale.bits import Bits, from_bits, to_bits
from refkern.scale.remote import DEFAULT_BUDGET

__all__ = ["point", "Points", "client_from_options", "ClientError"]


class ClientError(Exception):
    """A cluster option that cannot be honoured (dask missing, no scheduler answering): one line."""


def point(op, out, args, k, backend):
    """One row of ``refkern sweep``: the errors of ``out`` against the exact ``op(*args)``."""
    from refkern.analysis.compare import elements

    e = elements(out, op, *args)
    m = e["magnitude"]
    rel = np.where(m > 0, e["error"] / np.where(m > 0, m, 1), 0.0)
    rep = e["report"]
    return {"k": k, "backend": backend, "verdict": rep.verdict, "precision": rep.precision,
            "max_ulp": rep.max_ulp, "max_bound_ratio": rep.max_bound_ratio,
            "max_rel_error": float(np.max(rel)), "median_rel_error": float(np.median(rel)),
            "sum_abs_error": float(np.sum(e["error"]))}  # fmt: skip


def _remote_point(op, out: Bits, args: list, k, backend):
    from refkern.scale._states import limit_threads

    limit_threads()
    return point(op, from_bits(out), [from_bits(a) for a in args], k, backend)


class Points:
    """The sweep's rows, in the order added: computed at once (``client`` None) or on the cluster."""

    def __init__(self, client=None, budget: int = DEFAULT_BUDGET, advance=None):
        self.client = client
        self.budget = budget
        self.advance = advance or (lambda: None)
        self._rows = []  # a row, or [future, nbytes]

    def add(self, op, out, args, k, backend):
        if self.client is None:
            self._rows.append(point(op, out, args, k, backend))
            self.advance()
            return
        out_b, args_b = to_bits(out), [to_bits(a) for a in args]
        n = out_b.nbytes + sum(a.nbytes for a in args_b)
        self._wait_for_room(n)
        fut = self.client.submit(_remote_point, op, out_b, args_b, k, backend, pure=False)
        self._rows.append([fut, n, (op, out_b, args_b, k, backend)])

    def _pending(self):
        return [r for r in self._rows if isinstance(r, list)]

    def _wait_for_room(self, n):
        from distributed import wait

        while True:
            live = self._pending()
            if not live or sum(r[1] for r in live) + n <= self.budget:
                return
            wait([r[0] for r in live], return_when="FIRST_COMPLETED")
            self._settle(done_only=True)

    def _settle(self, done_only=False):
        for i, r in enumerate(self._rows):
            if not isinstance(r, list) or (done_only and not r[0].done()):
                continue
            for _ in range(4):
                try:
                    self._rows[i] = r[0].result()
                    break
                except Exception:  # lost with its worker: again
                    r[0] = self.client.submit(_remote_point, *r[2], pure=False)
            else:
                self._rows[i] = r[0].result()  # the error itself, as a serial sweep raises it
            self.advance()

    def rows(self) -> list:
        self._settle()
        return self._rows


def client_from_options(workers=None, scheduler=None):
    """The client of ``--workers N`` (a local cluster, closed at exit) or ``--scheduler ADDRESS``;
    None for neither. Raises ClientError with one line when it cannot be had."""
    if workers is None and scheduler is None:
        return None
    from refkern.scale import INSTALL

    try:
        import distributed  # noqa: F401
    except ImportError:
        opt = "--workers" if workers is not None else "--scheduler"
        raise ClientError(f"{opt} needs Dask (dask and distributed), an optional extra: {INSTALL}") from None
    from refkern.scale.cluster import client_for

    try:
        client = client_for(workers, scheduler)
    except (ValueError, ConnectionError) as exc:
        raise ClientError(str(exc)) from None
    if workers is not None:
        cluster = client.cluster
        atexit.register(lambda: (client.close(), cluster.close()))
    return client
