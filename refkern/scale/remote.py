"""Audits and sweeps judged on a dask.distributed cluster.

The model runs where it runs; what an op's verdict needs (its output, its inputs, its keyword
arguments) is shipped to a worker as raw bits (bfloat16 and float16 included, no conversion),
the reference and the verdict are computed there (:mod:`refkern.scale.worker`), and only the
Report comes back.

What travels, and why (each figure measured at the TCP layer, :mod:`refkern.scale.wire`): a Dask
task of ``bytes`` arguments costs about 0.75 KB of Dask's own framing (its ``update-graph``
message), 0.06 KB to fetch its result and 0.12 KB to release it; a scatter about 0.5 KB; a numpy
array inside a task about 0.1 KB of pickled metadata. So an op does not travel alone, and its
tensors are not arrays:

* ops travel in **messages** of at least 64 KB of operands (an op that large alone): one task
  whose arguments are one ``bytes`` blob (every embedded tensor's bits: :mod:`refkern.scale.bits`)
  and one header (:mod:`refkern.scale.header`: the message's distinct definitions once, an op's
  name, keywords and structure, a dtype and shape, a view of a parameter; then each op as a row
  of varints naming them; the names refkern knows are never sent as text). A message is sent
  only when the next one already holds 64 KB, so the audit's tail joins the last message instead
  of travelling short. A message of under 64 KB of operands (an audit that small, an op sent
  again alone) carries its bits as byte planes deflated, where that is smaller: Dask's framing of
  about 1 KB a message is otherwise more than a tenth of an audit under 10 KB;
* a **parameter** (or buffer) of the audited model is captured when an op first reads it (its
  bits then, a new capture if written to since: a running mean) and named by a small integer
  afterwards; the parameters captured since the last message travel in one scattered blob just
  before it (inside it, for the audit's last message) and stay on the cluster until the audit
  ends. A view of one is rebuilt on the worker;
* activations travel once per op, after the ``sample=`` sub-grid has been cut.

Submissions wait while the bytes in flight exceed a budget, so memory stays bounded. A message
whose worker dies is run again by the scheduler (its data is in it); one that needs a parameter
blob that died with its worker is sent again one op at a time, every tensor embedded: nothing is
lost, and every verdict is the one a local audit gives (the same code on the same bits).
:meth:`Remote.per_job` says what each op cost, from the payload or from the bytes measured on
the wire.
"""

import pickle
import sys
import uuid
from dataclasses import dataclass, field

from refkern.scale.bits import pack, to_bits
from refkern.scale.header import HeaderWriter, encode, strip
from refkern.scale.worker import judge_bundle

__all__ = ["Remote", "Pending", "remote_for", "resolve_audit", "DEFAULT_BUDGET", "BUNDLE"]

DEFAULT_BUDGET = 1 << 30  # bytes of operands in flight
BUNDLE = 1 << 16  # operand bytes a message holds at least (an op this large travels alone)


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


@dataclass(eq=False)
class Pending:
    """A verdict being computed on the cluster (``key``: one gradient of a backward kernel's dict)."""

    job: "Job"
    key: object = None


@dataclass(eq=False)
class Job:
    kind: str
    op: str
    raw: tuple  # (actual, args, kwargs) as given, kept until the result is in (to submit again)
    nbytes: int = 0  # bits embedded
    future: object = None
    result: object = None
    done: bool = False
    tries: int = 0
    count: object = None  # the audit's counts key
    entry: tuple = None  # (template (op, structure[, kind]), refs), interned, as shipped
    parts: list = None  # the embedded tensors' bits (numpy arrays), in the order of refs
    pids: tuple = ()  # the parameters it reads
    index: int = 0  # its place in its task's list of verdicts
    operand_bytes: int = 0  # its output, inputs and keyword tensors, as they are
    own: list = field(default_factory=list)  # (message, bytes of it that are this op's own)


@dataclass(eq=False)
class Message:
    """One send: its Dask keys (the task's, and the parameter scatter's that went just before it), the
    payload handed to Dask, and its ops (those it carries, those whose parameters it carried first)."""

    keys: list
    payload: int = 0
    jobs: list = field(default_factory=list)

    def add(self, job: Job, nbytes: float):
        job.own.append((self, nbytes))
        if not any(j is job for j in self.jobs):
            self.jobs.append(job)


class Remote:
    """Submits verdicts to ``client`` and collects them (see the module docstring)."""

    def __init__(self, client, budget: int = DEFAULT_BUDGET):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"audit: budget must be a positive number of bytes; got budget={budget!r}.")
        self.client = client
        self.budget = budget
        self.jobs: list[Job] = []
        self.messages: list[Message] = []
        self.current = None  # the audit's op name (its counts' key) while it observes an op
        self._prefix, self._n = f"rk{uuid.uuid4().hex[:6]}-", 0  # short Dask keys: every message names one
        self._bundle = []  # jobs encoded, not yet sent
        self._results = {}  # a message's key -> its list of verdicts
        self._params = {}  # _key -> (parameter or buffer, (pid, its version then) or None)
        self._pid_key = {}  # pid -> _key (to forget a capture lost with its worker)
        self._next_pid = 0
        self._captured = []  # (pid, Bits, job that read it first): not yet scattered
        self._blobs = {}  # pid -> future of the scattered blob that holds it
        self._interned = {}
        self.stats = {"ops": 0, "operand_bytes": 0, "payload_bytes": 0, "tasks": 0, "scatters": 0,
                      "params_scattered": 0, "param_bytes": 0, "resubmitted": 0}  # fmt: skip

    def _name(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n}"

    def _intern(self, obj):
        """One object per value (its header encoding), so that a message defines it once."""
        try:
            k = encode(obj)
        except Exception:
            return obj
        if len(self._interned) > 100_000:
            self._interned.clear()
        return self._interned.setdefault(k, obj)

    # parameters: registered as the modules run, captured on first read, scattered with the next message
    def register(self, t):
        if t.is_contiguous() and t.numel() and _key(t) not in self._params:
            self._params[_key(t)] = (t, None)

    def _param_ref(self, t, job):
        """A parameter's reference (its pid, or (pid, offset, shape, stride) for a view), or None."""
        got = self._params.get(_key(t))
        if got is None:
            return None
        p, cap = got
        view = _view_of(t, p)
        if view is None:
            return None
        if cap is None or cap[1] != p._version:  # not yet captured, or written to since (a running mean)
            b = to_bits(p)
            cap = (self._next_pid, p._version)
            self._next_pid += 1
            self._params[_key(t)] = (p, cap)
            self._pid_key[cap[0]] = _key(t)
            self._captured.append((cap[0], b, job))
            self.stats["params_scattered"] += 1
            self.stats["param_bytes"] += b.nbytes
        pid = cap[0]
        off, shape, stride = view
        if off == 0 and shape == tuple(p.shape) and stride == tuple(p.stride()):
            return pid
        return self._intern((pid, off, shape, stride))

    def _encode(self, job: Job, embed=False):
        """The job's entry and bits, now (an output written to in place later must not change what
        is judged); parameters by reference unless ``embed``."""
        actual, args, kwargs = job.raw
        tensors = []
        template = (job.op, strip((actual, args, kwargs), tensors))
        template = self._intern(template if job.kind == "forward" else (*template, job.kind))
        refs, parts, pids = [], [], []
        for t in tensors:
            r = None if embed else self._param_ref(t, job)
            if r is None:
                b = to_bits(t)
                parts.append(b.raw)
                r = self._intern((b.dtype, b.shape))
            else:
                pids.append(r if isinstance(r, int) else r[0])
            refs.append(r)
        job.entry = (template, refs)
        job.parts, job.pids = parts, tuple(pids)
        job.nbytes = sum(p.nbytes for p in parts)

    def _header(self, jobs: list, msg: Message) -> bytes:
        """The header of a task carrying ``jobs`` (:mod:`refkern.scale.header`). Each op's own bytes:
        its row, and of each definition it uses the definition's bytes over the number of ops
        using it; the first line is the message's."""
        defs, users = {}, {}
        for j in jobs:
            template, refs = j.entry
            for d in (template, *(r for r in refs if isinstance(r, tuple))):
                defs.setdefault(id(d), d)
                users.setdefault(id(d), set()).add(id(j))
        index = {k: i for i, k in enumerate(defs)}
        w = HeaderWriter()
        w.first(len(defs), len(jobs))
        size = {k: w.define(d) for k, d in defs.items()}
        for i, j in enumerate(jobs):
            template, refs = j.entry
            items = (index[id(template)], *(index[id(r)] if isinstance(r, tuple) else len(defs) + r for r in refs))
            used = {id(d) for d in (template, *refs) if isinstance(d, tuple)}
            msg.add(j, w.row(items) + sum(size[k] / len(users[k]) for k in used))
            j.index = i
        return w.getvalue()

    @staticmethod
    def _pack(parts: list, owners: list, msg: Message, small: bool) -> bytes:
        """``parts`` (numpy arrays of bits, each of the job in ``owners`` at its place) as one blob,
        byte planes deflated if the message is ``small`` (under BUNDLE operand bytes: Dask's own
        framing, about 1 KB a message, is then more than 1.5% of it; a larger one is not worth
        the client's time) and that is smaller (:func:`refkern.scale.bits.pack`). Each job's own
        bytes: the blob's bytes in proportion to its bits in it (a deflated stream is not cut by op)."""
        raw = sum(p.nbytes for p in parts)
        blob = pack(parts, planes=small)
        for p, j in zip(parts, owners):
            msg.add(j, (len(blob) - 1) * p.nbytes / (raw or 1))
        return blob

    def _captured_blob(self, msg: Message, small: bool):
        """The parameters captured since the last send as one blob, (first pid, metas, packed bits):
        their bytes are the own bytes of the op that read each first."""
        got, self._captured = self._captured, []
        if not got:
            return None
        first = got[0][0]
        blob = self._pack([b.raw for _, b, _ in got], [job for _, _, job in got], msg, small)
        return first, [(b.dtype, b.shape) for _, b, _ in got], blob

    def _forget(self, pid):
        """A parameter capture lost (its blob died with a worker): the next read captures it again."""
        self._blobs.pop(pid, None)
        k = self._pid_key.pop(pid, None)
        if k in self._params and self._params[k][1] is not None and self._params[k][1][0] == pid:
            self._params[k] = (self._params[k][0], None)

    def _send(self, jobs: list, final=False):
        """``jobs`` (encoded) in one task. The parameters captured since the last send go just before
        it, scattered (later tasks name them), or inside it if ``final`` (no op comes after). Jobs
        whose parameter blob was lost, or the whole message if the cluster fails while it is
        shipped, go one by one with everything embedded."""
        msg = Message([])
        self.messages.append(msg)
        blob_of = {}  # pid -> what the task is given for it: a scattered blob's future, or the blob itself
        small = sum(j.operand_bytes for j in jobs) < BUNDLE  # an audit that small (all of it in one message)
        captured = self._captured_blob(msg, small)
        if captured is not None:
            first, metas, raw = captured
            extra = len(raw) + len(pickle.dumps((first, metas)))  # as Dask pickles it, about
            msg.payload += extra
            self.stats["payload_bytes"] += extra
            pids = range(first, first + len(metas))
            if final:
                blob_of.update((p, captured) for p in pids)
            else:
                key = self._name()
                try:
                    fut = self.client.scatter({key: captured}, hash=False)[key]
                except Exception:  # a worker lost while scattering: captured again when next read
                    for p in pids:
                        self._forget(p)
                    for j in jobs:
                        self._alone(j)
                    return
                msg.keys.append(key)
                self.stats["scatters"] += 1
                for p in pids:
                    self._blobs[p] = fut
        ok = []
        for j in jobs:
            lost = [p for p in j.pids if p not in blob_of and getattr(self._blobs.get(p), "status", None) != "finished"]
            for p in lost:
                self._forget(p)
            (self._alone(j) if lost else ok.append(j))
        if not ok:
            return
        ok.sort(key=lambda j: -j.operand_bytes)  # a definition's first bytes written while the largest op reads
        header = self._header(ok, msg)
        blob = self._pack([p for j in ok for p in j.parts], [j for j in ok for _ in j.parts], msg, small)
        given = {}
        for j in ok:
            for p in j.pids:
                g = blob_of.get(p) or self._blobs[p]
                given[id(g)] = g
        key = self._name()
        try:
            fut = self.client.submit(judge_bundle, header, blob, list(given.values()), key=key, pure=False)
        except Exception:
            for j in ok:
                j.own = [(m, n) for m, n in j.own if m is not msg]
                self._alone(j)
            return
        msg.keys.append(key)
        msg.payload += len(header) + len(blob)
        self.stats["tasks"] += 1
        self.stats["payload_bytes"] += len(header) + len(blob)
        for j in ok:
            j.future = fut
            j.tries += 1
            j.parts = None

    def _alone(self, job: Job):
        """``job`` in a task of its own, every tensor embedded (after a loss); retried after a pause
        while the cluster recovers."""
        import time

        self.stats["resubmitted"] += 1
        for attempt in range(6):
            msg = Message([])
            try:
                self._encode(job, embed=True)
                header = self._header([job], msg)
                blob = self._pack(job.parts, [job] * len(job.parts), msg, job.operand_bytes < BUNDLE)
                key = self._name()
                job.future = self.client.submit(judge_bundle, header, blob, [], key=key, pure=False)
                break
            except Exception:
                job.own = [(m, n) for m, n in job.own if m is not msg]
                if attempt == 5:
                    raise
                time.sleep(0.2 * attempt)
        msg.keys.append(key)
        msg.payload = len(header) + len(blob)
        self.messages.append(msg)
        self.stats["tasks"] += 1
        self.stats["payload_bytes"] += msg.payload
        job.parts = None
        job.tries += 1

    def _flush(self, everything=True, final=False):
        """Send the jobs waiting: all of them, or (``everything`` False) the oldest that hold at
        least BUNDLE operand bytes, the rest waiting for the next message."""
        if not self._bundle:
            return
        if everything:
            jobs, self._bundle = self._bundle, []
        else:
            n, acc = 0, 0
            while n < len(self._bundle) and acc < BUNDLE:
                acc += self._bundle[n].operand_bytes
                n += 1
            jobs, self._bundle = self._bundle[:n], self._bundle[n:]
        self._send(jobs, final=final)

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
        job = Job(kind, op, (actual, tuple(args), dict(kwargs)))
        job.count = self.current
        job.operand_bytes = self._operand_bytes(job.raw)
        self.stats["ops"] += 1
        self.stats["operand_bytes"] += job.operand_bytes
        self._wait_for_room()
        self.jobs.append(job)
        self._encode(job)
        if job.operand_bytes >= BUNDLE:  # large enough to travel alone
            self._send([job])
            return job
        self._bundle.append(job)
        if sum(j.operand_bytes for j in self._bundle) >= 2 * BUNDLE:  # the next message would be full too
            self._flush(everything=False)
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
        """The job's result, sending it again (data embedded) if its worker died with it."""
        if job.future is None:
            self._flush()
        while True:
            try:
                key = job.future.key
                if key not in self._results:  # a task's list of verdicts, fetched once
                    self._results[key] = job.future.result()
                job.result = self._results[key][job.index]
                break
            except Exception:  # the task or its inputs were lost (a worker died): send it again
                if job.tries >= 4:
                    job.result = ("error", "lost on the cluster 4 times")
                    break
                self._alone(job)
        job.done = True
        job.future = None
        job.entry = None
        if job.result[0] == "ok" or job.kind == "forward":
            job.raw = None  # its tensors are released (a backward kernel's, once judged, or judged one by one)

    def finish(self):
        self._flush(final=True)
        for j in self.jobs:
            if not j.done:
                self._collect(j)
        self._results.clear()
        self._blobs.clear()  # the parameter blobs released on the cluster
        self._params = {k: (p, None) for k, (p, _) in self._params.items()}

    def per_job(self, wire=None) -> list:
        """[(job, bytes sent for it)]. Per message: each op's own bytes (its embedded bits, its
        header entry and its share of the definitions it uses, the bits of the parameters it read
        first), and a share of the rest in proportion to operand bytes: the header's first line,
        the parameters' list, and with ``wire`` (a :class:`refkern.scale.wire.Wire`) everything
        Dask wrote for the message's keys (its framing, the result's request and release). With
        ``wire``, its bytes that name no key (heartbeats, handshakes) are shared the same way."""
        sent = {id(j): 0.0 for j in self.jobs}
        for m in self.messages:
            total = sum(wire.by_key.get(k, 0.0) for k in m.keys) if wire is not None else m.payload
            own = {id(j): sum(n for g, n in j.own if g is m) for j in m.jobs}
            rest = max(total - sum(own.values()), 0.0)
            weight = sum(j.operand_bytes for j in m.jobs) or 1
            for j in m.jobs:
                sent[id(j)] += own[id(j)] + rest * j.operand_bytes / weight
        if wire is not None:
            weight = sum(j.operand_bytes for j in self.jobs) or 1
            for j in self.jobs:
                sent[id(j)] += wire.other * j.operand_bytes / weight
        return [(j, sent[id(j)]) for j in self.jobs]

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
    from refkern.gradients import compare_backward

    grads, args, kwargs = p.job.raw
    try:
        rep = compare_backward({p.key: grads[p.key]}, p.job.op, args[0], *args[1:], **kwargs)[p.key]
        return rep, None
    except Exception as exc:
        return None, f"not analysed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
