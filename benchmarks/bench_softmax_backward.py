"""The correctly rounded softmax / log_softmax gradient against torch's float64 autograd in the same run.

    python benchmarks/bench_softmax_backward.py [--quick] [--blocks N] [--before-rows K] [--before-rev REV]
                                                [--json FILE]

Cases: logits ``randn * 3`` and gradients ``randn`` (seed 0), (256, 4096) and (8, 128), float32 and
float64, softmax and log_softmax, over the last dim. Sides, each timed in blocks of consecutive calls
after a warm-up call (:mod:`_timing`), the best block counting:

* ``exact``: ``refkern.backward(op, g, x, -1)`` (validation, the three passes, delivery);
* ``kernel``: :func:`~refkern.kernels.softmax_backward.softmax_backward_rows` on the float64 rows;
* ``torch_f64``: ``torch.autograd.grad`` of ``op(x.double(), -1)`` with ``g.double()`` (forward and
  backward, as a float64 reference costs a user);
* ``before``: the kernel before the double-word pass, its ``exact_row`` read from git (``--before-rev``,
  the last commit before it): the float64 pass for float32, then the exact path for every row holding
  an undecided element, and for every row of a float64 result. On (8, 128) the whole former kernel in
  the same blocks; on (256, 4096) timed once, on at most ``--before-rows`` of its exact rows, scaled
  to all of them (a whole run takes minutes: 50-140 s float32 softmax and 373 s float64 softmax were
  measured on this 2-core machine). ``speedup`` is before / kernel.

Path counts: the rows the float64 pass left to the double-word pass, the elements left to the exact path.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import types
from functools import partial

import numpy as np
import torch
from _timing import per_call  # benchmarks/_timing.py, beside this script

import refkern as rk
from refkern.accumulate.formats import FORMATS
from refkern.kernels._softmax_dd import dd_rows
from refkern.kernels.softmax_backward import _fast_rows, softmax_backward_rows


def _data(shape, dtype):
    r = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=r) * 3).to(dtype)
    g = torch.randn(shape, generator=r).to(dtype)
    return x, g


def _torch_f64(fn, x64, g64):
    x64 = x64.detach().requires_grad_()
    (dx,) = torch.autograd.grad(fn(x64, -1), x64, g64)
    return dx


def _paths(X, G, fmt, log):
    """(rows to the double-word pass, elements to the exact path)."""
    R, n = X.shape
    out = np.empty((R, n))
    und = np.zeros((R, n), np.bool_)
    if fmt.prec < 53:
        _fast_rows(X, G, log, *fmt.params, out, und)
    else:
        und[:] = True
    rows = np.flatnonzero(und.any(axis=1)).astype(np.int64)
    if rows.size:
        dd_rows(X, G, rows, log, *fmt.params, 1.0, out, und)
    return int(rows.size), int(und.sum())


BEFORE_REV = "3dc27a5"  # the last commit of refkern/kernels/softmax_backward.py without the double-word pass


def _former(rev):
    """The module refkern/kernels/softmax_backward.py at git revision ``rev`` (its jitted pass uncached), or None."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        src = subprocess.run(["git", "show", f"{rev}:refkern/kernels/softmax_backward.py"], cwd=root, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    src = src.replace("from refkern._jit import jit", "from numba import njit\n\n"
                      "def jit(**kw):\n    return njit(fastmath=False, cache=False, **kw)")  # fmt: skip
    mod = types.ModuleType("softmax_backward_before")
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{rev}:refkern/kernels/softmax_backward.py", "exec"), mod.__dict__)
    return mod


def _before(old, X, G, fmt, log, k):
    """Seconds of the former kernel on all rows, from k of its exact rows (its float64 pass timed whole, warm)."""
    t_fast = 0.0
    first = np.ones(X.shape, np.bool_)
    if fmt.prec < 53:
        out = np.empty(X.shape)
        for _ in range(2):
            t0 = time.perf_counter()
            old._fast_rows(X, G, log, *fmt.params, out, first)
            t_fast = time.perf_counter() - t0
    rows = np.flatnonzero(first.any(axis=1))
    take = rows[:k]
    t0 = time.perf_counter()
    for r in take:
        old.exact_row(X[r], G[r], np.flatnonzero(first[r]).tolist(), fmt, log)
    t_rows = time.perf_counter() - t0
    return t_fast + (t_rows / max(take.size, 1)) * rows.size, int(take.size), int(rows.size)


def bench(shape, dtype, op, blocks, before_rows, old):
    x, g = _data(shape, dtype)
    fmt = FORMATS[str(dtype)[6:]]
    log = op == "log_softmax"
    fn = torch.log_softmax if log else torch.softmax
    X = np.ascontiguousarray(x.double().numpy().reshape(-1, shape[-1]))
    G = np.ascontiguousarray(g.double().numpy().reshape(-1, shape[-1]))
    big = shape[0] * shape[1] >= 1 << 16
    sides = {"exact": (partial(rk.backward, op, g, x, -1), 1 if big else 20),
             "kernel": (partial(softmax_backward_rows, X, G, fmt, log), 1 if big else 20),
             "torch_f64": (partial(_torch_f64, fn, x.double(), g.double()), 10 if big else 200)}  # fmt: skip
    if old is not None and not big:  # the former kernel whole, in the same blocks
        sides["before"] = (partial(old.softmax_backward_rows, X, G, fmt, log), 2)
    t = per_call(sides, blocks)
    dd, n_exact = _paths(X, G, fmt, log)
    ref = rk.backward(op, g, x, -1)["input"].double().numpy()
    kern, _ = softmax_backward_rows(X, G, fmt, log)
    assert kern.reshape(ref.shape).view(np.int64).tolist() == ref.view(np.int64).tolist()
    if old is None:
        t_before, sampled, ex_rows = float("nan"), 0, 0
    elif big:
        t_before, sampled, ex_rows = _before(old, X, G, fmt, log, before_rows)
    else:
        t_before, sampled, ex_rows = t["before"], -1, -1
    return dict(op=op, case=str(tuple(shape)), dtype=str(dtype)[6:], exact_s=t["exact"], kernel_s=t["kernel"],
                torch_f64_s=t["torch_f64"], vs_torch_f64=t["exact"] / t["torch_f64"], before_s=t_before,
                before_rows_timed=sampled, before_exact_rows=ex_rows, speedup=t_before / t["kernel"], dd_rows=dd,
                exact_elements=n_exact)  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="float32 only, 2 blocks")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--before-rows", type=int, default=3, help="exact rows of the former method timed per case")
    p.add_argument("--before-rev", default=BEFORE_REV, help="git revision of the former kernel ('' to skip it)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    old = _former(a.before_rev) if a.before_rev else None
    torch.set_num_threads(os.cpu_count() or 1)
    blocks = 2 if a.quick else a.blocks
    dtypes = (torch.float32,) if a.quick else (torch.float32, torch.float64)
    rows = [bench(shape, dt, op, blocks, a.before_rows, old) for shape in ((256, 4096), (8, 128)) for dt in dtypes
            for op in ("softmax", "log_softmax")]  # fmt: skip
    print(f"{'op':<12} {'case':<12} {'dtype':<8} {'exact':>10} {'torch f64':>10} {'ratio':>8} {'kernel':>10} "
          f"{'before':>10} {'speedup':>8} {'dd rows':>8} {'exact el':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['op']:<12} {r['case']:<12} {r['dtype']:<8} {r['exact_s'] * 1e3:8.4g}ms "
              f"{r['torch_f64_s'] * 1e3:8.3g}ms {r['vs_torch_f64']:7.3g}x {r['kernel_s'] * 1e3:8.4g}ms "
              f"{r['before_s'] * 1e3:8.4g}ms "
              f"{r['speedup']:7.3g}x {r['dd_rows']:>8} {r['exact_elements']:>8}")  # fmt: skip
    print(f"before: the kernel at {a.before_rev or '(skipped)'}; on (256, 4096) its exact rows timed on at most "
          f"{a.before_rows} of them and scaled; speedup = before / kernel; {torch.get_num_threads()} threads"
          )  # fmt: skip
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "threads": torch.get_num_threads()}, f, indent=1)
        print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
