"""Power of the GEMM verdict in absolute units (issue 24): bugs sized in spreads of correct implementations.

For ``matmul`` (M = N = 64, K = 256, 1024, 4096) and ``conv2d`` ((2, C, 12, 12) * (16, C, 3, 3), padding 1,
C = 32 and 128: K = 288 and 1152) in float32, bfloat16 and float16, randn inputs. The spread is the largest
``|out_k - exact|`` over correct implementations k run on the very inputs: torch's CPU kernel, and float32
loops rounded once to the dtype: k left to right, right to left, split-K into chunks of 256 summed in
order, and 8 SIMD lanes over k (k = l mod 8) summed in order; conv2d in the channel-major (c, ky, kx) and
tap-major (ky, kx, c) orders. ``exact`` is torch in float64. Bugs: torch's output plus a perturbation whose
largest |value| is s x spread (s = 0.5, 8, 32), rounded to the dtype (skipped where rounding swallows
it): the whole output scaled, a constant offset, one row scaled, one column offset, one element off. Rules
as bench_verdict's power family: a correct result is never ``mismatch`` or a precision; from 8x a bug is
``mismatch``; below 1x it is never named a precision; ``detectable`` (the element threshold, median over
elements) over the spread is reported.

    python benchmarks/bench_gemm_power.py [--json out.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import refkern as rk

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SCALES = (0.5, 8, 32)
CASES = [("matmul", 256), ("matmul", 1024), ("matmul", 4096), ("conv2d", 32), ("conv2d", 128)]


def _f32(x):
    return np.asarray(x, np.float32)


def _loop(L, R, order):
    """sum_k L[:, k] R[k] in float32 over the index list ``order`` (an array of k), one rounding per step."""
    acc = np.zeros((L.shape[0], R.shape[1]), np.float32)
    for k in order:
        acc = _f32(acc + _f32(np.outer(L[:, k], R[k])))
    return acc


def _chunks(L, R, order, size):
    acc = np.zeros((L.shape[0], R.shape[1]), np.float32)
    for i in range(0, len(order), size):
        acc = _f32(acc + _loop(L, R, order[i : i + size]))
    return acc


def _lanes(L, R, order, n):
    lanes = [_loop(L, R, order[i::n]) for i in range(n)]
    acc = lanes[0]
    for v in lanes[1:]:
        acc = _f32(acc + v)
    return acc


def _emulations(L, R, orders):
    """float32 results of the emulated kernels of ``L @ R`` (float32 arrays), per order of k."""
    out = {}
    for name, o in orders.items():
        out[f"{name} left to right"] = _loop(L, R, o)
        out[f"{name} right to left"] = _loop(L, R, o[::-1])
        out[f"{name} split-K 256"] = _chunks(L, R, o, 256)
        out[f"{name} 8 lanes"] = _lanes(L, R, o, 8)
    return out


def case(op, n, dtype, seed=0):
    """(call, outputs of correct kernels {name: tensor in dtype}, exact float64 tensor)."""
    g = torch.Generator().manual_seed(1000 + seed + n)
    dt = DT[dtype]
    if op == "matmul":
        a, b = torch.randn(64, n, generator=g).to(dt), torch.randn(n, 64, generator=g).to(dt)
        args, kw = (a, b), {}
        exact = a.double() @ b.double()
        L, R = _f32(a.float().numpy()), _f32(b.float().numpy())
        emu = {k: torch.from_numpy(v) for k, v in _emulations(L, R, {"k": np.arange(n)}).items()}
    else:
        x, w = torch.randn(2, n, 12, 12, generator=g).to(dt), torch.randn(16, n, 3, 3, generator=g).to(dt)
        args, kw = (x, w), {"padding": 1}
        exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        cols = torch.nn.functional.unfold(x.float(), 3, padding=1)  # (2, n 9, 144), rows (c, ky, kx)
        L = _f32(cols.permute(0, 2, 1).reshape(-1, n * 9).numpy())
        R = _f32(w.float().reshape(16, -1).T.numpy())
        K = n * 9
        tap = np.arange(K).reshape(n, 9).T.reshape(-1)
        emu = {k: torch.from_numpy(v.reshape(2, 144, 16)).permute(0, 2, 1).reshape(exact.shape)
               for k, v in _emulations(L, R, {"channel-major": np.arange(K), "tap-major": tap}).items()}  # fmt: skip
    outs = {"torch": (args[0] @ args[1]) if op == "matmul" else torch.nn.functional.conv2d(*args, **kw)}
    outs.update({k: v.to(dt) for k, v in emu.items()})
    return (op, args, kw), outs, exact


def bugs(base, spread, exact, dtype, g):
    """[(kind, s, tensor)]: torch's output plus perturbations of largest |value| s x spread, rounded to dtype."""
    B = base.double()
    flat = B.reshape(B.shape[0], -1) if B.dim() == 2 else B.reshape(-1, B.shape[-1])
    out = []
    for s in SCALES:
        a = s * spread
        amax = float(exact.abs().max())
        cands = [("whole scaled", B * (1 + a / amax)), ("constant offset", B + a)]
        row = flat.clone()
        r = int(g.integers(flat.shape[0]))
        row[r] *= 1 + a / max(float(flat[r].abs().max()), 1e-300)
        cands.append(("one row scaled", row.reshape(B.shape)))
        col = flat.clone()
        col[:, int(g.integers(flat.shape[1]))] += a
        cands.append(("one column offset", col.reshape(B.shape)))
        el = B.clone().reshape(-1)
        el[int(g.integers(el.numel()))] += a * (1 if g.random() < 0.5 else -1)
        cands.append(("one element off", el.reshape(B.shape)))
        for kind, v in cands:
            v = v.to(DT[dtype])
            size = float((v.double() - B).abs().max())
            if size > 0:
                out.append((kind, size / spread, v))
    return out


def run(log=print):
    rows = []
    for op, n in CASES:
        for dtype in DT:
            t0 = time.perf_counter()
            (name, args, kw), outs, exact = case(op, n, dtype)
            errs = {k: float((v.double() - exact).abs().max()) for k, v in outs.items()}
            spread = max(errs.values())
            rep0 = None
            for k, v in outs.items():
                rep = rk.compare(v, name, *args, **kw)
                rep0 = rep if k == "torch" else rep0
                rows.append(dict(op=op, n=n, dtype=dtype, truth="correct", name=k, verdict=rep.verdict,
                                 precision=rep.precision, size=errs[k] / spread))  # fmt: skip
            det = float(rep0.detectable["element"]) / spread
            g = np.random.default_rng(n)
            for kind, s, v in bugs(outs["torch"], spread, exact, dtype, g):
                rep = rk.compare(v, name, *args, **kw)
                rows.append(dict(op=op, n=n, dtype=dtype, truth="bug", name=kind, verdict=rep.verdict,
                                 precision=rep.precision, size=s))  # fmt: skip
            rows.append(dict(op=op, n=n, dtype=dtype, truth="detectable", name="torch", det_over_spread=det))
            log(f"{op} {n} {dtype}: det/spread {det:.2f}, {time.perf_counter() - t0:.0f} s")
    return rows


def summarise(rows):
    out = {}
    for r in rows:
        key = f"{r['op']} {r['n']} {r['dtype']}"
        e = out.setdefault(key, {"false_alarms": 0, "correct": 0, "caught_8x": 0, "bugs_8x": 0, "below_1x_named": 0,
                                 "missed": []})  # fmt: skip
        if r["truth"] == "correct":
            e["correct"] += 1
            e["false_alarms"] += r["verdict"] not in ("exact", "rounding")
        elif r["truth"] == "bug" and r["size"] >= 8:
            e["bugs_8x"] += 1
            e["caught_8x"] += r["verdict"] == "mismatch"
            if r["verdict"] != "mismatch":
                e["missed"].append(f"{r['name']} {r['size']:.1f}x: {r['verdict']} {r['precision'] or ''}".strip())
        elif r["truth"] == "bug" and r["size"] < 1:
            e["below_1x_named"] += r["verdict"] == "reduced-precision"
        elif r["truth"] == "detectable":
            e["det_over_spread"] = round(r["det_over_spread"], 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = run()
    summary = summarise(rows)
    for k, v in summary.items():
        print(k, {kk: vv for kk, vv in v.items() if vv or kk in ("false_alarms", "caught_8x")})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": [{k: v for k, v in r.items()} for r in rows], "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
