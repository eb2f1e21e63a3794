"""Exact attention and softmax against torch in the same run.

    python benchmarks/bench_attention.py [--quick] [--json FILE]
    python benchmarks/bench_attention.py --verdict [--lengths 16,64,256,1024] [--json FILE]

Issue 12's target: exact scaled_dot_product_attention on (2, 8, 512, 64) float32 within 10x torch's
float64 SDPA on its math backend (``sdpa_kernel(SDPBackend.MATH)``). Also softmax / log_softmax on
(64, 1024) float32 against torch float64, and (without --quick) the float16/bfloat16/float64 SDPA.
Each side is timed in blocks of consecutive calls, the sides taking turns, after a warm-up call
(which compiles); the best block per side is reported. The path counts say how many rows the
float64 pass decided, how many went to the double-word pass, and how many elements to the exact
integer path.

``--verdict`` measures the verdict instead of the speed, by sequence length L = S (E = 64): false
alarms of compare on torch's CPU outputs in float16 and bfloat16 (the math backend by default and
with ``allow_fp16_bf16_reduction_math_sdp``, the flash kernel; plain, causal, boolean and float
masks, GQA, a non-contiguous query, large logits; softmax and log_softmax over the last and a
strided dim), and how many injected bugs it calls a mismatch in float32, float16 and bfloat16.
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


def _backends(args, kw):
    """torch's CPU outputs: the math backend (as is, and with half-precision reductions), the flash kernel."""
    with sdpa_kernel(SDPBackend.MATH):
        yield "math", F.scaled_dot_product_attention(*args, **kw)
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        try:
            yield "math-half", F.scaled_dot_product_attention(*args, **kw)
        finally:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            yield "flash", F.scaled_dot_product_attention(*args, **kw)
    except RuntimeError:
        pass


def _cases(L, E, dtype, g):
    def r(*shape, sc=1.0):
        return (torch.randn(*shape, generator=g) * sc).to(dtype)

    q, k, v = r(2, 2, L, E), r(2, 2, L, E), r(2, 2, L, E)
    yield "plain", (q, k, v), {}
    yield "causal", (q, k, v), {"is_causal": True}
    yield "bool mask", (q, k, v), {"attn_mask": torch.rand(L, L, generator=g) > 0.3}
    yield "float mask", (q, k, v), {"attn_mask": r(2, 1, L, L, sc=2.0)}
    yield "gqa", (r(1, 4, L, E), r(1, 2, L, E), r(1, 2, L, E)), {"enable_gqa": True}
    yield "non-contiguous", (q.transpose(1, 2).contiguous().transpose(1, 2), k, v), {}
    yield "large logits", (r(1, 2, L, E, sc=3.0), r(1, 2, L, E, sc=3.0), v[:1]), {}


def _bugs(q, k, v, E, L):
    sdpa = F.scaled_dot_product_attention
    tri = torch.ones(L, L, dtype=torch.bool)
    m = torch.rand(L, L, generator=torch.Generator().manual_seed(1)) > 0.3
    yield "scale 1/E", sdpa(q, k, v, scale=1.0 / E), {}
    yield "scale 1", sdpa(q, k, v, scale=1.0), {}
    yield "causal +1", sdpa(q, k, v, attn_mask=tri.tril(1)), {"is_causal": True}
    yield "causal -1", sdpa(q, k, v, attn_mask=tri.tril(-1)), {"is_causal": True}
    yield "mask ignored", sdpa(q, k, v), {"attn_mask": m}
    yield "mask inverted", sdpa(q, k, v, attn_mask=~m), {"attn_mask": m}
    yield "scale x1.01", sdpa(q, k, v, scale=1.01 / E**0.5), {}
    yield "offset 1e-2", sdpa(q, k, v) + 1e-2, {}
    if L == E:
        yield "K untransposed", sdpa(q, k.transpose(-2, -1), v), {}


def bench_verdict(lengths, E=64):
    """Rows of false alarms (float16, bfloat16) and bugs caught (float32, float16, bfloat16) per length."""
    name, ok, rows = "scaled_dot_product_attention", ("exact", "rounding"), []
    for dtype in (torch.float16, torch.bfloat16):
        for L in lengths:
            g = torch.Generator().manual_seed(L)
            bad, ran = [], 0
            for case, args, kw in _cases(L, E, dtype, g):
                for be, out in _backends(args, kw):
                    ran += 1
                    rep = rk.compare(out, name, *args, **kw)
                    if rep.verdict not in ok:
                        bad.append(f"{case} ({be}): {rep.verdict}")
            x = (torch.randn(8, L, generator=g) * 4).to(dtype)
            for op, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
                for xx, dim in ((x, -1), (x.t(), 0)):
                    ran += 1
                    rep = rk.compare(fn(xx, dim), op, xx, dim)
                    if rep.verdict not in ok:
                        bad.append(f"{op} dim={dim}: {rep.verdict}")
            rows.append(dict(kind="false alarms", dtype=str(dtype)[6:], L=L, count=len(bad), of=ran, which=bad))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for L in lengths:
            g = torch.Generator().manual_seed(L)
            q, k, v = (torch.randn(1, 2, L, E, generator=g).to(dtype) for _ in range(3))
            missed, ran = [], 0
            with sdpa_kernel(SDPBackend.MATH):
                for bug, out, kw in _bugs(q, k, v, E, L):
                    ran += 1
                    if rk.compare(out, name, q, k, v, **kw).verdict != "mismatch":
                        missed.append(bug)
            rows.append(dict(kind="bugs caught", dtype=str(dtype)[6:], L=L, count=ran - len(missed), of=ran,
                             which=missed))  # fmt: skip
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the target case and float32 softmax only")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--json", default=None, help="write the rows and targets to this file")
    p.add_argument("--verdict", action="store_true", help="false alarms and bugs caught by length, not speed")
    p.add_argument("--lengths", default="16,64,256,1024", help="sequence lengths for --verdict")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    if a.verdict:
        rows = bench_verdict([int(n) for n in a.lengths.split(",")])
        for r in rows:
            which = f"  ({'; '.join(r['which'])})" if r["which"] else ""
            print(f"{r['kind']:<13} {r['dtype']:<9} L={r['L']:<5} {r['count']:>3}/{r['of']:<3}{which}")
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump({"rows": rows, "torch": torch.__version__}, f, indent=1)
        return
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
