"""Plots of an analysis: the ulp histogram, error against bound, and sweep curves (PNG)."""

import numpy as np

__all__ = ["error_plots", "sweep_plot", "sweep_figure"]


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
    if not nz.size:  # nothing to draw on a log axis: say so instead of an empty panel
        a.text(0.5, 0.5, f"every element exact ({zeros})" if zeros == ulp.size else "no element with an error",
               transform=a.transAxes, ha="center", va="center")  # fmt: skip
    ok = np.isfinite(err) & np.isfinite(bnd) & (err > 0) & (bnd > 0)
    beyond = ok & (err > bnd)
    b.scatter(bnd[ok & ~beyond], err[ok & ~beyond], s=4, alpha=0.4, color="#4477aa", label="within the bound")
    if beyond.any():
        b.scatter(bnd[beyond], err[beyond], s=10, color="#cc3311", label="beyond the bound")
    if ok.any():
        lo, hi = min(bnd[ok].min(), err[ok].min()), max(bnd[ok].max(), err[ok].max())
        b.plot([lo, hi], [lo, hi], color="black", lw=1, label="error = bound")
    else:
        b.text(0.5, 0.5, "no element with an error: nothing to compare with its bound", transform=b.transAxes,
               ha="center", va="center")  # fmt: skip
    if ok.any():
        b.set_xscale("log")
        b.set_yscale("log")
    b.set_xlabel("worst-case rounding bound of the element")
    b.set_ylabel("|actual - exact|")
    b.set_title("error against bound, one point per element")
    if ok.any():
        b.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_plot(rows: list, op: str, dtype: str, path: str, u: float = 2.0**-24) -> str:
    """Error against reduction length K per backend (max and median of |error| / sum|terms|),
    with the worst-case bound gamma_K u and the probabilistic scale sqrt(K) u drawn. A point
    whose error is 0 (exact) cannot sit on a log axis: it is marked on an "exact" line drawn
    below every other value, never at a made-up tiny number."""
    plt = _pyplot()
    fig = sweep_figure(rows, op, dtype, u)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_figure(rows: list, op: str, dtype: str, u: float = 2.0**-24):
    """The figure of :func:`sweep_plot` (not saved, not closed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    ks = sorted({r["k"] for r in rows})
    k = np.array(ks, float)
    worst, prob = k * u / (1 - k * u), np.sqrt(k) * u
    values = [r[f] for r in rows for f in ("max_rel_error", "median_rel_error") if r[f] > 0]
    floor = min(values + [float(prob.min())]) / 8  # below everything drawn: where exact points are marked
    any_exact = False
    for i, backend in enumerate(sorted({r["backend"] for r in rows})):
        rr = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["k"])
        c = f"C{i}"
        kk = np.array([r["k"] for r in rr], float)
        for field, style, what in (("max_rel_error", "o-", "max"), ("median_rel_error", "x--", "median")):
            v = np.array([r[field] for r in rr], float)
            if (v > 0).any():
                ax.plot(kk, np.where(v > 0, v, np.nan), style, color=c, alpha=1 if what == "max" else 0.7,
                        label=f"{backend}: {what}")  # fmt: skip
        zero = np.array([r["max_rel_error"] == 0 for r in rr])
        if zero.any():  # every element exact at these K
            any_exact = True
            ax.plot(kk[zero], np.full(zero.sum(), floor), "v", color=c, mfc="none", ms=8,
                    label=f"{backend}: exact (error 0)")  # fmt: skip
    ax.plot(k, worst, color="black", lw=1.5, label=f"{_fp(u)} worst-case bound gamma_K u")
    ax.plot(k, prob, color="gray", lw=1.5, ls=":", label=f"{_fp(u)} probabilistic scale sqrt(K) u")
    if any_exact:
        ax.axhline(floor, color="#999999", lw=0.8, ls="--")
        ax.annotate("exact: error 0", (k.min(), floor), textcoords="offset points", xytext=(2, 4), fontsize=8,
                    color="#555555")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("reduction length K")
    ax.set_ylabel("|actual - exact| / sum |terms|")
    ax.set_title(f"{op} ({dtype}): error against reduction length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _fp(u: float) -> str:
    return "fp64" if u <= 2.0**-53 else "fp32"
