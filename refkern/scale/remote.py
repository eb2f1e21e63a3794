"""Audits and sweeps judged on a dask.distributed cluster.

The model runs where it runs; what an op's verdict needs (its output, its inputs, its keyword
arguments) is shipped to a worker as raw bits (:class:`Bits`: bfloat16 and float16 included, no
conversion), the reference and the verdict are computed there, and only the Report comes back.
A parameter (or buffer) of the audited model is scattered to the cluster once and named by its
future in every op that reads it; activations travel once per op, after the ``sample=`` sub-grid
has been cut; ops below 64 KB of operands travel together, up to 64 KB a task (their bits packed
when they run). Submissions wait while the bytes in flight exceed a budget, so memory stays bounded.
A task lost with its worker is submitted again, with its data embedded (a scattered parameter
that died with the worker is not needed): nothing is lost, and every verdict is the one a local
audit gives (the same code on the same bits).
"""

import pickle
import sys
import uuid
from dataclasses import dataclass

import numpy as np

__all__ = ["Bits", "pack", "unpack", "Remote", "judge", "remote_for", "resolve_audit", "DEFAULT_BUDGET"]

DEFAULT_BUDGET = 1 << 30  # bytes of operands in flight
BUNDLE = 1 << 16  # ops with fewer operand bytes travel together, up to this many bytes a task
VIEW = "rk-view"  # [VIEW, parameter's future, offset, shape, stride]: a parameter read through a view


@dataclass
class Bits:
    """A tensor as its raw bits: dtype name, shape and a contiguous numpy array of unsigned integers."""

    dtype: str
    shape: tuple
    raw: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def to_bits(t) -> Bits:
    torch = sys.modules["torch"]
    c = t.detach().to("cpu").contiguous()
    if c.dtype == torch.bool:
        raw = c.numpy().view(np.uint8)
    else:
        raw = c.view(getattr(torch, f"uint{8 * c.element_size()}") if c.element_size() > 1 else torch.uint8).numpy()
    return Bits(str(c.dtype).removeprefix("torch."), tuple(c.shape), raw.reshape(-1).copy())


def from_bits(b: Bits):
    import torch

    raw = torch.from_numpy(b.raw.view(_UINT[b.raw.itemsize]).copy())
    dt = getattr(torch, b.dtype)
    return (raw.view(torch.bool) if dt == torch.bool else raw.view(dt)).reshape(b.shape)


def _key(t):
    """The storage a tensor reads (a parameter's views share it, and its version counter)."""
    return (t.untyped_storage().data_ptr(), t.dtype)


def _view_of(t, p):
    """(offset, shape, stride) of ``t`` within the contiguous parameter ``p`` (whose storage it
    reads), or None if it reaches outside it."""
    if any(st < 0 for st in t.stride()):
        return None
    off = t.storage_offset() - p.storage_offset()
    top = off + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else off
    if off < 0 or top >= max(p.numel(), 1):
        return None
    return off, tuple(t.shape), tuple(t.stride())


def pack(obj, remote=None, embed=False):
    """``obj`` with every tensor replaced by its :class:`Bits`, or by the future of a parameter
    already scattered (``remote``, unless ``embed``): (packed, bytes embedded)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if remote is not None and not embed:
            got = remote.param_view(obj)
            if got is not None:
                return got, 0
        b = to_bits(obj)
        return b, b.nbytes
    if isinstance(obj, (list, tuple)):
        items = [pack(v, remote, embed) for v in obj]
        return type(obj)(v for v, _ in items) if isinstance(obj, tuple) else [v for v, _ in items], sum(
            n for _, n in items
        )
    if isinstance(obj, dict):
        items = {k: pack(v, remote, embed) for k, v in obj.items()}
        return {k: v for k, (v, _) in items.items()}, sum(n for _, n in items.values())
    return obj, 0


def unpack(obj):
    if isinstance(obj, Bits):
        return from_bits(obj)
    if isinstance(obj, list) and len(obj) == 5 and isinstance(obj[0], str) and obj[0] == VIEW:
        _, bits, offset, shape, stride = obj  # a parameter (its bits, scattered) seen through a view
        return from_bits(bits).reshape(-1).as_strided(shape, stride, offset)
    if isinstance(obj, (list, tuple)):
        return type(obj)(unpack(v) for v in obj) if isinstance(obj, tuple) else [unpack(v) for v in obj]
    if isinstance(obj, dict):
        return {k: unpack(v) for k, v in obj.items()}
    return obj


def judge(kind, op, actual, args, kwargs):
    """On a worker: ``compare`` (kind "forward") or ``compare_backward`` (kind "backward") of the
    unpacked call, as ("ok", result) or ("error", "Type: message") (the analysis' own failure)."""
    import refkern
    from refkern.scale._states import limit_threads

    limit_threads()
    try:
        actual, args, kwargs = unpack(actual), unpack(args), unpack(kwargs)
        if kind == "forward":
            return "ok", refkern.compare(actual, op, *args, **kwargs)
        grad_output, *rest = args
        return "ok", refkern.compare_backward(actual, op, grad_output, *rest, **kwargs)
    except Exception as exc:  # reported as the op's note, as a local audit does
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def judge_many(calls):
    """On a worker: :func:`judge` of each (kind, op, actual, args, kwargs) of a bundle, in order."""
    return [judge(*c) for c in calls]


@dataclass
class Pending:
    """A verdict being computed on the cluster (``key``: one gradient of a backward kernel's dict)."""

    job: "Job"
    key: object = None


@dataclass
class Job:
    kind: str
    op: str
    raw: tuple  # (actual, args, kwargs) as given, kept until the result is in (to submit again)
    nbytes: int
    future: object = None
    result: object = None
    done: bool = False
    tries: int = 0
    count: object = None  # the audit's counts key
    packed: tuple = None  # (kind, op, actual, args, kwargs) as shipped
    index: object = None  # its place in a bundle's list of verdicts (None: submitted alone)
    operand_bytes: int = 0  # its output, inputs and keyword tensors, as they are
    shipped_bytes: int = 0  # what was sent for it: bits, the pickled rest, parameters it scattered first


class Remote:
    """Submits verdicts to ``client`` and collects them (see the module docstring)."""

    def __init__(self, client, budget: int = DEFAULT_BUDGET):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"audit: budget must be a positive number of bytes; got budget={budget!r}.")
        self.client = client
        self.budget = budget
        self.jobs: list[Job] = []
        self.current = None  # the audit's op name (its counts' key) while it observes an op
        self._scattered = 0  # bytes of parameters scattered for the job being packed
        self._prefix, self._n = f"rk{uuid.uuid4().hex[:6]}-", 0  # scattered parameters' keys
        self._bundle = []  # small jobs packed, not yet submitted
        self._results = {}  # a bundle's future key -> its list of verdicts
        self._params = {}  # _key -> (parameter or buffer, (future of its Bits, its version then) or None)
        self.stats = {"ops": 0, "operand_bytes": 0, "shipped_bytes": 0, "params_scattered": 0,
                      "param_bytes": 0, "resubmitted": 0}  # fmt: skip

    # parameters: registered as the modules run, scattered on first use
    def register(self, t):
        if t.is_contiguous() and t.numel() and _key(t) not in self._params:
            self._params[_key(t)] = (t, None)

    def param_view(self, t):
        """A parameter's view as [VIEW, its future, offset, shape, stride], or None."""
        got = self._params.get(_key(t))
        if got is None:
            return None
        p, fut = got
        view = _view_of(t, p)
        if view is None:
            return None
        if fut is None or fut[1] != p._version or fut[0].status != "finished":
            # not yet shipped, written to since (a running mean), or lost with its worker
            b = to_bits(p)
            self._n += 1
            key = f"{self._prefix}{self._n}"  # short: every op that reads it names it
            fut = (self.client.scatter({key: b}, hash=False)[key], p._version)
            self._params[_key(t)] = (p, fut)
            self.stats["params_scattered"] += 1
            self.stats["param_bytes"] += b.nbytes
            self._scattered += b.nbytes + len(pickle.dumps(_skeleton(b)))
        off, shape, stride = view
        return [VIEW, fut[0], off, shape, stride]

    def _pack(self, job: Job, embed=False):
        """The job's tensors as bits now (an output written to in place later must not change what
        is judged); the bytes it ships, and those of the parameters it scattered first."""
        actual, args, kwargs = job.raw
        pa, na = pack(actual, self, embed)
        pg, ng = pack(args, self, embed)
        pk, nk = pack(kwargs, self, embed)
        job.nbytes = na + ng + nk
        job.packed = (job.kind, job.op, pa, pg, pk)
        sent = job.nbytes + self._scattered
        self._scattered = 0
        job.shipped_bytes += sent
        self.stats["shipped_bytes"] += sent

    def _submit(self, job: Job, embed=False):
        """Ship the job alone (parameters by their futures unless ``embed``); a failure to ship (a
        worker lost while scattering to it) is retried with everything embedded, then after a pause."""
        import time

        for attempt in range(6):
            try:
                self._pack(job, embed)
                job.future = self.client.submit(judge, *job.packed, pure=False)
                job.index = None
                break
            except Exception:
                if attempt == 5:
                    raise
                self.stats["resubmitted"] += 1
                embed = True
                time.sleep(0.2 * attempt)
        self._overhead([job], len(pickle.dumps(_skeleton(job.packed))))
        job.tries += 1

    def _overhead(self, jobs, nbytes):
        """What a message adds to its bits, shared by its jobs in proportion to their operands."""
        total = sum(j.operand_bytes for j in jobs) or 1
        for j in jobs:
            share = nbytes * (j.operand_bytes or total / len(jobs)) / total
            j.shipped_bytes += share
            self.stats["shipped_bytes"] += share

    def _flush(self):
        """The small jobs waiting, in one task (their verdicts come back as one list)."""
        jobs, self._bundle = self._bundle, []
        if not jobs:
            return
        calls = [j.packed for j in jobs]
        try:
            fut = self.client.submit(judge_many, calls, pure=False)
        except Exception:  # the cluster lost a worker while we shipped: each alone, embedded
            for j in jobs:
                self._submit(j, embed=True)
            return
        self._overhead(jobs, len(pickle.dumps(_skeleton(calls))))
        for i, j in enumerate(jobs):
            j.future, j.index = fut, i
            j.tries += 1

    def _operand_bytes(self, obj):
        torch = sys.modules["torch"]
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, (list, tuple)):
            return sum(self._operand_bytes(v) for v in obj)
        if isinstance(obj, dict):
            return sum(self._operand_bytes(v) for v in obj.values())
        return 0

    def submit(self, kind, op, actual, args, kwargs):
        job = Job(kind, op, (actual, tuple(args), dict(kwargs)), 0)
        job.count = self.current
        job.operand_bytes = self._operand_bytes(job.raw)
        self.stats["ops"] += 1
        self.stats["operand_bytes"] += job.operand_bytes
        self._wait_for_room()
        self.jobs.append(job)
        if job.operand_bytes >= BUNDLE:
            self._submit(job)
            return job
        try:
            self._pack(job)
        except Exception:  # a scatter to a worker that just died: this job's parameters embedded
            self.stats["resubmitted"] += 1
            self._pack(job, embed=True)
        self._bundle.append(job)
        if sum(j.operand_bytes for j in self._bundle) >= BUNDLE:
            self._flush()
        return job

    def compare(self, actual, op, args, kwargs):
        return Pending(self.submit("forward", op, actual, args, kwargs))

    def compare_backward(self, grads: dict, op, grad_output, args, kwargs):
        job = self.submit("backward", op, grads, (grad_output, *args), kwargs)
        return {k: Pending(job, k) for k in grads}

    def _in_flight(self):
        return [j for j in self.jobs if not j.done and j.future is not None]

    def _wait_for_room(self):
        from distributed import wait

        while True:
            live = self._in_flight()
            if not live or sum(j.nbytes for j in live) <= self.budget:
                return
            wait([j.future for j in live], return_when="FIRST_COMPLETED")
            for j in live:
                if j.future.done():
                    self._collect(j)

    def _collect(self, job: Job):
        """The job's result, submitting it again (data embedded) if its worker died with it."""
        if job.future is None:
            self._flush()
        while True:
            try:
                if job.index is None:
                    job.result = job.future.result()
                else:  # one of a bundle's verdicts (the list fetched once)
                    key = job.future.key
                    if key not in self._results:
                        self._results[key] = job.future.result()
                    job.result = self._results[key][job.index]
                break
            except Exception:  # the task or its inputs were lost (a worker died): submit it again
                if job.tries >= 4:
                    job.result = ("error", "lost on the cluster 4 times")
                    break
                self.stats["resubmitted"] += 1
                self._submit(job, embed=True)
        job.done = True
        job.future = None
        job.packed = None
        if job.result[0] == "ok" or job.kind == "forward":
            job.raw = None  # its tensors are released (a backward kernel's, once judged, or judged one by one)

    def finish(self):
        self._flush()
        for j in self.jobs:
            if not j.done:
                self._collect(j)
        self._results.clear()

    def resolve(self, p: Pending):
        """(report, None) or (None, note) for a pending verdict (after :meth:`finish`)."""
        status, value = p.job.result
        if status != "ok":
            return None, f"not analysed: {value}"
        if p.key is None:
            return value, None
        if p.key in value:
            return value[p.key], None
        return None, "not analysed: no gradient returned"


def _skeleton(obj):
    """What pickling adds around the raw bits: the structure, with arrays and futures as stubs."""
    if isinstance(obj, Bits):
        return (obj.dtype, obj.shape)
    if isinstance(obj, (list, tuple)):
        return [_skeleton(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _skeleton(v) for k, v in obj.items()}
    if type(obj).__name__ == "Future":
        return str(getattr(obj, "key", ""))
    try:
        pickle.dumps(obj)
        return obj
    except Exception:
        return repr(obj)


def remote_for(client, budget=None) -> Remote:
    """A :class:`Remote` for an audit; ``client`` must be a ``dask.distributed.Client``."""
    try:
        from distributed import Client
    except ImportError:
        from refkern.scale import INSTALL

        raise ImportError(f"audit: client= needs dask.distributed, an optional extra: {INSTALL}") from None
    if not isinstance(client, Client):
        raise TypeError(f"audit: client must be a dask.distributed.Client; got {type(client).__name__}.")
    return Remote(client, DEFAULT_BUDGET if budget is None else budget)


def _uncount(a, job, why):
    name = job.count
    if name is None or name not in a.counts:
        return
    c = a.counts[name]
    if c[0] > 0:
        c[0] -= 1
        c[1] += 1
        a.unchecked[name] = a.unchecked.get(name, 0) + 1
        a.reasons.setdefault(name, why)


def resolve_audit(a) -> None:
    """Every pending verdict of audit ``a`` in place: reports, notes for an analysis that failed
    (counted as not checked, as a local audit counts it)."""
    r = a._remote
    r.finish()
    failed = set()
    for c in a.calls:
        if isinstance(c.report, Pending):
            p = c.report
            rep, note = r.resolve(p)
            if rep is None and p.job.kind == "backward" and p.job.raw is not None:
                rep, note = _backward_alone(p)  # as a local audit does: this gradient on its own
            c.report = rep
            if note is not None:
                c.note = note
                if id(p.job) not in failed:
                    failed.add(id(p.job))
                    _uncount(a, p.job, note)
        for k, v in list(c.parts.items()):
            if isinstance(v, Pending):
                rep, note = r.resolve(v)
                c.parts[k] = rep if rep is not None else f"not analysed ({note.removeprefix('not analysed: ')})"


def _backward_alone(p: Pending):
    import refkern

    grads, args, kwargs = p.job.raw
    try:
        rep = refkern.compare_backward({p.key: grads[p.key]}, p.job.op, args[0], *args[1:], **kwargs)[p.key]
        return rep, None
    except Exception as exc:
        return None, f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
