"""Engine benchmark: the exact BLAS (Ozaki) engine against float64 BLAS and the Numba engine,
all measured in the same run.

    python benchmarks/bench_engines.py [--blocks 3] [--json FILE]

Cases and targets (issue 15, 2-core CPU): exact float32 matmul 1024^3 within 2.5x numpy's
float64 matmul; exact float64 matmul 512^3 within 8x; exact float32 ResNet conv
(8, 64, 56, 56) x (64, 64, 3, 3), padding 1, within 1x torch's float64 conv2d. Each side is
timed in blocks of consecutive calls (never one call of each side interleaved), after a
warm-up call that also compiles; a block's time per call is its total / calls. The sides
take turns block by block for ``--blocks`` rounds (so that a machine shared with other jobs
loads them alike), and each side's best block is reported. Before timing, the BLAS engine's
result is checked bit for bit against the Numba engine's.
"""

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F

import refkern as rk
from refkern import engines

TARGETS = {"matmul_f32_1024": 2.5, "matmul_f64_512": 8.0, "conv_resnet_f32": 1.0}


def per_call(sides, blocks):
    """{name: (fn, calls)} -> {name: best seconds per call}: warm-up, then ``blocks`` rounds in
    which every side runs one block of ``calls`` consecutive calls."""
    for fn, _ in sides.values():
        fn()
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(blocks):
        for name, (fn, calls) in sides.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


def identical(x, y):
    """Bit for bit (the same bytes)."""
    x, y = (v.numpy() if torch.is_tensor(v) else np.asarray(v) for v in (x, y))
    return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


def case_matmul(name, n, dtype, blocks):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    same = identical(rk.matmul(a, b, engine="blas"), rk.matmul(a, b, engine="numba"))
    calls = max(1, int(2**30 // n**3))
    t = per_call({"base": (lambda: np.matmul(a64, b64), 4 * calls),
                  "blas": (lambda: rk.matmul(a, b, engine="blas"), calls),
                  "numba": (lambda: rk.matmul(a, b, engine="numba"), calls)}, blocks)  # fmt: skip
    base, blas, numba = t["base"], t["blas"], t["numba"]
    return dict(case=name, baseline="numpy float64 matmul", baseline_s=base, blas_s=blas, numba_s=numba,
                ratio=blas / base, numba_ratio=numba / base, identical=same, target=TARGETS[name])  # fmt: skip


def case_conv(blocks):
    torch.manual_seed(0)
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3)
    x64, w64 = x.double(), w.double()
    same = identical(rk.conv2d(x, w, padding=1, engine="blas"), rk.conv2d(x, w, padding=1, engine="numba"))
    t = per_call({"base": (lambda: F.conv2d(x64, w64, padding=1), 2),
                  "blas": (lambda: rk.conv2d(x, w, padding=1, engine="blas"), 1),
                  "numba": (lambda: rk.conv2d(x, w, padding=1, engine="numba"), 1)}, blocks)  # fmt: skip
    base, blas, numba = t["base"], t["blas"], t["numba"]
    return dict(case="conv_resnet_f32", baseline="torch float64 conv2d", baseline_s=base, blas_s=blas,
                numba_s=numba, ratio=blas / base, numba_ratio=numba / base, identical=same,
                target=TARGETS["conv_resnet_f32"])  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=5, help="rounds of one block per side (best is reported)")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "engines.json"))
    a = p.parse_args(argv)
    rows = [
        case_matmul("matmul_f32_1024", 1024, np.float32, a.blocks),
        case_matmul("matmul_f64_512", 512, np.float64, a.blocks),
        case_conv(a.blocks),
    ]
    print(f"{'case':<18} {'baseline':<22} {'base ms':>8} {'blas ms':>8} {'numba ms':>9} {'blas/base':>9} "
          f"{'numba/base':>10} {'target':>7}  identical")  # fmt: skip
    for r in rows:
        met = "met" if r["ratio"] <= r["target"] else "MISSED"
        print(f"{r['case']:<18} {r['baseline']:<22} {r['baseline_s'] * 1e3:8.1f} {r['blas_s'] * 1e3:8.1f} "
              f"{r['numba_s'] * 1e3:9.1f} {r['ratio']:8.2f}x {r['numba_ratio']:9.2f}x {r['target']:6.1f}x  "
              f"{r['identical']} ({met})")  # fmt: skip
    info = {"threads_torch": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "torch": torch.__version__, "numpy": np.__version__, "engines": engines.status()}  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"targets": TARGETS, "rows": rows, "info": info}, f, indent=1)
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
