"""Reference-kernel benchmark: exact matmul and conv2d against numpy / torch in the same run,
plus cold start (first call, empty Numba cache) and warm start (cache filled) in new processes.

    python benchmarks/bench_kernels.py [--quick] [--json FILE]

Each timing is the best of several calls after a warm-up call. Targets (issue 3, 2-core
machine): exact float32 matmul 512^3 within 12x numpy float64 matmul; exact float32 conv2d
(8, 64, 56, 56) x 64 x 3x3 within 6x torch float64 conv2d; warm start under 2 s. Issue 12: exact
float32 conv_transpose2d on U-Net-sized layers within 3x torch float64 conv_transpose2d; there
the two sides take turns in blocks of consecutive calls (best block per side, after a warm-up
call), so that a shared machine loads them alike.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk

TARGETS = {
    "matmul_512_vs_numpy_f64": 12.0,
    "conv2d_resnet_vs_torch_f64": 6.0,
    "warm_start_s": 2.0,
    "compare_vs_exact": 3.0,
    "conv_transpose2d_unet_vs_torch_f64": 3.0,
}

# U-Net decoder layers: (4, 128, 32, 32) -> 64 channels, upsampling 2x2 stride 2, then a 3x3 one
CONV_TRANSPOSES = {
    "unet up 2x2/2": dict(x=(4, 128, 32, 32), w=(128, 64, 2, 2), kw=dict(stride=2)),
    "unet 3x3 p1": dict(x=(4, 128, 32, 32), w=(128, 64, 3, 3), kw=dict(padding=1)),
}

CONVS = {
    "resnet 3x3": dict(x=(8, 64, 56, 56), w=(64, 64, 3, 3), kw=dict(padding=1)),
    "stem 7x7/2": dict(x=(8, 3, 224, 224), w=(64, 3, 7, 7), kw=dict(stride=2, padding=3)),
    "depthwise 3x3": dict(x=(8, 128, 28, 28), w=(128, 1, 3, 3), kw=dict(padding=1, groups=128)),
}


def best(fn, *args, reps=5, **kw):
    fn(*args, **kw)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args, **kw)
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_matmul(sizes):
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        a32, b32 = rng.standard_normal((2, n, n), dtype=np.float32)
        a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
        reps = 3 if n >= 1024 else 5
        t_np = best(np.matmul, a64, b64, reps=10)
        t_t32 = best(torch.matmul, torch.from_numpy(a32), torch.from_numpy(b32), reps=10)
        for dtype, (a, b) in {"float32": (a32, b32), "float64": (a64, b64)}.items():
            t = best(rk.matmul, a, b, reps=reps)
            rows.append(dict(op="matmul", case=f"{n}^3", dtype=dtype, exact_s=t, numpy_f64_s=t_np,
                             torch_f32_s=t_t32, vs_numpy_f64=t / t_np, vs_torch_f32=t / t_t32))  # fmt: skip
    return rows


def bench_conv(names):
    torch.manual_seed(0)
    rows = []
    for name in names:
        c = CONVS[name]
        x, w = torch.randn(*c["x"]), torch.randn(*c["w"])
        t32 = best(F.conv2d, x, w, **c["kw"], reps=5)
        t64 = best(F.conv2d, x.double(), w.double(), **c["kw"], reps=3)
        for dtype, (xx, ww) in {"float32": (x, w), "float64": (x.double(), w.double())}.items():
            t = best(rk.conv2d, xx, ww, **c["kw"], reps=2)
            rows.append(dict(op="conv2d", case=name, dtype=dtype, exact_s=t, torch_f32_s=t32, torch_f64_s=t64,
                             vs_torch_f64=t / t64, vs_torch_f32=t / t32))  # fmt: skip
    return rows


def bench_conv_transpose(names, blocks=3):
    torch.manual_seed(0)
    rows = []
    for name in names:
        c = CONV_TRANSPOSES[name]
        x, w = torch.randn(*c["x"]), torch.randn(*c["w"])
        x64, w64, kw = x.double(), w.double(), c["kw"]
        t = per_call({"exact": (partial(rk.conv_transpose2d, x, w, **kw), 2),
                      "torch_f64": (partial(F.conv_transpose2d, x64, w64, **kw), 6),
                      "torch_f32": (partial(F.conv_transpose2d, x, w, **kw), 12)}, blocks)  # fmt: skip
        e, t64, t32 = t["exact"], t["torch_f64"], t["torch_f32"]
        rows.append(dict(op="conv_transpose2d", case=name, dtype="float32", exact_s=e, torch_f32_s=t32,
                         torch_f64_s=t64, vs_torch_f64=e / t64, vs_torch_f32=e / t32))  # fmt: skip
    return rows


_START = (
    "import time; t = time.perf_counter(); import numpy as np, refkern; "
    "x = np.ones((1, 3, 8, 8), np.float32); w = np.ones((4, 3, 3, 3), np.float32); "
    "refkern.conv2d(x, w, padding=1); print(time.perf_counter() - t)"
)


def bench_start():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        times = []
        for _ in range(2):  # first: empty cache (compiles); second: loads from the cache
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, check=True)
            times.append((float(out.stdout.strip()), time.perf_counter() - t0))
    return {"cold_call_s": times[0][0], "cold_process_s": times[0][1], "warm_call_s": times[1][0],
            "warm_process_s": times[1][1]}  # fmt: skip


def bench_compare(rounds=3, calls=5):
    """rk.compare on torch's float32 output of the ResNet conv, against the exact reference alone:
    each side timed in blocks of ``calls`` calls, the blocks taking turns, the best block of each."""
    torch.manual_seed(0)
    c = CONVS["resnet 3x3"]
    x, w = torch.randn(*c["x"]), torch.randn(*c["w"])
    out = F.conv2d(x, w, **c["kw"])

    def block(fn):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t) / calls

    ref, cmp = (lambda: rk.conv2d(x, w, **c["kw"])), (lambda: rk.compare(out, "conv2d", x, w, **c["kw"]))
    ref(), cmp()  # compile outside the timing
    t_ref, t_cmp = [], []
    for _ in range(rounds):
        t_ref.append(block(ref))
        t_cmp.append(block(cmp))
    return {"exact_s": min(t_ref), "compare_s": min(t_cmp), "ratio": min(t_cmp) / min(t_ref)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="matmul 256/512 and the resnet conv only")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "kernels.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    rows = bench_matmul([256, 512] if a.quick else [256, 512, 1024])
    rows += bench_conv(["resnet 3x3"] if a.quick else list(CONVS))
    rows += bench_conv_transpose(list(CONV_TRANSPOSES))
    start = bench_start()
    cmp = bench_compare()
    print(f"{'op':<7} {'case':<14} {'dtype':<8} {'exact':>9} {'baseline':>26} {'ratios'}")
    for r in rows:
        if r["op"] == "matmul":
            base = f"numpy f64 {r['numpy_f64_s'] * 1e3:7.2f} ms"
            ratio = f"{r['vs_numpy_f64']:6.1f}x numpy f64, {r['vs_torch_f32']:6.1f}x torch f32"
        else:
            base = f"torch f64 {r['torch_f64_s'] * 1e3:7.1f} ms"
            ratio = f"{r['vs_torch_f64']:6.2f}x torch f64, {r['vs_torch_f32']:6.1f}x torch f32"
        print(f"{r['op']:<7} {r['case']:<14} {r['dtype']:<8} {r['exact_s'] * 1e3:7.1f}ms {base:>26}  {ratio}")
    print(f"start (new process, small conv2d): cold {start['cold_call_s']:.1f} s (empty cache), "
          f"warm {start['warm_call_s']:.2f} s (import + call), process {start['warm_process_s']:.2f} s")  # fmt: skip
    mm = next(r for r in rows if r["op"] == "matmul" and r["case"] == "512^3" and r["dtype"] == "float32")
    cv = next(r for r in rows if r["op"] == "conv2d" and r["case"] == "resnet 3x3" and r["dtype"] == "float32")
    ct = max((r for r in rows if r["op"] == "conv_transpose2d"), key=lambda r: r["vs_torch_f64"])
    checks = [
        ("exact float32 matmul 512^3 vs numpy float64", mm["vs_numpy_f64"], TARGETS["matmul_512_vs_numpy_f64"]),
        ("exact float32 conv2d resnet 3x3 vs torch float64", cv["vs_torch_f64"], TARGETS["conv2d_resnet_vs_torch_f64"]),
        ("warm start (s)", start["warm_call_s"], TARGETS["warm_start_s"]),
        ("compare / exact reference, resnet conv", cmp["ratio"], TARGETS["compare_vs_exact"]),
        (f"exact float32 conv_transpose2d {ct['case']} (the slower U-Net layer) vs torch float64", ct["vs_torch_f64"],
         TARGETS["conv_transpose2d_unet_vs_torch_f64"]),
    ]
    for name, got, target in checks:
        print(f"target: {name}: {got:.2f} (<= {target}) {'met' if got <= target else 'MISSED'}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"targets": TARGETS, "rows": rows, "start": start, "compare": cmp,
                   "threads": torch.get_num_threads()}, f, indent=1)  # fmt: skip
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
