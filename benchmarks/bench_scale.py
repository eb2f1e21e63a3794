"""refkern on Dask (issue 28): the exact sum of a chunked array, a sweep and an audit on a cluster.

    python benchmarks/bench_scale.py [--quick] [--json FILE]

Issue 28's targets, each a ratio measured in this run:

* ``sum_2e8_f32``: the exact sum of 2 x 10**8 float32 normals generated chunk by chunk
  (``refkern.sum`` of a Dask array on a two-worker local cluster, chunks of 2**22) within 1.3x the
  local time: the same blocks generated into one numpy array and summed by ``refkern.sum``. Both
  sides generate the values (they are not stored anywhere); the peak memory of the Dask side
  (every process of it) is reported beside the 800 MB the array takes. For information: the
  same sum on the threaded scheduler, and Dask's overhead alone (``from_array`` of the array
  already in memory, threaded scheduler, against ``refkern.sum`` of it).
* ``sweep_200``: a sweep of 200 matmul points (m = n = 16, K = 16 .. 3200; the backend is
  torch's CPU matmul, the analysis refkern's ``refkern sweep`` row) at least 1.7x faster with two
  workers than serially in this process (numba on every core), rows identical. The cluster is
  started and warmed before the timing.
* ``audit_bytes``: an audit on the cluster (a small ResNet, and the 7-op model of the tests whose
  one message is under 15 KB; fp32 and bf16): bytes shipped per audited op at most 1.1x its
  operands and output (the largest ratio over ops, and the total; for the 7-op model also without
  deflating its bits, what an audit whose bits do not deflate would cost),
  each parameter scattered once, verdicts equal to the local audit's. The bytes are those the
  client writes, counted at the TCP layer (:class:`refkern.scale.wire.Wire`): Dask's framing of
  every task and scatter, the requests for results and their releases, heartbeats included; the
  verdicts coming back are reported beside them (pickled size), not counted.

Each side is timed in blocks of consecutive calls (benchmarks/_timing.py); the best block counts.
"""

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _timing import per_call  # noqa: E402

import refkern as rk  # noqa: E402

TARGETS = {"sum_2e8_f32": 1.3, "sweep_200": 1.7, "audit_bytes": 1.1}
CHUNK = 1 << 22


def _block(seed, n):
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def _gen(block_info=None):
    ((lo, hi),) = block_info[None]["array-location"]
    return _block(lo // CHUNK, hi - lo)


def _local_sum(n):
    x = np.empty(n, np.float32)
    for s in range(0, n, CHUNK):
        x[s : s + CHUNK] = _block(s // CHUNK, min(CHUNK, n - s))
    return rk.sum(x)


class Peak:
    """The largest summed RSS of this process and its children while inside (sampled every 20 ms),
    and ``base``, the sum on entry."""

    def __enter__(self):
        import psutil

        self.peak, self._stop = 0, False
        me = psutil.Process()
        self.base = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])

        def run():
            while not self._stop:
                try:
                    procs = [me, *me.children(recursive=True)]
                    self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
                except Exception:
                    pass
                time.sleep(0.02)

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()


def bench_sum(client, n, blocks):
    import dask.array as da

    x = da.map_blocks(_gen, chunks=((CHUNK,) * (n // CHUNK) + ((n % CHUNK,) if n % CHUNK else ()),),
                      dtype=np.float32, meta=np.empty(0, np.float32))  # fmt: skip
    lazy = rk.sum(x)
    want = _local_sum(n)
    got = client.compute(lazy, sync=True)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (got, want)
    assert np.asarray(lazy.compute(scheduler="threads")).tobytes() == np.asarray(want).tobytes()
    t = per_call({"local": (lambda: _local_sum(n), 1), "dask_2_workers": (lambda: client.compute(lazy, sync=True), 1),
                  "dask_threads": (lambda: lazy.compute(scheduler="threads"), 1)}, blocks)  # fmt: skip
    with Peak() as pk:
        client.compute(lazy, sync=True)
    held = np.concatenate([_block(s // CHUNK, min(CHUNK, n - s)) for s in range(0, min(n, 8 * CHUNK), CHUNK)])
    d = da.from_array(held, chunks=CHUNK)
    t2 = per_call({"in_memory": (lambda: rk.sum(held), 5),
                   "dask_from_array": (lambda: rk.sum(d).compute(scheduler="threads"), 5)},
                  blocks)  # fmt: skip
    return {"n": n, "chunk": CHUNK, "value": float(want), "seconds": t,
            "ratio": t["dask_2_workers"] / t["local"], "ratio_threads": t["dask_threads"] / t["local"],
            "peak_rss_dask_MB": pk.peak / 2**20, "rss_growth_dask_MB": (pk.peak - pk.base) / 2**20,
            "array_MB": n * 4 / 2**20,
            "overhead": {"n": held.size, "seconds": t2, "ratio": t2["dask_from_array"] / t2["in_memory"]}}  # fmt: skip


def _sweep_inputs(npts):
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(npts):
        k = 16 * (i + 1)
        a, b = torch.randn(16, k, generator=g), torch.randn(k, 16, generator=g)
        out.append((k, a, b, torch.matmul(a, b)))
    return out


def bench_sweep(client, npts, blocks):
    from refkern.scale.sweep import Points

    pts = _sweep_inputs(npts)

    def run(c):
        p = Points(c)
        for k, a, b, out in pts:
            p.add("matmul", out, (a, b), k, "cpu")
        return p.rows()

    serial = run(None)
    assert run(client) == serial
    t = per_call({"serial": (lambda: run(None), 1), "two_workers": (lambda: run(client), 1)}, blocks)
    return {"points": npts, "seconds": t, "speedup": t["serial"] / t["two_workers"]}


class Tiny:
    """The 7-op model of tests/test_scale_audit.py (14.6 KB of operands in fp32, 7.6 KB in bf16: one
    message, where Dask's own framing of about 1 KB is more than a tenth of it)."""

    @staticmethod
    def make():
        import torch
        from torch import nn

        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.norm = nn.Linear(24, 24), nn.LayerNorm(24)
                self.conv, self.out = nn.Conv1d(1, 2, 3, padding=1), nn.Linear(48, 10)

            def forward(self, x):
                h = self.norm(self.fc(torch.relu(self.fc(x))))
                return torch.softmax(self.out(self.conv(h[:, None, :]).flatten(1)), -1)

        return Shared(), (6, 24)


def _audit_once(client, m, x, deflate=True):
    """(local audit, cluster audit, Wire, seconds on the cluster); ``deflate`` False ships every blob
    back to back (what an audit whose bits do not deflate costs)."""
    import torch

    import refkern.torch as rkt
    from refkern.scale import bits, remote
    from refkern.scale.wire import Wire

    with torch.no_grad(), rkt.audit(progress=False) as local:
        m(x)
    remote.pack = bits.pack if deflate else (lambda arrays, planes=True: bits.pack(arrays, False))
    try:
        t0 = time.perf_counter()
        with Wire(client) as w:
            with torch.no_grad(), rkt.audit(progress=False, client=client) as far:
                m(x)
            secs = time.perf_counter() - t0
            time.sleep(0.5)  # the releases sent once the verdicts are in
    finally:
        remote.pack = bits.pack
    return local, far, w, secs


def bench_audit(client):
    """Bytes the client writes per audited op, measured at the TCP layer (refkern.scale.wire): each op
    its own bytes (bits, header row and share of definitions, parameters it read first) and a share,
    in proportion to operands, of its message's framing and of the bytes that name no Dask key. A
    small ResNet (several messages) and the 7-op model (one message), fp32 and bf16."""
    import pickle

    import torch
    from audit_models import resnet18

    models = {"resnet18_w8": (lambda: resnet18(num_classes=10, width=8), (2, 3, 32, 32)), "tiny_7ops": Tiny.make}
    out = {}
    for name, make in models.items():
        for dt in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            m, shape = make() if name == "tiny_7ops" else (make[0](), make[1])
            m = m.to(dt).eval()
            x = torch.randn(*shape).to(dt)
            local, far, w, secs = _audit_once(client, m, x)
            r = far._remote
            ops = r.stats["operand_bytes"]
            sent = r.per_job(w)
            ratios = [(b / j.operand_bytes, j) for j, b in sent if j.operand_bytes]
            worst, wj = max(ratios, key=lambda t: t[0])
            payload = max(b / j.operand_bytes for j, b in r.per_job() if j.operand_bytes)
            back = sum(len(pickle.dumps(j.result)) for j in r.jobs)  # the verdicts, pickled (what returns)
            row = {
                "ops": r.stats["ops"], "operand_bytes": ops, "wire_bytes": w.total, "total_ratio": w.total / ops,
                "max_ratio_per_op": worst, "worst_op": {"op": wj.op, "operand_bytes": wj.operand_bytes},
                "attributed_bytes": sum(b for _, b in sent), "max_payload_ratio_per_op": payload,
                "payload_bytes": r.stats["payload_bytes"], "tasks": r.stats["tasks"], "scatters": r.stats["scatters"],
                "wire_by_message": {k: {"bytes": v[0], "count": v[1]} for k, v in w.by_op.items()},
                "unkeyed_bytes": w.other, "verdict_bytes_back": back, "verdict_ratio_back": back / ops,
                "params": len(list(m.parameters())) + len(list(m.buffers())),
                "params_scattered": r.stats["params_scattered"], "param_bytes": r.stats["param_bytes"],
                "same_verdicts": far.to_dict() == local.to_dict(), "seconds_on_cluster": secs,
                "ops_over_1.1": sum(q > 1.1 for q, _ in ratios),
                "largest_operands_over_1.1": max((j.operand_bytes for q, j in ratios if q > 1.1), default=0),
                "smallest_operands": min(j.operand_bytes for j in r.jobs)}  # fmt: skip
            if name == "tiny_7ops":  # for information: the same audit with no blob deflated
                _, far2, w2, _ = _audit_once(client, m, x, deflate=False)
                q2 = max(b / j.operand_bytes for j, b in far2._remote.per_job(w2) if j.operand_bytes)
                row["without_deflate"] = {"wire_bytes": w2.total, "total_ratio": w2.total / ops, "max_ratio_per_op": q2}
            out[f"{name}_{str(dt).removeprefix('torch.')}"] = row
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 x 10**7 elements, 60 sweep points, one block")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--only", choices=("sum", "sweep", "audit"), help="one measure alone")
    a = p.parse_args(argv)
    from refkern.scale.cluster import local_client

    n = 2 * 10**7 if a.quick else 2 * 10**8
    npts = 60 if a.quick else 200
    blocks = 1 if a.quick else 2
    client = local_client(2)
    try:
        client.run(lambda: __import__("refkern.torch"))  # warm: imports and numba caches loaded on each worker
        res = {"machine": {"cores": os.cpu_count(), "load_before": os.getloadavg()}}
        runs = {"sum": lambda: bench_sum(client, n, blocks), "sweep": lambda: bench_sweep(client, npts, blocks),
                "audit": lambda: bench_audit(client)}  # fmt: skip
        for name, run in runs.items():
            if a.only in (None, name):
                res[name] = run()
        res["machine"]["load_after"] = os.getloadavg()
    finally:
        client.close()
        client.cluster.close()
    s, w, au = res.get("sum"), res.get("sweep"), res.get("audit")
    checks = {}
    if s:
        checks["sum_2e8_f32"] = (s["ratio"], s["ratio"] <= TARGETS["sum_2e8_f32"])
    if w:
        checks["sweep_200"] = (w["speedup"], w["speedup"] >= TARGETS["sweep_200"])
    if au:
        checks["audit_bytes"] = (max(v["max_ratio_per_op"] for v in au.values()),
                                 all(v["max_ratio_per_op"] <= TARGETS["audit_bytes"] and v["same_verdicts"]
                                     and v["params_scattered"] <= v["params"] for v in au.values()))  # fmt: skip
    res["targets"] = {k: {"value": v, "target": TARGETS[k], "met": ok} for k, (v, ok) in checks.items()}
    print(f"{'measure':<44} {'value':>10} {'target':>8}  met")
    if s:
        met = checks["sum_2e8_f32"][1]
        print(f"{'sum 2e8 f32: dask 2 workers / local':<44} {s['ratio']:>10.3f} {'<= 1.3':>8}  {met}")
        print(f"{'  dask threads / local':<44} {s['ratio_threads']:>10.3f}")
        print(f"{'  local s, dask s':<44} {s['seconds']['local']:>10.3f} {s['seconds']['dask_2_workers']:>8.3f}")
        print(f"{'  dask side: RSS growth MB (peak), array MB':<44} {s['rss_growth_dask_MB']:>10.0f} "
              f"{s['array_MB']:>8.0f}")  # fmt: skip
        print(f"{'  overhead: from_array / in memory':<44} {s['overhead']['ratio']:>10.3f}")
    if w:
        print(f"{'sweep 200: serial / 2 workers':<44} {w['speedup']:>10.3f} {'>= 1.7':>8}  {checks['sweep_200'][1]}")
    for dt, v in (au or {}).items():
        q, wo = v["max_ratio_per_op"], v["worst_op"]
        print(f"{'audit ' + dt + ': wire / operands, worst op':<44} {q:>10.3f} {'<= 1.1':>8}  {q <= 1.1}"
              f"   ({wo['op']}, {wo['operand_bytes']} B)")  # fmt: skip
        if "without_deflate" in v:
            nd = v["without_deflate"]
            print(f"{'  not deflated: worst op, total':<44} {nd['max_ratio_per_op']:>10.3f} {nd['total_ratio']:>8.3f}")
        print(f"{'  total; params scattered / params; same':<44} {v['total_ratio']:>10.3f} "
              f"{v['params_scattered']:>4}/{v['params']:<4} {v['same_verdicts']}")  # fmt: skip
        print(f"{'  ops over 1.1x of all; their largest operands B':<44} {v['ops_over_1.1']:>6}/{v['ops']:<3} "
              f"{v['largest_operands_over_1.1']:>8}")  # fmt: skip
        print(f"{'  tasks, scatters; payload worst op':<44} {v['tasks']:>6} {v['scatters']:>3} "
              f"{v['max_payload_ratio_per_op']:>8.3f}")  # fmt: skip
        print(f"{'  verdicts back (pickled) / operands':<44} {v['verdict_ratio_back']:>10.3f}")
    print(f"load average before {res['machine']['load_before']}, after {res['machine']['load_after']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
