"""The elementwise ops measured: false alarms of torch's own CPU results, power on injected bugs, and the
reference's speed beside torch's float64 version of the same op (one run, one machine).

    python benchmarks/bench_elementwise.py [--n 200000] [--seeds 3] [--speed-n 1000000] [--json FILE]
    python benchmarks/bench_elementwise.py --speed-only [OP ...] [--threads 1]   (the speed part alone)

False alarms: for every op x dtype, ``seeds`` calls of ``refkern.compare(torch_op(x), op, x)`` on inputs
over the whole range (a third random bit patterns: subnormals, huge values, specials; the rest normal at
scales 1e-6..1e4; each function's domain edges); a call is a false alarm when its verdict is neither exact
nor rounding. Power: float32/bfloat16 bugs (a 2-ulp systematic offset, a relative offset of 8 float32
ulps, a float32 range reduction of cos at 1e4..1e5, a stray epsilon in rsqrt, gelu's tanh form for its
erf form, exp as 2**(x log2 e) with a float32 product, given as a numpy array: the fast-math classes apply
to CUDA tensors and arrays of unknown origin). Speed: float32 inputs, the reference (correctly
rounded, float32 result) against torch's float64 op on the same values, timed in blocks (benchmarks/_timing).
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import refkern

OPS = [("exp", torch.exp, {}), ("exp2", torch.exp2, {}), ("expm1", torch.expm1, {}), ("log", torch.log, {}),
       ("log2", torch.log2, {}), ("log1p", torch.log1p, {}), ("sqrt", torch.sqrt, {}), ("rsqrt", torch.rsqrt, {}),
       ("reciprocal", torch.reciprocal, {}), ("tanh", torch.tanh, {}), ("sigmoid", torch.sigmoid, {}),
       ("silu", F.silu, {}), ("gelu", F.gelu, {}), ("gelu", F.gelu, {"approximate": "tanh"}), ("erf", torch.erf, {}),
       ("softplus", F.softplus, {}), ("sin", torch.sin, {}), ("cos", torch.cos, {}),
       ("pow", torch.pow, {"exponent": 2.0}), ("pow", torch.pow, {"exponent": 2.5}),
       ("pow", torch.pow, {"exponent": -0.5})]  # fmt: skip
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _label(op, kw):
    return op + "".join(f"({k}={v})" for k, v in kw.items())


def wide(dtype, n, rng):
    finfo = torch.finfo(dtype)
    bits = rng.integers(0, 2**finfo.bits - 1, n // 3, dtype=np.uint64)
    if dtype is torch.float64:
        a = bits.view(np.float64)
    elif dtype is torch.float32:
        a = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    else:
        a = torch.from_numpy(bits.astype(np.int16)).view(dtype).double().numpy()
    s = rng.standard_normal(n - a.size) * rng.choice([1e-6, 1e-3, 0.1, 1, 3, 10, 40, 100, 1e4], n - a.size)
    edges = np.array([88.72, 88.73, -87.34, -103.97, 709.78, -745.1, 20.0, -20.0, 6.0, -6.0, 1e5, -1e5, finfo.tiny,
                      finfo.max, 1.0, -1.0, 0.0, -0.0])  # fmt: skip
    x = torch.from_numpy(np.concatenate([a, s, edges])).to(dtype)
    return x


def _call(f, x, kw):
    return f(x, kw["exponent"]) if "exponent" in kw else f(x, **kw)


def false_alarms(n, seeds):
    rows = []
    for op, f, kw in OPS:
        for dt in DTYPES:
            verdicts, unexplained, elements = {}, 0, 0
            for seed in range(seeds):
                x = wide(dt, n, np.random.default_rng(seed))
                if op == "gelu":
                    x = x[torch.isfinite(x)]  # torch's float32 gelu(+inf) is NaN, its float64 one inf
                rep = refkern.compare(_call(f, x, kw), op, x, **kw)
                verdicts[rep.verdict] = verdicts.get(rep.verdict, 0) + 1
                unexplained += rep.counts["mismatch"]
                elements += rep.n_elements
            rows.append({"op": _label(op, kw), "dtype": str(dt)[6:], "calls": seeds, "elements": elements,
                         "verdicts": verdicts, "false_alarms": seeds - verdicts.get("exact", 0)
                         - verdicts.get("rounding", 0), "unexplained_elements": unexplained})  # fmt: skip
    return rows


def _up(y, k):
    for _ in range(k):
        y = torch.nextafter(y, torch.full_like(y, math.inf))
    return y


def power(n):
    rows = []
    rng = np.random.default_rng(7)
    for dt in (torch.float32, torch.bfloat16):
        x = torch.from_numpy(rng.standard_normal(n) * 4).to(dt)
        xp = x.abs() + 1e-3
        bugs = [(op, f, kw, "2-ulp offset", lambda y: _up(y, 2)) for op, f, kw in OPS
                if op not in ("sqrt", "reciprocal") and not kw.get("approximate")]  # fmt: skip
        for op, f, kw, name, bug in bugs:
            xx = xp if op in ("log", "log2", "rsqrt", "sqrt") or kw.get("exponent") in (2.5, -0.5) else x
            y = bug(_call(f, xx, kw))
            rep = refkern.compare(y, op, xx, **kw)
            rows.append({"bug": f"{_label(op, kw)} {name}", "dtype": str(dt)[6:], "verdict": rep.verdict,
                         "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
        rel = torch.exp(x.float()) * (1 + 8 * 2.0**-24)
        rep = refkern.compare(rel.to(dt), "exp", x)
        rows.append({"bug": "exp x (1 + 8 fp32 ulps)", "dtype": str(dt)[6:], "verdict": rep.verdict,
                     "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
        ang = torch.linspace(1e4, 1e5, n).to(dt)
        a32 = ang.float()
        k = torch.round(a32 / (math.pi / 2))
        r = a32 - k * torch.tensor(math.pi / 2, dtype=torch.float32)
        q = k.to(torch.int64) % 4
        bad = torch.where(q == 0, torch.cos(r), torch.where(q == 1, -torch.sin(r), torch.where(q == 2, -torch.cos(r),
                                                                                             torch.sin(r))))
        rep = refkern.compare(bad.to(dt), "cos", ang)
        rows.append({"bug": "cos, float32 range reduction, 1e4..1e5", "dtype": str(dt)[6:], "verdict": rep.verdict,
                     "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
        rep = refkern.compare(torch.rsqrt(xp + 1e-6), "rsqrt", xp)
        rows.append({"bug": "rsqrt(x + 1e-6)", "dtype": str(dt)[6:], "verdict": rep.verdict,
                     "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
        rep = refkern.compare(F.gelu(x, approximate="tanh"), "gelu", x)
        rows.append({"bug": "gelu: tanh form for erf form", "dtype": str(dt)[6:], "verdict": rep.verdict,
                     "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
        xs = (x.float() * 5).clamp(-20, 20).to(dt).float()
        fast = torch.exp2((xs * torch.tensor(1 / math.log(2), dtype=torch.float32)).double()).float()
        rep = refkern.compare(fast.to(dt).numpy() if dt is torch.float32 else fast.to(dt), "exp", xs.to(dt).numpy()
                              if dt is torch.float32 else xs.to(dt))  # fmt: skip
        rows.append({"bug": "exp as 2**(fl32(x log2 e)) (fast-math)", "dtype": str(dt)[6:], "verdict": rep.verdict,
                     "precision": rep.precision, "unexplained": rep.counts["mismatch"]})  # fmt: skip
    return rows


def speed(n, only=None, blocks=5):
    """Per op: the reference on n float32 inputs (float32 result) and torch's float64 op on the same values, each
    timed in blocks of consecutive calls (benchmarks/_timing.per_call: a warm-up call, the best of ``blocks``
    blocks; each side as many calls per block as fill about 0.1 s), by the wall clock and by the process's CPU time
    (which a loaded machine disturbs less: a thread waiting for a core costs no CPU time); the ratios from the one
    run."""
    from _timing import per_call

    rows = []
    x32 = torch.from_numpy(np.random.default_rng(3).standard_normal(n) * 3).float()
    for op, f, kw in OPS:
        if only and op not in only:
            continue
        x = x32.abs() + 1e-3 if op in ("log", "log2", "rsqrt", "sqrt") or kw.get("exponent") in (2.5, -0.5) else x32
        ref = getattr(refkern, op)
        x64 = x.double()
        sides = {"ref": lambda: ref(x, **kw), "torch": lambda: _call(f, x64, kw)}  # noqa: B023
        calls = {}
        for name, fn in sides.items():
            fn()
            t = time.perf_counter()
            fn()
            calls[name] = max(1, int(0.1 / max(time.perf_counter() - t, 1e-6)))
        got = {clock: per_call({k: (fn, calls[k]) for k, fn in sides.items()}, blocks, clock)
               for clock in (time.perf_counter, time.process_time)}  # fmt: skip
        wall, cpu = got[time.perf_counter], got[time.process_time]
        rows.append({"op": _label(op, kw), "n": n, "reference_s": wall["ref"], "torch_float64_s": wall["torch"],
                     "ratio": wall["ref"] / wall["torch"], "reference_cpu_s": cpu["ref"],
                     "torch_float64_cpu_s": cpu["torch"], "ratio_cpu": cpu["ref"] / cpu["torch"]})  # fmt: skip
        r = rows[-1]
        print(f"  {r['op']}: {r['reference_s'] * 1e3:.2f} ms, torch float64 {r['torch_float64_s'] * 1e3:.2f} ms, "
              f"{r['ratio']:.1f}x wall; CPU {r['reference_cpu_s'] * 1e3:.2f} / {r['torch_float64_cpu_s'] * 1e3:.2f} "
              f"ms, {r['ratio_cpu']:.1f}x", flush=True)  # fmt: skip
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--power-n", type=int, default=20_000)
    p.add_argument("--speed-n", type=int, default=1_000_000)
    p.add_argument("--json")
    p.add_argument("--speed-only", nargs="*", default=None, help="only the speed part (of these ops, or of all)")
    p.add_argument("--threads", type=int, help="torch's and numba's thread count (default: theirs)")
    a = p.parse_args()
    if a.threads:
        import numba

        torch.set_num_threads(a.threads)
        numba.set_num_threads(a.threads)
    if a.speed_only is not None:
        out = {"torch": torch.__version__, "threads": a.threads, "load": os.getloadavg(),
               "speed": speed(a.speed_n, a.speed_only)}  # fmt: skip
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(out, fh, indent=1)
        return
    out = {"torch": torch.__version__, "threads": a.threads, "load": os.getloadavg(),
           "false_alarms": false_alarms(a.n, a.seeds), "power": power(a.power_n),
           "speed": speed(a.speed_n)}  # fmt: skip
    fa = out["false_alarms"]
    print(f"false alarms: {sum(r['false_alarms'] for r in fa)} of {sum(r['calls'] for r in fa)} calls "
          f"({sum(r['elements'] for r in fa)} elements)")  # fmt: skip
    for r in fa:
        if r["false_alarms"]:
            print("  ", r)
    print("| bug | dtype | verdict | unexplained |")
    for r in out["power"]:
        v = r["verdict"] + (f" ({r['precision']})" if r["precision"] else "")
        print(f"| {r['bug']} | {r['dtype']} | {v} | {r['unexplained']} |")
    print("| op | reference (ms) | torch float64 (ms) | ratio (wall) | ratio (CPU) |")
    for r in out["speed"]:
        print(f"| {r['op']} | {r['reference_s'] * 1e3:.2f} | {r['torch_float64_s'] * 1e3:.2f} | {r['ratio']:.1f} "
              f"| {r['ratio_cpu']:.1f} |")  # fmt: skip
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
