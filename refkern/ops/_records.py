"""The records of :mod:`refkern.ops`, one per op: the products and convolutions first (one rounded sum
per output element), then the ops judged by envelopes, each family in the order users meet them.

Every name below is a string: nothing is imported here (the kernels, torch and mpmath are imported
when a consumer first asks a record for its function)."""

from refkern.ops._record import Backward, Call, Op

_F = "torch.nn.functional."
_SUM_HYPOTHESES = ("tf32", "autocast", "accumulators")  # and "epilogue" where a bias is added
_CONV_CALL = "convolution", "_convolution"  # aten's one convolution: every conv and transposed conv
_RULE, _TRUTH = "refkern.kernels.", "refkern.truth.backward:"
_JUDGE, _AUDIT = "refkern.analysis.gradients:", "refkern.torch.dispatch_backward:"


def _backward(rule, truth, judge, audit=None):
    """The :class:`Backward` of an op: ``rule`` a kernels module and function ("gemm_grad:_linear"), ``truth``
    and ``judge`` functions of :mod:`refkern.truth.backward` and :mod:`refkern.analysis.gradients`, ``audit``
    one of :mod:`refkern.torch.dispatch_backward` (for the ops with an aten backward kernel)."""
    return Backward(_RULE + rule, _TRUTH + truth, _JUDGE + judge, _AUDIT + audit if audit else None)


def _methods(*names, params=None, torch_name=None):
    """Call records of ``torch.<name>`` and ``torch.Tensor.<name>``."""
    return tuple(Call(f"torch.{p}{n}", params, torch_name) for n in names for p in ("", "Tensor."))


def _product(name, reference, operands, *, hypotheses, calls, aten, torch_function, autograd=(), sample=None,
             opinfo=()):  # fmt: skip
    return Op(name, "product", reference, f"refkern.truth.products:{name}", operands, "sum", required=2,
              positional=True, hypotheses=hypotheses, differentiable=operands,
              torch_function=torch_function, calls=calls, aten=aten, autograd=autograd, sample=sample, sweep=True,
              opinfo=opinfo, backward=_backward(f"gemm_grad:_{name}", name, "adjoint_report"),
              integer_reference=f"refkern.kernels.integer_gemm:{name}")  # fmt: skip


def _conv(nd, transposed=False):
    name = f"conv_transpose{nd}d" if transposed else f"conv{nd}d"
    first = "input" if transposed else "x"
    return Op(name, "conv_transpose" if transposed else "conv",
              f"refkern.kernels.{'conv_transpose' if transposed else 'conv'}:{name}",
              f"refkern.truth.products:{name}", (first, "weight", "bias"), "sum", required=2, positional=True,
              hypotheses=(*_SUM_HYPOTHESES, "epilogue", *(("taps",) if transposed else ())),
              differentiable=(first, "weight", "bias"), torch_function=f"{_F}{name}",
              calls=(Call(f"{_F}{name}"),), aten=_CONV_CALL, aten_backward=("convolution_backward",),
              autograd=(("ConvolutionBackward0", ("input", "weight", "bias")),),
              sample=None if transposed else "conv", opinfo=(f"nn.functional.{name}",), spatial=nd,
              backward=_backward(f"conv_grad:{'conv_transpose' if transposed else 'conv'}_rule",
                                 "conv_transpose" if transposed else "conv", "adjoint_report",
                                 "convolution"))  # fmt: skip


def _reduction(name, params, *, aten=None, needs=None, hypotheses=()):
    cumsum = name == "cumsum"  # its gradient is a (flipped) cumsum: an adjoint call, judged as one
    return Op(name, "reduction", f"refkern.kernels.reduction:{name}", f"refkern.truth.reductions:{name}", ("x",),
              "envelope", hypotheses=hypotheses, differentiable=("x",), torch_function=f"torch.{name}",
              calls=_methods(name, params=params), aten=aten or (name,), needs=needs, opinfo=(name,),
              backward=_backward(f"reduction_grad:_{'cumsum' if cumsum else 'reduction'}", "reduction",
                                 "cumsum_report" if cumsum else "reduction_report"))  # fmt: skip


def _norm(name, operands, params, *, aten, aten_backward, autograd, memo=(), required=1, needs=None, sample=None,
          hypotheses=()):  # fmt: skip
    return Op(name, "norm", f"refkern.kernels.norm:{name}", f"refkern.truth.norms:{name}", operands,
              "envelope", required=required, hypotheses=hypotheses,
              differentiable=tuple(k for k in operands if k in ("input", "weight", "bias")),
              torch_function=f"{_F}{name}", calls=(Call(f"{_F}{name}", params),), aten=aten,
              aten_backward=aten_backward, aten_memo=memo, autograd=autograd, sample=sample, needs=needs,
              opinfo=(f"nn.functional.{name}",),
              backward=_norm_backward(name))  # fmt: skip


def _norm_backward(name):
    """A norm's :class:`Backward`: norm_grad's rule and the norms' envelope; batch_norm's through its own rule and
    route (:func:`refkern.kernels.batch_norm_grad.batch_norm_rule`: an input with no element too)."""
    if name == "batch_norm":
        return Backward(_RULE + "batch_norm_grad:batch_norm_rule", _TRUTH + name,
                        "refkern.analysis.batch_norm_gradients:batch_norm_report", _AUDIT + name)  # fmt: skip
    return _backward("norm_grad:_norm", name if name == "group_norm" else "norm", "norm_report", name)


def _pool(kind, nd, params, *, aten=None, aten_backward=(), autograd=None, with_indices=False, needs,
          module="pool"):  # fmt: skip
    """The record of torch's ``<kind>_pool<nd>d`` (``kind`` one of :data:`~refkern.ops.POOL_KINDS`, ``nd`` its
    pooled dimensions): ``F.<name>`` with torch's parameters ``params``, and ``nn.<Name>`` (torch's class name for
    the function: ``nn.AdaptiveAvgPool2d`` for ``adaptive_avg_pool2d``), whose attributes are those parameters;
    ``with_indices``: ``F.<name>_with_indices`` and aten's ``<name>_with_indices`` too (``return_indices=True``: the
    argmax positions, an output no reference judges). Its aten backward kernels are read by
    :func:`refkern.torch.dispatch_backward.pool`, every pool's."""
    name = f"{kind}_pool{nd}d"
    average = kind == "avg"  # torch's integer averages truncate: refkern.kernels.integer_pool
    integer = f"refkern.kernels.{'pool3d:integer_' if module == 'pool3d' else 'integer_pool:'}{name}"
    indexed = (f"{name}_with_indices",) if with_indices else ()
    unjudged = (("indices", "argmax positions (integers): not judged, the values are"),) if indexed else ()
    nn = "".join(w[0].upper() + w[1:] for w in name.split("_"))  # torch's class of F.<name>: AdaptiveAvgPool2d
    return Op(name, "pool", f"refkern.kernels.{module}:{name}", f"refkern.truth.pools:{name}", ("input",),
              "envelope", differentiable=("input",), torch_function=f"{_F}{name}",
              calls=(Call(f"{_F}{name}", params),
                     *(Call(f"{_F}{c}", params, fixed=(("return_indices", True),)) for c in indexed)),
              aten=(*(aten or (name,)), *indexed), aten_backward=aten_backward,
              aten_unjudged=unjudged,
              autograd=((autograd, ("input",)),) if autograd else (), needs=needs,
              opinfo=(f"nn.functional.{name}",), modules=(f"torch.nn.{nn}",),
              integer_reference=integer if average else None, pool=kind, spatial=nd,
              backward=_backward("pool_grad:_pool", "pool", "pool_report",
                                 "pool" if aten_backward else None))  # fmt: skip


def _softmax(name, aten, aten_backward, nodes):
    """A softmax's record: its backward kernel receives the output, so the audit keeps the input of every aten
    op computing it (``_safe_softmax`` too: SDPA's math path, T5's attention)."""
    f_params, t_params = ("input", "dim", "_stacklevel", "dtype"), ("input", "dim", "dtype")
    return Op(name, "softmax", f"refkern.kernels.softmax:{name}", f"refkern.truth.softmax:{name}", ("input",),
              "envelope", hypotheses=("stored output", "named bugs"), differentiable=("input",),
              torch_function=f"{_F}{name}",
              calls=(Call(f"{_F}{name}", f_params), *_methods(name, params=t_params)), aten=aten,
              aten_backward=aten_backward, aten_memo=tuple((a, "input") for a in aten),
              autograd=tuple((node, ("input",)) for node in nodes),
              sample="rows", needs="dim=-1", opinfo=(name,),
              backward=_backward("softmax_grad:_softmax", "softmax", "softmax_report", "softmax"))  # fmt: skip


_AVG1 = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
_MAX = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_SDPA = "_scaled_dot_product_"
_QKV = ("query", "key", "value")
# attention's fused backward kernels (CPU flash; CUDA flash, memory-efficient, cuDNN; the overrideable one of
# out-of-tree backends) and their outputs in order, the gradient of the additive mask last
_SDPA_BACKWARD = ((f"{_SDPA}flash_attention_for_cpu_backward", _QKV), (f"{_SDPA}flash_attention_backward", _QKV),
                  (f"{_SDPA}efficient_attention_backward", (*_QKV, "attn_bias")),
                  (f"{_SDPA}cudnn_attention_backward", _QKV),
                  (f"{_SDPA}fused_attention_overrideable_backward", (*_QKV, "attn_bias")))  # fmt: skip

RECORDS = (
    _product("dot", "refkern.reduce:dot", ("x", "y"), hypotheses=_SUM_HYPOTHESES,
             calls=_methods("dot", params=("input", "tensor")), aten=("dot",), torch_function="torch.dot",
             opinfo=("dot",)),
    _product("matmul", "refkern.kernels.gemm:matmul", ("a", "b"), hypotheses=_SUM_HYPOTHESES,
             calls=(*_methods("matmul"), Call("torch.Tensor.__matmul__"), *_methods("mm", torch_name="mm"),
                    *_methods("bmm", torch_name="bmm"), *_methods("mv", torch_name="mv"),
                    *_methods("addmm", torch_name="addmm"),
                    *_methods("baddbmm", torch_name="baddbmm")),
             aten=("mm", "bmm", "mv", "matmul", "addmm", "baddbmm"), torch_function="torch.matmul",
             autograd=(("MmBackward0", ("input", "mat2")), ("BmmBackward0", ("input", "mat2"))),
             sample="matmul", opinfo=("matmul", "mm", "bmm", "mv", "addmm", "baddbmm")),
    _product("linear", "refkern.kernels.gemm:linear", ("x", "weight", "bias"),
             hypotheses=(*_SUM_HYPOTHESES, "epilogue"), calls=(Call(f"{_F}linear"),), aten=("linear",),
             autograd=(("AddmmBackward0", ("bias", "input", "weight")),),
             torch_function=f"{_F}linear", sample="linear", opinfo=("nn.functional.linear",)),
    *(_conv(nd) for nd in (1, 2, 3)),
    *(_conv(nd, transposed=True) for nd in (1, 2, 3)),
    _reduction("sum", ("input", "dim", "keepdim")),
    _reduction("mean", ("input", "dim", "keepdim")),
    _reduction("var", ("input", "dim", "unbiased", "keepdim"), aten=("var", "var_mean"),
               hypotheses=("one-pass variance",)),
    _reduction("std", ("input", "dim", "unbiased", "keepdim"), aten=("std", "std_mean"),
               hypotheses=("one-pass variance",)),
    _reduction("cumsum", ("input", "dim"), needs="dim=-1"),
    _norm("layer_norm", ("input", "weight", "bias"), ("input", "normalized_shape", "weight", "bias", "eps"),
          aten=("native_layer_norm", "layer_norm"), aten_backward=("native_layer_norm_backward",),
          memo=(("native_layer_norm", "eps"),), autograd=(("NativeLayerNormBackward0", ("input", "weight", "bias")),),
          needs="normalized_shape=(768,)", sample="rows", hypotheses=("one-pass variance",)),
    _norm("rms_norm", ("input", "weight"), ("input", "normalized_shape", "weight", "eps"),
          aten=("rms_norm", "_fused_rms_norm"), aten_backward=("_fused_rms_norm_backward",),
          memo=(("_fused_rms_norm", "eps"),), autograd=(("FusedRmsNormBackward0", ("input", "weight")),),
          needs="normalized_shape=(768,)", sample="rows"),
    _norm("group_norm", ("input", "weight", "bias"), ("input", "num_groups", "weight", "bias", "eps"),
          aten=("native_group_norm",), aten_backward=("native_group_norm_backward",), needs="num_groups=4",
          memo=(("native_group_norm", "eps"),), autograd=(("NativeGroupNormBackward0", ("input", "weight", "bias")),),
          hypotheses=("one-pass variance",)),
    _norm("batch_norm", ("input", "running_mean", "running_var", "weight", "bias"),
          ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
          aten=("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                "_native_batch_norm_legit_functional"),
          aten_backward=("native_batch_norm_backward",), required=3, sample="batch_norm",
          autograd=(("NativeBatchNormBackward0", ("input", "weight", "bias")),),
          hypotheses=("one-pass variance",)),
    _pool("avg", 1, _AVG1, needs="kernel_size=3"),
    _pool("avg", 2, (*_AVG1, "divisor_override"), aten_backward=("avg_pool2d_backward",),
          autograd="AvgPool2DBackward0", needs="kernel_size=3"),
    _pool("avg", 3, (*_AVG1, "divisor_override"), aten_backward=("avg_pool3d_backward",),
          autograd="AvgPool3DBackward0", needs="kernel_size=3", module="pool3d"),
    _pool("max", 1, _MAX, with_indices=True, needs="kernel_size=3"),
    _pool("max", 2, _MAX, aten_backward=("max_pool2d_with_indices_backward",), with_indices=True,
          autograd="MaxPool2DWithIndicesBackward0", needs="kernel_size=3"),
    _pool("adaptive_avg", 1, ("input", "output_size"), needs="output_size=4"),
    _pool("adaptive_avg", 2, ("input", "output_size"), aten=("adaptive_avg_pool2d", "_adaptive_avg_pool2d"),
          aten_backward=("_adaptive_avg_pool2d_backward",), autograd="AdaptiveAvgPool2DBackward0",
          needs="output_size=(4,4)"),
    _softmax("softmax", ("_softmax", "_safe_softmax", "softmax"), ("_softmax_backward_data",),
             ("SoftmaxBackward0", "SafeSoftmaxBackward0")),
    _softmax("log_softmax", ("_log_softmax", "log_softmax"), ("_log_softmax_backward_data",),
             ("LogSoftmaxBackward0",)),
    Op("scaled_dot_product_attention", "attention", "refkern.kernels.attention:scaled_dot_product_attention",
       "refkern.truth.softmax:scaled_dot_product_attention", ("query", "key", "value", "attn_mask"), "envelope",
       required=3, hypotheses=("P@V", "named bugs"), differentiable=("query", "key", "value", "attn_mask"),
       torch_function=f"{_F}scaled_dot_product_attention",
       calls=(Call(f"{_F}scaled_dot_product_attention",
                   ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")),),
       aten=(f"{_SDPA}flash_attention_for_cpu", f"{_SDPA}efficient_attention", f"{_SDPA}flash_attention",
             f"{_SDPA}cudnn_attention", "scaled_dot_product_attention"),
       aten_backward=tuple(k for k, _ in _SDPA_BACKWARD),
       backward_outputs=_SDPA_BACKWARD,
       autograd=(("ScaledDotProductFlashAttentionForCpuBackward0", _QKV),
                 ("ScaledDotProductFlashAttentionBackward0", _QKV),
                 ("ScaledDotProductEfficientAttentionBackward0", (*_QKV, "attn_bias")),
                 ("ScaledDotProductCudnnAttentionBackward0", _QKV),
                 ("ScaledDotProductFusedAttentionOverrideableBackward0", (*_QKV, "attn_bias"))),
       opinfo=("nn.functional.scaled_dot_product_attention",),
       backward=_backward("attention_grad:_attention", "attention", "attention_report", "attention")),
)  # fmt: skip
