"""Exact attention and softmax against torch in the same run.

    python benchmarks/bench_attention.py [--quick] [--json FILE]

Issue 12's target: exact scaled_dot_product_attention on (2, 8, 512, 64) float32 within 10x torch's
float64 SDPA on its math backend (``sdpa_kernel(SDPBackend.MATH)``). Also softmax / log_softmax on
(64, 1024) float32 against torch float64, and (without --quick) the float16/bfloat16/float64 SDPA.
Each side is timed in blocks of consecutive calls, the sides taking turns, after a warm-up call
(which compiles); the best block per side is reported. The path counts say how many rows the
float64 pass decided, how many went to the double-word pass, and how many elements to the exact
integer path.
"""

import argparse
import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from _timing import per_call  # benchmarks/_timing.py, beside this script
from torch.nn.attention import SDPBackend, sdpa_kernel

import refkern as rk
from refkern.kernels.attention import attention_operands, attention_rows
from refkern.kernels.softmax import softmax_rows

TARGETS = {"sdpa_2x8x512x64_f32_vs_torch_math_f64": 10.0}


def _math_sdpa(q, k, v, **kw):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def bench_sdpa(shape, dtype, kw, blocks, calls):
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
    q64, k64, v64 = q.double(), k.double(), v.double()
    t = per_call({"exact": (partial(rk.scaled_dot_product_attention, q, k, v, **kw), calls),
                  "torch_math_f64": (partial(_math_sdpa, q64, k64, v64, **kw), 3 * calls),
                  "torch_f32": (partial(F.scaled_dot_product_attention, q.float(), k.float(), v.float(), **kw),
                                6 * calls)}, blocks)  # fmt: skip
    _, c = attention_rows(attention_operands(q, k, v, **kw))
    return dict(op="sdpa", case=f"{tuple(shape)} {' '.join(kw) or 'plain'}", dtype=str(dtype)[6:],
                exact_s=t["exact"], torch_f64_s=t["torch_math_f64"], torch_f32_s=t["torch_f32"],
                vs_torch_f64=t["exact"] / t["torch_math_f64"], vs_torch_f32=t["exact"] / t["torch_f32"],
                rows=c.rows, fast_rows=c.fast_rows, dd_rows=c.dd_rows, exact_elements=c.exact_elements)  # fmt: skip


def bench_softmax(shape, dtype, log, blocks):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).to(dtype)
    ref = rk.log_softmax if log else rk.softmax
    tf = torch.log_softmax if log else torch.softmax
    t = per_call({"exact": (partial(ref, x, -1), 20), "torch_f64": (partial(tf, x.double(), -1), 100),
                  "torch_f32": (partial(tf, x.float(), -1), 200)}, blocks)  # fmt: skip
    from refkern.accumulate.formats import FORMATS

    _, c = softmax_rows(x.double().numpy().reshape(-1, shape[-1]), FORMATS[str(dtype)[6:]], log)
    return dict(op="log_softmax" if log else "softmax", case=str(tuple(shape)), dtype=str(dtype)[6:],
                exact_s=t["exact"], torch_f64_s=t["torch_f64"], torch_f32_s=t["torch_f32"],
                vs_torch_f64=t["exact"] / t["torch_f64"], vs_torch_f32=t["exact"] / t["torch_f32"], rows=c.rows,
                fast_rows=c.fast_rows, dd_rows=c.dd_rows, exact_elements=c.exact_elements)  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the target case and float32 softmax only")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--json", default=None, help="write the rows and targets to this file")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    shape = (2, 8, 512, 64)
    rows = [bench_sdpa(shape, torch.float32, {}, a.blocks, 2)]
    if not a.quick:
        rows.append(bench_sdpa(shape, torch.float32, {"is_causal": True}, a.blocks, 2))
        rows.append(bench_sdpa(shape, torch.bfloat16, {}, a.blocks, 2))
        rows.append(bench_sdpa(shape, torch.float16, {}, a.blocks, 2))
        rows.append(bench_sdpa((1, 2, 256, 64), torch.float64, {}, 2, 1))
    for log in (False, True):
        rows.append(bench_softmax((64, 1024), torch.float32, log, a.blocks))
    if not a.quick:
        rows.append(bench_softmax((64, 1024), torch.float64, False, a.blocks))
    print(f"{'op':<12} {'case':<28} {'dtype':<9} {'exact':>9} {'torch f64':>10} {'ratio':>8} {'vs f32':>8}  paths")
    for r in rows:
        paths = f"{r['fast_rows']}/{r['rows']} rows fast, {r['dd_rows']} double-word, {r['exact_elements']} exact"
        times = f"{r['exact_s'] * 1e3:7.1f}ms {r['torch_f64_s'] * 1e3:8.2f}ms"
        print(f"{r['op']:<12} {r['case']:<28} {r['dtype']:<9} {times} {r['vs_torch_f64']:7.2f}x "
              f"{r['vs_torch_f32']:7.1f}x  {paths}")  # fmt: skip
    got = rows[0]["vs_torch_f64"]
    target = TARGETS["sdpa_2x8x512x64_f32_vs_torch_math_f64"]
    print(f"target: exact float32 SDPA (2, 8, 512, 64) vs torch math float64: {got:.2f}x (<= {target}) "
          f"{'met' if got <= target else 'MISSED'}")  # fmt: skip
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"targets": TARGETS, "rows": rows, "threads": torch.get_num_threads()}, f, indent=1)
        print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
