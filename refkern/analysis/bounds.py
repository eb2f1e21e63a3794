"""Worst-case bounds: what no correct implementation can exceed, in any order.

Per element, with ``M = sum|terms|``, ``n`` terms, accumulation unit ``u_a`` and result unit
``u_o``, a backend that forms the same products and adds them in any order in precision
``u_a``, then stores in the result format, errs from the correctly rounded value by at most
(Higham 2002, (3.5) with the final rounding)::

    B = (1 + u_o) gamma_n(u_a) M + 2 u_o |ref|,      gamma_n(u) = n u / (1 - n u).

An element beyond B is proof, not statistics, that the result is not a correct one in that
precision. The report gives the largest ratio to B per candidate precision
(:func:`precision_ratios`); the verdict itself is the statistical test of
:mod:`refkern.analysis.verdict`, which is far sharper in long reductions where B is loose.
"""

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, TFLOAT32, Format

__all__ = ["bound", "residual", "working_units", "precision_ratios", "CANDIDATES"]


def _mag_slack(n):
    """M is a float64 sum of n non-negative terms in any order: relative error below (n + 1) 2**-52."""
    return 1.0 + (n + 1) * 2.0**-52


def working_units(fmt: Format) -> tuple[float, float]:
    """(u_accumulation, u_result) of the 'rounding' hypothesis for a result format."""
    return (FLOAT64.u if fmt.prec >= FLOAT64.prec else FLOAT32.u), fmt.u


def _gamma(n, u):
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else np.inf


def bound(mag, ref, n, u_acc, u_out):
    """The worst-case bound B of the module docstring, elementwise."""
    b = (1.0 + u_out) * _gamma(n, u_acc) * mag * _mag_slack(n) + 2.0 * u_out * np.abs(ref)
    return b + n * 2.0**-1074  # underflow of float64 M


def residual(actual, ref):
    """actual - ref, with equal specials (same infinity, both NaN) as 0 and unequal ones as inf."""
    with np.errstate(invalid="ignore"):
        e = actual - ref
    same = (actual == ref) | (np.isnan(actual) & np.isnan(ref))
    e = np.where(same, 0.0, e)
    return np.where(np.isnan(e), np.inf, np.abs(e))


def _ratio(err, b):
    """err / b elementwise: 0 where err is 0, inf where the bound is 0 or NaN (it explains nothing)."""
    out = np.zeros_like(err)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(err, b, out=out, where=err > 0)
    out[np.isnan(out)] = np.inf
    return out


# (input unit roundoff, accumulation unit roundoff) of each candidate precision; truncation of
# the inputs (TF32, bf16) doubles the input unit, so the larger one is used
CANDIDATES = {
    "fp64": (0.0, FLOAT64.u),
    "fp32": (0.0, FLOAT32.u),
    "tf32": (2.0 * TFLOAT32.u, FLOAT32.u),
    "fp16": (FLOAT16.u, FLOAT32.u),
    "bf16": (2.0 * BFLOAT16.u, FLOAT32.u),
}


def _max_ratio(e, b) -> float:
    """max(e / b); a NaN bound (inf/NaN inputs) explains nothing and counts as inf."""
    if e.size == 0:
        return 0.0
    v = float(np.max(e / b))
    return np.inf if v != v else v


def precision_ratios(err, n, mag, ref, fmt) -> dict:
    """For each candidate precision: the largest ratio of the error to its worst-case bound and
    to its probabilistic scale (the analytic version of each hypothesis, no emulation).

    worst case: (2 u_i + u_i^2) M + (1 + u_o) gamma_n(u_a) (1 + u_i)^2 M + 2 u_o |ref|,
    inputs rounded with unit u_i, accumulation u_a (Higham 2002, (3.5) and the rounding of
    each factor); probabilistic scale: sqrt(n) u_a M + 2 u_i M / sqrt(n) + 2 u_o |ref|, the
    typical size of independent rounding errors (Higham and Mary 2019), not a bound."""
    u_o = fmt.u
    inexact = err > 0  # only these can have a nonzero ratio
    e, m, ref = err[inexact], (mag * _mag_slack(n))[inexact], np.abs(ref)[inexact]
    out = {}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # inf/NaN inputs: 0 * inf in M
        for name, (ui, ua) in CANDIDATES.items():
            worst = (2 * ui + ui * ui) * m + (1 + u_o) * _gamma(n, ua) * (1 + ui) ** 2 * m + 2 * u_o * ref
            prob = np.sqrt(n) * ua * m + 2 * ui * m / np.sqrt(max(n, 1)) + 2 * u_o * ref
            out[name] = {"worst_case": _max_ratio(e, worst), "probabilistic": _max_ratio(e, prob)}
    return out

