"""Dot-product benchmark: ns per term of every accumulation method, against numpy's float64
``dot`` on the same data already in float64, measured in the same run.

    python benchmarks/bench_dot.py [--sizes 1e3,1e4,1e5,1e6,1e7] [--json FILE] [--quick]

Each timing is the best of repeated calls (at least 3, and at least 0.2 s in all) after a
warm-up call that compiles the kernel. The "wide" rows use float64 terms whose magnitudes
spread over 2**-100 .. 2**100 (float32: 2**-60 .. 2**60), where the exact path needs
more bins: slower, never wrong.
"""

import argparse
import json
import os
import platform
import sys
import time

import numba
import numpy as np

import refkern as rk

# targets for n = 1e6 on the 2-core reference machine (issue 2), as ratios to numpy float64 dot
TARGETS = {"float32": 4.0, "float64": 8.0}


def best_time(fn, *args, min_reps=3, min_total=0.2, **kw):
    fn(*args, **kw)  # warm-up: compile / load from cache
    times = []
    t_start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - t_start < min_total:
        t0 = time.perf_counter()
        fn(*args, **kw)
        times.append(time.perf_counter() - t0)
        if len(times) > 10_000:
            break
    return min(times)


def data(n, dtype, wide, rng):
    x = rng.standard_normal(n)
    y = rng.standard_normal(n)
    if wide:
        span = 100 if dtype == "float64" else 60
        x = x * 2.0 ** rng.integers(-span, span, n)
    return x.astype(dtype), y.astype(dtype)


def run(sizes, methods, quick=False):
    rng = np.random.default_rng(2024)
    rows = []
    for dtype in ("float32", "float64"):
        for wide in (False, True):
            for n in sizes:
                if wide and n != 10**6:
                    continue
                x, y = data(n, dtype, wide, rng)
                x64, y64 = x.astype(np.float64), y.astype(np.float64)
                t_np = best_time(np.dot, x64, y64)
                for m in methods:
                    if m != "exact" and (n > 10**6 or quick and n > 10**5):
                        continue  # the emulated-format methods are ~10 ns/term: not the point here
                    t = best_time(rk.dot, x, y, accumulate=m)
                    rows.append(
                        {
                            "dtype": dtype,
                            "data": "wide" if wide else "normal",
                            "n": n,
                            "method": m,
                            "ns_per_term": t / n * 1e9,
                            "numpy_f64_ns_per_term": t_np / n * 1e9,
                            "ratio": t / t_np,
                        }
                    )
    return rows


def table(rows):
    lines = [f"{'dtype':<8} {'data':<7} {'n':>9} {'method':<9} {'ns/term':>9} {'numpy f64':>10} {'ratio':>7}"]
    for r in rows:
        lines.append(
            f"{r['dtype']:<8} {r['data']:<7} {r['n']:>9} {r['method']:<9} {r['ns_per_term']:>9.3f} "
            f"{r['numpy_f64_ns_per_term']:>10.3f} {r['ratio']:>7.2f}"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e3,1e4,1e5,1e6,1e7", help="comma-separated lengths")
    p.add_argument("--methods", default=",".join(rk.METHODS), help="comma-separated methods")
    p.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "dot.json"))
    p.add_argument("--quick", action="store_true", help="skip the slow emulated methods above 1e5")
    a = p.parse_args(argv)
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    rows = run(sizes, a.methods.split(","), a.quick)
    print(table(rows))
    verdicts = []
    for dtype, target in TARGETS.items():
        r = [x for x in rows if x["dtype"] == dtype and x["n"] == 10**6 and x["method"] == "exact"]
        for x in r:
            head = f"exact {dtype} n=1e6 {x['data']}: {x['ratio']:.2f}x numpy float64 dot"
            if x["data"] == "wide":
                verdicts.append(f"{head} (no target: exponents spread over 2**+-100)")
            else:
                verdicts.append(f"{head} (target {target}x) {'met' if x['ratio'] <= target else 'MISSED'}")
    print("\n".join(verdicts))
    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numba": numba.__version__,
        "refkern": rk.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "targets": TARGETS, "rows": rows}, f, indent=1)
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
