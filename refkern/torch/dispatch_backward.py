"""The audit's backward kernels (:mod:`refkern.torch.dispatch` says what each forward op is): what a backward
kernel needs from its forward (:data:`MEMO`, :func:`forward_memo`), the refkern gradient call it stands for
(:func:`backward_call`), and which gradient each output of an autograd node is (:func:`op_edges`)."""

import torch

import refkern.ops as _ops
from refkern.torch.dispatch import _BACKWARD, _tup, op_name

__all__ = ["MEMO", "BackwardCall", "forward_memo", "backward_call", "leaf", "edge_name", "op_edges"]


# scaled_dot_product_attention's fused backward kernels: their outputs in order (the registry's)
_ATTN_BACKWARD = {k: outs for r in _ops.REGISTRY.values() for k, outs in r.backward_outputs}


# forward aten op -> what its backward needs kept from the forward (see :func:`forward_memo`): the registry's
MEMO = {a: need for r in _ops.REGISTRY.values() for a, need in r.aten_memo}


class BackwardCall:
    """The :func:`refkern.compare_backward` call that judges a backward kernel's gradients:
    ``compare_backward({name: got}, op, grad_output, *args, **kwargs)`` for each ``(index, name)`` in
    ``grads`` (``index``: which output of the kernel is the gradient of refkern's argument ``name``);
    or ``unsupported``, why none is. ``skipped``: the gradients it computed that no reference judges
    (label -> why), shown beside the judged ones."""

    def __init__(self, op=None, grad_output=None, args=(), kwargs=None, grads=(), unsupported=None, skipped=None):
        self.op = op
        self.grad_output = grad_output
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.grads = list(grads)
        self.unsupported = unsupported
        self.skipped = dict(skipped or {})  # a gradient the kernel computed and nothing judges: label -> why

    def tensors(self):
        return [self.grad_output, *(a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor))]


def forward_memo(func, b):
    """What the backward of forward op ``func`` (bound arguments ``b``) will need and not receive, or
    None: ``{"eps": eps}`` for a norm, ``{"input": x, "version": x._version}`` for a softmax (its backward
    receives the softmax's output, refkern's gradient is defined at its input)."""
    need = MEMO.get(op_name(func))
    if need == "eps":
        return {"eps": b.get("eps")}
    if need == "input":
        x = b.get("self")
        return {"input": x, "version": x._version, "half_to_float": bool(b.get("half_to_float"))}
    return None


def _masked(mask, pairs):
    mask = list(mask) if mask is not None else [True] * len(pairs)
    return [(i, n) for (i, n), m in zip(pairs, mask) if m and n is not None]


def _zeros_like_bias(sizes, like):
    return torch.zeros(tuple(sizes), dtype=like.dtype) if sizes is not None else None


#: aten backward kernel -> the record of the op whose gradients it computes (the registry's ``aten_backward``)
_KERNELS = {k: r for r in _ops.REGISTRY.values() for k in r.aten_backward}


def backward_call(func, b, memo, present) -> BackwardCall:
    """The :class:`BackwardCall` for backward kernel ``func`` with bound arguments ``b`` (CPU copies),
    ``memo`` (:func:`forward_memo` of its forward, or None where the forward ran outside the audit) and
    ``present(i)`` whether output ``i`` was computed: the reading its op's record names
    (:class:`refkern.ops.Backward`'s ``audit``, one of this module's functions below)."""
    name = op_name(func)
    r = _KERNELS.get(name)
    if r is None:
        return BackwardCall(unsupported=f"{name}: no backward reference in refkern")
    return _ops.resolve_path(r.backward.audit)(name, b, memo, present, r.name)


def _eps_unknown(name):
    return BackwardCall(unsupported=f"{name}: eps (not an argument of the backward) is known only when the forward "
                        "ran inside the audit")  # fmt: skip


def _grads(mask, pairs, present):
    return [(i, n) for i, n in _masked(mask, pairs) if present(i)]


# the readings the records name (refkern.ops.Backward.audit): (kernel, b, memo, present, op) -> BackwardCall


def convolution(name, b, memo, present, op):
    """convolution_backward, the one kernel of every convolution: the op from the weight's dimensions and
    ``transposed``."""
    x, w = b["input"], b["weight"]
    nd = w.dim() - 2
    transposed = bool(b["transposed"])
    rec = _ops.conv_op(transposed, nd)  # the record over the weight's spatial dimensions
    if rec is None:
        return BackwardCall(unsupported=f"{name}: a {nd}-d convolution")
    op = rec.name
    mask = b["output_mask"]
    bias = _zeros_like_bias(b["bias_sizes"], w) if mask[2] else None  # grad_bias needs only its shape
    kw = dict(stride=_tup(b["stride"]), padding=_tup(b["padding"]), dilation=_tup(b["dilation"]), groups=b["groups"])
    if transposed:
        kw["output_padding"] = _tup(b["output_padding"])
    first = "input" if transposed else "x"
    grads = _grads(mask, [(0, first), (1, "weight"), (2, "bias")], present)
    return BackwardCall(op, b["grad_output"], (x, w, bias), kw, grads)


def softmax(name, b, memo, present, op):
    """_softmax_backward_data and _log_softmax_backward_data: at the input the audit kept at the forward."""
    x = _kept_input(op, memo)
    if isinstance(x, BackwardCall):
        return x
    g = b["grad_output"]
    if memo["half_to_float"] or b["input_dtype"] != g.dtype or x.dtype != g.dtype:
        return BackwardCall(unsupported=f"{op} computed in another dtype than its input's (half_to_float, dtype=)")
    if x.numel() and bool((x == float("-inf")).all(dim=b["dim"]).any()):  # _safe_softmax's zero rows
        return BackwardCall(unsupported=f"{op} with rows of -inf only (_safe_softmax's zeros): refkern's softmax "
                            "has no value there")  # fmt: skip
    return BackwardCall(op, g, (x,), {"dim": b["dim"]}, [(0, "input")])


def embedding(name, b, memo, present, op):
    """embedding_dense_backward: the gradient of weight at the indices it received (weight's values do not
    enter: a zero tensor of its shape stands for it)."""
    g, ix = b["grad_output"], b["indices"]
    pad = b["padding_idx"]
    w = torch.zeros((b["num_weights"], g.shape[-1]), dtype=g.dtype)
    kw = {"padding_idx": None if pad == -1 else pad, "scale_grad_by_freq": bool(b["scale_grad_by_freq"])}
    return BackwardCall(op, g, (ix, w), kw, [(0, "weight")])


_REDUCTIONS = ("none", "mean", "sum")  # aten's reduction enum


def nll_loss(name, b, memo, present, op):
    """nll_loss_backward, nll_loss2d_backward: at the log-probabilities and targets it received (total_weight,
    the forward's stored sum of weights, is not needed: refkern's is exact)."""
    kw = {"weight": b["weight"], "reduction": _REDUCTIONS[b["reduction"]], "ignore_index": int(b["ignore_index"])}
    return BackwardCall(op, b["grad_output"], (b["self"], b["target"]), kw, [(0, "input")])


def mse_loss(name, b, memo, present, op):
    """mse_loss_backward: the gradient of its input (the target's is its negation, taken by autograd)."""
    kw = {"reduction": _REDUCTIONS[b["reduction"]]}
    return BackwardCall(op, b["grad_output"], (b["self"], b["target"]), kw, [(0, "input")])


def binary_cross_entropy(name, b, memo, present, op):
    kw = {"weight": b["weight"], "reduction": _REDUCTIONS[b["reduction"]]}
    return BackwardCall(op, b["grad_output"], (b["self"], b["target"]), kw, [(0, "input")])


def layer_norm(name, b, memo, present, op):
    eps = memo.get("eps") if memo else None
    if eps is None:
        return _eps_unknown(name)
    kw = dict(normalized_shape=tuple(b["normalized_shape"]), weight=b["weight"], bias=b["bias"], eps=eps)
    grads = _grads(b["output_mask"], [(0, "input"), (1, "weight" if b["weight"] is not None else None),
                                      (2, "bias" if b["bias"] is not None else None)], present)  # fmt: skip
    return BackwardCall(op, b["grad_out"], (b["input"],), kw, grads)


def rms_norm(name, b, memo, present, op):
    if memo is None:
        return _eps_unknown(name)
    kw = dict(normalized_shape=tuple(b["normalized_shape"]), weight=b["weight"], eps=memo.get("eps"))
    grads = _grads(b["output_mask"], [(0, "input"), (1, "weight" if b["weight"] is not None else None)], present)
    return BackwardCall(op, b["grad_out"], (b["input"],), kw, grads)


def group_norm(name, b, memo, present, op):
    eps = memo.get("eps") if memo else None
    if eps is None:
        return _eps_unknown(name)
    w, mask = b["weight"], b["output_mask"]
    bias = torch.zeros(b["C"], dtype=b["input"].dtype if w is None else w.dtype) if mask[2] else None
    kw = dict(num_groups=b["group"], weight=w, bias=bias, eps=eps)
    grads = _grads(mask, [(0, "input"), (1, "weight" if w is not None else None), (2, "bias")], present)
    return BackwardCall(op, b["grad_out"], (b["input"],), kw, grads)


def batch_norm(name, b, memo, present, op):
    """native_batch_norm_backward (its eps an argument), in training or eval mode."""
    x, w, mask = b["input"], b["weight"], b["output_mask"]
    train = bool(b["train"])
    if not train and (b["running_mean"] is None or b["running_var"] is None):
        return BackwardCall(unsupported=f"{name} in eval mode without running statistics")
    bias = torch.zeros(x.shape[1], dtype=x.dtype if w is None else w.dtype) if mask[2] else None
    kw = dict(weight=w, bias=bias, training=train, eps=b["eps"])
    grads = _grads(mask, [(0, "input"), (1, "weight" if w is not None else None), (2, "bias")], present)
    return BackwardCall(op, b["grad_out"], (x, b["running_mean"], b["running_var"]), kw, grads)


def _kept_input(op, memo):
    """The input the audit kept at ``op``'s forward (for a backward that receives the forward's output), on the
    CPU, or the BackwardCall that says why it cannot be used: released, never kept, or modified in place."""
    if memo is not None and memo.get("released"):
        return BackwardCall(unsupported=f"{op}'s input, kept for the first backward through this graph, was "
                            "released after it")  # fmt: skip
    if memo is None or memo.get("input") is None:
        return BackwardCall(unsupported=f"{op}'s input: its backward receives the {op}'s output, and the forward "
                            "ran outside the audit")  # fmt: skip
    x = memo["input"]
    if x._version != memo["version"]:
        return BackwardCall(unsupported=f"{op}'s input was modified in place after the forward")
    return x.detach().to("cpu")


def elementwise(name, b, memo, present, op):
    """The activations' backward kernels: silu_backward and gelu_backward receive the forward's input;
    tanh_backward and sigmoid_backward its output, so their input is the one the audit kept at the forward (as
    for softmax)."""
    g = b["grad_output"]
    x = b.get("self")
    if x is None:
        x = _kept_input(op, memo)
        if isinstance(x, BackwardCall):
            return x
    if x.dtype != g.dtype or tuple(x.shape) != tuple(g.shape):
        return BackwardCall(unsupported=f"{name} with grad_output of another dtype or shape than the input's")
    params = _ops.get(op).signature.parameters  # the kernel's own arguments that are the op's (gelu's approximate)
    kw = {k: v for k, v in b.items() if k in params and k != "input"}
    return BackwardCall(op, g, (x,), kw, [(0, "input")])


def pool(name, b, memo, present, op):
    """Every pool's aten backward kernel (avg_pool2d_backward, avg_pool3d_backward,
    max_pool2d_with_indices_backward, _adaptive_avg_pool2d_backward; torch runs the 1-d pools as 2-d ones), read
    from its op's record as the audit reads the forward (:func:`refkern.torch.dispatch._pool`): the arguments the
    kernel received that the record's first call names (aten's empty ``stride`` is torch's None, the kernel
    size), an adaptive pool's ``output_size`` the last ``Op.spatial`` sizes of grad_output. Judged at the input it
    received (a maximum's gradient goes where refkern's own forward puts the window's maximum; the kernel's
    ``indices`` are not needed)."""
    rec = _ops.get(op)
    g = b["grad_output"]
    kw = {p: _tup(b[p]) for p in rec.calls[0].params[1:] if p in b}
    if "stride" in kw:
        kw["stride"] = kw["stride"] or None
    if rec.pool == "adaptive_avg":
        kw["output_size"] = tuple(g.shape[-rec.spatial :])
    return BackwardCall(op, g, (b["self"],), kw, [(0, "input")])


def attention(name, b, memo, present, op):
    """The fused attention backward kernels: dq, dk and dv judged as refkern's gradients of
    scaled_dot_product_attention at the query, key, value, mask, causality and scale the kernel received
    (the forward's output and log-sum-exp it also receives are not needed: refkern recomputes them exactly)."""
    p = b.get("dropout_p") or 0.0
    if p:
        return BackwardCall(unsupported=f"attention with dropout_p={p} (a random mask no reference can reproduce)")
    for s in ("cum_seq_q", "cum_seq_k"):
        t = b.get(s)
        if isinstance(t, torch.Tensor) and t.numel():
            return BackwardCall(unsupported=f"{name} with {s}: sequences of several lengths (nested tensors) in one "
                                "batch, no refkern op")  # fmt: skip
    q, k, v = b["query"], b["key"], b["value"]
    mask = b.get("attn_mask", b.get("attn_bias"))
    kw = dict(attn_mask=mask, is_causal=bool(b.get("is_causal")), scale=b.get("scale"))
    if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        kw["enable_gqa"] = True
    flags = b.get("grad_input_mask")  # which of dq, dk, dv (d attn_bias) the efficient kernels compute
    outs = _ATTN_BACKWARD[name]
    grads = _masked(flags, [(i, None if n == "attn_bias" else n) for i, n in enumerate(outs)])
    skipped = {}
    if len(outs) == 4 and mask is not None and (flags is None or flags[3]) and present(3):
        skipped["grad_attn_bias"] = "the gradient of the additive mask: no refkern op"
    g = b.get("grad_out", b.get("grad_out_"))
    return BackwardCall(op, g, (q, k, v), kw, [(i, n) for i, n in grads if present(i)], skipped=skipped)


# The inputs of an autograd node, in its order (its next_functions): the forward op's arguments (the
# registry's; a node several ops share, as ConvolutionBackward0, has one order)
_EDGES = {node: edges for r in _ops.REGISTRY.values() for node, edges in r.autograd}


# nodes whose backward only moves or restates the gradient: a parameter's gradient passes through
_PASS = frozenset("TBackward0 TransposeBackward0 PermuteBackward0 ViewBackward0 UnsafeViewBackward0 "
                  "ReshapeAliasBackward0 UnsqueezeBackward0 SqueezeBackward0 SqueezeBackward1 AliasBackward0 "
                  "CloneBackward0 ToCopyBackward0".split())  # fmt: skip


# (node, which saved operand, the edge of the *other* operand): an mm/bmm reading that saved operand computes
# the other operand's gradient (grad_mat1 = grad @ mat2^T reads mat2, grad_mat2 = mat1^T @ grad reads mat1)
_MM_SAVED = {"AddmmBackward0": (("_saved_mat1", 2), ("_saved_mat2", 1)),
             "MmBackward0": (("_saved_self", 1), ("_saved_mat2", 0)),
             "BmmBackward0": (("_saved_self", 1), ("_saved_mat2", 0))}  # fmt: skip


def leaf(fn, depth=8):
    """The leaf tensor (a parameter) whose gradient an edge of the autograd graph accumulates into,
    through nodes that only move or restate it; None when the edge leads elsewhere."""
    while fn is not None and depth:
        n = fn.name()
        if n == "torch::autograd::AccumulateGrad" or n.endswith("AccumulateGrad"):
            return fn.variable
        if n not in _PASS or not fn.next_functions:
            return None
        fn = fn.next_functions[0][0]
        depth -= 1
    return None


def edge_name(node, i) -> str:
    """The name of input ``i`` of autograd ``node`` ("weight" of a convolution), or "input i"."""
    names = _EDGES.get(node.name())
    return names[i] if names and i < len(names) else f"input {i}"


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # a tensor without storage (a subclass, meta): no match
        return None


def op_edges(node, func, args, outs) -> list:
    """Which input of autograd ``node`` each output of backward op ``func`` is the gradient of (an index
    into ``node.next_functions``, or None where that is not known)."""
    name, kind = node.name(), op_name(func)
    if kind in _BACKWARD:  # the backward kernel of the node's op: its outputs in the node's input order
        return list(range(len(outs)))
    if kind in ("mm", "bmm") and name in _MM_SAVED:
        found = set()
        ptrs = {_storage(a) for a in args if isinstance(a, torch.Tensor)}
        for attr, edge in _MM_SAVED[name]:
            try:
                saved = getattr(node, attr)
            except Exception:  # not saved (its gradient is not needed), or released
                continue
            if isinstance(saved, torch.Tensor) and _storage(saved) in ptrs:
                found.add(edge)
        return [found.pop() if len(found) == 1 else None] + [None] * (len(outs) - 1)
    if kind == "sum" and outs and isinstance(outs[0], torch.Tensor):  # a bias's gradient: the parameter of its size
        hits = [i for i, (fn, _) in enumerate(node.next_functions) if (p := leaf(fn)) is not None
                and p.numel() == outs[0].numel()]  # fmt: skip
        return [hits[0] if len(hits) == 1 else None] + [None] * (len(outs) - 1)
    return [None] * len(outs)
