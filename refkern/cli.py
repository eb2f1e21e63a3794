"""The ``refkern`` command (also ``python -m refkern``).

    refkern demo                      the classic questions, answered live
    refkern check OP --shape ...      one op on random (or given) data, on every backend
    refkern sweep OP --k A:B:S        error against reduction length, with the bounds drawn
    refkern audit MODULE:FACTORY ...  every conv/linear/matmul call of a model
    refkern doctor                    versions, threads, caches, devices and their flags
    refkern bench                     the benchmarks

Bad arguments print one line, ``refkern <command>: error: ...``, and exit with status 2.
``--json`` output has ``"version": 1`` and the schema in docs/cli.md.
"""

import argparse
import ast
import importlib
import json
import os
import platform
import subprocess
import sys

from refkern._version import __version__

JSON_VERSION = 1
OPERANDS = {"dot": ("x", "y"), "matmul": ("a", "b"), "linear": ("x", "weight", "bias"),
            "conv1d": ("x", "weight", "bias"), "conv2d": ("x", "weight", "bias")}  # fmt: skip


class UsageError(Exception):
    """A bad argument: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _shape(text: str) -> tuple:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise UsageError(f"--shape {text!r} is not a shape; write it as 8,3,32,32 or 8x3x32x32") from None
    if not dims or any(d < 0 for d in dims):
        raise UsageError(f"--shape {text!r} needs non-negative sizes, e.g. 8,3,32,32")
    return dims


def _kwargs(items) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--kw {item!r} must be name=value, e.g. padding=1 or stride=(2,1)")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k.strip()] = v  # a string such as padding=same
    return out


def _krange(text: str) -> list:
    try:
        parts = [int(p) for p in text.split(":")]
        start, stop, step = (parts + [None] * 3)[:3]
        step = step or max(1, (stop - start) // 8)
        ks = list(range(start, stop + 1, step))
    except (ValueError, TypeError):
        raise UsageError(f"--k {text!r} must be START:STOP[:STEP] with integers, e.g. 16:4096:256") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k {text!r} must give at least one length >= 1")
    return ks


def _torch():
    try:
        import torch
    except ImportError:
        raise UsageError('this command needs torch: pip install "torch==2.13.0"') from None
    return torch


def _dtype(torch, name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise UsageError(f"--dtype {name!r}: choose one of float16, bfloat16, float32, float64")
    return dt


def _need_matplotlib(option):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{option} needs matplotlib: pip install matplotlib (or the refkern[plot] extra)") from None


def _torch_fn(torch, op):
    """The torch function that computes each refkern op."""
    F = torch.nn.functional
    return {"dot": torch.dot, "matmul": torch.matmul, "linear": F.linear, "conv1d": F.conv1d, "conv2d": F.conv2d}[op]


def _write_json(path, data):
    with open(path, "w") as f:
        json.dump({"version": JSON_VERSION, **data}, f, indent=1)


# ---------------------------------------------------------------------------------- commands


def cmd_demo(a):
    from refkern import demo

    if a.sums:
        return 1 if demo.run_sums() else 0
    _torch()
    res = demo.run()
    if a.json:
        _write_json(a.json, {"command": "demo", "cases": res["cases"]})
    return 0


def _inputs(a, torch, op):
    names = OPERANDS[op]
    if a.input:
        if a.input.endswith(".npz"):
            import numpy as np

            with np.load(a.input) as z:
                keys = [k for k in names if k in z] or list(z.keys())
                tensors = [torch.from_numpy(z[k]) for k in keys]
        else:
            obj = torch.load(a.input)
            tensors = [obj[k] for k in names if k in obj] if isinstance(obj, dict) else list(obj)
        if not 2 <= len(tensors) <= len(names):
            raise UsageError(
                f"--input {a.input!r} must hold {', '.join(names)} (or the first two); got {len(tensors)} arrays"
            )
        return tensors
    if not a.shape:
        raise UsageError(
            f"give --shape for {', '.join(names[:2])}" + (" [and bias]" if len(names) == 3 else "") + " or --input FILE"
        )
    if not 2 <= len(a.shape) <= len(names):
        raise UsageError(
            f"{op} takes {len(names) if len(names) == 2 else '2 or 3'} shapes ({', '.join(names)}); got {len(a.shape)}"
        )
    g = torch.Generator().manual_seed(a.seed)
    dt = _dtype(torch, a.dtype)
    return [torch.randn(*s, generator=g, dtype=torch.float32).to(dt) for s in a.shape]


def cmd_check(a):
    torch = _torch()
    import refkern.torch as rkt

    if a.plot:
        _need_matplotlib("--plot")
    op = a.op
    fn = _torch_fn(torch, op)
    tensors = _inputs(a, torch, op)
    kw = _kwargs(a.kw)
    try:
        res = rkt.check(fn, *tensors, devices=a.device or None, compile=a.compile, op=op, **kw)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    print(res)
    if a.json:
        _write_json(a.json, {"command": "check", **res.to_dict()})
    if a.plot:
        from refkern.analysis.compare import elements
        from refkern.report.plots import error_plots

        row = next((r for r in res.rows if r.report is not None), None)
        if row is None:
            raise UsageError("--plot: no backend could run the op")
        dev = next(b.device for b in rkt.devices() if b.name == row.backend.split("+")[0])
        with torch.no_grad():  # the plotted output comes from the first backend that ran the op
            out = fn(*(t.to(dev) for t in tensors), **kw)
        arrays = elements(out, op, *tensors, **kw)
        error_plots(arrays, f"{op} on {row.backend}: {row.report.verdict}", a.plot)
        print(f"plot: {a.plot}")
    return 0


def cmd_sweep(a):
    torch = _torch()
    import numpy as np

    import refkern.torch as rkt

    if a.op not in ("dot", "matmul", "linear"):
        raise UsageError(f"sweep takes dot, matmul or linear (an op with a reduction length K); got {a.op!r}")
    ks = _krange(a.k)
    if a.png:
        _need_matplotlib("--png")
    dt = _dtype(torch, a.dtype)
    backends = [b for b in rkt.devices() if not a.device or b.name in a.device or b.kind in a.device]
    if not backends:
        raise UsageError(f"--device {' '.join(a.device)}: none of these is available here")
    from refkern.analysis.compare import elements

    fn = _torch_fn(torch, a.op)
    g = torch.Generator().manual_seed(a.seed)
    rows = []
    try:
        from rich.progress import Progress

        progress = Progress(transient=True)
    except ImportError:  # pragma: no cover
        progress = None
    tasks = [(k, b) for k in ks for b in backends]
    ctx = progress if progress is not None else _Null()
    with ctx:
        tid = progress.add_task(f"sweep {a.op}", total=len(tasks)) if progress else None
        for k in ks:
            if a.op == "dot":
                args = (torch.randn(k, generator=g).to(dt), torch.randn(k, generator=g).to(dt))
            else:
                args = (torch.randn(a.m, k, generator=g).to(dt), torch.randn(a.n if a.op == "linear" else k,
                        k if a.op == "linear" else a.n, generator=g).to(dt))  # fmt: skip
            for b in backends:
                if str(dt).removeprefix("torch.") not in b.dtypes:
                    continue
                out = fn(*(t.to(b.device) for t in args))
                e = elements(out, a.op, *args)
                rel = np.where(e["magnitude"] > 0, e["error"] / np.where(e["magnitude"] > 0, e["magnitude"], 1), 0.0)
                rep = e["report"]
                rows.append({"k": k, "backend": b.name, "verdict": rep.verdict, "precision": rep.precision,
                             "max_ulp": rep.max_ulp, "max_bound_ratio": rep.max_bound_ratio,
                             "max_rel_error": float(np.max(rel)), "median_rel_error": float(np.median(rel)),
                             "sum_abs_error": float(np.sum(e["error"]))})  # fmt: skip
                if progress:
                    progress.advance(tid)
    if not rows:
        raise UsageError(f"no backend here computes {a.op} in {a.dtype}; try another --device or --dtype")
    print(f"{'K':>7} {'backend':<10} {'verdict':<26} {'max|err|/M':>11} {'median':>10} {'sum|err|':>10}")
    for r in rows:
        v = r["verdict"] + (f" ({r['precision']})" if r["precision"] else "")
        print(f"{r['k']:>7} {r['backend']:<10} {v:<26} {r['max_rel_error']:>11.3g} {r['median_rel_error']:>10.3g} "
              f"{r['sum_abs_error']:>10.3g}")  # fmt: skip
    if a.csv:
        import csv

        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"csv: {a.csv}")
    if a.png:
        from refkern.report.plots import sweep_plot

        sweep_plot(rows, a.op, a.dtype, a.png, u=2.0**-53 if a.dtype == "float64" else 2.0**-24)
        print(f"plot: {a.png}")
    if a.json:
        _write_json(a.json, {"command": "sweep", "op": a.op, "dtype": a.dtype, "rows": rows})
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def cmd_audit(a):
    torch = _torch()
    import refkern.torch as rkt

    if ":" not in a.target:
        raise UsageError(f"{a.target!r} must be MODULE:FACTORY, e.g. mypkg.models:make_model")
    mod_name, factory = a.target.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {mod_name!r}: {exc}") from None
    make = getattr(mod, factory, None)
    if not callable(make):
        raise UsageError(f"{mod_name!r} has no callable {factory!r}")
    try:
        model = make()
    except Exception as exc:
        raise UsageError(
            f"{a.target}() raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{a.target} returned {type(model).__name__}, not a torch.nn.Module")
    dt = _dtype(torch, a.dtype)
    device = a.device or "cpu"
    try:
        model = model.to(device=device, dtype=dt).eval()
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {device!r}: {str(exc).splitlines()[0]}") from None
    g = torch.Generator().manual_seed(a.seed)
    x = torch.randn(*a.input_shape, generator=g).to(device=device, dtype=dt)
    with torch.no_grad(), rkt.audit() as au:
        model(x)
    print(au.report())
    if a.json:
        calls = [{"index": c.index, "name": c.name, "op": c.op, "device": c.device, "dtype": c.dtype,
                  "shapes": [list(s) for s in c.shapes], "note": c.note,
                  "report": c.report.to_dict() if c.report else None} for c in au.calls]  # fmt: skip
        f = au.first_failure
        _write_json(a.json, {"command": "audit", "target": a.target, "calls": calls,
                             "first_failure": f.index if f else None})  # fmt: skip
    return 1 if a.strict and (au.first_failure is not None or au.not_analysed) else 0


def doctor_info() -> dict:
    import numba

    from refkern import _jit

    def version(mod):
        try:
            return importlib.import_module(mod).__version__
        except Exception:
            return None

    info = {
        "refkern": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": version("numpy"),
        "numba": numba.__version__,
        "llvmlite": version("llvmlite"),
        "mpmath": version("mpmath"),
        "torch": version("torch"),
        "torch_directml": version("torch_directml"),
        "numba_threads": numba.get_num_threads(),
        "numba_cpu": __import__("llvmlite.binding", fromlist=["x"]).get_host_cpu_name(),
        "numba_cache": "on, keyed on all refkern sources" if _jit.CACHE else "off (Numba internals differ)",
        "numba_cache_dir": numba.config.CACHE_DIR
        or f"__pycache__ beside each module of {os.path.dirname(os.path.abspath(_jit.__file__))}",
        "devices": [],
    }
    if info["torch"]:
        import refkern.torch as rkt

        info["devices"] = [{"name": d.name, "description": d.description, "dtypes": list(d.dtypes),
                            "settings": d.settings} for d in rkt.devices()]  # fmt: skip
    return info


def cmd_doctor(a):
    info = doctor_info()
    for k, v in info.items():
        if k != "devices":
            print(f"{k:<16} {v if v is not None else 'not installed'}")
    for d in info["devices"]:
        print(f"device {d['name']:<9} {d['description']}; {', '.join(d['dtypes'])}")
        for k, v in d["settings"].items():
            print(f"    {k}: {v}")
    if a.json:
        _write_json(a.json, {"command": "doctor", **info})
    return 0


def cmd_bench(a):
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    scripts = [os.path.join(root, s) for s in ("bench_dot.py", "bench_kernels.py")]
    if not all(os.path.exists(s) for s in scripts):
        raise UsageError(f"the benchmarks live in the source tree ({root}); run from a clone of refkern")
    rc = 0
    for s in scripts:
        args = [sys.executable, s] + (["--quick"] if a.quick else [])
        if a.quick and s.endswith("bench_dot.py"):
            args += ["--sizes", "1e3,1e5,1e6"]
        rc |= subprocess.call(args)
    return rc


# -------------------------------------------------------------------------------- parser


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="refkern", description="Exact reference kernels: is a numerical difference rounding, "
                "reduced precision, or a bug?")  # fmt: skip
    p.add_argument("--version", action="version", version=f"refkern {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("demo", help="the classic discrepancy questions, answered live")
    d.add_argument("--sums", action="store_true", help="every accumulation method on classic float32 sums instead")
    d.add_argument("--json", metavar="FILE", help="write the verdicts and answers as JSON")
    d.set_defaults(run=cmd_demo)

    ops = list(OPERANDS)
    c = sub.add_parser("check", help="one op on random (or given) inputs, on every backend")
    c.add_argument("op", choices=ops, help="the op")
    c.add_argument(
        "--shape", nargs="+", type=_shape, metavar="S", help="operand shapes in order, e.g. 8,3,32,32 16,3,3,3 16"
    )
    c.add_argument("--kw", nargs="+", metavar="K=V", help="op arguments, e.g. padding=1 stride=(2,1) padding=same")
    c.add_argument("--input", metavar="FILE", help=".npz or .pt file with the operands (x, weight, bias / a, b)")
    c.add_argument("--device", nargs="+", metavar="D", help="backends (default: all): cpu cuda cuda:1 mps xpu dml")
    c.add_argument("--dtype", default="float32", help="float16, bfloat16, float32 (default) or float64")
    c.add_argument("--compile", action="store_true", help="also each backend's torch.compile'd form")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", metavar="FILE", help="write the result as JSON")
    c.add_argument("--plot", metavar="FILE", help="write an ulp histogram and error-against-bound plot (PNG)")
    c.set_defaults(run=cmd_check)

    s = sub.add_parser("sweep", help="error against reduction length, with the fp32 bounds drawn")
    s.add_argument("op", choices=["dot", "matmul", "linear"])
    s.add_argument("--k", required=True, metavar="START:STOP[:STEP]", help="reduction lengths, e.g. 16:4096:256")
    s.add_argument("--m", type=int, default=16, help="rows (default 16)")
    s.add_argument("--n", type=int, default=16, help="columns / out features (default 16)")
    s.add_argument("--device", nargs="+", metavar="D", help="backends (default: all)")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--png", metavar="FILE", help="write the curves (PNG)")
    s.add_argument("--csv", metavar="FILE", help="write the table (CSV)")
    s.add_argument("--json", metavar="FILE")
    s.set_defaults(run=cmd_sweep)

    au = sub.add_parser("audit", help="every conv/linear/matmul call of a model, per layer")
    au.add_argument("target", metavar="MODULE:FACTORY", help="import path of a function returning an nn.Module")
    au.add_argument("--input-shape", required=True, type=_shape, metavar="S", help="e.g. 1,3,32,32")
    au.add_argument("--dtype", default="float32")
    au.add_argument("--device", default=None, help="where the model runs (default cpu)")
    au.add_argument("--seed", type=int, default=0)
    au.add_argument("--strict", action="store_true", help="exit 1 if a call is neither exact nor rounding")
    au.add_argument("--json", metavar="FILE")
    au.set_defaults(run=cmd_audit)

    dr = sub.add_parser("doctor", help="versions, threads, caches, devices and their flags")
    dr.add_argument("--json", metavar="FILE")
    dr.set_defaults(run=cmd_doctor)

    b = sub.add_parser("bench", help="run the benchmarks (from a source checkout)")
    b.add_argument("--quick", action="store_true", help="fewer sizes")
    b.set_defaults(run=cmd_bench)
    return p


def main(argv=None) -> int:
    p = _parser()
    try:
        args = p.parse_args(argv)
        if args.command is None:
            p.print_help()
            return 2
        return args.run(args)
    except UsageError as exc:
        cmd = getattr(locals().get("args"), "command", None) if "args" in locals() else None
        prog = "refkern" + (f" {cmd}" if cmd else "")
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
