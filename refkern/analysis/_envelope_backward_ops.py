"""The gradients' envelopes of softmax, log_softmax, the norms and the poolings, with the constants and
units every backward envelope shares (:mod:`refkern.analysis._envelope_backward`, whose docstring derives
them)."""


import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.analysis._envelope_softmax import EXP_ULPS

PRODUCT_ROUNDINGS = 3  #: softmax: g_i - D^, the product by y^_i, and the expanded form's second product


LOG_ROUNDINGS = 2  #: log_softmax: the product exp(l^_i) G^ and the difference g_i - t


SECOND_ORDER = 4  #: at most four roundings compound on one path: (1 + 4u) covers their products


F64_SUM = 2  #: float64 sums of the bound's own quantities: 2 (n + 2) 2**-53 of their magnitudes


EVAL_SLACK = 1.0 + 2.0**-40  #: the bound's own float64 evaluation


INPUT_ROUNDINGS = 8  #: norm grad_input: at most seven roundings compound on one term of torch's form, plus one


XHAT_ROUNDINGS = 3  #: norm xhat^: the products x rstd^ and mean^ rstd^ (or x - mean^ and the product), the difference


NORM_SECOND_ORDER = 8  #: norms: at most eight roundings compound on one path: (1 + 8 ua) covers their products


BLOCK_ROUNDINGS = 3  #: group_norm's raw block form beyond its sums: db mean^, ds - db mean^, the product by rstd^


POOL_TERM_ROUNDINGS = 2  #: an average's gradient term g / d: one division, or a reciprocal and a product


EVAL_INPUT_ROUNDINGS = 2  #: batch_norm eval grad_input: g invstd^ w, two products in either order


BATCH_INPUT_ROUNDINGS = 9  #: batch_norm grad_input: eight roundings compound on the (x - mean^) k term, plus one


def _gamma(k, u):
    return k * u / (1 - k * u) if k * u < 0.5 else np.inf


def _units(out: Format):
    """(u, u_m, eta_w, eta_h, u_o, eta_o) of a result format (module docstring)."""
    u = FLOAT64.u if out is FLOAT64 else FLOAT32.u
    work = FLOAT64 if out is FLOAT64 else FLOAT32
    half = out.prec < FLOAT32.prec
    u_m = out.u if half else 0.0
    eta_h = 2.0 ** (out.emin - out.prec) if half else 0.0
    return u, u_m, 2.0**work.emin, eta_h, out.u, 2.0 ** (out.emin - out.prec)


def bound(op: str, x: np.ndarray, g: np.ndarray, ref: np.ndarray, out: Format) -> np.ndarray:
    """The envelope of each element of the gradient of ``op`` ("softmax" or "log_softmax") along the
    last axis of the float64 (R, n) arrays ``x`` (logits) and ``g`` (grad_output), around ``ref``
    (the correctly rounded gradient, float64 (R, n)), for results in ``out`` (module docstring).
    Rows whose forward or ``g`` is not finite get 0 (the reference is NaN there: only NaN fits)."""
    from refkern import ops
    from refkern.analysis.envelope import envelopes

    log = op == "log_softmax"
    R, n = x.shape
    u, u_m, eta_w, eta_h, u_o, eta_o = _units(out)
    with np.errstate(all="ignore"):
        y = np.asarray(ops.get("softmax").reference(x, -1), np.float64)  # the exact softmax, rounded to float64
        y = np.where(np.isnan(y), 0.0, y)
        fwd = ops.get("log_softmax" if log else "softmax").reference(x, -1)
        fwd_out = np.asarray(fwd, np.float64)
        from refkern.accumulate.formats import round_array

        ref_f = round_array(np.ascontiguousarray(fwd_out), *out.params) if out is not FLOAT64 else fwd_out
        hyps, _ = envelopes(op, {"input": x.astype(np.float32) if out is not FLOAT64 else x, "dim": -1,
                                 "dtype": None}, ref_f, out)  # fmt: skip
        b_f = np.asarray(hyps[0][3], np.float64)
        b_f = np.where(np.isnan(b_f), 0.0, b_f)
        finite = np.isfinite(x)
        sum_slack = F64_SUM * (n + 2) * 2.0**-53
        if log:
            lam = b_f + u_o * np.abs(fwd_out) + eta_o + 2.0**-52 * np.abs(fwd_out) + 2.0**-1074
            eta = np.where(finite, y * (np.expm1(lam) + EXP_ULPS * u * np.exp(lam)) + eta_w, 0.0)
            eta = np.where(finite & np.isnan(eta), np.inf, eta)
            eta = eta + np.where(finite, 2.0**-52 * y + 2.0**-1074, 0.0)
            G = g.sum(axis=1, keepdims=True)
            AG = np.abs(g).sum(axis=1, keepdims=True)
            e_G = _gamma(n - 1, u) * AG + sum_slack * AG
            e_G = (e_G + u_m * np.abs(G) + eta_h) / (1 - u_m)
            Y = y + eta
            E = eta * (np.abs(G) + e_G) + y * e_G + LOG_ROUNDINGS * u * (np.abs(g) + Y * (np.abs(G) + e_G)) + eta_w
            dx = g - y * G
        else:
            eta = np.where(finite, b_f + u_o * y + eta_o + 2.0**-52 * y + 2.0**-1074, 0.0)
            D = (g * y).sum(axis=1, keepdims=True)
            A1 = np.abs(g * y).sum(axis=1, keepdims=True)
            Ge = (np.abs(g) * eta).sum(axis=1, keepdims=True)
            e_D = Ge + _gamma(n, u) * (A1 + Ge) + n * eta_w + sum_slack * (A1 + Ge)
            e_D = (e_D + u_m * np.abs(D) + eta_h) / (1 - u_m)
            H = np.abs(g - D) + e_D
            Y = y + eta
            inner = e_D + PRODUCT_ROUNDINGS * u * (np.abs(g) + np.abs(D) + e_D) + u_m * H + eta_h
            E = eta * H + Y * inner + 2.0 * eta_w
            dx = y * (g - D)
        B = E * (1 + SECOND_ORDER * u) + u_o * (2.0 * np.abs(dx) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        bad = ~np.isfinite(ref) | ~np.isfinite(g).all(axis=1, keepdims=True)
        return np.where(bad, 0.0, B)


def norm_bound(op: str, name: str, X: np.ndarray, G: np.ndarray, W, eps: float, ref: np.ndarray,
               fmts: dict, *, regroup=None, block: int = 1, input_roundings: int = INPUT_ROUNDINGS,
               stored_sums: bool = False, half_sums: bool = True, half_steps: bool = False) -> np.ndarray:  # fmt: skip
    """The envelope (module docstring, layer_norm and rms_norm; group_norm and batch_norm in training
    with the keywords below) of the gradient ``name`` ("input", "weight", "bias") of ``op`` over the
    rows of the float64 (R, n) arrays X and G, weight W (n,), (R, n) (a weight per element) or None,
    around ``ref`` (the correctly rounded gradient: (R, n) for input, (C,) otherwise), for results in
    ``fmts[name]``; the working precision follows the input's format ``fmts["input"]``.

    ``regroup`` maps an (R, n) array to (T, C): column c holds the T terms of parameter element c
    (None: the columns of X). ``block``: the parameter sums may be formed per block of that many terms
    of one row in the raw form ``(sum g x - mean^ sum g) rstd^`` (group_norm's ds, db per (sample,
    channel): :data:`GROUP_NORM` below); ``input_roundings``: the roundings that compound on one term of
    grad_input; ``stored_sums``: the per-channel sums behind grad_input are stored once in the half
    input format (one ``u_m`` more on e_S and e_C); ``half_sums``: grad_weight's and grad_bias's sums may
    round every addition to the half result format (``uc = ua + u_m`` each, layer_norm's step 4), else
    they run in the working precision (``ua`` each) and only their stored parts and result are rounded
    to the half format: ``u_m`` once on each term's block (ds and db) and once on the result (group_norm,
    batch_norm: torch's CPU kernels accumulate them in opmath); ``half_steps``: each of grad_input's
    ``input_roundings`` may round to the half input format (``ua + u_m`` each, and its underflow ``eta_m``:
    torch's generic batch_norm backward, which serves non-contiguous inputs, computes k = dotp rstd^2 / n,
    grad_mean = sum g / n and every operation of ``(g - grad_mean - (x - mean) k) rstd w`` in scalar_t)."""
    from refkern.analysis.envelope import _gamma, _underflow

    fin = fmts["input"]
    out = fmts[name]
    R, n = X.shape
    u = FLOAT64.u if fin is FLOAT64 else FLOAT32.u
    u_m = fin.u if fin.prec < FLOAT32.prec else 0.0
    ua = u  # the backward's own operations are in the working format (module docstring)
    eta_w = 2.0 ** (FLOAT64 if fin is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    center = op != "rms_norm"
    w = np.ones(n) if W is None else np.asarray(W, np.float64)
    if w.ndim == 2:  # (P, n): row r uses w[r % P]
        w = w[np.arange(R) % w.shape[0]]
    with np.errstate(all="ignore"):
        mu = X.mean(axis=1, keepdims=True) if center else np.zeros((R, 1))
        d = X - mu
        m2 = (d * d).sum(axis=1, keepdims=True)
        q = (X * X).sum(axis=1, keepdims=True)
        A = np.abs(X).mean(axis=1, keepdims=True)
        g_n = _gamma(n, ua)[()]
        dmu = (g_n * A + u_m * np.abs(mu)) if center else np.zeros((R, 1))
        e_m2 = _gamma(n + 3, ua)[()] * np.sqrt(q) * np.sqrt(m2) + n * (g_n * A) ** 2 + _underflow(n, u)
        var = m2 / n
        e_v = e_m2 / n + ua * var
        z = var + eps
        e_w = e_v + ua * z
        r = 1.0 / np.sqrt(z)
        s_lo, s_hi = np.sqrt(np.maximum(z - e_w, 0.0)), np.sqrt(z + e_w)
        e_r = np.maximum(1.0 / s_lo - r, r - 1.0 / s_hi) + (2.0 * u + u_m) * r
        R1 = r + e_r
        D = np.abs(d) + dmu
        xm = np.abs(X) + np.abs(mu) + dmu  # the uncentred forms' magnitude
        if name == "input":
            ui, eta_i = (ua + u_m, eta_w + 2.0 ** (fin.emin - fin.prec)) if half_steps else (ua, eta_w)
            gw = G * w
            S = gw.sum(axis=1, keepdims=True)
            Sa = np.abs(gw).sum(axis=1, keepdims=True)
            e_S = g_n * Sa + (u_m * Sa if stored_sums else 0.0)
            Ad = S / n if center else np.zeros((R, 1))
            e_A = e_S / n if center else np.zeros((R, 1))
            Cn = (gw * d).sum(axis=1, keepdims=True)
            e_C = _gamma(n + 2, ua)[()] * ((np.abs(gw) * np.abs(X)).sum(axis=1, keepdims=True) + np.abs(mu) * Sa)
            e_C = e_C + n * 2.0**-52 * (np.abs(gw) * np.abs(d)).sum(axis=1, keepdims=True)  # Cn's float64 sum
            if stored_sums:  # ds and db stored once in the half format: u_m of their magnitudes
                e_C = e_C + u_m * ((np.abs(gw) * np.abs(X)).sum(axis=1, keepdims=True) + np.abs(mu) * Sa)
            Cm = np.abs(Cn) + e_C + dmu * np.abs(S)
            Am = np.abs(Ad) + e_A
            E = (e_r * (np.abs(gw) + Am) + R1 * e_A
                 + (3.0 * e_r * R1**2 * D * Cm + r**3 * dmu * Cm + r**3 * np.abs(d) * (e_C + dmu * np.abs(S))) / n
                 + input_roundings * ui * (R1 * (np.abs(gw) + Am) + R1**3 * xm * Cm / n)
                 + (n * eta_w + input_roundings * eta_i) * (R1 + R1**3 * xm))  # fmt: skip
            if u_m and op in ("layer_norm", "rms_norm"):  # gw_k rounded to the half input format (HF RMSNorm)
                E = E + u_m * (R1 * (np.abs(gw) + (Sa / n if center else 0.0))
                               + R1**3 * D * (np.abs(gw) * D).sum(axis=1, keepdims=True) / n)  # fmt: skip
            refm = np.abs(ref).reshape(R, n)
            bad = ~(np.isfinite(X).all(axis=1, keepdims=True) & np.isfinite(G).all(axis=1, keepdims=True))
            bad = bad & np.ones((1, n), bool)
        else:
            rg = (lambda a: a) if regroup is None else regroup
            T = rg(np.zeros((R, n))).shape[0]  # terms per parameter element
            if name == "weight":
                xh = np.abs(d) * r
                if block == 1:
                    e_xh = e_r * D + r * dmu + XHAT_ROUNDINGS * ua * R1 * xm
                else:  # the raw block form: ds, db, db mean^, their difference, the product by rstd^; ds, db stored
                    e_xh = e_r * D + r * dmu + (_gamma(block + BLOCK_ROUNDINGS, ua)[()] + u_m) * R1 * xm
                ag = np.abs(G)
                g_T = _gamma(T, u + u_m)[()] if half_sums else _gamma(T, ua)[()] + u_m
                E = (rg(ag * e_xh).sum(axis=0) + g_T * rg(ag * (xh + e_xh)).sum(axis=0)
                     + (T if block == 1 else 2 * T) * eta_w)  # fmt: skip
            else:
                g_T = _gamma(max(T - 1, 0), u + u_m)[()] if half_sums else _gamma(max(T - 1, 0), ua)[()] + u_m
                E = g_T * rg(np.abs(G)).sum(axis=0)
            refm = np.abs(ref).reshape(-1)
            ok = np.isfinite(X) & np.isfinite(G)
            bad = ~rg(ok).all(axis=0) | ~np.isfinite(refm)
        B = E * (1.0 + NORM_SECOND_ORDER * ua) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(bad | ~np.isfinite(refm), 0.0, B)


def batch_norm_eval_bound(name: str, X: np.ndarray, G: np.ndarray, W, RM, RV, eps: float, ref: np.ndarray,
                          fmts: dict) -> np.ndarray:  # fmt: skip
    """The envelope of the gradient ``name`` of batch_norm in eval mode (the running statistics given:
    an affine map per channel) over the channels as rows of the float64 (C, K) arrays X and G, W (C, K)
    or None, RM and RV (C,), around ``ref`` ((C, K) for input, (C,) otherwise), for results in
    ``fmts[name]``; the working precision ``ua`` follows the input's format (module docstring's
    conventions: ``u_m`` the half input format's unit, ``eta_w`` the working format's smallest normal).

    What a correct backward computes (torch's CPU kernel: ``invstd = 1 / sqrt(rv + eps)``, ``dx = dy
    invstd w``, ``grad_weight = invstd sum (x - rm) dy``, ``grad_bias = sum dy``, in opmath), with
    ``z = rv + eps``, ``r = z**(-1/2)``, ``d = x - rm``:

    1. ``invstd^``: z rounded twice (eps converted to the working format, then the addition): within
       ``e_z = ua (eps + |z|) (1 + ua)``; ``1/sqrt`` on ``[z - e_z, z + e_z]`` moves by at most ``e_z / (2
       (z - e_z)**1.5)`` (the mean value theorem: ``|d z**-1/2 / dz| = z**-1.5 / 2``, largest at the lower
       end; infinite when ``e_z >= z``), then the square root and the division (or an rsqrt within 2 ua)
       and a store in the half format: ``e_r = e_z / (2 (z - e_z)**1.5) + (2 ua + u_m) R1``, ``R1 = r (1 +
       2 ua + u_m) + e_z / (2 (z - e_z)**1.5)`` (r's magnitude inflated by the same errors).
    2. grad_input: ``E = |g w| (e_r + EVAL_INPUT_ROUNDINGS ua R1) + EVAL_INPUT_ROUNDINGS eta_w``,
       EVAL_INPUT_ROUNDINGS = 2 (the two products, in either order).
    3. grad_weight: each term rounds ``x - rm``, the product by g, (or by invstd first), the K - 1
       additions and the final product by invstd: K + 2 roundings on one path in the working precision
       (torch's CPU kernel accumulates ``dotp`` in opmath), and one store of a partial sum in a half
       format (``u_m``): ``E = e_r sum|g d| + (gamma_{K+2}(ua) + u_m) R1 sum|g d| + 2 K eta_w`` (two
       products per term may underflow).
    4. grad_bias: ``E = (gamma_{K-1}(ua) + u_m) sum|g|``.
    5. The store and the centre as the norms' step 6, with NORM_SECOND_ORDER and EVAL_SLACK: every
       quantity above is formed in float64 without cancellation (``d`` and ``z`` within 2**-53 of their
       magnitudes), so a few units of 2**-53 relative cover its own evaluation. Channels with a NaN or an
       infinity, or ``z <= 0``, get 0 (the reference follows IEEE arithmetic there)."""
    from refkern.analysis.envelope import _gamma

    fin = fmts["input"]
    out = fmts[name]
    C, K = X.shape
    ua = FLOAT64.u if fin is FLOAT64 else FLOAT32.u
    u_m = fin.u if fin.prec < FLOAT32.prec else 0.0
    eta_w = 2.0 ** (FLOAT64 if fin is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    w = np.ones((C, K)) if W is None else np.asarray(W, np.float64)
    with np.errstate(all="ignore"):
        z = (np.asarray(RV, np.float64) + eps)[:, None]
        e_z = ua * (eps + np.abs(z)) * (1.0 + ua)
        lo = z - e_z
        move = np.where(lo > 0, e_z / (2.0 * lo**1.5), np.inf)
        r = 1.0 / np.sqrt(z)
        R1 = r * (1.0 + 2.0 * ua + u_m) + move
        e_r = move + (2.0 * ua + u_m) * R1
        if name == "input":
            gw = np.abs(G * w)
            E = gw * (e_r + EVAL_INPUT_ROUNDINGS * ua * R1) + EVAL_INPUT_ROUNDINGS * eta_w
            refm = np.abs(ref).reshape(C, K)
            ok = np.isfinite(X).all(axis=1) & np.isfinite(G).all(axis=1) & np.isfinite(w).all(axis=1)
            bad = ~(ok[:, None] & (z > 0) & np.isfinite(np.asarray(RM, np.float64))[:, None]) | np.zeros((1, K), bool)
        else:
            if name == "weight":
                gd = (np.abs(G) * np.abs(X - np.asarray(RM, np.float64)[:, None])).sum(axis=1, keepdims=True)
                E = e_r * gd + (_gamma(K + 2, ua)[()] + u_m) * R1 * gd + 2 * K * eta_w
            else:
                E = (_gamma(max(K - 1, 0), ua)[()] + u_m) * np.abs(G).sum(axis=1, keepdims=True)
            E = E.reshape(C)
            refm = np.abs(ref).reshape(C)
            ok = np.isfinite(X).all(axis=1) & np.isfinite(G).all(axis=1)
            bad = ~(ok & (z.reshape(C) > 0) & np.isfinite(np.asarray(RM, np.float64)))
            if name == "bias":
                bad = ~np.isfinite(G).all(axis=1)
        B = E * (1.0 + NORM_SECOND_ORDER * ua) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(bad | ~np.isfinite(refm), 0.0, B)


def pool_bound(asum: np.ndarray, cnt: np.ndarray, ref: np.ndarray, out: Format, exact_terms: bool) -> np.ndarray:
    """The envelope of a pooling's grad_input around ``ref`` (its correctly rounded value), from each
    element's ``asum = sum|t|`` over its ``cnt = k`` terms (:mod:`refkern.kernels.pool_backward`), for
    results in ``out``; ``exact_terms``: a maximum's terms ``t = g`` (no rounding), else an average's
    ``t = g / d``.

    What a correct backward computes: every term, then their sum in any order, in the working precision
    ``ua`` (float32 for float16/bfloat16/float32 results, float64 for float64), each operation possibly
    also stored in a half result format (torch's CPU kernels add ``g / d`` into the gradient tensor
    itself: ``uc = ua + u_m`` per operation, ``u_m`` the half format's unit, 0 otherwise).

    1. An average: a term rounds at most POOL_TERM_ROUNDINGS = 2 times (``g / d``, or ``1 / d`` then the
       product), and the k - 1 additions once each: at most k + 1 roundings on one path, ``E =
       gamma_{k+1}(uc) asum + 2 k eta_w`` (``eta_w``: the working format's smallest normal, once per
       division or product that underflows; additions of subnormals are exact).
    2. A maximum: the terms are exact, ``E = gamma_{k-1}(uc) asum`` (no term rounds: one term gives 0).
    3. The store and the centre as the norms' step 6: ``|actual - ref| <= E (1 + F64_SUM (k + 2) 2**-53) +
       u_o (2 |ref| (1 + 2 u_o) + E) + 2 eta_o``, the first factor for asum's own float64 sum (the terms
       within 2**-53 each, k - 1 additions), then EVAL_SLACK. Elements whose reference is not finite
       get 0 (IEEE arithmetic there: only the same value fits)."""
    from refkern.analysis.envelope import _gamma

    ua = FLOAT64.u if out is FLOAT64 else FLOAT32.u
    u_m = out.u if out.prec < FLOAT32.prec else 0.0
    uc = ua + u_m
    eta_w = 2.0 ** (FLOAT64 if out is FLOAT64 else FLOAT32).emin
    u_o, eta_o = out.u, 2.0 ** (out.emin - out.prec)
    k = np.asarray(cnt, np.float64)
    with np.errstate(all="ignore"):
        if exact_terms:
            E = _gamma(np.maximum(k - 1, 0), uc) * asum
        else:
            E = _gamma(k + 1, uc) * asum + 2.0 * k * eta_w
        E = np.where(k == 0, 0.0, E)
        refm = np.abs(ref)
        B = E * (1.0 + F64_SUM * (k + 2) * 2.0**-53) + u_o * (2.0 * refm * (1.0 + 2.0 * u_o) + E) + 2.0 * eta_o
        B = B * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(~np.isfinite(ref), 0.0, B)


def converted_bound(b_c: np.ndarray, ref_c: np.ndarray, fmt_c: Format, fmt: Format) -> np.ndarray:
    """The envelope of a gradient computed in the format ``fmt_c`` (softmax's ``dtype=``) and converted to
    the input's format ``fmt`` (autograd's conversion back), around the reference rounded once to ``fmt``.

    ``b_c`` bounds ``|v - ref_c|`` for the backend's ``fmt_c`` result v around ``ref_c = RN_c(dx)``, and
    ``|ref_c - dx| <= u_c |dx| + eta_c``, so ``|v - dx| <= b_c + u_c |dx| + eta_c``; the conversion adds
    ``u |v| + eta`` (``u``, ``eta``: the unit and half the smallest subnormal of fmt; 0 when it widens,
    which is exact, and the bound still holds), the reference ``RN(dx)`` is within ``u |dx| + eta``:
    ``|actual - ref| <= (b_c + u_c |dx| + eta_c) (1 + u) + 2 u |dx| + 2 eta``, with ``|dx| <= |ref_c| (1 +
    2 u_c) + 2 eta_c``; then EVAL_SLACK. Where ``b_c`` is 0 (no real value: IEEE rows), 0."""
    u_c, eta_c = fmt_c.u, 2.0 ** (fmt_c.emin - fmt_c.prec)
    u, eta = fmt.u, 2.0 ** (fmt.emin - fmt.prec)
    with np.errstate(all="ignore"):
        dx = np.abs(ref_c) * (1.0 + 2.0 * u_c) + 2.0 * eta_c
        B = ((b_c + u_c * dx + eta_c) * (1.0 + u) + 2.0 * u * dx + 2.0 * eta) * EVAL_SLACK
        B = np.where(np.isnan(B), np.inf, B)
        return np.where(b_c == 0, 0.0, B)
