"""What compare costs next to the reference it computes (issue 24: at most 3x on layer_norm and attention
below; issue 27: at most 2x on the ResNet convolution).

    python benchmarks/bench_compare_cost.py [--blocks 3] [--json out.json] [--only conv2d]

With one thread on each side (the CPU ratio of docs/analysis.md), set the pools before Python starts:
``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1``; torch's follows
``torch.get_num_threads()``, which OMP_NUM_THREADS sets.

Cases: layer_norm over (32, 512, 768) bfloat16 (torch's output, weight and bias),
scaled_dot_product_attention (1, 8, 1024, 64) bfloat16 and conv2d (8, 64, 56, 56) x (64, 64, 3, 3) float32
(padding 1, weights of scale 0.05), torch's CPU outputs (correct results: the verdict is rounding). Each
side is timed in blocks of consecutive calls (benchmarks/_timing.py), the best block counts; the ratio is
compare's time over the reference's, in the same run. Process CPU time is reported beside wall time: on a
machine shared with other work the CPU ratio is the steadier; the load average (1 min) before and after each
case is printed with it and kept in the JSON.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from _timing import per_call

import refkern as rk


def cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 512, 768, generator=g).bfloat16()
    w, b = torch.randn(768, generator=g).bfloat16(), torch.randn(768, generator=g).bfloat16()
    out = F.layer_norm(x, (768,), w, b)
    yield ("layer_norm (32, 512, 768) bf16", lambda: rk.layer_norm(x, (768,), w, b),
           lambda: rk.compare(out, "layer_norm", x, (768,), w, b))  # fmt: skip
    q, k, v = (torch.randn(1, 8, 1024, 64, generator=g).bfloat16() for _ in range(3))
    o = F.scaled_dot_product_attention(q, k, v)
    yield ("scaled_dot_product_attention (1, 8, 1024, 64) bf16", lambda: rk.scaled_dot_product_attention(q, k, v),
           lambda: rk.compare(o, "scaled_dot_product_attention", q, k, v))  # fmt: skip
    x, w = torch.randn(8, 64, 56, 56, generator=g), torch.randn(64, 64, 3, 3, generator=g) * 0.05
    y = F.conv2d(x, w, padding=1)
    yield ("conv2d (8, 64, 56, 56) x (64, 64, 3, 3) fp32", lambda: rk.conv2d(x, w, padding=1),
           lambda: rk.compare(y, "conv2d", x, w, padding=1))  # fmt: skip


TARGETS = {"layer_norm": 3.0, "scaled_dot_product_attention": 3.0, "conv2d": 2.0}  #: issue 24's and issue 27's


def run(blocks=3, log=print, only=None):
    rows = []
    for name, ref, cmp in cases():
        op = name.split()[0]
        if only and op not in only:
            continue
        verdict = cmp().verdict
        sides = {"reference": (ref, 1), "compare": (cmp, 1)}
        load0 = os.getloadavg()[0]
        wall, cpu = per_call(sides, blocks), per_call(sides, blocks, time.process_time)
        load = (load0, os.getloadavg()[0])
        row = {"case": name, "verdict": verdict, "wall": wall, "cpu": cpu, "load": load,
               "ratio_wall": wall["compare"] / wall["reference"],
               "ratio_cpu": cpu["compare"] / cpu["reference"]}  # fmt: skip
        log(f"{name}: {verdict}; reference {wall['reference']:.3f} s, compare {wall['compare']:.3f} s: "
            f"{row['ratio_wall']:.1f}x wall; CPU {cpu['reference']:.3f} s, {cpu['compare']:.3f} s: "
            f"{row['ratio_cpu']:.1f}x (target {TARGETS[op]:g}x); load {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--only", nargs="*", help="ops to run (layer_norm, scaled_dot_product_attention, conv2d)")
    a = ap.parse_args()
    rows = run(a.blocks, only=a.only)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
