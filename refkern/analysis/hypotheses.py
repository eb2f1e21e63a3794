"""The hypotheses the verdict weighs: each one a computation that can be run on the very inputs.

A :class:`Model` says how a backend computed the op: which inputs it rounded and how
(TF32 to nearest even, ties away as NVIDIA's ``cvt.rna.tf32.f32`` does, or by truncation;
bf16/fp16 casts, the bias with them under autocast), in which format it accumulated and in
which order, whether it rounded the product sum to the result format before adding the bias
(torch's ``matmul`` then ``add_`` for fp16/bf16 linear), and in which format it stored the
result before handing it over (autocast's bf16 output cast back to fp32; an fp32 computation
behind a float64 result). Its **centre** ``c`` is what that computation gives, computed exactly
on these inputs; its **scale** ``sigma`` is the sub-Gaussian parameter of what remains unknown
(:mod:`refkern.analysis.stats`), per element:

* models that fix the inputs and the formats but not the order (``order=None``): the order
  of accumulation is unknown, so with ``M_H = sum|terms|`` of the model's own terms and
  ``u_a`` the accumulation unit::

      sigma**2 = ((1 + gamma_n) u_a)**2 (n + 1) M_H**2 + 2 (u_s c)**2 + 2 eta_s**2 + (n + 1) eta_a**2

  (n - 1 partial sums, the products' roundings with sum of squares <= M_H**2, one rounding of
  the product sum before an epilogue bias, the backend's store and the reference's rounding to
  the storage format of unit u_s; eta_f = 2**(emin_f - prec_f) bounds each rounding's absolute
  error in the subnormal range). The epilogue model adds 2 (u_s p)**2 + 2 eta_s**2 for the
  rounding of the product sum p = c - bias.
* accumulator models (``order`` left-to-right or pairwise): the centre is that order run in the
  narrow format, and the backend's own order differs from it by two such errors, each at most
  ``u_a S`` with ``S**2 = sum_k s_k**2 + sum_k t_k**2`` taken along the left-to-right order,
  the noisiest of the orders backends use on data without structure (pairwise and blocked
  sums have smaller partial sums)::

      sigma**2 = 2 ((1 + gamma_n) u_a S)**2 + 2 (u_s c)**2 + 2 eta_s**2 + 2 (n + 1) eta_a**2.

  They are sharp where an order-free fp16 bound (``sqrt(n) u M``, 20x wider at K = 288 on
  random data) would explain a dropped bias.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, TFLOAT32, Format, round_array
from refkern.analysis.evaluate import Problem, sample_run
from refkern.analysis.stats import level
from refkern.analysis.tensor_cores import drift, fit_drift
from refkern.engines.filter import threads_for
from refkern.kernels._element import ENERGY, EXACT, NAIVE, PAIRWISE

__all__ = ["Model", "models", "centre", "centre_sample", "rounding_variance"]

NEAREST, TRUNCATE, AWAY = 0, 1, 2
_MODE = {NEAREST: "round to nearest", TRUNCATE: "truncated", AWAY: "round to nearest, ties away"}
_ORDER = {NAIVE: "left-to-right", PAIRWISE: "pairwise"}


@dataclass(frozen=True)
class Model:
    key: str  # unique name in the report
    precision: str | None  # None: the rounding of a correct implementation; else "tf32", "fp16", "bf16", "fp32"
    kind: str  # one line for the report
    storage: Format  # the format the backend stores its result in
    acc: Format  # the accumulation format
    inputs: tuple | None = None  # (Format, mode, round_bias): inputs rounded first
    order: int | None = None  # None: any order; NAIVE / PAIRWISE: the centre is that order in ``acc``
    epilogue: bool = False  # the product sum is rounded to ``storage`` before the bias is added
    taps: bool = False  # per-tap sums added tap after tap into an accumulator in ``storage``
    tap_store: bool = True  # with taps: each tap's sum is rounded to ``storage`` before it is added (col2im)
    tap_running: bool = True  # with taps: the running sum is held in ``storage`` (else summed in fp32, rounded once)
    product: Format | None = None  # the product sum stored in this format, then a bias added in ``storage``
    rz: bool = False  # the accumulator rounds toward zero (NVIDIA tensor cores): a drift fitted (tensor_cores)

    @property
    def rounding(self) -> bool:
        return self.precision is None


def _eta(f: Format) -> float:
    return 2.0 ** (f.emin - f.prec)


def _gamma(n: int, u: float) -> float:
    return n * u / (1.0 - n * u) if n * u < 0.5 else 1.0


def models(out: Format, in_prec: int, has_bias: bool, op: str = "") -> list:
    """Every model worth weighing for a result of format ``out`` from inputs of precision ``in_prec``:
    the rounding family first, then the reduced precisions a backend can produce."""
    acc = FLOAT64 if out is FLOAT64 else FLOAT32
    ms = [Model("rounding", None, f"{acc.short} accumulation, any order", out, acc)]
    if has_bias and out.prec < FLOAT32.prec:
        ms.append(Model("rounding (product rounded before the bias)", None,
                        f"fp32 accumulation, product rounded to {out.short}, bias added after", out, FLOAT32,
                        epilogue=True))  # fmt: skip
    if op.startswith("conv_transpose") and out.prec < FLOAT32.prec:
        ms.append(Model("rounding (per-tap sums in the result format)", None,
                        f"fp32 sum over channels per tap rounded to {out.short}, taps and bias added in "
                        f"{out.short} (torch's CPU col2im)", out, FLOAT32, taps=True))  # fmt: skip
        ms.append(Model("rounding (per-tap sums added into the result format)", None,
                        f"fp32 sum over channels per tap added, tap after tap, into a {out.short} accumulator "
                        f"(torch's CPU half GEMMs accumulating with beta = 1: a half grad_weight, image after image)",
                        out, FLOAT32, taps=True, tap_store=False))  # fmt: skip
        ms.append(Model("rounding (per-tap sums in the result format, added in fp32)", None,
                        f"fp32 sum over channels per tap rounded to {out.short}, the taps summed in fp32 and rounded "
                        f"once (torch's sum over a broadcast batch of per-element {out.short} gradients)", out,
                        FLOAT32, taps=True, tap_running=False))  # fmt: skip
    if out.prec <= FLOAT32.prec:
        if out is FLOAT32 and in_prec > TFLOAT32.prec:
            for mode, tag in ((NEAREST, ""), (AWAY, ", ties away"), (TRUNCATE, ", truncated")):
                ms.append(Model(f"tf32{tag}", "tf32", f"tf32 inputs ({_MODE[mode]}), fp32 accumulation", out,
                                FLOAT32, (TFLOAT32, mode, False)))  # fmt: skip
            for mode, tag in ((NEAREST, ""), (TRUNCATE, ", truncated")):  # ties away: nearest's drift alike
                ms.append(Model(f"tf32 tensor cores{tag}", "tf32", f"tf32 inputs ({_MODE[mode]}), fp32 tensor-core "
                                "accumulation (rounded toward zero, NVIDIA)", out, FLOAT32, (TFLOAT32, mode, False),
                                rz=True))  # fmt: skip
        for f, modes in ((FLOAT16, (NEAREST,)), (BFLOAT16, (NEAREST, TRUNCATE))):
            if in_prec <= f.prec:
                continue  # the inputs are already this coarse: rounding them changes nothing
            for mode in modes:
                tag = ", truncated" if mode == TRUNCATE else ""
                kind = f"{f.short} inputs ({_MODE[mode]}), fp32 accumulation"
                ms.append(Model(f"{f.short} inputs{tag}", f.short, kind, out, FLOAT32, (f, mode, False)))
            if has_bias:  # autocast, or a custom kernel: the bias is cast too (into any result format)
                ms.append(Model(f"{f.short} inputs and bias", f.short,
                                f"{f.short} inputs and bias, fp32 accumulation", out, FLOAT32, (f, NEAREST, True)))
        if out is FLOAT32 and has_bias:  # autocast's matmul in f, then the fp32 bias added (pytorch#137080)
            for f in (FLOAT16, BFLOAT16):
                if in_prec > f.prec:
                    ms.append(Model(f"{f.short} autocast product, fp32 bias", f.short,
                                    f"autocast: {f.short} inputs, fp32 accumulation, the product stored in {f.short}, "
                                    "the fp32 bias added after", out, FLOAT32, (f, NEAREST, False),
                                    product=f))  # fmt: skip
        if out is FLOAT32:
            for f in (FLOAT16, BFLOAT16):
                ms.append(Model(f"{f.short} autocast", f.short,
                                f"autocast: {f.short} inputs and bias, fp32 accumulation, {f.short} output", f,
                                FLOAT32, (f, NEAREST, True)))  # fmt: skip
    if out is FLOAT64:
        ms.append(Model("fp32 computation", "fp32", "computed in fp32 (inputs, accumulation and output)", FLOAT32,
                        FLOAT32, (FLOAT32, NEAREST, True)))  # fmt: skip
    for f in (FLOAT16, BFLOAT16) + ((FLOAT32,) if out is FLOAT64 else ()):
        for order in (NAIVE, PAIRWISE):
            ms.append(Model(f"{f.short} accumulation ({_ORDER[order]})", f.short,
                            f"{f.short} accumulation, {_ORDER[order]}", out if out.prec <= f.prec else f, f,
                            order=order))  # fmt: skip
    return ms


def rounding_variance(m: Model, n: int, mag, c, p=None, order=None):
    """sigma**2 of a model that fixes everything but the order (module docstring). ``order``: the order term
    ``sum_j c_j**2`` of the exact terms (:mod:`refkern.analysis.partials`), used in place of ``(n + 1) mag**2``
    where smaller. For a model whose inputs are rounded (unit ``u_i``) each term moves by at most ``2 u_i |t|``
    (with its own rounding error), so each partial sum by at most ``2 u_i mag``: by Minkowski's inequality its
    square root grows to ``sqrt(order) (1 + 2 u_i) + 2 u_i mag sqrt(2 n)`` (at most ``2 n`` partial sums and
    products, blocks included)."""
    ua, us = m.acc.u * (1.0 + _gamma(n, m.acc.u)), m.storage.u
    free = (n + 1) * mag * mag
    if order is not None:
        ui = m.inputs[0].u if m.inputs else 0.0
        free = np.minimum(free, (np.sqrt(order) * (1.0 + 2.0 * ui) + 2.0 * ui * mag * np.sqrt(2.0 * n)) ** 2)
    var = ua * ua * free + 2.0 * (us * c) ** 2 + 2.0 * _eta(m.storage) ** 2 + (n + 1) * _eta(m.acc) ** 2
    if m.epilogue:
        var = var + 2.0 * (us * p) ** 2 + 2.0 * _eta(m.storage) ** 2
    return var


def _order_variance(m: Model, n: int, s, c):
    ua, us = m.acc.u * (1.0 + _gamma(n, m.acc.u)), m.storage.u
    return 2.0 * (ua * s) ** 2 + 2.0 * (us * c) ** 2 + 2.0 * _eta(m.storage) ** 2 + 2.0 * (n + 1) * _eta(m.acc) ** 2


def _store(v, m: Model):
    """The accumulated value stored in the model's storage format (exact when it already fits)."""
    return round_array(v, *m.storage.params) if m.storage.prec < m.acc.prec and m.order is not None else v


def _tapped(terms, n_taps, m: Model, n: int):
    """(c, var) of the per-tap models: per tap t, p_t = sum over channels of the products (float64, the
    exact sum within K 2**-53), s_t = fl(s_{t-1} + fl(p_t)) in the storage format (col2im: each tap's
    GEMM output is stored first) or s_t = fl(s_{t-1} + p_t) (``tap_store`` False: a GEMM adding its fp32
    result into a half accumulator, beta = 1) or s = fl(sum_t fl(p_t)) (``tap_running`` False: the stored
    taps summed in fp32, whose error the products' sigma_0 covers, rounded once), c = fl(s + bias). Scale:
    sigma_0 of the products (whose store term is c's rounding) plus, for every other rounding to storage,
    2 (u_s |value|)**2 (the backend's fp32 channel sums may round a tap, or a running sum, to the
    neighbouring value): p_t's with ``tap_store``; every s_t with ``tap_running`` (the last counted again
    when it is c: conservative), else s before a bias."""
    L, R, b, hb = terms
    T = (L * R).reshape(L.shape[0], -1, n_taps)
    p = T.sum(axis=1)
    if m.tap_store:
        p = round_array(p, *m.storage.params)
    extra = (p**2).sum(axis=1) if m.tap_store else np.zeros(L.shape[0])
    if m.tap_running:
        s = np.zeros(L.shape[0])
        for t in range(n_taps):
            s = round_array(s + p[:, t], *m.storage.params)
            extra += s**2
    else:  # the taps' fp32 sum, rounded once (and once more after a bias: one more term)
        s = round_array(p.sum(axis=1), *m.storage.params)
        extra += s**2 if hb else 0.0
    c = round_array(s + b, *m.storage.params) if hb else s
    mag = np.abs(T).sum(axis=(1, 2)) + np.abs(b)
    var = rounding_variance(m, n, mag, c) + 2.0 * (m.storage.u**2) * extra
    return c, var


def _taps(pr: Problem) -> int:
    """Taps per channel of a convolution's terms (1 for the products): the drift's second order."""
    return int(np.prod(pr.ops[0].W.shape[2:])) if pr.kind == "conv" else 1


def _n_taps(pr: Problem) -> int:
    w = pr.ops[0].weight
    return int(np.prod(w.shape[2:]))


def _product_then_bias(p, mag, b, m: Model, n: int, lam: float, order=None):
    """(c, var) of a model that stores the product sum in ``m.product`` and adds the bias in ``m.storage``:
    ``c = fl_s(fl_p(p) + b)`` from the product ``p`` (float64, within 2**-53 of the exact sum; ``mag`` the
    sum of its terms' magnitudes). The backend's own product carries its accumulation's rounding,
    ``sigma_a = (1 + gamma_n) u_a sqrt(n + 1) mag``; where ``p`` lies within ``lam sigma_a`` (plus the float64
    slack ``2**-52 |p|``) of a midpoint of ``m.product``'s grid, the backend may store the neighbouring value
    instead: there, and only there, the scale widens by one ulp of that grid (``2 ulp**2``: the straddle
    rule of the envelopes). Elsewhere the stored product is the centre's, exactly: the scale is the
    rounding model's, the bias's addition and the stores."""
    f = m.product
    with np.errstate(all="ignore"):
        q = round_array(np.ascontiguousarray(p, np.float64), *f.params)
        c = round_array(q + b, *m.storage.params)
        var = rounding_variance(m, n, mag + np.abs(b), c, order=order)
        _, e = np.frexp(np.where(np.isfinite(p), np.abs(p), 0.0))
        ulp = np.ldexp(1.0, np.maximum(e - 1, f.emin) - f.prec + 1)
        sig = m.acc.u * (1.0 + _gamma(n, m.acc.u)) * np.sqrt(n + 1.0) * mag
        near = ulp / 2 - np.abs(p - q) <= lam * sig + 2.0**-52 * np.abs(p)
        var = var + np.where(near, 2.0 * ulp * ulp, 0.0)
    return c, var


def centre(pr: Problem, m: Model, actual=None):
    """(c, var) of the model on every element of the problem, float64 arrays of its shape. An RZ
    model's centre carries the drift fitted on ``actual`` (:mod:`refkern.analysis.tensor_cores`)."""
    n = pr.n_terms
    if m.rz:
        c, var = centre(pr, dataclasses.replace(m, rz=False))
        if actual is None:
            return c, var
        rounded, taps, D = pr.with_inputs(m.inputs), _taps(pr), None
        step = max(1, 2**20 // max(n, 1))
        for s0 in range(0, pr.size, step):
            idx = np.arange(s0, min(pr.size, s0 + step))
            L, R, _, _ = rounded.terms(idx)
            part = drift(L, R, taps)
            D = np.empty((pr.size, part.shape[1])) if D is None else D
            D[idx] = part
        return fit_drift(np.asarray(actual, np.float64).reshape(-1), c.reshape(-1), var.reshape(-1), D)[0].reshape(
            c.shape), var
    if m.taps:  # computed from the gathered terms, in chunks of at most 2**20 terms
        c, var = np.empty(pr.size), np.empty(pr.size)
        step = max(1, 2**20 // max(n, 1))
        for s0 in range(0, pr.size, step):
            idx = np.arange(s0, min(pr.size, s0 + step))
            c[idx], var[idx] = _tapped(pr.terms(idx), _n_taps(pr), m, n)
        return c.reshape(pr.shape), var.reshape(pr.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        if m.order is not None:
            v, _ = pr.run(inputs=m.inputs, method=m.order, work=m.acc)
            s, _ = pr.run(inputs=m.inputs, method=ENERGY, work=FLOAT64)
            c = _store(v, m)
            return c, _order_variance(m, n, s, c)
        order = _order_term(pr)
        if m.product is not None:
            prod, mag = pr.run(inputs=m.inputs, work=FLOAT64, want_mag=True, with_bias=False)
            return _product_then_bias(prod, mag, pr.bias_values(), m, n, level(pr.size), order)
        if m.epilogue:
            prod, mag = pr.run(inputs=m.inputs, work=m.storage, want_mag=True, with_bias=False)
            b = pr.bias_values()
            c = round_array(prod + b, *m.storage.params)
            return c, rounding_variance(m, n, mag + np.abs(b), c, prod, order)
        c, mag = pr.run(inputs=m.inputs, work=m.storage, want_mag=True)
        return c, rounding_variance(m, n, mag, c, order=order)


def _order_term(pr: Problem, idx=None):
    """The verdict's order term of the exact terms (``pr.order_term``, flat, set by the verdict when the
    bound of :mod:`refkern.analysis.partials` applies; None for the order-free scale), at the flat indices
    ``idx`` (all elements, in ``pr.shape``, by default)."""
    o = getattr(pr, "order_term", None)
    if o is None:
        return None
    return o.reshape(pr.shape) if idx is None else o.reshape(-1)[idx]


def centre_sample(terms, pr: Problem, m: Model, actual=None):
    """(c, var) of the model on the gathered elements ``terms = (L, R, bias, has_bias)`` (an RZ model's
    drift fitted on ``actual``, the backend's values there, as :func:`centre`)."""
    with threads_for(terms[0].size):  # a sample is small: its kernels on one thread (threads_for)
        if not m.rz:
            return _centre_sample(terms, pr, m)
        c, var = _centre_sample(terms, pr, dataclasses.replace(m, rz=False))
        if actual is None:
            return c, var
        memo = _shared(terms)
        key = ("drift", m.inputs)
        if key not in memo:
            Lr, Rr, _ = _rounded(terms, memo, m.inputs)
            memo[key] = drift(Lr, Rr, _taps(pr))
        return fit_drift(actual, c, var, memo[key])[0], var


_SHARED = (None, {})  # (the last sample's terms, its runs and rounded operands): see _shared


def _shared(terms):
    """The work the models share on one sample ``terms`` (the same tuple, passed to every model by
    the verdict): the operands rounded to an input format (fp16 inputs and fp16 autocast round them
    alike), and the runs that do not depend on the model (the four accumulator models' error scale,
    ENERGY on the unrounded operands). Kept for the last sample only, keyed on the tuple's identity
    (held here, so the identity cannot be reused)."""
    global _SHARED
    held, memo = _SHARED
    if held is not terms:
        memo = {}
        _SHARED = (terms, memo)
    return memo


def _rounded(terms, memo, inputs):
    """(L, R, bias) of ``terms`` rounded as ``inputs = (fmt, mode, round_bias)`` says, once per sample.
    Where the problem's operands hold fewer values than the sample's rows (a ResNet conv on one
    image: 0.25M values against 1820 patches of 576, 1M), the operands are rounded and the rows
    gathered again from them (:meth:`~refkern.analysis.evaluate.Problem.with_inputs`): the same
    values, each rounding being elementwise."""
    L, R, b, hb = terms
    if inputs is None:
        return L, R, b
    fmt, mode, round_bias = inputs
    key = ("rounded", fmt, mode)
    if key not in memo:
        pr = getattr(terms, "problem", None)
        if pr is not None and pr.operand_size() < L.size:
            Lr, Rr, _, _ = pr.with_inputs((fmt, mode, False)).terms(terms.idx)
        else:
            Lr, Rr = round_array(L, *fmt.params, mode), round_array(R, *fmt.params, mode)
        memo[key] = (Lr, Rr)
    Lr, Rr = memo[key]
    if round_bias and hb:
        kb = ("bias", fmt, mode)
        if kb not in memo:
            memo[kb] = round_array(b, *fmt.params, mode)
        b = memo[kb]
    return Lr, Rr, b


def _centre_sample(terms, pr: Problem, m: Model):
    L, R, b, hb = terms
    n = pr.n_terms
    p = pr.p
    if m.taps:
        return _tapped(terms, _n_taps(pr), m, n)
    memo = _shared(terms)

    def run(method, work, with_bias=True):
        key = ("run", m.inputs, method, work, hb and with_bias)
        if key not in memo:  # the same call for two models (ENERGY of every accumulator model): run once
            q = dataclasses.replace(p, method=method, work=work)
            Lr, Rr, br = _rounded(terms, memo, m.inputs)
            memo[key] = sample_run(Lr, Rr, br, hb and with_bias, q)
        return tuple(v.copy() for v in memo[key])  # copies: no model can alter another's

    with np.errstate(invalid="ignore", over="ignore"):
        if m.order is not None:
            v, _ = run(m.order, m.acc)
            s, _ = run(ENERGY, FLOAT64)
            c = _store(v, m)
            return c, _order_variance(m, n, s, c)
        idx = getattr(terms, "idx", None)
        order = _order_term(pr, idx) if idx is not None else None
        if m.product is not None:
            prod, mag = run(EXACT, FLOAT64, with_bias=False)
            return _product_then_bias(prod, mag, b, m, n, level(pr.size), order)
        if m.epilogue:
            prod, mag = run(EXACT, m.storage, with_bias=False)
            c = round_array(prod + b, *m.storage.params)
            return c, rounding_variance(m, n, mag + np.abs(b), c, prod, order)
        c, mag = run(EXACT, m.storage)
        return c, rounding_variance(m, n, mag, c, order=order)
