"""The BLAS engine: exact GEMM as Ozaki slice products on torch (any device), tiled, with the
Numba kernel for the rows and columns the slices cannot hold.

:func:`gemm` computes ``out[i, j] = bias[j] + sum_k A[i, k] Bt[j, k]``, each element the exact
sum rounded once to the result format, for float64 tensors holding the inputs' exact values:

1. **Bias.** The bias is one more term: a column ``c`` (a power of two near the rows' typical
   magnitude) is appended to A and ``bias / c`` to Bt, both exact (``c = 1`` if ``bias / c``
   would lose a bit).
2. **Plan.** Per row of A and of Bt, :func:`~refkern.engines.ozaki.slices_needed` at the
   width ``w = slice_width(K)`` (plain) or ``slice_width(K, karatsuba=True)``. The scheme and
   the dense counts (S_A, S_B) minimise the estimated cost: ``S_A S_B`` GEMMs (plain) or
   ``S (S + 1) / 2`` (Karatsuba, S_A = S_B = S), plus ``TAIL_COST`` GEMM rows per extra slice
   of a row (beyond the dense count) and slice of the other side, plus ``FALLBACK_COST`` GEMM
   rows per row left to Numba. The extra ("tail") slices of a row are multiplied restricted
   to their nonzero columns: only a row's smallest elements reach them.
3. **Fallback.** Rows needing more than ``MAX_SLICES`` slices or holding inf or NaN, and the
   same for columns, are zero in the slices; their outputs are then recomputed by the Numba
   kernel (:func:`refkern.engines.run_gemm`, on the CPU), which is exact on every input.
4. **Tiles.** Outputs in tiles of ``tm x tn``, K in chunks of ``tk`` (the digit planes are
   integers, so chunks add exactly; ``w`` follows from the whole K). The tile sizes halve
   until :func:`peak_bytes` fits ``memory`` (default ``MEMORY`` = 512 MiB).
   The products themselves: :func:`refkern.engines.ozaki.products`.
5. **Signed zeros.** An exactly zero sum is -0 only when every term is -0 (IEEE 754):
   counted exactly for the zero elements only, by one GEMM of 0/+-1 indicators.
"""

import numpy as np
import torch

from refkern.engines import ozaki
from refkern.engines._combine import add_plane, make_slices_cpu, round_planes
from refkern.kernels._element import row_stats as _row_bits

__all__ = ["gemm", "peak_bytes", "MEMORY", "MAX_SLICES", "FALLBACK_COST", "TAIL_COST"]

MEMORY = 1 << 29  # bytes of scratch per call, beyond the operands and the result
MAX_SLICES = 8  # per operand: rows spanning more than 8 w bits (>= 128 for K <= 2**20) fall back
FALLBACK_COST = {True: 6.0, False: 20.0}  # Numba exact / one float64 GEMM, narrow and float64 inputs
TAIL_COST = 1.2  # a row's tail slice against one slice of the other side, in GEMM rows (gathers cost)
ROUND_PLANES = {"numba": 2, "torch": 15}  # temporaries of the rounding per output element


def peak_bytes(tm: int, tn: int, tk: int, sa: int, sb: int, planes: int, combine: str = "numba") -> int:
    """Scratch bytes of one tile, all in 8-byte elements: the dense slices of A and Bt with
    three temporaries each (slicing; a Karatsuba sum), the int64 digit planes, the GEMM result
    and its int64 copy, and the rounding's temporaries (ROUND_PLANES per output element, and
    with torch a copy of the planes). The sparse tails come on top (a few % of a slice)."""
    per_out = planes + 2 + ROUND_PLANES[combine] + (planes + 1 if combine == "torch" else 0)
    return 8 * ((sa + 3) * tm * tk + (sb + 3) * tn * tk + tm * tn * per_out)


def _tiles(m, n, k, sa, sb, memory, combine, planes):
    tm, tn, tk = max(m, 1), max(n, 1), max(k, 1)
    while peak_bytes(tm, tn, tk, sa, sb, planes, combine) > memory:
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


def _plan(k, stats_a, stats_b, narrow, max_slices, karatsuba=None):
    """(karatsuba, w, S_A, S_B, need_a, need_b) of least estimated cost (module docstring);
    ``karatsuba`` True / False restricts the choice to that scheme."""
    best = None
    for kara in (False, True) if karatsuba is None else (karatsuba,):
        w = ozaki.slice_width(k, kara)
        need = []
        for E, low, fin in (stats_a, stats_b):
            need.append(ozaki.slices_needed(E, low, w).where(fin, max_slices + 1))
        hist = [torch.bincount(nd.clamp(0, max_slices + 1), minlength=max_slices + 2).cpu().tolist() for nd in need]
        rows = [max(nd.numel(), 1) for nd in need]
        fb = [hs[max_slices + 1] / r for hs, r in zip(hist, rows)]  # fraction left to Numba
        f = FALLBACK_COST[bool(narrow)]
        top = [max([q for q in range(max_slices + 1) if hs[q]] or [1]) for hs in hist]  # T_A, T_B
        for sa in range(1, max_slices + 1):
            for sb in range(1, max_slices + 1):
                if kara and sa != sb:
                    continue
                # tail pairs: each extra slice of a row of A against all T_B slices of B; each
                # extra slice of a row of B against the S_A dense slices of A
                xa = sum(hs * (q - sa) for q, hs in enumerate(hist[0][: max_slices + 1]) if q > sa) / rows[0]
                xb = sum(hs * (q - sb) for q, hs in enumerate(hist[1][: max_slices + 1]) if q > sb) / rows[1]
                gemms = sa * (sa + 1) / 2 if kara else sa * sb
                cost = gemms + TAIL_COST * (xa * max(top[1], sb) + xb * sa) + f * (fb[0] + fb[1])
                if best is None or cost < best[0]:
                    best = (cost, kara, w, sa, sb, need[0], need[1])
    return best[1:]


def _slice_rows(x, E, need, s, t, w, combine):
    """Dense slices (s, rows, K) of the rows needing <= t slices, and the tails of the rows
    needing more than s: [(q, R, C, T)], slice q >= s restricted to its nonzero rows R and
    columns C (T = slice q[R][:, C], dense and small: only the smallest elements reach it)."""
    dense = _slices(x, E, s, w, need <= s, combine)
    rows = ((need > s) & (need <= t)).nonzero().flatten()
    tails = []
    if rows.numel():
        full = _slices(x[rows], E[rows], t, w, torch.ones_like(rows, dtype=torch.bool), combine)
        dense[:, rows] = full[:s]
        for q in range(s, t):
            nz = full[q] != 0
            r = nz.any(1).nonzero().flatten()
            c = nz.any(0).nonzero().flatten()
            if r.numel():
                tails.append((q, rows[r], c, full[q][r][:, c]))
    return dense, tails


def _adder(planes, combine):
    """add(d, x, sign): planes[d] += sign * x (x: float64 integers below 2**53, exact)."""
    if combine == "numba":
        return lambda d, x, sign: add_plane(planes[d].numpy(), x.contiguous().numpy(), sign)
    return lambda d, x, sign: planes[d].add_(x.to(torch.int64), alpha=sign)


def gemm(A, Bt, bias, fmt, formats, fallback, *, memory=None, max_slices=None, combine=None, karatsuba=None):
    """``bias[j] + sum_k A[i, k] Bt[j, k]`` for every (i, j), exact, rounded once to ``fmt``.

    A (M, K), Bt (N, K), bias (N,) or None: float64 tensors on one device, holding the
    values of inputs in the ``formats`` (of A, Bt, bias) exactly. ``fallback(rows,
    cols)`` returns the exact result, as a float64 numpy array, for the index arrays
    ``rows`` of A and ``cols`` of Bt: the Numba kernel. Returns an (M, N) float64 tensor.
    ``combine`` ("numba" on the CPU, "torch") picks the slicing and rounding code;
    ``karatsuba`` (True / False) overrides the choice of the product scheme (tests).
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
    st_a = _stats(A, fa, memory, combine)
    if bias is not None:
        A, Bt, ec = _augment(A, Bt, bias, st_a[0])
        fz = formats[2]
        fa = (fa[0], min(fa[1], ec))  # the column c = 2**ec
        fb = (max(fb[0], fz.prec), min(fb[1], fz.emin - fz.prec + 1 - ec))  # and bias / c
        st_a = _stats(A, fa, memory, combine)
    st_b = _stats(Bt, fb, memory, combine)
    k = A.shape[1]
    kara, w, sa, sb, need_a, need_b = _plan(k, st_a, st_b, narrow, max_slices, karatsuba)
    E_a, E_b = st_a[0], st_b[0]
    keep_a, keep_b = need_a <= max_slices, need_b <= max_slices
    ta_max = int(need_a[keep_a].max()) if bool(keep_a.any()) else 1
    tb_max = int(need_b[keep_b].max()) if bool(keep_b.any()) else 1
    ta_max, tb_max = max(ta_max, sa), max(tb_max, sb)
    planes_n = ta_max + tb_max - 1
    tm, tn, tk = _tiles(m, n, k, sa, sb, memory, combine, planes_n)
    for i0 in range(0, m, tm):
        i1 = min(m, i0 + tm)
        for j0 in range(0, n, tn):
            j1 = min(n, j0 + tn)
            planes = torch.zeros((planes_n, i1 - i0, j1 - j0), dtype=torch.int64, device=A.device)
            add = _adder(planes, combine)
            for k0 in range(0, k, tk):
                k1 = min(k, k0 + tk)
                na, nb = need_a[i0:i1].where(keep_a[i0:i1], 0), need_b[j0:j1].where(keep_b[j0:j1], 0)
                s_a, t_a = _slice_rows(A[i0:i1, k0:k1], E_a[i0:i1], na, sa, ta_max, w, combine)
                s_b, t_b = _slice_rows(Bt[j0:j1, k0:k1], E_b[j0:j1], nb, sb, tb_max, w, combine)
                ozaki.products(s_a, s_b, t_a, t_b, planes, add, kara)
                del s_a, s_b, t_a, t_b
            if combine == "numba":
                v = torch.empty((i1 - i0, j1 - j0), dtype=torch.float64)
                zero = torch.empty((i1 - i0, j1 - j0), dtype=torch.bool)
                c = 2 - 2 * w  # plane d of (i, j) has weight 2**(E_i + F_j + c - d w)
                round_planes(planes.numpy(), E_a[i0:i1].numpy(), E_b[j0:j1].numpy(), c, w, *fmt.params,
                             v.numpy(), zero.numpy())  # fmt: skip
            else:
                e0 = E_a[i0:i1, None] + E_b[None, j0:j1] + 2 - 2 * w  # weight of digit plane 0
                v, zero = ozaki.round_digits(planes, e0, w, *fmt.params)
            del planes
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
    from refkern.engines import run_gemm

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
    """The BLAS engine on :func:`refkern.kernels._gemm_numba.matmul_operands`' prepared operands:
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
