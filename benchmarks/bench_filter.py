"""The filtering engine (issue 27): exact GEMM and convolution against one float64 GEMM / conv.

    NUMBA_NUM_THREADS=2 python benchmarks/bench_filter.py [--quick] [--audit] [--json FILE]
    python benchmarks/bench_filter.py --analysis --audit [--one-thread]  # compare and the audit only

Every ratio is measured in one run, the two sides in blocks of consecutive calls (benchmarks/
_timing.py: never interleaved single calls), the best block per side. Targets (2-core machine):

* exact matmul 512^3 and 1024^3, float32, bfloat16 and float16 inputs: <= 1.3x numpy's float64
  matmul;
* exact conv2d of a ResNet layer (8, 64, 56, 56) x (64, 64, 3, 3), padding 1: <= 0.8x torch's
  float64 conv2d;
* ``refkern.compare`` on that conv: <= 2x the exact reference alone;
* (``--audit``) ``refkern.torch.audit`` of ResNet-18 on 1x3x224x224: <= 3x its float64 eager forward.
* (``--gpu``, only this section) exact matmul 4096^3 on a CUDA device, float32, bfloat16 and float16
  inputs (:func:`refkern.engines.filter_device.matmul`, the result left on the device): <= 1.5x torch's
  float64 matmul on the same device. Each side in blocks of calls, ``torch.cuda.synchronize()`` before
  every clock read, the median block. Also: the device part alone (GEMM, norms, decision, the undecided
  indices back; no exact path), and ``refkern.matmul`` on CUDA tensors (its numpy operands, the result
  back in the result format); the undecided elements per case. Under 60 s on an H100 after warm-up.

Also measured, not targets: the undecided elements per case (after the norm bound; what the
|A||B| bound and the exact path then handled), cancelling matmuls (condition numbers about 3e4
and 4e6: the filter must cost no more than the Numba engine plus one GEMM), and the cost model
behind ``ABS_GEMM_MIN``: one |A||B| GEMM over a block of rows against the exact path per element.
"""

import argparse
import json
import os
import sys
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk
from refkern.engines import filter as filt
from refkern.engines import filter_conv
from refkern.kernels import conv as conv_mod
from refkern.kernels._common import plan
from refkern.kernels.gemm import matmul_operands

TARGETS = {"matmul_vs_numpy_f64": 1.3, "conv2d_resnet_vs_torch_f64": 0.8, "compare_vs_exact": 2.0,
           "audit_resnet18_vs_f64_eager": 3.0, "gpu_matmul_vs_torch_f64": 1.5}  # fmt: skip


def _inputs(n, dtype, rng):
    a, b = rng.standard_normal((2, n, n), dtype=np.float32)
    if dtype == "bfloat16":
        ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
        return ta, tb, ta.double().numpy(), tb.double().numpy()
    a, b = a.astype(dtype), b.astype(dtype)
    return a, b, a.astype(np.float64), b.astype(np.float64)


def _stats_matmul(a, b):
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p, contiguous=False)
    st = {}
    filt.gemm(p, A3, Bt3, ia, ib, None, shape, stats=st)
    return st


def bench_matmul(sizes, dtypes, blocks):
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        for dtype in dtypes:
            a, b, a64, b64 = _inputs(n, dtype, rng)
            calls = 20 if n <= 512 else 4
            t = per_call({"numpy_f64": (partial(np.matmul, a64, b64), calls),
                          "exact": (partial(rk.matmul, a, b), calls)}, blocks)  # fmt: skip
            rows.append(dict(op="matmul", case=f"{n}^3", dtype=dtype, exact_s=t["exact"], numpy_f64_s=t["numpy_f64"],
                             ratio=t["exact"] / t["numpy_f64"], target=TARGETS["matmul_vs_numpy_f64"],
                             **_stats_matmul(a, b)))  # fmt: skip
    return rows


def _cancelling(n, eps, rng):
    """A = [X, -X (1 + eps)] (float32), B = [Y; Y]: A B = -eps X Y up to the rounding of X (1 + eps):
    condition numbers about 1 / eps."""
    x = rng.standard_normal((n, n // 2), dtype=np.float32)
    y = rng.standard_normal((n // 2, n), dtype=np.float32)
    a = np.concatenate([x, -(x * np.float32(1 + eps))], axis=1)
    return a, np.concatenate([y, y], axis=0)


def bench_cancelling(n, blocks):
    rng = np.random.default_rng(1)
    rows = []
    for eps in (2.0**-15, 2.0**-22):
        a, b = _cancelling(n, eps, rng)
        v = a.astype(np.float64) @ b.astype(np.float64)
        mags = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        cond = float(np.median(mags / np.maximum(np.abs(v), 1e-300)))
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        t = per_call({"numpy_f64": (partial(np.matmul, a64, b64), 3), "filter": (partial(rk.matmul, a, b), 1),
                      "numba": (partial(rk.matmul, a, b, engine="numba"), 1)}, blocks)  # fmt: skip
        rows.append(dict(op="matmul cancelling", case=f"{n}^3 eps=2^{int(np.log2(eps))}", dtype="float32",
                         median_condition=cond, filter_s=t["filter"], numba_s=t["numba"], numpy_f64_s=t["numpy_f64"],
                         filter_vs_numba_plus_gemm=t["filter"] / (t["numba"] + t["numpy_f64"]),
                         ratio=t["filter"] / t["numpy_f64"], **_stats_matmul(a, b)))  # fmt: skip
    return rows


def bench_cost_model(n, blocks):
    """The |A||B| GEMM of one block of ROW_BLOCK rows, per element, against the exact path per
    undecided element (cancelling data, all of a block exact), at K = n."""
    rng = np.random.default_rng(2)
    a, b = _cancelling(n, 2.0**-22, rng)
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p, contiguous=False)
    g = filt._Gemm(p, A3, Bt3, ia, ib, np.zeros(n), np.zeros(n), False, None)
    rb = filt.ROW_BLOCK
    ii = np.repeat(np.arange(rb), n)
    jj = np.tile(np.arange(n), rb)
    V = np.empty((1, n, n))
    t = per_call({"abs_gemm_block": (partial(g.abs_gemm, 0, 0, rb), 3),
                  "exact_pairs_block": (partial(g._pairs, V, 0, ii, jj, n, p.work.params), 1),
                  "numba_block": (partial(g._numba_rows, 0, np.arange(rb)), 1)}, blocks)  # fmt: skip
    per = t["abs_gemm_block"] / t["exact_pairs_block"]
    return [dict(op="cost model", case=f"{rb} x {n} block, K={n}", dtype="float32", abs_gemm_s=t["abs_gemm_block"],
                 exact_pairs_s=t["exact_pairs_block"], numba_block_s=t["numba_block"], abs_gemm_per_exact_element=per,
                 numba_block_per_pairs=t["numba_block"] / t["exact_pairs_block"], abs_gemm_cost=filt.ABS_GEMM_COST,
                 tile_exact_min=filt.TILE_EXACT_MIN)]  # fmt: skip


def bench_conv(blocks, quick):
    torch.manual_seed(0)
    shape = (2, 64, 56, 56) if quick else (8, 64, 56, 56)
    x, w = torch.randn(*shape), torch.randn(64, 64, 3, 3)
    x64, w64 = x.double(), w.double()
    rows = []
    for dtype in ("float32", "bfloat16", "float16"):
        xx, ww = x.to(getattr(torch, dtype)), w.to(getattr(torch, dtype))
        t = per_call({"torch_f64": (partial(F.conv2d, x64, w64, padding=1), 3),
                      "exact": (partial(rk.conv2d, xx, ww, padding=1), 3)}, blocks)  # fmt: skip
        p = plan("conv2d", {"x": xx, "weight": ww, "bias": None}, ("x", "weight"), "exact", None)
        c = conv_mod.conv_operands(p, 2, 1, 1, 1, 1, "zeros")
        st = {}
        filter_conv.conv(p, c, stats=st)
        rows.append(dict(op="conv2d", case=f"resnet {shape}x64x3x3", dtype=dtype, exact_s=t["exact"],
                         torch_f64_s=t["torch_f64"], ratio=t["exact"] / t["torch_f64"],
                         target=TARGETS["conv2d_resnet_vs_torch_f64"], **st))  # fmt: skip
    return rows + bench_compare(blocks, quick)


def bench_compare(blocks, quick):
    """``refkern.compare`` on the ResNet layer (float32, torch's own output) against ``rk.conv2d`` alone."""
    torch.manual_seed(0)
    shape = (2, 64, 56, 56) if quick else (8, 64, 56, 56)
    x, w = torch.randn(*shape), torch.randn(64, 64, 3, 3)
    rows = []
    out = F.conv2d(x, w, padding=1)
    sides = {"exact": (partial(rk.conv2d, x, w, padding=1), 3),
             "compare": (partial(rk.compare, out, "conv2d", x, w, padding=1), 1)}  # fmt: skip
    t = per_call(sides, blocks)
    c = per_call(sides, blocks, clock=time.process_time)  # the process's CPU time: steadier on a shared machine
    rows.append(dict(op="compare conv2d", case=f"resnet {shape}x64x3x3", dtype="float32", compare_s=t["compare"],
                     exact_s=t["exact"], ratio=t["compare"] / t["exact"], compare_cpu_s=c["compare"],
                     exact_cpu_s=c["exact"], cpu_ratio=c["compare"] / c["exact"],
                     target=TARGETS["compare_vs_exact"]))  # fmt: skip
    return rows


def bench_audit(quick):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from audit_models import randomize_batch_norm, resnet18

    import refkern.torch as rkt

    torch.manual_seed(0)
    side = 112 if quick else 224
    model = randomize_batch_norm(resnet18()).eval()
    x = torch.randn(1, 3, side, side)
    m64, x64 = resnet18().eval(), x.double()
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    with torch.no_grad(), rkt.audit(progress=False):  # compile every kernel outside the timing
        model(torch.randn(1, 3, 32, 32))
    with torch.no_grad():
        m64(x64)
        t64 = min((_timed(lambda: m64(x64)) for _ in range(3)), key=lambda t: t[0])

        def audited():
            with rkt.audit(progress=False):
                model(x)

        t_audit = _timed(audited)
    return [dict(op="audit resnet18", case=f"1x3x{side}x{side}", dtype="float32", audit_s=t_audit[0],
                 f64_eager_s=t64[0], ratio=t_audit[0] / t64[0], audit_cpu_s=t_audit[1], f64_eager_cpu_s=t64[1],
                 cpu_ratio=t_audit[1] / t64[1], target=TARGETS["audit_resnet18_vs_f64_eager"])]  # fmt: skip


def _gpu_per_call(sides, blocks, dev):
    """{name: (fn, calls)} -> {name: median seconds per call}: a warm-up call each, then ``blocks``
    rounds in which every side runs ``calls`` consecutive calls, the device synchronised before each
    clock read."""
    import statistics

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for fn, _ in sides.values():
        fn()
    sync()
    times = {name: [] for name in sides}
    for _ in range(blocks):
        for name, (fn, calls) in sides.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(v) for name, v in times.items()}


def bench_gpu(n, blocks, dev):
    """Exact matmul n^3 on the CUDA device ``dev`` against torch's float64 matmul there (module
    docstring; ``--device cpu`` runs the same code on the CPU, to check it without a GPU)."""
    from refkern.engines import filter_device as fd

    g = torch.Generator(device=dev).manual_seed(0)  # the same data on every run
    a0 = torch.randn(n, n, device=dev, generator=g)
    b0 = torch.randn(n, n, device=dev, generator=g)
    zero = np.zeros(1, np.int64)
    rows = []
    for dtype in ("float32", "bfloat16", "float16"):
        a, b = a0.to(getattr(torch, dtype)), b0.to(getattr(torch, dtype))
        a64, b64 = a.double(), b.double()

        def device_part(a=a, b=b, dtype=dtype):
            return fd.Device(a[None], b.T[None], zero, zero, None, dtype).run()

        fd.matmul(a, b)  # compiles the exact path's kernel outside the timing
        st = fd.matmul(a, b)[1]  # the counts, and one warm call's device and exact-path seconds
        def stages(a=a, b=b):  # the device's stages before filter_compensated (|A| |B|, pairwise), for the ratio
            fd.Device.compensate = False
            try:
                return fd.matmul(a, b)
            finally:
                fd.Device.compensate = True

        sides = {"torch_f64": (partial(torch.matmul, a64, b64), 10), "exact": (partial(fd.matmul, a, b), 2),
                 "device_part": (device_part, 2), "exact_stages": (stages, 2)}  # fmt: skip
        t = _gpu_per_call(sides, blocks, dev)
        t.update(_gpu_per_call({"refkern_matmul": (partial(rk.matmul, a, b), 1)}, 2, dev))
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        rows.append(dict(op="gpu matmul", case=f"{n}^3", dtype=dtype, device=name,
                         exact_s=t["exact"], torch_f64_s=t["torch_f64"], ratio=t["exact"] / t["torch_f64"],
                         device_part_s=t["device_part"], device_part_ratio=t["device_part"] / t["torch_f64"],
                         stages_s=t["exact_stages"], stages_ratio=t["exact_stages"] / t["torch_f64"],
                         refkern_matmul_s=t["refkern_matmul"],
                         refkern_matmul_ratio=t["refkern_matmul"] / t["torch_f64"],
                         target=TARGETS["gpu_matmul_vs_torch_f64"], **st))  # fmt: skip
    return rows


def _timed(fn):
    """(wall seconds, the process's CPU seconds) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _table(rows):
    print(f"{'op':<18} {'case':<28} {'dtype':<9} {'ratio':>7} {'target':>6}  undecided (first / elements), notes")
    for r in rows:
        tgt = r.get("target")
        mark = "" if tgt is None else ("ok" if r["ratio"] <= tgt else "MISSED")
        und = f"{r['undecided_first']} / {r['elements']}" if "elements" in r else ""
        extra = ""
        if "median_condition" in r:
            extra = f"cond {r['median_condition']:.2g}; filter / (numba + gemm) {r['filter_vs_numba_plus_gemm']:.2f}"
        if "cpu_ratio" in r:
            extra = f"wall; CPU time {r['cpu_ratio']:.2f}x"
        if "device_part_ratio" in r:
            comp = r.get("undecided_after_compensated", f"(not run: {r.get('compensated_unavailable')})")
            extra = (f"{r['device']}: torch f64 {r['torch_f64_s'] * 1e3:.2f} ms; device part alone "
                     f"{r['device_part_ratio']:.2f}x; without the compensated stage {r['stages_ratio']:.2f}x; "
                     f"refkern.matmul (copies) {r['refkern_matmul_ratio']:.2f}x; undecided after the compensated "
                     f"stage {comp}"
                     f", after |A||B| {r['undecided_after_tight']}, after the pairwise stage "
                     f"{r.get('undecided_after_pairwise', '(not run)')}; one call: device part "
                     f"{r['device_seconds'] * 1e3:.1f} ms, exact path with copies "
                     f"{r['exact_seconds'] * 1e3:.1f} ms")  # fmt: skip
        if "abs_gemm_per_exact_element" in r:
            extra = (f"|A||B| block GEMM = {r['abs_gemm_per_exact_element']:.3f} of its elements exact; the block by "
                     f"the Numba kernel = {r['numba_block_per_pairs']:.3f} of it element by element")  # fmt: skip
            r["ratio"] = r["abs_gemm_per_exact_element"]
        ratio = r.get("ratio", float("nan"))
        print(f"{r['op']:<18} {r['case']:<28} {r['dtype']:<9} {ratio:>7.3f} {tgt or '':>6}  {und} {extra} {mark}")


def _finish(rows, a, load0):
    load1 = os.getloadavg()
    _table(rows)
    print(f"load average (1, 5, 15 min) before {load0}, after {load1}; NUMBA_NUM_THREADS="
          f"{os.environ.get('NUMBA_NUM_THREADS')}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "targets": TARGETS, "load_before": load0, "load_after": load1}, fh, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--audit", action="store_true", help="also audit ResNet-18 (slow)")
    ap.add_argument("--gpu", action="store_true", help="only the CUDA section (exact matmul 4096^3 on the device)")
    ap.add_argument("--device", default="cuda", help="the --gpu section's device (cpu: to check the code)")
    ap.add_argument("--n", type=int, help="the --gpu section's size (default 4096, 1024 with --quick)")
    ap.add_argument(
        "--analysis",
        action="store_true",
        help="only the verdict's figures: compare on the ResNet layer (and with --audit the audit)",
    )
    ap.add_argument(
        "--one-thread",
        action="store_true",
        help="Numba and torch on one thread (under load, parallel regions' waiting counts as CPU time)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.one_thread:
        import numba

        numba.set_num_threads(1)
        torch.set_num_threads(1)
    blocks = 2 if a.quick else 4
    load0 = os.getloadavg()
    if a.gpu:
        dev = torch.device(a.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            print("bench_filter --gpu: no CUDA device here; nothing measured.")
            return 1
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        print(f"device {name}; torch {torch.__version__}; NUMBA_NUM_THREADS="
              f"{os.environ.get('NUMBA_NUM_THREADS')}; load average {load0}")  # fmt: skip
        rows = bench_gpu(a.n or (1024 if a.quick else 4096), 3 if a.quick else 5, dev)
        _finish(rows, a, load0)
        return 1 if any(r["ratio"] > r["target"] for r in rows) and not a.quick else 0
    if a.analysis:
        rows = bench_compare(blocks, a.quick)
    else:
        rows = bench_matmul([256] if a.quick else [512, 1024], ["float32", "bfloat16", "float16"], blocks)
        rows += bench_conv(blocks, a.quick)
        rows += bench_cancelling(256 if a.quick else 1024, 1 if a.quick else 2)
        rows += bench_cost_model(256 if a.quick else 1024, 2)
    if a.audit:
        rows += bench_audit(a.quick)
    _finish(rows, a, load0)
    missed = [r for r in rows if r.get("target") is not None and r["ratio"] > r["target"]]
    return 1 if missed and not a.quick else 0


if __name__ == "__main__":
    sys.exit(main())
