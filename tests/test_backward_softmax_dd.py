"""The double-word pass of the softmax / log_softmax backward (refkern/kernels/_softmax_dd.py): bit for
bit against the exact path (``force_exact=True``) on adversarial rows in every format, the rows that
reach each of its cases, and its bounds: shrunk far enough, they decide a case wrongly."""

import math

import numpy as np
import pytest

from refkern.accumulate.formats import FORMATS, round_array
from refkern.kernels._softmax_dd import dd_rows
from refkern.kernels.softmax_backward import exact_row, softmax_backward_rows

INF = math.inf
FMTS = ("float16", "bfloat16", "float32", "float64")


def _largest(fmt):
    return math.ldexp(2.0 - 2.0 ** (1 - fmt.prec), fmt.emax)


def _rows(fmt):
    """Adversarial rows (x, g) of the format, as a list of 2-d float64 arrays pairs of one length each."""
    p = fmt.prec
    big, sub = _largest(fmt), 2.0 ** (fmt.emin - p + 1)
    cases = []

    def add(x, g):
        cases.append((np.array([x], np.float64), np.array([g], np.float64)))

    # ties in the logits; a zero softmax numerator without equal g (every G_k / c_k = 1 where g_i = 1)
    add([1.0, 1.0, 2.0, 2.0, 2.0, -0.5], [0.5, 1.5, 1.0, 1.0, 1.0, 1.0])
    add([1.0, 1.0, 2.0, 2.0, 2.0, -0.5], [0.5, 1.5, 1.0, -0.0, 1.0, 3.0])
    # one value throughout (y = 1/c: rational results, exact midpoints), one entry, equal g, zero g
    add([0.75] * 5, [1.0, -2.0, 0.5, 3.0, -0.0])
    add([2.0], [1.5])
    add([2.0], [-0.0])
    add([1.0, 1.0], [1.0 + 2.0 ** (1 - p), -(2.0**-p)])  # (g0 - g1) / 4 and (g0 - g1) / 2: midpoints
    add([0.5, -3.0, 1.0, -INF], [0.25] * 4)  # softmax: equal g, dx = +0 (-inf entry too)
    add([0.5, -3.0, 1.0, -INF], [0.0, -0.0, 0.0, -0.0])  # log_softmax: G = 0, dx = g (signs kept)
    add([0.5, 0.5, -INF], [0.0, -0.0, -0.0])  # one group and G = 0: +0 for the finite entries
    add([0.5, -3.0, 1.0, 2.0], [1.0, -1.0, -0.0, 0.0])  # G = 0 without all g zero
    add([0.5, -3.0, 1.0, 2.0], [0.25, -0.5, 0.25, 0.0])
    # -inf entries, a fully masked row, NaN and +inf logits, non-finite g
    add([-INF, 1.0, -INF, -2.0], [3.0, -1.0, -0.0, 0.5])
    add([-INF] * 3, [1.0, 2.0, 3.0])
    add([1.0, np.nan, 0.0], [1.0, 1.0, 1.0])
    add([1.0, INF, 0.0], [1.0, 1.0, 1.0])
    add([1.0, 2.0, 0.0], [1.0, INF, 1.0])
    add([1.0, 2.0, 0.0], [1.0, np.nan, 1.0])
    # huge and tiny logits, huge and tiny g
    add([big, -big, big / 2, 0.0], [1.0, -2.0, 0.5, 0.25])
    add([sub, -sub, 0.0, 2 * sub], [1.0, -2.0, 0.5, 0.25])
    add([0.0, -1.0, 2.0], [big, big, -big])  # G beyond the range: log_softmax dx = +-inf
    add([100.0 if p > 11 else 10.0, 0.0, 0.0], [-big, big, big])
    add([0.0, -1.0, 2.0, 0.5], [sub, -sub, 2 * sub, 0.0])
    add([0.0, -1.0, 2.0, 0.5], [big, sub, -sub, 1.0])  # g over the whole range: the "tiny" g'
    add([0.0, -1.0, 2.0, 0.5], [1.0, sub, -sub, 0.0])
    # results near zero, subnormal results, results rounding to zero (a spread of logits)
    for j in range(-3, p + 4):
        L = float(round_array(np.array([math.log(2.0) * (1 - fmt.emin + j)]), *fmt.params)[0])
        add([0.0, -L, 0.5], [1.0, -0.75, 0.25])
        add([0.0, -L], [0.0, 1.0])
    for L in (2001.0, 3000.0, 1e4):  # e**d below 2**-2885: the d < -2000 cases
        add([0.0, -L, 0.5], [1.0, -0.75, 0.25])
        add([0.0, -L, 0.5], [1.0, 0.0, 0.25])
        add([0.0, -L, 0.5], [1.0, -0.0, -1.0])
        add([0.0, -L, 0.5], [0.0, 0.0, 0.0 if L < 3000 else 1.0])
    # cancellation: g_i close to D (softmax) and to G y_i (log_softmax)
    add([0.3, -1.2, 0.7, 0.1], [1.0, 1.0, 1.0, 1.0 + 2.0 ** (1 - p)])
    add([0.0, -(2.0**-p)], [1.0, 1.0])
    add([0.0, -(2.0**-p), -(2.0 ** (1 - p))], [1.0, 1.0, 1.0 + 2.0 ** (1 - p)])
    # N = sum_j (g_0 - g_j) e**d_j = (g_0 - g_1) e**-75 ~ 2**-(p + 106), below the double-word rounding of
    # S (2**-106): the softmax numerator of the first entry is lost in the row's sums, and the next pass decides
    for j in range(1, 4):
        add([0.0, -75.0, -1.25], [1.5, 1.5 + j * 2.0 ** (2 - p), 1.5])
        add([0.0, -75.0, -1.25], [1.5, 1.5 - j * 2.0 ** (2 - p), 1.5])
    # irrational values near a midpoint. softmax, x = [1, 1 - 2**-p]: dx_0 = (g0 - g1) E / (1 + E)**2 with
    # E = e**(-2**-p), = (g0 - g1) (1/4 - 2**-2p / 32 + ...), (g0 - g1) / 4 a midpoint
    add([1.0, 1.0 - 2.0**-p], [1.0 + 2.0 ** (1 - p), -(2.0**-p)])
    # the same with x = [0, -2**-60]: 2**-123 of itself below the midpoint, far inside the double-word bound
    for j in range(1, 6):
        add([0.0, -(2.0**-60)], [1.0 + j * 2.0 ** (1 - p), -(2.0**-p)])
        add([0.0, -(2.0**-60), -INF], [0.5 + j * 2.0 ** (1 - p), 2.0 ** -(p + 1), 1.0])
    # log_softmax, x = [0, -2**-k], g = [g0, 0]: dx_0 = g0 (1/2 - 2**-k / 4 + 2**-3k / 48 - ...), with
    # g0 = 1 + 2**-(p - 1 - k) making g0 (1/2 - 2**-k / 4) a midpoint
    k = min(40, p - 2)
    add([0.0, -(2.0**-k)], [1.0 + 2.0 ** -(p - 1 - k), 0.0])
    add([0.0, -(2.0**-k)], [-(1.0 + 2.0 ** -(p - 1 - k)), 0.0])
    # random rows of a few lengths and scales, with ties and -inf entries
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 5, 17):
        for scale in (0.5, 4.0, 40.0):
            x = np.round(rng.standard_normal(n) * scale * 4) / 4
            g = rng.standard_normal(n)
            if n > 2:
                x[rng.integers(n)] = -INF
            add(list(x), list(g))
    out = []
    for x, g in cases:  # every value of the format (cases that do not fit it are rounded into it)
        with np.errstate(invalid="ignore"):
            x = np.where(np.isfinite(x), round_array(np.nan_to_num(x), *fmt.params), x)
            g = np.where(np.isfinite(g), round_array(np.nan_to_num(g), *fmt.params), g)
        out.append((x, g))
    return out


def _bits(a):
    return a.view(np.int64).tolist()


@pytest.mark.parametrize("log", (False, True), ids=("softmax", "log_softmax"))
@pytest.mark.parametrize("name", FMTS)
def test_adversarial_rows_bit_identical_to_the_exact_path(name, log):
    """The three passes against the exact path alone; and the double-word pass by itself on every
    element (for float16/bfloat16/float32 the float64 pass leaves it few)."""
    fmt = FORMATS[name]
    n_exact = n_all = n_dd = 0
    for x, g in _rows(fmt):
        fast, ne = softmax_backward_rows(x, g, fmt, log)
        exact, _ = softmax_backward_rows(x, g, fmt, log, force_exact=True)
        assert _bits(fast) == _bits(exact), (name, log, x, g, fast, exact)
        out = np.empty_like(x)
        und = np.ones(x.shape, np.bool_)
        dd_rows(x, g, np.arange(x.shape[0]), log, *fmt.params, 1.0, out, und)
        assert _bits(np.where(und, exact, out)) == _bits(exact), (name, log, x, g, out, exact)
        n_exact += ne
        n_all += x.size
        n_dd += int((~und).sum())
    assert n_exact < n_all // 4 and n_dd > n_all // 2  # the passes before the exact path decide most


@pytest.mark.parametrize("log", (False, True), ids=("softmax", "log_softmax"))
def test_float64_rows_decided_by_the_double_word_pass(log):
    """Random float64 rows of 4096: nothing for the exact path; a batch mixing the row kinds too."""
    fmt = FORMATS["float64"]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 4096)) * 3
    g = rng.standard_normal((4, 4096))
    x[1, ::5] = -INF
    g[2] = 0.5  # softmax: equal g; log_softmax: a row of one g
    out, n_exact = softmax_backward_rows(x, g, fmt, log)
    assert n_exact == 0 and np.isfinite(out).all()
    cols = [0, 1, 5, 4095]
    for r in range(4):  # the exact path on a few elements of each row (it takes ~1 s a row)
        ref = exact_row(x[r], g[r], cols, fmt, log)
        assert _bits(out[r, cols]) == _bits(np.array([ref[c] for c in cols])), r


def test_deep_midpoint_goes_to_the_exact_path():
    """float64 softmax of x = [1, 1 - 2**-53], g = [1 + 2**-52, -2**-53]: the real dx_0 lies 2**-109 of
    itself below a midpoint, beyond the double-word pass; the exact path decides it (from 128 bits)."""
    fmt = FORMATS["float64"]
    x = np.array([[1.0, 1.0 - 2.0**-53]])
    g = np.array([[1.0 + 2.0**-52, -(2.0**-53)]])
    out = np.empty((1, 2))
    und = np.ones((1, 2), np.bool_)
    dd_rows(x, g, np.array([0]), False, *fmt.params, 1.0, out, und)
    assert und.all()
    fast, n_exact = softmax_backward_rows(x, g, fmt, False)
    exact, _ = softmax_backward_rows(x, g, fmt, False, force_exact=True)
    assert n_exact == 2 and _bits(fast) == _bits(exact)
    # (g0 - g1) / 4 = 1/4 + 3 * 2**-55 lies halfway between 1/4 + 2**-54 and 1/4 + 2**-53; the real value below it
    assert fast[0, 0] == 0.25 + 2.0**-54 and fast[0, 1] == -(0.25 + 2.0**-54)


@pytest.mark.parametrize("log", (False, True), ids=("softmax", "log_softmax"))
def test_shrunk_bounds_decide_wrongly(log):
    """Every bound of the double-word pass times ``slack``: at 1 it agrees with the exact path on every
    row above; at 2**-16 it decides some float64 row wrongly (measured: the first wrong decision comes at
    2**-11 for softmax and 2**-10 for log_softmax, both on the cancelling row x = [0, -2**-53, -2**-52],
    g = [1, 1, 1 + 2**-52]), so the rows test the bounds rather than pass whatever they are. Halving a
    bound breaks nothing here: they are worst-case sums (n EPS per sum of n terms), about 2**10 times the
    errors these rows reach. For float16/bfloat16/float32 no slack, 0 included, gave a wrong result: a
    value that close to a midpoint has its high word on the midpoint, which decide_scaled never decides."""
    fmt = FORMATS["float64"]
    wrong = 0
    for x, g in _rows(fmt):
        exact, _ = softmax_backward_rows(x, g, fmt, log, force_exact=True)
        for slack in (1.0, 2.0**-16):
            out = np.empty_like(x)
            und = np.ones(x.shape, np.bool_)
            dd_rows(x, g, np.arange(x.shape[0]), log, *fmt.params, slack, out, und)
            differ = bool((np.where(und, exact, out).view(np.int64) != exact.view(np.int64)).any())
            if slack == 1.0:
                assert not differ, (log, x, g)
            wrong += differ
    assert wrong > 0
