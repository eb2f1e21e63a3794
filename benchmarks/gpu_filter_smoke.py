"""A short check of the filter's decision on a CUDA device (refkern.engines.filter_device), < 30 s.

    python benchmarks/gpu_filter_smoke.py [--device cuda]

Each case computes an exact GEMM on the device, by the device path that stays there
(``filter_device.matmul``) and by ``refkern.matmul`` / ``refkern.linear`` on CUDA tensors (the
filter's device decision, results copied back), and compares both with the Numba engine on the CPU,
bit for bit. One line per case: PASS, or FAIL with the first differing element, both values in hex
and as bits of the result format. Then the device's own self-test (the float64 GEMM's assumption),
a 1024^3 float32 product checked on a block of rows, and the pairwise stage (forced) at K = 4096.
``--device cpu`` runs the same on CPU tensors (to check the script without a GPU). Exit status 1
when any case fails.
"""

import argparse
import sys
import time

import numpy as np
import torch

import refkern as rk
from refkern.engines import filter as filt
from refkern.engines import filter_device as fd

NARROW = ("float32", "bfloat16", "float16")


def _bits(x, dtype):
    """The result format's bit pattern of the float64 value x (exactly representable there)."""
    t = torch.tensor([x], dtype=torch.float64).to(getattr(torch, dtype))
    return f"0x{t.view(torch.int16 if dtype != 'float32' else torch.int32).item() & 0xFFFFFFFF:x}"


def _first_difference(got, want, dtype):
    """None when got and want (tensors of one shape) are the same bits, NaNs alike; else a line."""
    g = got.detach().cpu().double().numpy().reshape(-1)
    w = want.detach().cpu().double().numpy().reshape(-1)
    if g.shape != w.shape:
        return f"shapes differ: {got.shape} vs {want.shape}"
    same = (g.view(np.int64) == w.view(np.int64)) | (np.isnan(g) & np.isnan(w))
    if same.all():
        return None
    i = int(np.flatnonzero(~same)[0])
    idx = np.unravel_index(i, tuple(got.shape))
    return (f"{int((~same).sum())} of {g.size} differ; first at {tuple(int(v) for v in idx)}: got {float(g[i]).hex()} "
            f"({_bits(g[i], dtype)}), want {float(w[i]).hex()} ({_bits(w[i], dtype)})")  # fmt: skip


def _cases(dev):
    """(name, a, b, bias) small adversarial GEMMs, on ``dev``."""
    g = torch.Generator().manual_seed(7)
    out = []
    for dtype in NARROW:
        dt = getattr(torch, dtype)
        fin = torch.finfo(dt)
        a = torch.randn(48, 200, generator=g)
        b = torch.randn(200, 40, generator=g)
        out.append((f"{dtype} normal", a, b, None))
        out.append((f"{dtype} bias", a, b, torch.randn(40, generator=g)))
        c = a.clone()
        c[:, 1::2] = -c[:, ::2]  # cancelling pairs, and one small term: most elements undecided
        d = b.clone()
        d[1::2] = d[::2]
        c[:, 198], c[:, 199] = 0, 2.0**-20  # sums 2**-20 d[199]: condition numbers about 2**27
        out.append((f"{dtype} cancellation", c, d, None))
        p = {"float32": 24, "bfloat16": 8, "float16": 11}[dtype]
        h = 2.0**-p
        rows = torch.tensor([[1, h, 0, 0], [1 + 2 * h, h, 0, 0], [1, h, 2.0**-30, 0], [2, -h / 2, 0, 0],
                             [1, h, -(2.0**-30), 0]], dtype=torch.float64)  # fmt: skip
        if dtype == "float16":
            rows[2, 2], rows[4, 2] = 2.0**-20, -(2.0**-20)
        out.append((f"{dtype} ties and midpoints", rows, torch.ones(4, 3, dtype=torch.float64), None))
        sub = fin.smallest_normal * 2.0 ** -(p - 1)
        big = fin.max / 2
        e = torch.tensor([[sub, 0, 0], [sub, sub, 0], [big, big, big], [-big, -big, -big], [-0.0, 0.0, -0.0],
                          [-0.0, -0.0, -0.0], [1.0, -1.0, 0.0]], dtype=torch.float64)  # fmt: skip
        f = torch.tensor([[0.5, 1.0], [0.25, 1.0], [1.0, 1.0]], dtype=torch.float64)  # sub / 2: a tie to +0
        out.append((f"{dtype} subnormal, overflow, signed zeros", e, f, None))
        s = torch.randn(32, 64, generator=g) * 2.0 ** torch.randint(-30, 31, (32, 64), generator=g)
        if dtype == "float16":
            s = torch.randn(32, 64, generator=g) * 2.0 ** torch.randint(-6, 7, (32, 64), generator=g)
        out.append((f"{dtype} exponent spread", s, torch.randn(64, 24, generator=g), None))
        x = torch.randn(16, 32, generator=g)
        x[0, 3], x[1, 5], x[2, 0] = float("inf"), float("nan"), float("-inf")
        out.append((f"{dtype} inf and NaN rows", x, torch.randn(32, 8, generator=g), None))
    res = []
    for name, a, b, bias in out:
        dt = getattr(torch, name.split()[0])
        res.append((name, a.to(dt), b.to(dt), None if bias is None else bias.to(dt)))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    dev = torch.device(ap.parse_args().device)
    t_start = time.perf_counter()
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("FAIL no CUDA device visible to torch")
        return 1
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {name}; torch {torch.__version__}; numpy {np.__version__}")
    t0 = time.perf_counter()
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    rk.matmul(a, b, engine="numba")
    fd.matmul(a.to(dev), b.to(dev))
    a[0, 1::2] = -a[0, ::2]
    fd.matmul(a.to(dev), torch.ones(8, 3))  # compiles the exact path's kernel
    print(f"warm-up (Numba compiles, CUDA context): {time.perf_counter() - t0:.1f} s")
    fails = 0
    for case, a, b, bias in _cases(dev):
        dtype = case.split()[0]
        t0 = time.perf_counter()
        want = rk.matmul(a, b, engine="numba") if bias is None else rk.linear(a, b.T.contiguous(), bias, engine="numba")
        try:
            got, st = fd.matmul(a.to(dev), b.to(dev), None if bias is None else bias.to(dev))
            diff = _first_difference(got, want, dtype)
            if bias is None:
                got2 = rk.matmul(a.to(dev), b.to(dev), engine="filter")
            else:
                got2 = rk.linear(a.to(dev), b.T.contiguous().to(dev), bias.to(dev), engine="filter")
            diff2 = _first_difference(got2, want, dtype)
        except Exception as exc:  # a crash is a failure of this case, reported, not the end of the run
            diff, diff2, st = f"raised {type(exc).__name__}: {exc}", None, {}
        bad = diff or diff2
        fails += bool(bad)
        und = (f"undecided {st.get('undecided_first', '?')} -> {st.get('undecided_after_tight', '?')} of "
               f"{st.get('elements', '?')}")  # fmt: skip
        where = f": filter_device.matmul: {diff}" if diff else f": refkern.matmul on {dev.type}: {diff2}"
        print(f"{'FAIL' if bad else 'PASS'} {case} ({und}; {time.perf_counter() - t0:.2f} s)" + (where if bad else ""))
    if dev.type == "cuda":
        ok, detail = filt.self_test(dev)
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'} self_test(cuda): {detail}")
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    got, st = fd.matmul(a.to(dev), b.to(dev))
    want = rk.matmul(a[:64], b, engine="numba")
    diff = _first_difference(got[:64], want, "float32")
    fails += bool(diff)
    print(f"{'FAIL' if diff else 'PASS'} float32 1024^3, rows 0..63 against the Numba engine (undecided "
          f"{st['undecided_first']} -> {st['undecided_after_tight']} of {st['elements']}; "
          f"{time.perf_counter() - t0:.2f} s)" + (f": {diff}" if diff else ""))  # fmt: skip
    t0 = time.perf_counter()
    a, b = torch.randn(32, 4096, generator=g), torch.randn(4096, 512, generator=g)
    bias = torch.randn(512, generator=g)
    fd.Device.force_pairwise = True  # the pairwise stage on these few undecided elements too
    try:
        got, st = fd.matmul(a.to(dev), b.to(dev), bias.to(dev))
    finally:
        fd.Device.force_pairwise = False
    diff = _first_difference(got, rk.linear(a, b.T.contiguous(), bias, engine="numba"), "float32")
    fails += bool(diff)
    print(f"{'FAIL' if diff else 'PASS'} float32 32 x 4096 x 512 with bias, the pairwise stage forced (undecided "
          f"{st['undecided_first']} -> {st['undecided_after_tight']} -> {st.get('undecided_after_pairwise')} of "
          f"{st['elements']}; {time.perf_counter() - t0:.2f} s)" + (f": {diff}" if diff else ""))  # fmt: skip
    print(f"SMOKE {'PASS' if not fails else f'FAIL ({fails} failed)'} in {time.perf_counter() - t_start:.1f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
