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

from refkern._jit import jit
from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, TFLOAT32, Format

__all__ = ["bound", "bound1", "working_units", "precision_ratios", "CANDIDATES"]


def _mag_slack(n):
    """M is a float64 sum of n non-negative terms in any order: relative error below (n + 1) 2**-52."""
    return 1.0 + (n + 1) * 2.0**-52


def working_units(fmt: Format) -> tuple[float, float]:
    """(u_accumulation, u_result) of the 'rounding' hypothesis for a result format."""
    return (FLOAT64.u if fmt.prec >= FLOAT64.prec else FLOAT32.u), fmt.u


def _gamma(n, u):
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else np.inf


@jit(inline="always")
def bound1(m, ref, n, u_acc, u_out):
    """B of the module docstring for one element (magnitude m, reference ref)."""
    nu = n * u_acc
    g = nu / (1.0 - nu) if nu < 1.0 else np.inf
    return (1.0 + u_out) * g * m * (1.0 + (n + 1) * 2.0**-52) + 2.0 * u_out * abs(ref) + n * 2.0**-1074


@jit
def _bound_all(mag, ref, n, u_acc, u_out, out):
    for i in range(mag.size):
        out[i] = bound1(mag[i], ref[i], n, u_acc, u_out)


def bound(mag, ref, n, u_acc, u_out):
    """The worst-case bound B of the module docstring, elementwise (the slack ``1 + (n + 1) 2**-52``
    covers M summed in float64 in any order; ``n 2**-1074`` its underflow)."""
    mag, ref = np.broadcast_arrays(np.asarray(mag, np.float64), np.asarray(ref, np.float64))
    out = np.empty(mag.shape)
    _bound_all(np.ascontiguousarray(mag).reshape(-1), np.ascontiguousarray(ref).reshape(-1), n, u_acc, u_out,
               out.reshape(-1))  # fmt: skip
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


@jit
def _max_ratios(e, m, ref, cm, cr):
    """out[j] = max_i e_i / (cm[j] m_i + cr[j] |ref_i|) over e_i > 0, in one pass; a NaN or zero
    bound (inf/NaN inputs, M = 0) explains nothing and counts as inf."""
    out = np.zeros(cm.size)
    for i in range(e.size):
        if e[i] > 0:
            for j in range(cm.size):
                b = cm[j] * m[i] + cr[j] * abs(ref[i])
                r = e[i] / b if b > 0 else np.inf
                if r != r:
                    r = np.inf
                if r > out[j]:
                    out[j] = r
    return out


def precision_ratios(err, n, mag, ref, fmt) -> dict:
    """For each candidate precision: the largest ratio of the error to its worst-case bound and
    to its probabilistic scale (the analytic version of each hypothesis, no emulation).

    worst case: (2 u_i + u_i^2) M + (1 + u_o) gamma_n(u_a) (1 + u_i)^2 M + 2 u_o |ref|,
    inputs rounded with unit u_i, accumulation u_a (Higham 2002, (3.5) and the rounding of
    each factor); probabilistic scale: sqrt(n) u_a M + 2 u_i M / sqrt(n) + 2 u_o |ref|, the
    typical size of independent rounding errors (Higham and Mary 2019), not a bound."""
    u_o = fmt.u
    cm, cr = [], []
    for ui, ua in CANDIDATES.values():
        cm.append(((2 * ui + ui * ui) + (1 + u_o) * _gamma(n, ua) * (1 + ui) ** 2) * _mag_slack(n))
        cm.append((np.sqrt(n) * ua + 2 * ui / np.sqrt(max(n, 1))) * _mag_slack(n))
        cr += [2 * u_o, 2 * u_o]
    flat = (np.ascontiguousarray(a, np.float64).reshape(-1) for a in (err, mag, ref))
    r = _max_ratios(*flat, np.array(cm), np.array(cr))
    return {name: {"worst_case": float(r[2 * j]), "probabilistic": float(r[2 * j + 1])}
            for j, name in enumerate(CANDIDATES)}  # fmt: skip
