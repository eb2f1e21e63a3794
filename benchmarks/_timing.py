"""How every benchmark times its sides: in blocks of consecutive calls, never single calls
interleaved (numba's and BLAS's thread pools would otherwise measure each other)."""

import time


def per_call(sides, blocks):
    """{name: (fn, calls)} -> {name: best seconds per call}: a warm-up call each, then ``blocks``
    rounds in which every side runs ``calls`` consecutive calls; the best round counts."""
    for fn, _ in sides.values():
        fn()
    out = dict.fromkeys(sides, float("inf"))
    for _ in range(blocks):
        for name, (fn, calls) in sides.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name] = min(out[name], (time.perf_counter() - t0) / calls)
    return out
