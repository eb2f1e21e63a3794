"""The BLAS engine: exact GEMM as Ozaki slice products on torch (any device), tiled, with the
Numba kernel for the rows and columns the slices cannot hold.

:func:`gemm` computes ``out[i, j] = bias[j] + sum_k A[i, k] Bt[j, k]``, each element the exact
sum rounded once to the result format, for float64 tensors holding the inputs' exact values:

1. **Bias.** The bias is one more term: a column ``c`` (a power of two near the rows' typical
   magnitude) is appended to A and ``bias / c`` to Bt, both exact (``c = 1`` if ``bias / c``
   would lose a bit).
2. **Slice counts.** Per row of A and of Bt, :func:`~refkern.engines.ozaki.slices_needed`
   at the width ``w = slice_width(K)``. The counts (S_A, S_B) minimise the estimated cost
   ``S_A * S_B`` slice GEMMs plus ``FALLBACK_COST * (rows left out / M + columns left out / N)``
   (a row done by Numba costs that many GEMM rows), each at most ``MAX_SLICES``.
3. **Fallback.** Rows needing more than S_A slices, rows holding inf or NaN, and the same for
   columns, are zero in the slices; their outputs are then recomputed by the Numba kernel
   (:func:`refkern.kernels.gemm.run_gemm`, on the CPU), which is exact on every input.
4. **Tiles.** Outputs in tiles of ``tm x tn``, K in chunks of ``tk`` (the digit planes are
   integers, so chunks add exactly; ``w`` follows from the whole K). The tile sizes halve
   until :func:`peak_bytes` fits ``memory`` (default ``MEMORY`` = 512 MiB).
5. **Signed zeros.** An exactly zero sum is -0 only when every term is -0 (IEEE 754):
   counted exactly for the zero elements only, by one GEMM of 0/+-1 indicators.
"""

import numpy as np
import torch

from refkern.engines import ozaki
from refkern.engines._combine import make_slices_cpu, round_planes
from refkern.kernels._element import row_stats as _row_bits

__all__ = ["gemm", "peak_bytes", "MEMORY", "MAX_SLICES", "FALLBACK_COST"]

MEMORY = 1 << 29  # bytes of scratch per call, beyond the operands and the result
MAX_SLICES = 8  # per operand: rows spanning more than 8 w bits (>= 128 for K <= 2**20) fall back
FALLBACK_COST = {True: 6.0, False: 20.0}  # Numba exact / one float64 GEMM, narrow and float64 inputs
ROUND_PLANES = {"numba": 2, "torch": 16}  # temporaries of the rounding per output element


def peak_bytes(tm: int, tn: int, tk: int, sa: int, sb: int, combine: str = "numba") -> int:
    """Scratch bytes of one tile, all in 8-byte elements: the slices of A and Bt with two
    temporaries each (tm tk and tn tk), the float64 and int64 digit planes (2 (sa + sb - 1),
    one more int64 copy in the torch rounding), a conversion temporary, and the rounding's
    own temporaries (ROUND_PLANES per output element)."""
    digits = sa + sb - 1
    planes = 1 + 2 * digits + (digits + 1 if combine == "torch" else 0) + ROUND_PLANES[combine]
    return 8 * ((sa + 2) * tm * tk + (sb + 2) * tn * tk + tm * tn * planes)


def _tiles(m, n, k, sa, sb, memory, combine):
    tm, tn, tk = max(m, 1), max(n, 1), max(k, 1)
    while peak_bytes(tm, tn, tk, sa, sb, combine) > memory:
        cands = [(tk / 4, "k")] if tk > 256 else []  # K chunks cost nothing extra; keep them long
        cands += [(tm, "m")] if tm > 16 else []
        cands += [(tn, "n")] if tn > 16 else []
        if not cands:
            break
        axis = max(cands)[1]
        if axis == "k":
            tk = (tk + 1) // 2
        elif axis == "m":
            tm = (tm + 1) // 2
        else:
            tn = (tn + 1) // 2
    return tm, tn, tk


def _stats(x, fmt, memory, combine):
    """row_stats over row blocks and K chunks (bounded temporaries); fmt: (prec, quantum).
    With ``combine == "numba"`` (CPU), one Numba pass (max and min nonzero |bits| per row)."""
    rows, k = x.shape
    if combine == "numba" and x.is_contiguous() and rows and k:
        st = np.empty((rows, 2), np.int64)
        _row_bits(x.numpy(), st)
        st = torch.from_numpy(st)
        mx, mn = st[:, 0].view(torch.float64), st[:, 1].view(torch.float64)  # max, min nonzero |x|
        fin = torch.isfinite(mx)
        E = torch.frexp(mx.where(fin, 1.0))[1].to(torch.int64) - 1
        lo = torch.frexp(mn.where(torch.isfinite(mn), 1.0))[1].to(torch.int64) - fmt[0]
        low = torch.where(mx == 0, ozaki._NONE, lo.clamp(min=fmt[1]))
        return E.where(mx != 0, -ozaki._NONE), low, fin
    E = torch.full((rows,), -ozaki._NONE, dtype=torch.int64, device=x.device)
    low = torch.full((rows,), ozaki._NONE, dtype=torch.int64, device=x.device)
    fin = torch.ones(rows, dtype=torch.bool, device=x.device)
    tk = max(1, min(k, memory // (32 * max(rows, 1))))
    tr = max(1, min(rows, memory // (32 * tk)))  # ~4 float64 temporaries per element
    for r0 in range(0, rows, tr):
        for k0 in range(0, max(k, 1), tk):
            e, lo, f = ozaki.row_stats(x[r0 : r0 + tr, k0 : k0 + tk], *fmt)
            E[r0 : r0 + tr] = torch.maximum(E[r0 : r0 + tr], e)
            low[r0 : r0 + tr] = torch.minimum(low[r0 : r0 + tr], lo)
            fin[r0 : r0 + tr] &= f
    return E, low, fin


def _choose(need_a, need_b, narrow, max_slices):
    """(S_A, S_B) of least estimated cost (module docstring, step 2)."""
    m, n = max(need_a.numel(), 1), max(need_b.numel(), 1)
    ca = torch.bincount(need_a.clamp(0, max_slices + 1), minlength=max_slices + 2).cpu().tolist()
    cb = torch.bincount(need_b.clamp(0, max_slices + 1), minlength=max_slices + 2).cpu().tolist()
    over_a = [sum(ca[s + 1 :]) for s in range(max_slices + 1)]  # rows needing more than s slices
    over_b = [sum(cb[s + 1 :]) for s in range(max_slices + 1)]
    f = FALLBACK_COST[bool(narrow)]
    best = None
    for sa in range(1, max_slices + 1):
        for sb in range(1, max_slices + 1):
            cost = sa * sb + f * (over_a[sa] / m + over_b[sb] / n)
            if best is None or cost < best[0]:
                best = (cost, sa, sb)
    return best[1], best[2]


def _slices(x, E, s, w, keep, combine):
    """ozaki.make_slices, by the Numba kernel on the CPU (``combine == "numba"``)."""
    if combine != "numba":
        return ozaki.make_slices(x, E, s, w, keep)
    out = torch.empty((s, *x.shape), dtype=torch.float64)
    make_slices_cpu(x.contiguous().numpy(), (w - 1 - E.where(keep, 0)).numpy(), w, keep.numpy(), out.numpy())
    return out


def _neg_zero_count(a, bt):
    """Number of -0 products per element: a product is -0 when a factor is zero and the signs
    differ; count = #(signs differ) - #(both nonzero and signs differ), in one GEMM of 0/+-1
    entries over 4K terms (exact: every partial sum is an integer below 2**53)."""
    sa = torch.signbit(a).to(torch.float64)
    nza = (a != 0).to(torch.float64)
    sb = torch.signbit(bt).to(torch.float64)
    nzb = (bt != 0).to(torch.float64)
    x = torch.cat([sa, 1 - sa, -sa * nza, -(1 - sa) * nza], 1)
    y = torch.cat([1 - sb, sb, (1 - sb) * nzb, sb * nzb], 1)
    return x @ y.T


def _signed_zeros(v, zero, A, Bt, tk):
    """Set to -0 the exactly zero sums whose terms are all -0."""
    k = A.shape[1]
    if k == 0 or not bool(zero.any()):
        return
    rows = zero.any(1).nonzero().flatten()
    cols = zero.any(0).nonzero().flatten()
    count = torch.zeros((rows.numel(), cols.numel()), dtype=torch.float64, device=v.device)
    for k0 in range(0, k, tk):
        count += _neg_zero_count(A[rows, k0 : k0 + tk], Bt[cols, k0 : k0 + tk])
    sub = v[rows[:, None], cols[None, :]]
    neg = zero[rows[:, None], cols[None, :]] & (count == k)
    v[rows[:, None], cols[None, :]] = torch.where(neg, -0.0, sub)


def _augment(A, Bt, bias, E_a):
    """(A | c, Bt | bias / c, log2 c): the bias as the K+1-th term, c a power of two (exact)."""
    ok = E_a > -ozaki._NONE
    ec = int(E_a[ok].median()) if bool(ok.any()) else 0
    ec = max(-1000, min(1000, ec))
    c = 2.0**ec
    scaled = bias / c
    fin = torch.isfinite(bias)
    if not bool(((scaled * c == bias) | ~fin).all()):  # bias / c lost a bit: use c = 1
        ec, c, scaled = 0, 1.0, bias
    A1 = torch.cat([A, torch.full((A.shape[0], 1), c, dtype=A.dtype, device=A.device)], 1)
    return A1, torch.cat([Bt, scaled[:, None]], 1), ec


def gemm(A, Bt, bias, fmt, formats, fallback, *, memory=None, max_slices=None, combine=None):
    """``bias[j] + sum_k A[i, k] Bt[j, k]`` for every (i, j), exact, rounded once to ``fmt``.

    A (M, K), Bt (N, K), bias (N,) or None: float64 tensors on one device, holding the
    values of inputs in the ``formats`` (of A, Bt, bias) exactly. ``fallback(rows,
    cols)`` returns the exact result, as a float64 numpy array, for the index arrays
    ``rows`` of A and ``cols`` of Bt: the Numba kernel. Returns an (M, N) float64 tensor.
    """
    memory = MEMORY if memory is None else memory
    max_slices = MAX_SLICES if max_slices is None else max_slices
    if combine is None:
        combine = "numba" if A.device.type == "cpu" else "torch"
    m, n = A.shape[0], Bt.shape[0]
    out = torch.empty((m, n), dtype=torch.float64, device=A.device)
    if m == 0 or n == 0:
        return out
    narrow = max(formats[0].prec, formats[1].prec) <= 24
    fa = (formats[0].prec, formats[0].emin - formats[0].prec + 1)  # precision and smallest quantum
    fb = (formats[1].prec, formats[1].emin - formats[1].prec + 1)
    E_a, low_a, fin_a = _stats(A, fa, memory, combine)
    if bias is not None:
        A, Bt, ec = _augment(A, Bt, bias, E_a)
        fz = formats[2]
        fa = (fa[0], min(fa[1], ec))  # the column c = 2**ec
        fb = (max(fb[0], fz.prec), min(fb[1], fz.emin - fz.prec + 1 - ec))  # and bias / c
        E_a, low_a, fin_a = _stats(A, fa, memory, combine)
    E_b, low_b, fin_b = _stats(Bt, fb, memory, combine)
    k = A.shape[1]
    w = ozaki.slice_width(k)
    need_a = ozaki.slices_needed(E_a, low_a, w).where(fin_a, max_slices + 1)
    need_b = ozaki.slices_needed(E_b, low_b, w).where(fin_b, max_slices + 1)
    sa, sb = _choose(need_a, need_b, narrow, max_slices)
    keep_a, keep_b = need_a <= sa, need_b <= sb
    tm, tn, tk = _tiles(m, n, k, sa, sb, memory, combine)
    for i0 in range(0, m, tm):
        i1 = min(m, i0 + tm)
        for j0 in range(0, n, tn):
            j1 = min(n, j0 + tn)
            planes = torch.zeros((sa + sb - 1, i1 - i0, j1 - j0), dtype=torch.float64, device=A.device)
            digits = _LazyZeros(planes.shape, A.device)
            load = [0] * (sa + sb - 1)
            for k0 in range(0, k, tk):
                k1 = min(k, k0 + tk)
                s_a = _slices(A[i0:i1, k0:k1], E_a[i0:i1], sa, w, keep_a[i0:i1], combine)
                s_b = _slices(Bt[j0:j1, k0:k1], E_b[j0:j1], sb, w, keep_b[j0:j1], combine)
                ozaki.slice_products(s_a, s_b, planes, load, k1 - k0, w, digits)
                del s_a, s_b
            if combine == "numba":
                v = torch.empty((i1 - i0, j1 - j0), dtype=torch.float64)
                zero = torch.empty((i1 - i0, j1 - j0), dtype=torch.bool)
                c = 2 - 2 * w  # plane k of (i, j) has weight 2**(E_i + F_j + c - k w)
                g = digits.t if digits.t is not None else torch.zeros((1, 1, 1), dtype=torch.int64)
                round_planes(g.numpy(), planes.numpy(), digits.t is not None, E_a[i0:i1].numpy(),
                             E_b[j0:j1].numpy(), c, w, *fmt.params, v.numpy(), zero.numpy())  # fmt: skip
            else:
                g = planes.to(torch.int64) if digits.t is None else digits.t + planes.to(torch.int64)
                e0 = E_a[i0:i1, None] + E_b[None, j0:j1] + 2 - 2 * w  # weight of digit plane 0
                v, zero = ozaki.round_digits(g, e0, w, *fmt.params)
            del digits, planes
            zero &= keep_a[i0:i1, None] & keep_b[None, j0:j1]  # the others are recomputed below
            _signed_zeros(v, zero, A[i0:i1], Bt[j0:j1], tk)
            out[i0:i1, j0:j1] = v
    rows = (~keep_a).nonzero().flatten()
    cols = (~keep_b).nonzero().flatten()
    if rows.numel():
        out[rows] = torch.from_numpy(fallback(rows.cpu().numpy(), np.arange(n))).to(out.device)
    if cols.numel():
        out[:, cols] = torch.from_numpy(fallback(np.arange(m), cols.cpu().numpy())).to(out.device)
    return out


def _numba_fallback(p, A, Bt, bias):
    """fallback(rows, cols) for :func:`gemm`: the Numba kernel on those rows of A and of Bt."""
    from refkern.kernels.gemm import run_gemm

    zero = np.zeros(1, np.int64)

    def fallback(rows, cols):
        a = np.ascontiguousarray(A[rows])[None]
        bt = np.ascontiguousarray(Bt[cols])[None]
        b = None if bias is None else np.ascontiguousarray(bias[cols])
        return run_gemm(p, a, bt, zero, zero, b, (len(rows), len(cols)))[0]

    return fallback


def _tensor(x, dev):
    """A numpy array as a tensor on ``dev`` without a copy where possible (read-only arrays,
    which torch cannot share, are copied)."""
    return torch.from_numpy(x if x.flags.writeable else x.copy()).to(dev)


def run_batched(p, A3, Bt3, ia, ib, bias, out_shape, formats, device=None):
    """The BLAS engine on :func:`refkern.kernels.gemm.matmul_operands`' prepared operands:
    float64 numpy values of ``out_shape``, as ``run_gemm(...)[0]`` gives them. ``formats``:
    those of the inputs of A3, Bt3 and bias (None without bias)."""
    dev = torch.device("cpu") if device is None else device
    nb, m, n = len(ia), A3.shape[1], Bt3.shape[1]
    out = np.empty((nb, m, n))
    tb = None if bias is None else _tensor(bias, dev)
    for t in range(nb):
        a, bt = A3[ia[t]], Bt3[ib[t]]
        ta, tbt = _tensor(a, dev), _tensor(bt, dev)
        res = gemm(ta, tbt, tb, p.out, formats, _numba_fallback(p, a, bt, bias))
        out[t] = res.cpu().numpy()
    return out.reshape(out_shape)


def conv_chunk(n_img: int, patches: int, k: int, memory: int) -> int:
    """Images per im2col chunk: the unfolded patches and their row-major copy (2 x 8 bytes
    per patch element) take at most half of ``memory``; at least one image."""
    return max(1, min(n_img, (memory // 2) // max(1, 16 * patches * k)))


def run_conv(p, c, formats, device=None, memory=None):
    """The BLAS engine on :func:`refkern.kernels.conv.conv_operands`' prepared operands: per group
    and chunk of images, im2col (``torch.nn.functional.unfold``) then :func:`gemm` against the
    filters. Values as ``run_conv(...)[0]`` gives them. Peak scratch: ``memory`` for the GEMM
    plus at most ``memory / 2`` for the patches (:func:`conv_chunk`)."""
    memory = MEMORY if memory is None else memory
    dev = torch.device("cpu") if device is None else device
    X, W = _tensor(c.X, dev), _tensor(c.W, dev)
    n_img, c_in = X.shape[:2]
    c_out, cin_g, kh, kw = W.shape
    g = c.groups
    cout_g = c_out // g
    _, _, ho, wo = c.out_shape
    k = cin_g * kh * kw
    out = np.empty(c.out_shape)
    nb = conv_chunk(n_img, ho * wo, k, memory)
    for gi in range(g):
        Wg = W[gi * cout_g : (gi + 1) * cout_g].reshape(cout_g, k)
        Wn = np.ascontiguousarray(c.W[gi * cout_g : (gi + 1) * cout_g].reshape(cout_g, k))
        bn = None if c.bias is None else np.ascontiguousarray(c.bias[gi * cout_g : (gi + 1) * cout_g])
        bg = None if bn is None else torch.from_numpy(bn).to(dev)
        for n0 in range(0, n_img, nb):
            n1 = min(n_img, n0 + nb)
            xs = X[n0:n1, gi * cin_g : (gi + 1) * cin_g]
            cols = torch.nn.functional.unfold(xs, (kh, kw), dilation=c.dilation, stride=c.stride)  # (n, K, L)
            A = cols.transpose(1, 2).reshape(-1, k)  # one row per output pixel, K in W's (ci, ky, kx) order
            del cols
            fallback = _numba_fallback(p, _Lazy(A), Wn, bn)
            res = gemm(A, Wg, bg, p.out, formats, fallback, memory=memory)
            res = res.reshape(n1 - n0, ho, wo, cout_g).permute(0, 3, 1, 2)
            out[n0:n1, gi * cout_g : (gi + 1) * cout_g] = res.cpu().numpy()
    return c.result(out)


class _Lazy:
    """Rows of a tensor as numpy arrays on demand (the fallback rarely needs any)."""

    def __init__(self, t):
        self.t = t

    def __getitem__(self, rows):
        if len(rows) == self.t.shape[0] and bool((np.diff(rows) == 1).all()):
            return self.t.cpu().numpy()  # all rows (a fallback column): no gather
        return self.t[torch.as_tensor(rows, device=self.t.device)].cpu().numpy()


class _LazyZeros:
    """int64 digit planes, allocated (as zeros) on the first ``+=``: rarely needed at all."""

    def __init__(self, shape, device):
        self.shape, self.device, self.t = shape, device, None

    def __getitem__(self, d):
        if self.t is None:
            self.t = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        return self.t[d]

    def __setitem__(self, d, value):
        self.t[d] = value
