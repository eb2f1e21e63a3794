"""Pooling benchmark: refkern's exact poolings against torch's float64 (and float32) on ResNet-sized
inputs, ratios taken in the same run.

    python benchmarks/bench_pool.py [--quick] [--json FILE]

Cases: the stem's max_pool2d 3x3 / 2, padding 1, on (16, 64, 112, 112); avg_pool2d with the same
window and a 2x2 / 2 one (ResNet-D's downsampling shortcut); the head's adaptive_avg_pool2d to
1x1 on (32, 2048, 7, 7). refkern runs on float32 and on float64 inputs; torch's float64 op runs
on the same values in float64. The sides take turns in blocks of consecutive calls (a warm-up
call each first, compilation outside the timing); each side's best block counts, so that a
shared machine loads them alike. Also reported: the share of averages each tier of the
rounding decided (refkern.kernels.pool.PATHS).
"""

import argparse
import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk
from refkern.kernels import pool

CASES = {
    "max 3x3/2 p1": (rk.max_pool2d, F.max_pool2d, (16, 64, 112, 112), dict(kernel_size=3, stride=2, padding=1)),
    "avg 3x3/2 p1": (rk.avg_pool2d, F.avg_pool2d, (16, 64, 112, 112), dict(kernel_size=3, stride=2, padding=1)),
    "avg 2x2/2": (rk.avg_pool2d, F.avg_pool2d, (16, 64, 112, 112), dict(kernel_size=2)),
    "adaptive 7x7->1": (rk.adaptive_avg_pool2d, F.adaptive_avg_pool2d, (32, 2048, 7, 7), dict(output_size=1)),
}


def bench(names, blocks, scale):
    torch.manual_seed(0)
    rows = []
    for name in names:
        ours, theirs, shape, kw = CASES[name]
        shape = (max(1, shape[0] // scale), *shape[1:])
        x32 = torch.randn(*shape)
        x64 = x32.double()
        before = pool.PATHS.copy()
        t = per_call({"refkern_f32": (partial(ours, x32, **kw), 2), "refkern_f64": (partial(ours, x64, **kw), 2),
                      "torch_f64": (partial(theirs, x64, **kw), 4), "torch_f32": (partial(theirs, x32, **kw), 8)},
                     blocks)  # fmt: skip
        tiers = pool.PATHS - before
        total = sum(tiers.values())
        rows.append(dict(case=name, shape=list(shape), **{f"{k}_s": v for k, v in t.items()},
                         f32_vs_torch_f64=t["refkern_f32"] / t["torch_f64"],
                         f64_vs_torch_f64=t["refkern_f64"] / t["torch_f64"],
                         tiers={k: v / total for k, v in tiers.items()} if total else {}))  # fmt: skip
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a quarter of the batch, two blocks")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "pool.json"))
    a = p.parse_args()
    rows = bench(list(CASES), blocks=2 if a.quick else 4, scale=4 if a.quick else 1)
    head = f"{'case':18} {'shape':>20} {'rk f32 ms':>10} {'rk f64 ms':>10} {'torch f64':>10} {'torch f32':>10} " \
           f"{'f32/t64':>8} {'f64/t64':>8}  tiers (share of averages)"  # fmt: skip
    print(head)
    for r in rows:
        tiers = ", ".join(f"{k} {v:.3f}" for k, v in r["tiers"].items() if v)
        print(f"{r['case']:18} {str(tuple(r['shape'])):>20} {r['refkern_f32_s'] * 1e3:10.1f} "
              f"{r['refkern_f64_s'] * 1e3:10.1f} {r['torch_f64_s'] * 1e3:10.1f} {r['torch_f32_s'] * 1e3:10.1f} "
              f"{r['f32_vs_torch_f64']:8.2f} {r['f64_vs_torch_f64']:8.2f}  {tiers}")  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"threads": torch.get_num_threads(), "rows": rows}, f, indent=1)
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
