"""``refkern.backward`` and ``refkern.compare_backward``: the exact gradients of the products and
convolutions, each one *adjoint call* of an exact forward kernel.

The gradient of a sum of products with respect to one of its factors is again a sum of
products: every forward term ``l * r`` that reaches output element I puts the term
``grad_output[I] * r`` into the gradient of l's element. Each gradient element is therefore
an exact sum of products, and computing it as one forward call of an exact refkern kernel (on
rearranged operands) gives it correctly rounded, rounded once, in the argument's dtype (as torch
returns it). The adjoint calls:

* ``linear(x, W, b)``: grad_x = ``matmul(grad_output, W)``; grad_W = ``matmul(g2.T, x2)`` with the
  leading dimensions flattened (g2: (M, out), x2: (M, in)); grad_b = ``sum(g2, dim=0)``.
* ``matmul(a, b)`` (torch.matmul semantics): grad_a = ``matmul(G, B^T)`` and grad_b =
  ``matmul(A^T, G)`` per batch element; the batch dimensions over which an operand was broadcast
  are moved into the reduction dimension K, so a broadcast operand's gradient is still one
  exact sum, rounded once (torch sums rounded per-batch products).
* ``conv{n}d(x, W, b, stride s, padding (lo, hi), dilation d, groups)`` (padding_mode "zeros"): grad_x =
  ``conv_transpose{n}d(grad_output, W, stride=s, padding=lo, output_padding=lo - hi + rem,
  dilation=d, groups)`` (rem: the positions past the last window); grad_W = ``conv{n}d(X'', G'',
  stride=d, dilation=s, groups)`` with X'' the padded input as (C_in / groups, groups * N, ...)
  (batch and channels swapped) and G'' grad_output as (C_out, N, ...); grad_b = ``sum`` over the
  batch and spatial dimensions. With padding_mode "reflect", "replicate" or "circular" (the padded
  input a gather of x), grad_x is one exact sum per element over every (output, tap) pair whose
  padded position holds it: a batched ``matmul`` of gathered rows (:class:`_Fold`).
* ``cumsum(x, dim)``: grad_x = ``cumsum(flip(grad_output, dim), dim)`` flipped back; ``dot(x, y)``: grad_x =
  ``matmul(g[None], y[None, :])`` (one product per element), grad_y likewise.
* ``conv_transpose{n}d(input, W, b, stride s, padding p, output_padding a, groups, dilation d)``:
  grad_input = ``conv{n}d(G_p, W, stride=s, dilation=d, groups)`` with G_p grad_output padded by
  (p, p - a) zeros; grad_W = ``conv{n}d(G_p'', X'', stride=d, dilation=s, groups)``; grad_b = ``sum``.

:func:`compare_backward` judges a backend's gradient by :func:`refkern.compare` on the same adjoint
call, so the bounds, emulated precisions and structure tests of the forward op apply unchanged;
its Reports index the adjoint call's output (the gradient itself, or its transpose for grad_W
of a convolution).
"""

import refkern.ops as _ops
from refkern.kernels._grad import Adjoint, _shape
from refkern.ops._bind import bind as _bind

__all__ = ["backward", "compare_backward", "adjoints", "differentiable", "broadcast_operands", "Adjoint", "OPS"]

#: the ops with a backward, in registry order (each record's :class:`~refkern.ops.Backward` names its rule)
OPS = _ops.names(backward=True)


def _op_name(op, who) -> str:
    return _ops.lookup(op, who, among=OPS)


def _rule(name):
    """The backward rule of op ``name`` (its record's): ``rule(name, grad_output, bound, wrt, who)``."""
    return _ops.resolve_path(_ops.get(name).backward.rule)


def _reference(name):
    """The reference function of op ``name`` (the registry's), which :meth:`Adjoint.run` calls."""
    return _ops.get(name).reference


def _given(a, k) -> bool:
    """Whether argument ``k`` of the bound call ``a`` was given as something with a gradient: not None, and not
    integers (cross_entropy's class-index target is differentiable only as probabilities)."""
    import numpy as np

    from refkern._arrays import is_tensor

    v = a.get(k)
    if v is None:
        return False
    if is_tensor(v):
        return bool(v.is_floating_point())
    return np.asarray(v).dtype.kind not in "iub"


def differentiable(op, args, kwargs, who="backward") -> dict:
    """``{name: value}`` of the differentiable arguments of ``op(*args, **kwargs)`` that were given
    (not None, not integers), bound by the op's signature."""
    name = _op_name(op, who)
    a = _bind(name, args, kwargs, who)
    return {k: a[k] for k in _ops.get(name).differentiable if _given(a, k)}


def broadcast_operands(name, bound, wrt) -> tuple:
    """The arguments of ``wrt`` that are array operands of op ``name`` (its differentiable ones) broadcast against
    the others: a shape other than the broadcast shape of them all (a gradient summed over the broadcast
    dimensions, autograd's ``sum_to``)."""
    import numpy as np

    shapes = {k: tuple(np.shape(bound[k])) for k in _ops.get(name).differentiable
              if hasattr(bound.get(k), "shape") and hasattr(bound.get(k), "dtype")}  # fmt: skip
    full = np.broadcast_shapes(*shapes.values()) if shapes else ()
    return tuple(k for k in wrt if k in shapes and shapes[k] != tuple(full))


def adjoints(op, grad_output, *args, wrt=None, who="backward", **kwargs) -> dict:
    """The :class:`Adjoint` call of every gradient asked for (all differentiable arguments given,
    without ``wrt``), validated as torch validates the forward call."""
    name = _op_name(op, who)
    diff = _ops.get(name).differentiable
    a = _bind(name, args, kwargs, who)
    given = tuple(k for k in diff if _given(a, k))
    if wrt is None:
        wrt = given
    elif isinstance(wrt, str):
        wrt = (wrt,)
    for k in wrt:
        if k not in diff:
            raise ValueError(f"{who}: {name} has no differentiable argument {k!r}; choose among {', '.join(diff)}.")
        if a.get(k) is None:
            raise ValueError(f"{who}: wrt names {k!r}, but {name} was called without it.")
    return _rule(name)(name, grad_output, a, tuple(wrt), who)


def backward(op, grad_output, *args, wrt=None, **kwargs) -> dict:
    """Exact gradients of ``op(*args, **kwargs)`` for ``grad_output``: ``{argument name: gradient}``.

    ``op``: "linear", "matmul", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "scaled_dot_product_attention", "sum", "mean", "var", "std", "cumsum", "dot", the losses,
    "embedding" and the elementwise ops (:data:`OPS`, the registry's ops with a backward; or the refkern function); the
    arguments are exactly the op's (same names: ``x``/``weight``/``bias``, ``a``/``b``,
    ``input``/``weight``/``bias``, ``input``/``dim``, ``input``/``normalized_shape``/``weight``/``bias``/``eps``,
    ``x``/``dim``/``keepdim``/``dtype``/``correction``, ``x``/``y``), and
    ``grad_output`` has the op's output shape and dtype. ``wrt``: the argument
    names whose gradients to compute (default: every differentiable argument given); only those are
    computed. pow's tensor operand broadcast against the other one gets autograd's gradient, the sum of the
    elementwise gradients over the broadcast dimensions, exact and rounded once (its record's ``broadcast``:
    :mod:`refkern.kernels.pow_backward`).

    **Guarantee.** Every element of every gradient is the exact sum of its products (each forward
    term ``l * r`` reaching output I contributes ``grad_output[I] * r`` to l's gradient), summed
    over the whole batch and every broadcast dimension, rounded once, to nearest even, to the
    argument's dtype, as torch returns it. Each gradient is one *adjoint call* of an exact refkern
    kernel (:mod:`refkern.gradients`), so the guarantee is the forward kernels' own. softmax and
    log_softmax: the real-valued derivative of the definition at the given inputs, ``y_i (g_i -
    sum_j g_j y_j)`` and ``g_i - y_i sum_j g_j`` with ``y`` the exact softmax, rounded once
    (:mod:`refkern.kernels.softmax_backward`; with ``dtype=``, at the input converted to that dtype, rounded
    once to the input's dtype, as autograd converts the gradient back). layer_norm and rms_norm: with
    ``r = (var + eps)**(-1/2)`` (exact mean, biased variance; rms_norm: ``mean(x**2)``, no centring),
    ``xhat = (x - mean) r`` and ``gw = grad_output * weight``, ``grad_input = r (gw - mean(gw) - xhat
    mean(gw xhat))`` (no ``mean(gw)`` for rms_norm), ``grad_weight`` and ``grad_bias`` the sums over
    the rows of ``grad_output * xhat`` and ``grad_output``, each real-valued and rounded once to its
    argument's dtype (:mod:`refkern.kernels.norm_backward`). group_norm: the same over each (sample,
    group), grad_weight and grad_bias summed over (sample, spatial) per channel; batch_norm with
    ``training=True``: the same over each channel's (N, spatial) elements (the gradient flows through
    the batch statistics); with ``training=False``: the affine map of the running statistics, ``g w /
    sqrt(rv + eps)``, ``sum g (x - rm) / sqrt(rv + eps)``, ``sum g`` (:mod:`refkern.kernels.batch_norm_backward`).
    Poolings: each element of grad_input the exact sum of ``g_o / d_o`` over the average windows that
    hold it, or of ``g_o`` over the windows whose selected maximum it is (torch's CPU choice: the first of
    equal maxima), rounded once (:mod:`refkern.kernels.pool_backward`). scaled_dot_product_attention:
    ``query``, ``key``, ``value`` from ``P = softmax(scale q k^T + mask)`` (real exp), ``dv = P^T dO``,
    ``dS = P (dO v^T - rowsum(dO O))``, ``dq = scale dS k``, ``dk = scale dS^T q``, summed over the batches
    that read each element, rounded once (:mod:`refkern.kernels.attention_backward`; dropout_p > 0 and
    non-finite inputs are refused). Reductions: ``sum``, ``g`` over the reduced dims (exact; with ``dtype=``
    converted once); ``mean``, ``g / n``; ``var``, ``2 g (x - mean) / (n - correction)``; ``std``, ``g (x - mean) /
    ((n - correction) std)``, each real-valued with the exact mean and std, rounded once
    (:mod:`refkern.kernels.reduction_backward`; with ``dtype=``, at the converted input, rounded once to the
    input's dtype); where it has no real value (``n - correction <= 0``, std at a zero variance, NaN or
    infinite inputs) the IEEE value torch's autograd formula gives. ``cumsum``: ``sum_{j >= i} g_j`` along
    dim, one exact sum rounded once (the forward cumsum of the flipped grad_output); ``dot``: ``g y`` and
    ``g x``, one product each.

    A convolution with ``padding_mode`` "reflect", "replicate" or "circular": the gradient of ``x``
    folds the padded border back onto the input, each element one exact sum of every product that
    reaches it through any padded position (:class:`_Fold`), rounded once.

    Returns numpy arrays, or CPU tensors when any input is a tensor.
    """
    name = _op_name(op, "backward")
    summed, rb = (), _ops.get(name).backward
    if rb.broadcast is not None:  # operands broadcast against the others: autograd's sum of elementwise gradients
        bound = _bind(name, args, kwargs, "backward")
        asked = tuple(differentiable(name, args, kwargs)) if wrt is None else (wrt,) if isinstance(wrt, str) else wrt
        summed = broadcast_operands(name, bound, asked)
    rest = tuple(k for k in asked if k not in summed) if summed else wrt
    adj = {} if summed and not rest else adjoints(op, grad_output, *args, wrt=rest, **kwargs)
    out = {k: a.run(_reference) for k, a in adj.items()}
    for k in summed:
        out[k] = _ops.resolve_path(rb.broadcast)(grad_output, bound, k, "backward")
    return {k: out[k] for k in asked if k in out} if summed else out


def compare_backward(actual_grads: dict, op, grad_output, *args, rtol=None, atol=None, **kwargs) -> dict:
    """Judge a backend's gradients: ``{argument name: Report}``, one per entry of ``actual_grads``.

    ``actual_grads`` maps argument names (``"x"``, ``"weight"``, ``"bias"``, ``"a"``, ``"b"``,
    ``"input"``) to the backend's gradients (e.g. ``{"weight": conv.weight.grad}``); ``op``,
    ``grad_output`` and the arguments are those of :func:`backward`. Each gradient is judged by
    :func:`refkern.compare` on its adjoint call (the forward call whose exact result it is), so the
    verdicts (``exact``, ``rounding``, ``reduced-precision`` with the precision, ``mismatch``), the
    bounds, the emulated precisions and the structure tests are those of that forward op. A
    Report indexes the adjoint call's output: the gradient itself, except grad_weight of a
    convolution, which is judged as (C_in / groups, C_out, ...) (its first two axes swapped).
    softmax and log_softmax gradients are judged by the worst-case envelope of a correct float32
    (float64) implementation that differentiates from its own stored forward
    (:mod:`refkern.analysis._envelope_backward`): ``exact``, ``rounding`` or ``mismatch``; so are the
    layer_norm, rms_norm, group_norm and batch_norm gradients (the envelope of torch's CPU kernels'
    forms, same module), and the scaled_dot_product_attention gradients (``attention_bound``: torch's math
    backend and a flash backward, every intermediate possibly stored in the dtype). sum's gradient must be
    bit-exact (a copy: ``exact`` or ``mismatch``); mean's, var's and std's are judged by ``mean_bound`` and
    ``var_bound`` (same module: ``g * fl(1 / n)`` in the working precision; torch's ``(2 / dof) * g * (x -
    mean^)`` with the stored mean's cancellation and std's stored forward); cumsum's by compare's cumsum on the
    flipped grad_output, dot's by compare's matmul (K = 1). The gradient of pow's operand broadcast against the
    other (a sum of elementwise gradients, autograd's ``sum_to``) is judged by
    :func:`refkern.analysis.elementwise_grad.judge_reduced`: each term within its elementwise bound, summed in any
    order.
    """
    from refkern.analysis.gradients import judge

    if not isinstance(actual_grads, dict):
        raise TypeError(
            f"compare_backward: actual_grads must be a dict of argument name to gradient; got "
            f"{type(actual_grads).__name__}."
        )
    name = _op_name(op, "compare_backward")
    bound = _bind(name, args, kwargs, "compare_backward")
    summed = ()  # pow's operands broadcast against the other: autograd's sum of elementwise gradients
    if _ops.get(name).error_model == "elementwise":
        from refkern.analysis.elementwise_grad import reduced_arguments

        summed = reduced_arguments(name, bound, tuple(actual_grads))
    rest = tuple(k for k in actual_grads if k not in summed)
    adj = adjoints(op, grad_output, *args, wrt=rest, who="compare_backward", **kwargs) if rest or not summed else {}
    out = {}
    for k, got in actual_grads.items():
        want = _shape(bound[k])
        if _shape(got) != want:
            raise ValueError(
                f"compare_backward: the gradient of {k} must have the shape of {k}, {want}; got shape {_shape(got)}."
            )
        if k in summed:
            from refkern.analysis.elementwise_grad import judge_reduced

            out[k] = judge_reduced(name, k, got, grad_output, bound, rtol=rtol, atol=atol)
            continue
        out[k] = judge(name, k, adj[k], got, grad_output, bound, rtol=rtol, atol=atol)
    return out
