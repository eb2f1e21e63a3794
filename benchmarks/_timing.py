"""How every benchmark times its sides: in blocks of consecutive calls, never single calls
interleaved (numba's and BLAS's thread pools would otherwise measure each other)."""

import time


def per_call(sides, blocks, clock=time.perf_counter):
    """{name: (fn, calls)} -> {name: best seconds per call}: a warm-up call each, then ``blocks``
    rounds in which every side runs ``calls`` consecutive calls; the best round counts. ``clock``:
    wall time, or e.g. ``time.process_time`` for the process's CPU time."""
    for fn, _ in sides.values():
        fn()
    out = dict.fromkeys(sides, float("inf"))
    for _ in range(blocks):
        for name, (fn, calls) in sides.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            out[name] = min(out[name], (clock() - t0) / calls)
    return out
