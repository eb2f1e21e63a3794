"""What an aten op (one op as torch's dispatcher runs it) computes, for the audit.

Every op a model runs reaches torch's dispatcher as an ``OpOverload`` (``aten.convolution.default``,
``aten.addmm.default``, ``aten.native_layer_norm.default``, ``aten.gelu.default``...), whether it came from a
module, a functional call, the inside of ``F.multi_head_attention_forward``, a decomposition or a fused
fast path. :func:`classify` says what the audit does with one:

- ``"reference"``: it computes a refkern op; :func:`references` gives the refkern calls that reproduce
  each of its outputs (``native_layer_norm``: the normalised output, and its ``mean``), and the outputs
  no refkern op reproduces (``rstd``) with the reason;
- ``"defined"``: its result is defined to the bit (IEEE 754 add, sub, mul, div, sqrt, comparisons,
  selections, integer arithmetic): recomputed on the CPU in the same dtype and compared bit for bit;
- ``"move"``: it only moves, selects or restates values (views, copies, concatenation, padding,
  constants): nothing is computed, nothing is counted;
- ``"backward"``: the backward kernel of a refkern op (``convolution_backward``,
  ``native_layer_norm_backward``, ``_softmax_backward_data``...):
  :func:`~refkern.torch.dispatch_backward.backward_call` gives the :func:`refkern.compare_backward` call that
  judges each gradient it returns;
- ``"random"``, ``"fused"``, ``"unchecked"``: not checked, with the reason (:func:`reason`).
"""

import torch

import refkern.ops as _ops
from refkern.torch.ops import OpCall, from_call

__all__ = ["classify", "reason", "bind", "references", "Part", "op_name"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Ops that move, select or restate values, or make constants (besides every view op).
_MOVES = frozenset(
    "clone copy copy_ _to_copy contiguous cat stack index_select gather index index_put slice_scatter "
    "select_scatter diagonal_scatter as_strided_scatter constant_pad_nd reflection_pad1d reflection_pad2d "
    "reflection_pad3d replication_pad1d replication_pad2d replication_pad3d repeat repeat_interleave flip roll "
    "embedding split split_with_sizes unbind chunk detach alias lift lift_fresh lift_fresh_copy tril triu "
    "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like new_empty new_empty_strided "
    "new_zeros new_ones new_full arange linspace scalar_tensor fill zero set resize resize_as "
    "_local_scalar_dense _unsafe_view expand_copy view_copy permute_copy t_copy transpose_copy unsqueeze_copy "
    "squeeze_copy _reshape_copy clone_ unfold_copy im2col col2im pixel_shuffle pixel_unshuffle "
    "channel_shuffle native_channel_shuffle _pin_memory scatter index_copy index_fill masked_scatter "
    "masked_select nonzero _assert_async _assert_tensor_metadata _functional_assert_async "
    "_fused_sdp_choice is_same_size equal _has_compatible_shallow_copy_type record_stream select_backward "
    "slice_backward diagonal_backward".split()
)  # fmt: skip

# Ops whose result is defined to the bit: IEEE 754's correctly rounded arithmetic (+ - * / sqrt, fma is
# not among torch's ops), comparisons, selections, sign and rounding to integers, integer arithmetic.
# Recomputing one on the CPU in the same dtype gives the one right answer.
_DEFINED = frozenset(
    "add sub rsub mul div neg abs relu where maximum minimum fmax fmin clamp clamp_min clamp_max hardtanh "
    "threshold leaky_relu sqrt reciprocal floor ceil trunc round sign sgn signbit fmod remainder copysign "
    "eq ne lt le gt ge logical_not logical_and logical_or logical_xor bitwise_not bitwise_and bitwise_or "
    "bitwise_xor masked_fill max min amax amin argmax argmin sort topk isnan isinf isfinite isneginf isposinf "
    "nan_to_num square floor_divide relu6 hardshrink softshrink any all heaviside threshold_backward "
    "hardtanh_backward leaky_relu_backward native_dropout_backward".split()
)  # fmt: skip
# (the backward of relu, hardtanh and dropout selects grad_output or zero, or multiplies it by one constant:
# one IEEE operation per element, as the forward ops above)

# Fused kernels: several ops in one, whose inside the dispatcher does not show.
_FUSED = frozenset(
    "_transformer_encoder_layer_fwd _native_multi_head_attention _addmm_activation _transformer_decoder_only_layer_fwd "
    "_fused_adam _fused_adamw _fused_sgd _fused_moving_avg_obs_fq_helper _fused_dropout".split()
)  # fmt: skip

_RANDOM = frozenset(
    "bernoulli native_dropout uniform normal rand randn randint randperm rand_like randn_like randint_like "
    "exponential geometric log_normal cauchy multinomial random poisson _standard_gamma dropout "
    "feature_dropout alpha_dropout".split()
)  # fmt: skip

# The aten ops whose outputs a refkern op reproduces, and their backward kernels: the registry's.
_REFERENCED = frozenset(a for r in _ops.REGISTRY.values() for a in r.aten)


def op_name(func) -> str:
    """'relu' for aten.relu.default and aten.relu_.default; 'convolution' for aten.convolution.default."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else getattr(func, "__name__", str(func))
    return name[:-1] if name.endswith("_") and not name.endswith("__") and name[:-1] else name


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []


def classify(func, args, kwargs, out) -> str:
    """One of "reference", "defined", "move", "random", "fused", "unchecked" (see the module's doc)."""
    name = op_name(func)
    if name in _FUSED:
        return "fused"
    if name in _RANDOM:
        return "random"
    if not _tensors(out):  # sizes, scalars, a choice of kernel: no values computed
        return "move"
    if getattr(func, "is_view", False) or name in _MOVES:
        if name == "_to_copy" and _rounds(args, out):  # a conversion to a narrower float rounds: IEEE defines it
            return "defined"
        return "move"
    if name in _BACKWARD:
        return "backward"
    if name in _REFERENCED:
        ins = [t for t in _tensors(args) + _tensors(list((kwargs or {}).values()))]
        if ins and all(not (t.is_floating_point() or t.is_complex()) for t in ins + _tensors(out)):  # an integer sum
            return "defined"  # is exact; integer inputs of a floating result (exp of int64 is float32) are judged
        return "reference"
    if name in _DEFINED:
        return "defined"
    ins = _tensors(args) + _tensors(list((kwargs or {}).values()))
    outs = _tensors(out)
    if ins and all(not (t.is_floating_point() or t.is_complex()) for t in ins + outs):  # integer arithmetic
        return "defined"
    return "unchecked"


def _rounds(args, out):
    """Whether a conversion rounds: float to a narrower float (or between float16 and bfloat16), float to int."""
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    outs = _tensors(out)
    if src is None or not outs:
        return False
    a, b = src.dtype, outs[0].dtype
    if not (a.is_floating_point and b.is_floating_point):
        return a.is_floating_point and not b.is_floating_point  # float -> int truncates: defined too
    return torch.finfo(b).bits < torch.finfo(a).bits or {a, b} == {torch.float16, torch.bfloat16}


def reason(kind, func) -> str:
    """Why an op of this kind is not checked."""
    if kind == "fused":
        return "fused kernel: several ops in one, not looked inside"
    if kind == "random":
        return "random draw: no reference can reproduce it"
    name = op_name(func)
    if name.endswith(("_backward", "_backward_data")) or "_backward_" in name:
        return "no backward reference in refkern"
    return "no reference in refkern"


def bind(func, args, kwargs) -> dict:
    """The op's arguments by their schema names, defaults filled in."""
    kwargs = kwargs or {}
    vals = {}
    pos = 0
    for a in func._schema.arguments:
        if not a.kwarg_only and pos < len(args):
            vals[a.name] = args[pos]
            pos += 1
        elif a.name in kwargs:
            vals[a.name] = kwargs[a.name]
        else:
            vals[a.name] = a.default_value
    return vals


def mutated(func) -> list:
    """Names of the arguments the op writes into (``self`` of relu_, a batch norm's running statistics)."""
    return [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


class Part:
    """One output of an aten op: ``call`` reproduces it (an OpCall), or ``why`` says why nothing does."""

    def __init__(self, label, index, call=None, why=None):
        self.label = label  # "out", "mean", "rstd", "logsumexp"
        self.index = index  # which output of the op
        self.call = call
        self.why = why


def _tup(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _upcast(x):
    """A float16/bfloat16 tensor in float32 (exact): the dtype torch's kernels keep statistics in."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _float(t):
    return isinstance(t, torch.Tensor) and t.dtype in _FLOATS


def references(func, b, out) -> list:
    """The parts of aten op ``func``'s output, given its bound arguments ``b`` (:func:`bind`) and its output."""
    name = op_name(func)
    overload = func._overloadname
    if overload.endswith("out") and overload != "default":  # the .out forms write their result into out=
        b = {k: v for k, v in b.items() if not k.startswith("out") and k not in ("save_mean", "save_invstd", "indices")}
    if overload in ("dtype", "dtype_out"):
        return [Part("out", 0, OpCall(name, unsupported=f"{name} with out_dtype: not a result in the inputs' dtype"))]
    fn = _MAP.get(name)
    if fn is None:
        return [Part("out", 0, OpCall(name, unsupported=f"aten.{name}: no mapping to a refkern op"))]
    ins, outs = [v for v in b.values() if isinstance(v, torch.Tensor)], _tensors(out)
    if ins and outs and outs[0].dtype in _FLOATS and not any(t.is_floating_point() or t.is_complex() for t in ins):
        # integer or bool inputs of a floating result (exp of int64 is float32, sum's dtype=): torch converted them to
        # the result's dtype first, as refkern.torch.ops.from_call does
        b = {k: v.to(outs[0].dtype) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
    return fn(name, b, out)


def _conv(name, b, out):
    x, w, bias = b["input"], b["weight"], b["bias"]
    nd = w.dim() - 2
    if nd not in (1, 2, 3):
        return [Part("out", 0, OpCall(name, unsupported=f"a {nd}-d convolution (refkern has 1-d, 2-d and 3-d)"))]
    if b["transposed"]:
        op = f"conv_transpose{nd}d"
        kw = dict(stride=_tup(b["stride"]), padding=_tup(b["padding"]), output_padding=_tup(b["output_padding"]),
                  groups=b["groups"], dilation=_tup(b["dilation"]))  # fmt: skip
    else:
        op = f"conv{nd}d"
        kw = dict(stride=_tup(b["stride"]), padding=_tup(b["padding"]), dilation=_tup(b["dilation"]),
                  groups=b["groups"])  # fmt: skip
    return [Part("out", 0, OpCall(op, op, (x, w, bias), kw))]


def _mm(name, b, out):
    other = b.get("mat2", b.get("vec", b.get("tensor")))
    op = "dot" if name == "dot" else "matmul"
    return [Part("out", 0, OpCall(name, op, (b["self"], other)))]


def _addmm(name, b, out):
    f = {"addmm": torch.addmm, "baddbmm": torch.baddbmm}[name]
    m1 = b.get("mat1", b.get("batch1"))
    m2 = b.get("mat2", b.get("batch2"))
    call = from_call(f, (b["self"], m1, m2), {"beta": b["beta"], "alpha": b["alpha"]})
    call.torch_name = name
    return [Part("out", 0, call)]


def _linear(name, b, out):
    if name == "matmul":
        return [Part("out", 0, OpCall(name, "matmul", (b["self"], b["other"])))]
    return [Part("out", 0, OpCall(name, "linear", (b["input"], b["weight"], b["bias"])))]


def _softmax(name, b, out):
    x, dim = b["self"] if "self" in b else b["input"], b["dim"]
    op = "log_softmax" if "log" in name else "softmax"
    if name == "_safe_softmax":
        if x.numel() and torch.isneginf(x).all(dim).any():
            return [Part("out", 0, OpCall(name, unsupported="_safe_softmax of rows entirely masked (-inf): it gives 0 "
                                          "there, softmax NaN"))]  # fmt: skip
        dtype = b.get("dtype")
    elif name in ("softmax", "log_softmax"):
        dtype = b.get("dtype")
    else:
        dtype = torch.float32 if b["half_to_float"] else None
    kw = {"dim": dim} if dtype is None else {"dim": dim, "dtype": dtype}
    return [Part("out", 0, OpCall(name, op, (x,), kw))]


def _layer_norm(name, b, out):
    x, shape = b["input"], tuple(b["normalized_shape"])
    parts = [Part("out", 0, OpCall(name, "layer_norm", (x,), dict(normalized_shape=shape, weight=b["weight"],
                                                                  bias=b["bias"], eps=b["eps"])))]  # fmt: skip
    if name == "native_layer_norm":
        axis = x.dim() - len(shape)
        dims = tuple(range(axis, x.dim()))
        parts.append(Part("mean", 1, OpCall(name, "mean", (_upcast(x),), dict(dim=dims, keepdim=True))))
        parts.append(Part("rstd", 2, why="rstd = 1/sqrt(var + eps): no refkern op"))
    return parts


def _rms_norm(name, b, out):
    x = b["input"]
    parts = [Part("out", 0, OpCall(name, "rms_norm", (x,), dict(normalized_shape=tuple(b["normalized_shape"]),
                                                                weight=b["weight"], eps=b["eps"])))]  # fmt: skip
    if name == "_fused_rms_norm":
        parts.append(Part("rstd", 1, why="rstd = 1/sqrt(mean(x^2) + eps): no refkern op"))
    return parts


def _group_norm(name, b, out):
    x, g = b["input"], b["group"]
    parts = [Part("out", 0, OpCall(name, "group_norm", (x,), dict(num_groups=g, weight=b["weight"], bias=b["bias"],
                                                                  eps=b["eps"])))]  # fmt: skip
    n = x.shape[0]
    parts.append(Part("mean", 1, OpCall(name, "mean", (_upcast(x).reshape(n, g, -1),), dict(dim=2))))
    parts.append(Part("rstd", 2, why="rstd = 1/sqrt(var + eps): no refkern op"))
    return parts


def _batch_norm(name, b, out):
    x = b["input"]
    training = b.get("training", False) if name != "_native_batch_norm_legit_no_training" else False
    rm, rv = b.get("running_mean"), b.get("running_var")
    kw = dict(weight=b["weight"], bias=b["bias"], training=bool(training), momentum=b["momentum"] or 0.0, eps=b["eps"])
    if not training and (rm is None or rv is None):
        return [Part("out", 0, OpCall(name, unsupported=f"{name} in eval mode without running statistics"))]
    parts = [Part("out", 0, OpCall(name, "batch_norm", (x, rm, rv), kw))]
    if training:
        dims = (0,) + tuple(range(2, x.dim()))
        parts.append(Part("save_mean", 1, OpCall(name, "mean", (_upcast(x),), dict(dim=dims))))
        parts.append(Part("save_invstd", 2, why="invstd = 1/sqrt(var + eps): no refkern op"))
        if rm is not None:
            parts.append(Part("running stats", None, why="the running statistics' update is not judged"))
    return parts


def _reduction(name, b, out):
    base = {"var_mean": "var", "std_mean": "std"}.get(name, name)
    x = b["self"]
    kw = {}
    dim = b.get("dim")
    if dim is not None and not (isinstance(dim, (list, tuple)) and len(dim) == 0 and base != "cumsum"):
        kw["dim"] = _tup(dim) if base != "cumsum" else dim
    if base in ("sum", "mean", "var", "std"):
        kw["keepdim"] = bool(b.get("keepdim") or False)
    if base in ("sum", "mean", "cumsum") and b.get("dtype") is not None:
        kw["dtype"] = b["dtype"]
    if base in ("var", "std"):
        corr = b.get("correction")
        if corr is None:
            corr = 1 if b.get("unbiased", True) is not False else 0
        kw["correction"] = int(corr) if float(corr) == int(corr) else corr
    parts = [Part("out", 0, OpCall(name, base, (x,), kw))]
    if name in ("var_mean", "std_mean"):
        mkw = {k: v for k, v in kw.items() if k in ("dim", "keepdim")}
        parts.append(Part("mean", 1, OpCall(name, "mean", (x,), mkw)))
    return parts


# a pool's aten ops -> its record: the op, and its first call's parameters (torch's names, aten's too)
_POOLS = {a: r for r in _ops.REGISTRY.values() if r.family == "pool" for a in r.aten}


def _pool(name, b, out):
    """A pool's aten op as its record's op, with the aten call's arguments that its first call names (aten's empty
    ``stride``, the kernel size, is torch's None); outputs past the first (``max_pool2d_with_indices``' argmax
    positions) are the record's ``aten_unjudged``."""
    rec = _POOLS[name]
    kw = {p: _tup(b[p]) for p in rec.calls[0].params[1:] if p in b}
    if "stride" in kw:
        kw["stride"] = kw["stride"] or None
    parts = [Part("out", 0, OpCall(name, rec.name, (b["self"],), kw))]
    extra = len(_tensors(out)) - 1
    return parts + [Part(label, i, why=why) for i, (label, why) in enumerate(rec.aten_unjudged[:extra], 1)]


def _attention(name, b, out):
    q, k, v = b["query"], b["key"], b["value"]
    mask = b.get("attn_mask", b.get("attn_bias"))
    p = b.get("dropout_p") or 0.0
    if p:
        return [Part("out", 0, OpCall(name, unsupported=f"attention with dropout_p={p} (a random mask no reference "
                                      "can reproduce)"))]  # fmt: skip
    kw = dict(attn_mask=mask, is_causal=bool(b.get("is_causal")), scale=b.get("scale"))
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        kw["enable_gqa"] = True
    parts = [Part("out", 0, OpCall(name, "scaled_dot_product_attention", (q, k, v), kw))]
    if name != "scaled_dot_product_attention":
        parts.append(Part("logsumexp", 1, why="the softmax's log-sum-exp (for the backward): no refkern op"))
    return parts


def _elementwise(name, b, out):
    """An elementwise function (exp, rsqrt, silu, gelu with its ``approximate``, softplus with ``beta`` and
    ``threshold``, pow of a tensor or a number to a number or a float tensor): refkern's op of the same name on the
    same arguments."""
    y = _tensors(out)
    e = b.get("exponent") if name == "pow" else None
    if isinstance(e, torch.Tensor) and not (e.is_floating_point() or e.is_complex()) and y and y[0].dtype in _FLOATS:
        b = dict(b, exponent=e.to(y[0].dtype))  # a float base to an integer tensor power: torch's result_type
    x = b.get("self")
    e = b.get("exponent") if name == "pow" else None
    tensor_pow = isinstance(e, torch.Tensor) and _float(e)  # pow.Tensor_Tensor, pow.Scalar (a number base)
    ok = (_float(x) or (tensor_pow and isinstance(x, (int, float)))) and y
    if not ok or (not tensor_pow and y[0].dtype != x.dtype):
        got = "a number" if not isinstance(x, torch.Tensor) else str(x.dtype).removeprefix("torch.")
        return [Part("out", 0, OpCall(name, unsupported=f"{name} of {got} (refkern's {name} takes a float16, "
                                      "bfloat16, float32 or float64 tensor, its result in that dtype)"))]  # fmt: skip
    if name == "pow" and isinstance(e, torch.Tensor) and not tensor_pow:
        return [Part("out", 0, OpCall(name, unsupported=f"pow with a {e.dtype} exponent tensor (refkern's pow takes "
                                      "a number or a float tensor)"))]  # fmt: skip
    # the keywords the record's signature names (gelu's approximate, softplus's beta and threshold, pow's exponent),
    # as the aten call's bound arguments give them; silu's inplace is no aten argument
    kw = {p: b[p] for p in _ops.get(name).calls[0].params[1:] if p in b}
    return [Part("out", 0, OpCall(name, name, (x,), kw))]


def _product(name, b, out):
    if name in ("addmm", "baddbmm"):
        return _addmm(name, b, out)
    if name in ("linear", "matmul"):
        return _linear(name, b, out)
    return _mm(name, b, out)


def _norm(name, b, out):
    if "layer_norm" in name:
        return _layer_norm(name, b, out)
    if "rms_norm" in name:
        return _rms_norm(name, b, out)
    if "group_norm" in name:
        return _group_norm(name, b, out)
    return _batch_norm(name, b, out)


def _loss(name, b, out):
    from refkern.torch._losses import loss_parts

    return loss_parts(name, b, out, Part)


# the aten ops of each family of the registry's records -> the function that binds their schema's arguments
_FAMILY = {"product": _product, "conv": _conv, "conv_transpose": _conv, "reduction": _reduction, "norm": _norm,
           "pool": _pool, "softmax": _softmax, "attention": _attention, "elementwise": _elementwise,
           "loss": _loss}  # fmt: skip
_MAP = {a: _FAMILY[r.family] for r in _ops.REGISTRY.values() for a in r.aten}


# ---------------------------------------------------------------- backward kernels

# The backward kernels of refkern's ops (refkern.torch.dispatch_backward: what each needs from its forward that it
# does not receive, ``eps`` of a norm, the input of a softmax, whose backward receives its output).
_BACKWARD = frozenset(a for r in _ops.REGISTRY.values() for a in r.aten_backward)
