"""refkern.backward for scaled_dot_product_attention where a row's logits lie far apart (1e5, 1e6, a mask of
float32's lowest value): gradients of size e**-1e5 that no fixed-point width reaches, decided by their sign
(:func:`refkern.kernels._exact_attention._scaled`), bit for bit (signed zeros too) against mpmath from the
definition; the rounding argument on a synthetic sum; the constants pinned."""

import math
from fractions import Fraction

import numpy as np
import pytest

import refkern as rk
from refkern.accumulate.formats import FORMATS
from refkern.kernels import _exact_attention as xa
from refkern.kernels import _exact_attention_row as xrow

torch = pytest.importorskip("torch")
mpmath = pytest.importorskip("mpmath")
OP = "scaled_dot_product_attention"


def _truth(q, k, v, g, scale, mask=None, prec=256):  # noqa: C901 - one definition, written out
    """Every gradient from the definition on mpmath intervals at ``prec`` bits (relative: mpmath's exponents are
    free), in the form without cancellation between exponentials: ``P_ij = e**a_ij / S_i``, ``dS_ij = e**a_ij
    sum_k (dP_ij - dP_ik) e**a_ik / S_i**2`` (``dP_ij - dP_ik`` exact), ``dq = s dS k``, ``dk = s dS^T q``, ``dv =
    P^T dO``, ``dmask = dS``; each interval must round to one value (signed zeros apart) of the inputs' format."""
    from mpmath import iv

    from refkern.truth.softmax import _round_ends

    fmt = FORMATS[str(q.dtype)[6:]]
    Q, K, V, G = ([[Fraction(float(x)) for x in row] for row in t[0].tolist()] for t in (q, k, v, g))
    M = (
        [[Fraction(0)] * len(K) for _ in Q]
        if mask is None
        else [[Fraction(float(x)) for x in r] for r in mask.tolist()]
    )
    s = Fraction(scale)
    L, S = len(Q), len(K)
    saved = iv.prec
    iv.prec = prec
    try:

        def mp(x):
            return iv.mpf(x.numerator) / x.denominator

        P, dS = [], []
        for i in range(L):
            z = [s * sum(a * b for a, b in zip(Q[i], K[j])) + M[i][j] for j in range(S)]
            top = max(z)
            E = [iv.exp(mp(x - top)) for x in z]
            Si = sum(E[1:], E[0])
            dP = [sum(a * b for a, b in zip(G[i], V[j])) for j in range(S)]
            P.append([E[j] / Si for j in range(S)])
            dS.append(
                [E[j] * sum((mp(dP[j] - dP[m]) * E[m] for m in range(S)), iv.mpf(0)) / (Si * Si) for j in range(S)]
            )
        out = {
            "query": [[mp(s) * sum((dS[i][j] * mp(K[j][c]) for j in range(S)), iv.mpf(0)) for c in range(len(K[0]))]
                      for i in range(L)],
            "key": [[mp(s) * sum((dS[i][j] * mp(Q[i][c]) for i in range(L)), iv.mpf(0)) for c in range(len(Q[0]))]
                    for j in range(S)],
            "value": [[sum((P[i][j] * mp(G[i][c]) for i in range(L)), iv.mpf(0)) for c in range(len(V[0]))]
                      for j in range(S)],
            "attn_mask": dS,
        }  # fmt: skip
        res = {}
        for n, rows in out.items():
            vals = [[_round_ends(x, fmt) for x in r] for r in rows]
            if any(x is None for r in vals for x in r):
                assert prec < 1 << 16, (n, "undecided at", prec, "bits")
                return None
            res[n] = np.array(vals)
        return res
    finally:
        iv.prec = saved


def _bits(x):
    return np.asarray(x, np.float64).view(np.int64).tolist()


def _check(q, k, v, g, scale, mask=None):
    kw = {"scale": scale} if mask is None else {"scale": scale, "attn_mask": mask}
    got = rk.backward(OP, g, q, k, v, **kw)
    want = _truth(q, k, v, g, scale, mask)
    if want is None:  # a value at a rounding boundary but for e**-(a few 1e4): mpmath to 2**16 bits (e**-45000)
        want = _truth(q, k, v, g, scale, mask, 1 << 16)
    names = ("query", "key", "value") + (("attn_mask",) if mask is not None else ())
    for n in names:
        assert _bits(got[n].double().reshape(want[n].shape)) == _bits(want[n]), n
    return got


@pytest.mark.parametrize(("dtype", "gap"), ((torch.bfloat16, 1e5), (torch.float32, 1e5), (torch.float32, 1e6)),
                         ids=("bfloat16-1e5", "float32-1e5", "float32-1e6"))  # fmt: skip
def test_logits_far_apart_bit_identical_to_mpmath(gap, dtype):
    """Row 0's logits: 0, gap + 0.5, 2.5; row 1's: 0, gap / 4 - 1, -2.75 (scale 1). Every dq and dk element and the
    dv of the two lower keys are nonzero reals of size e**-(gap / 4) or below, far under every subnormal: zeros
    whose sign is the sum's (the fixed-point widths stopped at 2**16 bits with a RuntimeError beyond gap 45,000).
    The top key's dv is ``dO_0 + dO_1`` less about e**-(gap / 4): in bfloat16 that sum is a midpoint (the rest's
    sign decides), for which mpmath takes 2**16 bits (so the bfloat16 case stops at 1e5)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.tensor([[[1.0, 0.5], [0.25, -1.0]]]).to(dtype)
    k = torch.tensor([[[0.0, 0.0], [gap, 1.0], [1.0, 3.0]]]).to(dtype)
    v = torch.randn(1, 3, 2, generator=gen).to(dtype)
    g = torch.randn(1, 2, 2, generator=gen).to(dtype)
    got = _check(q, k, v, g, 1.0)
    assert (got["query"] == 0).all() and torch.signbit(got["query"]).any() and not torch.signbit(got["query"]).all()


def test_a_mask_of_float32s_lowest_value_bit_identical_to_mpmath():
    """A key column masked by ``torch.finfo(float32).min`` in every row (Hugging Face's masks): its dv is of size
    e**-3.4e38 in every row, a zero of the sign of ``sum_i e**(a_i0 - max) dO_i``, whose terms differ by O(1)
    factors (the factor e**-3.4e38 is known only to a factor 4: its sign decides); its dmask elements likewise.
    This raised after 267 s."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, 2, generator=gen) for n in (3, 4, 4))
    g = torch.randn(1, 3, 2, generator=gen)
    m = torch.zeros(3, 4)
    m[:, 0] = torch.finfo(torch.float32).min
    got = _check(q, k, v, g, 1.0 / math.sqrt(2.0), m)
    assert (got["value"][0, 0] == 0).all() and torch.signbit(got["value"][0, 0]).any()


@pytest.mark.slow
def test_logits_far_apart_bit_identical_to_refkern_truth():
    """The same first case against refkern.truth.backward (its own Ziv loop on P (dP - Delta), up to 2**20 bits:
    about 70 s at gap 1e5)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.tensor([[[1.0, 0.5], [0.25, -1.0]]])
    k = torch.tensor([[[0.0, 0.0], [1e5, 1.0], [1.0, 3.0]]])
    v, g = torch.randn(1, 3, 2, generator=gen), torch.randn(1, 2, 2, generator=gen)
    got, want = rk.backward(OP, g, q, k, v, scale=1.0), rk.truth.backward(OP, g, q, k, v, scale=1.0)
    for n in ("query", "key", "value"):
        assert _bits(got[n].double()) == _bits(want[n].double()), n


class _Term:
    """A stand-in row for :func:`~refkern.kernels._exact_attention._scaled`: its one term is ``0 + e**(bn 2**ae) Y``."""

    def __init__(self, bn, ae, Y):
        self.ae, self._got = ae, (Fraction(0), bn, Y)

    def scaled(self, j, kind, K):
        return self._got


@pytest.mark.parametrize("b", (-1e5, -1e40), ids=("e-1e5", "e-1e40"))
def test_a_tiny_part_decides_by_its_sign(b):
    """x0 + d with |d| = e**b (b = -1e5: to K bits; -1e40: to a factor 4, exp_far) rounds as x0 + sign(d) 0+: a
    float32 midpoint (1 + 2**-24) goes up or down with d's sign, a float32 value (1) stays, and 0 is a zero of d's
    sign (the real is nonzero: -0.0 for d < 0)."""
    f32 = FORMATS["float32"]
    n, e = Fraction(b).numerator, 0
    mid, one = Fraction(1) + Fraction(1, 1 << 24), Fraction(1)
    for sign in (1, -1):
        term = [(_Term(n, e, (sign, sign, 0)), 0, "P", Fraction(1))]
        assert xa._scaled(mid, term, Fraction(1), f32, 6144) == (1.0 + 2.0**-23 if sign > 0 else 1.0)
        assert xa._scaled(one, term, Fraction(1), f32, 6144) == 1.0
        z = xa._scaled(Fraction(0), term, Fraction(1), f32, 6144)
        assert z == 0.0 and math.copysign(1.0, z) == sign
    # the interval of d straddles 0 (a sign not yet known): undecided
    assert xa._scaled(Fraction(0), [(_Term(n, e, (-1, 1, 0)), 0, "P", Fraction(1))], Fraction(1), f32, 6144) is None


def test_constants_pinned():
    """The first width of the scaled evaluation (4 _W0 bits, after the tests of rationality within rows: the
    fixed-point widths below it are the cheaper first tries), ln 2's bound in _dv_exp's cut-off, and exp_far's
    bracket (within a factor 4, around e**d by mpmath)."""
    assert xa._SCALED_W == pytest.approx(384, abs=0)
    assert math.log(2.0) < 0.6932 and 0.6932 == pytest.approx(6932 / 10000, abs=0)
    assert xrow._dv_exp(-8873, 0, 12800) == (0, 1, -12800)  # -8873 < -0.6932 * 12800 = -8872.96: below 2**-12800
    lo, hi, sh = xrow._dv_exp(-8872, 0, 12800)  # above the cut-off: to K bits
    with mpmath.workprec(13000):
        x = mpmath.exp(-8872)
        assert 0 < lo and mpmath.ldexp(lo, sh) <= x <= mpmath.ldexp(hi, sh) and (hi - lo) << 12000 < lo
    for n in (-3 * 10**6, -(10**40), -(2**70) - 1):
        lo, hi, sh = xrow.exp_far(n, 0)
        assert lo == 1 and hi in (1, 2, 4)
        with mpmath.workprec(300):
            l2 = mpmath.mpf(n) / mpmath.log(2)  # log2(e**n)
            assert sh <= l2 <= sh + math.log2(hi)
