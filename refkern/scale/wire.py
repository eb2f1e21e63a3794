"""The bytes a Dask client really writes to its cluster, measured at the TCP layer, by Dask key.

What an audit on a cluster costs in traffic is not what it hands to Dask: every task is an
``update-graph`` message (about 1.3 KB of Dask's own framing before any data), its result is
asked for (``gather``) and released (``client-releases-keys``), and every scatter is a message of
its own. :class:`Wire` counts what the client's own connections write while it is entered (the
scheduler of a ``LocalCluster`` lives in this process too: its writes are not counted), and
splits each write among the messages batched in it and each message among the keys it names.
"""

import collections

__all__ = ["Wire"]


def _keys(msg) -> list:
    """The Dask keys a message names (a task's, a gather's, a release's, a scatter's)."""
    if not isinstance(msg, dict):
        return []
    keys = msg.get("keys")
    if keys is None and isinstance(msg.get("data"), dict):
        keys = msg["data"].keys()
    return [k for k in (keys or ()) if isinstance(k, (str, bytes, tuple))]


def _sizes(msgs) -> list:
    """Each message's serialized size, to split a batched write among them."""
    from distributed.protocol import dumps

    out = []
    for m in msgs:
        try:
            out.append(sum(memoryview(f).nbytes for f in dumps(m)))
        except Exception:
            out.append(1)
    return out


class Wire:
    """Bytes written by ``client`` while entered: ``by_key`` (Dask key -> bytes), ``other`` (messages
    that name no key: heartbeats, handshakes), ``by_op`` (message op -> [bytes, count]) and ``total``."""

    def __init__(self, client):
        self.client = client
        self.by_key = collections.defaultdict(float)
        self.by_op = collections.defaultdict(lambda: [0.0, 0])
        self.other = 0.0
        self.total = 0
        self._restore = None

    def _mine(self, comm) -> bool:
        c = self.client
        batched = getattr(getattr(c, "scheduler_comm", None), "comm", None)
        if comm is batched:
            return True
        pool = c.rpc
        return any(comm in s for s in pool.occupied.values()) or any(comm in s for s in pool.available.values())

    def _count(self, msg, n):
        msgs = msg if isinstance(msg, (list, tuple)) else [msg]
        sizes = _sizes(msgs) if len(msgs) > 1 else [1]
        whole = sum(sizes) or 1
        self.total += n
        for m, s in zip(msgs, sizes):
            part = n * s / whole
            op = m.get("op") if isinstance(m, dict) else type(m).__name__
            self.by_op[str(op)][0] += part
            self.by_op[str(op)][1] += 1
            keys = _keys(m)
            if not keys:
                self.other += part
            for k in keys:
                self.by_key[k] += part / len(keys)

    def __enter__(self):
        from distributed.comm import tcp

        write = tcp.TCP.write
        wire = self

        async def counted(comm, msg, *args, **kwargs):
            n = await write(comm, msg, *args, **kwargs)
            if wire._mine(comm):
                wire._count(msg, n)
            return n

        tcp.TCP.write = counted
        self._restore = lambda: setattr(tcp.TCP, "write", write)
        return self

    def __exit__(self, *exc):
        self._restore()
