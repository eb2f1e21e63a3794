"""The yardstick of embedding (a lookup: bit for bit) and of its gradient (a scatter-add: the worst-case
envelope of a sum in any order).

Row ``v`` of the gradient of ``weight`` sums the k rows of grad_output whose index is v. A correct
implementation adds them in any order in its working precision; torch's CPU kernel (``index_add_`` on the
result) rounds every addition to the result dtype (measured: bfloat16 within 2 of its units times the
terms' magnitude over 80 terms). So with ``u`` float32's unit for float16/bfloat16/float32 results
(float64's for float64) and ``u_m`` the result's unit for a half result (0 otherwise), ``ua = u + u_m``:

* ``|computed - exact| <= gamma_{k-1}(ua) sum |g_i|`` (Higham (4.4); ``gamma_k(u) = k u (1 + 4 k u) / (1 -
  k u)``, infinite beyond ``k u = 1/8``: no bound is claimed, and the Report counts those elements);
* with ``scale_grad_by_freq`` each term is first multiplied by ``fl(1 / k)`` (two roundings): ``+ 2 ua sum
  |g_i| / k``, and the sum's bound is over k;
* plus the centre's store, ``u_out |ref| + eta`` (twice for a half result); a row of one term without
  scaling is a copy: its bound is 0 (bit for bit), as is every row no index reaches and the padding row.

A gradient that keeps one of a repeated token's rows drops the others, each as large as the kept one:
far beyond ``gamma_{k-1}``, a mismatch (for ``k ua <= 1/8``: k up to 31 in bfloat16, 255 in float16).
"""

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.kernels.loss import gamma

__all__ = ["compare_call", "grad_report", "grad_bound"]


def compare_call(actual, name, args, kwargs, rtol=None, atol=None, arrays=False):
    """:func:`refkern.compare` for embedding's lookup: every element must be the looked-up value."""
    from refkern._arrays import operand
    from refkern.analysis.actual import actual_as
    from refkern.analysis.evaluate import _bind
    from refkern.analysis.losses import _report
    from refkern.kernels.embedding import embedding

    bound = _bind(name, args, kwargs)
    ref = operand(embedding(**bound), "reference", "compare")
    a64, device = actual_as(actual, name, ref.shape, ref.fmt)
    r64 = np.asarray(ref.values, np.float64).reshape(ref.shape)
    notes = ["a lookup copies values: judged bit for bit"]
    b = np.zeros(r64.shape)
    if bound.get("max_norm") is not None:
        b = renorm_bound(bound, r64, ref.fmt)
        notes.append("rows beyond max_norm: the envelope of torch's embedding_renorm_ (refkern.analysis.embedding)")
    rep = _report(name, a64, r64, b, ref.fmt, device, 1, rtol, atol, notes)
    return rep, ({"reference": r64, "actual": a64, "report": rep} if arrays else None)


def renorm_bound(a, ref, fmt) -> np.ndarray:
    """The envelope of a lookup with ``max_norm`` (module docstring's units). torch's ``embedding_renorm_``
    computes ``N = ||w||_p`` in the working precision, stored in the dtype (``u_m``): relative error ``r_N`` =
    ``gamma_{D-1}(u)`` (p = 1), 0 (inf), ``gamma_D(u) / 2 + u`` (2: the squares, the sum, the square root),
    ``(2u + gamma_{D-1}(u)) / p + 2u`` (any other p: |w|**p and the root within 1 ulp each), plus ``u_m``;
    then ``max_norm / (N + 1e-7)`` in float64 (``2**-51``), converted to the working precision and multiplied
    (``gamma_2(u)``) and stored (``u_m``): a scaled element within ``(r_N / (1 - r_N) + 2**-51 + gamma_2(u) +
    u_m) |y| * 1.01`` plus the centre's store(s). A row whose N lies within ``2 r_N N`` of max_norm may be
    scaled or not: both are accepted (``|w - y|`` more). Every other row is a copy, bit for bit."""
    from refkern._arrays import operand
    from refkern.kernels._embedding_renorm import check_norm_type

    w = operand(a["weight"], "weight", "compare")
    W = np.asarray(w.values, np.float64).reshape(w.shape)
    V, D = W.shape
    p = check_norm_type(a.get("norm_type", 2.0), "compare")
    u = FLOAT64.u if fmt is FLOAT64 else FLOAT32.u
    u_m = fmt.u if fmt.prec < FLOAT32.prec else 0.0
    if p == 1.0:
        rN = float(gamma(max(D - 1, 0), u))
    elif p == np.inf:
        rN = 0.0
    elif p == 2.0:
        rN = float(gamma(D, u)) / 2 + u
    else:
        rN = (2 * u + float(gamma(max(D - 1, 0), u))) / p + 2 * u
    rN += u_m
    with np.errstate(all="ignore"):
        N = np.max(np.abs(W), axis=1) if p == np.inf else np.sum(np.abs(W) ** p, axis=1) ** (1 / p)
        m = float(a["max_norm"])
        scaled = W * (m / (N + 1e-7))[:, None]
        rel = rN / (1 - rN) + 2.0**-51 + float(gamma(2, u)) + u_m
        stores = 2 if u_m else 1
        env = rel * np.abs(scaled) * 1.01 + stores * (fmt.u * np.abs(scaled) + 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1))
        near = np.abs(N - m) <= 2 * rN * N + 1e-300
        rows = np.where(near[:, None], np.abs(W - scaled) + env, np.where((N > m)[:, None], env, 0.0))
    idx = a["input"]
    from refkern.kernels.embedding import indices_of

    b = rows[indices_of(idx, "input", "compare")]
    return np.where(np.isnan(b), np.inf, b).reshape(ref.shape)


def grad_bound(c, ref) -> np.ndarray:
    """The envelope (V, D) of the module docstring for the validated call ``c``
    (:class:`~refkern.kernels.embedding.EmbeddingGrad`) and its reference."""
    fmt = c.fmt
    u = FLOAT64.u if fmt is FLOAT64 else FLOAT32.u
    u_m = fmt.u if fmt.prec < FLOAT32.prec else 0.0
    ua = u + u_m
    N, D = c.G.shape
    keep = np.ones(N, np.bool_) if c.padding is None else c.idx != c.padding
    k = np.bincount(c.idx[keep], minlength=c.V).astype(np.float64)
    m = np.zeros((c.V, D))
    np.add.at(m, c.idx[keep], np.abs(c.G[keep]))
    with np.errstate(all="ignore"):
        if c.scale:
            b = (gamma(np.maximum(k - 1, 0), ua)[:, None] * m + 2.0 * ua * m) / np.maximum(k, 1)[:, None]
        else:
            b = gamma(np.maximum(k - 1, 0), ua)[:, None] * m
        stores = 2 if u_m else 1
        b = b * 1.01 + stores * (fmt.u * np.abs(ref) + 0.5 * 2.0 ** (fmt.emin - fmt.prec + 1))
    copy = (k <= 1) & (not c.scale) | (k == 0)
    if c.padding is not None:
        copy[c.padding] = True
    return np.where(copy[:, None], 0.0, np.where(np.isnan(b), np.inf, b))


def grad_report(got, g, a, who, rtol=None, atol=None):
    """compare_backward's Report for the gradient of embedding's weight."""
    from refkern.analysis.actual import actual_grad
    from refkern.analysis.losses import _report
    from refkern.kernels.embedding import grad_weight
    from refkern.kernels.embedding_grad import call_of

    c = call_of(g, a, who)
    a64, device = actual_grad(got, "weight", c.fmt, who)
    ref = grad_weight(c)
    b = grad_bound(c, ref)
    blind = int(np.count_nonzero(np.isinf(b)))
    notes = ["the gradient of embedding judged by the worst-case envelope of a scatter-add in any order "
             "(refkern.analysis.embedding): rows of one term are copies, judged bit for bit"]  # fmt: skip
    if blind:
        notes.append(f"no bound is claimed for {blind} elements (a token repeated beyond 1/(8 u) times)")
    a64 = a64.reshape(ref.shape)
    return _report("embedding backward (weight)", a64, ref, b, c.fmt, device, int(c.G.shape[0]), rtol, atol, notes)
