"""Plots of an analysis: the ulp histogram, error against bound, and sweep curves (PNG)."""

import numpy as np

__all__ = ["error_plots", "sweep_plot"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib (or the refkern[plot] extra)") from None

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def error_plots(arrays: dict, title: str, path: str) -> str:
    """Two panels for one output tensor: the distribution of errors in ulps, and each element's
    error against its worst-case rounding bound (points above the diagonal cannot be rounding)."""
    plt = _pyplot()
    err, bnd, ulp = (np.asarray(arrays[k], np.float64).reshape(-1) for k in ("error", "bound", "ulp"))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    finite = np.isfinite(ulp)
    nz = ulp[finite & (ulp > 0)]
    zeros = int((ulp[finite] == 0).sum())
    if nz.size:
        bins = np.logspace(np.log10(max(nz.min(), 1e-3)), np.log10(nz.max() * 1.01), 40)
        a.hist(nz, bins=bins, color="#4477aa")
        a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("|error| in ulps of the result dtype")
    a.set_ylabel("elements")
    a.set_title(f"error distribution ({zeros} exact, {int((~finite).sum())} non-finite)")
    ok = np.isfinite(err) & np.isfinite(bnd) & (err > 0) & (bnd > 0)
    beyond = ok & (err > bnd)
    b.scatter(bnd[ok & ~beyond], err[ok & ~beyond], s=4, alpha=0.4, color="#4477aa", label="within the bound")
    if beyond.any():
        b.scatter(bnd[beyond], err[beyond], s=10, color="#cc3311", label="beyond the bound")
    if ok.any():
        lo, hi = min(bnd[ok].min(), err[ok].min()), max(bnd[ok].max(), err[ok].max())
        b.plot([lo, hi], [lo, hi], color="black", lw=1, label="error = bound")
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("worst-case rounding bound of the element")
    b.set_ylabel("|actual - exact|")
    b.set_title("error against bound, one point per element")
    b.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_plot(rows: list, op: str, dtype: str, path: str, u: float = 2.0**-24) -> str:
    """Error against reduction length K per backend (max and median of |error| / sum|terms|),
    with the worst-case bound gamma_K u and the probabilistic scale sqrt(K) u drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    ks = sorted({r["k"] for r in rows})
    for i, backend in enumerate(sorted({r["backend"] for r in rows})):
        rr = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["k"])
        c = f"C{i}"
        ax.plot(
            [r["k"] for r in rr], [max(r["max_rel_error"], 1e-30) for r in rr], "o-", color=c, label=f"{backend}: max"
        )
        ax.plot([r["k"] for r in rr], [max(r["median_rel_error"], 1e-30) for r in rr], "x--", color=c, alpha=0.7,
                label=f"{backend}: median")  # fmt: skip
    k = np.array(ks, float)
    ax.plot(k, k * u / (1 - k * u), color="black", lw=1.5, label="fp32 worst-case bound gamma_K u")
    ax.plot(k, np.sqrt(k) * u, color="gray", lw=1.5, ls=":", label="fp32 probabilistic scale sqrt(K) u")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("reduction length K")
    ax.set_ylabel("|actual - exact| / sum |terms|")
    ax.set_title(f"{op} ({dtype}): error against reduction length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
