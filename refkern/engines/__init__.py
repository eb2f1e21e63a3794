"""Where an exact reduction runs: ``"numba"`` (the jitted kernels, CPU), ``"filter"`` (one
float64 GEMM on the platform's BLAS with a rigorous bound per element, the few undecided
elements exact: :mod:`refkern.engines.filter`) or ``"blas"`` (Ozaki slices on torch's BLAS:
MKL / OpenBLAS on the CPU, cuBLAS on CUDA), chosen by ``"auto"``.

All give the same, correctly rounded, results; only the speed differs. ``engine="auto"``
(the default of :func:`refkern.matmul`, :func:`refkern.linear` and the convolutions) takes
``"filter"`` when the method is ``"exact"``, the factors are float32 or narrower, the result
format has at most 26 bits, and the GEMM holds at least ``FILTER_MIN_WORK`` products (M * N * K
over the batch), on the CPU and on CUDA alike. The threshold is not calibrated: measured on the
2-core machine under a load average of 10 to 14 (others' jobs), the filter took 0.02x to 0.13x
the Numba engine's time from 16**3 to 96**3 (the Numba kernel's parallel launch waits for busy
cores; the filter's passes run on one thread), which says nothing of an idle machine, where the
Numba kernel's single call is expected to win on the smallest GEMMs (the filter's fixed cost is
a few numpy calls). 2**15 keeps the tiniest GEMMs on the Numba kernel. Naming ``"filter"`` for float64
factors or another method runs the Numba kernel (the filter's products would not be exact).
Otherwise ``"auto"`` takes ``"blas"`` when the method is ``"exact"``, torch is importable, an
input is a tensor on a CUDA device, and the GEMM is large (``M * N * K >= AUTO_MIN_WORK``, ``M, N >=
AUTO_MIN_SIDE``, ``K >= AUTO_MIN_K``; smaller ones cost little on the CPU and are not worth
a GPU launch). Everything else runs on ``"numba"``: on the 2-core CPU this was built on,
the BLAS engine's three (float32, Karatsuba) or nine (float64) slice GEMMs plus slicing and
rounding measured slower than the Numba kernel at every benchmark size
(benchmarks/bench_engines.py), so it is chosen on the CPU only by name.

Importing this package imports neither torch nor numba's kernels; :func:`status` says what
is usable here.
"""

import importlib.util

__all__ = ["ENGINES", "status", "check_engine", "choose", "run_gemm", "AUTO_MIN_WORK", "AUTO_MIN_SIDE", "AUTO_MIN_K",
           "FILTER_MIN_WORK"]  # fmt: skip

ENGINES = ("auto", "blas", "filter", "numba")
FILTER_MIN_WORK = 1 << 15  # M * N * K: e.g. 32**3
AUTO_MIN_WORK = 1 << 24  # M * N * K (per batch), e.g. 256**3
AUTO_MIN_SIDE = 32
AUTO_MIN_K = 32


def check_engine(op: str, engine: str, accumulate: str) -> None:
    """Validate ``engine=`` at the public boundary (house-style errors)."""
    if engine not in ENGINES:
        choices = ", ".join(repr(e) for e in ENGINES)
        raise ValueError(f"{op}: unknown engine={engine!r}; choose one of {choices}.")
    if engine == "blas" and accumulate != "exact":
        raise ValueError(
            f"{op}: engine='blas' computes accumulate='exact' only; got accumulate={accumulate!r}. "
            "Use engine='numba' (or 'auto') for the other methods."
        )
    if engine == "filter" and accumulate != "exact":
        raise ValueError(
            f"{op}: engine='filter' computes accumulate='exact' only; got accumulate={accumulate!r}. "
            "Use engine='numba' (or 'auto') for the other methods."
        )
    if engine == "blas" and importlib.util.find_spec("torch") is None:
        raise ValueError(f"{op}: engine='blas' needs torch; install it (pip install 'refkern[torch]').")


def choose(engine: str, accumulate: str, m: int, n: int, k: int, device=None, filterable: bool = False) -> str:
    """The engine that ``engine`` (already checked) names for one GEMM of M x K by K x N whose
    inputs live on ``device`` (None: the CPU); ``filterable``: the filter can compute it
    (:func:`refkern.engines.filter.applies`)."""
    if engine == "filter":
        return "filter" if filterable else "numba"
    if engine != "auto":
        return engine
    if accumulate == "exact" and filterable and m * n * k >= FILTER_MIN_WORK:
        return "filter"
    if accumulate != "exact" or device is None or getattr(device, "type", "cpu") != "cuda":
        return "numba"
    big = m * n * k >= AUTO_MIN_WORK and min(m, n) >= AUTO_MIN_SIDE and k >= AUTO_MIN_K
    return "blas" if big else "numba"


def run_gemm(p, A3, Bt3, ia, ib, bias, out_shape, want_mag=False, device=None):
    """The exact GEMM on prepared operands (:mod:`refkern.kernels._gemm_numba`): (values, magnitudes
    or None) as float64 arrays of out_shape, by the filtering engine where :func:`choose` picks it for
    ``engine="auto"`` (exact, float32-or-narrower factors, large enough), else by the Numba kernel
    (:func:`~refkern.kernels._gemm_numba.run_numba`). Both give the same values; the magnitudes agree
    within gamma_K."""
    from refkern.engines import filter as filt
    from refkern.kernels._element import EXACT
    from refkern.kernels._gemm_numba import run_numba

    m, n, k = A3.shape[1], Bt3.shape[1], A3.shape[2]
    acc = "exact" if p.method == EXACT else "other"
    if choose("auto", acc, m * len(ia), n, k, device, filterable=filt.applies(p)) == "filter":
        return filt.gemm(p, A3, Bt3, ia, ib, bias, out_shape, want_mag, device)
    return run_numba(p, A3, Bt3, ia, ib, bias, out_shape, want_mag)


def status() -> dict:
    """Which engines and devices are usable here: ``{engine: {"usable", "devices", "detail"}}``."""
    import numba

    out = {
        "numba": {
            "usable": True,
            "devices": ["cpu"],
            "detail": f"numba {numba.__version__}, {numba.get_num_threads()} threads",
        }
    }
    if importlib.util.find_spec("torch") is None:
        out["blas"] = {"usable": False, "devices": [], "detail": "torch is not installed"}
        _filter_status(out)
        return out
    import torch

    devices = ["cpu"]
    detail = f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        detail += f"; CUDA: {names}"
    else:
        detail += "; no CUDA device"
    out["blas"] = {"usable": True, "devices": devices, "detail": detail}
    _filter_status(out)
    return out


def _filter_status(out):
    """The filter's entry of :func:`status`: its BLAS and its self-test."""
    import numpy as np

    from refkern.engines import filter as filt

    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        lib = f"numpy {np.__version__} on {cfg.get('name', '?')} {cfg.get('version', '')}".strip()
    except Exception:  # pragma: no cover - numpy without show_config dicts
        lib = f"numpy {np.__version__}"
    ok, detail = filt.self_test()
    test = f"self-test {'passed' if ok else 'FAILED'}: {detail}"
    auto = f"auto takes it for exact fp16/bf16/fp32 GEMMs and convolutions of >= {FILTER_MIN_WORK} products"
    cuda = [d for d in out.get("blas", {}).get("devices", []) if d != "cpu"]
    out["filter"] = {"usable": ok, "devices": ["cpu", *cuda], "detail": f"{lib}; {test}; {auto}"}
