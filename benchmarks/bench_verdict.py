"""Calibration of the verdict: a confusion matrix over ops, reduction lengths, data and truths.

    python benchmarks/bench_verdict.py [--quick] [--json FILE] [--seeds N]

Every case is an output whose truth is known, judged by ``refkern.compare``:

* correct results: torch's own CPU kernels (fp32, and fp16/bf16 with 3-D inputs and
  non-contiguous operands), left-to-right and pairwise fp32 sums, split-K blocks summed in fp32,
  the reversed order, the float64 result rounded to fp32;
* reduced precisions: inputs rounded to tf32 (to nearest even, ties away, truncated), to bf16
  and fp16, autocast (bf16 and fp16 inputs and output), fp16/bf16 accumulation left-to-right,
  pairwise and in blocks of 32 (an order the verdict does not emulate), an fp32 computation
  handed over as float64;
* bugs: a dropped or doubled bias, a missing input channel or feature, a shifted output, an
  untransposed weight, a dropped tail of K, a wrong border, a whole channel off by a constant,
  one element and 1% of the elements off, noise on every element; alone and on top of a tf32
  or bf16 result. Each bug's size is measured as the largest |error| over the fp32 scale
  sqrt(n) u M of its element: >= 10 must be found, < 1 ("below the noise") must never be
  named a precision.

It prints the false-alarm rate, the detection rate of bugs >= 10x the scale, by K, the share
of reduced precisions named right, and writes JSON.
"""

import argparse
import json
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT16, TFLOAT32, round_array

KS = (9, 27, 72, 288, 1152, 4608)
DATA = ("randn", "cancelling", "positive", "wide")
OPS = ("linear", "conv2d", "matmul")
U32 = 2.0**-24


def _gen(*key):
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return g


def _rnd(g, *shape):
    return torch.randn(*shape, generator=g)


def inputs(op, k, data, seed):
    """(args, kwargs) of a call with reduction length k (conv2d: 3x3 taps, k / 9 input channels)."""
    g = _gen(op, k, data, seed)
    if op == "conv2d":
        c = max(1, k // 9)
        x, w, b = _rnd(g, 2, c, 8, 8), _rnd(g, 8, c, 3, 3), _rnd(g, 8)
    elif op == "linear":
        x, w, b = _rnd(g, 16, k), _rnd(g, 24, k), _rnd(g, 24)
    else:
        x, w, b = _rnd(g, 2, 8, k), _rnd(g, k, 12), None
    red = 1 if op == "conv2d" else (x.ndim - 1)
    if data == "positive":  # post-ReLU activations times positive weights: every term >= 0
        x, w = torch.relu(x), w.abs()
        b = b.abs() if b is not None else None
    elif data == "wide":  # exponents spread over 2**-20 .. 2**20
        x = x * torch.exp2(torch.randint(-20, 21, x.shape, generator=g).float())
        w = w * torch.exp2(torch.randint(-20, 21, w.shape, generator=g).float())
    elif data == "cancelling":  # half of the terms cancel the other half to 1e-3: outputs near 0
        h = x.shape[red] // 2
        if h:
            xs = list(x.unbind(red))
            for i in range(h):
                xs[h + i] = xs[i]
            x = torch.stack(xs, red)
            wdim = 1 if op in ("conv2d", "linear") else 0
            ws = list(w.unbind(wdim))
            for i in range(h):
                ws[h + i] = -ws[i] * (1 + 1e-3 * torch.randn(ws[i].shape, generator=g))
            w = torch.stack(ws, wdim)
    if op == "conv2d":
        return (x, w, b), {"padding": 1}
    if op == "linear":
        return (x, w, b), {}
    return (x, w), {}


def _torch_fn(op):
    return {"conv2d": F.conv2d, "linear": F.linear, "matmul": torch.matmul}[op]


def _round(t, fmt, mode):
    return torch.from_numpy(round_array(t.double().numpy(), *fmt.params, mode)).to(t.dtype)


def _rk(op, args, kw, **acc):
    return getattr(rk, op)(*args, **kw, **acc)


def _split_k(op, args, kw, block, dtype):
    """The reduction in blocks of ``block`` terms (fp32 torch kernels), block sums added in ``dtype``."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = x.shape[1] if op == "conv2d" else x.shape[-1]
    out = None
    for s in range(0, k, block):
        if op == "conv2d":
            part = F.conv2d(x[:, s:s + block], w[:, s:s + block], None, **kw)
        elif op == "linear":
            part = F.linear(x[..., s:s + block], w[..., s:s + block])
        else:
            part = torch.matmul(x[..., s:s + block], w[s:s + block])
        part = part.to(dtype)
        out = part if out is None else (out + part)
    if b is not None:
        out = out + (b.to(dtype)[:, None, None] if op == "conv2d" else b.to(dtype))
    return out


def _flip(op, args):
    """The same linear / matmul with the reduction order reversed."""
    x, w = args[0], args[1]
    if op == "linear":
        return (x.flip(-1), w.flip(-1), *args[2:])
    return (x.flip(-1), w.flip(0))


def correct_outputs(op, args, kw):
    """Correct fp32 results in several orders: (name, output)."""
    fn = _torch_fn(op)
    out = [("torch fp32", fn(*args, **kw))]
    out.append(("left-to-right fp32", _rk(op, args, kw, accumulate="naive", accum_dtype="float32")))
    out.append(("pairwise fp32", _rk(op, args, kw, accumulate="pairwise", accum_dtype="float32")))
    out.append(("split-K 64, fp32", _split_k(op, args, kw, 64, torch.float32)))
    if op != "conv2d":
        out.append(("reversed order", fn(*_flip(op, args), **kw)))
    dbl = fn(*[a.double() if a is not None else None for a in args], **kw)
    out.append(("fp64 rounded", dbl.float()))
    return out


def reduced_outputs(op, args, kw, data):
    """(precision, name, output): results of a reduced-precision computation."""
    fn = _torch_fn(op)
    x, w = args[0], args[1]
    rest = args[2:]
    out = []
    for mode, tag in ((0, "nearest"), (2, "ties away"), (1, "truncated")):
        xr, wr = _round(x, TFLOAT32, mode), _round(w, TFLOAT32, mode)
        out.append(("tf32", f"tf32 inputs ({tag})", fn(xr, wr, *rest, **kw)))
    if data != "wide":
        out.append(("fp16", "fp16 inputs", fn(x.half().float(), w.half().float(), *rest, **kw)))
    out.append(("bf16", "bf16 inputs", fn(x.bfloat16().float(), w.bfloat16().float(), *rest, **kw)))
    out.append(("bf16", "bf16 inputs (truncated)", fn(_round(x, BFLOAT16, 1), _round(w, BFLOAT16, 1), *rest, **kw)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out.append(("bf16", "autocast bf16", fn(*args, **kw).float()))
    if data != "wide":
        halves = [a.half() if a is not None else None for a in args]
        out.append(("fp16", "fp16 cast in and out", fn(*halves, **kw).float()))
    k = x.shape[1] * 9 if op == "conv2d" else x.shape[-1]
    for acc in ("float16", "bfloat16"):
        if acc == "float16" and data == "wide":
            continue  # fp16 accumulation overflows there: no precision explains inf
        short = "fp16" if acc == "float16" else "bf16"
        for order, tag in (("naive", "left-to-right"), ("pairwise", "pairwise")):
            out.append((short, f"{short} accumulation, {tag}", _rk(op, args, kw, accumulate=order, accum_dtype=acc)))
        if k >= 64:
            out.append((short, f"{short} accumulation, blocks of 32", _split_k_rk(op, args, kw, 32, acc)))
    dargs = [a.double() if a is not None else None for a in args]
    out.append(("fp32", "fp32 computation as float64", (dargs, fn(*args, **kw).double())))
    return out


def _split_k_rk(op, args, kw, block, acc):
    """fp16/bf16 accumulation in blocks: each block left-to-right in ``acc``, the block sums added in ``acc``."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = x.shape[1] if op == "conv2d" else x.shape[-1]
    fmt = FLOAT16 if acc == "float16" else BFLOAT16
    out = None
    for s in range(0, k, block):
        if op == "conv2d":
            part = rk.conv2d(x[:, s:s + block], w[:, s:s + block], None, **kw, accumulate="naive", accum_dtype=acc)
        elif op == "linear":
            part = rk.linear(x[..., s:s + block], w[..., s:s + block], accumulate="naive", accum_dtype=acc)
        else:
            part = rk.matmul(x[..., s:s + block], w[s:s + block], accumulate="naive", accum_dtype=acc)
        out = part if out is None else _round(out + part, fmt, 0)
    if b is not None:
        out = _round(out + (b[:, None, None] if op == "conv2d" else b), fmt, 0)
    return out


def bugs(op, args, kw, good, scale, seed):
    """(name, output): a bug injected into the result ``good`` of a kernel fed ``args``."""
    fn = _torch_fn(op)
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    g = _gen("bug", op, seed)
    out = []
    if b is not None:
        out.append(("bias dropped", fn(x, w, None, **kw)))
        out.append(("bias added twice", fn(x, w, 2 * b, **kw)))
    if op == "conv2d":
        c = x.shape[1]
        if c > 1:
            x0 = x.clone()
            x0[:, c // 2] = 0
            out.append(("input channel missing", fn(x0, w, b, **kw)))
        w0 = w.clone()
        w0[:, :, 1, 2] = 0
        out.append(("kernel tap missing", fn(x, w0, b, **kw)))
        bad = good.clone()  # the last column padded by replicating the border instead of zeros
        bad[..., -1] = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, b)[..., -1]
        out.append(("wrong border column", bad))
        ch = good.clone()
        ch[:, 3] += 30 * float(scale[:, 3].median())
        out.append(("one channel off by 30x scale", ch))
        out.append(("shifted by one column", torch.roll(good, 1, dims=3)))
    else:
        k = x.shape[-1]
        x0 = x.clone()
        x0[..., k // 3] = 0
        out.append(("input feature zeroed", fn(x0, w, *args[2:], **kw)))
        if op == "linear":
            ch = good.clone()
            ch[..., 5] += 30 * float(scale[..., 5].median())
            out.append(("one output feature off by 30x scale", ch))
        out.append(("shifted by one", torch.roll(good, 1, dims=-1)))
        if op == "linear" and w.shape[0] == w.shape[1]:
            out.append(("untransposed weight", x @ w + b))
    kk = x.shape[1] if op == "conv2d" else x.shape[-1]
    tail = max(1, kk // 16)
    if kk > 1:
        if op == "conv2d":
            out.append(("last K/16 channels dropped", fn(x[:, :kk - tail], w[:, :kk - tail], b, **kw)))
        elif op == "linear":
            out.append(("last K/16 terms dropped", fn(x[..., :kk - tail], w[..., :kk - tail], b)))
        else:
            out.append(("last K/16 terms dropped", fn(x[..., :kk - tail], w[:kk - tail])))
    flat = good.reshape(-1)
    sc = scale.reshape(-1)
    one = flat.clone()
    i = int(torch.randint(0, flat.numel(), (1,), generator=g))
    one[i] += 10.5 * float(sc[i]) * (1 if i % 2 else -1)
    out.append(("one element off by 10.5x scale", one.reshape(good.shape)))
    some = flat.clone()
    idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 100)]
    some[idx] += 12 * sc[idx].float() * torch.sign(torch.randn(len(idx), generator=g))
    out.append(("1% of elements off by 12x scale", some.reshape(good.shape)))
    noise = flat + 0.5 * sc.float() * torch.sign(torch.randn(flat.numel(), generator=g))
    out.append(("every element off by 0.5x scale", noise.reshape(good.shape)))
    return out


def judge(op, args, kw, out):
    t = time.perf_counter()
    rep = rk.compare(out, op, *args, **kw)
    return rep, time.perf_counter() - t


def scale_of(op, args, kw):
    el = rk.analysis.compare.elements(rk.__dict__[op](*args, **kw), op, *args, **kw)
    n = el["report"].n_terms
    return torch.from_numpy(np.sqrt(n) * U32 * el["magnitude"]), el["reference"]


def _bug_size(out, good_ref, scale):
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(out.double().numpy() - good_ref) / np.maximum(scale.numpy(), 1e-300)
    r = np.where(np.isnan(r), np.inf, r)
    return float(r.max())


def half_cases(op, k, seed):
    """Correct fp16/bf16 results of torch's CPU kernels: 3-D inputs, non-contiguous operands."""
    out = []
    (args, kw) = inputs(op, k, "randn", seed)
    for dt in (torch.float16, torch.bfloat16):
        a = [t.to(dt) if t is not None else None for t in args]
        if op == "linear":
            x3 = a[0].reshape(2, 8, -1)
            bias_nc = torch.stack([a[2], a[2]], 1)[:, 0]  # a non-contiguous bias: matmul, then add_
            res = F.linear(x3, a[1], bias_nc)
            out.append((f"torch {dt} 3-D input, strided bias", res, (x3, a[1], bias_nc), {}))
            wt = a[1].t().contiguous().t()  # a transposed-layout weight
            out.append((f"torch {dt} transposed weight layout", F.linear(a[0], wt, a[2]), (a[0], wt, a[2]), {}))
        elif op == "conv2d":
            xc = a[0].to(memory_format=torch.channels_last)
            out.append((f"torch {dt} channels_last", F.conv2d(xc, a[1], a[2], **kw), (xc, a[1], a[2]), kw))
        else:
            bt = a[1].t().contiguous().t()
            out.append((f"torch {dt} strided", torch.matmul(a[0], bt), (a[0], bt), {}))
    return out


def run(quick=False, seeds=1, ks=KS, ops=OPS, data=DATA, log=print):
    rows = []
    for op in ops:
        for k in ks:
            if quick and op == "conv2d" and k > 1152:
                continue
            for d in data:
                for seed in range(seeds):
                    args, kw = inputs(op, k, d, seed)
                    scale, ref = scale_of(op, args, kw)
                    for name, out in correct_outputs(op, args, kw):
                        rep, s = judge(op, args, kw, out)
                        rows.append(dict(op=op, k=k, data=d, truth="correct", name=name, verdict=rep.verdict,
                                         precision=rep.precision, alternatives=rep.alternatives, seconds=s))
                    if d == "randn":
                        for name, out, a2, kw2 in half_cases(op, k, seed):
                            rep, s = judge(op, a2, kw2, out)
                            rows.append(dict(op=op, k=k, data=d, truth="correct", name=name, verdict=rep.verdict,
                                             precision=rep.precision, alternatives=rep.alternatives, seconds=s))
                    for prec, name, out in reduced_outputs(op, args, kw, d):
                        a2 = args
                        if isinstance(out, tuple):
                            a2, out = out
                        rep, s = judge(op, a2, kw, out)
                        rows.append(dict(op=op, k=k, data=d, truth=f"reduced:{prec}", name=name, verdict=rep.verdict,
                                         precision=rep.precision, alternatives=rep.alternatives, seconds=s))
                    good = _torch_fn(op)(*args, **kw)
                    bases = [("fp32", good, ref, scale, args)]
                    if not quick:
                        for prec, fmt in (("tf32", TFLOAT32), ("bf16", BFLOAT16)):
                            ra = [_round(a, fmt, 0) if a is not None and i < 2 else a for i, a in enumerate(args)]
                            bo = _torch_fn(op)(*ra, **kw)
                            bases.append((prec, bo, bo.double().numpy(), scale, ra))
                    for prec, base, bref, sc, bargs in bases:  # a bug in a kernel fed the base's own inputs
                        for name, out in bugs(op, bargs, kw, base, sc, seed):
                            size = _bug_size(out, bref, sc)
                            rep, s = judge(op, args, kw, out)
                            rows.append(dict(op=op, k=k, data=d, truth=f"bug:{prec}", name=name, size=size,
                                             verdict=rep.verdict, precision=rep.precision,
                                             alternatives=rep.alternatives, seconds=s))
                    log(f"{op} K={k} {d}: {len(rows)} cases so far")
    return rows


def summarise(rows) -> dict:
    correct = [r for r in rows if r["truth"] == "correct"]
    false_alarms = [r for r in correct if r["verdict"] not in ("exact", "rounding")]
    reduced = [r for r in rows if r["truth"].startswith("reduced:")]
    named = [r for r in reduced if r["verdict"] == "reduced-precision"
             and (r["precision"] == r["truth"][8:] or r["truth"][8:] in r["alternatives"])]
    big = [r for r in rows if r["truth"].startswith("bug") and r["size"] >= 10]
    caught = [r for r in big if r["verdict"] == "mismatch"]
    small = [r for r in rows if r["truth"].startswith("bug") and r["size"] < 1]
    # below the noise a bug may go unseen, but it is never named a precision the computation did not use
    small_named = [r for r in small if r["verdict"] == "reduced-precision"
                   and r["truth"][4:] not in [r["precision"], *r["alternatives"]]]
    mid = [r for r in rows if r["truth"].startswith("bug") and 1 <= r["size"] < 10]
    by_k = {}
    for r in big:
        e = by_k.setdefault(r["k"], [0, 0])
        e[0] += r["verdict"] == "mismatch"
        e[1] += 1
    return {
        "cases": len(rows),
        "false_alarms": len(false_alarms), "correct": len(correct),
        "false_alarm_rate": len(false_alarms) / max(len(correct), 1),
        "named_right": len(named), "reduced": len(reduced), "named_rate": len(named) / max(len(reduced), 1),
        "bugs_ge_10x": len(big), "caught": len(caught), "detection_rate": len(caught) / max(len(big), 1),
        "detection_by_k": {str(k): f"{c}/{n}" for k, (c, n) in sorted(by_k.items())},
        "bugs_1_to_10x": len(mid), "caught_1_to_10x": sum(r["verdict"] == "mismatch" for r in mid),
        "bugs_below_noise": len(small), "below_noise_named_a_precision": len(small_named),
        "median_seconds": float(np.median([r["seconds"] for r in rows])) if rows else 0.0,
        "false_alarm_cases": false_alarms[:20],
        "missed": [r for r in big if r["verdict"] != "mismatch"][:40],
        "misnamed": [r for r in reduced if r not in named][:40],
        "below_noise_named": small_named[:20],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer K, no bugs on top of reduced precisions")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--json", help="write rows and summary here")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    t = time.time()
    rows = run(quick=a.quick, seeds=a.seeds, ks=(9, 72, 1152) if a.quick else KS)
    s = summarise(rows)
    print(f"\n{s['cases']} cases in {time.time() - t:.0f} s")
    print(f"false alarms on correct results: {s['false_alarms']} / {s['correct']} ({100 * s['false_alarm_rate']:.2f}%)")
    print(f"bugs >= 10x the fp32 scale caught: {s['caught']} / {s['bugs_ge_10x']} "
          f"({100 * s['detection_rate']:.1f}%); by K: {s['detection_by_k']}")
    print(f"bugs 1-10x the scale caught: {s['caught_1_to_10x']} / {s['bugs_1_to_10x']}")
    print(f"bugs below the noise named a precision: {s['below_noise_named_a_precision']} / {s['bugs_below_noise']}")
    print(f"reduced precisions named right: {s['named_right']} / {s['reduced']} ({100 * s['named_rate']:.1f}%)")
    for key in ("false_alarm_cases", "missed", "misnamed", "below_noise_named"):
        for r in s[key][:12]:
            print(f"  {key}: {r['op']} K={r['k']} {r['data']} {r['truth']} {r['name']}: {r['verdict']} "
                  f"{r['precision'] or ''} {r.get('size', '')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": {k: v for k, v in s.items() if not isinstance(v, list)}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
