"""torch's CPU elementwise kernels judged over the whole range (issue 26's done-when: no false alarm in float32,
bfloat16 and float16): every bfloat16 and float16 value (all 65,536 bit patterns: subnormals, the largest finite
values, +-0, +-inf, NaNs) through each function, and a dense float32 sample (every ``--f32-stride``-th bit pattern,
offset so that both signs and every binade are met, plus each function's domain edges), each judged by
:func:`refkern.compare` against the correctly rounded reference and the accuracy-class yardstick.

    python benchmarks/bench_elementwise_sweep.py --json /tmp/sweep.json [--ops exp gelu] [--dtypes bfloat16]

Prints one row per (function, dtype): the elements, the verdict, the class named, the largest error over its bound
and, for anything but exact/rounding, the worst inputs.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import refkern

#: (name shown, registry op, torch callable, keyword arguments)
OPS = [("exp", "exp", torch.exp, {}), ("exp2", "exp2", torch.exp2, {}), ("expm1", "expm1", torch.expm1, {}),
       ("log", "log", torch.log, {}), ("log2", "log2", torch.log2, {}), ("log1p", "log1p", torch.log1p, {}),
       ("sqrt", "sqrt", torch.sqrt, {}), ("rsqrt", "rsqrt", torch.rsqrt, {}),
       ("reciprocal", "reciprocal", torch.reciprocal, {}), ("tanh", "tanh", torch.tanh, {}),
       ("sigmoid", "sigmoid", torch.sigmoid, {}), ("silu", "silu", F.silu, {}), ("gelu", "gelu", F.gelu, {}),
       ("gelu-tanh", "gelu", F.gelu, {"approximate": "tanh"}), ("erf", "erf", torch.erf, {}),
       ("softplus", "softplus", F.softplus, {}), ("sin", "sin", torch.sin, {}), ("cos", "cos", torch.cos, {}),
       *((f"pow-{y}", "pow", torch.pow, {"exponent": y}) for y in (2.0, 3.0, -1.0, -2.0, 0.5, -0.5, 2.5))]  # fmt: skip

#: the edges of the functions' domains and ranges, added to the float32 sample
EDGES = [88.72283935546875, 88.7228469848633, -87.33654022216797, -103.97207641601562, -103.97208404541016, 128.0,
         -149.0, -150.0, 20.0, -20.0, 3.0, -3.0, 6.37, 4.5, -14.5, 1e5, -1e5, 1e30, -1e30, 0.5, -0.5, 1.0, -1.0,
         -0.9999999403953552, 2.0**-126, 2.0**-149, -(2.0**-149), 3.4028234663852886e38, np.inf, -np.inf, 0.0, -0.0,
         float(np.pi / 2), float(np.pi), 102940.0, 205881.0]  # fmt: skip


def values(dtype, stride):
    """Every value of a 16-bit format; for float32 every ``stride``-th bit pattern (stride odd, so every
    residue of the low bits is met across binades) and the domain edges."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    bits = np.arange(0, 2**32, stride, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return torch.from_numpy(np.concatenate([x, np.asarray(EDGES, np.float32)]))


def judge(op, f, kw, x):
    out = f(x, **kw) if op != "pow" else f(x, kw["exponent"])
    t0 = time.perf_counter()
    rep = refkern.compare(out, op, x, **kw)
    row = {"verdict": rep.verdict, "model": rep.model, "max_ratio": rep.max_bound_ratio, "max_ulp": rep.max_ulp,
           "n": int(x.numel()), "seconds": time.perf_counter() - t0}  # fmt: skip
    if rep.verdict not in ("exact", "rounding"):
        w = rep.worst_details if hasattr(rep, "worst_details") else None
        row["worst"] = str(w)[:2000]
        row["report"] = str(rep)[:3000]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--ops", nargs="*", default=None)
    p.add_argument("--dtypes", nargs="*", default=["bfloat16", "float16", "float32"])
    p.add_argument("--f32-stride", type=int, default=4099)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"load {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    for name in a.dtypes:
        dtype = getattr(torch, name)
        x = values(dtype, a.f32_stride)
        for shown, op, f, kw in OPS:
            if a.ops and shown not in a.ops and op not in a.ops:
                continue
            row = {"op": shown, "dtype": name, **judge(op, f, kw, x)}
            rows.append(row)
            print(f"{shown:12s} {name:9s} n={row['n']:8d} {row['verdict']:18s} {str(row['model']):22s} "
                  f"ratio {row['max_ratio']:.3g} ulp {row['max_ulp']:.3g} ({row['seconds']:.1f} s)", flush=True)
            if "report" in row:
                print(row["report"], flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"load": os.getloadavg(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
