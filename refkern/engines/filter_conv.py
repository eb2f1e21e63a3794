"""The filtering engine's convolutions (:mod:`refkern.engines.filter`: one float64 GEMM, a rigorous
bound per element, the undecided elements exact): im2col in chunks of images (or, stride 1 on the CPU,
shifted products without it), at most ``MEMORY`` bytes of patches per chunk (twice with the
magnitudes: the patches' absolute values), see :func:`conv_chunk`; the transposed convolution as the
convolution of the stride-dilated input."""

import dataclasses

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.engines import filter as filt
from refkern.engines.filter import _Gemm

__all__ = ["conv", "conv_transpose", "conv_chunk", "MEMORY", "SHIFT_MIN"]

MEMORY = 1 << 28  # bytes of im2col patches per chunk of images
SHIFT_MIN = 4096  # output columns (images x Ho x Wp) of a chunk from which the shifted taps beat im2col
# Measured (process CPU ms, value / value and magnitudes, 3x3 stride 1, torch 2.13 CPU, 2 cores at
# load 13-15): shifted taps against im2col, 1 image 64ch 56x56 52/95 vs 41/67, 128ch 28x28 80/103 vs
# 43/77, 256ch 14x14 82/79 vs 19/32, 512ch 7x7 71/119 vs 24/44; 2 images 56x56 61/110 vs 60/125;
# 4 images 28x28 80/159 vs 100/217; 8 images 56x56 100/216 vs 258/422; 16 images 14x14 204/354 vs
# 185/316. A single image's nine tap GEMMs (K = C_in, one product of 64 x 3246 and less) run far
# below the BLAS's speed; a batch runs one GEMM per image and thread.


@jit(parallel=True)
def _im2col(X, n0, g, cin_g, kh, kw, sh, sw, dh, dw, ho, wo, cols):
    """cols[n - n0, y wo + x, (ci, ky, kx)] = X[n, g cin_g + ci, y sh + ky dh, x sw + kx dw] (X
    padded): one patch per row, in the Numba kernel's (ci, ky, kx) order of terms."""
    nc = cols.shape[0]
    for task in prange(nc * ho):
        n = task // ho
        y = task % ho
        for x in range(wo):
            row = cols[n, y * wo + x]
            q = 0
            for ci in range(cin_g):
                for ky in range(kh):
                    src = X[n0 + n, g * cin_g + ci, y * sh + ky * dh]
                    for kx in range(kw):
                        row[q] = src[x * sw + kx * dw]
                        q += 1


class _ShiftConv(_Gemm):
    """A stride-1 convolution of images n0:n1 and group ``gi`` without im2col: for each tap (ky, kx)
    one batched GEMM (torch ``baddbmm``, beta = 1) of the tap's filters against the padded input
    read at a shift of ``ky dh Wp + kx dw`` along its flattened (H, W) plane: output position
    y Wp + x of that product is the tap's term of output (y, x) (the columns x >= W_out wrap
    around and are dropped). Each element is still a float64 sum of its K exact products in some
    order (partial sums per tap added by the GEMMs' beta = 1), so the bound holds as for one GEMM.
    The patches' norms come from the per-pixel channel sums of squares, summed over the taps."""

    def __init__(self, p, c, gi, n0, n1, brow, has_bias):
        import torch

        n_img, c_out, ho, wo = c.out_shape
        cout_g = c_out // c.groups
        cin_g, kh, kw = c.W.shape[1:]
        hp, wp = c.X.shape[2:]
        self.torch, self.c, self.gi, self.n0 = torch, c, gi, n0
        self.ho, self.wo, self.wp, self.kh, self.kw = ho, wo, wp, kh, kw
        self.dh, self.dw = c.dilation
        self.cin_g, self.cout_g = cin_g, cout_g
        W2 = np.ascontiguousarray(c.W[gi * cout_g : (gi + 1) * cout_g].reshape(cout_g, -1))
        zero = np.zeros(n1 - n0, np.int64)
        super().__init__(p, W2[None], None, zero, np.arange(n1 - n0), brow, np.zeros(ho * wo), has_bias, None,
                         bias_rows=True)  # fmt: skip
        self.n = ho * wo
        # the padded input's planes flattened, a view: the last row's wrapped columns are not formed
        # (Lp = Ho Wp - (kw - 1) dw columns: the last valid one is (Ho - 1) Wp + Wo - 1), so the last
        # tap's read ends at Hp Wp
        self.flat = c.X[n0:n1, gi * cin_g : (gi + 1) * cin_g].reshape(n1 - n0, cin_g, hp * wp)
        self.lp = ho * wp - (kw - 1) * self.dw
        self.taps = [np.ascontiguousarray(c.W[gi * cout_g : (gi + 1) * cout_g, :, ky, kx])
                     for ky in range(kh) for kx in range(kw)]  # fmt: skip
        self.offs = [ky * self.dh * wp + kx * self.dw for ky in range(kh) for kx in range(kw)]

    def _shifted(self, flat, taps, rows=None):
        """sum over taps of taps[t][rows] @ flat[:, :, off_t : off_t + Lp], as (n, rows, Ho, Wo)."""
        torch = self.torch
        L = self.lp
        X = torch.from_numpy(flat)
        full = None
        for w, off in zip(taps, self.offs):
            wt = torch.from_numpy(w if rows is None else np.ascontiguousarray(w[rows]))
            wb = wt.expand(X.shape[0], *wt.shape)
            xs = X[:, :, off : off + L]
            full = torch.bmm(wb, xs) if full is None else full.baddbmm_(wb, xs)
        return self._valid(full.numpy())

    def _valid(self, full):
        """(..., Lp) positions y Wp + x -> (..., Ho, Wo), a strided view of the valid ones."""
        st = full.strides
        return np.lib.stride_tricks.as_strided(full, (*full.shape[:-1], self.ho, self.wo),
                                               (*st[:-1], st[-1] * self.wp, st[-1]), writeable=False)  # fmt: skip

    def value_gemm(self, V):
        V.reshape(V.shape[0], V.shape[1], self.ho, self.wo)[...] = self._shifted(self.flat, self.taps)

    def abs_gemm(self, t, i0, i1, out=None):
        r = self._shifted(np.abs(self.flat[t : t + 1]), [np.abs(w) for w in self.taps], slice(i0, i1))
        r = r.reshape(i1 - i0, self.ho * self.wo)
        if out is None:
            return r
        out[...] = r
        return out

    def mag_gemm(self, mag):
        """All images of the chunk in one batched product per tap: torch's bmm on a batch of one
        image ran 8x slower per image than on eight (measured: 0.77 s against 0.099 s for the
        (8, 64, 56, 56) x (64, 64, 3, 3) layer's nine taps, torch 2.13 CPU)."""
        r = self._shifted(np.abs(self.flat), [np.abs(w) for w in self.taps])
        mag.reshape(mag.shape[0], mag.shape[1], self.ho, self.wo)[...] = r

    def norms(self):
        q = np.einsum("nck,nck->nk", self.flat, self.flat)  # per pixel: sum over the group's channels
        L = self.lp
        s = sum(q[:, off : off + L] for off in self.offs)  # over the taps: every square once, any order
        s = self._valid(s).reshape(-1, self.ho * self.wo)
        return filt._norms(self.A), np.sqrt(s)

    def b_rows(self, t, idx):
        y, x = idx // self.wo, idx % self.wo
        ci = np.arange(self.cin_g)[None, :, None, None] + self.gi * self.cin_g
        ky = (np.arange(self.kh) * self.dh)[None, None, :, None]
        kx = (np.arange(self.kw) * self.dw)[None, None, None, :]
        X = self.c.X[self.n0 + t]
        patches = X[ci, y[:, None, None, None] + ky, x[:, None, None, None] + kx]
        return np.ascontiguousarray(patches.reshape(idx.size, -1))


def _has_torch():
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def conv_chunk(n_img: int, patches: int, k: int, memory: int) -> int:
    """Images per im2col chunk: ``8 * patches * K`` bytes each, at most ``memory`` per chunk; at
    least one image."""
    return max(1, min(n_img, memory // max(1, 8 * patches * k)))


def conv(p, c, want_mag=False, device=None, memory=None, stats=None):
    """:func:`refkern.kernels.conv.run_conv` by the filter (``applies(p)`` must hold): per group and
    chunk of images, im2col (patches as rows, :func:`_im2col`), one batched GEMM of the filters
    against the patches (``W_g @ cols^T``: the output's layout directly), the decision, and the
    exact path for the undecided elements. Stride 1 on the CPU with torch, at least two images and
    ``SHIFT_MIN`` output columns: no im2col (:class:`_ShiftConv`), ``memory`` bounds the tap products
    per chunk of images. Otherwise:
    at most ``memory`` (default ``MEMORY``) of patches per chunk, twice with ``want_mag``. The
    result and the magnitudes themselves come on top."""
    memory = MEMORY if memory is None else memory
    n_img, c_out, ho, wo = c.out_shape
    g_n = c.groups
    cout_g = c_out // g_n
    cin_g, kh, kw = c.W.shape[1:]
    k = cin_g * kh * kw
    L = ho * wo
    out = np.empty((n_img, c_out, L))
    mag = np.empty((n_img, c_out, L)) if want_mag else None
    has_bias = c.bias is not None
    cpu = device is None or getattr(device, "type", "cpu") == "cpu"
    shift = c.stride == (1, 1) and cpu and _has_torch() and n_img >= 2 and n_img * ho * c.X.shape[3] >= SHIFT_MIN
    if shift:  # the padded input's group copy and the product per image, not K x L patches
        hp, wp = c.X.shape[2:]
        nb = max(1, min(n_img, memory // max(1, 8 * 2 * cout_g * ho * wp)))
    else:
        nb = conv_chunk(n_img, L, k, memory)
    W2 = np.ascontiguousarray(c.W.reshape(c_out, k))
    for gi in range(g_n):
        Wg = W2[gi * cout_g : (gi + 1) * cout_g][None]
        brow = np.ascontiguousarray(c.bias[gi * cout_g : (gi + 1) * cout_g]) if has_bias else np.zeros(cout_g)
        for n0 in range(0, n_img, nb):
            n1 = min(n_img, n0 + nb)
            if shift:
                g = _ShiftConv(p, c, gi, n0, n1, brow, has_bias)
            else:
                cols = np.empty((n1 - n0, L, k))
                _im2col(c.X, n0, gi, cin_g, kh, kw, *c.stride, *c.dilation, ho, wo, cols)
                g = _Gemm(p, Wg, cols, np.zeros(n1 - n0, np.int64), np.arange(n1 - n0), brow, np.zeros(L), has_bias,
                          device, bias_rows=True)  # fmt: skip
            V = np.empty((n1 - n0, cout_g, L))
            M = np.empty((n1 - n0, cout_g, L)) if want_mag else None
            g.stats = stats
            g.values(V, M)
            out[n0:n1, gi * cout_g : (gi + 1) * cout_g] = V
            if want_mag:
                mag[n0:n1, gi * cout_g : (gi + 1) * cout_g] = M
            del g
    shape4 = (n_img, c_out, ho, wo)
    return c.result(out.reshape(shape4)), (c.result(mag.reshape(shape4)) if want_mag else None)


def conv_transpose(p, c, want_mag=False, device=None, memory=None):
    """:func:`refkern.kernels.conv_transpose.run_conv_transpose` by the filter (``applies(p)``): the
    transposed convolution as the convolution of the stride-dilated, padded input with the flipped,
    transposed weight (:mod:`refkern.kernels.conv_transpose`'s derivation), by :func:`conv`. The
    inserted zeros add exact zero products: every element's value is unchanged, and the bound counts
    all C_in / groups * kd * kh * kw terms (at least the element's own). Two things the zeros would
    change go to the Numba kernel (which forms only the products that reach an element): inputs
    holding inf or NaN (0 * inf is NaN), all of them; and the sign of an exactly zero result, per
    image holding one (the results that are zero are recomputed there). Memory: the dilated input
    (stride**nd times the input) besides :func:`conv`'s."""
    from refkern.kernels._convt_numba import run_convt_numba

    if not (np.isfinite(c.X).all() and np.isfinite(c.weight).all()):
        return run_convt_numba(p, c, want_mag)
    n_img, c_out = c.out_shape[:2]
    do = c.out_shape[2]
    cc = c.as_convolution()
    v, m = conv(p, cc, want_mag, device, memory)

    def five(x):
        return np.ascontiguousarray(x.reshape(n_img, do, c_out, *c.out_shape[3:]).transpose(0, 2, 1, 3, 4))

    v = five(v)
    m = five(m) if want_mag else None
    zero = (v == 0).reshape(n_img, -1).any(axis=1)
    for i in np.flatnonzero(zero):  # the sign of a zero: the products that reach it only
        ci = dataclasses.replace(c, X=c.X[i : i + 1], out_shape=(1, *c.out_shape[1:]), nd=3, unbatched=False)
        vi = run_convt_numba(p, ci)[0]
        z = v[i] == 0
        v[i][z] = vi[0][z]
    return c.result(v), (c.result(m) if want_mag else None)
