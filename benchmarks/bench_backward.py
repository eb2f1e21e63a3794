"""Exact conv gradients against torch's float64 backward in the same run.

    python benchmarks/bench_backward.py [--quick] [--json FILE]

Issue 13's target: the exact grad_weight and grad_input of the ResNet conv (8, 64, 56, 56) x
(64, 64, 3, 3), padding 1, float32, within 3x torch's float64 backward of the same conv
(``torch.ops.aten.convolution_backward`` with both outputs, as autograd calls it). Each side is
timed in blocks of consecutive calls, the sides taking turns, after a warm-up call (which
compiles); the best block per side is reported. Without --quick also each gradient alone, a
linear layer's (4096 x 1024 x 1024) gradients against torch float64 matmuls, and the correctly
rounded softmax / log_softmax gradients of (64, 1024) float32 logits against torch's float64
backward kernels (no target: reported).
"""

import argparse
import json
import os
from functools import partial

import torch
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk

TARGETS = {"conv_8x64x56x56_3x3_f32_grads_vs_torch_f64_backward": 3.0}


def _torch_conv_backward(g, x, w, mask):
    return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)


def bench_conv(wrt, blocks):
    torch.manual_seed(0)
    x, w = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3) * 0.05
    g = torch.randn(8, 64, 56, 56)
    x64, w64, g64 = x.double(), w.double(), g.double()
    mask = ["x" in wrt, "weight" in wrt, False]
    t = per_call({"exact": (partial(rk.backward, "conv2d", g, x, w, padding=1, wrt=wrt), 1),
                  "torch_f64": (partial(_torch_conv_backward, g64, x64, w64, mask), 3),
                  "torch_f32": (partial(_torch_conv_backward, g, x, w, mask), 6)}, blocks)  # fmt: skip
    return dict(op="conv2d backward", case="(8,64,56,56)x(64,64,3,3) p1", wrt="+".join(wrt), dtype="float32",
                exact_s=t["exact"], torch_f64_s=t["torch_f64"], torch_f32_s=t["torch_f32"],
                vs_torch_f64=t["exact"] / t["torch_f64"], vs_torch_f32=t["exact"] / t["torch_f32"])  # fmt: skip


def bench_linear(blocks):
    torch.manual_seed(0)
    x, w, g = torch.randn(4096, 1024), torch.randn(1024, 1024), torch.randn(4096, 1024)
    x64, w64, g64 = x.double(), w.double(), g.double()
    t = per_call({"exact": (partial(rk.backward, "linear", g, x, w), 1),
                  "torch_f64": (lambda: (g64 @ w64, g64.t() @ x64), 3),
                  "torch_f32": (lambda: (g @ w, g.t() @ x), 6)}, blocks)  # fmt: skip
    return dict(op="linear backward", case="(4096,1024)x(1024,1024)", wrt="x+weight", dtype="float32",
                exact_s=t["exact"], torch_f64_s=t["torch_f64"], torch_f32_s=t["torch_f32"],
                vs_torch_f64=t["exact"] / t["torch_f64"], vs_torch_f32=t["exact"] / t["torch_f32"])  # fmt: skip


def bench_softmax(op, blocks):
    """softmax / log_softmax backward of (64, 1024) float32 logits (exact, correctly rounded) against
    torch's float64 backward kernel (``torch._softmax_backward_data`` on the stored float64 output)."""
    torch.manual_seed(0)
    x, g = torch.randn(64, 1024) * 4, torch.randn(64, 1024)
    x64, g64 = x.double(), g.double()
    fwd, bwd = {"softmax": (torch.softmax, torch._softmax_backward_data),
                "log_softmax": (torch.log_softmax, torch._log_softmax_backward_data)}[op]  # fmt: skip
    y64, y32 = fwd(x64, -1), fwd(x, -1)
    t = per_call({"exact": (partial(rk.backward, op, g, x, -1), 1),
                  "torch_f64": (partial(bwd, g64, y64, -1, torch.float64), 20),
                  "torch_f32": (partial(bwd, g, y32, -1, torch.float32), 20)}, blocks)  # fmt: skip
    return dict(op=f"{op} backward", case="(64,1024) dim -1", wrt="input", dtype="float32",
                exact_s=t["exact"], torch_f64_s=t["torch_f64"], torch_f32_s=t["torch_f32"],
                vs_torch_f64=t["exact"] / t["torch_f64"], vs_torch_f32=t["exact"] / t["torch_f32"])  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the target case only, two blocks")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows and targets to this file")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    blocks = 2 if a.quick else a.blocks
    rows = [bench_conv(("x", "weight"), blocks)]
    if not a.quick:
        rows.append(bench_conv(("weight",), blocks))
        rows.append(bench_conv(("x",), blocks))
        rows.append(bench_linear(blocks))
        rows += [bench_softmax(op, blocks) for op in ("softmax", "log_softmax")]
    print(f"{'op':<21} {'case':<30} {'wrt':<9} {'exact':>9} {'torch f64':>10} {'ratio':>8} {'vs f32':>8}")
    for r in rows:
        times = f"{r['exact_s'] * 1e3:7.3g}ms {r['torch_f64_s'] * 1e3:8.3g}ms"
        print(
            f"{r['op']:<21} {r['case']:<30} {r['wrt']:<9} {times} {r['vs_torch_f64']:7.3g}x {r['vs_torch_f32']:7.3g}x"
        )
    got = rows[0]["vs_torch_f64"]
    target = TARGETS["conv_8x64x56x56_3x3_f32_grads_vs_torch_f64_backward"]
    print(f"target: exact grad_x + grad_weight of the ResNet conv vs torch float64 backward: {got:.2f}x "
          f"(<= {target}) {'met' if got <= target else 'MISSED'}")  # fmt: skip
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"targets": TARGETS, "rows": rows, "threads": torch.get_num_threads()}, f, indent=1)
        print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
