"""The filtering engine's decision as torch ops on the tensors' device (issue 27, point 4).

:mod:`refkern.engines.filter` decides each element of a float64 GEMM with :func:`~refkern.engines.
filter.decide_one` in a jitted CPU loop. On a CUDA device that loop would need the whole float64
result copied back (128 MiB at 4096**2). Here the same test runs as whole-tensor torch ops where the
tensors live (cuBLAS's GEMM, the norms, the bound, both ends of each interval rounded to the result
format and compared); only the undecided elements' indices come back to the CPU, where the existing
exact path (:func:`~refkern.engines.filter_element._exact_pairs`, the Numba engine's own element)
computes them. The decided values are rounded on the device, in the result format. Every function takes
torch tensors on any device, the CPU included, so that the tests run it without a GPU.

**The bound** (:func:`decide`). decide_one takes e = fl(C m), C = (K + 1) SLACK 2**-53 (exact),
m = fl(fl(na nb) + |bias|). Here e' = fl(fl(fl(na C1) nb) + fl(|bias| C1)): the constant folded into
the row norms saves one pass over the (M, N) result. C1 = C moved up by 8 float64 steps
(:func:`scale`), so C1 >= C (1 + 8u), u = 2**-53 (each step adds ulp(C) >= u C). With every rounding
relative error at most u: e' >= C1 (na nb + |b|) (1 - u)**3 >= C (na nb + |b|) (1 + u)**3 >= e,
because (1 + u)**3 / (1 - u)**3 < 1 + 7u. So e' >= e for every element, and since fl(s - e) and
fl(s + e) are monotonic in e, the interval tested here contains decide_one's: whatever this decides,
decide_one's derivation holds for it (the exact sum lies in [fl(s - e'), fl(s + e')]), and every
element decided here is decided by decide_one to the same value (a wider interval that rounds to one
value contains the narrower). The tight bound (m = fl(G + |b|), G the float64 GEMM of |A| |B|^T) is
covered the same way: e' = fl(C1 fl(G + |b|)) >= fl(C fl(G + |b|)).

**decide_one's range guards** hold by themselves for float32-or-narrower factors (``applies``): a
nonzero norm is >= 2**-149 (a nonzero square >= 2**-298), so m is 0, or >= 2**-298 > M_MIN, or
inf/NaN (a term inf or NaN); a finite m <= K 2**256 + 2**128 < 2**297 < M_MAX (K < 2**40).
m = 0 means every term is zero: s = +-0, both ends round to zero, and a zero result is left
undecided here (its sign needs the exact path, decide_one's step 4), which also stands for
decide_one's test |s| > e: a nonzero value r = round(fl(s - e')) = round(fl(s + e')) has the sign of
both ends, so fl(s - e') > 0 (or fl(s + e') < 0), i.e. s > e' (or s < -e'). inf or NaN in m makes
e' inf or NaN: the ends are -inf and inf, or NaN, and never compare equal. No product underflows:
e' >= 2**-53 2**-149 2**-149 (normal; C1 >= 2**-53 for K >= 0).

**Rounding the ends to the result format.** float32: torch's float64 -> float32 conversion (one
IEEE rounding to nearest even, subnormals and overflow to inf included). bfloat16 and float16:
torch converts float64 to them through float32, two roundings, wrong where the float32 value lands
on a midpoint of the narrow format (torch gives 1 for 1 + 2**-8 + 2**-30 in bfloat16; the correct
rounding is 1 + 2**-7). So each end y = fl32(x) is rounded to the narrow format from float32 (one
rounding), and the element is decided only when neither y is a possible rounding boundary of the
narrow format: every boundary (a midpoint, or the overflow threshold max + ulp / 2) is a float32
number, so a boundary in [lo, hi] is also in [fl32(lo), fl32(hi)] (rounding is monotonic), and
when round(fl32(lo)) == round(fl32(hi)) and neither is a boundary, none lies between them: the
exact sum rounds to that value. A float32 y is a bfloat16 boundary iff its 16 low bits are 0x8000
(bfloat16 is float32 without those bits, subnormals included); a float16 boundary in float16's
normal range iff its 13 low bits are 0x1000; below 2**-14 (float16's subnormals) every end counts as
a possible boundary. That leaves about 2**-16 (bfloat16) or 2**-13 (float16) of the elements
undecided although decide_one decides them; those undecided elements are looked at again, gathered,
with both ends in float64 rounded once (:func:`round_once`, :meth:`Device._once`), which decides
what decide_one decides on them (tests: never more).

**What runs where, and memory.** On the device: the float64 GEMM (cuBLAS), the norms, the decision
in chunks of at most CHUNK elements (at most 32 bytes of temporaries per element of a chunk: a
float64 bound where a bias or the magnitudes enter it, both ends in float32, their narrow roundings,
an int32 bit test and boolean masks; 1 GiB at CHUNK, beside the float64 result), the rounded
results; then, on a CUDA device, the compensated stage (:mod:`~refkern.engines.filter_compensated`:
one kernel reads each undecided element's two rows once and sums its products with every addition's
error, an interval about ``K u**2 T`` wide); where it does not compile, or on CPU tensors, the |A| |B|^T
GEMM over the rows holding undecided elements where it pays (:func:`tight_pays`), and the pairwise
stage on the elements still undecided where it pays (:func:`pairwise`, :func:`pairwise_pays`; chunks
of PAIRWISE_PRODUCTS gathered products). On the CPU: what remains, by the exact path, on copies of the
rows it needs. Every elementwise step is one
torch op, except fl(s -+ fl(na C1) nb) without a bias (torch.addcmul, whose kernel may contract the
product into an FMA: the product then is exact, which the bound above covers, :func:`decide`).
"""

import math
import time

import numpy as np

from refkern.engines import filter_element as fe

__all__ = ["CHUNK", "EXACT_TERM_S", "TIGHT_SHARE", "supports", "scale", "norms", "decide", "decide_gemm",
           "round_once", "decide_ends", "value_gemm", "tight_pays", "pairwise", "pairwise_pays", "PAIRWISE_PRODUCTS",
           "PAIRWISE_MIN_S", "Device", "exact_elements", "gemm", "matmul"]  # fmt: skip

CHUNK = 1 << 25  # elements per decision chunk: at most 32 bytes of temporaries each (module docstring)
EXACT_TERM_S = 2.5e-9  # the CPU exact path, seconds per product on one thread (measured: 2.44 ns, K = 4096)
TIGHT_SHARE = 1 - 2 / math.pi  # the undecided share the |A||B| bound decides on Gaussian data (tight_pays)
PAIRWISE_PRODUCTS = 1 << 24  # products per chunk of the pairwise stage: about 5 float64 temporaries, 640 MiB
PAIRWISE_MIN_S = 1e-3  # the pairwise stage's launches (4 ops x log2 K levels, gathers): its fixed cost

_FORMATS = {(24, -126, 127): "float32", (8, -126, 127): "bfloat16", (11, -14, 15): "float16"}


def supports(params) -> bool:
    """Whether :func:`decide` rounds to the format (prec, emin, emax): float32, bfloat16, float16."""
    return tuple(params) in _FORMATS


def scale(k) -> float:
    """C1: (K + 1) SLACK 2**-53 (exact, :func:`~refkern.engines.filter_element.bound`'s constant) moved up by
    8 float64 steps, so C1 >= C (1 + 8u) (module docstring: the folded bound stays above decide_one's)."""
    c = (k + 1) * fe.SLACK * 2.0**-53
    for _ in range(8):
        c = math.nextafter(c, math.inf)
    return c


def norms(X):
    """fl(sqrt(sum_k X[..., k]**2)) per row of a float64 tensor of <= 24-bit values: each square is
    exact (a separate op, so never contracted into an FMA), torch's sum any order (gamma_{K-1}), as
    :func:`~refkern.engines.filter._norms`."""
    return (X * X).sum(-1).sqrt()


def _boundary(y, low_bits):
    """Whether the float32 tensor y's ``low_bits`` lowest bits are 1 followed by zeros: a midpoint of
    the format that drops them (module docstring)."""
    b = y.view(_torch().int32)
    return (b & ((1 << low_bits) - 1)) == (1 << (low_bits - 1))


def _round_ends(yl, yh, name):
    """(r, undecided): yl, yh the float32 roundings of the two ends, r the result-format value of the
    lower, undecided where the ends do not round to one nonzero value of the format (module
    docstring)."""
    torch = _torch()
    if name == "float32":
        und = yl != yh
        und |= yl == 0  # a zero result: its sign needs the exact path; +0 == -0 compare equal
        return yl, und
    dt = getattr(torch, name)
    rl, rh = yl.to(dt), yh.to(dt)  # one rounding each, from float32
    und = rl != rh
    und |= rl == 0
    if name == "bfloat16":
        und |= _boundary(yl, 16)
        und |= _boundary(yh, 16)
    else:
        und |= _boundary(yl, 13)
        und |= _boundary(yh, 13)
        und |= yl.abs() < 2.0**-14  # float16's subnormal range: every end a possible boundary
        und |= yh.abs() < 2.0**-14
    return rl, und


def round_once(x, name):
    """The float64 tensor x rounded once (to nearest even) to bfloat16 or float16: to float32 by
    rounding to odd (the nearer neighbour, or of the two float32 neighbours of an inexact x the one
    with an odd last bit), then to the format to nearest, which is one correct rounding wherever
    float32 holds at least two more bits than the format at x's magnitude (Boldo and Melquiond, IEEE
    TC 57(4), 2008): everywhere for bfloat16 (16 more, subnormals included) and float16 (at least 13).
    Beyond float32's range the odd neighbour is float32's largest number, which rounds to inf in both."""
    torch = _torch()
    y = x.to(torch.float32)
    back = y.to(torch.float64)
    keep = (back == x) | ((y.view(torch.int32) & 1) == 1)  # exact, or already the odd neighbour
    toward = torch.where(x > back, torch.inf, -torch.inf).to(torch.float32)
    return torch.where(keep, y, torch.nextafter(y, toward)).to(getattr(torch, name))


def decide(s, e, name):
    """(r, undecided) for the float64 values ``s`` (the GEMM plus the bias) and bounds ``e`` (a float64
    tensor of s's shape, or a pair (x, y) of factors broadcast to it, e = x y never formed): r holds
    the correctly rounded result, in the format ``name``, wherever ``undecided`` is False.

    Each end fl(s -+ e) is formed in float64 and rounded to float32 in one pass (an ``out=`` float32
    tensor: torch computes in the inputs' float64 and converts on the store, the same two roundings as
    two passes). With the factors, torch.addcmul(s, x, y, value=-+1) may round the product x y or
    (contracted into an FMA) not: either way the subtrahend is at least fl(x y) >= decide_one's e
    (x = fl(na C1) >= C (1 + 8u)(1 - u) na, module docstring), and fl is monotonic."""
    torch = _torch()
    yl = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    yh = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    try:
        if isinstance(e, tuple):
            torch.addcmul(s, *e, value=-1, out=yl)
            torch.addcmul(s, *e, value=1, out=yh)
        else:
            torch.sub(s, e, out=yl)
            torch.add(s, e, out=yh)
    except RuntimeError:  # a torch that refuses a float32 out= of float64 inputs: form the ends, then convert
        yl.copy_(torch.addcmul(s, *e, value=-1) if isinstance(e, tuple) else s - e)
        yh.copy_(torch.addcmul(s, *e, value=1) if isinstance(e, tuple) else s + e)
    return _round_ends(yl, yh, name)


def tight_pays(undecided, rows, n, k, gemm_s, m, threads):
    """Whether the |A| |B|^T GEMM over ``rows`` rows (of m, at N = n) costs less than the exact path
    it is expected to save: its time is the value GEMM's measured time ``gemm_s`` times rows / m (same
    K and N); it decides about TIGHT_SHARE of the ``undecided`` elements, each of which costs the
    exact path K EXACT_TERM_S seconds on one of ``threads`` threads. TIGHT_SHARE = 1 - 2 / pi: for
    Gaussian data the norm product exceeds sum |a b| by pi / 2 on average, so a bound that tight
    leaves 2 / pi of the elements the norms left (measured on 256 rows of 4096^3 float32: 5,069 ->
    3,391, a share of 0.33 decided). Where terms cancel it decides none: at most one GEMM's time lost.
    On an H100 with 16 CPU threads at 4096^3 a row's GEMM costs about one element's exact path, so
    it runs where rows hold about three undecided elements each."""
    return gemm_s * rows / max(m, 1) < TIGHT_SHARE * undecided * k * EXACT_TERM_S / max(threads, 1)


def pairwise(A, B, t, i, j, bias, name):
    """(r, undecided) for the elements (t, i, j) (int64 tensors) of A[t] @ B[t]^T (+ bias), float64
    tensors A (T, M, K) and B (T, N, K) of narrow values, ``bias`` the values added to each element
    (a float64 tensor of t's length) or None: the K products gathered (exact), zeros to 2**w terms,
    summed pairwise by whole-tensor halvings (each a sum of two: one rounded addition, in no order to
    choose), the bias added at the root, and the same for their absolute values. A summation tree of
    depth L = w (+ 1 with the bias) errs by at most gamma_L sum |terms| (Higham, *Accuracy and
    Stability*, 2nd ed., section 4.2: each term passes through at most L rounded additions), which is
    decide_one's assumption with L in place of K, and the same tree's sum T' of |terms| is at least
    (1 - gamma_L) T: so e' = fl(scale(L) T') bounds the error as decide_one's derivation says. With
    L = 12 instead of K = 4096 the interval is 340 times narrower; the ends are rounded as in
    :func:`round_once` (bfloat16, float16) or by the conversion (float32), a zero result undecided.
    In chunks of PAIRWISE_PRODUCTS products (the two gathered operands, the products and their
    absolute values, and the halvings: about five float64 temporaries of that size)."""
    torch = _torch()
    w = max(1, math.ceil(math.log2(max(A.shape[2], 2))))  # the products padded to 2**w
    L = w + (bias is not None)  # the bias added at the root: a tree of depth w + 1
    c1 = scale(L)
    rows = max(1, PAIRWISE_PRODUCTS >> w)
    r = torch.empty(t.shape, dtype=getattr(torch, name), device=A.device)
    und = torch.empty(t.shape, dtype=torch.bool, device=A.device)
    for c0 in range(0, t.shape[0], rows):
        sl = slice(c0, c0 + rows)
        p = torch.zeros((t[sl].shape[0], 1 << w), dtype=torch.float64, device=A.device)
        torch.mul(A[t[sl], i[sl]], B[t[sl], j[sl]], out=p[:, : A.shape[2]])  # exact products
        q = p.abs()
        while p.shape[1] > 1:
            p = p.view(p.shape[0], -1, 2).sum(-1)  # one rounded addition per pair
            q = q.view(q.shape[0], -1, 2).sum(-1)
        sv, tq = p[:, 0], q[:, 0]
        if bias is not None:
            sv, tq = sv + bias[sl], tq + bias[sl].abs()
        e = tq * c1
        r[sl], und[sl] = decide_ends(sv - e, sv + e, name)
    return r, und


def decide_ends(lo, hi, name):
    """(r, undecided) for float64 tensors ``lo`` and ``hi``, the ends of intervals that hold exact
    sums: each end rounded once to the format ``name`` (the conversion for float32, :func:`round_once`
    for bfloat16 and float16); an element is decided to ``r`` where both ends round to one nonzero
    value (rounding is monotonic; a zero result's sign is the exact path's)."""
    torch = _torch()
    if name == "float32":
        rl, rh = lo.to(torch.float32), hi.to(torch.float32)
    else:
        rl, rh = round_once(lo, name), round_once(hi, name)
    return rl, (rl != rh) | (rl == 0)


def pairwise_pays(undecided, k, threads):
    """Whether the pairwise stage is worth its launches: the exact path would take longer than
    PAIRWISE_MIN_S on ``threads`` CPU threads (K EXACT_TERM_S per element). Its own cost per product
    on a GPU (about 70 bytes of memory traffic: the gathers, the product, the halvings) is a few
    hundredths of a nanosecond, far below the exact path's 2.5 ns per thread."""
    return undecided * k * EXACT_TERM_S / max(threads, 1) > PAIRWISE_MIN_S


def _torch():
    import torch

    return torch


def value_gemm(A, B):
    """A @ B^T in float64 on the tensors' device (cuBLAS on CUDA: a float64 GEMM, which torch's TF32
    and reduced-precision switches leave alone; :func:`~refkern.engines.filter.self_test` checks it)."""
    return _torch().matmul(A, B.transpose(-1, -2))


def _bias_view(bias, bias_rows):
    return bias.view((1, -1, 1) if bias_rows else (1, 1, -1))


def decide_gemm(V, na, nb, k, name, bias=None, bias_rows=False, mag=None):
    """(R, undecided) for V (T, M, N), the float64 GEMM of K products per element (without the bias;
    V += bias in place): R in the format ``name`` (float32, bfloat16, float16), correctly rounded
    wherever ``undecided`` is False. The bound: with ``mag`` (T, M, N) = |A| |B|^T + |bias| (float64),
    e' = fl(C1 mag); else from the row norms na (T, M) of A and nb (T, N) of B, e' = fl(fl(fl(na C1)
    nb) + fl(|bias| C1)) (module docstring). bias: (N,), or (M,) with ``bias_rows``, float64. In
    chunks of at most CHUNK elements (whole batch elements, or rows of one)."""
    torch = _torch()
    c1 = scale(k)
    bc = None
    if bias is not None:
        V += _bias_view(bias, bias_rows)  # s = V + bias: one more rounded addition, counted in K + 1
        bc = _bias_view(bias.abs() * c1, bias_rows)
    if mag is None:
        na = na * c1  # fl(na C1)
    nt, m, n = V.shape
    if m * n <= CHUNK:
        step = max(1, CHUNK // max(m * n, 1))
        parts = [(slice(t, min(nt, t + step)), slice(0, m)) for t in range(0, nt, step)]
    else:
        rows = max(1, CHUNK // max(n, 1))
        parts = [(slice(t, t + 1), slice(i, min(m, i + rows))) for t in range(nt) for i in range(0, m, rows)]
    if len(parts) > 1:
        R = torch.empty(V.shape, dtype=getattr(torch, name), device=V.device)
        und = torch.empty(V.shape, dtype=torch.bool, device=V.device)
    for ts, rs in parts:
        if mag is not None:
            e = mag[ts, rs] * c1
        elif bc is not None:
            e = na[ts, rs, None] * nb[ts, None, :]
            e += bc[:, rs] if bias_rows else bc  # fl(fl(na C1) nb) + fl(|b| C1)
        else:
            e = (na[ts, rs, None], nb[ts, None, :])  # fl(na C1) nb, never formed (decide)
        if len(parts) == 1:
            return decide(V, e, name)
        R[ts, rs], und[ts, rs] = decide(V[ts, rs], e, name)
    return R, und


class Device:
    """One batch ``V[t] = A[ia[t]] @ B[ib[t]]^T (+ bias)`` decided on the tensors' device. A (TA, M, K)
    and B (TB, N, K): tensors of exactly representable values (float16, bfloat16, float32 or their
    float64 widening), ia and ib int64 numpy arrays, bias a tensor (N,) (per column) or (M,) with
    ``bias_rows``, or None; ``name`` the result format."""

    def __init__(self, A, B, ia, ib, bias, name, bias_rows=False):
        torch = _torch()
        self.dev = A.device
        self.A = A.to(torch.float64)
        self.A_in, self.B_in = A, B.to(device=self.dev)  # the narrow values as given (filter_compensated)
        self.B = B.to(device=self.dev, dtype=torch.float64)
        self.ia, self.ib, self.name, self.bias_rows = np.asarray(ia), np.asarray(ib), name, bias_rows
        self.bias = None if bias is None else bias.to(device=self.dev, dtype=torch.float64)
        self.k = self.A.shape[2]
        self.stats = {}

    def _sync(self):
        if self.dev.type == "cuda":
            _torch().cuda.synchronize(self.dev)

    def _pair(self, X, idx):
        """X[idx] (the batch elements the GEMM pairs), a view when idx is 0 .. T - 1."""
        if idx.size == X.shape[0] and (idx == np.arange(idx.size)).all():
            return X
        return X[_torch().as_tensor(idx, device=self.dev)]

    def run(self, want_mag=False):
        """(R, V, mag, idx): R (T, M, N) the results in the format (valid where decided), V the GEMM's
        values plus the bias (float64), mag (|A| |B|^T + |bias|, float64) or None, idx the undecided
        elements as a (n, 3) int64 numpy array of (t, i, j)."""
        A, B = self._pair(self.A, self.ia), self._pair(self.B, self.ib)
        self._sync()
        t0 = time.perf_counter()
        V = value_gemm(A, B)
        self._sync()
        gemm_s = time.perf_counter() - t0  # the tight bound's cost model (tight_pays)
        mag = na = nb = None
        if want_mag:  # the tight bound from the start: the magnitudes are wanted anyway
            mag = value_gemm(A.abs(), B.abs())
            if self.bias is not None:
                mag += _bias_view(self.bias, self.bias_rows).abs()
            R, und = decide_gemm(V, None, None, self.k, self.name, self.bias, self.bias_rows, mag=mag)
        else:
            na, nb = norms(A), norms(B)
            R, und = decide_gemm(V, na, nb, self.k, self.name, self.bias, self.bias_rows)
        idx = und.nonzero()
        self.stats["elements"] = V.numel()
        self.stats["undecided_first"] = int(idx.shape[0])
        if idx.shape[0] and self.name != "float32":
            idx = self._once(V, R, und, idx, mag, na, nb)
            self.stats["undecided_rounded_once"] = int(idx.shape[0])
        if idx.shape[0] and self._compensates():
            idx = self._compensated(R, idx)
            self.stats["undecided_after_compensated"] = int(idx.shape[0])
        if idx.shape[0] and not want_mag:
            idx = self._tighten(A, B, V, R, und, idx, gemm_s)
        self.stats["undecided_after_tight"] = int(idx.shape[0])
        if idx.shape[0] and (self.dev.type == "cuda" or self.force_pairwise):
            import numba

            if self.force_pairwise or pairwise_pays(idx.shape[0], self.k, numba.get_num_threads()):
                idx = self._pairwise(A, B, R, idx)
                self.stats["undecided_after_pairwise"] = int(idx.shape[0])
        return R, V, mag, idx.cpu().numpy()

    force_pairwise = False  # the tests: the pairwise stage on CPU tensors too
    force_compensated = False  # the tests: the compensated stage on CPU tensors (under Numba's CUDA simulator)
    compensate = True  # False: the |A| |B| and pairwise stages on a CUDA device too (benchmarks/bench_filter.py)

    def _compensates(self):
        """Whether the undecided elements go to :mod:`~refkern.engines.filter_compensated` (one kernel
        launch; on a CUDA device where Numba's CUDA target compiles it, else the |A| |B| and pairwise
        stages, with the reason in the stats)."""
        from refkern.engines import filter_compensated as fc

        if self.force_compensated:
            return True
        if not self.compensate:
            return False
        if self.dev.type != "cuda":
            return False
        if not fc.available():
            self.stats["compensated_unavailable"] = fc.reason()
            return False
        return True

    def _compensated(self, R, idx):
        """The undecided elements idx by :func:`refkern.engines.filter_compensated.sums` (each element's
        row of A and of B read once, its sum with every addition's error) and its decision; those that
        remain, as idx."""
        from refkern.engines import filter_compensated as fc

        torch = _torch()
        t, i, j = idx[:, 0], idx[:, 1], idx[:, 2]
        b = None if self.bias is None else self.bias[i if self.bias_rows else j]
        A32 = self._pair(self.A_in, self.ia).to(torch.float32)  # exact: narrow values
        B32 = self._pair(self.B_in, self.ib).to(torch.float32)
        sigma, tau, q = fc.sums(A32, B32, t, i, j, b)
        r, u = decide_ends(*fc.interval(sigma, tau, q, self.k, b is not None), self.name)
        R[t, i, j] = torch.where(u, R[t, i, j], r)
        return idx[u]

    def _pairwise(self, A, B, R, idx):
        """The undecided elements idx by :func:`pairwise`; those that remain, as idx."""
        t, i, j = idx[:, 0], idx[:, 1], idx[:, 2]
        b = None if self.bias is None else self.bias[i if self.bias_rows else j]
        r, u = pairwise(A, B, t, i, j, b, self.name)
        R[t, i, j] = _torch().where(u, R[t, i, j], r)
        return idx[u]

    def _once(self, V, R, und, idx, mag, na, nb):
        """The undecided elements idx of a bfloat16 or float16 result again, with both ends in float64
        rounded once (:func:`round_once`): most of those the whole-tensor pass left undecided had an
        end whose float32 value merely looked like a midpoint (about 2**-13 of float16's elements,
        2**-16 of bfloat16's: 2,087 and 265 of 4096**2 Gaussian products). The bound is the same
        formula (e' >= decide_one's e). The undecided that remain, as idx."""
        torch = _torch()
        t, i, j = idx[:, 0], idx[:, 1], idx[:, 2]
        s = V[t, i, j]
        c1 = scale(self.k)
        if mag is not None:
            e = mag[t, i, j] * c1
        else:
            e = (na[t, i] * c1) * nb[t, j]
            if self.bias is not None:
                e = e + self.bias[i if self.bias_rows else j].abs() * c1
        rl, rh = round_once(s - e, self.name), round_once(s + e, self.name)
        now = (rl != rh) | (rl == 0)
        R[t, i, j] = torch.where(now, R[t, i, j], rl)
        und[t, i, j] = now
        return idx[now]

    def _tighten(self, A, B, V, R, und, idx, gemm_s):
        """The undecided elements against the tight bound (|A| |B|^T over the rows holding them, per
        batch element) where :func:`tight_pays`; the undecided that remain, as idx."""
        import numba

        torch = _torch()
        nt, m, n = V.shape
        keep = []
        tcol = idx[:, 0]
        for t in range(nt):
            it = idx[tcol == t] if nt > 1 else idx
            if it.shape[0] == 0:
                continue
            rows = torch.unique(it[:, 1])
            if not tight_pays(it.shape[0], rows.numel(), n, self.k, gemm_s / nt, m, numba.get_num_threads()):
                keep.append(it)
                continue
            G = value_gemm(A[t, rows].abs(), B[t].abs())
            if self.bias is not None:
                G += (self.bias[rows, None] if self.bias_rows else self.bias[None, :]).abs()
            r, u = decide(V[t, rows], G.mul_(scale(self.k)), self.name)  # fl(C1 fl(G + |b|))
            was = und[t, rows]
            now = was & u
            R[t, rows] = torch.where(was & ~u, r, R[t, rows])
            und[t, rows] = now
            self.stats["abs_gemm_rows"] = self.stats.get("abs_gemm_rows", 0) + rows.numel()
            sub = now.nonzero()
            keep.append(torch.stack([torch.full_like(sub[:, 0], t), rows[sub[:, 0]], sub[:, 1]], 1))
        return torch.cat(keep) if keep else idx[:0]


def exact_elements(a_rows, b_rows, idx, bias, bias_rows, params):
    """The exact path on the undecided elements ``idx`` ((n, 3) int64 of (t, i, j)): a_rows(t, rows)
    and b_rows(t, rows) give float64 numpy copies of those rows of A[ia[t]] and B[ib[t]]; bias a
    numpy array (or None). Returns float64 numpy values, in idx's order."""
    out = np.empty(idx.shape[0])
    for t in np.unique(idx[:, 0]):
        sel = np.flatnonzero(idx[:, 0] == t)
        ii, jj = idx[sel, 1], idx[sel, 2]
        ua, ri = np.unique(ii, return_inverse=True)
        ub, rj = np.unique(jj, return_inverse=True)
        a, b = np.ascontiguousarray(a_rows(t, ua)), np.ascontiguousarray(b_rows(t, ub))
        has = bias is not None
        bb = np.ascontiguousarray((bias[ii] if bias_rows else bias[jj]) if has else np.zeros(sel.size))
        o = np.empty(sel.size)
        k = a.shape[1]
        with fe.threads_for(sel.size * k):
            fe._exact_pairs(a, b, ri.reshape(-1), rj.reshape(-1), bb, has, True, *params, o)
        out[sel] = o
    return out


def matmul(a, b, bias=None):
    """Exact ``a @ b (+ bias)`` of two 2-D torch tensors (float16, bfloat16 or float32, one dtype) on
    their device, correctly rounded to their dtype; the result stays on the device. The float64 GEMM
    and the decision run there (:class:`Device`); the undecided elements' rows are copied to the CPU,
    computed by the exact path and written back. ``bias`` (N,) of the same dtype: one more term of
    each sum (``torch.addmm``'s and ``F.linear``'s exact reference). Returns (result, stats): the
    counts of :meth:`Device.run`, and the seconds of the device part (``device_seconds``) and of the exact
    path with its copies (``exact_seconds``)."""
    torch = _torch()
    name = str(a.dtype).removeprefix("torch.")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype or name not in _FORMATS.values():
        raise ValueError(f"matmul: expects 2-D float16/bfloat16/float32 tensors of one dtype with matching inner "
                         f"dimensions; got a {tuple(a.shape)} {a.dtype} and b {tuple(b.shape)} {b.dtype}.")  # fmt: skip
    params = next(p for p, v in _FORMATS.items() if v == name)
    zero = np.zeros(1, np.int64)
    t0 = time.perf_counter()
    d = Device(a[None], b.T[None], zero, zero, bias, name)
    R, V, _, idx = d.run()  # ends with the undecided indices on the CPU: the device's work is done
    t1 = time.perf_counter()
    d.stats["device_seconds"], d.stats["exact_seconds"] = t1 - t0, 0.0
    if idx.shape[0]:
        def rows(X):  # the rows an exact element needs, to the CPU as float32 (exact), widened there
            return lambda t, r: X[0, torch.as_tensor(r, device=d.dev)].float().cpu().numpy().astype(np.float64)

        rows_a, rows_b = rows(d.A), rows(d.B)
        bn = None if bias is None else bias.double().cpu().numpy()
        vals = exact_elements(rows_a, rows_b, idx, bn, False, params)
        it = torch.as_tensor(idx, device=d.dev)
        R[it[:, 0], it[:, 1], it[:, 2]] = torch.from_numpy(vals).to(device=d.dev, dtype=R.dtype)
        d.stats["exact_seconds"] = time.perf_counter() - t1  # rows to the CPU, the exact path, values back
    return R[0], d.stats


def gemm(p, A3, Bt3, ia, ib, bias, want_mag, device, stats=None):
    """The device part of :func:`refkern.engines.filter.gemm` (``supports(p.work.params)``): the
    prepared float64 numpy operands go to ``device`` as float32 (exact: narrow values), the decided
    results come back once in the result format. (V (T, M, N) float64 numpy, decided where idx does
    not name it; magnitudes or None; idx (n, 3) the undecided (t, i, j), for the caller's exact path)."""
    torch = _torch()
    name = _FORMATS[tuple(p.work.params)]
    A = torch.from_numpy(_f32(A3)).to(device)
    B = torch.from_numpy(_f32(Bt3)).to(device)
    bt = None if bias is None else torch.from_numpy(np.array(bias, np.float64))  # a writable copy for torch
    d = Device(A, B, ia, ib, bt, name)
    R, _, mag, idx = d.run(want_mag)
    V = R.cpu().to(torch.float64).numpy()  # one copy back, in the result format; widened exactly
    if stats is not None:
        for key, v in d.stats.items():
            stats[key] = stats.get(key, 0) + v
    return V, (None if mag is None else mag.cpu().numpy()), idx


def _f32(x):
    """x (float64 numpy, narrow values) as float32, exactly: half the bytes to the device; astype keeps a
    transposed view's layout (torch takes its strides) unless a stride is negative."""
    y = x.astype(np.float32)
    return y if all(st >= 0 for st in y.strides) else np.ascontiguousarray(y)
