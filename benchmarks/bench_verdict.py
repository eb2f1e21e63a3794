"""Calibration of the verdict: a confusion matrix over ops, reduction lengths, data and truths.

    python benchmarks/bench_verdict.py [--quick] [--family all|gemm|envelope|backward|power|power-backward]
                                       [--json FILE] [--seeds N] [--markdown FILE] [--markdown-backward FILE]
                                       [--ops A,B] [--sizes N,M] [--dtypes D,E] [--jsonl FILE]
    python benchmarks/bench_verdict.py --summarize FILE.jsonl [FILE.jsonl ...] [--markdown FILE]
                                       [--markdown-backward FILE] [--json FILE]

The power families run in parts: ``--ops``, ``--sizes`` and ``--dtypes`` keep only those cases (the named
calls of their own, ``special``, run in a whole power run or when ``--ops`` names them), ``--jsonl`` appends each
case's rows to a file as soon as the case ends (a stopped run keeps what it measured), and ``--summarize``
builds from such files the summary, printed tables, markdown and JSON a whole run writes (a case measured in
several parts counts once: its last part's rows).

Every case is an output whose truth is known, judged by ``refkern.compare`` (gradients: by
``refkern.compare_backward``). Five families:

**gemm** (matmul, linear, conv2d; the statistical test):

* correct results: torch's own CPU kernels (fp32, and fp16/bf16 with 3-D inputs and
  non-contiguous operands), left-to-right and pairwise fp32 sums, split-K blocks summed in fp32,
  the reversed order, the float64 result rounded to fp32;
* reduced precisions: inputs rounded to tf32 (to nearest even, ties away, truncated), to bf16
  and fp16, autocast (bf16 and fp16 inputs and output), fp16/bf16 accumulation left-to-right,
  pairwise and in blocks of 32 (an order the verdict does not emulate), an fp32 computation
  handed over as float64;
* bugs: a dropped or doubled bias, a missing input channel or feature, a shifted output, an
  untransposed weight, a dropped tail of K, a wrong border, a whole channel off by a constant,
  one element and 1% of the elements off, noise on every element; alone and on top of a tf32
  or bf16 result. Each bug's size is measured as the largest |error| over the fp32 scale
  sqrt(n) u M of its element: >= 10 must be found, < 1 ("below the noise") must never be
  named a precision.

It prints the false-alarm rate, the detection rate of bugs >= 10x the scale, by K, the share
of reduced precisions named right, and writes JSON.

**envelope** (sum, mean, var, std, cumsum, layer/rms/group norm, batch_norm in training and
eval, avg/max/adaptive pools, and softmax, log_softmax, attention when
``refkern.analysis.envelope.OPS`` lists them; a deterministic test against worst-case
envelopes): reduction lengths 1 to 10^5; data randn, offset (mean 1e4, std 1), positive,
signed lognormal (14 decades), constant, tiny (around the dtype's smallest normal); fp32, fp16,
bf16, fp64; contiguous, transposed and strided inputs; every dim choice, keepdim and ``dtype=``.

* correct: torch's CPU kernels, torch in float64 (and float32 for half results) rounded,
  the two-pass norm in torch ops, and float32 algorithms in numpy: left-to-right, reversed,
  tree, blocked and Kahan sums; sum / n and sum times fl(1/n); two-pass, Welford and blocked
  Welford (Chan's merge) variances; blocked and Kahan scans; norms in direct, folded
  (x (r w) + (b - m r w)) and divided forms; softmax by division and by a reciprocal. Never
  ``mismatch`` nor ``reduced-precision``. (float32 variance algorithms on tiny data, whose
  squares underflow, are counted apart: the standard model leaves underflow out.)
* reduced: inputs rounded to bf16 / fp16 then computed by torch in fp32; fp32 computation
  handed over as float64. Named right (alone, or with precisions that fit alike: indistinguishable),
  named another precision, mismatch, or below the
  rounding envelope (indistinguishable: not a naming error); a reduced truth whose inputs overflow
  p (inf/NaN where the exact result is finite) is a mismatch by rule, counted apart.
* bugs: one-pass variance, eps 1e-3, eps outside the sqrt, biased/unbiased swapped, weight or
  bias dropped, wrong divisor, count_include_pad flipped, a pool window missing a tap or
  shifted, padding read as 0, floor-ended adaptive windows, a cumsum restarting per block, an
  exclusive scan, a dropped term, batch vs running statistics, a shifted output, one element
  moved by s x its envelope (s = 0.5 .. 10), 1% of elements by 3x, one element by 1e-3
  relative, noise of relative size 1e-6 .. 1e-2. Size = max |error| / envelope (the verdict's
  own ratio): >= 2 must be caught (the test is deterministic), below 1 cannot be.

It prints false alarms per op and dtype, the largest error / envelope any correct result used,
precision naming, power by bug kind, by terms per output and by dtype, the envelope's width in
ulps, and writes JSON (key ``envelope``).

**backward** (gradients, ``refkern.compare_backward``): linear (and a square one), matmul with a
broadcast batch, conv1d (padding; stride 2, dilation 2, groups 2), conv2d (padding 1; stride 2;
dilation 2 with groups 2; ``padding="same"`` with an even kernel), conv_transpose2d (stride 2,
output_padding 1), layer_norm, rms_norm, group_norm, batch_norm (training and eval), softmax,
log_softmax, avg/max/adaptive pools, scaled_dot_product_attention (causal and not), sum, mean, var,
std, cumsum; three reduction lengths per op (the terms per gradient element, as the report counts
them, are recorded); data randn, offset (mean 1e4), tiny, signed lognormal where sensible; fp32,
fp16, bf16 (fp64 for linear, matmul, conv2d, layer_norm, softmax, var); contiguous, transposed and
strided inputs (grad_output strided with them).

* correct: torch's CPU autograd gradients in the dtype, and float64 autograd rounded to it. Never
  ``mismatch`` nor ``reduced-precision``.
* reduced: fp32 gradients of linear/matmul/conv computed from operands and grad_output rounded to
  tf32, bf16, fp16 (named right or not).
* bugs: a batch element or one spatial position (2-D: one column, index W/2) missing from
  grad_weight's sum, the batch reduction as a mean, grad_bias over the wrong axis (or the batch axis
  not reduced), a missing scale (attention's dk/dq without the scale, the norms' grad_input without
  the 1/n of their mean terms, mean without 1/n, var without its 2, std by n, avg_pool without its
  divisor), softmax's row-sum term dropped, cumsum forward or exclusive, a gradient shifted by one
  position, a sign flipped on one channel, one element moved by s x its own yardstick (s = 0.5 ..
  30; the yardstick asked of the report: the element moved far until it dominates, max ratio /
  distance), noise of relative size 1e-6 .. 1e-2. A bug's size is the report's own ratio on the
  buggy gradient: ``max_bound_ratio`` for the ops judged by worst-case envelopes (must be caught
  from 2x), ``max_prob_ratio`` (max error over sqrt(n) u M + 2 u |ref|) for the statistical ones
  (must be caught from 10x), and from that multiple of the ratio the correct gradient itself
  reached where that is above 1 (torch's half-precision conv / matmul gradients reach 100-1000x the
  fp32 scale; those bugs are counted apart); below 1x nothing may be named a precision. For the
  statistical ops the size over the clean report's ``detectable`` element (median) is printed too:
  torch's half-precision kernels accumulate in the half format, far beyond the fp32 scale, and the
  report's model of them sets what it can see there.

It prints false alarms per op and dtype, the largest ratio a correct gradient used, precision
naming, power by size, by bug kind, by terms per element, by dtype and by op, the missed bugs and
false alarms with their case (``repro_backward(case, grad, truth, bug)`` prints the report), and
writes JSON (key ``backward``).

**power** (issue 24's calibration in absolute units; layer_norm, rms_norm, softmax, log_softmax,
scaled_dot_product_attention, sum, mean, var, cumsum; fp32, bf16, fp16; 64 to 8192 features, 64 to
8192 keys over (1, 2, 16, 64) queries, one row of 10^3 to 10^7 terms, scans of 4 rows of 10^3 to
10^6; randn data, and offset rows (mean 300, std 1) for the norms and var). A bug's size is its
largest |error| over the *spread of correct implementations*: the largest |out - exact| of any
correct kernel emulated on the same inputs (exact: refkern's result on float64 copies, in float64),
never the verdict's own envelope or scale.

* correct (never ``mismatch`` nor ``reduced-precision``): torch's CPU kernel; torch in float64
  rounded; (half) torch in float32 rounded once; the envelope family's float32 algorithms (rounded
  once to a half dtype); sums by 8 and 16 SIMD lanes in blocks; the two-pass folded norm; Hugging
  Face's RMSNorm (half: the normalised row rounded before the weight); online softmax over tiles of
  128; attention in float32 direct and online over tiles of 128 keys, (half) with P rounded to the
  dtype before P V (Hugging Face eager, FlashAttention 2). Sequential float32 sums of one-signed
  terms (offset data, var's squares) beyond 10^5 terms are left out (they drift: a bug of their own).
* bugs: torch's output plus a perturbation whose largest |value| is s x spread (s = 0.5 .. 32),
  rounded to the dtype (skipped where rounding swallows it): the whole tensor scaled by (1 + e), a
  constant offset, one row (norm or softmax row, query row, scan row) scaled, one feature offset or
  one head scaled (a scan: one row's tail offset), one element off; and the issue's named bugs at
  their natural size (x 1.1, x 1.01, w + 2 for w + 1, W for 1 + W, a dropped bias, the one-pass
  variance, a sequential float32 mean of 4e7 values, pytorch#188372's 11 for 3). Sizes >= 8x must be
  a mismatch; below 1x nothing may be named a precision.

It prints a table by op x dtype x size: false alarms, bugs >= 8x and 1-8x caught, below 1x named a
precision, the spread in ulps (median over elements of spread / ulp at the reference), torch's
report's ``detectable`` element (median ulps) and their ratio (the issue asks <= 8), the median
seconds per ``compare``; then every false alarm and miss with its case (``pw_case(op, n, data,
dtype, seed, scales)`` reproduces it), and writes JSON (key ``power``).

**power-backward** (the same calibration for the gradients, ``refkern.compare_backward``): softmax, log_softmax
(4 rows of 1024 to 8192 keys; float32 up to 4096), layer_norm, rms_norm (4 rows of 1024, 4096, 8192 features),
group_norm (4096, 8192 features per group), batch_norm in training (4096, 8192 elements per channel), avg_pool2d
(kernels 3 and 8, stride 1), mean, var, std (4 rows of 10^5, 10^6 terms), scaled_dot_product_attention (q, k, v;
16 queries over 64 to 1024 keys, float32 up to 256), and the GEMM adjoints of linear, matmul and conv2d (512 and
4096 terms in grad_weight's sums); fp32, bf16, fp16; randn, and offset rows (mean 300) for layer_norm, var and std.
Per gradient, the spread is the largest |grad - exact| over the correct implementations (exact: refkern.backward on
float64 copies; attention: torch's float64 autograd), in absolute units (the table gives it in ulps too: the median
over elements of spread / ulp(exact)).

* correct (never ``mismatch``, nor a reduced precision other than the half running sum torch's CPU norms keep for
  grad_weight / grad_bias, which the verdict may name): torch's CPU autograd; torch's float64 (and, for half
  results, float32) autograd rounded once; float32 emulations rounded once: softmax from the stored output (or an
  online-softmax forward), D summed pairwise, left to right, in blocks or by 8 lanes, ``y (g - D)`` and ``y g - y D``;
  norms with two-pass, Welford-block and left-to-right statistics, the centred and torch's raw ``r gw + b x + c``
  form, parameter sums in several orders, mean and rstd stored in the half dtype (torch's CPU layer, group and
  batch norms), S and C too (torch's half batch_norm), Hugging Face's RMSNorm through autograd; the pool's taps in
  order and reversed, ``g / d`` and ``g fl(1 / d)``, added into the half gradient; var and std with the mean summed
  several ways and stored in the dtype; attention in the math order (Delta = rowsum(P dP) or rowsum(dO O)) and
  FlashAttention 2's backward (P recomputed per tile of 128 keys from the log-sum-exp, dQ accumulated over tiles,
  P and dS rounded to the dtype before their products); the GEMMs by sgemm, split-K blocks of 256 and sequential
  rank-1 updates. Sequential sums of offset data beyond 10^5 terms are left out (as in the power family).
* bugs: a correct gradient (torch's, or torch's float32 autograd rounded where torch keeps a half running sum) plus a
  perturbation of s x spread (s = 0.5, 1, 2, 4, 8, 16, 64): the whole gradient scaled, a constant offset, one row /
  sample / query or key row / batch scaled, one column / channel offset, one head or output channel scaled, one
  element off; and the dropped terms at their natural size (softmax's D, the norms' mean term, their xhat term and
  the 1/n of both, grad_weight without xhat, a batch element missing from a parameter's sum, attention's Delta and
  scale, the divisor, 1/n, 2 or n - 1, the gradient x 1.1).

It prints per family x gradient x dtype x size the false alarms, bugs >= 8x and 1-8x caught, below 1x named a
precision, the named bugs caught, the spread in ulps, the base gradient's report's ``detectable`` element (median
ulps; the GEMMs' absolute figure over each element's ulp) and its ratio to the spread, then every false alarm and
miss (``pb_case(family, n, data, dtype, seed, scales)`` reproduces it), and writes JSON (key ``power_backward``).
"""

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import refkern as rk
from refkern.accumulate.formats import BFLOAT16, FLOAT16, TFLOAT32, round_array
from refkern.analysis.noise_store import GRAIN

KS = (9, 27, 72, 288, 1152, 4608)
DATA = ("randn", "cancelling", "positive", "wide")
OPS = ("linear", "conv2d", "matmul")
U32 = 2.0**-24


def _gen(*key):
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return g


def _rnd(g, *shape):
    return torch.randn(*shape, generator=g)


def inputs(op, k, data, seed):
    """(args, kwargs) of a call with reduction length k (conv2d: 3x3 taps, k / 9 input channels)."""
    g = _gen(op, k, data, seed)
    if op == "conv2d":
        c = max(1, k // 9)
        x, w, b = _rnd(g, 2, c, 8, 8), _rnd(g, 8, c, 3, 3), _rnd(g, 8)
    elif op == "linear":
        x, w, b = _rnd(g, 16, k), _rnd(g, 24, k), _rnd(g, 24)
    else:
        x, w, b = _rnd(g, 2, 8, k), _rnd(g, k, 12), None
    red = 1 if op == "conv2d" else (x.ndim - 1)
    if data == "positive":  # post-ReLU activations times positive weights: every term >= 0
        x, w = torch.relu(x), w.abs()
        b = b.abs() if b is not None else None
    elif data == "wide":  # exponents spread over 2**-20 .. 2**20
        x = x * torch.exp2(torch.randint(-20, 21, x.shape, generator=g).float())
        w = w * torch.exp2(torch.randint(-20, 21, w.shape, generator=g).float())
    elif data == "cancelling":  # half of the terms cancel the other half to 1e-3: outputs near 0
        h = x.shape[red] // 2
        if h:
            xs = list(x.unbind(red))
            for i in range(h):
                xs[h + i] = xs[i]
            x = torch.stack(xs, red)
            wdim = 1 if op in ("conv2d", "linear") else 0
            ws = list(w.unbind(wdim))
            for i in range(h):
                ws[h + i] = -ws[i] * (1 + 1e-3 * torch.randn(ws[i].shape, generator=g))
            w = torch.stack(ws, wdim)
    if op == "conv2d":
        return (x, w, b), {"padding": 1}
    if op == "linear":
        return (x, w, b), {}
    return (x, w), {}


def _torch_fn(op):
    return {"conv2d": F.conv2d, "linear": F.linear, "matmul": torch.matmul}[op]


def _round(t, fmt, mode):
    return torch.from_numpy(round_array(t.double().numpy(), *fmt.params, mode)).to(t.dtype)


def _rk(op, args, kw, **acc):
    return getattr(rk, op)(*args, **kw, **acc)


def _split_k(op, args, kw, block, dtype):
    """The reduction in blocks of ``block`` terms (fp32 torch kernels), block sums added in ``dtype``."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = x.shape[1] if op == "conv2d" else x.shape[-1]
    out = None
    for s in range(0, k, block):
        if op == "conv2d":
            part = F.conv2d(x[:, s : s + block], w[:, s : s + block], None, **kw)
        elif op == "linear":
            part = F.linear(x[..., s : s + block], w[..., s : s + block])
        else:
            part = torch.matmul(x[..., s : s + block], w[s : s + block])
        part = part.to(dtype)
        out = part if out is None else (out + part)
    if b is not None:
        out = out + (b.to(dtype)[:, None, None] if op == "conv2d" else b.to(dtype))
    return out


def _flip(op, args):
    """The same linear / matmul with the reduction order reversed."""
    x, w = args[0], args[1]
    if op == "linear":
        return (x.flip(-1), w.flip(-1), *args[2:])
    return (x.flip(-1), w.flip(0))


def correct_outputs(op, args, kw):
    """Correct fp32 results in several orders: (name, output)."""
    fn = _torch_fn(op)
    out = [("torch fp32", fn(*args, **kw))]
    out.append(("left-to-right fp32", _rk(op, args, kw, accumulate="naive", accum_dtype="float32")))
    out.append(("pairwise fp32", _rk(op, args, kw, accumulate="pairwise", accum_dtype="float32")))
    out.append(("split-K 64, fp32", _split_k(op, args, kw, 64, torch.float32)))
    if op != "conv2d":
        out.append(("reversed order", fn(*_flip(op, args), **kw)))
    dbl = fn(*[a.double() if a is not None else None for a in args], **kw)
    out.append(("fp64 rounded", dbl.float()))
    return out


def reduced_outputs(op, args, kw, data):
    """(precision, name, output): results of a reduced-precision computation."""
    fn = _torch_fn(op)
    x, w = args[0], args[1]
    rest = args[2:]
    out = []
    for mode, tag in ((0, "nearest"), (2, "ties away"), (1, "truncated")):
        xr, wr = _round(x, TFLOAT32, mode), _round(w, TFLOAT32, mode)
        out.append(("tf32", f"tf32 inputs ({tag})", fn(xr, wr, *rest, **kw)))
    if data != "wide":
        out.append(("fp16", "fp16 inputs", fn(x.half().float(), w.half().float(), *rest, **kw)))
    out.append(("bf16", "bf16 inputs", fn(x.bfloat16().float(), w.bfloat16().float(), *rest, **kw)))
    out.append(("bf16", "bf16 inputs (truncated)", fn(_round(x, BFLOAT16, 1), _round(w, BFLOAT16, 1), *rest, **kw)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out.append(("bf16", "autocast bf16", fn(*args, **kw).float()))
    if data != "wide":
        halves = [a.half() if a is not None else None for a in args]
        out.append(("fp16", "fp16 cast in and out", fn(*halves, **kw).float()))
    k = x.shape[1] * 9 if op == "conv2d" else x.shape[-1]
    for acc in ("float16", "bfloat16"):
        if acc == "float16" and data == "wide":
            continue  # fp16 accumulation overflows there: no precision explains inf
        short = "fp16" if acc == "float16" else "bf16"
        for order, tag in (("naive", "left-to-right"), ("pairwise", "pairwise")):
            out.append((short, f"{short} accumulation, {tag}", _rk(op, args, kw, accumulate=order, accum_dtype=acc)))
        if k >= 64:
            out.append((short, f"{short} accumulation, blocks of 32", _split_k_rk(op, args, kw, 32, acc)))
    dargs = [a.double() if a is not None else None for a in args]
    out.append(("fp32", "fp32 computation as float64", (dargs, fn(*args, **kw).double())))
    return out


def _split_k_rk(op, args, kw, block, acc):
    """fp16/bf16 accumulation in blocks: each block left-to-right in ``acc``, the block sums added in ``acc``."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    k = x.shape[1] if op == "conv2d" else x.shape[-1]
    fmt = FLOAT16 if acc == "float16" else BFLOAT16
    out = None
    for s in range(0, k, block):
        if op == "conv2d":
            part = rk.conv2d(x[:, s : s + block], w[:, s : s + block], None, **kw, accumulate="naive", accum_dtype=acc)
        elif op == "linear":
            part = rk.linear(x[..., s : s + block], w[..., s : s + block], accumulate="naive", accum_dtype=acc)
        else:
            part = rk.matmul(x[..., s : s + block], w[s : s + block], accumulate="naive", accum_dtype=acc)
        out = part if out is None else _round(out + part, fmt, 0)
    if b is not None:
        out = _round(out + (b[:, None, None] if op == "conv2d" else b), fmt, 0)
    return out


def bugs(op, args, kw, good, scale, seed):
    """(name, output): a bug injected into the result ``good`` of a kernel fed ``args``."""
    fn = _torch_fn(op)
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    g = _gen("bug", op, seed)
    out = []
    if b is not None:
        out.append(("bias dropped", fn(x, w, None, **kw)))
        out.append(("bias added twice", fn(x, w, 2 * b, **kw)))
    if op == "conv2d":
        c = x.shape[1]
        if c > 1:
            x0 = x.clone()
            x0[:, c // 2] = 0
            out.append(("input channel missing", fn(x0, w, b, **kw)))
        w0 = w.clone()
        w0[:, :, 1, 2] = 0
        out.append(("kernel tap missing", fn(x, w0, b, **kw)))
        bad = good.clone()  # the last column padded by replicating the border instead of zeros
        bad[..., -1] = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, b)[..., -1]
        out.append(("wrong border column", bad))
        ch = good.clone()
        ch[:, 3] += 30 * float(scale[:, 3].median())
        out.append(("one channel off by 30x scale", ch))
        out.append(("shifted by one column", torch.roll(good, 1, dims=3)))
    else:
        k = x.shape[-1]
        x0 = x.clone()
        x0[..., k // 3] = 0
        out.append(("input feature zeroed", fn(x0, w, *args[2:], **kw)))
        if op == "linear":
            ch = good.clone()
            ch[..., 5] += 30 * float(scale[..., 5].median())
            out.append(("one output feature off by 30x scale", ch))
        out.append(("shifted by one", torch.roll(good, 1, dims=-1)))
        if op == "linear" and w.shape[0] == w.shape[1]:
            out.append(("untransposed weight", x @ w + b))
    kk = x.shape[1] if op == "conv2d" else x.shape[-1]
    tail = max(1, kk // 16)
    if kk > 1:
        if op == "conv2d":
            out.append(("last K/16 channels dropped", fn(x[:, : kk - tail], w[:, : kk - tail], b, **kw)))
        elif op == "linear":
            out.append(("last K/16 terms dropped", fn(x[..., : kk - tail], w[..., : kk - tail], b)))
        else:
            out.append(("last K/16 terms dropped", fn(x[..., : kk - tail], w[: kk - tail])))
    flat = good.reshape(-1)
    sc = scale.reshape(-1)
    one = flat.clone()
    i = int(torch.randint(0, flat.numel(), (1,), generator=g))
    one[i] += 10.5 * float(sc[i]) * (1 if i % 2 else -1)
    out.append(("one element off by 10.5x scale", one.reshape(good.shape)))
    some = flat.clone()
    idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 100)]
    some[idx] += 12 * sc[idx].float() * torch.sign(torch.randn(len(idx), generator=g))
    out.append(("1% of elements off by 12x scale", some.reshape(good.shape)))
    noise = flat + 0.5 * sc.float() * torch.sign(torch.randn(flat.numel(), generator=g))
    out.append(("every element off by 0.5x scale", noise.reshape(good.shape)))
    return out


def judge(op, args, kw, out):
    t = time.perf_counter()
    rep = rk.compare(out, op, *args, **kw)
    return rep, time.perf_counter() - t


def scale_of(op, args, kw):
    el = rk.analysis.compare.elements(rk.__dict__[op](*args, **kw), op, *args, **kw)
    n = el["report"].n_terms
    return torch.from_numpy(np.sqrt(n) * U32 * el["magnitude"]), el["reference"]


def _bug_size(out, good_ref, scale):
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(out.double().numpy() - good_ref) / np.maximum(scale.numpy(), 1e-300)
    r = np.where(np.isnan(r), np.inf, r)
    return float(r.max())


def half_cases(op, k, seed):
    """Correct fp16/bf16 results of torch's CPU kernels: 3-D inputs, non-contiguous operands."""
    out = []
    (args, kw) = inputs(op, k, "randn", seed)
    for dt in (torch.float16, torch.bfloat16):
        a = [t.to(dt) if t is not None else None for t in args]
        if op == "linear":
            x3 = a[0].reshape(2, 8, -1)
            bias_nc = torch.stack([a[2], a[2]], 1)[:, 0]  # a non-contiguous bias: matmul, then add_
            res = F.linear(x3, a[1], bias_nc)
            out.append((f"torch {dt} 3-D input, strided bias", res, (x3, a[1], bias_nc), {}))
            wt = a[1].t().contiguous().t()  # a transposed-layout weight
            out.append((f"torch {dt} transposed weight layout", F.linear(a[0], wt, a[2]), (a[0], wt, a[2]), {}))
        elif op == "conv2d":
            xc = a[0].to(memory_format=torch.channels_last)
            out.append((f"torch {dt} channels_last", F.conv2d(xc, a[1], a[2], **kw), (xc, a[1], a[2]), kw))
        else:
            bt = a[1].t().contiguous().t()
            out.append((f"torch {dt} strided", torch.matmul(a[0], bt), (a[0], bt), {}))
    return out


def run(quick=False, seeds=1, ks=KS, ops=OPS, data=DATA, log=print):
    rows = []
    for op in ops:
        for k in ks:
            if quick and op == "conv2d" and k > 1152:
                continue
            for d in data:
                for seed in range(seeds):
                    args, kw = inputs(op, k, d, seed)
                    scale, ref = scale_of(op, args, kw)
                    for name, out in correct_outputs(op, args, kw):
                        rep, s = judge(op, args, kw, out)
                        rows.append(
                            dict(
                                op=op,
                                k=k,
                                data=d,
                                truth="correct",
                                name=name,
                                verdict=rep.verdict,
                                precision=rep.precision,
                                alternatives=rep.alternatives,
                                seconds=s,
                            )
                        )
                    if d == "randn":
                        for name, out, a2, kw2 in half_cases(op, k, seed):
                            rep, s = judge(op, a2, kw2, out)
                            rows.append(
                                dict(
                                    op=op,
                                    k=k,
                                    data=d,
                                    truth="correct",
                                    name=name,
                                    verdict=rep.verdict,
                                    precision=rep.precision,
                                    alternatives=rep.alternatives,
                                    seconds=s,
                                )
                            )
                    for prec, name, out in reduced_outputs(op, args, kw, d):
                        a2 = args
                        if isinstance(out, tuple):
                            a2, out = out
                        rep, s = judge(op, a2, kw, out)
                        rows.append(
                            dict(
                                op=op,
                                k=k,
                                data=d,
                                truth=f"reduced:{prec}",
                                name=name,
                                verdict=rep.verdict,
                                precision=rep.precision,
                                alternatives=rep.alternatives,
                                seconds=s,
                            )
                        )
                    good = _torch_fn(op)(*args, **kw)
                    bases = [("fp32", good, ref, scale, args)]
                    if not quick:
                        for prec, fmt in (("tf32", TFLOAT32), ("bf16", BFLOAT16)):
                            ra = [_round(a, fmt, 0) if a is not None and i < 2 else a for i, a in enumerate(args)]
                            bo = _torch_fn(op)(*ra, **kw)
                            bases.append((prec, bo, bo.double().numpy(), scale, ra))
                    for prec, base, bref, sc, bargs in bases:  # a bug in a kernel fed the base's own inputs
                        for name, out in bugs(op, bargs, kw, base, sc, seed):
                            size = _bug_size(out, bref, sc)
                            rep, s = judge(op, args, kw, out)
                            rows.append(
                                dict(
                                    op=op,
                                    k=k,
                                    data=d,
                                    truth=f"bug:{prec}",
                                    name=name,
                                    size=size,
                                    verdict=rep.verdict,
                                    precision=rep.precision,
                                    alternatives=rep.alternatives,
                                    seconds=s,
                                )
                            )
                    log(f"{op} K={k} {d}: {len(rows)} cases so far")
    return rows


def summarise(rows) -> dict:
    correct = [r for r in rows if r["truth"] == "correct"]
    false_alarms = [r for r in correct if r["verdict"] not in ("exact", "rounding")]
    reduced = [r for r in rows if r["truth"].startswith("reduced:")]
    named = [
        r
        for r in reduced
        if r["verdict"] == "reduced-precision"
        and (r["precision"] == r["truth"][8:] or r["truth"][8:] in r["alternatives"])
    ]
    big = [r for r in rows if r["truth"].startswith("bug") and r["size"] >= 10]
    caught = [r for r in big if r["verdict"] == "mismatch"]
    small = [r for r in rows if r["truth"].startswith("bug") and r["size"] < 1]
    # below the noise a bug may go unseen, but it is never named a precision the computation did not use
    small_named = [
        r
        for r in small
        if r["verdict"] == "reduced-precision" and r["truth"][4:] not in [r["precision"], *r["alternatives"]]
    ]
    mid = [r for r in rows if r["truth"].startswith("bug") and 1 <= r["size"] < 10]
    by_k = {}
    for r in big:
        e = by_k.setdefault(r["k"], [0, 0])
        e[0] += r["verdict"] == "mismatch"
        e[1] += 1
    return {
        "cases": len(rows),
        "false_alarms": len(false_alarms),
        "correct": len(correct),
        "false_alarm_rate": len(false_alarms) / max(len(correct), 1),
        "named_right": len(named),
        "reduced": len(reduced),
        "named_rate": len(named) / max(len(reduced), 1),
        "bugs_ge_10x": len(big),
        "caught": len(caught),
        "detection_rate": len(caught) / max(len(big), 1),
        "detection_by_k": {str(k): f"{c}/{n}" for k, (c, n) in sorted(by_k.items())},
        "bugs_1_to_10x": len(mid),
        "caught_1_to_10x": sum(r["verdict"] == "mismatch" for r in mid),
        "bugs_below_noise": len(small),
        "below_noise_named_a_precision": len(small_named),
        "median_seconds": float(np.median([r["seconds"] for r in rows])) if rows else 0.0,
        "false_alarm_cases": false_alarms[:20],
        "missed": [r for r in big if r["verdict"] != "mismatch"][:40],
        "misnamed": [r for r in reduced if r not in named][:40],
        "below_noise_named": small_named[:20],
    }


# ============================================================================ the envelope family
#
# sum, mean, var, std, cumsum, the norms and the pools (softmax, log_softmax and attention once
# refkern.analysis.envelope lists them) are judged by worst-case envelopes: per element, a bound
# on |computed - exact| that holds for every correct implementation. The test is deterministic
# (threshold 1): a correct result must never leave the envelope, and a bug whose largest error is
# above it must be a mismatch unless a reduced precision's own (sharp) envelope explains it.

ENV_LENGTHS = (1, 2, 3, 7, 64, 1000, 10_000, 100_000)
ENV_LENGTHS_QUICK = (1, 7, 1000, 100_000)
ENV_DATA = ("randn", "offset", "positive", "lognormal", "constant", "tiny")
ENV_DATA_QUICK = ("randn", "offset", "lognormal", "constant", "tiny")
ENV_DTYPES = ("float32", "float16", "bfloat16", "float64")
ENV_LAYOUTS = ("contiguous", "transposed", "strided")
ENV_ROW_OPS = (
    "sum",
    "mean",
    "var",
    "std",
    "cumsum",
    "layer_norm",
    "rms_norm",
    "group_norm",
    "batch_norm[train]",
    "batch_norm[eval]",
)
ENV_LATE_OPS = ("softmax", "log_softmax", "scaled_dot_product_attention")  # judged once envelope.OPS lists them
ENV_SCALES = (0.5, 0.9, 1.1, 1.5, 2.0, 3.0, 10.0)  # one element moved by s x its envelope
ENV_SCALES_QUICK = (0.5, 1.5, 3.0)
QUICK_SKIP = {
    "reversed fp32",
    "blocks of 128 fp32",
    "tree fp32 / n",
    "two-pass left-to-right fp32",
    "Welford fp32",
    "two-pass left-to-right, divide fp32",
    "given, divide fp32",
}
CAP = 1 << 16  # elements per input (at least one row)
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
F32 = np.float32
NORMS = ("layer_norm", "rms_norm", "group_norm", "batch_norm[train]", "batch_norm[eval]")
UNDERFLOWS = ("var", "std", "layer_norm", "rms_norm", "group_norm", "batch_norm")

# pools: (op, input shape, kwargs); the terms per output come from the report
POOLS = (
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=1)),
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=2)),
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=3, stride=2, padding=1)),
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True)),
    ("avg_pool1d", (2, 3, 50), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True, count_include_pad=False)),
    ("avg_pool1d", (1, 2, 4096), dict(kernel_size=1024, stride=512)),
    ("avg_pool2d", (2, 3, 12, 17), dict(kernel_size=2)),
    ("avg_pool2d", (2, 3, 12, 17), dict(kernel_size=3, stride=2, padding=1)),
    ("avg_pool2d", (2, 3, 12, 17), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool2d", (2, 3, 12, 17), dict(kernel_size=(3, 5), stride=(1, 2), padding=(1, 2), ceil_mode=True)),
    ("avg_pool2d", (2, 3, 12, 17), dict(kernel_size=3, padding=1, divisor_override=5)),
    ("avg_pool2d", (1, 4, 56, 56), dict(kernel_size=56)),
    ("max_pool1d", (2, 3, 50), dict(kernel_size=2)),
    ("max_pool1d", (2, 3, 50), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool1d", (2, 3, 50), dict(kernel_size=3, stride=1, padding=1, dilation=2)),
    ("max_pool1d", (2, 3, 50), dict(kernel_size=4, stride=3, ceil_mode=True)),
    ("max_pool2d", (2, 3, 12, 17), dict(kernel_size=2)),
    ("max_pool2d", (2, 3, 12, 17), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool2d", (2, 3, 12, 17), dict(kernel_size=(2, 3), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True)),
    ("adaptive_avg_pool1d", (2, 3, 50), dict(output_size=7)),
    ("adaptive_avg_pool1d", (2, 3, 50), dict(output_size=1)),
    ("adaptive_avg_pool1d", (1, 2, 10_000), dict(output_size=3)),
    ("adaptive_avg_pool2d", (2, 3, 12, 17), dict(output_size=(5, 7))),
    ("adaptive_avg_pool2d", (1, 8, 7, 7), dict(output_size=1)),
)
POOLS_QUICK = (2, 5, 6, 9, 10, 12, 14, 16, 19, 20, 22, 23)


def env_ops():
    """The row ops, and softmax, log_softmax and attention if refkern judges them by envelopes."""
    from refkern.analysis.envelope import OPS as env_ops_listed

    return ENV_ROW_OPS + tuple(o for o in ENV_LATE_OPS if o in env_ops_listed)


def _rk_name(op):
    return op.split("[")[0]


def _values(shape, data, dt, g):
    """A data regime's values, drawn in float64 and converted to ``dt``."""
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    if data == "offset":  # mean 1e4, std 1: the cancellation a one-pass variance loses
        t = t + 1e4
    elif data == "positive":
        t = t.abs()
    elif data == "lognormal":  # signed, |x| = e^(s N(0, 1)): 7 decades either side at 4 sigma (fp16: 3.5)
        s = 2.0 if dt == torch.float16 else 4.0
        t = torch.sign(t) * torch.exp(s * torch.randn(shape, generator=g, dtype=torch.float64))
    elif data == "constant":  # zero variance (0.3 is inexact: the mean itself rounds)
        t = torch.full(shape, 0.3, dtype=torch.float64)
    elif data == "tiny":  # around the smallest normal of the dtype: most of them subnormal
        t = t * torch.finfo(dt).tiny
    return t.to(dt)


def _laid_out(shape, layout, make):
    """``make(shape)`` as an input of ``shape``: contiguous, transposed (every axis reversed in memory) or
    strided (every other element of the last axis)."""
    if layout == "transposed" and len(shape) > 1:
        return make(shape[::-1]).permute(*range(len(shape) - 1, -1, -1))
    if layout == "strided":
        return make((*shape[:-1], 2 * shape[-1]))[..., ::2]
    return make(shape)


def _tensor(shape, layout, data, dt, g):
    return _laid_out(shape, layout, lambda s: _values(s, data, dt, g))


def env_call(op, n, data, dtype, layout, seed):
    """(args, kwargs) of one call of ``op`` whose outputs each reduce ``n`` values, or None."""
    dt = DT[dtype]
    g = _gen("env", op, n, data, dtype, layout, seed)
    rows = max(1, min(16, CAP // n))

    def vec(k):
        return _values((k,), "randn", dt, g)

    if op in ("sum", "mean", "var", "std", "cumsum", "softmax", "log_softmax"):
        x = _tensor((rows, n), layout, data, dt, g)
        kw = {"correction": 1 if op == "var" else 0} if op in ("var", "std") else {}
        return (x, -1), kw
    if op == "layer_norm":
        return (_tensor((rows, n), layout, data, dt, g), (n,), vec(n), vec(n)), {}
    if op == "rms_norm":
        return (_tensor((rows, n), layout, data, dt, g), (n,), vec(n)), {}
    if op == "group_norm":  # 4 channels in 2 groups: a group holds 2 L values
        ln = max(1, n // 2)
        return (_tensor((max(1, min(4, CAP // (4 * ln))), 4, ln), layout, data, dt, g), 2, vec(4), vec(4)), {}
    if op.startswith("batch_norm"):
        train = op == "batch_norm[train]"
        if train and n < 2:
            return None
        nb, ln = (1, n) if n < 64 else (2, n // 2)
        c = max(1, min(3, CAP // n))
        x = _tensor((nb, c, ln), layout, data, dt, g)
        xd = x.double()
        rm = (xd.mean((0, 2)) + 0.1 * torch.randn(c, generator=g, dtype=torch.float64)).to(dt)
        rv = (xd.var((0, 2), correction=0) * (0.9 + 0.2 * torch.rand(c, generator=g, dtype=torch.float64))).to(dt)
        return (x, rm, rv, vec(c), vec(c)), {"training": train}
    if op == "scaled_dot_product_attention":
        if n > 10_000 or data not in ("randn", "positive", "constant"):
            return None
        q = _tensor((1, 2, 8, 16), layout, data, dt, g)
        return (q, _tensor((1, 2, n, 16), layout, data, dt, g), _tensor((1, 2, n, 16), layout, data, dt, g)), {}
    raise ValueError(op)


def pool_call(i, data, dtype, layout, seed):
    op, shape, kw = POOLS[i]
    g = _gen("pool", i, data, dtype, layout, seed)
    return op, (_tensor(shape, layout, data, DT[dtype], g),), dict(kw)


def _bn(x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5):
    """F.batch_norm on copies of the running statistics (training mode updates them)."""
    return F.batch_norm(x, rm.clone(), rv.clone(), w, b, training, momentum, eps)


def _env_fn(op):
    op = _rk_name(op)
    if op == "batch_norm":
        return _bn
    return getattr(torch, op) if op in ("sum", "mean", "var", "std", "cumsum") else getattr(F, op)


def _cast(args, dt):
    return tuple(a.to(dt) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


# ---------------------------------------------------------------- correct algorithms in numpy fp32


def _lr(X):
    """Left-to-right float32 sums of the rows."""
    return np.cumsum(X, axis=1, dtype=F32)[:, -1] if X.shape[1] else np.zeros(X.shape[0], F32)


def _tree(X):
    """Pairwise float32 sums of the rows, halves added elementwise (the pairing GPU tree reductions use)."""
    n = X.shape[1]
    Y = np.zeros((X.shape[0], 1 << max(0, (n - 1).bit_length())), F32)
    Y[:, :n] = X
    while Y.shape[1] > 1:
        h = Y.shape[1] // 2
        Y = Y[:, :h] + Y[:, h:]
    return Y[:, 0]


def _blocked(X, b=128):
    """Left to right in blocks of ``b``, the block sums left to right (float32)."""
    r, n = X.shape
    nb = max(1, -(-n // b))
    Y = np.zeros((r, nb * b), F32)
    Y[:, :n] = X
    part = np.cumsum(Y.reshape(r, nb, b), axis=2, dtype=F32)[:, :, -1]
    return np.cumsum(part, axis=1, dtype=F32)[:, -1]


_JIT = {}


def _jit():
    """Kahan prefix sums and Welford (sequential, or in blocks merged by Chan's formula), float32."""
    if _JIT:
        return _JIT
    from numba import njit

    @njit(fastmath=False)
    def kahan_cum(X):
        r, n = X.shape
        out = np.empty((r, n), np.float32)
        for i in range(r):
            s = np.float32(0.0)
            c = np.float32(0.0)
            for j in range(n):
                y = X[i, j] - c
                t = s + y
                c = (t - s) - y
                s = t
                out[i, j] = s
        return out

    @njit(fastmath=False)
    def welford(X, block):
        r, n = X.shape
        mean = np.zeros(r, np.float32)
        m2 = np.zeros(r, np.float32)
        bs = block if block > 0 else max(n, 1)
        for i in range(r):
            cm = np.float32(0.0)
            cq = np.float32(0.0)
            cn = np.float32(0.0)
            for s in range(0, n, bs):
                m = np.float32(0.0)
                q = np.float32(0.0)
                k = 0
                for j in range(s, min(s + bs, n)):
                    k += 1
                    x = X[i, j]
                    d = x - m
                    m = m + d / np.float32(k)
                    q = q + d * (x - m)
                kf = np.float32(k)
                if cn == 0:
                    cm, cq, cn = m, q, kf
                else:
                    tot = cn + kf
                    d = m - cm
                    cm = cm + d * (kf / tot)
                    cq = cq + q + d * d * (cn * kf / tot)
                    cn = tot
            mean[i] = cm
            m2[i] = cq
        return mean, m2

    _JIT.update(kahan_cum=kahan_cum, welford=welford)
    return _JIT


def _sums(X, how):
    if how == "left-to-right":
        return _lr(X)
    if how == "reversed":
        return _lr(X[:, ::-1])
    if how == "tree":
        return _tree(X)
    if how == "blocks of 128":
        return _blocked(X)
    return _jit()["kahan_cum"](X)[:, -1] if X.shape[1] else np.zeros(X.shape[0], F32)


def _moments(X, how):
    """(mean, M2) of the rows in float32: two-pass (with ``how``'s sums), Welford, Welford blocks of 64."""
    n = X.shape[1]
    if how.startswith("Welford"):
        return _jit()["welford"](X, 64 if "blocks" in how else 0)
    s = _tree if "tree" in how else _lr
    m = s(X) / F32(n)
    d = X - m[:, None]
    return m, s(d * d)


def _np_norm(X, W, B, eps, center, given, stats, form):
    """A norm over the float32 rows X: statistics by ``stats``, then ``form``: (x - m) r w + b (direct),
    x (r w) + (b - m r w) (folded, as torch's CPU kernels), or (x - m) / sqrt(v + eps) w + b (divide)."""
    n = X.shape[1]
    e = F32(eps)
    if given is not None:
        m, v = given
    elif not center:
        m = F32(0.0)
        v = ((_tree if "tree" in stats else _lr)(X * X) / F32(n))[:, None]
    else:
        mm, q = _moments(X, stats)
        m, v = mm[:, None], (q / F32(n))[:, None]
    if form == "divide":
        return (X - m) / np.sqrt(v + e) * W + B
    r = F32(1.0) / np.sqrt(v + e)
    if form == "folded":
        sc = r * W
        return X * sc + (B - m * sc)
    return (X - m) * r * W + B


def _norm_rows(op, args, kw):
    """A norm call as rows: (X, W, B, eps, center, given statistics, back to the output's shape), torch."""
    x = args[0]
    name = _rk_name(op)
    if name in ("layer_norm", "rms_norm"):
        n = int(np.prod(args[1]))
        w = args[2] if len(args) > 2 else None
        b = args[3] if name == "layer_norm" and len(args) > 3 else None
        eps = kw.get("eps", 1e-5) if name == "layer_norm" else _rms_eps(kw, x.dtype)
        w, b = (None if t is None else t.reshape(1, n) for t in (w, b))
        return x.reshape(-1, n), w, b, eps, name == "layer_norm", None, lambda y: y.reshape(x.shape)
    if name == "group_norm":
        nb, c = x.shape[:2]
        grp = args[1]
        hw = int(np.prod(x.shape[2:]))

        def per_row(t):
            return None if t is None else t.reshape(grp, c // grp).repeat_interleave(hw, 1).repeat(nb, 1)

        w, b = (args[2] if len(args) > 2 else None), (args[3] if len(args) > 3 else None)
        return (
            x.reshape(nb * grp, -1),
            per_row(w),
            per_row(b),
            kw.get("eps", 1e-5),
            True,
            None,
            lambda y: y.reshape(x.shape),
        )
    c = x.shape[1]
    rm, rv, w, b = args[1], args[2], args[3], args[4]
    given = None if kw.get("training", False) else (rm[:, None], rv[:, None])
    back_shape = (c, x.shape[0], *x.shape[2:])
    return (
        x.movedim(1, 0).reshape(c, -1),
        w[:, None],
        b[:, None],
        kw.get("eps", 1e-5),
        True,
        given,
        lambda y: y.reshape(back_shape).movedim(0, 1),
    )


def _f32(t):
    return None if t is None else np.ascontiguousarray(t.float().numpy())


def _windows(shape_in, shape_out, kw, op):
    """Per spatial axis: (taps (Lo, k) of positions, divisor per output position) of a pool (torch's rules)."""
    d = 1 if op.endswith("1d") else 2

    def tup(v, default):
        v = default if v is None else v
        return (v,) * d if isinstance(v, int) else tuple(v)

    ks = tup(kw["kernel_size"], None)
    st = tup(kw.get("stride"), ks)
    pd = tup(kw.get("padding", 0), 0)
    dl = tup(kw.get("dilation", 1), 1)
    out = []
    for a in range(d):
        L, lo = shape_in[-d + a], shape_out[-d + a]
        start = np.arange(lo) * st[a] - pd[a]
        taps = start[:, None] + np.arange(ks[a])[None, :] * dl[a]
        end = np.minimum(start + ks[a], L + pd[a])
        inside = np.minimum(end, L) - np.maximum(start, 0)
        out.append((taps, end - start if kw.get("count_include_pad", True) else inside))
    return out


def _gather(x, wins, fill):
    """The windows' values: (..., Lo[, Wo], k) (float64 numpy), ``fill`` outside the input."""
    d = len(wins)
    sp = x.shape[-d:]
    lo = [int(-min(0, t.min())) for t, _ in wins]
    hi = [int(max(0, t.max() + 1 - s)) for (t, _), s in zip(wins, sp)]
    xp = np.pad(x, [(0, 0)] * (x.ndim - d) + list(zip(lo, hi)), constant_values=fill)
    if d == 1:
        return xp[..., wins[0][0] + lo[0]]
    th, tw = wins[0][0] + lo[0], wins[1][0] + lo[1]
    v = xp[..., th[:, None, :, None], tw[None, :, None, :]]
    return v.reshape(*v.shape[:-2], -1)


def _divisor(wins, kw):
    if kw.get("divisor_override"):
        return np.array(float(kw["divisor_override"]))
    if len(wins) == 1:
        return wins[0][1].astype(np.float64)
    return np.outer(wins[0][1], wins[1][1]).astype(np.float64)


def _adaptive(x, sizes, floor_end=False):
    """adaptive average pooling in float64 (numpy): windows [floor(i L / O), ceil((i + 1) L / O));
    ``floor_end``: the bug that ends them at floor((i + 1) L / O)."""
    d = len(sizes)
    out = x
    for a in range(d):
        ax = x.ndim - d + a
        L, o = x.shape[ax], sizes[a]
        parts = []
        for i in range(o):
            s, e = (i * L) // o, -(-((i + 1) * L) // o)
            if floor_end:
                e = max(s + 1, ((i + 1) * L) // o)
            parts.append(np.take(out, range(s, e), axis=ax).mean(axis=ax, keepdims=True))
        out = np.concatenate(parts, axis=ax)
    return out


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def alternatives(op, args, kw, good):
    """(name, output): correct float32 algorithms (numpy, float32 arithmetic throughout) for a float32 call."""
    name = _rk_name(op)
    out = []
    if name in ("sum", "mean", "var", "std", "cumsum", "softmax", "log_softmax"):
        X = _f32(args[0])
        n = X.shape[1]
        if name == "sum":
            for how in ("left-to-right", "reversed", "tree", "blocks of 128", "Kahan"):
                out.append((f"{how} fp32", _sums(X, how)))
        elif name == "mean":  # the sum's orders, then divided (torch's mean is its sum over n)
            for how in ("left-to-right", "reversed", "tree", "blocks of 128", "Kahan"):
                out.append((f"{how} fp32 / n", _sums(X, how) / F32(n)))
            out.append(("tree fp32 times fl(1/n)", _tree(X) * (F32(1.0) / F32(n))))
        elif name in ("var", "std"):
            c = F32(kw.get("correction", 1))
            for how in ("two-pass tree", "two-pass left-to-right", "Welford", "Welford blocks of 64, Chan merge"):
                with np.errstate(all="ignore"):
                    v = _moments(X, how)[1] / (F32(n) - c)
                    out.append((f"{how} fp32", v if name == "var" else np.sqrt(v)))
        elif name == "cumsum":
            out.append(("left-to-right fp32", np.cumsum(X, axis=1, dtype=F32)))
            b = 64
            nb = max(1, -(-n // b))
            Y = np.zeros((X.shape[0], nb * b), F32)
            Y[:, :n] = X
            loc = np.cumsum(Y.reshape(-1, nb, b), axis=2, dtype=F32)
            carry = np.concatenate([np.zeros((X.shape[0], 1), F32), np.cumsum(loc[:, :-1, -1], axis=1, dtype=F32)], 1)
            out.append(("blocked scan (64) fp32", (loc + carry[:, :, None]).reshape(X.shape[0], -1)[:, :n]))
            out.append(("Kahan fp32", _jit()["kahan_cum"](X)))
        else:
            m = X.max(axis=1, keepdims=True)
            with np.errstate(all="ignore"):
                e = np.exp(X - m)
                if name == "softmax":
                    out.append(("exp(x - max) / tree sum fp32", e / _tree(e)[:, None]))
                    out.append(("exp(x - max) times 1 / sum fp32", e * (F32(1.0) / _lr(e))[:, None]))
                else:
                    out.append(("x - max - log(tree sum) fp32", X - m - np.log(_tree(e))[:, None]))
        return [(k, torch.from_numpy(np.ascontiguousarray(v, F32)).reshape(good.shape)) for k, v in out]
    if op in NORMS:
        X, W, B, eps, center, given, back = _norm_rows(op, args, kw)
        Xn = _f32(X)
        Wn = F32(1.0) if W is None else _f32(W)
        Bn = F32(0.0) if B is None else _f32(B)
        gv = None if given is None else (_f32(given[0]), _f32(given[1]))
        if center or given is not None:
            combos = (
                ("two-pass tree", "direct"),
                ("Welford", "folded"),
                ("two-pass left-to-right", "divide"),
                ("Welford blocks of 64, Chan merge", "direct"),
            )
        else:
            combos = (("tree", "direct"), ("left-to-right", "divide"))
        if given is not None:
            combos = (("given", "direct"), ("given", "folded"), ("given", "divide"))
        for stats, form in combos:
            with np.errstate(all="ignore"):
                y = _np_norm(Xn, Wn, Bn, eps, center, gv, stats, form)
            out.append((f"{stats}, {form} fp32", back(torch.from_numpy(np.ascontiguousarray(y, F32)))))
        return out
    if name.startswith("avg_pool"):
        x = args[0].double().numpy()
        wins = _windows(x.shape, tuple(good.shape), kw, name)
        v = _gather(x, wins, 0.0).astype(F32)
        div = _divisor(wins, kw).astype(F32)
        s_lr = _lr(_rows(v)).reshape(v.shape[:-1])
        s_tr = _tree(_rows(v)).reshape(v.shape[:-1])
        out.append(("left-to-right fp32 / divisor", torch.from_numpy(np.ascontiguousarray(s_lr / div, F32))))
        out.append(
            ("tree fp32 times fl(1/divisor)", torch.from_numpy(np.ascontiguousarray(s_tr * (F32(1) / div), F32)))
        )
    return out


def _rms_eps(kw, dt):
    """rms_norm's eps: given, or torch's default, the epsilon of the opmath type (float32 for fp16/bf16
    inputs, not the input dtype's)."""
    eps = kw.get("eps")
    return torch.finfo(torch.float64 if dt == torch.float64 else torch.float32).eps if eps is None else eps


def _fixed(op, kw, dtype):
    """The call's kwargs for computing the same op in another dtype (rms_norm's default eps made explicit)."""
    return dict(kw, eps=_rms_eps(kw, DT[dtype])) if op == "rms_norm" else kw


def correct_env(op, args, kw, dtype, good):
    """(name, output): other correct results of the call (besides torch's own, judged first)."""
    fn = _env_fn(op)
    dt = DT[dtype]
    out = []
    kw = _fixed(op, kw, dtype)
    if dtype != "float64":
        out.append(("torch fp64, rounded", fn(*_cast(args, torch.float64), **kw).to(dt)))
    if dtype in ("float16", "bfloat16"):
        out.append(("torch fp32 (opmath), rounded", fn(*_cast(args, torch.float32), **kw).to(dt)))
    if op in NORMS:  # the textbook two-pass norm in the opmath type, torch ops
        X, W, B, eps, center, given, back = _norm_rows(op, args, kw)
        out.append(("two-pass norm in opmath, torch", back(_manual_norm(X, W, B, eps, center, given)).to(dt)))
    if dtype == "float32":
        out += alternatives(op, args, kw, good)
    return out


def reduced_env(op, args, kw, dtype):
    """(precision, name, output) of computations in a reduced precision, where it changes the inputs."""
    fn = _env_fn(op)
    out = []
    kw = _fixed(op, kw, dtype)
    if dtype == "float32":
        for p, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            ra = tuple(a.to(dt).float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
            if all(not isinstance(a, torch.Tensor) or torch.equal(a, b) for a, b in zip(args, ra)):
                continue  # every input is a bf16 (fp16) number already: nothing reduced
            out.append((p, f"{p} inputs, torch fp32", fn(*ra, **kw)))
    elif dtype == "float64":
        out.append(("fp32", "torch fp32, as float64", fn(*_cast(args, torch.float32), **kw).double()))
    return out


# ---------------------------------------------------------------- bugs


def _manual_norm(X, W, B, eps, center, given, var="biased", eps_out=False, no_w=False, no_b=False):
    """A norm over the rows X in the opmath type (torch ops), with the bugs as switches."""
    acc = torch.float64 if X.dtype == torch.float64 else torch.float32
    X = X.to(acc)
    if given is not None:
        m, v = given[0].to(acc), given[1].to(acc)
    elif center:
        m = X.mean(1, keepdim=True)
        if var == "one-pass":
            v = (X * X).mean(1, keepdim=True) - m * m
        else:
            v = X.var(1, keepdim=True, correction=1 if var == "unbiased" else 0)
    else:
        m = torch.zeros((), dtype=acc)
        v = (X * X).mean(1, keepdim=True)
    y = (X - m) / (v.sqrt() + eps) if eps_out else (X - m) * torch.rsqrt(v + eps)
    if W is not None and not no_w:
        y = y * W.to(acc)
    if B is not None and not no_b:
        y = y + B.to(acc)
    return y


def _restart(x, b):
    """cumsum along the last axis that restarts every ``b`` terms."""
    n = x.shape[-1]
    nb = -(-n // b)
    y = torch.zeros((*x.shape[:-1], nb * b), dtype=x.dtype)
    y[..., :n] = x
    return y.reshape(*x.shape[:-1], nb, b).cumsum(-1).reshape(*x.shape[:-1], nb * b)[..., :n]


def natural_bugs(op, args, kw, good):
    """(kind, output): bugs of the op's own kind, at their natural size."""
    name = _rk_name(op)
    x = args[0]
    dt = good.dtype
    acc = torch.float64 if dt == torch.float64 else torch.float32
    out = []
    if name in ("sum", "mean", "var", "std", "cumsum", "softmax", "log_softmax"):
        n = x.shape[-1]
        xa = x.to(acc)
        if name == "sum" and n > 1:
            out.append(("last term dropped", x[..., :-1].sum(-1)))
        if name == "mean" and n > 1:
            out.append(("divides by n - 1", (xa.sum(-1) / (n - 1)).to(dt)))
            out.append(("last term dropped", (xa[..., :-1].sum(-1) / n).to(dt)))
        if name in ("var", "std") and n > 1:
            c = kw.get("correction", 1)
            m = xa.mean(-1)
            v = ((xa * xa).mean(-1) - m * m) * (n / (n - c))
            out.append(("one-pass variance", (v if name == "var" else v.sqrt()).to(dt)))
            out.append(("correction swapped (biased <-> unbiased)", getattr(torch, name)(x, -1, correction=1 - c)))
            if n > 2:
                out.append(("last term dropped", getattr(torch, name)(x[..., :-1], -1, correction=c)))
        if name == "cumsum" and n > 2:
            b = 64 if n > 128 else 2
            out.append(("cumsum restarts per block", _restart(xa, b).to(dt)))
            out.append(("exclusive scan", torch.cat([torch.zeros_like(good[..., :1]), good[..., :-1]], -1)))
        if name in ("softmax", "log_softmax") and n > 1:
            m = xa.amax(-1, keepdim=True)
            e = (xa - m).exp()
            s = e[..., :-1].sum(-1, keepdim=True)
            out.append(("normaliser misses the last term", (e / s if name == "softmax" else xa - m - s.log()).to(dt)))
        if name == "scaled_dot_product_attention":
            q, k, v = args[:3]
            out.append(("scale missing", F.scaled_dot_product_attention(q, k, v, scale=1.0)))
            if k.shape[-2] > 1:
                out.append(("last key dropped", F.scaled_dot_product_attention(q, k[..., :-1, :], v[..., :-1, :])))
        return out
    if op in NORMS:
        X, W, B, eps, center, given, back = _norm_rows(op, args, kw)

        def bad(**o):
            return back(_manual_norm(X, W, B, o.pop("eps", eps), o.pop("center", center), given, **o)).to(dt)

        if center and given is None:
            out.append(("one-pass variance", bad(var="one-pass")))
            out.append(("unbiased variance", bad(var="unbiased")))
        out.append(("eps 1e-3 (not the default)", bad(eps=1e-3)))
        out.append(("eps outside the sqrt", bad(eps_out=True)))
        if W is not None:
            out.append(("weight dropped", bad(no_w=True)))
        if B is not None:
            out.append(("bias dropped", bad(no_b=True)))
        if name == "rms_norm":
            out.append(("mean subtracted (a layer_norm)", bad(center=True)))
        if name == "group_norm":
            out.append(("a group per channel", F.group_norm(x, x.shape[1], *args[2:], **kw)))
        if op == "batch_norm[train]":
            out.append(("running statistics used", _bn(*args, training=False)))
        if op == "batch_norm[eval]" and x.numel() // x.shape[1] > 1:
            out.append(("batch statistics used", _bn(*args, training=True)))
        return out
    xd = x.double().numpy()
    if name.startswith("avg_pool"):
        if kw.get("padding", 0) or kw.get("ceil_mode", False):
            flip = dict(kw, count_include_pad=not kw.get("count_include_pad", True))
            out.append(("count_include_pad flipped", _env_fn(name)(x, **flip)))
        wins = _windows(xd.shape, tuple(good.shape), kw, name)
        v = _gather(xd, wins, 0.0)
        div = _divisor(wins, kw)
        out.append(("divisor one too large", torch.from_numpy(v.sum(-1) / (div + 1)).to(dt)))
        if v.shape[-1] > 1:
            out.append(("window misses its last tap", torch.from_numpy(v[..., :-1].sum(-1) / div).to(dt)))
    if name.startswith("max_pool"):
        wins = _windows(xd.shape, tuple(good.shape), kw, name)
        v = _gather(xd, wins, -np.inf)
        if v.shape[-1] > 1:
            out.append(("window misses its last tap", torch.from_numpy(v[..., :-1].max(-1)).to(dt)))
        shifted = [(t + 1, dv) for t, dv in wins[:1]] + wins[1:]
        out.append(("window shifted by one", torch.from_numpy(_gather(xd, shifted, -np.inf).max(-1)).to(dt)))
        if kw.get("padding", 0) or kw.get("ceil_mode", False):
            out.append(("padding read as 0", torch.from_numpy(_gather(xd, wins, 0.0).max(-1)).to(dt)))
    if name.startswith("adaptive_avg_pool"):
        sizes = kw["output_size"]
        sizes = (sizes,) * (1 if name.endswith("1d") else 2) if isinstance(sizes, int) else tuple(sizes)
        out.append(("window ends at floor((i + 1) L / O)", torch.from_numpy(_adaptive(xd, sizes, True)).to(dt)))
    return out


def generic_bugs(good, ref, bound, g, quick):
    """(kind, output): bugs of any op: a shift, elements moved by a multiple of their envelope, noise."""
    dt = good.dtype
    out = []
    if good.ndim and good.shape[-1] > 1:
        out.append(("output shifted by one", torch.roll(good, 1, -1)))
    flat_ref, flat_b = ref.reshape(-1), bound.reshape(-1)
    ok = np.flatnonzero(np.isfinite(flat_ref) & np.isfinite(flat_b) & (flat_b > 0))
    if len(ok):
        i = int(ok[int(torch.randint(0, len(ok), (1,), generator=g))])
        sgn = 1.0 if int(torch.randint(0, 2, (1,), generator=g)) else -1.0
        for s in ENV_SCALES_QUICK if quick else ENV_SCALES:
            y = good.clone().reshape(-1)
            y[i] = torch.tensor(flat_ref[i] + sgn * s * flat_b[i], dtype=torch.float64).to(dt)
            out.append((f"one element off by {s:g}x its envelope", y.reshape(good.shape)))
        idx = ok[torch.randperm(len(ok), generator=g)[: max(1, len(ok) // 100)].numpy()]
        y = good.clone().reshape(-1).double()
        y[idx] = torch.from_numpy(flat_ref[idx] + 3.0 * flat_b[idx])
        out.append(("1% of elements off by 3x their envelope", y.to(dt).reshape(good.shape)))
        y = good.clone().reshape(-1).double()
        y[i] = y[i] * (1 + 1e-3) if y[i] != 0 else torch.tensor(1e-3, dtype=torch.float64)
        out.append(("one element off by 1e-3 relative", y.to(dt).reshape(good.shape)))
    for s in (1e-4,) if quick else (1e-6, 1e-4, 1e-2):
        z = torch.randn(good.shape, generator=g, dtype=torch.float64)
        out.append((f"noise of relative size {s:g} on every element", (good.double() * (1 + s * z)).to(dt)))
    return out


def _ratio(y, ref, bound):
    """max over elements of |y - ref| / bound, as the verdict measures it (NaN/inf that differ: inf)."""
    a = y.double().numpy() if isinstance(y, torch.Tensor) else np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        same = (a == ref) | (np.isnan(a) & np.isnan(ref))
        e = np.where(same, 0.0, np.abs(a - ref))
        e = np.where(np.isnan(e), np.inf, e)
        r = np.where(e == 0, 0.0, e / bound)
    r = np.where(np.isnan(r), np.inf, r)
    return float(r.max(initial=0.0))


# ---------------------------------------------------------------- the run


def _env_row(op, rep, seconds, **kv):
    det = rep.detectable["element"]["median_ulps"] if rep.detectable else 0.0
    one = any("one-pass variance" in t for t in rep.notes)
    over = any("inf or NaN where the exact result is finite" in t for t in rep.notes)  # overflow is no excuse
    return dict(
        op=op,
        n=int(rep.n_terms),
        verdict=rep.verdict,
        precision=rep.precision,
        alternatives=list(rep.alternatives),
        ratio=float(rep.max_bound_ratio),
        det_ulps=float(det),
        one_pass=one,
        overflow=over,
        seconds=seconds,
        **kv,
    )


def _judge_env(op, args, kw, out):
    t = time.perf_counter()
    rep = rk.compare(out, _rk_name(op), *args, **kw)
    return rep, time.perf_counter() - t


def env_case(op, args, kw, dtype, meta, extras, bugs_on, quick, log_err):
    """The truths for one call: torch's output; with ``extras`` other correct ones and reduced
    precisions; with ``bugs_on`` the bugs."""
    rows = []
    fn = _env_fn(op)
    try:
        good = fn(*args, **kw)
    except (RuntimeError, NotImplementedError) as e:  # no torch CPU kernel for this dtype
        log_err(f"{op} {dtype}: torch has no kernel ({str(e).splitlines()[0][:80]})")
        return rows
    t = time.perf_counter()
    el = rk.analysis.compare.elements(good, _rk_name(op), *args, **kw)
    rep, ref, bound = el["report"], el["reference"], el["bound"]
    rows.append(_env_row(op, rep, time.perf_counter() - t, truth="correct", name="torch", **meta))
    for name, out in correct_env(op, args, kw, dtype, good) if extras else ():
        if quick and name in QUICK_SKIP:
            continue
        r, s = _judge_env(op, args, kw, out)
        # float32 variance algorithms on values near the smallest normal: their squares underflow, which
        # the standard model (and every envelope built on it) leaves out; counted apart, not as false alarms
        under = meta["data"] == "tiny" and not name.startswith("torch") and _rk_name(op) in UNDERFLOWS
        rows.append(_env_row(op, r, s, truth="correct-underflow" if under else "correct", name=name, **meta))
    for prec, name, out in reduced_env(op, args, kw, dtype) if extras else ():
        r, s = _judge_env(op, args, kw, out)
        rows.append(_env_row(op, r, s, truth=f"reduced:{prec}", name=name, **meta))
    if bugs_on:
        g = _gen("envbug", op, repr(meta))
        for kind, out in natural_bugs(op, args, kw, good) + generic_bugs(good, ref, bound, g, quick):
            if out.shape != good.shape or _same(out, good):
                continue  # not a bug on this call (e.g. count_include_pad without padding)
            r, s = _judge_env(op, args, kw, out)
            rows.append(
                _env_row(
                    op,
                    r,
                    s,
                    truth="bug",
                    name=kind,
                    size=_ratio(out, ref, bound),
                    injected=_ratio(out, good.double().numpy(), bound),
                    **meta,
                )
            )
    return rows


def _same(a, b):
    a, b = a.double(), b.double()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _pick(options, *key):
    return options[zlib.crc32(repr(key).encode()) % len(options)]


def run_envelope(quick=False, seeds=1, ops=None, lengths=None, data=None, dtypes=ENV_DTYPES, pools=None, log=print):
    """The envelope family's confusion matrix; rows of dicts (see summarise_envelope).

    Full: every length, regime, dtype and layout; the other correct algorithms, the reduced
    precisions and the bugs on the contiguous layout, bugs on fp32 results of every regime and on
    fp16/bf16/fp64 results of randn data. Offset, constant and tiny data send var and the norms
    to refkern's exact fallback (seconds per call at 10^5 terms): there, 10^4 terms on the
    contiguous layout only, and 10^5 terms torch's fp32 and fp64 results only. Quick: randn (fp32:
    and offset) and one other regime per (op, length, dtype), rotating; one layout per case,
    rotating; fewer other algorithms; bugs on fp32 results of randn data (and offset data for
    var, std and the norms); 10^5 terms on randn data only. Softmax and attention skip the
    lognormal regime."""
    import warnings

    warnings.filterwarnings("ignore", message=".*degrees of freedom is <= 0.*")
    ops = env_ops() if ops is None else ops
    lengths = (ENV_LENGTHS_QUICK if quick else ENV_LENGTHS) if lengths is None else lengths
    data = (ENV_DATA_QUICK if quick else ENV_DATA) if data is None else data
    pools = (POOLS_QUICK if quick else range(len(POOLS))) if pools is None else pools
    rows = []
    errs = []

    def plan(key, n, d, dtype):
        """[(layout, everything?, bugs?)] for one case."""
        if key[0] in ("softmax", "log_softmax", "scaled_dot_product_attention") and d == "lognormal":
            return []  # logits up to 1e7: refkern's exact log_softmax takes minutes there (see the report)
        if quick:  # randn (fp32: and offset) and one other regime per (op, n, dtype), rotating
            if n is not None and n >= 10_000 and d != "randn":
                return []
            fixed = ("randn", "offset") if dtype == "float32" else ("randn",)
            if d not in fixed and d != _pick([e for e in data if e not in fixed] or ["randn"], *key):
                return []
            bugs = dtype == "float32" and (d == "randn" or d == "offset" and _rk_name(key[0]) in UNDERFLOWS)
            return [(_pick(ENV_LAYOUTS, *key, d), True, bugs)]
        if n is not None and n >= 10_000 and d in ("offset", "constant", "tiny"):  # slow references
            if n > 10_000:
                return [("contiguous", False, False)] if dtype in ("float32", "float64") else []
            return [("contiguous", True, dtype == "float32")]
        bugs = dtype == "float32" or d == "randn"
        return [(lay, lay == "contiguous", lay == "contiguous" and bugs) for lay in ENV_LAYOUTS]

    for seed in range(seeds):
        for op in ops:
            t0 = time.perf_counter()
            for n in lengths:
                for d in data:
                    for dtype in dtypes:
                        for lay, extras, bugs in plan((op, n, dtype, seed), n, d, dtype):
                            call = env_call(op, n, d, dtype, lay, seed)
                            if call is None:
                                continue
                            meta = dict(
                                length=n, data=d, dtype=dtype, layout=lay, seed=seed, case=[op, n, d, dtype, lay, seed]
                            )
                            rows += env_case(op, *call, dtype, meta, extras, bugs, quick, errs.append)
            log(f"envelope {op}: {len(rows)} cases so far ({time.perf_counter() - t0:.0f} s)")
        t0 = time.perf_counter()
        for i in pools:
            for d in data:
                for dtype in dtypes:
                    for lay, extras, bugs in plan(("pool", i, dtype, seed), None, d, dtype):
                        op, args, kw = pool_call(i, d, dtype, lay, seed)
                        meta = dict(
                            length=None,
                            data=d,
                            dtype=dtype,
                            layout=lay,
                            seed=seed,
                            case=["pool", i, d, dtype, lay, seed],
                        )
                        rows += env_case(op, args, kw, dtype, meta, extras, bugs, quick, errs.append)
        log(f"envelope pools: {len(rows)} cases so far ({time.perf_counter() - t0:.0f} s)")
        t0 = time.perf_counter()
        rows += run_dims(quick, seed)
        log(f"envelope dims: {len(rows)} cases so far ({time.perf_counter() - t0:.0f} s)")
    for e in sorted(set(errs)):
        log("  skipped: " + e)
    return rows


def run_dims(quick, seed):
    """Every dim choice of sum/mean/var/std/cumsum on a 3-D input (contiguous and permuted), every dtype,
    with keepdim and with a wider result dtype (sum/mean ``dtype=``)."""
    rows = []
    dims = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2)]
    if quick:
        dims = [None, 0, -1, (0, 2)]
    for d in ("randn", "offset") if quick else ("randn", "offset", "lognormal", "constant"):
        for dtype in ENV_DTYPES:
            dt = DT[dtype]
            for lay in ("contiguous", "transposed"):
                g = _gen("dims", d, dtype, lay, seed)
                x = _tensor((4, 6, 10), lay, d, dt, g)
                calls = []
                for op in ("sum", "mean", "var", "std"):
                    kw = {"correction": 0} if op == "std" else {}
                    calls += [(op, (x, dim), kw) for dim in dims]
                    calls.append((op, (x, 1), dict(kw, keepdim=True)))
                    calls.append((op, (x, None), dict(kw, keepdim=True)))
                for op in ("sum", "mean"):
                    wide = torch.float64 if dtype == "float32" else (torch.float32 if dtype != "float64" else None)
                    if wide is not None:
                        calls.append((op, (x, (0, 2)), {"dtype": wide}))
                calls += [("cumsum", (x, dim), {}) for dim in ((0, -1) if quick else (0, 1, 2, -1))]
                for op, args, kw in calls:
                    good = _env_fn(op)(*args, **kw)
                    rep, s = _judge_env(op, args, kw, good)
                    rows.append(
                        _env_row(
                            op,
                            rep,
                            s,
                            truth="correct",
                            name=f"torch dim={args[1]} {kw}",
                            length=None,
                            data=d,
                            dtype=dtype,
                            layout=lay,
                            seed=seed,
                            case=["dims", op, d, dtype, lay],
                        )
                    )
    return rows


def _nbin(n):
    for hi, lab in ((1, "1"), (9, "2-9"), (99, "10-99"), (999, "100-999"), (9999, "1e3-1e4"), (10**9, ">=1e4")):
        if n <= hi:
            return lab
    return ">=1e4"


NBINS = ("1", "2-9", "10-99", "100-999", "1e3-1e4", ">=1e4")
SBINS = (("<1x", 0, 1), ("1-2x", 1, 2), ("2-10x", 2, 10), (">=10x", 10, np.inf))


def _frac(rows, pred):
    return f"{sum(map(pred, rows))}/{len(rows)}"


def summarise_envelope(rows) -> dict:
    correct = [r for r in rows if r["truth"] == "correct"]
    fa = [r for r in correct if r["verdict"] not in ("exact", "rounding")]
    under = [r for r in rows if r["truth"] == "correct-underflow"]
    ops = sorted({r["op"] for r in rows}, key=lambda o: (o.startswith(("avg", "max", "adaptive")), o))
    by_op_dtype = {}
    for r in correct:
        e = by_op_dtype.setdefault(r["op"], {}).setdefault(r["dtype"], [0, 0])
        e[0] += r in fa
        e[1] += 1
    slack = {}
    for r in correct:  # the largest error / envelope a correct result used (1 = the edge)
        if np.isfinite(r["ratio"]):
            slack[r["op"]] = max(slack.get(r["op"], 0.0), r["ratio"])
    reduced = [r for r in rows if r["truth"].startswith("reduced:")]
    outcome = {}
    for r in reduced:
        p = r["truth"][8:]
        k = (
            "named right"
            if r["verdict"] == "reduced-precision" and r["precision"] == p
            else "named right among the indistinguishable"
            if r["verdict"] == "reduced-precision" and p in r.get("alternatives", ())
            else "named another precision"
            if r["verdict"] == "reduced-precision"
            else "mismatch: inputs overflow p (no excuse)"
            if r["verdict"] == "mismatch" and r.get("overflow")
            else "mismatch"
            if r["verdict"] == "mismatch"
            else "below the envelope (rounding)"
        )
        r["outcome"] = k
        e = outcome.setdefault(p, {})
        e[k] = e.get(k, 0) + 1
    # a reduced truth whose inputs overflow p (lognormal data in fp16) gives inf/NaN where the exact result is
    # finite: the verdict calls that a mismatch by rule (refkern.analysis.verdict, "overflow is no excuse")
    decided = [r for r in reduced if r["outcome"] not in ("below the envelope (rounding)",
                                                           "mismatch: inputs overflow p (no excuse)")]  # fmt: skip
    bugs = [r for r in rows if r["truth"] == "bug"]
    for r in bugs:
        r["caught"] = r["verdict"] == "mismatch"
        r["kind"] = r["name"]
    big = [r for r in bugs if r["size"] >= 2]
    by_kind = {}
    for r in bugs:
        e = by_kind.setdefault(r["kind"], {"n": 0})
        e["n"] += 1
        for lab, lo, hi in SBINS:
            if lo <= r["size"] < hi or (hi == np.inf and r["size"] == np.inf):
                c = e.setdefault(lab, [0, 0])
                c[0] += r["caught"]
                c[1] += 1
        e["named a precision"] = e.get("named a precision", 0) + (r["verdict"] == "reduced-precision")
    by_n = {}
    for r in bugs:
        e = by_n.setdefault(_nbin(r["n"]), {"bugs": 0, "ge2": 0, "caught_ge2": 0, "caught": 0, "inf_env": 0})
        e["bugs"] += 1
        e["ge2"] += r["size"] >= 2
        e["caught_ge2"] += r["size"] >= 2 and r["caught"]
        e["caught"] += r["caught"]
        e["inf_env"] += r["det_ulps"] == np.inf
    by_dtype = {}
    for r in bugs:
        e = by_dtype.setdefault(r["dtype"], {"bugs": 0, "ge2": 0, "caught_ge2": 0, "caught": 0, "inf_env": 0})
        e["bugs"] += 1
        e["ge2"] += r["size"] >= 2
        e["caught_ge2"] += r["size"] >= 2 and r["caught"]
        e["caught"] += r["caught"]
        e["inf_env"] += r["det_ulps"] == np.inf
    width = {}  # the envelope in ulps (median over elements), torch's own results, per op, dtype and length
    for r in correct:
        if (
            r["name"] == "torch"
            and r["length"] is not None
            and (r["data"] == "randn" or r["dtype"] == "float32" and r["data"] == "offset")
        ):
            key = f"{r['op']} {r['dtype']}" + (" offset" if r["data"] == "offset" else "")
            width.setdefault(key, {}).setdefault(_nbin(r["n"]), []).append(r["det_ulps"])
    width = {
        k: {b: float(np.median(v)) for b, v in sorted(d.items(), key=lambda t: NBINS.index(t[0]))}
        for k, d in width.items()
    }
    one = [r for r in bugs if r["kind"] == "one-pass variance" and r["caught"]]
    return {
        "cases": len(rows),
        "correct": len(correct),
        "false_alarms": len(fa),
        "false_alarm_rate": len(fa) / max(len(correct), 1),
        "false_alarms_by_op_dtype": {o: {d: f"{a}/{b}" for d, (a, b) in v.items()} for o, v in by_op_dtype.items()},
        "false_alarms_by_source": {
            k: _frac([r for r in correct if r["name"].split(" dim=")[0] == k], lambda r: r in fa)
            for k in sorted({r["name"].split(" dim=")[0] for r in correct})
        },
        "largest_ratio_on_correct": slack,
        "underflowing_fp32_algorithms": _frac(under, lambda r: r["verdict"] not in ("exact", "rounding")),
        "reduced": len(reduced),
        "reduced_outcomes": outcome,
        "named_right": sum(r["outcome"].startswith("named right") for r in reduced),
        "named_rate_where_sharp": sum(r["outcome"].startswith("named right") for r in decided) / max(len(decided), 1),
        "bugs": len(bugs),
        "bugs_ge_2x": len(big),
        "caught_ge_2x": sum(r["caught"] for r in big),
        "bugs_1_to_2x": sum(1 <= r["size"] < 2 for r in bugs),
        "caught_1_to_2x": sum(1 <= r["size"] < 2 and r["caught"] for r in bugs),
        "bugs_below_1x": sum(r["size"] < 1 for r in bugs),
        "caught_below_1x": sum(r["size"] < 1 and r["caught"] for r in bugs),
        "bugs_named_a_precision": sum(r["verdict"] == "reduced-precision" for r in bugs),
        "one_pass_caught_and_named": f"{sum(r['one_pass'] for r in one)}/{len(one)}",
        "power_by_kind": by_kind,
        "power_by_length": by_n,
        "power_by_dtype": by_dtype,
        "envelope_ulps": width,
        "ops": ops,
        "median_seconds": float(np.median([r["seconds"] for r in rows])) if rows else 0.0,
        "false_alarm_cases": fa[:40],
        "missed_ge_2x": [r for r in big if not r["caught"]][:40],
        "misnamed": [r for r in reduced if r["outcome"] in ("named another precision", "mismatch")][:40],
    }


def print_envelope(s, log=print):
    log(f"\n== envelope family: {s['cases']} cases (median {s['median_seconds']:.3f} s per compare)")
    log(f"false alarms on correct results: {s['false_alarms']} / {s['correct']} ({100 * s['false_alarm_rate']:.2f}%)")
    dts = ENV_DTYPES
    log(f"  {'op':24s}" + "".join(f"{d:>12s}" for d in dts) + f"{'max err/env':>13s}")
    for op in s["ops"]:
        v = s["false_alarms_by_op_dtype"].get(op, {})
        log(
            f"  {op:24s}"
            + "".join(f"{v.get(d, '-'):>12s}" for d in dts)
            + f"{s['largest_ratio_on_correct'].get(op, 0.0):>13.3g}"
        )
    log("  by source: " + ", ".join(f"{k} {v}" for k, v in s["false_alarms_by_source"].items()))
    log(
        f"  not counted: fp32 variance algorithms on tiny data (squares underflow, outside the model) flagged "
        f"{s['underflowing_fp32_algorithms']}"
    )
    log(
        f"reduced precisions named right: {s['named_right']} / {s['reduced']}; where the hypothesis is sharp "
        f"(not below the rounding envelope): {100 * s['named_rate_where_sharp']:.1f}%"
    )
    for p, v in s["reduced_outcomes"].items():
        log(f"  {p}: " + ", ".join(f"{k} {c}" for k, c in sorted(v.items())))
    log(
        f"bugs >= 2x the envelope caught: {s['caught_ge_2x']} / {s['bugs_ge_2x']}; 1-2x: {s['caught_1_to_2x']} / "
        f"{s['bugs_1_to_2x']}; below 1x: {s['caught_below_1x']} / {s['bugs_below_1x']} (all {s['bugs']}); "
        f"named a precision: {s['bugs_named_a_precision']}; one-pass variance named: {s['one_pass_caught_and_named']}"
    )
    log(f"  {'bug kind':46s}{'n':>6s}" + "".join(f"{lab:>12s}" for lab, _, _ in SBINS) + f"{'precision':>10s}")
    for k, v in sorted(s["power_by_kind"].items()):
        log(
            f"  {k[:46]:46s}{v['n']:>6d}"
            + "".join(f"{'{}/{}'.format(*v[lab]) if lab in v else '-':>12s}" for lab, _, _ in SBINS)
            + f"{v['named a precision']:>10d}"
        )
    log("  caught / bugs by terms per output (>= 2x: caught/n; share of bugs >= 2x; infinite envelope):")
    for b in NBINS:
        if b in s["power_by_length"]:
            e = s["power_by_length"][b]
            log(
                f"    n {b:>8s}: all {e['caught']}/{e['bugs']}, >= 2x {e['caught_ge2']}/{e['ge2']} "
                f"({100 * e['ge2'] / max(e['bugs'], 1):.0f}% of bugs), infinite envelope {e['inf_env']}"
            )
    for d, e in s["power_by_dtype"].items():
        log(
            f"    {d:>10s}: all {e['caught']}/{e['bugs']}, >= 2x {e['caught_ge2']}/{e['ge2']}, "
            f"infinite envelope {e['inf_env']}"
        )
    log("  envelope width, median ulps of torch's own results on randn data (fp32: and offset), by terms per output:")
    for k, v in sorted(s["envelope_ulps"].items()):
        log(f"    {k:30s} " + "  ".join(f"{b}: {u:.3g}" for b, u in v.items()))
    for key in ("false_alarm_cases", "missed_ge_2x", "misnamed"):
        for r in s[key][:15]:
            log(
                f"  {key}: {r['case']} {r['truth']} {r['name']}: {r['verdict']} {r['precision'] or ''} "
                f"ratio {r['ratio']:.3g} size {r.get('size', '')}"
            )


# ============================================================================ the backward family
#
# Gradients judged by refkern.compare_backward. Products and convolutions (linear, matmul, conv1d/2d,
# conv_transpose2d) are judged by the statistical test on their adjoint call (Report.max_prob_ratio:
# max |error| / (sqrt(n) u M + 2 u |ref|), the scale the gemm family uses); the norms, softmax,
# log_softmax, the pools, attention and the reductions by worst-case envelopes (Report.max_bound_ratio,
# the deterministic test: above 1 no correct implementation produces it). A bug's size is the report's
# own ratio on the buggy gradient (the statistical scale or the envelope); bugs >= 10x the scale
# (statistical) and >= 2x the envelope must be caught, and none below 1x may be named a precision.

BW_SCALES = (0.5, 0.9, 1.5, 2.5, 5.0, 12.0, 30.0)  # one element moved by s x its own bound / scale
BW_SCALES_QUICK = (0.5, 2.5, 12.0)
BW_NOISE = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
BW_NOISE_QUICK = (1e-5, 1e-3)
BW_DTYPES = ("float32", "float16", "bfloat16", "float64")
BW_LAYOUTS = ("contiguous", "transposed", "strided")
STAT_OPS = ("linear", "matmul", "conv1d", "conv2d", "conv_transpose2d")
STAT_SBINS = (("<1x", 0, 1), ("1-10x", 1, 10), ("10-100x", 10, 100), (">=100x", 100, np.inf))
BW_DATA_ALL = ("randn", "offset", "tiny", "lognormal")

# (config, rk op, the three reduction-length parameters, data regimes, fp64 too?)
BW_CONFIGS = (
    ("linear", "linear", (6, 48, 384), BW_DATA_ALL, True),
    ("linear[square]", "linear", (24,), ("randn",), False),  # M == out: grad_bias over the wrong axis fits
    ("matmul[broadcast]", "matmul", (4, 32, 256), ("randn", "offset", "lognormal"), True),
    ("conv1d[s1 p1]", "conv1d", (8, 64, 512), ("randn", "tiny", "lognormal"), False),
    ("conv1d[s2 p2 d2 g2]", "conv1d", (8, 64, 512), ("randn", "offset"), False),
    ("conv2d[s1 p1]", "conv2d", (4, 10, 24), ("randn", "offset", "tiny", "lognormal"), True),
    ("conv2d[s2 p1]", "conv2d", (4, 10, 24), ("randn",), False),
    ("conv2d[s1 p2 d2 g2]", "conv2d", (4, 10, 24), ("randn", "lognormal"), False),
    ("conv2d[same]", "conv2d", (4, 10, 24), ("randn",), False),
    ("conv_transpose2d[s2 p1 op1]", "conv_transpose2d", (3, 8, 16), ("randn", "offset"), False),
    ("layer_norm", "layer_norm", (8, 128, 2048), ("randn", "offset", "tiny"), True),
    ("rms_norm", "rms_norm", (8, 128, 2048), ("randn", "offset", "tiny"), False),
    ("group_norm", "group_norm", (2, 32, 512), ("randn", "offset"), False),
    ("batch_norm[train]", "batch_norm", (2, 32, 512), ("randn", "offset", "tiny"), False),
    ("batch_norm[eval]", "batch_norm", (2, 32, 512), ("randn", "offset"), False),
    ("softmax", "softmax", (8, 128, 2048), ("randn", "offset"), True),
    ("log_softmax", "log_softmax", (8, 128, 2048), ("randn", "offset"), False),
    ("avg_pool2d", "avg_pool2d", (2, 3, 8), ("randn", "lognormal", "tiny"), False),
    ("avg_pool2d[pad, no count_include_pad]", "avg_pool2d", (3, 5), ("randn",), False),
    ("max_pool2d", "max_pool2d", (2, 3, 5), ("randn", "lognormal"), False),
    ("max_pool1d[dilated]", "max_pool1d", (2, 3, 7), ("randn",), False),
    ("adaptive_avg_pool2d", "adaptive_avg_pool2d", (1, 2, 8), ("randn", "lognormal"), False),
    ("adaptive_avg_pool1d", "adaptive_avg_pool1d", (1, 3, 64), ("randn",), False),
    ("sdpa", "scaled_dot_product_attention", (4, 32, 256), ("randn", "tiny"), False),
    ("sdpa[causal]", "scaled_dot_product_attention", (4, 32, 256), ("randn",), False),
    ("sum", "sum", (8, 128, 4096), BW_DATA_ALL, False),
    ("mean", "mean", (8, 128, 4096), BW_DATA_ALL, False),
    ("var", "var", (8, 128, 4096), BW_DATA_ALL, True),
    ("std", "std", (8, 128, 4096), ("randn", "offset", "lognormal"), False),
    ("cumsum", "cumsum", (8, 128, 4096), ("randn", "lognormal", "tiny"), False),
)
BW_CFG = {c[0]: c for c in BW_CONFIGS}
NORM_BW = ("layer_norm", "rms_norm", "group_norm", "batch_norm")  # torch sums their parameters' grads in half


def _bw_values(shape, data, dt, g):
    """A data regime's values for the backward family (float64 drawn, converted): randn, offset (mean 1e4,
    std 1; float16: mean 1e3), tiny (x the dtype's smallest normal times 2**6: products stay normal in the
    half formats, subnormal gradients in float32), signed lognormal (|x| = e^(2 N(0, 1)))."""
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    if data == "offset":
        t = t + (1e3 if dt == torch.float16 else 1e4)
    elif data == "tiny":
        t = t * torch.finfo(dt).tiny * 64
    elif data == "lognormal":
        t = torch.sign(t) * torch.exp(2.0 * torch.randn(shape, generator=g, dtype=torch.float64))
    return t.to(dt)


def _bw_tensor(shape, layout, data, dt, g):
    return _laid_out(shape, layout, lambda s: _bw_values(s, data, dt, g))


def _bn_fn(x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5):
    return F.batch_norm(x, None if rm is None else rm.clone(), None if rv is None else rv.clone(), w, b, training,
                        momentum, eps)  # fmt: skip


def bw_call(cfg, length, data, dtype, layout, seed):
    """One call: dict(op, fn (torch), args, kw, diff {gradient name: position in args}) whose gradients
    reduce about ``length`` terms (the reports' n_terms are recorded)."""
    _, op, _, _, _ = BW_CFG[cfg]
    dt = DT[dtype]
    g = _gen("bw", cfg, length, data, dtype, layout, seed)
    L = length

    def x_(*shape):  # the data input, in the layout asked for
        return _bw_tensor(shape, layout, data, dt, g)

    def p_(*shape):  # parameters: randn, contiguous
        return _bw_values(shape, "randn", dt, g)

    kw = {}
    if op == "linear":
        if cfg == "linear[square]":
            return dict(op=op, fn=F.linear, args=[x_(L, 16), p_(L, 16), p_(L)], kw={}, diff=dict(x=0, weight=1, bias=2))
        return dict(op=op, fn=F.linear, args=[x_(L, 32), p_(L, 32), p_(L)], kw={}, diff=dict(x=0, weight=1, bias=2))
    if op == "matmul":
        return dict(op=op, fn=torch.matmul, args=[x_(2, 3, L, 8), p_(3, 8, L)], kw={}, diff=dict(a=0, b=1))
    if op == "conv1d":
        if "g2" in cfg:
            kw = dict(stride=2, padding=2, dilation=2, groups=2)
            return dict(
                op=op, fn=F.conv1d, args=[x_(2, 8, L), p_(8, 4, 3), p_(8)], kw=kw, diff=dict(x=0, weight=1, bias=2)
            )
        kw = dict(padding=1)
        return dict(op=op, fn=F.conv1d, args=[x_(2, 8, L), p_(8, 8, 3), p_(8)], kw=kw, diff=dict(x=0, weight=1, bias=2))
    if op == "conv2d":
        cin, wshape = 6, (8, 6, 3, 3)
        kw = {
            "conv2d[s1 p1]": dict(padding=1),
            "conv2d[s2 p1]": dict(stride=2, padding=1),
            "conv2d[s1 p2 d2 g2]": dict(padding=2, dilation=2, groups=2),
            "conv2d[same]": dict(padding="same"),
        }[cfg]
        if "g2" in cfg:
            wshape = (8, 3, 3, 3)
        if cfg == "conv2d[same]":
            wshape = (8, 6, 2, 3)  # an even kernel: odd total padding
        return dict(
            op=op, fn=F.conv2d, args=[x_(2, cin, L, L), p_(*wshape), p_(8)], kw=kw, diff=dict(x=0, weight=1, bias=2)
        )
    if op == "conv_transpose2d":
        kw = dict(stride=2, padding=1, output_padding=1)
        return dict(op=op, fn=F.conv_transpose2d, args=[x_(2, 6, L, L), p_(6, 4, 3, 3), p_(4)], kw=kw,
                    diff=dict(input=0, weight=1, bias=2))  # fmt: skip
    if op == "layer_norm":
        return dict(op=op, fn=F.layer_norm, args=[x_(16, L), (L,), p_(L), p_(L)], kw={},
                    diff=dict(input=0, weight=2, bias=3))  # fmt: skip
    if op == "rms_norm":
        return dict(op=op, fn=F.rms_norm, args=[x_(16, L), (L,), p_(L)], kw={}, diff=dict(input=0, weight=2))
    if op == "group_norm":
        return dict(op=op, fn=F.group_norm, args=[x_(4, 8, L), 2, p_(8), p_(8)], kw={},
                    diff=dict(input=0, weight=2, bias=3))  # fmt: skip
    if op == "batch_norm":
        train = cfg == "batch_norm[train]"
        x = x_(4, 3, L)
        xd = x.double()
        rm = (xd.mean((0, 2)) + 0.1 * torch.randn(3, generator=g, dtype=torch.float64)).to(dt)
        rv = (xd.var((0, 2), correction=0) * (0.9 + 0.2 * torch.rand(3, generator=g, dtype=torch.float64))).to(dt)
        return dict(op=op, fn=_bn_fn, args=[x, rm, rv, p_(3), p_(3)], kw=dict(training=train),
                    diff=dict(input=0, weight=3, bias=4))  # fmt: skip
    if op in ("softmax", "log_softmax"):
        fn = torch.softmax if op == "softmax" else torch.log_softmax
        return dict(op=op, fn=fn, args=[x_(16, L), -1], kw={}, diff=dict(input=0))
    if op == "avg_pool2d":
        if cfg == "avg_pool2d":
            kw = dict(kernel_size=L, stride=max(1, L - 1))
        else:
            kw = dict(kernel_size=L, stride=2, padding=L // 2, count_include_pad=False, ceil_mode=True)
        return dict(op=op, fn=F.avg_pool2d, args=[x_(2, 3, 16, 17)], kw=kw, diff=dict(input=0))
    if op == "max_pool2d":
        kw = dict(kernel_size=L, stride=max(1, L // 2), padding=L // 2)
        return dict(op=op, fn=F.max_pool2d, args=[x_(2, 3, 16, 17)], kw=kw, diff=dict(input=0))
    if op == "max_pool1d":
        kw = dict(kernel_size=L, stride=1, padding=L // 2, dilation=2)
        return dict(op=op, fn=F.max_pool1d, args=[x_(2, 3, 40)], kw=kw, diff=dict(input=0))
    if op == "adaptive_avg_pool2d":
        out = {1: 8, 2: 4, 8: 1}[L]  # windows of about (8 / out)**2 taps on 8 x 8
        return dict(
            op=op, fn=F.adaptive_avg_pool2d, args=[x_(2, 3, 8, 8)], kw=dict(output_size=out), diff=dict(input=0)
        )
    if op == "adaptive_avg_pool1d":
        return dict(
            op=op, fn=F.adaptive_avg_pool1d, args=[x_(2, 3, 64)], kw=dict(output_size=64 // L), diff=dict(input=0)
        )
    if op == "scaled_dot_product_attention":
        kw = dict(is_causal=True) if "causal" in cfg else {}
        return dict(op=op, fn=F.scaled_dot_product_attention, args=[x_(1, 2, 8, 16), p_(1, 2, L, 16), p_(1, 2, L, 16)],
                    kw=kw, diff=dict(query=0, key=1, value=2))  # fmt: skip
    if op in ("sum", "mean", "var", "std"):
        kw = {"correction": 1} if op in ("var", "std") else {}
        return dict(op=op, fn=getattr(torch, op), args=[x_(8, L), -1], kw=kw, diff=dict(x=0))
    if op == "cumsum":
        return dict(op=op, fn=torch.cumsum, args=[x_(8, L), -1], kw={}, diff=dict(x=0))
    raise ValueError(cfg)


def _bw_cast(args, dt):
    return [a.to(dt) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def _grad_out(call, g):
    """grad_output: standard normal in the output's dtype (strided for a non-contiguous call)."""
    with torch.no_grad():
        out = call["fn"](*call["args"], **call["kw"])
    if call.get("layout") == "strided" and out.ndim:
        return _bw_values((*out.shape[:-1], 2 * out.shape[-1]), "randn", out.dtype, g)[..., ::2]
    return _bw_values(tuple(out.shape), "randn", out.dtype, g)


def _autograd(call, gout, dt=None, kw=None):
    """torch's CPU autograd gradients {name: grad} of the call (in ``dt``, then cast back to the call's dtype)."""
    args = call["args"] if dt is None else _bw_cast(call["args"], dt)
    pos = {i: n for n, i in call["diff"].items()}
    leaves = [a.detach().clone().requires_grad_() if i in pos else a for i, a in enumerate(args)]
    out = call["fn"](*leaves, **(call["kw"] if kw is None else kw))
    out.backward(gout.to(out.dtype))
    return {n: leaves[i].grad.to(call["args"][i].dtype) for n, i in call["diff"].items()}


def _yard(rep):
    """A report's own yardstick: (test, ratio): the envelope's max_bound_ratio, or the statistical test's
    max error / (sqrt(n) u M + 2 u |ref|), max_prob_ratio."""
    if (rep.detectable or {}).get("test") in ("worst-case envelope", "statistical, inside the envelope"):
        return "envelope", float(rep.max_bound_ratio)  # inside: the envelope stays the outer certainty
    return "statistical", float(rep.max_prob_ratio)


def _judge_bw(call, gout, name, grad):
    t = time.perf_counter()
    rep = rk.compare_backward({name: grad}, call["op"], gout, *call["args"], **call["kw"])[name]
    return rep, time.perf_counter() - t


def _manual_norm_grad_input(call, gout, drop_mean=True):
    """layer_norm / rms_norm / batch_norm[train] grad_input with the 1/n of its mean terms dropped (sums
    instead of means), in float64: r (gw - sum(gw) - xhat sum(gw xhat))."""
    op, a = call["op"], call["args"]
    x, g = a[0].double(), gout.double()
    if op == "batch_norm":
        c = x.shape[1]
        X, G = x.movedim(1, 0).reshape(c, -1), g.movedim(1, 0).reshape(c, -1)
        W = a[3].double()[:, None]
        center, eps = True, call["kw"].get("eps", 1e-5)
    else:
        n = x.shape[-1]
        X, G = x.reshape(-1, n), g.reshape(-1, n)
        W = a[2].double()[None, :]
        center = op == "layer_norm"
        eps = 1e-5 if op == "layer_norm" else _rms_eps(call["kw"], a[0].dtype)
    m = X.mean(1, keepdim=True) if center else torch.zeros(())
    v = X.var(1, keepdim=True, correction=0) if center else (X * X).mean(1, keepdim=True)
    r = torch.rsqrt(v + eps)
    xh = (X - m) * r
    gw = G * W
    s1 = gw.sum(1, keepdim=True) if center else 0.0
    y = r * (gw - s1 - xh * (gw * xh).sum(1, keepdim=True))
    if op == "batch_norm":
        y = y.reshape(c, x.shape[0], *x.shape[2:]).movedim(0, 1)
    return y.reshape(x.shape).to(a[0].dtype)


def bw_natural_bugs(call, gout, good):
    """(gradient name, kind, output): bugs of the op's own kind, each on one gradient of ``good``."""
    op, a, kw = call["op"], call["args"], call["kw"]
    names = set(good)
    out = []
    params = [n for n in ("weight", "bias") if n in names]
    if op == "matmul":
        params = ["b"]  # broadcast over the leading batch dimension of a
    if params and gout.ndim >= 2 and gout.shape[0] > 1:
        g0 = gout.clone()
        g0[0] = 0
        bad = _autograd(call, g0)
        for n in params:
            out.append((n, "batch element 0 missing from the batch sum", bad[n]))
            out.append(
                (n, "batch reduction as a mean, not a sum", (good[n].double() / gout.shape[0]).to(good[n].dtype))
            )
        if gout.ndim >= 3 and gout.shape[-1] > 1 and op != "matmul":
            gs = gout.clone()
            gs[..., gout.shape[-1] // 2] = 0
            bad = _autograd(call, gs)
            for n in params:
                out.append((n, "one spatial position missing from the sum", bad[n]))
    if "bias" in names:
        gd = gout.double()
        dt = good["bias"].dtype
        if op == "linear" and gout.shape[0] == gout.shape[-1]:
            out.append(("bias", "grad_bias summed over the wrong axis", gd.sum(1).to(dt)))
        if gout.ndim >= 2 and gout.shape[0] > 1:
            only = gd[0] if gout.ndim == 2 else gd[0].reshape(gd.shape[1], -1).sum(1)
            out.append(("bias", "grad_bias: batch axis not reduced (sample 0 only)", only.to(dt)))
    if op == "scaled_dot_product_attention":
        scale = 1.0 / np.sqrt(a[0].shape[-1])
        for n in ("key", "query"):
            out.append((n, f"d{n[0]} without the scale", (good[n].double() / scale).to(good[n].dtype)))
    if op in ("layer_norm", "rms_norm") or (op == "batch_norm" and kw.get("training")):
        out.append(("input", "grad_input without the 1/n of its mean terms", _manual_norm_grad_input(call, gout)))
    if op in ("softmax", "log_softmax") and a[0].shape[-1] > 1:
        y = torch.softmax(a[0].double(), -1)
        gd = gout.double()
        bad = y * gd if op == "softmax" else gd
        out.append(("input", "row-sum term dropped", bad.to(a[0].dtype)))
    if op == "avg_pool2d" and kw.get("count_include_pad", True):
        k = kw["kernel_size"]
        out.append(("input", "the divisor forgotten", (good["input"].double() * k * k).to(a[0].dtype)))
    if op == "mean" and a[0].shape[-1] > 1:
        out.append(("x", "the 1/n forgotten", gout.double()[..., None].expand(a[0].shape).to(a[0].dtype)))
    if op == "var" and a[0].shape[-1] > 1:
        out.append(("x", "the factor 2 forgotten", (good["x"].double() / 2).to(a[0].dtype)))
    if op == "std" and a[0].shape[-1] > 2:
        n = a[0].shape[-1]
        out.append(("x", "divides by n, not n - 1", (good["x"].double() * (n - 1) / n).to(a[0].dtype)))
    if op == "cumsum" and a[0].shape[-1] > 1:
        out.append(("x", "forward cumsum instead of the reversed one", torch.cumsum(gout.double(), -1).to(a[0].dtype)))
        rev = good["x"].double() - gout.double()
        out.append(("x", "exclusive reversed cumsum", rev.to(a[0].dtype)))
    return out


def bw_generic_bugs(grad, ref):
    """(kind, output): bugs of any gradient: shifted by one position, one channel's sign flipped."""
    out = []
    if grad.ndim and grad.shape[-1] > 1:
        out.append(("shifted by one position", torch.roll(grad, 1, -1)))
    if grad.ndim >= 2 and grad.shape[1] > 1:
        y = grad.clone()
        c = grad.shape[1] // 2
        y[:, c] = -y[:, c]
        out.append(("sign flipped on one channel", y))
    elif grad.ndim == 1 and grad.shape[0] > 1:
        y = grad.clone()
        c = grad.shape[0] // 2
        y[c] = -y[c]
        out.append(("sign flipped on one channel", y))
    return out


def _set(grad, i, v):
    y = grad.clone().reshape(-1)
    y[i] = torch.tensor(v, dtype=torch.float64).to(grad.dtype)
    return y.reshape(grad.shape)


def bw_element_bugs(call, gout, name, grad, ref, base_ratio, g, quick):
    """(kind, output, yardstick of the element or None): one element moved by s x its own bound (scale),
    the element's yardstick found by asking the report (the element moved far: max ratio / distance);
    noise of relative size 1e-6 .. 1e-2 on every element."""
    out = []
    flat = ref.reshape(-1)
    fin = np.flatnonzero(np.isfinite(flat))
    if len(fin):
        i = int(fin[int(torch.randint(0, len(fin), (1,), generator=g))])
        sgn = 1.0 if int(torch.randint(0, 2, (1,), generator=g)) else -1.0
        fi = torch.finfo(grad.dtype)
        ulp = max(abs(flat[i]), float(np.abs(flat[fin]).max()) * 2.0**-10, fi.tiny) * fi.eps
        yard = None
        d = 64 * ulp
        for _ in range(6):  # the report's yardstick of element i: move it until it dominates the report
            v = flat[i] + sgn * d
            if not np.isfinite(float(torch.tensor(v, dtype=torch.float64).to(grad.dtype))):
                break
            probe = _set(grad, i, v)
            rep, _ = _judge_bw(call, gout, name, probe)
            _, r = _yard(rep)
            dist = abs(float(probe.reshape(-1)[i].double()) - flat[i])
            if not np.isfinite(r) or r == 0:
                break
            if r > 8 * max(base_ratio, 1.0):
                yard = dist / r
                break
            d *= 16
        if yard is not None:
            for s in BW_SCALES_QUICK if quick else BW_SCALES:
                out.append(
                    (f"one element off by {s:g}x its bound/scale", _set(grad, i, flat[i] + sgn * s * yard), yard)
                )
        else:  # no finite yardstick (sum's gradient is judged bit for bit): a relative error instead
            out.append(("one element off by 1e-3 relative", _set(grad, i, flat[i] * (1 + 1e-3) or 1e-3), None))
    for s in BW_NOISE_QUICK if quick else BW_NOISE:
        z = torch.randn(grad.shape, generator=g, dtype=torch.float64)
        out.append((f"noise of relative size {s:g}", (grad.double() * (1 + s * z)).to(grad.dtype), None))
    return out


def bw_reduced(call, gout):
    """(precision, gradient name, output): float32 gradients of torch computed from operands (and grad_output)
    rounded to tf32 / bf16 / fp16: a reduced-precision product, which the statistical test names."""
    out = []
    if call["op"] not in STAT_OPS:
        return out
    for prec in ("bf16", "fp16", "tf32"):
        if prec == "tf32":
            ra = [_round(a, TFLOAT32, 0) if isinstance(a, torch.Tensor) else a for a in call["args"]]
            gr = _round(gout, TFLOAT32, 0)
        else:
            dt = torch.bfloat16 if prec == "bf16" else torch.float16
            ra = [a.to(dt).float() if isinstance(a, torch.Tensor) else a for a in call["args"]]
            gr = gout.to(dt).float()
        grads = _autograd(dict(call, args=ra), gr)
        for n, v in grads.items():
            if n != "bias":  # grad_bias is a sum of grad_output alone: rounding it is the same sum of other numbers
                out.append((prec, n, v))
    return out


def _bw_row(call_meta, grad, rep, seconds, **kv):
    test, ratio = _yard(rep)
    det = rep.detectable or {}
    return dict(
        **call_meta,
        grad=grad,
        n=int(rep.n_terms),
        test=test,
        verdict=rep.verdict,
        precision=rep.precision,
        alternatives=list(rep.alternatives),
        ratio=ratio,
        det_scale_units=float(det.get("element_in_scale_units", np.nan)) if test == "statistical" else np.nan,
        seconds=seconds,
        **kv,
    )


def bw_case(cfg, length, data, dtype, layout, seed, extras, bugs, quick, log_err):
    """Every truth for one call: torch's autograd gradients (and float64 autograd rounded), with ``extras``
    reduced precisions, with ``bugs`` the bugs."""
    call = bw_call(cfg, length, data, dtype, layout, seed)
    call["layout"] = layout
    g = _gen("bwg", cfg, length, data, dtype, layout, seed)
    gout = _grad_out(call, g)
    meta = dict(op=cfg, length=length, data=data, dtype=dtype, layout=layout, seed=seed,
                case=[cfg, length, data, dtype, layout, seed])  # fmt: skip
    rows = []
    try:
        good = _autograd(call, gout)
    except (RuntimeError, NotImplementedError) as e:
        log_err(f"{cfg} {dtype}: torch has no kernel ({str(e).splitlines()[0][:80]})")
        return rows
    truths = [("torch autograd", good)]
    if dtype != "float64":
        kw64 = _fixed(call["op"], call["kw"], dtype) if call["op"] == "rms_norm" else None
        truths.append(("torch float64 autograd, rounded", _autograd(call, gout, torch.float64, kw64)))
    base = {}
    for src, grads in truths:
        for n, v in grads.items():
            try:
                rep, s = _judge_bw(call, gout, n, v)
            except (NotImplementedError, RuntimeError, ValueError) as e:
                log_err(
                    f"{cfg} {dtype} {n}: compare_backward raised {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                )
                continue
            # torch's CPU norms round grad_weight's and grad_bias's running sums to a half input's dtype: naming
            # that precision is right, not an alarm (the float32 model fails it by hundreds of sigma at 64 rows)
            may = _half_sums(call, n, dtype) if src == "torch autograd" else None
            rows.append(_bw_row(meta, n, rep, s, truth="correct", name=src, may_name=may))
            if src == "torch autograd":
                base[n] = rep
    for prec, n, v in bw_reduced(call, gout) if extras else ():
        rep, s = _judge_bw(call, gout, n, v)
        rows.append(_bw_row(meta, n, rep, s, truth=f"reduced:{prec}", name=f"{prec} operands, torch fp32"))
    if not bugs:
        return rows
    exact = rk.backward(call["op"], gout, *call["args"], wrt=tuple(base), **call["kw"])
    refs = {n: exact[n].double().numpy() if isinstance(exact[n], torch.Tensor) else np.asarray(exact[n], np.float64)
            for n in base}  # fmt: skip
    bl = []
    for n, kind, out in bw_natural_bugs(call, gout, good):
        if n in base:
            bl.append((n, kind, out, None))
    gb = _gen("bwbug", cfg, length, data, dtype, layout, seed)
    for n in base:
        for kind, out in bw_generic_bugs(good[n], refs[n]):
            bl.append((n, kind, out, None))
        _, r0 = _yard(base[n])
        for kind, out, yard in bw_element_bugs(call, gout, n, good[n], refs[n], r0, gb, quick):
            bl.append((n, kind, out, yard))
    for n, kind, out, _yd in bl:
        if out.shape != good[n].shape or _same(out, good[n]):
            continue  # not a bug on this call
        rep, s = _judge_bw(call, gout, n, out)
        test, _ = _yard(rep)
        err = np.abs(out.double().numpy() - refs[n])
        err = np.where(np.isnan(err), np.inf, err)
        det = (base[n].detectable or {}).get("element") if test == "statistical" else None
        size_det = float(err.max(initial=0.0) / det) if det else np.nan
        # on torch's half-summed norm parameters (named that precision themselves), a bug below that precision's
        # spread named it is no excuse: the kernel is that precision
        own = base[n].precision if base[n].verdict == "reduced-precision" and _half_sums(call, n, dtype) else None
        rows.append(_bw_row(meta, n, rep, s, truth="bug", name=kind, size=_yard(rep)[1], size_det=size_det,
                            base_ratio=_yard(base[n])[1], may_name=own))  # fmt: skip
    return rows


def _bw_plan(cfg, length, data, dtype, quick, seed):
    """[(layout, extras?, bugs?)] for one (config, length, data, dtype). Full: every sensible regime
    contiguous, the transposed and strided layouts on randn; reduced precisions on fp32 randn; bugs on
    fp32 (every regime, contiguous) and on every dtype for randn data. Quick: randn for every
    dtype and one other regime for one dtype per (config, length), rotating; one layout per case, rotating;
    float64 (where listed) on randn at the middle length, correct results only;
    reduced precisions on fp32 randn at the middle length; bugs on fp32 randn at every length and on one
    half dtype (rotating) at the middle length."""
    _, op, lengths, datas, f64 = BW_CFG[cfg]
    if (dtype == "float64" and not f64) or data not in datas:
        return []
    mid = lengths[len(lengths) // 2]
    if quick and dtype == "float64":  # correct results only, randn, the middle length
        return [(_pick(BW_LAYOUTS, cfg, seed), False, False)] if data == "randn" and length == mid else []
    if quick:
        if data != "randn":
            other = [d for d in datas if d != "randn"]
            if data != _pick(other, cfg, length, seed) or dtype != _pick(BW_DTYPES[:3], cfg, length, seed, "d"):
                return []
        lay = _pick(BW_LAYOUTS, cfg, length, data, dtype, seed)
        if op == "scaled_dot_product_attention" and dtype != "float32" and length == lengths[-1]:
            return []  # the longest half-precision attention: the exact fallback runs long
        half = dtype == _pick(("float16", "bfloat16"), cfg, seed)
        bugs = data == "randn" and (dtype == "float32" or (half and length == mid))
        return [(lay, dtype == "float32" and data == "randn" and length == mid, bugs)]
    lays = BW_LAYOUTS if data == "randn" else ("contiguous",)
    return [
        (lay, lay == "contiguous" and dtype == "float32" and data == "randn",
         lay == "contiguous" and (dtype == "float32" or data == "randn"))
        for lay in lays
    ]  # fmt: skip


def run_backward(quick=False, seeds=1, configs=None, dtypes=BW_DTYPES, data=None, lengths=None, log=print):
    """The backward family's confusion matrix: rows of dicts (see summarise_backward). ``lengths``: indices
    into each config's three lengths (default: all)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*degrees of freedom is <= 0.*")
    warnings.filterwarnings("ignore", message=".*padding='same' with even kernel lengths.*")
    configs = [c[0] for c in BW_CONFIGS] if configs is None else configs
    rows, errs = [], []
    for seed in range(seeds):
        for cfg in configs:
            t0 = time.perf_counter()
            _, _, ls, datas, _ = BW_CFG[cfg]
            sel = ls if lengths is None else tuple(ls[i] for i in lengths if i < len(ls))
            for length in sel:
                for d in datas if data is None else [e for e in datas if e in data]:
                    for dtype in dtypes:
                        for lay, extras, bugs in _bw_plan(cfg, length, d, dtype, quick, seed):
                            rows += bw_case(cfg, length, d, dtype, lay, seed, extras, bugs, quick, errs.append)
            log(f"backward {cfg}: {len(rows)} cases so far ({time.perf_counter() - t0:.0f} s)")
    for e in sorted(set(errs)):
        log("  skipped: " + e)
    return rows


def _must(r):
    """The multiple of its yardstick at which a bug must be caught: 2x the envelope, 10x the scale."""
    return 2.0 if r["test"] == "envelope" else 10.0


def _must_catch(r):
    """A bug that must be caught: its report's ratio at least the multiple, and at least that multiple of
    the ratio the correct gradient itself reached (torch's half-precision conv / matmul gradients reach
    100-1000x the fp32 scale sqrt(n) u M: a bug's ratio there measures torch's rounding, not the bug)."""
    return r["size"] >= _must(r) * max(1.0, r.get("base_ratio", 0.0))


def _half_sums(call, grad, dtype):
    """The half precision torch's CPU norms sum grad_weight and grad_bias in, for a half input (else None)."""
    half = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype)
    return half if call["op"] in NORM_BW and grad in ("weight", "bias") else None


def _named_own(r) -> bool:
    """A reduced precision named that the kernel itself has (torch's half-summed norm parameters)."""
    return r["verdict"] == "reduced-precision" and bool(r.get("may_name")) and r["precision"] == r["may_name"]


def _alarm(r) -> bool:
    """A correct gradient judged neither exact nor rounding, nor the reduced precision its kernel has."""
    return r["verdict"] not in ("exact", "rounding") and not _named_own(r)


def summarise_backward(rows) -> dict:
    correct = [r for r in rows if r["truth"] == "correct"]
    fa = [r for r in correct if _alarm(r)]
    by_op_dtype = {}
    for r in correct:
        e = by_op_dtype.setdefault(r["op"], {}).setdefault(r["dtype"], [0, 0])
        e[0] += _alarm(r)
        e[1] += 1
    slack = {}  # the largest ratio a correct result used, per config and test
    for r in correct:
        if np.isfinite(r["ratio"]):
            k = f"{r['op']} ({r['test']})"
            slack.setdefault(k, {})
            slack[k][r["dtype"]] = max(slack[k].get(r["dtype"], 0.0), r["ratio"])
    reduced = [r for r in rows if r["truth"].startswith("reduced:")]
    outcome = {}
    for r in reduced:
        p = r["truth"][8:]
        r["outcome"] = (
            "named right" if r["verdict"] == "reduced-precision" and (r["precision"] == p or p in r["alternatives"])
            else "named another precision" if r["verdict"] == "reduced-precision"
            else r["verdict"]
        )  # fmt: skip
        e = outcome.setdefault(p, {})
        e[r["outcome"]] = e.get(r["outcome"], 0) + 1
    bugs = [r for r in rows if r["truth"] == "bug"]
    for r in bugs:
        r["caught"] = r["verdict"] == "mismatch"
        r["kind"] = r["name"] if not r["name"].startswith("one element off by") else "one element off by s x yardstick"
        r["must"] = _must_catch(r)
    big = [r for r in bugs if r["must"]]
    masked = [r for r in bugs if r["size"] >= _must(r) and not r["must"]]  # the correct gradient's own ratio >= 1

    def bins(test):
        return SBINS if test == "envelope" else STAT_SBINS

    def binof(r):
        for lab, lo, hi in bins(r["test"]):
            if lo <= r["size"] < hi or (hi == np.inf and r["size"] == np.inf):
                return lab
        return "nan"

    by_size = {}
    for r in bugs:
        c = by_size.setdefault(r["test"], {}).setdefault(binof(r), [0, 0, 0])
        c[0] += r["caught"]
        c[1] += 1
        c[2] += r["verdict"] == "reduced-precision"
    by_kind = {}
    for r in bugs:
        e = by_kind.setdefault(f"{r['kind']} [{r['test'][:4]}]", {"n": 0, "precision": 0})
        e["n"] += 1
        c = e.setdefault(binof(r), [0, 0])
        c[0] += r["caught"]
        c[1] += 1
        e["precision"] += r["verdict"] == "reduced-precision"
    by_n, by_dtype, by_op = {}, {}, {}
    for r in bugs:
        for d, key in ((by_n, f"{r['test']} n {_nbin(r['n'])}"), (by_dtype, f"{r['test']} {r['dtype']}"),
                       (by_op, r["op"])):  # fmt: skip
            e = d.setdefault(key, {"bugs": 0, "must": 0, "caught_must": 0, "caught": 0})
            e["bugs"] += 1
            e["must"] += r["must"]
            e["caught_must"] += r["must"] and r["caught"]
            e["caught"] += r["caught"]
    stat_det = [r for r in bugs if r["test"] == "statistical" and np.isfinite(r.get("size_det", np.nan))]
    below = [r for r in bugs if r["size"] < 1]
    return {
        "cases": len(rows),
        "correct": len(correct),
        "correct_named_half_sums": sum(r["verdict"] == "reduced-precision" and not _alarm(r) for r in correct),
        "false_alarms": len(fa),
        "false_alarm_rate": len(fa) / max(len(correct), 1),
        "false_alarms_by_op_dtype": {o: {d: f"{a}/{b}" for d, (a, b) in v.items()} for o, v in by_op_dtype.items()},
        "false_alarms_by_source": {
            k: _frac([r for r in correct if r["name"] == k], lambda r: r in fa)
            for k in sorted({r["name"] for r in correct})
        },
        "largest_ratio_on_correct": slack,
        "reduced": len(reduced),
        "reduced_outcomes": outcome,
        "named_right": sum(r["outcome"] == "named right" for r in reduced),
        "bugs": len(bugs),
        "bugs_must": len(big),
        "caught_must": sum(r["caught"] for r in big),
        "must_by_test": {
            t: _frac([r for r in big if r["test"] == t], lambda r: r["caught"]) for t in ("envelope", "statistical")
        },
        "bugs_over_multiple_within_base": len(masked),
        "caught_over_multiple_within_base": sum(r["caught"] for r in masked),
        "bugs_below_1x": len(below),
        "caught_below_1x": sum(r["caught"] for r in below),
        "below_1x_named_a_precision": sum(r["verdict"] == "reduced-precision" and not _named_own(r) for r in below),
        "below_1x_named_its_own_precision": sum(_named_own(r) for r in below),
        "bugs_named_a_precision": sum(r["verdict"] == "reduced-precision" for r in bugs),
        "statistical_by_detectable": {
            lab: _frac([r for r in stat_det if lo <= r["size_det"] < hi], lambda r: r["caught"])
            for lab, lo, hi in (("<1x", 0, 1), ("1-2x", 1, 2), (">=2x", 2, np.inf))
        },
        "power_by_size": {t: {b: f"{c}/{n} (precision {p})" for b, (c, n, p) in v.items()} for t, v in by_size.items()},
        "power_by_kind": by_kind,
        "power_by_length": by_n,
        "power_by_dtype": by_dtype,
        "power_by_op": by_op,
        "median_seconds": float(np.median([r["seconds"] for r in rows])) if rows else 0.0,
        "false_alarm_cases": fa[:40],
        "missed_must": [r for r in big if not r["caught"]][:60],
        "named_a_precision": [r for r in bugs if r["verdict"] == "reduced-precision" and not _named_own(r)][:40],
        "misnamed": [r for r in reduced if r["outcome"] != "named right"][:40],
    }


def print_backward(s, log=print):
    log(f"\n== backward family: {s['cases']} cases (median {s['median_seconds']:.3f} s per compare_backward)")
    log(f"false alarms on correct gradients: {s['false_alarms']} / {s['correct']} ({100 * s['false_alarm_rate']:.2f}%)")
    dts = BW_DTYPES
    log(f"  {'op':38s}" + "".join(f"{d:>10s}" for d in dts))
    for op, v in s["false_alarms_by_op_dtype"].items():
        log(f"  {op:38s}" + "".join(f"{v.get(d, '-'):>10s}" for d in dts))
    log("  by source: " + ", ".join(f"{k} {v}" for k, v in s["false_alarms_by_source"].items()))
    log("  largest ratio a correct gradient used (envelope: error/envelope; statistical: error/scale):")
    for k, v in s["largest_ratio_on_correct"].items():
        log(f"    {k:52s} " + "  ".join(f"{d} {x:.3g}" for d, x in v.items()))
    log(f"reduced precisions (fp32 gradients of rounded operands) named right: {s['named_right']} / {s['reduced']}")
    for p, v in s["reduced_outcomes"].items():
        log(f"  {p}: " + ", ".join(f"{k} {c}" for k, c in sorted(v.items())))
    log(
        f"bugs >= 2x the envelope / >= 10x the statistical scale caught: {s['caught_must']} / {s['bugs_must']} "
        f"(envelope {s['must_by_test']['envelope']}, statistical {s['must_by_test']['statistical']}); below 1x: "
        f"caught {s['caught_below_1x']} / {s['bugs_below_1x']}, named a precision {s['below_1x_named_a_precision']}; "
        f"all bugs named a precision: {s['bugs_named_a_precision']} / {s['bugs']}"
    )
    log(
        f"  not counted as must-catch: bugs over the multiple but within that multiple of the correct gradient's own "
        f"ratio (torch's half kernels): caught {s['caught_over_multiple_within_base']} / "
        f"{s['bugs_over_multiple_within_base']}"
    )
    log("  power by size (caught/n, named a precision):")
    for t, v in s["power_by_size"].items():
        log(f"    {t:12s} " + "  ".join(f"{b}: {x}" for b, x in v.items()))
    log(
        "  statistical, by max error / the clean report's detectable element (median): "
        + ", ".join(f"{k} {v}" for k, v in s["statistical_by_detectable"].items())
    )
    log(
        f"  {'bug kind [test]':58s}{'n':>5s}"
        + "".join(f"{lab:>10s}" for lab, _, _ in SBINS + STAT_SBINS[1:])
        + "  prec"
    )
    for k, v in sorted(s["power_by_kind"].items()):
        cells = []
        for lab, _, _ in SBINS + STAT_SBINS[1:]:
            cells.append(f"{'{}/{}'.format(*v[lab]) if lab in v else '-':>10s}")
        log(f"  {k[:58]:58s}{v['n']:>5d}" + "".join(cells) + f"{v['precision']:>6d}")
    log("  by terms per gradient element (all caught/n; must-catch caught/n):")
    for k in sorted(s["power_by_length"], key=lambda k: (k.split(" n ")[0], NBINS.index(k.split(" n ")[1]))):
        e = s["power_by_length"][k]
        log(f"    {k:28s} all {e['caught']}/{e['bugs']}, must {e['caught_must']}/{e['must']}")
    log("  by dtype:")
    for k, e in sorted(s["power_by_dtype"].items()):
        log(f"    {k:28s} all {e['caught']}/{e['bugs']}, must {e['caught_must']}/{e['must']}")
    log("  by op:")
    for k, e in s["power_by_op"].items():
        log(f"    {k:38s} all {e['caught']}/{e['bugs']}, must {e['caught_must']}/{e['must']}")
    for key in ("false_alarm_cases", "missed_must", "named_a_precision", "misnamed"):
        for r in s[key][:25]:
            log(
                f"  {key}: {r['case']} {r['grad']} {r['truth']} {r['name']}: {r['verdict']} {r['precision'] or ''} "
                f"{r['test']} ratio {r['ratio']:.3g} n {r['n']}"
                + (f" size_det {r['size_det']:.3g} base {r['base_ratio']:.3g}" if "size_det" in r else "")
            )


def repro_backward(case, grad, truth="torch autograd", bug=None):
    """Print the Report of one backward case (``case`` as a row's ``case``); ``bug``: a bug kind to inject."""
    cfg, length, data, dtype, layout, seed = case
    call = bw_call(cfg, length, data, dtype, layout, seed)
    call["layout"] = layout
    gout = _grad_out(call, _gen("bwg", cfg, length, data, dtype, layout, seed))
    good = _autograd(call, gout) if truth == "torch autograd" else _autograd(call, gout, torch.float64)
    v = good[grad]
    if bug is not None:
        v = {k: o for n, k, o in bw_natural_bugs(call, gout, good) if n == grad}.get(bug)
        if v is None:
            v = dict(bw_generic_bugs(good[grad], None))[bug]
    rep, _ = _judge_bw(call, gout, grad, v)
    print(rep)
    return rep


# ---------------------------------------------------------------- power family: bugs in absolute units
#
# A bug's size is measured against the spread of correct implementations, the largest |error| of any
# emulated correct kernel on the very inputs (``spread = max_k max_i |out_k,i - exact_i|``, exact the
# float64 rounding of refkern's exact result), never against the verdict's own envelope or scale.

PW_OPS = (
    "layer_norm",
    "rms_norm",
    "softmax",
    "log_softmax",
    "scaled_dot_product_attention",
    "sum",
    "mean",
    "var",
    "cumsum",
)
PW_DTYPES = ("float32", "bfloat16", "float16")
PW_SIZES = {  # features (norms, softmax rows), keys (attention), terms (reductions, scans)
    "features": (64, 1024, 4096, 8192),
    "keys": (64, 1024, 4096, 8192),
    "terms": (1000, 100_000, 10_000_000),
    "scan": (1000, 100_000, 1_000_000),
}
PW_SIZES_QUICK = {"features": (64, 1024, 4096), "keys": (64, 1024), "terms": (1000, 100_000), "scan": (1000, 100_000)}
PW_SCALES = (0.5, 1, 2, 4, 8, 16, 32)  # a bug's largest |error| in spreads
PW_SCALES_QUICK = (0.5, 2, 8, 32)
PW_AXIS = {
    "layer_norm": "features",
    "rms_norm": "features",
    "softmax": "features",
    "log_softmax": "features",
    "scaled_dot_product_attention": "keys",
    "sum": "terms",
    "mean": "terms",
    "var": "terms",
    "cumsum": "scan",
}
PW_DATA = {"layer_norm": ("randn", "offset"), "rms_norm": ("randn", "offset"), "var": ("randn", "offset")}
PW_DATA_QUICK = {"layer_norm": ("offset",), "var": ("offset",)}
PW_ROWS = 4  # rows of the norms, softmax and scans (the reductions: one row)
PW_TILE = 128  # keys per tile of the online softmax (FlashAttention style)
RMS_EPS = float(torch.finfo(torch.float32).eps)  # torch's default for fp32/fp16/bf16 inputs, made explicit
_PREC = {"float32": (24, -126), "bfloat16": (8, -126), "float16": (11, -14)}


def pw_call(op, n, data, dtype, seed):
    """(args, kwargs) of the call: norms over ``n`` offset (mean 300, std 1) or randn features with weight
    1 + W (W ~ 0.1 N(0, 1), the Gemma convention the named bugs get wrong) and bias 0.1 N(0, 1); softmax
    rows of randn logits; attention (1, 2, 16, 64) queries over ``n`` keys; one row of ``n`` terms."""
    dt = DT[dtype]
    g = _gen("power", op, n, data, dtype, seed)

    def rnd(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)

    def x_of(shape):
        x = rnd(*shape)
        return (x + 300.0 if data == "offset" else x).to(dt)

    if op in ("layer_norm", "rms_norm"):
        x = x_of((PW_ROWS, n))
        W = 0.1 * rnd(n)
        w = (1.0 + W).to(dt)
        if op == "layer_norm":
            return (x, (n,), w, (0.1 * rnd(n)).to(dt)), {"eps": 1e-5, "_W": W}
        return (x, (n,), w), {"eps": RMS_EPS, "_W": W}
    if op in ("softmax", "log_softmax"):
        return (x_of((PW_ROWS, n)), -1), {}
    if op == "scaled_dot_product_attention":
        return (rnd(1, 2, 16, 64).to(dt), rnd(1, 2, n, 64).to(dt), rnd(1, 2, n, 64).to(dt)), {}
    if op == "cumsum":
        return (x_of((PW_ROWS, n)), -1), {}
    kw = {"correction": 1} if op == "var" else {}
    return (x_of((1, n)), -1), kw


def _pw_kw(kw):
    """The call's kwargs without the benchmark's own (underscored) entries."""
    return {k: v for k, v in kw.items() if not k.startswith("_")}


def _pw_fn(op):
    return _env_fn(op)


def pw_exact(op, args, kw):
    """refkern's exact result on float64 copies of the inputs (rounded once to float64), float64 numpy."""
    r = getattr(rk, op)(*_cast(args, torch.float64), **_pw_kw(kw))
    r = r[0] if isinstance(r, tuple) else r
    return np.asarray(r.numpy() if isinstance(r, torch.Tensor) else r, np.float64)


def ulp_of(v, dtype):
    """The ulp of ``dtype`` at the values ``v`` (float64): 2**(max(e, emin) - prec + 1), 2**e <= |v| < 2**(e+1)."""
    prec, emin = _PREC[dtype]
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(np.abs(np.asarray(v, np.float64))))
    e = np.where(np.isfinite(e), e, emin)
    return np.ldexp(1.0, (np.maximum(e, emin) - prec + 1).astype(int))


def _np(t):
    return t.double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)


def _to(a, dt, shape):
    """A float32 numpy result as a torch tensor of ``dt`` (rounded once) and ``shape``."""
    return torch.from_numpy(np.ascontiguousarray(a, F32)).reshape(shape).to(dt)


def _lanes(X, lanes, block):
    """Each row summed in blocks of ``block`` by ``lanes`` strided float32 accumulators (a SIMD loop), the
    lanes added pairwise, the block sums added pairwise (float32)."""
    r, n = X.shape
    nb = max(1, -(-n // block))
    Y = np.zeros((r, nb * block), F32)
    Y[:, :n] = X
    Z = Y.reshape(r, nb, block // lanes, lanes)
    acc = np.cumsum(Z, axis=2, dtype=F32)[:, :, -1, :]  # (r, nb, lanes): each lane left to right
    return _tree(_tree(acc.reshape(r * nb, lanes)).reshape(r, nb))


def _online_softmax(X, tile, log):
    """softmax (log_softmax) of the float32 rows X over tiles of ``tile`` columns with a running max and a
    running sum rescaled at every new max (the online softmax of FlashAttention), float32."""
    r, n = X.shape
    m = np.full(r, -np.inf, F32)
    l = np.zeros(r, F32)
    for s in range(0, n, tile):
        t = X[:, s : s + tile]
        mn = np.maximum(m, t.max(1))
        l = l * np.exp(m - mn) + np.exp(t - mn[:, None]).sum(1, dtype=F32)
        m = mn
    if log:
        return X - m[:, None] - np.log(l)[:, None]
    return np.exp(X - m[:, None]) / l[:, None]


def _exp_u20_softmax(X, log, online):
    """softmax (log_softmax) of the float32 rows X with torch's ``Vectorized<float>::exp_u20`` (emulated bit
    for bit, calibrate_exp_u20.py), float32: two passes (the maximum, then the exps and their sum), or
    ``online`` per element (Milakov and Gimelshein's running normaliser: the sum rescaled by an exp at every
    new maximum, as a thread's sequential loop in a warp-level softmax does)."""
    if "rows" not in _EXP_U20:
        import importlib.util

        from numba import njit

        path = Path(__file__).with_name("calibrate_exp_u20.py")
        spec = importlib.util.spec_from_file_location("calibrate_exp_u20", path)
        cal = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = cal  # numba resolves a jitted function's module by name (its cache, when warm)
        spec.loader.exec_module(cal)
        exp = cal.exp_u20

        @njit
        def rows(X, log, online):
            R, n = X.shape
            Y = np.empty((R, n), np.float32)
            for i in range(R):
                m, d = np.float32(-np.inf), np.float32(0.0)
                if online:
                    for j in range(n):
                        mn = max(m, X[i, j])
                        d = np.float32(np.float32(d * exp(np.float32(m - mn))) + exp(np.float32(X[i, j] - mn)))
                        m = mn
                else:
                    for j in range(n):
                        m = max(m, X[i, j])
                    for j in range(n):
                        d = np.float32(d + exp(np.float32(X[i, j] - m)))
                ld = np.float32(np.log(d))
                for j in range(n):
                    t = np.float32(X[i, j] - m)
                    Y[i, j] = np.float32(t - ld) if log else np.float32(exp(t) / d)
            return Y

        _EXP_U20["rows"] = rows
    return _EXP_U20["rows"](np.ascontiguousarray(X, F32), log, online)


_EXP_U20 = {}


def _attn_np(q, k, v, tile=None, p_dtype=None):
    """Attention in float32 numpy: scores q k^T / sqrt(d), softmax, P V; ``tile``: online over tiles of
    keys (running max, rescaled sum and output); ``p_dtype``: P rounded to that torch dtype before P V
    (Hugging Face's eager attention, FlashAttention 2)."""
    Q, K, V = (_f32(a) for a in (q, k, v))
    sc = F32(1.0 / np.sqrt(Q.shape[-1]))
    if tile is None:
        S = (Q @ np.swapaxes(K, -1, -2)) * sc
        E = np.exp(S - S.max(-1, keepdims=True))
        P = E / E.sum(-1, keepdims=True, dtype=F32)
        if p_dtype is not None:
            P = torch.from_numpy(P).to(p_dtype).float().numpy()
        return P @ V
    shape = Q.shape[:-1]
    m = np.full(shape, -np.inf, F32)
    l = np.zeros(shape, F32)
    acc = np.zeros(Q.shape[:-1] + (V.shape[-1],), F32)
    for s in range(0, K.shape[-2], tile):
        S = (Q @ np.swapaxes(K[..., s : s + tile, :], -1, -2)) * sc
        mn = np.maximum(m, S.max(-1))
        a = np.exp(m - mn)
        p = np.exp(S - mn[..., None])
        l = l * a + p.sum(-1, dtype=F32)
        acc = acc * a[..., None] + p @ V[..., s : s + tile, :]
        m = mn
    return acc / l[..., None]


def pw_correct(op, args, kw, dtype, good, data):
    """(name, output): correct implementations of the call besides torch's own: torch in float64 rounded,
    (half) torch in float32 rounded once, and float32 emulations in numpy (rounded once to a half dtype):
    bench_verdict's ``alternatives`` (sums left to right, reversed, tree, blocked, Kahan; two-pass, Welford
    and Chan-merged variances; norms direct, folded and divided; softmax by division and reciprocal),
    SIMD-lane sums, the two-pass folded norm, Hugging Face's RMSNorm (half: the normalised row rounded
    before the weight), online softmax over tiles of 128, softmax with torch's exp_u20 in two passes and
    online per element, attention direct, online over tiles of 128 keys and one key at a time, and (half)
    with P rounded before P V. Sequential float32 sums of one-signed terms (offset data, var's and std's squares)
    beyond 10^5 terms (they drift towards stagnation: a bug of their own) are left out."""
    dt = DT[dtype]
    kwc = _pw_kw(kw)
    out = list(correct_env(op, args, kwc, dtype, good))
    if dtype != "float32":  # correct_env adds the float32 algorithms for float32 results only
        out += [(f"{k}, rounded", o.to(dt)) for k, o in alternatives(op, args, kwc, good.float())]
    n = args[0].shape[-1]
    if n > 100_000 and (data == "offset" and op in ("sum", "mean", "cumsum") or op in ("var", "std")):
        # one-signed terms (offset data; var's and std's squares) summed sequentially in float32 drift towards
        # stagnation (pytorch#38716): a bug of their own, not a correct implementation
        seq = ("left-to-right", "reversed", "two-pass left-to-right", "Welford fp32")
        out = [(k, o) for k, o in out if not any(k.startswith(s) for s in seq)]
    half = dtype != "float32"
    X = _f32(args[0]).reshape(-1, n) if op != "scaled_dot_product_attention" else None
    if op in ("sum", "mean"):
        for lanes, block in ((8, 128), (16, 4096)):
            s = _lanes(X, lanes, block)
            s = s if op == "sum" else s / F32(n)
            out.append((f"{lanes} lanes in blocks of {block}, pairwise fp32", _to(s, dt, good.shape)))
        if half and n > GRAIN:  # torch's CPU kernel on more threads than this machine has: each thread's
            # float32 partial stored in the result format (noise_store.thread_members: reproduced torch
            # 2.13 on 1 to 32 threads), the partials added in float32
            for T in range(2, -(-n // GRAIN) + 1):
                c = -(-n // T)
                parts = [_tree(X[:, a : a + c]) for a in range(0, n, c)]
                if op == "mean":
                    parts = [p / F32(n) for p in parts]
                parts = [torch.from_numpy(np.ascontiguousarray(p, F32)).to(dt).float().numpy() for p in parts]
                tot = parts[0]
                for p in parts[1:]:
                    tot = (tot + p).astype(F32)
                out.append(
                    (f"torch CPU on {T} threads (partials stored in the result format)", _to(tot, dt, good.shape))
                )
    if op in ("layer_norm", "rms_norm"):
        W, B = _f32(args[2]).reshape(1, n), (_f32(args[3]).reshape(1, n) if len(args) > 3 else F32(0.0))
        eps = kwc["eps"]
        if op == "layer_norm":
            y = _np_norm(X, W, B, eps, True, None, "two-pass tree", "folded")
            out.append(("two-pass tree, folded fp32", _to(y, dt, good.shape)))
        else:  # Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, to the input dtype, times w
            r = F32(1.0) / np.sqrt(_tree(X * X)[:, None] / F32(n) + F32(eps))
            xn = torch.from_numpy(np.ascontiguousarray(X * r, F32)).to(dt)
            y = (args[2].to(dt) * xn).reshape(good.shape)  # torch: the product in float32, rounded once
            out.append(("Hugging Face RMSNorm (row rounded to the dtype, then times w)", y))
    if op in ("softmax", "log_softmax"):
        y = _online_softmax(X, PW_TILE, op == "log_softmax")
        out.append((f"online softmax, tiles of {PW_TILE} fp32", _to(y, dt, good.shape)))
        for online in (False, True):  # torch's exp_u20 (its CPU attention and softmax kernels' exp)
            y = _exp_u20_softmax(X, op == "log_softmax", online)
            out.append((f"exp_u20 fp32, {'online per element' if online else 'two passes'}", _to(y, dt, good.shape)))
    if op == "scaled_dot_product_attention":
        q, k, v = args[:3]
        out.append(("attention fp32, direct", _to(_attn_np(q, k, v), dt, good.shape)))
        out.append((f"attention fp32, online over tiles of {PW_TILE} keys", _to(_attn_np(q, k, v, PW_TILE), dt,
                                                                              good.shape)))  # fmt: skip
        # one key at a time (a CPU scalar loop, the textbook online softmax): its P V partial sums are the
        # longest chain, 5x the error of the blocked kernels above at 4096 keys (fp32: 2.6e-7 against 5e-8)
        out.append(("attention fp32, online one key at a time", _to(_attn_np(q, k, v, 1), dt, good.shape)))
        if half:
            out.append(("Hugging Face eager (fp32 softmax, P to the dtype before P V)",
                        _to(_attn_np(q, k, v, p_dtype=dt), dt, good.shape)))  # fmt: skip
            out.append((f"online over tiles of {PW_TILE}, P to the dtype before P V",
                        _to(_attn_np_tiles_p(q, k, v, PW_TILE, dt), dt, good.shape)))  # fmt: skip
    return out


def _attn_np_tiles_p(q, k, v, tile, p_dtype):
    """FlashAttention 2's forward in float32 with each tile's P rounded to ``p_dtype`` before P V."""
    Q, K, V = (_f32(a) for a in (q, k, v))
    sc = F32(1.0 / np.sqrt(Q.shape[-1]))
    m = np.full(Q.shape[:-1], -np.inf, F32)
    l = np.zeros(Q.shape[:-1], F32)
    acc = np.zeros(Q.shape[:-1] + (V.shape[-1],), F32)
    for s in range(0, K.shape[-2], tile):
        S = (Q @ np.swapaxes(K[..., s : s + tile, :], -1, -2)) * sc
        mn = np.maximum(m, S.max(-1))
        a = np.exp(m - mn)
        p = np.exp(S - mn[..., None])
        l = l * a + p.sum(-1, dtype=F32)
        ph = torch.from_numpy(p).to(p_dtype).float().numpy()
        acc = acc * a[..., None] + ph @ V[..., s : s + tile, :]
        m = mn
    return acc / l[..., None]


def pw_structure(op, shape):
    """(kind, index) of the structured bugs the output's shape allows: one bad row (norm row, softmax row,
    attention query row, scan row), one bad channel (a norm's or softmax's feature, an attention head), a
    scan's tail."""
    if len(shape) == 4:  # attention (B, H, L, D)
        return [("one query row scaled", (0, 1, shape[2] // 3)), ("one head scaled", (0, 1))]
    if len(shape) == 2 and shape[0] > 1:
        kinds = [("one row scaled", (1,))]
        if op == "cumsum":
            kinds.append(("one row's tail offset (a lost carry)", (2, slice(shape[1] // 2, None))))
        else:
            kinds.append(("one feature offset", (slice(None), shape[1] // 3)))
        return kinds
    return []


def pw_bugs(op, good, spread, scales, g, structure=None):
    """(kind, nominal size, output): the correct output plus a perturbation whose largest |value| is
    s x spread, rounded to the dtype: the whole tensor scaled by (1 + e), a constant offset, the structured
    kinds of ``pw_structure`` (or ``structure``: (kind, index) pairs), one element off. One output element: the
    scaled one only."""
    dt = good.dtype
    G = good.double()
    sgn = 1.0 if int(torch.randint(0, 2, (1,), generator=g)) else -1.0
    one = int(torch.randint(0, good.numel(), (1,), generator=g))
    out = []
    for s in scales:
        a = sgn * s * spread
        amax = float(G.abs().max())
        if amax > 0:
            out.append(("whole tensor scaled", s, (G * (1 + a / amax)).to(dt)))
        if good.numel() == 1:
            continue
        out.append(("constant offset", s, (G + a).to(dt)))
        for kind, idx in pw_structure(op, tuple(good.shape)) if structure is None else structure:
            y = G.clone()
            part = y[idx]
            if kind.endswith("scaled"):
                m = float(part.abs().max())
                if m == 0:
                    continue
                y[idx] = part * (1 + a / m)
            else:
                y[idx] = part + a
            out.append((kind, s, y.to(dt)))
        y = G.clone().reshape(-1)
        y[one] += a
        out.append(("one element off", s, y.reshape(good.shape).to(dt)))
    return out


def pw_named(op, args, kw, dtype, good):
    """(kind, output): the issue's named real bugs that apply to the call, at their natural size."""
    dt = good.dtype
    fn = _pw_fn(op)
    kwc = _pw_kw(kw)
    out = [("output x 1.1", (good.double() * 1.1).to(dt))]
    if op in ("layer_norm", "rms_norm"):
        W = kw["_W"]
        rest = (args[3],) if op == "layer_norm" else ()
        out.append(("w + 2 instead of w + 1", fn(args[0], args[1], (W + 2.0).to(dt), *rest, **kwc)))
        out.append(("weight W instead of 1 + W", fn(args[0], args[1], W.to(dt), *rest, **kwc)))
        if op == "layer_norm":
            out.append(("bias dropped", fn(args[0], args[1], args[2], None, **kwc)))
    if op == "scaled_dot_product_attention" and dtype == "float32":
        out.append(("output x 1.01", (good.double() * 1.01).to(dt)))
    if op == "var":
        out += [(k, o) for k, o in natural_bugs(op, args, kwc, good) if k == "one-pass variance"]
    return out


def _digest(t):
    """A digest of a tensor's dtype, shape and bits: equal outputs of one call share it."""
    import hashlib

    h = hashlib.blake2b(f"{t.dtype} {tuple(t.shape)}".encode(), digest_size=16)
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))  # stride 1, whatever t's layout
    h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _pw_judge(op, args, kw, out, memo=None):
    """(report, seconds) of ``compare`` on ``out``; ``memo`` ({digest: (report, seconds)}, one per call): an
    output equal bit for bit to one already judged on the same call gets that judgement (compare is a function
    of the output and the call). A bfloat16 mean of 10^7 terms has 305 thread-count members (torch's CPU kernel
    on 2 to 306 threads) with a handful of distinct values; each compare there costs 1-3 s (913 s in all)."""
    key = None if memo is None else _digest(out)
    if key is not None and key in memo:
        return memo[key]
    t = time.perf_counter()
    rep = rk.compare(out, op, *args, **_pw_kw(kw))
    got = rep, time.perf_counter() - t
    if key is not None:
        memo[key] = got
    return got


def _pw_row(rep, seconds, meta, **kv):
    det = (rep.detectable or {}).get("element") or {}
    return dict(
        verdict=rep.verdict,
        precision=rep.precision,
        seconds=seconds,
        det_ulps=float(det.get("median_ulps", np.nan)),
        det_max_ulps=float(det.get("max_ulps", np.nan)),
        **meta,
        **kv,
    )


def pw_case(op, n, data, dtype, seed, scales, log=print):
    """Every truth for one call: torch's output and the other correct implementations (their spread), the
    injected bugs in spread units and the named ones. Rows of dicts."""
    args, kw = pw_call(op, n, data, dtype, seed)
    meta = dict(op=op, n=n, data=data, dtype=dtype, seed=seed, case=[op, n, data, dtype, seed])
    good = _pw_fn(op)(*args, **_pw_kw(kw))
    exact = pw_exact(op, args, kw).reshape(good.shape)
    correct = [("torch", good)] + pw_correct(op, args, kw, dtype, good, data)
    errs = []
    for _, o in correct:
        e = np.abs(_np(o) - exact)
        errs.append(np.where(np.isnan(e), np.inf, e))
    spread_el = np.max(errs, axis=0)
    spread = float(spread_el.max())
    worst = correct[int(np.argmax([e.max() for e in errs]))][0]
    ulp = ulp_of(exact, dtype)
    fin = np.isfinite(exact)
    spread_ulps = float(np.median((spread / ulp)[fin])) if fin.any() else np.nan
    spread_el_ulps = float(np.median((spread_el / ulp)[fin])) if fin.any() else np.nan
    meta.update(spread=spread, spread_ulps=spread_ulps, spread_el_ulps=spread_el_ulps, spread_by=worst)
    rows = []
    memo = {}
    for (name, o), e in zip(correct, errs):
        rep, s = _pw_judge(op, args, kw, o, memo)
        rows.append(_pw_row(rep, s, meta, truth="correct", name=name, err=float(e.max()) / spread if spread else 0.0))
    if spread == 0 or not np.isfinite(spread):
        log(f"  {op} {n} {data} {dtype}: spread {spread}; no injected bugs")
        scales = ()
    g = _gen("powerbug", op, n, data, dtype, seed)
    bugs = [(k, s, o) for k, s, o in pw_bugs(op, good, spread, scales, g)]
    bugs += [(k, None, o) for k, o in pw_named(op, args, kw, dtype, good)]
    G = _np(good)
    for kind, nominal, o in bugs:
        inj = float(np.abs(_np(o) - G).max())
        if inj == 0:
            continue  # rounding to the dtype swallowed the perturbation
        rep, s = _pw_judge(op, args, kw, o, memo)
        size = inj / spread if spread else np.inf
        err = float(np.abs(_np(o) - exact).max())
        rows.append(
            _pw_row(
                rep,
                s,
                meta,
                truth="bug" if nominal is not None else "named",
                name=kind,
                nominal=nominal,
                size=size,
                err_size=err / spread if spread else np.inf,
            )
        )
    return rows


def pw_special(seed=0):
    """The named bugs on calls of their own: a float32 mean of 4e7 values in [0, 1) accumulated sequentially
    (stagnates at 2**24, pytorch#38716) and pytorch#188372 (bfloat16 layer_norm, normalized_shape=(1,),
    11 returned where the bias, 3, is exact). Rows of dicts, sizes in spreads of the correct ones."""
    from numba import njit

    rows = []

    @njit(fastmath=False)
    def seq32(x):
        s = np.float32(0.0)
        for v in x:
            s = s + v  # float32, left to right
        return s

    x = torch.rand(40_000_000, generator=_gen("power-mean", seed))
    good = x.mean()
    exact = pw_exact("mean", (x.double(),), {})
    X = x.numpy().reshape(1, -1)
    correct = [("torch", good), ("torch fp64, rounded", x.double().mean().float())]
    correct += [(h, torch.tensor(_sums(X, h)[0] / F32(x.numel()))) for h in ("tree", "blocks of 128", "Kahan")]
    bad = torch.tensor(seq32(x.numpy()) / F32(x.numel()))
    rows += _pw_special_rows("mean", (x,), {}, correct, [("sequential fp32 mean of 4e7 (pytorch#38716)", bad)],
                             exact, "float32", 40_000_000, "uniform [0, 1)", seed)  # fmt: skip
    x = torch.tensor([[1000.0], [2000.0]]).bfloat16()
    w, b = torch.tensor([1.0]).bfloat16(), torch.tensor([3.0]).bfloat16()
    args = (x, (1,), w, b)
    good = F.layer_norm(*args)
    exact = pw_exact("layer_norm", args, {})
    correct = [("torch", good), ("torch fp64, rounded", F.layer_norm(*_cast(args, torch.float64)).bfloat16())]
    rows += _pw_special_rows("layer_norm", args, {}, correct,
                             [("11 where the bias 3 is exact (pytorch#188372)", torch.full_like(good, 11.0))],
                             exact, "bfloat16", 1, "[[1000], [2000]], w 1, b 3", seed)  # fmt: skip
    return rows


def _pw_special_rows(op, args, kw, correct, bad, exact, dtype, n, data, seed):
    meta = dict(op=op, n=n, data=data, dtype=dtype, seed=seed, case=[op, n, data, dtype, seed])
    errs = [float(np.abs(_np(o) - exact.reshape(_np(o).shape)).max()) for _, o in correct]
    spread = max(errs)
    ulp = ulp_of(exact, dtype)
    meta.update(spread=spread, spread_ulps=float(np.median(spread / ulp)), spread_el_ulps=np.nan,
                spread_by=correct[int(np.argmax(errs))][0])  # fmt: skip
    rows = []
    for (name, o), e in zip(correct, errs):
        rep, s = _pw_judge(op, args, kw, o)
        rows.append(_pw_row(rep, s, meta, truth="correct", name=name, err=e / spread if spread else 0.0))
    for name, o in bad:
        rep, s = _pw_judge(op, args, kw, o)
        inj = float(np.abs(_np(o) - _np(correct[0][1])).max())
        rows.append(_pw_row(rep, s, meta, truth="named", name=name, nominal=None,
                            size=inj / spread if spread else np.inf,
                            err_size=float(np.abs(_np(o) - exact.reshape(_np(o).shape)).max()) / spread
                            if spread else np.inf))  # fmt: skip
    return rows


def run_power(quick=False, seeds=1, ops=PW_OPS, dtypes=PW_DTYPES, sizes=None, scales=None, data=None,
              special=True, log=print, on_case=None):  # fmt: skip
    """The power family's rows (see summarise_power). ``sizes``: {axis: lengths} (default PW_SIZES, quick
    PW_SIZES_QUICK); ``data``: {op: regimes} (default randn, and offset for the norms and var); ``on_case``:
    called with each case's rows as soon as the case ends (``--jsonl``: a stopped run keeps them)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*degrees of freedom is <= 0.*")
    sizes = (PW_SIZES_QUICK if quick else PW_SIZES) if sizes is None else sizes
    scales = (PW_SCALES_QUICK if quick else PW_SCALES) if scales is None else scales
    data = (PW_DATA_QUICK if quick else PW_DATA) if data is None else data
    rows = []
    for seed in range(seeds):
        for op in ops:
            for n in sizes[PW_AXIS[op]]:
                for d in data.get(op, ("randn",)):
                    for dtype in dtypes:
                        t0 = time.perf_counter()
                        case = pw_case(op, n, d, dtype, seed, scales, log)
                        rows += case
                        if on_case is not None:
                            on_case(case)
                        log(f"power {op} n={n} {d} {dtype}: {time.perf_counter() - t0:.1f} s")
        if special:
            t0 = time.perf_counter()
            case = pw_special(seed)
            rows += case
            if on_case is not None:
                on_case(case)
            log(f"power named calls of their own: {time.perf_counter() - t0:.1f} s")
    return rows


ALARMS = ("mismatch", "reduced-precision")  # a correct result called either is a false alarm
PW_BINS = (("<1x", 0, 1), ("1-8x", 1, 8), (">=8x", 8, np.inf))


def _pw_key(r):
    return (r["op"], r["dtype"], r["n"], r["data"])


def _pw_case_text(r):
    return f"{r['op']} n={r['n']} {r['data']} {r['dtype']} seed={r['seed']}"


def summarise_power(rows) -> dict:
    """Per (op, dtype, size, data): false alarms (a correct result called mismatch or reduced-precision),
    injected bugs caught by size bin in spreads, below 1x named a precision, torch's report's detectable
    element (median ulps) over the spread (median ulps of the spread at each element's reference), the
    median seconds per compare; the lists of false alarms, misses (>= 8x not a mismatch), bugs below 1x
    named a precision and the named bugs' verdicts."""
    table = {}
    for r in rows:
        t = table.setdefault(
            _pw_key(r),
            dict(op=r["op"], dtype=r["dtype"], n=r["n"], data=r["data"], correct=0, false_alarms=0, seconds=[],
                 spread=r["spread"], spread_ulps=r["spread_ulps"], spread_by=r["spread_by"], det_over_spread=np.nan,
                 det_over_spread_el=np.nan, det_ulps=np.nan, **{f"bugs {b}": 0 for b, _, _ in PW_BINS},
                 **{f"caught {b}": 0 for b, _, _ in PW_BINS}, named_precision_below_1x=0),
        )  # fmt: skip
        t["seconds"].append(r["seconds"])
        if r["truth"] == "correct":
            t["correct"] += 1
            t["false_alarms"] += r["verdict"] in ("mismatch", "reduced-precision")
            if r["name"] == "torch":
                t["det_ulps"] = r["det_ulps"]
                with np.errstate(all="ignore"):
                    t["det_over_spread"] = r["det_ulps"] / r["spread_ulps"] if r["spread_ulps"] else np.inf
                    t["det_over_spread_el"] = r["det_ulps"] / r["spread_el_ulps"] if r["spread_el_ulps"] else np.inf
        elif r["truth"] == "bug":
            for b, lo, hi in PW_BINS:
                if lo <= r["size"] < hi:
                    t[f"bugs {b}"] += 1
                    t[f"caught {b}"] += r["verdict"] == "mismatch"
            if r["size"] < 1:
                t["named_precision_below_1x"] += r["verdict"] == "reduced-precision"
    cases = []
    for t in table.values():
        t["median_seconds"] = float(np.median(t.pop("seconds")))
        cases.append(t)
    bugs = [r for r in rows if r["truth"] == "bug"]
    s = dict(
        cases=cases,
        compares=len(rows),
        correct=sum(r["truth"] == "correct" for r in rows),
        false_alarms=sum(t["false_alarms"] for t in cases),
        bugs_ge_8x=sum(r["size"] >= 8 for r in bugs),
        caught_ge_8x=sum(r["size"] >= 8 and r["verdict"] == "mismatch" for r in bugs),
        bugs_1_to_8x=sum(1 <= r["size"] < 8 for r in bugs),
        caught_1_to_8x=sum(1 <= r["size"] < 8 and r["verdict"] == "mismatch" for r in bugs),
        bugs_below_1x=sum(r["size"] < 1 for r in bugs),
        below_1x_named_a_precision=sum(r["size"] < 1 and r["verdict"] == "reduced-precision" for r in bugs),
        below_1x_mismatch=sum(r["size"] < 1 and r["verdict"] == "mismatch" for r in bugs),
        detectable_infinite=sum(1 for t in cases if not np.isfinite(t["det_ulps"])),
        detectable_over_8x=sum(1 for t in cases if not t["det_over_spread"] <= 8),
        median_seconds=float(np.median([r["seconds"] for r in rows])) if rows else np.nan,
        false_alarm_cases=[r for r in rows if r["truth"] == "correct" and r["verdict"] in ALARMS],
        missed=[r for r in bugs if r["size"] >= 8 and r["verdict"] != "mismatch"],
        below_1x_named=[r for r in bugs if r["size"] < 1 and r["verdict"] == "reduced-precision"],
        named=[r for r in rows if r["truth"] == "named"],
    )  # fmt: skip
    s["power_by"] = {}
    for key in ("op", "dtype"):
        for v in sorted({r[key] for r in bugs}):
            sel = [r for r in bugs if r[key] == v]
            s["power_by"][f"{key}={v}"] = {
                b: f"{sum(lo <= r['size'] < hi and r['verdict'] == 'mismatch' for r in sel)}/"
                f"{sum(lo <= r['size'] < hi for r in sel)}"
                for b, lo, hi in PW_BINS
            }
    return s


def _num(v):
    if v is None:
        return "-"
    if not np.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def print_power(s, log=print):
    log(f"\n== power family: {s['compares']} compare calls, median {s['median_seconds']:.2f} s each")
    log(f"false alarms on correct results: {s['false_alarms']} / {s['correct']}")
    log(f"bugs >= 8x the spread of correct implementations caught: {s['caught_ge_8x']} / {s['bugs_ge_8x']}")
    log(f"bugs 1-8x the spread caught: {s['caught_1_to_8x']} / {s['bugs_1_to_8x']}")
    log(
        f"bugs below 1x the spread named a precision: {s['below_1x_named_a_precision']} / {s['bugs_below_1x']} "
        f"(called mismatch: {s['below_1x_mismatch']})"
    )
    log(
        f"cases whose detectable is infinite: {s['detectable_infinite']}; "
        f"above 8x the spread: {s['detectable_over_8x']}"
    )
    log(
        f"{'op':<28} {'dtype':<9} {'n':>8} {'data':<6} {'FA':>5} {'>=8x':>7} {'1-8x':>7} {'<1x prec':>8} "
        f"{'spread ulp':>10} {'det ulp':>9} {'det/spr':>8} {'s/call':>6}  spread set by"
    )
    for t in sorted(s["cases"], key=lambda t: (PW_OPS.index(t["op"]) if t["op"] in PW_OPS else 99, t["dtype"], t["n"],
                                               t["data"])):  # fmt: skip
        log(
            f"{t['op']:<28} {t['dtype']:<9} {t['n']:>8} {t['data'][:6]:<6} {t['false_alarms']:>2}/{t['correct']:<2} "
            f"{t['caught >=8x']:>3}/{t['bugs >=8x']:<3} {t['caught 1-8x']:>3}/{t['bugs 1-8x']:<3} "
            f"{t['named_precision_below_1x']:>3}/{t['bugs <1x']:<4} {_num(t['spread_ulps']):>10} "
            f"{_num(t['det_ulps']):>9} {_num(t['det_over_spread']):>8} {t['median_seconds']:>6.2f}  {t['spread_by']}"
        )
    log("power by op and dtype (caught / bugs, by size in spreads):")
    for k, v in s["power_by"].items():
        log(f"  {k:<38} " + "  ".join(f"{b}: {x}" for b, x in v.items()))
    log("named real bugs (size = largest |bug - correct| in spreads):")
    for r in s["named"]:
        log(f"  {_pw_case_text(r)} {r['name']}: {r['verdict']} {r['precision'] or ''} size {_num(r['size'])}x")
    for key in ("false_alarm_cases", "missed", "below_1x_named"):
        for r in s[key]:
            log(
                f"  {key}: {_pw_case_text(r)} {r['truth']} {r['name']}: {r['verdict']} {r['precision'] or ''} "
                f"size {_num(r.get('size', r.get('err')))}x"
            )


def _pw_cell(t) -> str:
    """One dtype's cell of a power table: false alarms, bugs >= 8x caught (bold when not all), 1-8x caught,
    detectable over spread."""
    fa = f"**{t['false_alarms']}**/{t['correct']}" if t["false_alarms"] else f"0/{t['correct']}"
    ge = f"{t['caught >=8x']}/{t['bugs >=8x']}"
    ge = ge if t["caught >=8x"] == t["bugs >=8x"] else f"**{ge}**"
    return f"{fa}, {ge}, {t['caught 1-8x']}/{t['bugs 1-8x']}, {_num(t['det_over_spread'])}"


def power_markdown(s) -> str:
    """The power table as markdown (docs/analysis.md): one row per op x size x data, per dtype the false
    alarms, bugs >= 8x and 1-8x the spread caught, and torch's report's detectable over the spread."""
    dts = ("float32", "bfloat16", "float16")
    head = "| op | n | data | " + " | ".join(f"{d}: FA, >=8x, 1-8x, det/spread" for d in dts) + " |"
    lines = [head, "|---|---:|---|" + "---|" * len(dts)]
    by = {}
    for t in s["cases"]:
        by.setdefault((t["op"], t["n"], t["data"]), {})[t["dtype"]] = t
    order = {op: i for i, op in enumerate(PW_OPS)}
    for (op, n, data), ts in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1], kv[0][2])):
        cells = []
        for d in dts:
            t = ts.get(d)
            if t is None:
                cells.append("-")
                continue
            cells.append(_pw_cell(t))
        lines.append(f"| {op} | {n:g} | {data} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- power family, gradients: bugs in absolute units
#
# The power family's yardstick for gradients: a bug's size is its largest |error| over the spread of correct
# backward implementations, ``spread = max_k max_i |grad_k,i - exact_i|`` per gradient (exact: refkern.backward on
# float64 copies of the inputs, in float64; attention: torch's float64 autograd, whose error is ~1e-9 of a float32
# ulp), never the verdict's own envelope or scale. Correct implementations: torch's CPU autograd, torch in
# float64 (and, for half results, float32) rounded once, and backward kernels emulated in float32 numpy with
# other summation orders, forms and stores (``pb_correct``), each rounded once to the dtype.

PB_FAMILIES = (
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "group_norm",
    "batch_norm[train]",
    "avg_pool2d",
    "mean",
    "var",
    "std",
    "sdpa",
    "linear",
    "matmul",
    "conv2d",
)
PB_OP = {"batch_norm[train]": "batch_norm", "sdpa": "scaled_dot_product_attention"}
PB_AXIS = {  # what a family's size counts
    "softmax": "keys per row (4 rows)",
    "log_softmax": "keys per row (4 rows)",
    "layer_norm": "features (4 rows)",
    "rms_norm": "features (4 rows)",
    "group_norm": "features per group: (2, 32, n / 128, 32), 8 groups",
    "batch_norm[train]": "elements per channel: (n / 1024, 4, 32, 32)",
    "avg_pool2d": "kernel size (stride 1, padding k // 2) on (2, 8, 32, 32)",
    "mean": "terms per row (4 rows)",
    "var": "terms per row (4 rows)",
    "std": "terms per row (4 rows)",
    "sdpa": "keys, (1, 2, 16, 64) queries",
    "linear": "tokens: x (n, 128), weight (64, 128)",
    "matmul": "rows: a (4, n / 4, 64) @ b (64, 96)",
    "conv2d": "N H W: x (4, 8, H, H), weight (16, 8, 3, 3), padding 1",
}
PB_SIZES = {  # (float32 sizes, bfloat16 / float16 sizes)
    "softmax": ((1024, 4096), (1024, 8192)),
    "log_softmax": ((1024, 4096), (1024, 8192)),
    "layer_norm": ((1024, 4096, 8192), (1024, 4096, 8192)),
    "rms_norm": ((1024, 4096, 8192), (1024, 4096, 8192)),
    "group_norm": ((4096, 8192), (4096, 8192)),
    "batch_norm[train]": ((4096, 8192), (4096, 8192)),
    "avg_pool2d": ((3, 8), (3, 8)),
    "mean": ((100_000, 1_000_000), (100_000, 1_000_000)),
    "var": ((100_000, 1_000_000), (100_000, 1_000_000)),
    "std": ((100_000, 1_000_000), (100_000, 1_000_000)),
    "sdpa": ((64, 256), (64, 256, 1024)),
    "linear": ((512, 4096), (512, 4096)),
    "matmul": ((512, 4096), (512, 4096)),
    "conv2d": ((1024, 4096), (1024, 4096)),
}
PB_SIZES_QUICK = {
    "softmax": ((1024,), (1024,)),
    "log_softmax": ((1024,), (1024,)),
    "layer_norm": ((4096,), (4096,)),
    "rms_norm": ((4096,), (4096,)),
    "group_norm": ((4096,), (4096,)),
    "batch_norm[train]": ((4096,), (4096,)),
    "avg_pool2d": ((3,), (3,)),
    "mean": ((100_000,), (100_000,)),
    "var": ((100_000,), (100_000,)),
    "std": ((100_000,), (100_000,)),
    "sdpa": ((64,), (256,)),
    "linear": ((512,), (512,)),
    "matmul": ((512,), (512,)),
    "conv2d": ((1024,), (1024,)),
}
PB_SCALES = (0.5, 1, 2, 4, 8, 16, 64)  # a bug's largest |error| in spreads
PB_SCALES_QUICK = (0.5, 8, 64)
PB_DATA = {"layer_norm": ("randn", "offset"), "var": ("randn", "offset"), "std": ("randn", "offset")}
PB_DATA_QUICK = {}
PB_HALF = {"float16": "fp16", "bfloat16": "bf16"}


def pb_call(fam, n, data, dtype, seed):
    """(call, grad_output): the call as ``bw_call`` gives it (op, fn, args, kw, diff) at size ``n`` (PB_AXIS), inputs
    randn or offset (mean 300, std 1) in ``dtype``; norm weights 1 + 0.1 N(0, 1), biases 0.1 N(0, 1); grad_output
    randn."""
    dt = DT[dtype]
    g = _gen("power-bw", fam, n, data, dtype, seed)

    def rnd(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)

    def x_(*shape):
        x = rnd(*shape)
        return (x + 300.0 if data == "offset" else x).to(dt)

    def w_(c):
        return (1.0 + 0.1 * rnd(c)).to(dt)

    def b_(c):
        return (0.1 * rnd(c)).to(dt)

    if fam in ("softmax", "log_softmax"):
        fn = torch.softmax if fam == "softmax" else torch.log_softmax
        call = dict(op=fam, fn=fn, args=[x_(PW_ROWS, n), -1], kw={}, diff=dict(input=0))
    elif fam == "layer_norm":
        call = dict(op=fam, fn=F.layer_norm, args=[x_(PW_ROWS, n), (n,), w_(n), b_(n)], kw={"eps": 1e-5},
                    diff=dict(input=0, weight=2, bias=3))  # fmt: skip
    elif fam == "rms_norm":
        call = dict(op=fam, fn=F.rms_norm, args=[x_(PW_ROWS, n), (n,), w_(n)], kw={"eps": RMS_EPS},
                    diff=dict(input=0, weight=2))  # fmt: skip
    elif fam == "group_norm":
        call = dict(op=fam, fn=F.group_norm, args=[x_(2, 32, n // 128, 32), 8, w_(32), b_(32)], kw={"eps": 1e-5},
                    diff=dict(input=0, weight=2, bias=3))  # fmt: skip
    elif fam == "batch_norm[train]":
        c = 4
        call = dict(op="batch_norm", fn=_bn_fn, args=[x_(n // 1024, c, 32, 32), torch.zeros(c, dtype=dt),
                    torch.ones(c, dtype=dt), w_(c), b_(c)], kw={"training": True},
                    diff=dict(input=0, weight=3, bias=4))  # fmt: skip
    elif fam == "avg_pool2d":
        call = dict(op=fam, fn=F.avg_pool2d, args=[x_(2, 8, 32, 32)], kw=dict(kernel_size=n, stride=1, padding=n // 2),
                    diff=dict(input=0))  # fmt: skip
    elif fam in ("mean", "var", "std"):
        kw = {} if fam == "mean" else {"correction": 1}
        call = dict(op=fam, fn=getattr(torch, fam), args=[x_(PW_ROWS, n), -1], kw=kw, diff=dict(x=0))
    elif fam == "sdpa":
        call = dict(op=PB_OP[fam], fn=F.scaled_dot_product_attention, args=[x_(1, 2, 16, 64), x_(1, 2, n, 64),
                    x_(1, 2, n, 64)], kw={}, diff=dict(query=0, key=1, value=2))  # fmt: skip
    elif fam == "linear":
        call = dict(op=fam, fn=F.linear, args=[x_(n, 128), rnd(64, 128).to(dt), rnd(64).to(dt)], kw={},
                    diff=dict(x=0, weight=1, bias=2))  # fmt: skip
    elif fam == "matmul":
        call = dict(op=fam, fn=torch.matmul, args=[x_(4, n // 4, 64), rnd(64, 96).to(dt)], kw={}, diff=dict(a=0, b=1))
    elif fam == "conv2d":
        h = int(round(np.sqrt(n // 4)))
        call = dict(op=fam, fn=F.conv2d, args=[x_(4, 8, h, h), rnd(16, 8, 3, 3).to(dt), rnd(16).to(dt)],
                    kw={"padding": 1}, diff=dict(x=0, weight=1, bias=2))  # fmt: skip
    else:
        raise ValueError(f"pb_call: unknown family {fam!r}; choose one of {', '.join(PB_FAMILIES)}.")
    with torch.no_grad():
        out = call["fn"](*call["args"], **call["kw"])
    return call, rnd(*out.shape).to(dt)


def pb_exact(call, gout):
    """{gradient name: float64 numpy}: refkern.backward on float64 copies of the inputs (exact, rounded once to
    float64); attention: torch's float64 autograd (refkern's float64 attention backward takes minutes; its error,
    ~1e-16 relative times the gradient's condition, is far below any float32 ulp; tests check it against refkern's
    correctly rounded float32 gradient)."""
    if call["op"] == "scaled_dot_product_attention":
        return {k: v.numpy() for k, v in _autograd(dict(call, args=_bw_cast(call["args"], torch.float64)),
                                                   gout.double()).items()}  # fmt: skip
    ex = rk.backward(call["op"], gout.double(), *_bw_cast(call["args"], torch.float64), wrt=tuple(call["diff"]),
                     **call["kw"])  # fmt: skip
    return {k: np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v, np.float64) for k, v in ex.items()}


# the emulated backward kernels, float32 numpy


def _pb_st(a, dt):
    """A float32 array stored in the torch dtype ``dt`` (rounded once to nearest even) and read back as float32."""
    a = np.ascontiguousarray(a, F32)
    return a if dt == torch.float32 else torch.from_numpy(a).to(dt).float().numpy()


def _pb_sum(X, how):
    """float32 sums of the rows of the 2-D X in the order ``how``: left-to-right, reversed, tree, blocks of 128,
    Kahan (``_sums``), or 8 lanes (8 strided accumulators in blocks of 128, ``_lanes``)."""
    X = np.ascontiguousarray(X, F32)
    return _lanes(X, 8, 128) if how == "8 lanes" else _sums(X, how)


def _pb_mm(A, B, how):
    """A @ B in float32 (A (M, K), B (K, N)), the K terms in the order ``how``: BLAS (numpy's sgemm), blocks of
    256 (sgemm per block, the block products added left to right) or sequential (rank-1 updates left to right)."""
    A, B = np.ascontiguousarray(A, F32), np.ascontiguousarray(B, F32)
    if how == "BLAS":
        return A @ B
    out = np.zeros((A.shape[0], B.shape[1]), F32)
    step = 256 if how == "blocks of 256" else 1
    for s in range(0, A.shape[1], step):
        out += A[:, s : s + step] @ B[s : s + step]  # a (M, 1) @ (1, N) product is one exact-then-rounded term
    return out


def _pb_softmax(X, G, Y, how, form, log):
    """softmax (log_softmax) backward over float32 rows from the stored forward ``Y`` (float32 values of the stored
    output): D = sum g y (log_softmax: sum g) in the order ``how``; softmax dx = y (g - D) (``form`` "difference", the
    CPU kernels) or y g - y D ("split"); log_softmax dx = g - exp(l) sum g."""
    if log:
        return G - np.exp(Y) * _pb_sum(G, how)[:, None]
    D = _pb_sum(G * Y, how)[:, None]
    return Y * (G - D) if form == "difference" else Y * G - Y * D


def _pb_norm_rows(X, G, W, eps, center, stats, how, form, stat_dt, sum_dt):
    """A norm's grad_input over float32 rows, and xhat: statistics by ``stats`` (``_moments``; rms_norm: the mean
    of squares summed by ``how``), mean and rstd stored in ``stat_dt``; S = sum g w and C in the order ``how``,
    stored in ``sum_dt`` (torch's half batch_norm kernel); ``form`` "centred": r (gw - S / n) - r**3 d C / n with
    C = sum gw d; "raw" (torch's CPU layer_norm): ds = sum gw x, b = (S mean - ds) r**3 / n, c = -b mean - S r / n,
    dx = r gw + b x + c."""
    n = X.shape[1]
    nn = F32(n)
    if center:
        m, q = _moments(X, stats)
        v = np.asarray(q, F32) / nn
    else:
        m, v = np.zeros(X.shape[0], F32), _pb_sum(X * X, how) / nn
    r = F32(1.0) / np.sqrt(v + F32(eps))
    m, r = _pb_st(m, stat_dt)[:, None], _pb_st(r, stat_dt)[:, None]
    gw = G * W
    S = _pb_st(_pb_sum(gw, how), sum_dt)[:, None] if center else F32(0.0)
    r3 = r * r * r
    if form == "centred":
        d = X - m if center else X
        C = _pb_st(_pb_sum(gw * d, how), sum_dt)[:, None]
        dx = r * (gw - S / nn) - r3 * d * (C / nn)
    else:
        ds = _pb_st(_pb_sum(gw * X, how), sum_dt)[:, None]
        b = (S * m - ds) * r3 / nn
        c = -b * m - S * r / nn
        dx = r * gw + b * X + c
    return np.asarray(dx, F32), np.asarray((X - m) * r, F32)


def _pb_norm(fam, call, gout, stats, how, form, psum, store):
    """{name: gradient} of a norm family by ``_pb_norm_rows``, grad_weight and grad_bias summed over rows in the
    order ``psum`` ("per sample, then over samples": group_norm's per (sample, channel) sums first, as torch's
    CPU kernel); ``store``: None, "stats" (mean and rstd in the dtype, as torch's CPU kernels store them for half
    inputs) or "stats and sums" (S and C too: torch's half batch_norm kernel). Rounded once to the dtype."""
    a = call["args"]
    dt = a[0].dtype
    x, g = _f32(a[0]), _f32(gout)
    stat_dt = dt if store else torch.float32
    sum_dt = dt if store == "stats and sums" else torch.float32
    center = fam != "rms_norm"
    if fam in ("layer_norm", "rms_norm"):
        n = x.shape[-1]
        X, Gr, W = x.reshape(-1, n), g.reshape(-1, n), _f32(a[2]).reshape(1, n)

        def back(t):
            return t.reshape(x.shape)

        def params(T):
            return _pb_sum(np.ascontiguousarray(T.T), "tree" if psum == "per sample, then over samples" else psum)

    elif fam == "group_norm":
        N, C = x.shape[:2]
        grp, hw = a[1], int(np.prod(x.shape[2:]))
        X, Gr = x.reshape(N * grp, -1), g.reshape(N * grp, -1)
        W = np.tile(np.repeat(_f32(a[2]).reshape(grp, C // grp), hw, axis=1), (N, 1))

        def back(t):
            return t.reshape(x.shape)

        def params(T):
            T3 = T.reshape(N, C, hw)
            if psum == "per sample, then over samples":
                s = _pb_sum(T3.reshape(N * C, hw), "tree").reshape(N, C)
                return _pb_sum(np.ascontiguousarray(s.T), "left-to-right")
            return _pb_sum(np.ascontiguousarray(T3.transpose(1, 0, 2)).reshape(C, -1), psum)

    else:  # batch_norm, training: a channel's rows over (N, spatial)
        C = x.shape[1]
        X, Gr = (np.ascontiguousarray(np.moveaxis(t, 1, 0)).reshape(C, -1) for t in (x, g))
        W = _f32(a[3]).reshape(C, 1)

        def back(t):
            return np.moveaxis(t.reshape(C, x.shape[0], *x.shape[2:]), 0, 1)

        def params(T):
            if psum == "per sample, then over samples":
                s = _pb_sum(T.reshape(C * x.shape[0], -1), "tree").reshape(C, x.shape[0])
                return _pb_sum(s, "left-to-right")
            return _pb_sum(T, psum)

    eps = call["kw"].get("eps", 1e-5)
    dx, xh = _pb_norm_rows(X, Gr, W, eps, center, stats, how, form, stat_dt, sum_dt)
    out = {"input": _to(back(dx), dt, x.shape)}
    wi = 3 if fam.startswith("batch_norm") else 2
    out["weight"] = _to(params(Gr * xh), dt, a[wi].shape)
    if "bias" in call["diff"]:
        out["bias"] = _to(params(Gr), dt, a[wi + 1].shape)
    return out


def _hf_rms_norm(x, normalized_shape, w, eps=None):
    """Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x**2) + eps) in float32, the row rounded to the input dtype, then
    times w (in the dtype); autograd differentiates it op by op."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _pb_pool(call, gout, reverse, recip, acc_dt):
    """avg_pool2d's grad_input (stride 1, count_include_pad): each window's g / d (``recip``: g fl(1 / d)) added
    into the padded gradient tap by tap in float32 (``reverse``: the taps in reverse order), stored in ``acc_dt``
    after every add where that is a half dtype (torch's CPU kernel adds into the half gradient tensor)."""
    x = call["args"][0]
    k, p = call["kw"]["kernel_size"], call["kw"]["padding"]
    G = _f32(gout)
    N, C, Ho, Wo = G.shape
    H, W = x.shape[-2:]
    d = F32(k * k)
    t = G * (F32(1.0) / d) if recip else G / d
    gp = np.zeros((N, C, H + 2 * p, W + 2 * p), F32)
    taps = [(i, j) for i in range(k) for j in range(k)]
    for i, j in reversed(taps) if reverse else taps:
        gp[:, :, i : i + Ho, j : j + Wo] += t
        if acc_dt is not None:
            gp = _pb_st(gp, acc_dt)
    return _to(gp[:, :, p : p + H, p : p + W], x.dtype, x.shape)


def _pb_reduction(fam, call, gout, how, form, store):
    """mean, var, std grad_input in float32: mean g / n (``form`` "divide") or g fl(1 / n); var (2 / dof) g (x - m)
    ("factor first", torch's form) or 2 g (x - m) / dof, the mean m by ``how`` (or Welford blocks of 64), stored in
    the dtype where ``store``; std the same with g / (2 s), s the float32 two-pass std (stored in the dtype for half
    results, as the forward's output)."""
    x = call["args"][0]
    dt = x.dtype
    X, g = _f32(x), _f32(gout)[:, None]
    n = X.shape[1]
    if fam == "mean":
        y = g / F32(n) if form == "divide" else g * (F32(1.0) / F32(n))
        return {"x": _to(np.broadcast_to(y, X.shape), dt, x.shape)}
    dof = F32(n - call["kw"].get("correction", 1))
    m = _moments(X, how)[0] if how.startswith("Welford") else _pb_sum(X, how) / F32(n)
    m = _pb_st(m, dt if store else torch.float32)[:, None]
    d = X - m
    if fam == "std":
        s = _pb_st(np.sqrt(_pb_sum(d * d, "tree") / dof), dt)[:, None]
        g = g / (F32(2.0) * s)
    y = (F32(2.0) / dof) * g * d if form == "factor first" else F32(2.0) * g * d / dof
    return {"x": _to(y, dt, x.shape)}


def _pb_attention(call, gout, tile, delta, half_gemms):
    """Attention's q, k, v gradients in float32. ``tile`` None: the math backend's order (P = softmax(S) in float32,
    dV = P^T dO, dP = dO V^T, dS = P (dP - Delta), dQ = dS K s, dK = dS^T Q s); a number: FlashAttention 2's
    backward, P recomputed per tile of keys from the forward's float32 log-sum-exp, dQ accumulated over the tiles
    in float32, and (``half_gemms``) P and dS rounded to the dtype before their products, Delta = rowsum(dO O) (the
    stored output). ``delta`` (math order): "P dP" (rowsum of P dP) or "dO O"."""
    q, k, v = call["args"]
    dt = q.dtype
    Q, K, V = (_f32(t) for t in (q, k, v))
    dO = _f32(gout)
    sc = F32(1.0 / np.sqrt(Q.shape[-1]))
    kT = np.swapaxes(K, -1, -2)
    S = (Q @ kT) * sc
    mx = S.max(-1, keepdims=True)
    E = np.exp(S - mx)
    l = E.sum(-1, keepdims=True, dtype=F32)
    with torch.no_grad():
        O = _f32(F.scaled_dot_product_attention(q, k, v))  # the stored forward output
    if tile is None:
        P = E / l
        dV = np.swapaxes(P, -1, -2) @ dO
        dP = dO @ np.swapaxes(V, -1, -2)
        D = (P * dP).sum(-1, keepdims=True, dtype=F32) if delta == "P dP" else (dO * O).sum(-1, keepdims=True,
                                                                                             dtype=F32)  # fmt: skip
        dS = P * (dP - D)
        out = dict(query=(dS @ K) * sc, key=(np.swapaxes(dS, -1, -2) @ Q) * sc, value=dV)
    else:
        lse = mx + np.log(l)
        D = (dO * O).sum(-1, keepdims=True, dtype=F32)
        dQ = np.zeros_like(Q)
        dK, dV = np.zeros_like(K), np.zeros_like(V)
        hd = dt if half_gemms else torch.float32
        for s in range(0, K.shape[-2], tile):
            Kt, Vt = K[..., s : s + tile, :], V[..., s : s + tile, :]
            P = np.exp((Q @ np.swapaxes(Kt, -1, -2)) * sc - lse)
            dV[..., s : s + tile, :] = np.swapaxes(_pb_st(P, hd), -1, -2) @ dO
            dP = dO @ np.swapaxes(Vt, -1, -2)
            dS = _pb_st(P * (dP - D), hd)
            dQ += (dS @ Kt) * sc
            dK[..., s : s + tile, :] = (np.swapaxes(dS, -1, -2) @ Q) * sc
        out = dict(query=dQ, key=dK, value=dV)
    return {n: _to(t, dt, call["args"][i].shape) for i, (n, t) in enumerate(out.items())}


def _pb_gemm(fam, call, gout, how, bias_how):
    """linear, matmul and conv2d gradients as GEMMs in float32 (``_pb_mm``'s order ``how``); grad_bias summed by
    ``bias_how``; conv2d's grad_input through F.fold (float32) of W^T g per sample."""
    a = call["args"]
    dt = a[0].dtype
    G = _f32(gout)
    out = {}
    if fam == "linear":
        X, W = _f32(a[0]), _f32(a[1])
        out["x"] = _pb_mm(G, W, how)
        out["weight"] = _pb_mm(G.T, X, how)
        out["bias"] = _pb_sum(np.ascontiguousarray(G.T), bias_how)
    elif fam == "matmul":
        A, B = _f32(a[0]), _f32(a[1])
        out["a"] = np.stack([_pb_mm(G[i], B.T, how) for i in range(A.shape[0])])
        out["b"] = _pb_mm(A.reshape(-1, A.shape[-1]).T, G.reshape(-1, G.shape[-1]), how)
    else:
        x, w = a[0], _f32(a[1])
        N, cin, h, wd = x.shape
        cols = F.unfold(x.float(), 3, padding=1).numpy()  # (N, cin 9, h w): exact copies of x
        cout = w.shape[0]
        Wm = w.reshape(cout, -1)
        G3 = G.reshape(N, cout, -1)
        dcols = np.stack([_pb_mm(Wm.T, G3[i], how) for i in range(N)])
        out["x"] = F.fold(torch.from_numpy(dcols), (h, wd), 3, padding=1).numpy()  # <= 9 taps added in float32
        G2 = np.ascontiguousarray(G3.transpose(1, 0, 2)).reshape(cout, -1)
        X2 = np.ascontiguousarray(cols.transpose(1, 0, 2)).reshape(cols.shape[1], -1)
        out["weight"] = _pb_mm(G2, X2.T, how).reshape(w.shape)
        out["bias"] = _pb_sum(G2, bias_how)
    return {n: _to(t, dt, a[call["diff"][n]].shape) for n, t in out.items()}


def pb_correct(fam, call, gout, dtype, data):
    """(name, {gradient name: gradient}, may_name): correct backward implementations besides torch's autograd:
    torch's float64 autograd rounded; (half) torch's float32 autograd rounded once; and the float32 emulations
    (``_pb_*``), each rounded once to the dtype. ``may_name``: {gradient: the precision the verdict may name} for a
    kernel that keeps a running sum in the half dtype (torch's CPU half norms' grad_weight and grad_bias,
    Hugging Face's RMSNorm weight gradient: products rounded to the dtype, then summed)."""
    dt = DT[dtype]
    half = dtype != "float32"
    out = [("torch fp64 autograd, rounded", _autograd(call, gout, torch.float64), {})]
    if half:
        out.append(("torch fp32 autograd, rounded", _autograd(call, gout, torch.float32), {}))
    n = call["args"][0].shape[-1]
    big = data == "offset" and n > 100_000  # one-signed running sums drift: pairwise orders only (as pw_correct)
    if fam in ("softmax", "log_softmax"):
        log = fam == "log_softmax"
        X, G = _f32(call["args"][0]), _f32(gout)
        with torch.no_grad():
            Yt = _f32(call["fn"](*call["args"]))  # the stored forward output
        Yo = _pb_st(_online_softmax(X, PW_TILE, log), dt)
        if log:
            plans = [
                ("stored l, tree sum g", Yt, "tree", None),
                ("stored l, left-to-right sum g", Yt, "left-to-right", None),
                (f"online-softmax l (tiles of {PW_TILE}), 8 lanes sum g", Yo, "8 lanes", None),
            ]
        else:
            plans = [
                ("stored y, tree sum, y (g - D)", Yt, "tree", "difference"),
                ("stored y, left-to-right sum, y g - y D", Yt, "left-to-right", "split"),
                (f"online-softmax y (tiles of {PW_TILE}), blocks of 128, y (g - D)", Yo, "blocks of 128", "difference"),
                ("stored y, 8 lanes in blocks of 128, y g - y D", Yt, "8 lanes", "split"),
            ]
        for name, Y, how, form in plans:
            out.append((f"{name} fp32", {"input": _to(_pb_softmax(X, G, Y, how, form, log), dt, X.shape)}, {}))
    elif fam in ("layer_norm", "rms_norm", "group_norm", "batch_norm[train]"):
        if fam == "rms_norm":
            plans = [("tree", "tree", "centred", "tree", None), ("-", "left-to-right", "raw", "left-to-right", None),
                     ("-", "8 lanes", "centred", "blocks of 128", None)]  # fmt: skip
        else:
            plans = [
                ("two-pass tree", "tree", "centred", "tree", None),
                ("Welford blocks of 64, Chan merge", "left-to-right", "raw", "per sample, then over samples", None),
                ("two-pass tree", "blocks of 128", "raw", "blocks of 128", None),
                ("Welford blocks of 64, Chan merge", "8 lanes", "centred", "left-to-right", None),
            ]
            if data != "offset":
                plans.append(("two-pass left-to-right", "left-to-right", "centred", "tree", None))
        if half and fam != "rms_norm":  # torch's CPU layer, group and batch norms store mean and rstd in the dtype
            plans.append((plans[0][0], "tree", "raw", "per sample, then over samples", "stats"))
            if fam == "batch_norm[train]":
                plans.append((plans[0][0], "tree", "centred", "per sample, then over samples", "stats and sums"))
        for stats, how, form, psum, store in plans:
            st = "" if fam == "rms_norm" else f"{stats} stats, "
            name = f"{st}{how} sums, {form}, params {psum}" + (f", {store} in the dtype" if store else "") + " fp32"
            out.append((name, _pb_norm(fam, call, gout, stats, how, form, psum, store), {}))
        if fam == "rms_norm":
            hf = _autograd(dict(call, fn=_hf_rms_norm), gout)
            out.append(("Hugging Face RMSNorm (autograd: row rounded to the dtype, then times w)", hf,
                        {"weight": PB_HALF[dtype]} if half else {}))  # fmt: skip
    elif fam == "avg_pool2d":
        out.append(("taps in order, g / d fp32", {"input": _pb_pool(call, gout, False, False, None)}, {}))
        out.append(("taps reversed, g fl(1 / d) fp32", {"input": _pb_pool(call, gout, True, True, None)}, {}))
        if half:
            out.append(("taps added into the half gradient (torch CPU)", {"input": _pb_pool(call, gout, False, False,
                                                                                              dt)}, {}))  # fmt: skip
    elif fam == "mean":
        out.append(("g / n fp32", _pb_reduction(fam, call, gout, None, "divide", False), {}))
        out.append(("g fl(1 / n) fp32", _pb_reduction(fam, call, gout, None, "reciprocal", False), {}))
    elif fam in ("var", "std"):
        hows = ["tree", "8 lanes", "Welford blocks of 64, Chan merge"] + ([] if big else ["left-to-right"])
        for i, how in enumerate(hows):
            form = "factor first" if i % 2 == 0 else "factor last"
            out.append((f"mean by {how}, {form} fp32", _pb_reduction(fam, call, gout, how, form, False), {}))
        if half:
            out.append(("mean by tree stored in the dtype, factor first fp32",
                        _pb_reduction(fam, call, gout, "tree", "factor first", True), {}))  # fmt: skip
    elif fam == "sdpa":
        out.append(("math fp32, Delta = rowsum(P dP)", _pb_attention(call, gout, None, "P dP", False), {}))
        out.append(("math fp32, Delta = rowsum(dO O)", _pb_attention(call, gout, None, "dO O", False), {}))
        out.append((f"FlashAttention 2 style, tiles of {PW_TILE}, fp32 P and dS",
                    _pb_attention(call, gout, PW_TILE, "dO O", False), {}))  # fmt: skip
        if half:
            out.append((f"FlashAttention 2 style, tiles of {PW_TILE}, P and dS in the dtype",
                        _pb_attention(call, gout, PW_TILE, "dO O", True), {}))  # fmt: skip
    else:  # linear, matmul, conv2d: GEMM adjoints
        for how, bias_how in (("BLAS", "tree"), ("blocks of 256", "blocks of 128"), ("sequential", "left-to-right")):
            out.append((f"{how} fp32", _pb_gemm(fam, call, gout, how, bias_how), {}))
    return out


def pb_structure(fam, name, shape):
    """(kind, index) of the structured bugs of one gradient: one row (a norm's or softmax's row, a query / key row,
    a token, a sample) scaled, one column (a feature, a channel) offset, one head scaled (attention), one output
    channel scaled (a weight)."""
    nd = len(shape)
    if nd == 4 and fam == "sdpa":
        return [(f"one {'query' if name == 'query' else 'key'} row scaled", (0, 1, shape[2] // 3)),
                ("one head scaled", (0, 1))]  # fmt: skip
    if nd == 4:  # (N, C, H, W): a sample, a channel; conv2d's weight (Cout, Cin, kh, kw): an output channel
        if fam == "conv2d" and name == "weight":
            return [("one output channel scaled", (shape[0] // 3,)), ("one input channel offset", (slice(None), 1))]
        return [("one sample scaled", (1,)), ("one channel offset", (slice(None), shape[1] // 3))]
    if nd == 3:  # matmul's a (B, M, K): one batch, one row
        return [("one batch scaled", (1,)), ("one row scaled", (0, shape[1] // 3))]
    if nd == 2 and shape[0] > 1:
        return [("one row scaled", (1,)), ("one column offset", (slice(None), shape[1] // 3))]
    return []


def _pb_manual_norm(call, gout, drop):
    """A norm's grad_input in float64 with one term dropped: "mean" (its -mean(g w) term: S / n) or "xhat" (its
    -xhat mean(g w xhat) term); float64, cast to the dtype."""
    op, a = call["op"], call["args"]
    x, g = a[0].double(), gout.double()
    if op == "batch_norm":
        c = x.shape[1]
        X, G = (t.movedim(1, 0).reshape(c, -1) for t in (x, g))
        W = a[3].double()[:, None]
    elif op == "group_norm":
        N, C = x.shape[:2]
        grp = a[1]
        X, G = x.reshape(N * grp, -1), g.reshape(N * grp, -1)
        W = a[2].double().reshape(grp, C // grp).repeat_interleave(X.shape[1] * grp // C, 1).repeat(N, 1)
    else:
        n = x.shape[-1]
        X, G, W = x.reshape(-1, n), g.reshape(-1, n), a[2].double()[None, :]
    eps = call["kw"].get("eps", 1e-5)
    center = op != "rms_norm"
    m = X.mean(1, keepdim=True) if center else torch.zeros(())
    v = X.var(1, keepdim=True, correction=0) if center else (X * X).mean(1, keepdim=True)
    r = torch.rsqrt(v + eps)
    xh = (X - m) * r
    gw = G * W
    s1 = gw.mean(1, keepdim=True) if center and drop != "mean" else 0.0
    s2 = (gw * xh).mean(1, keepdim=True) if drop != "xhat" else 0.0
    y = r * (gw - s1 - xh * s2)
    if op == "batch_norm":
        y = y.reshape(c, x.shape[0], *x.shape[2:]).movedim(0, 1)
    return y.reshape(x.shape).to(a[0].dtype)


def pb_named(fam, call, gout, good):
    """(gradient name, kind, output): the dropped-term bugs at their natural size: bench_verdict's backward family's
    (``bw_natural_bugs``: a batch element missing from a parameter's sum, the batch sum as a mean, the norms'
    grad_input without the 1/n of its mean terms, softmax's row-sum term dropped, dk / dq without the scale,
    the divisor, 1/n, 2 or n - 1 forgotten) and: a norm's grad_input without its mean(g w) term or without its
    xhat term, grad_weight summed without xhat (the bias's sum), softmax's and log_softmax's formulas swapped,
    attention's dS without Delta, the gradient x 1.1."""
    op = call["op"]
    out = [(n, k, o) for n, k, o in bw_natural_bugs(call, gout, good) if n in good]
    for n, v in good.items():
        out.append((n, "gradient x 1.1", (v.double() * 1.1).to(v.dtype)))
    if op in ("layer_norm", "group_norm", "batch_norm", "rms_norm"):
        if op != "rms_norm":
            out.append(("input", "grad_input without its mean(g w) term", _pb_manual_norm(call, gout, "mean")))
        out.append(("input", "grad_input without its xhat mean(g w xhat) term", _pb_manual_norm(call, gout, "xhat")))
        x = call["args"][0]
        axes = tuple(i for i in range(x.ndim) if i != (x.ndim - 1 if op in ("layer_norm", "rms_norm") else 1))
        gsum = gout.double().sum(axes)
        out.append(("weight", "grad_weight summed without xhat (the bias's sum)", gsum.to(good["weight"].dtype)))
    if op in ("softmax", "log_softmax"):
        y, gd = torch.softmax(call["args"][0].double(), -1), gout.double()
        if op == "softmax":
            out.append(
                ("input", "log_softmax's formula g - y sum g", (gd - y * gd.sum(-1, keepdim=True)).to(gout.dtype))
            )
        else:
            out.append(("input", "softmax's formula y (g - sum g y)", (y * (gd - (gd * y).sum(-1, keepdim=True))).to(
                gout.dtype)))  # fmt: skip
    if op == "scaled_dot_product_attention":
        q, k, v = (t.double() for t in call["args"])
        sc = 1.0 / np.sqrt(q.shape[-1])
        P = torch.softmax(q @ k.transpose(-1, -2) * sc, -1)
        dS = P * (gout.double() @ v.transpose(-1, -2))  # Delta dropped
        out.append(("query", "dS without Delta", (dS @ k * sc).to(good["query"].dtype)))
        out.append(("key", "dS without Delta", (dS.transpose(-1, -2) @ q * sc).to(good["key"].dtype)))
    return out


def _pb_det(rep, exact, dtype):
    """(median, max) ulps of the report's detectable element: the inside test's own figure, or the GEMMs' absolute
    one over the ulp of each element's exact value."""
    det = (rep.detectable or {}).get("element")
    if isinstance(det, dict):
        return float(det.get("median_ulps", np.nan)), float(det.get("max_ulps", np.nan))
    if det is None or not np.isfinite(det):
        return np.nan, np.nan
    fin = np.isfinite(exact)
    r = float(det) / ulp_of(exact[fin], dtype)
    return (float(np.median(r)), float(r.max())) if r.size else (np.nan, np.nan)


def pb_case(fam, n, data, dtype, seed, scales, log=print, grads=None):
    """Every truth for one backward call, per gradient (``grads``: those names only): torch's autograd and the
    other correct implementations (the spread: the largest |error| of those with no half-precision running sum,
    ``may_name``), the injected bugs of ``pw_bugs`` in spreads on a correct base (torch's gradient, or torch's
    float32 autograd rounded where torch's own keeps a half running sum), the named dropped-term bugs. Rows of
    dicts."""
    call, gout = pb_call(fam, n, data, dtype, seed)
    half = dtype != "float32"
    good = _autograd(call, gout)
    may_torch = {k: PB_HALF[dtype] for k in ("weight", "bias")} if half and call["op"] in NORM_BW else {}
    correct = [("torch", good, may_torch)] + pb_correct(fam, call, gout, dtype, data)
    exact = pb_exact(call, gout)
    rows = []
    named = pb_named(fam, call, gout, good)
    for gname in call["diff"] if grads is None else grads:
        ex = exact[gname].reshape(good[gname].shape)
        meta = dict(op=fam, grad=gname, n=n, data=data, dtype=dtype, seed=seed, case=[fam, n, data, dtype, seed])
        errs = []
        for _, grads, _may in correct:
            if gname not in grads:
                errs.append(None)
                continue
            e = np.abs(_np(grads[gname]) - ex)
            errs.append(np.where(np.isnan(e), np.inf, e))
        rounding = [e for e, (_, grads, may) in zip(errs, correct) if e is not None and gname not in may]
        spread_el = np.max(rounding, axis=0)
        spread = float(spread_el.max())
        worst = max((float(e.max()), k) for e, (k, _, may) in zip(errs, correct) if e is not None and gname not in may)
        ulp = ulp_of(ex, dtype)
        fin = np.isfinite(ex)
        meta.update(spread=spread, spread_ulps=float(np.median((spread / ulp)[fin])),
                    spread_el_ulps=float(np.median((spread_el / ulp)[fin])), spread_by=worst[1])  # fmt: skip
        base_name = "torch" if gname not in may_torch else "torch fp32 autograd, rounded"
        base = dict((k, grads) for k, grads, _ in correct)[base_name][gname]
        for (cname, grads, may), e in zip(correct, errs):
            if e is None:
                continue
            rep, s = _judge_bw(call, gout, gname, grads[gname])
            dm, dx = _pb_det(rep, ex, dtype)
            rows.append(dict(verdict=rep.verdict, precision=rep.precision, seconds=s, det_ulps=dm, det_max_ulps=dx,
                             truth="correct", name=cname, may_name=may.get(gname), base=cname == base_name,
                             err=float(e.max()) / spread if spread else 0.0, **meta))  # fmt: skip
        sc = scales
        if spread == 0 or not np.isfinite(spread):
            log(f"  {fam} {n} {data} {dtype} {gname}: spread {spread}; no injected bugs")
            sc = ()
        g = _gen("power-bw-bug", fam, n, data, dtype, seed, gname)
        structure = pb_structure(fam, gname, tuple(base.shape))
        bugs = [(k, s_, o) for k, s_, o in pw_bugs(fam, base, spread, sc, g, structure=structure)]
        bugs += [(k, None, o) for gn, k, o in named if gn == gname]
        B = _np(base)
        for kind, nominal, o in bugs:
            if o.shape != base.shape:
                continue
            inj = float(np.abs(_np(o) - B).max())
            if inj == 0:
                continue  # rounding to the dtype swallowed the perturbation
            rep, s = _judge_bw(call, gout, gname, o)
            dm, dx = _pb_det(rep, ex, dtype)
            rows.append(dict(verdict=rep.verdict, precision=rep.precision, seconds=s, det_ulps=dm, det_max_ulps=dx,
                             truth="bug" if nominal is not None else "named", name=kind, nominal=nominal,
                             size=inj / spread if spread else np.inf,
                             err_size=float(np.abs(_np(o) - ex).max()) / spread if spread else np.inf,
                             **meta))  # fmt: skip
    return rows


def pb_plan(quick=False, families=PB_FAMILIES, dtypes=PW_DTYPES, sizes=None, data=None):
    """[(family, n, data, dtype)] of a run."""
    sizes = (PB_SIZES_QUICK if quick else PB_SIZES) if sizes is None else sizes
    data = (PB_DATA_QUICK if quick else PB_DATA) if data is None else data
    out = []
    for fam in families:
        for dtype in dtypes:
            for n in sizes[fam][dtype != "float32"]:
                for d in data.get(fam, ("randn",)):
                    out.append((fam, n, d, dtype))
    return out


def run_power_backward(quick=False, seeds=1, families=PB_FAMILIES, dtypes=PW_DTYPES, sizes=None, scales=None,
                       data=None, log=print, on_case=None):  # fmt: skip
    """The gradients' power rows (see summarise_power_backward); ``on_case``: called with each case's rows as soon
    as the case ends."""
    import warnings

    warnings.filterwarnings("ignore", message=".*degrees of freedom is <= 0.*")
    scales = (PB_SCALES_QUICK if quick else PB_SCALES) if scales is None else scales
    rows = []
    for seed in range(seeds):
        for fam, n, d, dtype in pb_plan(quick, families, dtypes, sizes, data):
            t0 = time.perf_counter()
            case = pb_case(fam, n, d, dtype, seed, scales, log)
            rows += case
            if on_case is not None:
                on_case(case)
            log(f"power-backward {fam} n={n} {d} {dtype}: {time.perf_counter() - t0:.1f} s")
    return rows


def _pb_alarm(r) -> bool:
    """A correct gradient called mismatch, or a reduced precision other than the one its kernel may be named."""
    return r["verdict"] == "mismatch" or (r["verdict"] == "reduced-precision" and r["precision"] != r.get("may_name"))


def _pb_key(r):
    return (r["op"], r["grad"], r["dtype"], r["n"], r["data"])


def summarise_power_backward(rows) -> dict:
    """Per (family, gradient, dtype, size, data): false alarms (``_pb_alarm``), injected bugs caught by size bin in
    spreads, below 1x named a precision, the base's report's detectable element (median ulps) over the spread (median
    over elements of spread / ulp(exact)), the median seconds per compare_backward; totals per dtype; the lists of
    false alarms, misses (>= 8x not a mismatch), bugs below 1x named a precision and the named bugs."""
    table = {}
    for r in rows:
        t = table.setdefault(
            _pb_key(r),
            dict(op=r["op"], grad=r["grad"], dtype=r["dtype"], n=r["n"], data=r["data"], correct=0, false_alarms=0,
                 seconds=[], spread=r["spread"], spread_ulps=r["spread_ulps"], spread_el_ulps=r["spread_el_ulps"],
                 spread_by=r["spread_by"], det_ulps=np.nan, det_over_spread=np.nan,
                 **{f"bugs {b}": 0 for b, _, _ in PW_BINS}, **{f"caught {b}": 0 for b, _, _ in PW_BINS},
                 named_precision_below_1x=0, named_bugs=0, named_caught=0),
        )  # fmt: skip
        t["seconds"].append(r["seconds"])
        if r["truth"] == "correct":
            t["correct"] += 1
            t["false_alarms"] += _pb_alarm(r)
            if r["base"]:
                t["det_ulps"] = r["det_ulps"]
                with np.errstate(all="ignore"):
                    t["det_over_spread"] = r["det_ulps"] / r["spread_ulps"] if r["spread_ulps"] else np.inf
        elif r["truth"] == "bug":
            for b, lo, hi in PW_BINS:
                if lo <= r["size"] < hi:
                    t[f"bugs {b}"] += 1
                    t[f"caught {b}"] += r["verdict"] == "mismatch"
            if r["size"] < 1:
                t["named_precision_below_1x"] += r["verdict"] == "reduced-precision"
        else:
            t["named_bugs"] += 1
            t["named_caught"] += r["verdict"] == "mismatch"
    cases = []
    for t in table.values():
        t["median_seconds"] = float(np.median(t.pop("seconds")))
        cases.append(t)
    bugs = [r for r in rows if r["truth"] == "bug"]
    correct = [r for r in rows if r["truth"] == "correct"]
    named = [r for r in rows if r["truth"] == "named"]
    s = dict(
        cases=cases,
        compares=len(rows),
        correct=len(correct),
        false_alarms=sum(_pb_alarm(r) for r in correct),
        correct_named_their_half_sum=sum(r["verdict"] == "reduced-precision" and not _pb_alarm(r) for r in correct),
        bugs_ge_8x=sum(r["size"] >= 8 for r in bugs),
        caught_ge_8x=sum(r["size"] >= 8 and r["verdict"] == "mismatch" for r in bugs),
        bugs_1_to_8x=sum(1 <= r["size"] < 8 for r in bugs),
        caught_1_to_8x=sum(1 <= r["size"] < 8 and r["verdict"] == "mismatch" for r in bugs),
        bugs_below_1x=sum(r["size"] < 1 for r in bugs),
        below_1x_named_a_precision=sum(r["size"] < 1 and r["verdict"] == "reduced-precision" for r in bugs),
        below_1x_mismatch=sum(r["size"] < 1 and r["verdict"] == "mismatch" for r in bugs),
        named_bugs=len(named),
        named_caught=sum(r["verdict"] == "mismatch" for r in named),
        named_ge_8x=sum(r["size"] >= 8 for r in named),
        named_ge_8x_caught=sum(r["size"] >= 8 and r["verdict"] == "mismatch" for r in named),
        detectable_infinite=sum(1 for t in cases if not np.isfinite(t["det_ulps"])),
        detectable_over_8x=sum(1 for t in cases if not t["det_over_spread"] <= 8),
        median_seconds=float(np.median([r["seconds"] for r in rows])) if rows else np.nan,
        false_alarm_cases=[r for r in correct if _pb_alarm(r)],
        missed=[r for r in bugs if r["size"] >= 8 and r["verdict"] != "mismatch"],
        below_1x_named=[r for r in bugs if r["size"] < 1 and r["verdict"] == "reduced-precision"],
        named=named,
    )  # fmt: skip
    s["by_dtype"] = {}
    for dtype in PW_DTYPES:
        sel = [r for r in bugs if r["dtype"] == dtype]
        cor = [r for r in correct if r["dtype"] == dtype]
        s["by_dtype"][dtype] = dict(
            false_alarms=f"{sum(_pb_alarm(r) for r in cor)}/{len(cor)}",
            caught_ge_8x=f"{sum(r['size'] >= 8 and r['verdict'] == 'mismatch' for r in sel)}/"
            f"{sum(r['size'] >= 8 for r in sel)}",
            below_1x_named=f"{sum(r['size'] < 1 and r['verdict'] == 'reduced-precision' for r in sel)}/"
            f"{sum(r['size'] < 1 for r in sel)}",
        )
    s["power_by"] = {}
    for key in ("op", "dtype", "name"):
        for v in sorted({r[key] for r in bugs}):
            sel = [r for r in bugs if r[key] == v]
            s["power_by"][f"{key}={v}"] = {
                b: f"{sum(lo <= r['size'] < hi and r['verdict'] == 'mismatch' for r in sel)}/"
                f"{sum(lo <= r['size'] < hi for r in sel)}"
                for b, lo, hi in PW_BINS
            }
    worst = sorted((t for t in cases if np.isfinite(t["det_over_spread"])), key=lambda t: -t["det_over_spread"])
    s["worst_det_over_spread"] = [
        f"{t['op']} {t['grad']} {t['dtype']} n={t['n']} {t['data']}: {t['det_over_spread']:.3g}" for t in worst[:12]
    ]
    return s


def _pb_text(r):
    return f"{r['op']} {r['grad']} n={r['n']} {r['data']} {r['dtype']} seed={r['seed']}"


def print_power_backward(s, log=print):
    log(f"\n== power family, gradients: {s['compares']} compare_backward calls, "
        f"median {s['median_seconds']:.2f} s each")  # fmt: skip
    log(f"false alarms on correct gradients: {s['false_alarms']} / {s['correct']} "
        f"(named their own half running sum, allowed: {s['correct_named_their_half_sum']})")  # fmt: skip
    log(f"bugs >= 8x the spread of correct implementations caught: {s['caught_ge_8x']} / {s['bugs_ge_8x']}")
    log(f"bugs 1-8x the spread caught: {s['caught_1_to_8x']} / {s['bugs_1_to_8x']}")
    log(f"bugs below 1x the spread named a precision: {s['below_1x_named_a_precision']} / {s['bugs_below_1x']} "
        f"(called mismatch: {s['below_1x_mismatch']})")  # fmt: skip
    log(f"named dropped-term bugs caught: {s['named_caught']} / {s['named_bugs']} (>= 8x the spread: "
        f"{s['named_ge_8x_caught']} / {s['named_ge_8x']})")  # fmt: skip
    log(f"cases whose detectable is infinite: {s['detectable_infinite']}; above 8x the spread: "
        f"{s['detectable_over_8x']} / {len(s['cases'])}")  # fmt: skip
    for d, v in s["by_dtype"].items():
        log(f"  {d:<9} false alarms {v['false_alarms']}, >= 8x caught {v['caught_ge_8x']}, "
            f"below 1x named {v['below_1x_named']}")  # fmt: skip
    log(
        f"{'family':<18} {'grad':<7} {'dtype':<9} {'n':>8} {'data':<6} {'FA':>5} {'>=8x':>7} {'1-8x':>7} "
        f"{'<1x prec':>8} {'named':>6} {'spread ulp':>10} {'det ulp':>9} {'det/spr':>8} {'s/call':>6}  spread set by"
    )
    order = {f: i for i, f in enumerate(PB_FAMILIES)}
    for t in sorted(s["cases"], key=lambda t: (order.get(t["op"], 99), t["grad"], t["dtype"], t["n"], t["data"])):
        log(
            f"{t['op']:<18} {t['grad']:<7} {t['dtype']:<9} {t['n']:>8} {t['data'][:6]:<6} "
            f"{t['false_alarms']:>2}/{t['correct']:<2} {t['caught >=8x']:>3}/{t['bugs >=8x']:<3} "
            f"{t['caught 1-8x']:>3}/{t['bugs 1-8x']:<3} {t['named_precision_below_1x']:>3}/{t['bugs <1x']:<4} "
            f"{t['named_caught']:>2}/{t['named_bugs']:<3} {_num(t['spread_ulps']):>10} {_num(t['det_ulps']):>9} "
            f"{_num(t['det_over_spread']):>8} {t['median_seconds']:>6.2f}  {t['spread_by']}"
        )
    log("power by family, dtype and kind (caught / bugs, by size in spreads):")
    for k, v in s["power_by"].items():
        log(f"  {k:<40} " + "  ".join(f"{b}: {x}" for b, x in v.items()))
    log("worst detectable / spread: " + "; ".join(s["worst_det_over_spread"]))
    for r in s["named"]:
        if r["verdict"] != "mismatch":
            log(f"  named, not caught: {_pb_text(r)} {r['name']}: {r['verdict']} {r['precision'] or ''} "
                f"size {_num(r['size'])}x")  # fmt: skip
    for key in ("false_alarm_cases", "missed", "below_1x_named"):
        for r in s[key]:
            log(
                f"  {key}: {_pb_text(r)} {r['truth']} {r['name']}: {r['verdict']} {r['precision'] or ''} "
                f"size {_num(r.get('size', r.get('err')))}x"
            )


def power_backward_markdown(s) -> str:
    """The gradients' power table as markdown (docs/analysis.md): one row per family x gradient x size x data, per
    dtype the false alarms, bugs >= 8x and 1-8x the spread caught, and the detectable over the spread."""
    dts = PW_DTYPES
    lines = ["| family | grad | n | data | " + " | ".join(f"{d}: FA, >=8x, 1-8x, det/spread" for d in dts) + " |",
             "|---|---|---:|---|" + "---|" * len(dts)]  # fmt: skip
    by = {}
    for t in s["cases"]:
        by.setdefault((t["op"], t["grad"], t["n"], t["data"]), {})[t["dtype"]] = t
    order = {f: i for i, f in enumerate(PB_FAMILIES)}
    for (op, grad, n, data), ts in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1], kv[0][2],
                                                                      kv[0][3])):  # fmt: skip
        cells = []
        for d in dts:
            t = ts.get(d)
            if t is None:
                cells.append("-")
                continue
            cells.append(_pw_cell(t))
        lines.append(f"| {op} | {grad} | {n:g} | {data} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the power families in parts (--ops, --sizes, --jsonl)

POWER_FAMILIES = {"power": PW_OPS + ("special",), "power-backward": PB_FAMILIES}


def _listed(text, known, arg):
    """The comma-separated names of ``text``, each one of ``known`` (else a ValueError naming ``arg``)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in known]
    if bad or not names:
        raise ValueError(f"{arg}: expected a comma-separated list of {', '.join(known)}; got {text!r}")
    return tuple(names)


def _sizes_of(text, arg="--sizes"):
    """The comma-separated sizes of ``text`` as ints (``1e7`` allowed where it is an integer)."""
    out = []
    for t in (t.strip() for t in text.split(",")):
        try:
            v = float(t)
        except ValueError:
            v = np.nan
        if not (np.isfinite(v) and v == int(v) and v >= 1):
            raise ValueError(f"{arg}: expected a comma-separated list of positive integers; got {text!r}")
        out.append(int(v))
    return set(out)


def power_plan_sizes(family, quick, want):
    """The size table of ``family`` (PW_SIZES or PB_SIZES, quick or not) restricted to the sizes in ``want``
    (None: all). power: {axis: lengths}; power-backward: {family: (float32 sizes, half sizes)}."""
    keep = (lambda ns: tuple(ns)) if want is None else (lambda ns: tuple(n for n in ns if n in want))
    if family == "power":
        return {ax: keep(ns) for ax, ns in (PW_SIZES_QUICK if quick else PW_SIZES).items()}
    return {f: (keep(a), keep(b)) for f, (a, b) in (PB_SIZES_QUICK if quick else PB_SIZES).items()}


_RUNS = [0]  # jsonl_writer's runs in this process


def jsonl_writer(path, family):
    """``on_case`` for run_power / run_power_backward: appends each case's rows to ``path`` as JSON lines (one
    row a line, with its ``family`` and the ``part`` it was measured in, this run's id and the case's number)
    and flushes, so that a stopped run keeps every case it finished."""
    _RUNS[0] += 1  # two runs within one second of one process (the tests) are two parts, not one
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{_RUNS[0]}"
    count = [0]

    def on_case(rows):
        count[0] += 1
        with open(path, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(family=family, part=f"{run_id}/{count[0]}", **r), default=_jsonable) + "\n")
            f.flush()
            os.fsync(f.fileno())

    return on_case


def read_jsonl(paths):
    """{family: rows} of the JSON-lines files ``paths`` (``--jsonl``). A case measured more than once (the
    same family and ``case`` in several parts) keeps the rows of its last part only, so that a rerun replaces
    it rather than counting it twice; a line cut short by a stopped run is skipped."""
    lines = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # the last line of a run stopped while writing
    last = {}
    for r in lines:
        last[(r["family"], json.dumps(r["case"]))] = r["part"]
    out = {}
    for r in lines:
        if last[(r["family"], json.dumps(r["case"]))] == r["part"]:
            fam = r.pop("family")
            r.pop("part")
            out.setdefault(fam, []).append(r)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer K, lengths and regimes; bugs on fp32 results only")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument(
        "--family",
        choices=("all", "gemm", "envelope", "backward", "power", "power-backward"),
        default="all",
        help="gemm: matmul/linear/conv2d (statistical test); envelope: reductions, norms, pools; "
        "backward: the gradients (compare_backward); power: bugs sized in spreads of correct implementations; "
        "power-backward: the same for the gradients",
    )
    ap.add_argument("--json", help="write rows and summary here")
    ap.add_argument("--markdown", help="power family: write its table as markdown here")
    ap.add_argument("--markdown-backward", help="power-backward family: write its table as markdown here")
    ap.add_argument(
        "--ops",
        help="power: only these ops (comma-separated, of " + ", ".join(POWER_FAMILIES["power"]) + "; special: the "
        "named calls of their own); power-backward: only these families",
    )
    ap.add_argument("--sizes", help="power families: only these sizes (comma-separated, e.g. 8192,1e7)")
    ap.add_argument("--dtypes", help="power families: only these dtypes (comma-separated: float32,bfloat16,float16)")
    ap.add_argument("--jsonl", help="power families: append each case's rows to this file as it ends")
    ap.add_argument(
        "--summarize",
        nargs="+",
        metavar="FILE.jsonl",
        help="run nothing: the power families' summaries and markdown tables from these --jsonl files",
    )
    a = ap.parse_args(argv)
    parts = a.ops is not None or a.sizes is not None or a.dtypes is not None or a.jsonl is not None
    if parts and a.family not in POWER_FAMILIES:
        ap.error(f"--ops, --sizes, --dtypes and --jsonl: expected --family power or power-backward; got {a.family}")
    if a.summarize and parts:
        ap.error("--summarize: reads --jsonl files and runs nothing; got it with --ops, --sizes, --dtypes or --jsonl")
    try:
        ops = None if a.ops is None else _listed(a.ops, POWER_FAMILIES[a.family], "--ops")
        want = None if a.sizes is None else _sizes_of(a.sizes)
        dtypes = PW_DTYPES if a.dtypes is None else _listed(a.dtypes, PW_DTYPES, "--dtypes")
    except ValueError as e:
        ap.error(str(e))
    if a.summarize:
        return _summarize_main(a)
    torch.set_num_threads(2)
    result = {}
    if a.family in ("all", "gemm"):
        t = time.time()
        rows = run(quick=a.quick, seeds=a.seeds, ks=(9, 72, 1152) if a.quick else KS)
        s = summarise(rows)
        print(f"\n== gemm family: {s['cases']} cases in {time.time() - t:.0f} s")
        print(
            f"false alarms on correct results: {s['false_alarms']} / {s['correct']} "
            f"({100 * s['false_alarm_rate']:.2f}%)"
        )
        print(
            f"bugs >= 10x the fp32 scale caught: {s['caught']} / {s['bugs_ge_10x']} "
            f"({100 * s['detection_rate']:.1f}%); by K: {s['detection_by_k']}"
        )
        print(f"bugs 1-10x the scale caught: {s['caught_1_to_10x']} / {s['bugs_1_to_10x']}")
        print(f"bugs below the noise named a precision: {s['below_noise_named_a_precision']} / {s['bugs_below_noise']}")
        print(f"reduced precisions named right: {s['named_right']} / {s['reduced']} ({100 * s['named_rate']:.1f}%)")
        for key in ("false_alarm_cases", "missed", "misnamed", "below_noise_named"):
            for r in s[key][:12]:
                print(
                    f"  {key}: {r['op']} K={r['k']} {r['data']} {r['truth']} {r['name']}: {r['verdict']} "
                    f"{r['precision'] or ''} {r.get('size', '')}"
                )
        result.update(summary={k: v for k, v in s.items() if not isinstance(v, list)}, rows=rows)
    if a.family in ("all", "envelope"):
        t = time.time()
        rows = run_envelope(quick=a.quick, seeds=a.seeds)
        s = summarise_envelope(rows)
        print_envelope(s)
        print(f"envelope family: {time.time() - t:.0f} s")
        result["envelope"] = {
            "summary": {k: v for k, v in s.items() if not isinstance(v, list) or k == "ops"},
            "rows": rows,
        }
    if a.family in ("all", "backward"):
        t = time.time()
        rows = run_backward(quick=a.quick, seeds=a.seeds)
        s = summarise_backward(rows)
        print_backward(s)
        print(f"backward family: {time.time() - t:.0f} s")
        result["backward"] = {"summary": {k: v for k, v in s.items() if not isinstance(v, list)}, "rows": rows}
    power = (("power", "power family", run_power, summarise_power, print_power, a.markdown, power_markdown),
             ("power_backward", "power family, gradients", run_power_backward, summarise_power_backward,
              print_power_backward, a.markdown_backward, power_backward_markdown))  # fmt: skip
    for key, label, run_f, summarise_f, print_f, md_path, md_f in power:
        fam = key.replace("_", "-")
        if a.family not in ("all", fam):
            continue
        t = time.time()
        kw = dict(sizes=power_plan_sizes(fam, a.quick, want), dtypes=dtypes)
        if fam == "power":  # the named calls of their own: in a whole run, or asked for by name
            whole = ops is None and want is None and a.dtypes is None
            kw.update(
                ops=tuple(o for o in PW_OPS if ops is None or o in ops), special=whole or "special" in (ops or ())
            )
        elif ops is not None:
            kw.update(families=ops)
        if a.jsonl:
            kw.update(on_case=jsonl_writer(a.jsonl, fam))
        rows = run_f(quick=a.quick, seeds=a.seeds, **kw)
        s = summarise_f(rows)
        print_f(s)
        print(f"{label}: {time.time() - t:.0f} s")
        result[key] = {"summary": s, "rows": rows}
        if md_path:
            with open(md_path, "w") as f:
                f.write(md_f(s) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=_jsonable)
    return 0


def _summarize_main(a):
    """``--summarize``: the power families' summaries, printed tables, markdown (``--markdown``,
    ``--markdown-backward``) and JSON (``--json``) from the rows of ``--jsonl`` files, as a whole run gives them."""
    fams = read_jsonl(a.summarize)
    result = {}
    power = (("power", summarise_power, print_power, a.markdown, power_markdown),
             ("power-backward", summarise_power_backward, print_power_backward, a.markdown_backward,
              power_backward_markdown))  # fmt: skip
    for fam, summarise_f, print_f, md_path, md_f in power:
        if fam not in fams or a.family not in ("all", fam):
            continue
        rows = fams[fam]
        s = summarise_f(rows)
        print_f(s)
        result[fam.replace("-", "_")] = {"summary": s, "rows": rows}
        if md_path:
            with open(md_path, "w") as f:
                f.write(md_f(s) + "\n")
    if not result:
        print(f"--summarize: no rows of the {a.family} family in {', '.join(a.summarize)}", file=sys.stderr)
        return 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=_jsonable)
    return 0


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
