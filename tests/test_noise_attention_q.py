"""attention's q-rounding term (``noise_attention._shared_q``): ``sum_l q_l**2 C_cl**2``, ``C_cl = sum_j w_j (v_jc -
o_c) k_jl``, against the definition evaluated independently (float64, one row at a time, no centring, no GEMM over
the outer products), within the float32 GEMM's own bound; by hand on a small case; with zero weights (a causal
mask: the rows' key ranges are cut) and with the outer products in several chunks."""

import numpy as np
import pytest

from refkern.analysis import noise_attention as nz_att

U32 = 2.0**-24


def _truth(w, v, k, q):
    """(value, |C|, A): the term by its definition per row in float64, |C| (L, Ev, E), and ``A_cl = sum_j w_j
    |v_jc - vbar_c| |k_jl|`` (vbar the mean of v over the keys: the code's float32 operand), which bounds the float32
    GEMM's error."""
    L, Ev, E = w.shape[0], v.shape[1], k.shape[1]
    out, Cabs, A = np.empty((L, Ev)), np.empty((L, Ev, E)), np.empty((L, Ev, E))
    vc = np.abs(v - v.mean(axis=0))
    for i in range(L):
        C = np.einsum("j,jc,jl->cl", w[i], v - w[i] @ v, k)
        out[i], Cabs[i] = (C * C) @ (q[i] * q[i]), np.abs(C)
        A[i] = np.einsum("j,jc,jl->cl", w[i], vc, np.abs(k))
    return out, Cabs, A


def _check(w, v, k, q):
    """|computed - truth| <= sum_l q_l**2 (2 |C_l| d_l + d_l**2), ``d = gamma_(S + 3) A`` (float32: each of w,
    v - vbar, k rounded once, each product once, S - 1 additions in any order), plus 1e-12 relative for the
    float64 steps (the centring, ``o (w @ k)``, the squares' sum)."""
    S = w.shape[1]
    got = nz_att._shared_q(w, v, k, q, w @ v)
    want, Cabs, A = _truth(w, v, k, q)
    g = (S + 3) * U32 / (1 - (S + 3) * U32)
    d = g * A
    tol = np.einsum("il,icl->ic", q * q, 2 * Cabs * d + d * d) + 1e-12 * want + 1e-300
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)
    return got, want


def _weights(z):
    w = np.exp(z - z.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def test_by_hand():
    """w = (1/2, 1/2), v = (0, 2): o = 1; k = (1, 3), q = 2: C = (-1 + 3) / 2 = 1, term q**2 C**2 = 4 (exact in
    float32)."""
    w = np.array([[0.5, 0.5]])
    got = nz_att._shared_q(w, np.array([[0.0], [2.0]]), np.array([[1.0], [3.0]]), np.array([[2.0]]), np.array([[1.0]]))
    assert got.tolist() == [[4.0]]


@pytest.mark.parametrize("seed", [0, 1])
def test_random_rows_match_definition(seed):
    rng = np.random.default_rng(seed)
    L, S, E, Ev = 200, 70, 8, 5
    q, k = rng.standard_normal((L, E)), rng.standard_normal((S, E))
    v = rng.standard_normal((S, Ev)) + 100.0  # a mean far above the spread: the centring keeps C's digits
    _check(_weights(q @ k.T / np.sqrt(E)), v, k, q)


def test_causal_rows_cut_and_match():
    """A causal mask: rows 0..L-1 weigh keys 0..i; the row blocks multiply only their keys, and the result is the
    definition's."""
    rng = np.random.default_rng(2)
    L = S = 300
    E, Ev = 6, 4
    q, k, v = rng.standard_normal((L, E)), rng.standard_normal((S, E)), rng.standard_normal((S, Ev))
    z = q @ k.T
    z[np.triu_indices(L, 1)] = -np.inf
    _check(_weights(z), v, k, q)


def test_chunks_of_keys(monkeypatch):
    """The outer products in chunks of 7 keys (with a row range starting mid-chunk: a mask from key 10 in the
    first rows) give the definition's value."""
    monkeypatch.setattr(nz_att, "_Q_CHUNK", 7 * 5 * 3)
    rng = np.random.default_rng(3)
    L, S, E, Ev = 260, 40, 3, 5
    q, k, v = rng.standard_normal((L, E)), rng.standard_normal((S, E)), rng.standard_normal((S, Ev))
    z = q @ k.T
    z[:128, :10] = -np.inf
    z[128:, 33:] = -np.inf
    _check(_weights(z), v, k, q)
