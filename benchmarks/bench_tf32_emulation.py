"""The verdict on emulated NVIDIA tensor-core TF32 GEMMs (issue 24): correct ones must be ``reduced-precision
(tf32)``, bugs ``mismatch``.

Emulation (Fasi, Higham, Mikaitis & Pranesh 2021, doi:10.7717/peerj-cs.330, simplified): the float32 inputs
rounded to tf32 (10 fraction bits; to nearest even, ``rn``, or truncated, ``trunc``), blocks of ``b`` exact
products added to a float32 accumulator rounded toward zero after each block; a bias added last, rounded toward
zero. ``linear``: x (64, K), w (256, K), bias (256,) or none, K in 64, 576, 4096, 16384, randn or rand (all
positive) inputs, b in 4, 8, 16, both input roundings. ``conv2d``: x (4, 64, 28, 28), w (64, 64, 3, 3),
padding 1, as an NHWC implicit GEMM (K = 576 in the taps-major (ky, kx, c) order), with and without bias.

The spread is the largest |out - exact| over these correct emulations of a case (exact: float64). Bugs, on
the ``rn``, b = 8 emulation, rounded to float32: the whole output x (1 + 1e-4); one row (linear: one x row;
conv2d: one output channel of one image) x 1.001; the bias dropped; a constant offset of 2x the spread.

    python benchmarks/bench_tf32_emulation.py [--ks 64,576] [--json out.json]
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

import refkern as rk

BLOCKS = (4, 8, 16)
MODES = ("rn", "trunc")


def tf32(x, mode):
    """float32 values of x rounded to tf32 (13 low fraction bits cleared), float64."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    if mode == "rn":  # to nearest, ties to even: add 0xFFF plus the kept lowest bit, then truncate
        b = b + 0xFFF + ((b >> 13) & 1)
    return ((b >> 13) << 13).astype(np.uint32).view(np.float32).astype(np.float64)


def rz32(x):
    """float64 x rounded toward zero to float32 (as float64)."""
    f = x.astype(np.float32).astype(np.float64)
    over = np.abs(f) > np.abs(x)
    f[over] = np.nextafter(f[over].astype(np.float32), np.float32(0)).astype(np.float64)
    return f


def tc_gemm(A, B, mode, blk):
    """A @ B (float64 arrays of float32 values) as a tensor core: tf32 inputs, blocks of blk products (exact
    in float64: 2 x 11-bit significands, blk <= 16 terms) added to the accumulator, rounded toward zero."""
    A, B = tf32(A, mode), tf32(B, mode)
    C = np.zeros((A.shape[0], B.shape[1]))
    for k in range(0, A.shape[1], blk):
        C = rz32(C + A[:, k : k + blk] @ B[k : k + blk, :])
    return C


def linear_case(K, data, bias, seed=0):
    g = torch.Generator().manual_seed(seed + K)
    rnd = torch.rand if data == "rand" else torch.randn
    x, w = rnd(64, K, generator=g), rnd(256, K, generator=g)
    b = rnd(256, generator=g) if bias else None
    X, W = x.double().numpy(), w.double().numpy().T

    def emu(mode, blk):
        C = tc_gemm(X, W, mode, blk)
        return torch.from_numpy(rz32(C + b.double().numpy()) if bias else C).float()

    exact = F.linear(x.double(), w.double(), None if b is None else b.double())

    def row_bug(o):
        o = o.double().clone()
        o[0] *= 1.001
        return o

    drop = (lambda o: o.double() - b.double()) if bias else None
    return ("linear", (x, w, b), {}), emu, exact, row_bug, drop


def conv_case(data, bias, seed=3):
    g = torch.Generator().manual_seed(seed)
    rnd = torch.rand if data == "rand" else torch.randn
    x, w = rnd(4, 64, 28, 28, generator=g), rnd(64, 64, 3, 3, generator=g)
    b = rnd(64, generator=g) if bias else None
    cols = F.unfold(x.double(), 3, padding=1)  # (N, C*9, L), rows (c, ky, kx)
    cols = cols.reshape(4, 64, 9, -1).permute(0, 2, 1, 3).reshape(4, 576, -1)  # (ky kx, c): NHWC implicit GEMM
    Wm = w.double().permute(0, 2, 3, 1).reshape(64, 576).numpy()

    def emu(mode, blk):
        out = np.stack([tc_gemm(Wm, cols[n].numpy(), mode, blk) for n in range(4)])
        if bias:
            out = rz32(out + b.double().numpy()[None, :, None])
        return torch.from_numpy(out.reshape(4, 64, 28, 28)).float()

    exact = F.conv2d(x.double(), w.double(), None if b is None else b.double(), padding=1)

    def row_bug(o):
        o = o.double().clone()
        o[0, 5] *= 1.001
        return o

    drop = (lambda o: o.double() - b.double()[None, :, None, None]) if bias else None
    args = (x, w, b)
    return ("conv2d", args, {"padding": 1}), emu, exact, row_bug, drop


def run(cases, log=print):
    rows = []
    for label, (call, emu, exact, row_bug, drop) in cases:
        op, args, kw = call
        args = args if args[-1] is not None else args[:-1]
        t0 = time.perf_counter()
        outs = {f"{m} b={blk}": emu(m, blk) for m in MODES for blk in BLOCKS}
        errs = {k: float((o.double() - exact).abs().max()) for k, o in outs.items()}
        spread = max(errs.values())
        for k, o in outs.items():
            r = rk.compare(o, op, *args, **kw)
            rows.append(dict(case=label, truth="correct", name=k, verdict=r.verdict, precision=r.precision,
                             err_over_spread=errs[k] / spread,
                             text=None if r.precision == "tf32" else str(r)[:3000]))  # fmt: skip
        base = outs["rn b=8"]
        bugs = [("x(1+1e-4)", base.double() * (1 + 1e-4)), ("one row x1.001", row_bug(base)),
                ("offset 2x spread", base.double() + 2 * spread)]  # fmt: skip
        if drop is not None:
            bugs.append(("bias dropped", drop(base)))
        for k, o in bugs:
            o = o.float()
            r = rk.compare(o, op, *args, **kw)
            rows.append(dict(case=label, truth="bug", name=k, verdict=r.verdict, precision=r.precision,
                             err_over_spread=float((o.double() - exact).abs().max()) / spread,
                             text=None if r.verdict == "mismatch" else str(r)[:3000]))  # fmt: skip
        bad = [f"{r['name']}: {r['verdict']} {r['precision'] or ''}" for r in rows[-len(outs) - len(bugs) :]
               if (r["truth"] == "correct") != (r["precision"] == "tf32" and r["verdict"] == "reduced-precision")
               or (r["truth"] == "bug" and r["verdict"] != "mismatch")]  # fmt: skip
        log(f"{label}: spread {spread:.3g}, {time.perf_counter() - t0:.0f} s, not as required: {bad}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="64,576,4096,16384")
    ap.add_argument("--conv", action="store_true", help="the conv2d cases too")
    ap.add_argument("--no-linear", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    cases = []
    if not a.no_linear:
        for K in (int(v) for v in a.ks.split(",")):
            for data in ("randn", "rand"):
                for bias in (True, False):
                    cases.append((f"linear K={K} {data} {'bias' if bias else 'no bias'}",
                                  linear_case(K, data, bias)))  # fmt: skip
    if a.conv:
        for data in ("randn", "rand"):
            for bias in (True, False):
                cases.append((f"conv2d K=576 NHWC {data} {'bias' if bias else 'no bias'}", conv_case(data, bias)))
    rows = run(cases, log=print)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
