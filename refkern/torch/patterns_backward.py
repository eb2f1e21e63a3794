"""A composed pattern's backward pass (:mod:`refkern.torch.patterns` finds the pattern in the forward stream):
hooks on the autograd nodes of its ops gather the gradient of its output and its ops' contributions to the
gradients of its inputs (:func:`watch`), which are then judged whole against the exact gradient of the one
operation the pattern computes (:func:`judge_backward`)."""

import torch

from refkern.torch._pattern import Pattern, cpu_of, judge

__all__ = ["watch", "judge_backward"]

_WALK = 64  # the most autograd nodes a walk from a pattern's output back to its inputs visits (a pattern has < 20)


def _is_edge(fn, nr, t):
    """Whether edge ``(fn, nr)`` of an autograd node leads to tensor t: t's own node and output, or, for a leaf,
    the node that accumulates its gradient."""
    if fn is None:
        return False
    if t.grad_fn is not None:
        return fn is t.grad_fn and nr == t.output_nr
    return getattr(fn, "variable", None) is t


def _edges(start, wrt):
    """{name: [(node, i)]}: every edge of the autograd graph from node ``start`` (a pattern's output) back to the
    tensors ``wrt`` ({name: tensor}) that does not pass through one of them: the pattern's own uses of its
    inputs, whose gradients sum to the pattern's gradient of each. None where the walk visits more than _WALK
    nodes before it ends (the pattern's subgraph is then not what the forward matched)."""
    found = {k: [] for k in wrt}
    seen, todo = {id(start)}, [start]
    while todo:
        n = todo.pop()
        for i, (fn, nr) in enumerate(n.next_functions):
            hit = next((k for k, t in wrt.items() if _is_edge(fn, nr, t)), None)
            if hit is not None:
                found[hit].append((n, i))
            elif fn is not None and id(fn) not in seen:
                seen.add(id(fn))
                if len(seen) > _WALK:
                    return None
                todo.append(fn)
    return found


def _paired(theta, d, convention):
    """Whether the rotary's angles are equal within each rotated pair (Llama's ``cat(freqs, freqs)``, GPT-J's
    ``repeat_interleave(2)``): then rotate's transpose is ``-rotate`` at the same angles and the gradient of q
    is the rotation of the output's gradient by ``-theta``."""
    t = theta if theta.shape[-1] == d else theta.expand(*theta.shape[:-1], d)
    if convention == "half":
        return bool(torch.equal(t[..., : d // 2], t[..., d // 2 :]))
    return bool(torch.equal(t[..., 0::2], t[..., 1::2]))


class _Watch:
    """The state of one pattern's backward: the output's gradient (from a pre-hook on its node) and each
    input's contributions (from hooks on the nodes that used it), cloned as they arrive (autograd then adds
    into the first of them in place)."""

    def __init__(self, p, wrt, edges, done):
        self.p, self.done, self.names = p, done, tuple(edges)  # no node held: a hook's node holds this
        self.need = sum(len(v) for v in edges.values())
        self.versions = {k: t._version for k, t in wrt.items()}
        self.wrt = {k: t.detach() for k, t in wrt.items()}  # no reference to the graph: no cycle through a hook
        self.reset()

    def reset(self):
        self.gy, self.parts, self.got = None, {k: [] for k in self.names}, 0

    def output(self, grad_outputs):
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():
            self.reset()  # a new backward pass through this graph (retain_graph) starts here
            g = grad_outputs[self.p.out_nr] if self.p.out_nr < len(grad_outputs) else None
            self.gy = None if g is None else g.detach().clone()

    def node(self, name, index, grad_inputs):
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():
            g = grad_inputs[index] if index < len(grad_inputs) else None
            if g is not None:
                self.parts[name].append(g.detach().clone())
            self.got += 1
            if self.got == self.need and self.gy is not None and all(self.parts.values()):
                self.finish()

    def finish(self):
        """Each input's gradient, its contributions summed in the order they arrived and in their dtype, as
        autograd's input buffer adds them (where the input has no other use, that sum is its gradient)."""
        grads = {}
        for k, parts in self.parts.items():
            acc = parts[0]
            for g in parts[1:]:
                acc = acc + g
            grads[k] = acc
        p, changed = self.p, [k for k, t in self.wrt.items() if t._version != self.versions[k]]
        kw = dict(grads=grads, grad_output=self.gy, phase="backward", forward=p)
        if changed:
            kw["unsupported"] = f"{', '.join(changed)} modified in place after the forward"
        if p.kind == "rms_norm":
            kw.update(x=self.wrt["input"], weight=p.weight, eps=p.eps, d=p.d)
        else:
            kw.update(theta=p.theta, scale=p.scale, convention=p.convention)
        self.reset()
        self.done(Pattern(p.kind, _backward_name(p.name), self.gy, **kw))


def _backward_name(name):
    """'rms_norm backward (composed: ...)' for 'rms_norm (composed: ...)'."""
    head, sep, rest = name.partition(" (")
    return f"{head} backward{sep}{rest}"


def watch(p, done):
    """Judge pattern ``p`` (found in a forward pass that autograd recorded) in the backward pass too: hooks on
    the autograd nodes of its ops call ``done(Pattern)`` once a backward pass has computed the gradient of its
    output and every contribution of its ops to the gradients of its inputs (q for a rotary; x, and the weight
    where it is a parameter the stream used as such, for an rms_norm). That Pattern (``phase`` "backward")
    holds ``grads`` ({"input": ..., "weight": ...}), ``grad_output`` and what :func:`judge_backward` needs.
    Returns whether the hooks were set: not where autograd did not record the output, no input needs a
    gradient, or a rotary's angles differ within a rotated pair (its gradient is then not a rotation)."""
    y = p.out
    if not isinstance(y, torch.Tensor) or y.grad_fn is None:
        return False
    if p.kind == "rms_norm":
        wrt = {"input": p.x, "weight": getattr(p, "param", None)}
    else:
        if not _paired(p.theta, p.q.shape[-1], p.convention):
            return False
        wrt = {"input": p.q}
    wrt = {k: t for k, t in wrt.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    edges = _edges(y.grad_fn, wrt) if "input" in wrt else None
    if not edges or not edges["input"]:
        return False
    edges = {k: v for k, v in edges.items() if v}
    w = _Watch(p, wrt, edges, done)
    p.out_nr = y.output_nr
    y.grad_fn.register_prehook(w.output)
    for name, pairs in edges.items():
        for node, i in pairs:
            node.register_hook(lambda gi, go, name=name, i=i: w.node(name, i, gi))
    p.out = p.x = p.q = p.param = None  # the graph's tensors: the hooks hold none (no cycle through them)
    return True


def judge_backward(p, sample=None):
    """({"input": Report, "weight": Report}, number of elements sampled or 0) of a backward pattern from
    :func:`watch`. An rms_norm's gradients by :func:`refkern.compare_backward` of ``rms_norm`` at the forward's
    input, weight and epsilon and the output's gradient: the verdict of a fused rms_norm backward, each
    gradient against the exact one. A rotary's: with the angles equal within each pair, ``rotate``'s transpose
    is ``-rotate``, so the exact gradient of q is ``s (g cos theta - rotate(g) sin theta)``, the rotation of the
    output's gradient g by ``-theta``, judged by :func:`refkern.analysis.rotary.compare_rotary` (its yardstick:
    the same cos and sin, the two products and the sum, each rounded in the gradient's dtype, as autograd's
    ``g * cos``, ``g * sin``, the selections' transposes and the sum of the contributions compute it), with
    ``sample`` on at most that many elements, whole rows."""
    if getattr(p, "unsupported", None):
        raise ValueError(p.unsupported)
    if p.kind == "rms_norm":
        from refkern.gradients import compare_backward

        got = {k: cpu_of(g) for k, g in p.grads.items()}
        return compare_backward(got, "rms_norm", cpu_of(p.grad_output), cpu_of(p.x), normalized_shape=(p.d,),
                                weight=cpu_of(p.weight), eps=p.eps), 0  # fmt: skip
    rot = Pattern("rotary", p.name, p.grads["input"], q=p.grad_output, theta=-p.theta, scale=p.scale,
                  convention=p.convention)  # fmt: skip
    rep, sampled = judge(rot, None, sample)
    return {"input": rep}, sampled
