"""The CUDA paths in one device call: every op of the registry run on a GPU and judged.

    PYTHONUNBUFFERED=1 python benchmarks/gpu_check.py [--device cuda] [--budget 300] [--json FILE] [--small]

A GPU is lent to some sessions only, for minutes (the device tool), so this is one prepared script:
sections in order of what they tell, each guarded (a failure prints its error and the next runs), and
the whole cut at ``--budget`` seconds (the sections left are named as skipped, never silently dropped).

1. ``check``: the ops users run on a GPU (the GEMMs with TF32 off and on, the norms, softmax,
   attention, the reductions, the pools, the elementwise functions over their whole range, the
   losses) through :func:`refkern.torch.check` on the device, forward and, where refkern has the
   gradient, backward. Every row is a real CUDA kernel judged against the exact reference of the very
   inputs: ``exact``, ``rounding`` or a named ``reduced-precision`` (TF32 when it is on) is expected;
   a ``mismatch`` is either a false alarm of refkern's verdict or a CUDA kernel beyond every model,
   and the row's report says which pattern it saw.
2. ``audit``: random-initialised transformers models (small configs) on the device, bfloat16 and
   float32 forward and a training step: the ops judged, the failures, what was not checked.
3. ``filter``: the exact float32 matmul of 4096^3 on the device (engine ``"filter"``) against torch's
   float64 matmul on the same device, in blocks of calls with the device synchronised; the issue's
   target is 1.5x.

``--device cpu --small`` runs the same script on the CPU at small sizes: the script's own smoke test.
``--save FILE`` keeps each mismatch's inputs and the device's output (``torch.load``), so that a false alarm
seen on a lent GPU can be studied afterwards on the CPU, without device time.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import refkern as rk
import refkern.torch as rkt

OK = ("exact", "rounding", "reduced-precision")
FOUND = {}  # "dtype case" -> the inputs, keywords and the device's output of each mismatch (--save)


def _data(shape, dtype, dev, gen, kind="normal"):
    """Seeded values on the CPU (the same on every run), then moved to ``dev`` without loss."""
    if kind == "normal":
        x = torch.randn(shape, generator=gen)
    elif kind == "wide":  # the elementwise functions' range: signs and exponents from 2**-20 to 2**7
        x = torch.randn(shape, generator=gen).sign() * torch.exp2(torch.rand(shape, generator=gen) * 27 - 20)
    elif kind == "angles":  # rotary angles: positions times frequencies, up to 1e5
        x = torch.rand(shape, generator=gen) * 1e5
    elif kind == "positive":
        x = torch.rand(shape, generator=gen) * 4 + 1e-3
    else:
        raise ValueError(kind)
    return x.to(getattr(torch, dtype)).to(dev)


ELEMENTWISE = (  # (label, function, the values' kind, keywords)
    ("exp", torch.exp, "wide", {}),
    ("log", torch.log, "positive", {}),
    ("tanh", torch.tanh, "wide", {}),
    ("sigmoid", torch.sigmoid, "wide", {}),
    ("silu", F.silu, "wide", {}),
    ("gelu", F.gelu, "wide", {}),
    ("gelu tanh", F.gelu, "wide", {"approximate": "tanh"}),
    ("erf", torch.erf, "wide", {}),
    ("sin angles", torch.sin, "angles", {}),
    ("cos angles", torch.cos, "angles", {}),
    ("rsqrt", torch.rsqrt, "positive", {}),
    ("sqrt", torch.sqrt, "positive", {}),
    ("log1p", torch.log1p, "positive", {}),
    ("expm1", torch.expm1, "wide", {}),
    ("softplus", F.softplus, "wide", {}),
    ("reciprocal", torch.reciprocal, "wide", {}),
)


def _gradients(fn, args, kw):
    """{"grad_output": g, "grads": [the device's gradient of each floating tensor argument, or None]}: the
    backward that refkern.torch.check ran, run again (grad_output standard normal from a generator seeded
    with 0, in float64 rounded to the output's dtype, as check makes it) and brought to the CPU."""
    leaves = [x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in args]  # fmt: skip
    with torch.enable_grad():
        out = fn(*leaves, **kw)
        out = out[0] if isinstance(out, tuple) else out
        g = torch.randn(tuple(out.shape), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        out.backward(g.to(out.dtype).to(out.device))
    grads = [x.grad.cpu() if isinstance(x, torch.Tensor) and x.grad is not None else None for x in leaves]
    return {"grad_output": g.to(out.dtype), "grads": grads}


def _cases(small, dtypes=("bfloat16", "float32", "float16")):
    """(label, fn, args builder, kwargs, backward, settings) for section 1."""
    n_feat, n_keys, n_red = (256, 256, 10**4) if small else (4096, 4096, 10**7)
    k_gemm = 256 if small else 4096
    cases = []
    for dt in dtypes:
        for tf32 in (False, True) if dt == "float32" else (False,):
            cases.append((f"linear K={k_gemm} tf32={tf32}", F.linear,
                          lambda g, d, dt=dt: (_data((64, k_gemm), dt, d, g), _data((256, k_gemm), dt, d, g),
                                               _data((256,), dt, d, g)), {}, True, dt, tf32))  # fmt: skip
            cases.append((f"conv2d 64ch tf32={tf32}", F.conv2d,
                          lambda g, d, dt=dt: (_data((4, 64, 28, 28), dt, d, g), _data((64, 64, 3, 3), dt, d, g)),
                          {"padding": 1}, True, dt, tf32))  # fmt: skip
        cases.append((f"bmm 8x128x{k_gemm}x128", torch.bmm,
                      lambda g, d, dt=dt: (_data((8, 128, k_gemm), dt, d, g), _data((8, k_gemm, 128), dt, d, g)),
                      {}, False, dt, False))  # fmt: skip
        feat = lambda g, d, dt=dt: (_data((16, n_feat), dt, d, g),)  # noqa: E731
        wb = lambda g, d, dt=dt: (  # noqa: E731
            _data((16, n_feat), dt, d, g),
            (n_feat,),
            _data((n_feat,), dt, d, g),
            _data((n_feat,), dt, d, g),
        )
        cases += [
            (f"layer_norm {n_feat}", F.layer_norm, wb, {}, True, dt, False),
            (
                f"rms_norm {n_feat}",
                F.rms_norm,
                lambda g, d, dt=dt: (_data((16, n_feat), dt, d, g), (n_feat,), _data((n_feat,), dt, d, g)),
                {},
                True,
                dt,
                False,
            ),
            (
                f"softmax {2 * n_feat}",
                F.softmax,
                lambda g, d, dt=dt: (_data((16, 2 * n_feat), dt, d, g) * 4,),
                {"dim": -1},
                True,
                dt,
                False,
            ),
            (
                f"log_softmax {2 * n_feat}",
                F.log_softmax,
                lambda g, d, dt=dt: (_data((16, 2 * n_feat), dt, d, g) * 4,),
                {"dim": -1},
                True,
                dt,
                False,
            ),
            (
                f"sdpa keys={n_keys}",
                F.scaled_dot_product_attention,
                lambda g, d, dt=dt: (
                    _data((1, 8, 64, 64), dt, d, g),
                    _data((1, 8, n_keys, 64), dt, d, g),
                    _data((1, 8, n_keys, 64), dt, d, g),
                ),
                {},
                True,
                dt,
                False,
            ),
            (
                "sdpa causal 512",
                F.scaled_dot_product_attention,
                lambda g, d, dt=dt: tuple(_data((2, 4, 512, 64), dt, d, g) for _ in range(3)),
                {"is_causal": True},
                True,
                dt,
                False,
            ),
            (
                f"sum {n_red if dt == 'float32' else n_red // 100}",
                torch.sum,
                lambda g, d, dt=dt: (_data((n_red if dt == "float32" else n_red // 100,), dt, d, g),),
                {},
                True,
                dt,
                False,
            ),
            (f"mean rows {n_feat}", torch.mean, feat, {"dim": -1}, True, dt, False),
            (f"var rows {n_feat}", torch.var, feat, {"dim": -1}, True, dt, False),
            (
                f"std {n_red // 100}",
                torch.std,
                lambda g, d, dt=dt: (_data((n_red // 100,), dt, d, g),),
                {},
                True,
                dt,
                False,
            ),
            (
                "cumsum 8192",
                torch.cumsum,
                lambda g, d, dt=dt: (_data((4, 8192), dt, d, g),),
                {"dim": -1},
                True,
                dt,
                False,
            ),
            (
                "avg_pool2d",
                F.avg_pool2d,
                lambda g, d, dt=dt: (_data((4, 16, 32, 32), dt, d, g),),
                {"kernel_size": 3},
                True,
                dt,
                False,
            ),
            (
                "max_pool2d",
                F.max_pool2d,
                lambda g, d, dt=dt: (_data((4, 16, 32, 32), dt, d, g),),
                {"kernel_size": 3},
                True,
                dt,
                False,
            ),
            (
                "group_norm",
                F.group_norm,
                lambda g, d, dt=dt: (
                    _data((4, 64, 16, 16), dt, d, g),
                    8,
                    _data((64,), dt, d, g),
                    _data((64,), dt, d, g),
                ),
                {},
                True,
                dt,
                False,
            ),
            (
                "batch_norm train",
                F.batch_norm,
                lambda g, d, dt=dt: (
                    _data((8, 64, 16, 16), dt, d, g),
                    None,
                    None,
                    _data((64,), dt, d, g),
                    _data((64,), dt, d, g),
                ),
                {"training": True},
                True,
                dt,
                False,
            ),
            (
                "cross_entropy 32000",
                F.cross_entropy,
                lambda g, d, dt=dt: (
                    _data((64, 32000 if not small else 1000), dt, d, g),
                    torch.randint(0, 1000, (64,), generator=g).to(d),
                ),
                {"label_smoothing": 0.1},
                True,
                dt,
                False,
            ),
            (
                "mse_loss",
                F.mse_loss,
                lambda g, d, dt=dt: (_data((64, 512), dt, d, g), _data((64, 512), dt, d, g)),
                {},
                True,
                dt,
                False,
            ),
        ]
        for name, fn, kind, kw in ELEMENTWISE:
            cases.append(
                (name, fn, lambda g, d, dt=dt, kind=kind: (_data((1 << 16,), dt, d, g, kind),), kw, True, dt, False)
            )
    return cases


def section_check(args, out):
    rows = []
    for label, fn, build, kw, backward, dt, tf32 in _cases(args.small, tuple(args.dtypes.split(","))):
        if args.cases and not any(c in label for c in args.cases.split(",")):
            continue
        if time.perf_counter() - T0 > args.budget:
            rows.append({"case": label, "dtype": dt, "skipped": "budget"})
            continue
        gen = torch.Generator().manual_seed(abs(hash((label, dt))) % 2**31)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        t = time.perf_counter()
        try:
            a = build(gen, args.device)
            res = rkt.check(fn, *a, devices=[args.device], backward=backward, **kw)
            fwd = [(r.report.verdict, r.report.precision) if r.report else ("-", r.note) for r in res.rows]
            grads = [
                (r.argument, r.report.verdict if r.report else "-", r.report.precision if r.report else r.note)
                for r in res.grads
            ]
            bad = [v for v in fwd if v[0] == "mismatch"] + [g for g in grads if g[1] == "mismatch"]
            row = {
                "case": label,
                "dtype": dt,
                "tf32": tf32,
                "forward": fwd,
                "grads": grads,
                "bad": bool(bad),
                "s": round(time.perf_counter() - t, 1),
            }
            if bad:  # the very inputs and the device's output kept, to be studied later on any CPU
                with torch.no_grad():
                    FOUND[f"{dt} {label}"] = {"args": [x.cpu() if isinstance(x, torch.Tensor) else x for x in a],
                                              "kwargs": kw, "out": fn(*a, **kw).cpu()}  # fmt: skip
                if backward and any(g[1] == "mismatch" for g in grads):
                    FOUND[f"{dt} {label}"].update(_gradients(fn, a, kw))
                row["text"] = str(res) + "\n" + "\n".join(
                    [str(r.report) for r in res.rows if r.report is not None and r.report.verdict == "mismatch"]
                    + [f"gradient {g.argument}: {g.report}" for g in res.grads
                       if g.report is not None and g.report.verdict == "mismatch"])  # fmt: skip
        except Exception as e:  # a section's failure is reported, the next case runs
            row = {
                "case": label,
                "dtype": dt,
                "tf32": tf32,
                "error": f"{type(e).__name__}: {e}"[:400],
                "trace": traceback.format_exc()[-1500:],
            }
        rows.append(row)
        flag = "MISMATCH" if row.get("bad") else ("ERROR" if "error" in row else "ok")
        print(
            f"[{time.perf_counter() - T0:6.0f}s] {flag:8s} {dt:9s} {label:28s} "
            f"fwd={row.get('forward', row.get('error'))}"
            f" grads={[(g[0], g[1], g[2]) for g in row.get('grads', [])]}",
            flush=True,
        )
        if row.get("bad"):
            print(row["text"], flush=True)
    out["check"] = rows


def section_audit(args, out):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from audit_models import hf_model

    rows = []
    todo = [tuple(m.split(":")) for m in args.models.split(",")]
    for kind, mode in todo:
        if time.perf_counter() - T0 > args.budget:
            rows.append({"model": kind, "mode": mode, "skipped": "budget"})
            continue
        t = time.perf_counter()
        try:
            m, x = hf_model(kind, layers=1)
            m = m.to(args.device)
            x = {k: v.to(args.device) for k, v in x.items()}
            if mode == "train":
                m.train()
                with rkt.audit(progress=False) as a:
                    m(**x).loss.backward()
            else:
                dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[mode]
                m = m.eval().to(dtype)
                x = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in x.items() if k != "labels"}
                if m.config.is_encoder_decoder:
                    x["decoder_input_ids"] = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(5)
                                                           ).to(args.device)  # fmt: skip
                with rkt.audit(progress=False) as a, torch.no_grad():
                    m(**x)
            fails = [
                (c.op, c.verdict) for c in a.calls if getattr(c, "verdict", None) not in (None, "exact", "rounding")
            ]
            row = {
                "model": kind,
                "mode": mode,
                "calls": len(a.calls),
                "first_failure": str(a.first_failure)[:300],
                "unchecked": dict(a.unchecked) if hasattr(a.unchecked, "items") else list(a.unchecked),
                "not_analysed": list(a.not_analysed)[:20],
                "fails": fails[:20],
                "s": round(time.perf_counter() - t, 1),
            }
            if a.first_failure is not None:
                row["report"] = "\n".join(f"call {c.index} {c.name} {c.op} {c.dtype} {c.shapes}:\n{c.report}"
                                           for c in a.calls if getattr(c, "verdict", None) not in
                                           (None, "exact", "rounding"))[:6000]  # fmt: skip
        except Exception as e:
            row = {
                "model": kind,
                "mode": mode,
                "error": f"{type(e).__name__}: {e}"[:400],
                "trace": traceback.format_exc()[-1500:],
            }
        rows.append(row)
        print(
            f"[{time.perf_counter() - T0:6.0f}s] audit {kind} {mode}: "
            f"{ {k: v for k, v in row.items() if k not in ('report', 'trace')} }",
            flush=True,
        )
        if "report" in row:
            print(row["report"], flush=True)
    out["audit"] = rows


def _block(fn, reps, dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def section_filter(args, out):
    n = 512 if args.small else 4096
    g = torch.Generator().manual_seed(1)
    rows = []
    for dt in ("float32", "bfloat16", "float16"):
        a, b = _data((n, n), dt, args.device, g), _data((n, n), dt, args.device, g)
        a64, b64 = a.double(), b.double()
        ref = lambda a64=a64, b64=b64: torch.matmul(a64, b64)  # noqa: E731
        mine = lambda a=a, b=b: rk.matmul(a, b, engine="filter")  # noqa: E731
        mine(), ref()  # warm-up: compile, handles
        t_ref = min(_block(ref, 5, args.device) for _ in range(3))
        t_mine = min(_block(mine, 2, args.device) for _ in range(3))
        sub = rk.matmul(a[:64].cpu(), b.cpu(), engine="numba")
        same = torch.equal(mine()[:64].cpu(), sub)
        rows.append(
            {
                "dtype": dt,
                "n": n,
                "torch_f64_s": t_ref,
                "filter_s": t_mine,
                "ratio": t_mine / t_ref,
                "target": 1.5,
                "first_64_rows_bit_identical_to_numba": same,
            }
        )
        print(
            f"[{time.perf_counter() - T0:6.0f}s] filter {dt} {n}^3 on {args.device}: {t_mine * 1e3:.1f} ms vs torch "
            f"float64 {t_ref * 1e3:.2f} ms = {t_mine / t_ref:.2f}x (target 1.5x); rows 0-63 bit-identical to the "
            f"Numba engine: {same}",
            flush=True,
        )
    out["filter"] = rows


def _seq(x):
    """cumsum with the running sum rounded to x's dtype at every addition."""
    out, acc = torch.empty_like(x), torch.zeros(x.shape[:-1], dtype=x.dtype)
    for k in range(x.shape[-1]):
        acc = (acc.float() + x[..., k].float()).to(x.dtype)
        out[..., k] = acc
    return out


def _tree(x, block):
    """cumsum by Hillis-Steele trees over blocks of ``block`` in x's dtype, the carry in x's dtype."""
    out, carry = torch.empty_like(x), torch.zeros(x.shape[:-1], dtype=x.dtype)
    for s in range(0, x.shape[-1], block):
        b = x[..., s : s + block].clone()
        b[..., 0] = (b[..., 0].float() + carry.float()).to(x.dtype)
        d = 1
        while d < b.shape[-1]:
            p = b.clone()
            b[..., d:] = (p[..., d:].float() + p[..., :-d].float()).to(x.dtype)
            d *= 2
        out[..., s : s + block], carry = b, b[..., -1]
    return out


def section_diag(args, out):
    """Which emulation each CUDA kernel equals, bit for bit (fractions of elements)."""
    from refkern.torch._bits import times_reciprocal

    g = torch.Generator().manual_seed(7)
    rows = {}
    for dt in (torch.bfloat16, torch.float16):
        x = torch.randn(4, 8192, generator=g).to(dt)
        y = torch.cumsum(x.to(args.device), -1).cpu()
        for name, e in [("sequential", _seq(x)), *[(f"tree{b}", _tree(x, b)) for b in (16, 32, 64, 1024)]]:
            rows[f"cumsum {dt} = {name}"] = float((y == e).double().mean())
        r = rk.compare(y, "cumsum", x, dim=-1)
        rows[f"cumsum {dt} verdict"] = f"{r.verdict} {r.precision} counts {r.counts}"
    a = torch.randn(4096, generator=g) * 10
    for b in (3.7, 2.0794415416798357):
        q = (a.to(args.device) / b).cpu()
        rows[f"div by {b}: = quotient"] = float((q == a / b).double().mean())
        rows[f"div by {b}: = a * fl(1/b)"] = float((q == times_reciprocal(a, b, torch.float32)).double().mean())
    for k, v in rows.items():
        print(f"diag {k}: {v}", flush=True)
    out["diag"] = rows


SECTIONS = {"check": section_check, "filter": section_filter, "audit": section_audit, "diag": section_diag}


def main():
    global T0
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--save", default=None, help="torch.save the failing cases' inputs and outputs here")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--dtypes", default="bfloat16,float32,float16", help="section check's dtypes")
    ap.add_argument("--cases", default="", help="section check: only cases whose label holds one of these")
    ap.add_argument(
        "--models",
        default="llama:bf16,llama:fp32,gpt2:bf16,bert:bf16,llama:train,qwen2:bf16,t5:bf16,vit:bf16,whisper:bf16",
        help="section audit: model:mode pairs",
    )
    ap.add_argument("--sections", default="check,filter,audit")
    args = ap.parse_args()
    T0 = time.perf_counter()
    out = {"torch": torch.__version__, "device": args.device}
    if args.device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name(0)
    print(
        f"refkern {rk.__version__}, torch {torch.__version__}, device {out.get('device_name', args.device)}", flush=True
    )
    for name in args.sections.split(","):
        try:
            SECTIONS[name](args, out)
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            print(f"section {name} failed: {out[name]['trace']}", flush=True)
        if args.save and FOUND:
            torch.save(FOUND, args.save)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
    bad = [r for r in out.get("check", []) if isinstance(r, dict) and (r.get("bad") or "error" in r)]
    print(
        f"\nsummary: {len(out.get('check', []))} check rows, {len(bad)} mismatch or error: "
        + "; ".join(f"{r['dtype']} {r['case']}" for r in bad),
        flush=True,
    )
    return 0 if math.isfinite(T0) else 1


T0 = 0.0
if __name__ == "__main__":
    sys.exit(main())
