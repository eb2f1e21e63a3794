"""The ``refkern`` command (also ``python -m refkern``).

    refkern demo                      the classic questions, answered live
    refkern check OP --shape ...      one op on random (or given) data, on every backend
    refkern sweep OP --k A:B:S        error against reduction length, with the bounds drawn
    refkern audit MODULE:FACTORY ...  every op a model runs: judged, or listed as not checked
    refkern doctor                    versions, threads, caches, devices and their flags
    refkern bench                     the benchmarks

Bad arguments print one line, ``refkern <command>: error: ...`` (``refkern: error: ...``
before a command is known), and exit with status 2; no traceback for a user's mistake.
``--json`` output has ``"version": 1`` and the schema in docs/cli.md.
"""

import argparse
import importlib
import importlib.util
import os
import platform
import subprocess
import sys

import refkern.ops as _ops
from refkern._cli_args import (
    UsageError,  # re-exported: the command's one error
    _backends,
    _check_output,
    _dtype,
    _krange,
    _kwargs,
    _need_matplotlib,
    _Parser,
    _positive,
    _seed,
    _shape,
    _torch,
    _torch_fn,
    _write_json,
    _Writing,
)
from refkern._version import __version__

OUTPUT_OPTIONS = ("json", "plot", "png", "csv")


# ---------------------------------------------------------------------------------- commands


def cmd_demo(a):
    import refkern.demo as demo

    if a.sums:
        return 1 if demo.run_sums() else 0
    _torch()
    res = demo.run()
    if a.json:
        _write_json(a.json, {"command": "demo", "cases": res["cases"]})
    return 0


def _load_input(path, torch, names):
    """The operands in an .npz (numpy.savez) or .pt (torch.save) file, as tensors."""
    if not os.path.exists(path):
        raise UsageError(f"--input {path!r}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"--input {path!r} is a folder; give an .npz or .pt file")
    if path.endswith(".npy"):
        raise UsageError(f"--input {path!r} holds a single array; save the operands in one file with "
                         f"np.savez(FILE.npz, {', '.join(f'{k}=...' for k in names[:2])})")  # fmt: skip
    npz = path.endswith(".npz")
    kind = "an .npz file written by numpy.savez" if npz else "a .pt file written by torch.save"
    try:
        if npz:
            import numpy as np

            z = np.load(path)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise UsageError(f"--input {path!r} holds a single array; save the operands with np.savez(FILE, "
                                 f"{', '.join(f'{k}=...' for k in names[:2])})")  # fmt: skip
            with z:
                keys = [k for k in names if k in z] or list(z.keys())
                tensors = [torch.from_numpy(np.array(z[k])) for k in keys]
        else:
            obj = torch.load(path)
            if isinstance(obj, dict):
                tensors = [obj[k] for k in names if k in obj] or list(obj.values())
            elif isinstance(obj, (list, tuple)):
                tensors = list(obj)
            else:
                tensors = [obj]
    except UsageError:
        raise
    except Exception as exc:  # not a file of that kind, or damaged: numpy/torch say why, in their first sentence
        why = str(exc).strip().splitlines()[0].split(". ")[0].rstrip(".") if str(exc).strip() else ""
        raise UsageError(f"--input {path!r} is not {kind}: {type(exc).__name__}: {why[:160]}") from None
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise UsageError(f"--input {path!r} must hold tensors or arrays; got {', '.join(bad)}")
    return tensors


def _inputs(a, torch, op):
    rec = _ops.get(op)
    names, need = rec.operands, rec.required
    if a.input:
        if a.shape:
            raise UsageError(f"--input {a.input!r} and --shape both give the operands; keep one of them")
        tensors = _load_input(a.input, torch, names)
        if not need <= len(tensors) <= len(names):
            first = f" (or the first {need})" if need < len(names) else ""
            raise UsageError(f"--input {a.input!r} must hold {', '.join(names)}{first}; got {len(tensors)} arrays")
        if a.dtype:  # converted on request, as --dtype says; the file's own dtype otherwise
            dt = _dtype(torch, a.dtype)
            tensors = [t.to(dt) for t in tensors]
        return tensors
    if not a.shape:
        rest = f" [and {', '.join(names[need:])}]" if need < len(names) else ""
        raise UsageError(f"give --shape for {', '.join(names[:need])}{rest} or --input FILE")
    if not need <= len(a.shape) <= len(names):
        count = str(need) if need == len(names) else f"{need} {'or' if len(names) == need + 1 else 'to'} {len(names)}"
        raise UsageError(f"{op} takes {count} shapes ({', '.join(names)}); got {len(a.shape)}")
    g = torch.Generator().manual_seed(a.seed)
    dt = _dtype(torch, a.dtype or "float32")
    out = []
    for name, s in zip(names, a.shape):
        t = torch.randn(*s, generator=g, dtype=torch.float32)
        out.append((t.exp() if name == "running_var" else t).to(dt))  # a variance is positive: lognormal
    return out


def cmd_check(a):
    torch = _torch()
    import refkern.torch as rkt

    if a.plot:
        _need_matplotlib("--plot")
    op = a.op
    fn = _torch_fn(op)
    kw = _kwargs(a.kw, op)
    rec = _ops.get(op)
    needed = rec.needs.split("=")[0] if rec.needs else None  # an argument a command line must give
    if needed and needed not in kw:
        example = rec.needs
        if needed == "normalized_shape" and a.shape:  # the input's last dimension
            example = f"normalized_shape=({a.shape[0][-1]},)"
        raise UsageError(f"{op} needs {needed}: add --kw {example}")
    tensors = _inputs(a, torch, op)
    if not rec.positional:  # torch.nn.functional's signature: the tensors after the first by name
        kw.update(zip(rec.operands[1:], tensors[1:]))
        tensors = tensors[:1]
    backends = _backends(a.device)
    try:
        res = rkt.check(fn, *tensors, devices=backends, compile=a.compile, op=op, **kw)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    print(res)
    failed = [r for r in res.rows if r.error]
    for r in failed:  # the table cuts a message short; here is all of its first lines
        print(f"{r.backend} failed: {r.error.splitlines()[0]}")
    if a.json:
        _write_json(a.json, {"command": "check", **res.to_dict()})
    if a.plot:
        from refkern.analysis.compare import elements
        from refkern.report.plots import error_plots

        row = next((r for r in res.rows if r.report is not None), None)
        if row is None:
            raise UsageError("--plot: no backend could run the op, so there is nothing to plot")
        dev = next(b.device for b in backends if b.name == row.backend.split("+")[0])
        with torch.no_grad():  # the plotted output comes from the first backend that ran the op
            moved = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            out = fn(*(t.to(dev) for t in tensors), **moved)
            out = out[0] if isinstance(out, tuple) else out  # max_pool's (values, indices)
        arrays = elements(out, op, *tensors, **kw)
        with _Writing("--plot", a.plot):
            error_plots(arrays, f"{op} on {row.backend}: {row.report.verdict}", a.plot)
        print(f"plot: {a.plot}")
    return 1 if failed else 0


def cmd_sweep(a):
    torch = _torch()
    ks = _krange(a.k)
    if a.png:
        _need_matplotlib("--png")
    dtype = a.dtype or "float32"
    dt = _dtype(torch, dtype)
    backends = _backends(a.device)
    from refkern.scale.sweep import Points

    fn = _torch_fn(a.op)
    g = torch.Generator().manual_seed(a.seed)
    try:
        from rich.progress import Progress

        progress = Progress(transient=True)
    except ImportError:  # pragma: no cover
        progress = None
    tasks = [(k, b) for k in ks for b in backends]
    ctx = progress if progress is not None else _Null()
    client = _cluster(a)  # --workers / --scheduler: each point's analysis on a worker (refkern.scale)
    with ctx:
        tid = progress.add_task(f"sweep {a.op}", total=len(tasks)) if progress else None
        points = Points(client, advance=(lambda: progress.advance(tid)) if progress else None)
        for k in ks:
            if a.op == "dot":
                args = (torch.randn(k, generator=g).to(dt), torch.randn(k, generator=g).to(dt))
            else:
                args = (torch.randn(a.m, k, generator=g).to(dt), torch.randn(a.n if a.op == "linear" else k,
                        k if a.op == "linear" else a.n, generator=g).to(dt))  # fmt: skip
            for b in backends:
                if dtype not in b.dtypes:
                    continue
                out = fn(*(t.to(b.device) for t in args))
                points.add(a.op, out, args, k, b.name)
        rows = points.rows()
    if not rows:
        raise UsageError(f"no backend here computes {a.op} in {dtype}; try another --device or --dtype")
    print(f"{'K':>7} {'backend':<10} {'verdict':<26} {'max|err|/M':>11} {'median':>10} {'sum|err|':>10}")
    for r in rows:
        v = r["verdict"] + (f" ({r['precision']})" if r["precision"] else "")
        print(f"{r['k']:>7} {r['backend']:<10} {v:<26} {r['max_rel_error']:>11.3g} {r['median_rel_error']:>10.3g} "
              f"{r['sum_abs_error']:>10.3g}")  # fmt: skip
    if a.csv:
        import csv

        with _Writing("--csv", a.csv), open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"csv: {a.csv}")
    if a.png:
        from refkern.report.plots import sweep_plot

        with _Writing("--png", a.png):
            sweep_plot(rows, a.op, dtype, a.png, u=2.0**-53 if dtype == "float64" else 2.0**-24)
        print(f"plot: {a.png}")
    if a.json:
        _write_json(a.json, {"command": "sweep", "op": a.op, "dtype": dtype, "rows": rows})
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cluster_options(p, what):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=_positive("workers"), metavar="N", help=f"{what} on a local Dask cluster of N "
                   "one-thread processes (needs refkern[dask])")  # fmt: skip
    g.add_argument("--scheduler", metavar="ADDRESS", help=f"{what} on the Dask cluster at ADDRESS (tcp://host:8786)")


def _cluster(a):
    from refkern.scale.sweep import ClientError, client_from_options

    try:
        return client_from_options(getattr(a, "workers", None), getattr(a, "scheduler", None))
    except ClientError as exc:
        raise UsageError(str(exc)) from None


def _import_target(target):
    """The module of MODULE:FACTORY: an import path (from the current directory) or a .py file."""
    mod_name = target.rsplit(":", 1)[0]
    if mod_name.endswith(".py") or "/" in mod_name or os.sep in mod_name:
        path = os.path.abspath(mod_name)
        if not os.path.isfile(path):
            raise UsageError(f"{mod_name!r}: no such file (MODULE:FACTORY takes an import path or a .py file)")
        name = os.path.splitext(os.path.basename(path))[0]
        sys.path.insert(0, os.path.dirname(path))  # the model file's own imports resolve beside it
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        run = lambda: spec.loader.exec_module(mod)  # noqa: E731
    else:
        sys.path.insert(0, os.getcwd())
        mod = None
        run = lambda: importlib.import_module(mod_name)  # noqa: E731
    try:
        got = run()
    except ImportError as exc:
        raise UsageError(f"cannot import {mod_name!r}: {exc}") from None
    except Exception as exc:  # the module itself failed: name its error, not ours
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UsageError(f"importing {mod_name!r} raised {type(exc).__name__}: {why}") from None
    return mod if mod is not None else got


def cmd_audit(a):
    torch = _torch()
    import refkern.torch as rkt

    if ":" not in a.target:
        raise UsageError(f"{a.target!r} must be MODULE:FACTORY, e.g. mypkg.models:make_model or ./model.py:make")
    mod_name, factory = a.target.rsplit(":", 1)
    mod = _import_target(a.target)
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
    dtype = a.dtype or "float32"
    dt = _dtype(torch, dtype)
    backend = _backends([a.device] if a.device else ["cpu"])[0]
    try:
        model = model.to(device=backend.device, dtype=dt).eval()
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {a.device!r}: {str(exc).splitlines()[0]}") from None
    g = torch.Generator().manual_seed(a.seed)
    shape = tuple(a.input_shape)
    x = torch.randn(*shape, generator=g).to(device=backend.device, dtype=dt)
    if a.compile:  # audited layer by layer (refkern.torch.compiled), and end to end
        model = torch.compile(model, mode=None if a.compile == "default" else a.compile)
    client = _cluster(a)  # --workers / --scheduler: each op judged on a worker (refkern.scale)
    try:
        with torch.no_grad(), rkt.audit(sample=a.sample, progress=False if a.no_progress else None,
                                        client=client) as au:
            model(x)
    except Exception as exc:  # the model's own error (the audit never raises): the input does not fit it
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UsageError(
            f"the model rejected an input of shape {shape} ({dtype} on {backend.name}): {type(exc).__name__}: "
            f"{why}. Give the shape it takes with --input-shape"
        ) from None
    print(au.report(order="worst" if a.worst_first else "call"))
    if a.json:
        _write_json(a.json, {"command": "audit", "target": a.target, **au.to_dict()})
    diverged = [c for c in au.compiled if c.first_divergence is not None or (c.end_to_end is not None
                                                                              and not c.end_to_end.ok)]  # fmt: skip
    return 1 if a.strict and (au.first_failure is not None or au.not_analysed or diverged) else 0


def doctor_info() -> dict:
    import numba

    import refkern._jit as _jit

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
        "engines": {},
    }
    from refkern.engines import status

    info["engines"] = status()
    if info["torch"]:
        import refkern.torch as rkt

        info["devices"] = [{"name": d.name, "description": d.description, "dtypes": list(d.dtypes),
                            "settings": d.settings} for d in rkt.devices()]  # fmt: skip
    return info


def cmd_doctor(a):
    info = doctor_info()
    for k, v in info.items():
        if k not in ("devices", "engines"):
            print(f"{k:<16} {v if v is not None else 'not installed'}")
    for name, e in info["engines"].items():
        state = "usable on " + ", ".join(e["devices"]) if e["usable"] else "not usable"
        print(f"engine {name:<9} {state}; {e['detail']}")
    for d in info["devices"]:
        print(f"device {d['name']:<9} {d['description']}; {', '.join(d['dtypes'])}")
        for k, v in d["settings"].items():
            print(f"    {k}: {v}")
    if a.json:
        _write_json(a.json, {"command": "doctor", **info})
    return 0


def run_benchmarks(commands, strict: bool, out=print) -> int:
    """Run each benchmark command, passing its output through; count the targets it reports as
    MISSED. Exit status: a benchmark's own failure, else 1 for a missed target under ``strict``."""
    rc, missed = 0, []
    for cmd in commands:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
        for line in proc.stdout:
            out(line.rstrip("\n"))
            if line.rstrip().endswith("MISSED"):
                missed.append(line.strip())
        rc |= proc.wait()
    if missed:
        tail = "; exit status 1 (--strict)" if strict else " (reported only; --strict makes a missed target exit 1)"
        out(f"bench: {len(missed)} target{'s' if len(missed) > 1 else ''} missed{tail}")
    if rc:
        return rc
    return 1 if strict and missed else 0


def cmd_bench(a):
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    scripts = [os.path.join(root, s) for s in ("bench_dot.py", "bench_kernels.py")]
    if not all(os.path.exists(s) for s in scripts):
        raise UsageError(f"the benchmarks live in the source tree ({root}); run from a clone of refkern")
    commands = []
    for s in scripts:
        args = [sys.executable, s] + (["--quick"] if a.quick else [])
        if a.quick and s.endswith("bench_dot.py"):
            args += ["--sizes", "1e3,1e5,1e6"]
        commands.append(args)
    return run_benchmarks(commands, a.strict)


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

    ops = list(_ops.REGISTRY)
    c = sub.add_parser("check", help="one op on random (or given) inputs, on every backend")
    c.add_argument("op", choices=ops, help="the op")
    c.add_argument(
        "--shape", nargs="+", type=_shape, metavar="S", help="operand shapes in order, e.g. 8,3,32,32 16,3,3,3 16"
    )
    c.add_argument("--kw", nargs="+", metavar="K=V", help="op arguments, e.g. padding=1 stride=(2,1) padding=same")
    c.add_argument("--input", metavar="FILE", help=".npz or .pt file with the operands (x, weight, bias / a, b / "
                   "query, key, value, ...: the op's tensors, by name or in order), instead of --shape")  # fmt: skip
    c.add_argument("--device", nargs="+", metavar="D", help="backends (default: all here): cpu cuda cuda:1 mps "
                   "xpu dml; one this machine lacks is an error")  # fmt: skip
    c.add_argument("--dtype", help="float16, bfloat16, float32 (default for --shape) or float64; with --input the "
                   "operands are converted to it (default: the file's own dtypes)")  # fmt: skip
    c.add_argument("--compile", action="store_true", help="also each backend's torch.compile'd form")
    c.add_argument("--seed", type=_seed, default=0)
    c.add_argument("--json", metavar="FILE", help="write the result as JSON")
    c.add_argument("--plot", metavar="FILE", help="write an ulp histogram and error-against-bound plot (PNG)")
    c.set_defaults(run=cmd_check)

    s = sub.add_parser("sweep", help="error against reduction length, with the fp32 bounds drawn")
    s.add_argument("op", choices=[n for n, r in _ops.REGISTRY.items() if r.sweep])
    s.add_argument("--k", required=True, metavar="START:STOP[:STEP]", help="reduction lengths, e.g. 16:4096:256")
    s.add_argument("--m", type=_positive("rows"), default=16, help="rows (default 16)")
    s.add_argument("--n", type=_positive("columns"), default=16, help="columns / out features (default 16)")
    s.add_argument("--device", nargs="+", metavar="D", help="backends (default: all here); one this machine lacks "
                   "is an error")  # fmt: skip
    s.add_argument("--dtype", help="float16, bfloat16, float32 (default) or float64")
    s.add_argument("--seed", type=_seed, default=0)
    s.add_argument("--png", metavar="FILE", help="write the curves (PNG)")
    s.add_argument("--csv", metavar="FILE", help="write the table (CSV)")
    s.add_argument("--json", metavar="FILE")
    _cluster_options(s, "each point's analysis")
    s.set_defaults(run=cmd_sweep)

    au = sub.add_parser("audit", help="every op a model runs (torch's dispatcher): judged against refkern's "
                        "references or bit for bit, or listed as not checked with the reason, per layer")  # fmt: skip
    au.add_argument("target", metavar="MODULE:FACTORY", help="a function returning an nn.Module: an import path "
                    "(mypkg.models:make, from the current directory) or a file (./model.py:make)")  # fmt: skip
    au.add_argument("--input-shape", required=True, type=_shape, metavar="S", help="e.g. 1,3,32,32")
    au.add_argument("--dtype", help="float16, bfloat16, float32 (default) or float64")
    au.add_argument("--device", default=None, help="where the model runs (default cpu); one this machine lacks "
                    "is an error")  # fmt: skip
    au.add_argument("--worst-first", action="store_true", help="list the calls worst first (default: call order)")
    au.add_argument("--seed", type=_seed, default=0)
    au.add_argument("--strict", action="store_true", help="exit 1 if an op is neither exact nor rounding, maps to "
                    "a refkern op in a form that could not be analysed, or (with --compile) a compiled layer diverges "
                    "or the compiled output is worse than eager's")  # fmt: skip
    au.add_argument("--sample", type=_positive("elements per op"), default=None, metavar="N",
                    help="judge at most N output elements of each large op (a deterministic sub-grid; default: "
                    "every element)")  # fmt: skip
    au.add_argument("--compile", choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                    help="audit the model torch.compile'd in this mode: each leaf compiled alone and judged, the first "
                    "layer where compiled diverges from eager named, and the output judged end to end")  # fmt: skip
    au.add_argument("--no-progress", action="store_true", help="no live progress line on stderr (it shows only on a "
                    "terminal anyway)")  # fmt: skip
    au.add_argument("--json", metavar="FILE")
    _cluster_options(au, "each op's reference and verdict")
    au.set_defaults(run=cmd_audit)

    dr = sub.add_parser("doctor", help="versions, threads, caches, devices and their flags")
    dr.add_argument("--json", metavar="FILE")
    dr.set_defaults(run=cmd_doctor)

    b = sub.add_parser("bench", help="run the benchmarks (from a source checkout)")
    b.add_argument("--quick", action="store_true", help="fewer sizes")
    b.add_argument("--strict", action="store_true", help="exit 1 when a speed target is missed (by default the "
                   "targets are only reported)")  # fmt: skip
    b.set_defaults(run=cmd_bench)
    return p


def main(argv=None) -> int:
    p = _parser()
    args = None
    try:
        args = p.parse_args(argv)
        if args.command is None:
            p.print_help()
            return 2
        for option in OUTPUT_OPTIONS:
            if getattr(args, option, None):
                _check_output(f"--{option}", getattr(args, option))
        return args.run(args)
    except UsageError as exc:
        cmd = getattr(args, "command", None)
        prog = exc.prog or ("refkern" + (f" {cmd}" if cmd else ""))
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
