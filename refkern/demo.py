"""``refkern demo``: classic discrepancies, each method against the correctly rounded result.

Every case is computed live: the exact result comes from ``accumulate="exact"`` and is
checked against the independent mpmath ground truth before it is printed.
"""

import time

import numpy as np

from refkern import reduce
from refkern.accumulate.formats import FLOAT32
from refkern.analysis.ulp import ulp_error

_ORDER = ["naive", "pairwise", "kahan", "neumaier", "dot2", "exact"]
assert sorted(_ORDER) == list(reduce.METHODS)


def _cases(seed=0):
    rng = np.random.default_rng(seed)
    small = rng.random(10_000).astype(np.float32)
    yield (
        "massive cancellation: sum([1e8, 10,000 uniforms in [0, 1), -1e8]) in float32",
        "float32 has 24 bits: each uniform added to 1e8 rounds to a multiple of 8 and is lost.",
        "sum",
        (np.concatenate([[1e8], small, [-1e8]]).astype(np.float32),),
    )
    x = rng.standard_normal(1_000_000).astype(np.float32)
    y = rng.standard_normal(1_000_000).astype(np.float32)
    yield (
        "float32 dot product of length 10^6 (standard normal entries)",
        "a sequential float32 loop errs by up to n*u*sum|x*y| in the worst case, ~sqrt(n)*u typically.",
        "dot",
        (x, y),
    )
    yield (
        "1e30 + 1 - 1e30 in float32",
        "the 1 is below half an ulp of 1e30 (2**76 in float32) and vanishes in every plain order;"
        " Kahan's compensation is lost too when the large terms cancel, Neumaier's and Dot2 keep it.",
        "sum",
        (np.array([1e30, 1.0, -1e30], np.float32),),
    )
    yield (
        "3e38 + 3e38 - 3e38 in float32 (largest float32 is 3.4e38)",
        "the intermediate 6e38 overflows to inf in float32; the exact sum is 3e38, finite.",
        "sum",
        (np.array([3e38, 3e38, -3e38], np.float32),),
    )


def _fmt_value(v):
    return f"{float(v):.9g}"


def run(out=print, seed=0) -> int:
    """Print the demo; returns the number of cases where the exact result disagreed with the
    mpmath ground truth (always 0 unless refkern is broken)."""
    from refkern import truth

    failures = 0
    out("refkern demo: every accumulation method against the correctly rounded result (float32)\n")
    for i, (title, why, op, args) in enumerate(_cases(seed), 1):
        fn = reduce.dot if op == "dot" else reduce.sum
        t0 = time.perf_counter()
        exact = fn(*args)
        t_exact = time.perf_counter() - t0
        gt = (truth.dot if op == "dot" else truth.sum)(*args)
        agrees = np.float32(gt).tobytes() == np.float32(exact).tobytes()
        failures += not agrees
        out(f"[{i}] {title}")
        out(f"    why: {why}")
        out(f"    {'method':<10} {'result':>16} {'error (ulp)':>14}")
        for m in _ORDER:
            v = exact if m == "exact" else fn(*args, accumulate=m)
            err = ulp_error(float(v), float(exact), FLOAT32)
            err_s = "0" if err == 0 else (f"{err:+.3g}" if abs(err) != float("inf") else "inf")
            out(f"    {m:<10} {_fmt_value(v):>16} {err_s:>14}")
        check = "agrees bit for bit" if agrees else f"DISAGREES ({_fmt_value(gt)})"
        out(f"    exact took {t_exact * 1e3:.1f} ms; mpmath ground truth {check}\n")
    return failures
