"""Backward rules of linear, matmul and dot: each gradient one adjoint call of an exact matmul
(:mod:`refkern.gradients` derives them)."""

import math

import numpy as np

from refkern._arrays import operand
from refkern.kernels._grad import Adjoint, _bcast, _check_grad, _ones_judge, _perm, _shape, _tap_judge


def _linear(op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import linear_operands

    x, w, b = a["x"], a["weight"], a["bias"]
    _, _, _, shape = linear_operands(plan(op, {"x": x, "weight": w, "bias": b}, ("x", "weight"), "exact", None))
    _check_grad(op, g, shape, x, "x", who)
    sx, sw = _shape(x), _shape(w)
    lead, n_in = sx[:-1], sx[-1]
    m = math.prod(lead)
    out = {}
    if "x" in wrt:
        if len(sw) == 2:
            out["x"] = Adjoint("x", "matmul", (g, w))
        else:  # y[...] = sum_k x[..., k] w[k]: grad_x[..., k] = g[...] w[k], one term
            out["x"] = Adjoint("x", "matmul", (g.reshape(lead + (1,) if lead else (1,)), w.reshape((1, n_in))))
    if "weight" in wrt:
        x2 = x.reshape((m, n_in))
        if len(sw) == 2:
            out["weight"] = Adjoint("weight", "matmul", (_perm(g.reshape((m, sw[0])), (1, 0)), x2))
        else:
            out["weight"] = Adjoint("weight", "matmul", (g.reshape((m,)), x2))
    if "bias" in wrt:
        if _shape(b) == () or len(sw) == 1:
            out["bias"] = Adjoint("bias", "sum", (g,), judge=lambda: _ones_judge(g.reshape((math.prod(_shape(g)),))))
        else:
            g2 = g.reshape((m, sw[0]))
            out["bias"] = Adjoint("bias", "sum", (g2,), {"dim": 0}, judge=lambda: _ones_judge(g2))
    return out


def _swap_last(a):
    return _perm(a, (*range(a.ndim - 2), a.ndim - 1, a.ndim - 2))


def _split_batch(batch, own):
    """Batch axes (of the broadcast ``batch``) an operand with batch shape ``own`` keeps, and those
    it was broadcast over (to be summed)."""
    lead = len(batch) - len(own)
    padded = (1,) * lead + tuple(own)
    kept = [i for i in range(len(batch)) if i >= lead and padded[i] == batch[i]]
    return kept, [i for i in range(len(batch)) if i not in kept]


def _matmul(op, g, a, wrt, who):
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands

    A, B = a["a"], a["b"]
    _, _, _, _, shape = matmul_operands(plan(op, {"a": A, "b": B}, ("a", "b"), "exact", None))
    _check_grad(op, g, shape, A, "a", who)
    sa, sb = _shape(A), _shape(B)
    A2 = A.reshape((1,) + sa) if len(sa) == 1 else A
    B2 = B.reshape(sb + (1,)) if len(sb) == 1 else B
    (m, k), n = _shape(A2)[-2:], _shape(B2)[-1]
    ba, bb = _shape(A2)[:-2], _shape(B2)[:-2]
    batch = tuple(np.broadcast_shapes(ba, bb))
    nb = len(batch)
    G = g.reshape(batch + (m, n))
    # the taps' judge only where every tap has terms and the gradient elements (no dimension is 0): an empty
    # gradient has nothing to judge, and one of empty sums is +0 everywhere, judged as the plain product (K = 0)
    taps = math.prod(batch) * m * k * n > 0
    out = {}
    if "a" in wrt:  # grad_a[.., i, p] = sum over (broadcast axes, j) of G[.., i, j] B[.., p, j]
        kept, red = _split_batch(batch, ba)
        r = math.prod(batch[i] for i in red)
        L = _perm(G, kept + [nb] + red + [nb + 1]).reshape(ba + (m, r * n))
        R = _perm(_bcast(B2, batch + (k, n)), kept + red + [nb + 1, nb]).reshape(ba + (r * n, k))
        if len(sa) == 1:  # a row: the product is 1-D
            L = L.reshape((r * n,))
        judge = None
        if r > 1 and taps:  # broadcast: torch sums the per-batch products; judge as taps (one per broadcast element)

            def judge(kept=kept, red=red, r=r):
                q = math.prod(ba)
                lt = _perm(G, kept + red + [nb, nb + 1]).reshape((q, r, m, n))
                rt = _perm(_bcast(B2, batch + (k, n)), kept + red + [nb + 1, nb]).reshape((q, r, n, k))
                return _tap_judge(
                    "a",
                    lt,
                    rt,
                    lambda v: _swap_last(v.reshape((q, k, m))).reshape(sa),
                    lambda v: _swap_last(v.reshape((q, m, k))).reshape((1, q * k, m)),
                )

        out["a"] = Adjoint("a", "matmul", (L, R), judge=judge)
    if "b" in wrt:  # grad_b[.., p, j] = sum over (broadcast axes, i) of A[.., i, p] G[.., i, j]
        kept, red = _split_batch(batch, bb)
        r = math.prod(batch[i] for i in red)
        L = _perm(_bcast(A2, batch + (m, k)), kept + [nb + 1] + red + [nb]).reshape(bb + (k, r * m))
        R = _perm(G, kept + red + [nb, nb + 1]).reshape(bb + (r * m, n))
        if len(sb) == 1:  # a column: the product is 1-D
            R = R.reshape((r * m,))
        judge = None
        if r > 1 and taps:

            def judge(kept=kept, red=red, r=r):
                q = math.prod(bb)
                lt = _perm(_bcast(A2, batch + (m, k)), kept + red + [nb + 1, nb]).reshape((q, r, k, m))
                rt = _perm(G, kept + red + [nb, nb + 1]).reshape((q, r, m, n))
                return _tap_judge(
                    "b",
                    lt,
                    rt,
                    lambda v: _swap_last(v.reshape((q, n, k))).reshape(sb),
                    lambda v: _swap_last(v.reshape((q, k, n))).reshape((1, q * n, k)),
                )

        out["b"] = Adjoint("b", "matmul", (L, R), judge=judge)
    return out


def _dot(op, g, a, wrt, who):
    """dot(x, y): grad_x = g y, grad_y = g x, one product each: a K = 1 matmul (an adjoint call)."""
    ox, oy = operand(a["x"], "x", who), operand(a["y"], "y", who)
    if len(ox.shape) != 1 or len(oy.shape) != 1 or ox.shape != oy.shape:
        raise ValueError(f"{who}: dot expects 1-D x and y of one length; got x.shape={tuple(ox.shape)} and "
                         f"y.shape={tuple(oy.shape)}.")  # fmt: skip
    if ox.fmt.name != oy.fmt.name:
        raise TypeError(f"{who}: dot expects x and y of one dtype; got x.dtype={ox.fmt.name} and "
                        f"y.dtype={oy.fmt.name}.")  # fmt: skip
    _check_grad(op, g, (), a["x"], "x", who)
    n = ox.shape[0]
    g1 = g.reshape((1,)) if hasattr(g, "reshape") else np.asarray(g).reshape((1,))
    out = {}
    for k, other in (("x", a["y"]), ("y", a["x"])):
        if k in wrt:
            out[k] = Adjoint(k, "matmul", (g1, other.reshape((1, n))))
    return out
