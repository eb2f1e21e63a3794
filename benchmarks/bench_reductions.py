"""Exact reductions and norms against torch in the same run.

    python benchmarks/bench_reductions.py [--quick] [--threads N] [--json FILE]

Issue 11's targets, each a ratio of times measured in this run:

* exact ``refkern.sum`` and ``refkern.mean`` of 10**7 float32 elements within 3x torch's float64
  sum, ``torch.sum(x.double())`` (the conversion included, as the issue writes it; the ratio
  against the sum of a tensor already in float64 is reported beside it), also with ``dim=`` on
  the (1000, 10000) layout of the same values, along either axis;
* exact ``refkern.layer_norm`` on (32, 512, 768) float32 within 5x torch's float64
  ``F.layer_norm`` (weight and bias given, inputs already float64);
* ``refkern.compare(torch_fp32_output, "layer_norm", x, (768,), w, b)`` within 3x the reference
  alone (``refkern.layer_norm`` on the same inputs).

var, std, cumsum, rms_norm, group_norm and batch_norm (training, with the new running
statistics) are reported for information. Each side is timed in blocks of consecutive calls,
the sides taking turns, after a warm-up call (which compiles): interleaved single calls would
let numba's and torch's thread pools measure each other. The best block per side counts.
``--threads`` sets both pools (default: every core). On a shared machine torch's OpenMP threads
wait on a busy core and its small float64 ops slow down several-fold while numba's do not, which
flatters refkern: compare with ``--threads 1`` there.
"""

import argparse
import json
import os
from functools import partial

import numba
import torch
import torch.nn.functional as F
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk

TARGETS = {
    "sum_1e7_f32_vs_torch_f64": 3.0,
    "mean_1e7_f32_vs_torch_f64": 3.0,
    "layer_norm_32x512x768_f32_vs_torch_f64": 5.0,
    "compare_layer_norm_vs_reference": 3.0,
}


def row(op, case, t, base="torch_f64", target=None, **extra):
    """A result row: every side's seconds and each refkern side's ratio to ``base``."""
    r = dict(op=op, case=case, **{f"{k}_s": v for k, v in t.items()}, base=base, **extra)
    r["ratio"] = t["exact"] / t[base]
    if "torch_f64_pre" in t:
        r["ratio_vs_pre"] = t["exact"] / t["torch_f64_pre"]
    if target is not None:
        r["target"] = target
        r["met"] = r["ratio"] <= TARGETS[target]
    return r


def bench_sums(n, blocks, quick):
    torch.manual_seed(0)
    x = torch.randn(n)
    x64 = x.double()
    rows = []
    for op, ours, theirs in (("sum", rk.sum, torch.sum), ("mean", rk.mean, torch.mean)):
        t = per_call({"exact": (partial(ours, x), 4), "torch_f64": (lambda f=theirs: f(x.double()), 8),
                      "torch_f64_pre": (partial(theirs, x64), 8)}, blocks)  # fmt: skip
        rows.append(row(op, f"({n},)", t, target=f"{op}_1e7_f32_vs_torch_f64" if n == 10**7 else None))
    x2 = x.reshape(1000, n // 1000)
    for op, ours, theirs in (("sum", rk.sum, torch.sum), ("mean", rk.mean, torch.mean)):
        for dim in (1, 0) if not quick or op == "sum" else (1,):
            t = per_call({"exact": (partial(ours, x2, dim), 4),
                          "torch_f64": (lambda f=theirs, d=dim: f(x2.double(), d), 8),
                          "torch_f64_pre": (partial(theirs, x2.double(), dim), 8)}, blocks)  # fmt: skip
            rows.append(row(op, f"{tuple(x2.shape)} dim={dim}", t))
    return rows


def bench_layer_norm(shape, blocks, with_compare):
    torch.manual_seed(0)
    x = torch.randn(shape)
    w = torch.randn(shape[-1])
    b = torch.randn(shape[-1])
    ns = (shape[-1],)
    x64, w64, b64 = x.double(), w.double(), b.double()
    t = per_call({"exact": (partial(rk.layer_norm, x, ns, w, b), 2),
                  "torch_f64": (partial(F.layer_norm, x64, ns, w64, b64), 4),
                  "torch_f32": (partial(F.layer_norm, x, ns, w, b), 8)}, blocks)  # fmt: skip
    rows = [row("layer_norm", str(tuple(shape)), t, target="layer_norm_32x512x768_f32_vs_torch_f64")]
    if with_compare:
        y = F.layer_norm(x, ns, w, b)
        t = per_call({"exact": (partial(rk.compare, y, "layer_norm", x, ns, w, b), 3),
                      "reference": (partial(rk.layer_norm, x, ns, w, b), 6)}, max(2, blocks))  # fmt: skip
        verdict = rk.compare(y, "layer_norm", x, ns, w, b).verdict
        rows.append(row("compare", f"layer_norm {tuple(shape)}", t, base="reference",
                        target="compare_layer_norm_vs_reference", verdict=verdict))  # fmt: skip
    return rows


def bench_info(scale, blocks):
    """The other reductions and norms, no targets."""
    torch.manual_seed(0)
    rows = []
    x = torch.randn(1000 // scale, 10000)
    x64 = x.double()
    for op, ours, theirs in (("var", rk.var, torch.var), ("std", rk.std, torch.std)):
        for dim in (1, None):
            t = per_call({"exact": (partial(ours, x, dim), 2), "torch_f64": (partial(theirs, x64, dim), 8)}, blocks)
            rows.append(row(op, f"{tuple(x.shape)} dim={dim}", t))
    xc = torch.randn(1000 // scale, 1000)
    t = per_call({"exact": (partial(rk.cumsum, xc, 1), 2), "torch_f64": (partial(torch.cumsum, xc.double(), 1), 8)},
                 blocks)  # fmt: skip
    rows.append(row("cumsum", f"{tuple(xc.shape)} dim=1", t))
    xn = torch.randn(32 // scale, 512, 768)
    w = torch.randn(768)
    t = per_call({"exact": (partial(rk.rms_norm, xn, (768,), w), 2),
                  "torch_f64": (partial(F.rms_norm, xn.double(), (768,), w.double()), 4)}, blocks)  # fmt: skip
    rows.append(row("rms_norm", str(tuple(xn.shape)), t))
    xg = torch.randn(16 // scale, 64, 56, 56)
    wg, bg = torch.randn(64), torch.randn(64)
    xg64, wg64, bg64 = xg.double(), wg.double(), bg.double()
    t = per_call({"exact": (partial(rk.group_norm, xg, 32, wg, bg), 2),
                  "torch_f64": (partial(F.group_norm, xg64, 32, wg64, bg64), 4)}, blocks)  # fmt: skip
    rows.append(row("group_norm", f"{tuple(xg.shape)} groups=32", t))
    rm, rv = torch.randn(64), torch.rand(64) + 0.5

    def torch_bn():  # torch updates the running statistics in place: fresh copies each call
        return F.batch_norm(xg64, rm.double(), rv.double(), wg64, bg64, training=True)

    t = per_call({"exact": (partial(rk.batch_norm, xg, rm, rv, wg, bg, training=True, return_running_stats=True), 1),
                  "torch_f64": (torch_bn, 4)}, blocks)  # fmt: skip
    rows.append(row("batch_norm", f"{tuple(xg.shape)} training, running stats", t))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the target cases, fewer blocks, a quarter of the rest")
    p.add_argument("--blocks", type=int, default=None, help="blocks per side (default 4, 2 with --quick)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch's and numba's threads")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "reductions.json"))
    a = p.parse_args(argv)
    blocks = a.blocks or (2 if a.quick else 4)
    torch.set_num_threads(a.threads)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    rows = bench_sums(10**7, blocks, a.quick)
    rows += bench_layer_norm((32, 512, 768), blocks, with_compare=True)
    rows += bench_info(4 if a.quick else 1, blocks)
    print(f"{'op':<11} {'case':<38} {'exact':>10} {'baseline':>10} {'ratio':>7}  against")
    for r in rows:
        note = " (vs float64 already: {:.2f}x)".format(r["ratio_vs_pre"]) if "ratio_vs_pre" in r else ""
        base = {"torch_f64": "torch float64", "reference": "refkern.layer_norm"}[r["base"]]
        print(f"{r['op']:<11} {r['case']:<38} {r['exact_s'] * 1e3:8.1f}ms {r[r['base'] + '_s'] * 1e3:8.1f}ms "
              f"{r['ratio']:6.2f}x  {base}{note}")  # fmt: skip
    for r in rows:
        if "target" in r:
            verdict = "met" if r["met"] else "MISSED"
            print(f"target {r['target']}: {r['ratio']:.2f}x (<= {TARGETS[r['target']]}) {verdict}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"targets": TARGETS, "rows": rows, "threads": torch.get_num_threads(),
                   "numba_threads": numba.get_num_threads(), "quick": a.quick}, f, indent=1)  # fmt: skip
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
