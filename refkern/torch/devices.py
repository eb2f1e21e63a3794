"""Every backend this machine can run, with the dtypes it takes and the settings that matter."""

import sys
from dataclasses import dataclass, field

import torch

__all__ = ["Backend", "devices", "resolve"]

_ALL = ("float16", "bfloat16", "float32", "float64")


@dataclass
class Backend:
    name: str  # "cpu", "cuda:0", "mps", "xpu:0", "dml:0"
    kind: str  # "cpu", "cuda", "mps", "xpu", "dml"
    device: torch.device
    description: str
    dtypes: tuple  # dtype names it can compute in
    settings: dict = field(default_factory=dict)

    def note(self) -> str:
        """The settings that change numerics, in a few words."""
        s = self.settings
        if self.kind == "cuda":
            on = lambda v: "on" if v else "off"  # noqa: E731
            return (f"TF32 matmul {on(s['tf32_matmul'])}, cuDNN {on(s['tf32_cudnn'])}; reduced-precision "
                    f"reductions fp16 {on(s['fp16_reduced_precision_reduction'])}, "
                    f"bf16 {on(s['bf16_reduced_precision_reduction'])}")  # fmt: skip
        if "float32_matmul_precision" in s and s["float32_matmul_precision"] != "highest":
            return f"float32_matmul_precision={s['float32_matmul_precision']}"
        return ""

    def __str__(self) -> str:
        return f"{self.name} ({self.description}; {', '.join(self.dtypes)})"


def _dml():
    """DirectML adapters through torch_directml (its API: device_count, device, device_name)."""
    dml = sys.modules.get("torch_directml")
    if dml is None:
        try:
            import torch_directml as dml  # noqa: F811
        except Exception:  # not installed, or no DirectX 12 here
            return []
    try:
        if hasattr(dml, "is_available") and not dml.is_available():
            return []
        out = []
        for i in range(dml.device_count()):
            dev = dml.device(i)
            f64 = bool(dml.has_float64_support(dev)) if hasattr(dml, "has_float64_support") else False
            dtypes = ("float16", "float32", "float64") if f64 else ("float16", "float32")
            out.append(Backend(f"dml:{i}", "dml", dev, f"DirectML: {dml.device_name(i)}", dtypes,
                               {"float64_support": f64}))  # fmt: skip
        return out
    except Exception:
        return []


def devices() -> list[Backend]:
    """cpu, each cuda:i, mps, each xpu:i and each DirectML adapter that this machine can run."""
    prec = torch.get_float32_matmul_precision()
    out = [Backend("cpu", "cpu", torch.device("cpu"), f"CPU, {torch.get_num_threads()} threads", _ALL,
                   {"threads": torch.get_num_threads(), "float32_matmul_precision": prec})]  # fmt: skip
    if torch.cuda.is_available():
        m = torch.backends.cuda.matmul
        settings = {
            "tf32_matmul": bool(m.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
            "bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction),
            "float32_matmul_precision": prec,
        }
        for i in range(torch.cuda.device_count()):
            out.append(Backend(f"cuda:{i}", "cuda", torch.device("cuda", i), torch.cuda.get_device_name(i), _ALL,
                               dict(settings)))  # fmt: skip
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append(Backend("mps", "mps", torch.device("mps"), "Apple Metal", ("float16", "bfloat16", "float32")))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for i in range(xpu.device_count()):
            out.append(Backend(f"xpu:{i}", "xpu", torch.device("xpu", i), xpu.get_device_name(i), _ALL))
    return out + _dml()


def resolve(names) -> list:
    """Backends for names like "cpu", "cuda", "cuda:1", "mps", "dml", "dml:0" (all when None).
    A name this machine cannot run becomes a string: the caller reports it, it does not fail."""
    avail = devices()
    if names is None:
        return avail
    if isinstance(names, (str, Backend)):
        names = [names]
    out = []
    for n in names:
        if isinstance(n, Backend):
            out.append(n)
            continue
        key = str(n).strip().lower().replace("directml", "dml").replace("privateuseone", "dml")
        key = "cpu" if key == "cpu:0" else key
        hits = [b for b in avail if b.name == key or (":" not in key and b.kind == key)]
        if not hits and key.split(":")[0] not in ("cpu", "cuda", "mps", "xpu", "dml"):
            choices = ", ".join(repr(b) for b in ("cpu", "cuda", "mps", "xpu", "dml"))
            raise ValueError(f"check: unknown device {n!r}; choose one of {choices} (optionally with :index).")
        out.extend(hits if hits else [str(n)])
    return out
