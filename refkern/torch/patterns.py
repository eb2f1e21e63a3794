"""Composed operations in the audit's op stream, judged whole (issue 26): Hugging Face's RMSNorm and the
rotary position embedding are written as five to ten small aten ops, each judged on its own by the audit
(all bit-exact or within their rounding), so a bug spread over them (a stray epsilon, ``w + 1`` for
``w``, a rotation with the wrong angles) passes op by op. :class:`Matcher` follows the stream (which op
made each tensor, from which tensors) and names the two patterns:

- **rms_norm**: a module whose forward computes ``rsqrt(mean(x**2, -1, keepdim=True) + eps)`` of a
  tensor x (``pow(x, 2)`` or ``x * x``, after a widening ``x.to(float32)``; ``pow(v, -0.5)`` for the
  rsqrt too) and returns a tensor made from it (Llama, Qwen2, Mistral, T5, Gemma). Its input x and its
  output are judged by :func:`refkern.compare` as ``rms_norm(x, (d,), weight, eps)``, with the weight and
  epsilon the module holds (``weight``; ``variance_epsilon``, ``eps`` or ``epsilon``): what the module
  is, not what the stream did with them, so that ``(w + 1) * h`` for ``w * h`` and a second epsilon
  are its failure. Modules whose weight is an offset by definition (Gemma's ``x (1 + w)``,
  :data:`OFFSET_WEIGHT`) are judged with ``1 + w``. A module without a weight: the stream's last
  multiplication by a tensor of d elements, if any. **Inline**: a statistic whose module does not return
  the normalised tensor (an RMSNorm written out inside an attention or MLP module), where ``x * r`` (r the
  statistic, x its input or its widened copy), through conversions, views and products by tensors, reaches
  an op that is none of those (the projection that consumes it): that op's operand is the output, judged
  with the stream's own epsilon and weight (its last product by a tensor of d elements): there is no
  module to say what they should be, so what it judges is the composition (a statistic summed in the
  input's bfloat16, say), not the constants.
- **rotary**: ``add(mul(q, C), mul(R, S))`` where C is, through views, a conversion and a scaling by a
  number, ``cos(theta)``, and R is q rotated: made from q by selections, negations and concatenations
  that, replayed on a probe, give ``rotate_half`` (``cat(-q[..., d/2:], q[..., :d/2])``, Llama) or GPT-J's
  interleaved pairs; anything else (``q.roll(1, -1)``) is not a rotary and is judged op by op only.
  Judged by :func:`refkern.analysis.rotary.analyse` against the exact ``s (q cos theta + R sin theta)``
  in that convention: S is not read from the stream, so a wrong sine (a cosine in its place, another
  angle) is the pattern's failure. theta is cos's input, or, where the stream reduced the angle itself
  before the cosine (``theta - k c``, ``remainder``, ``fmod``), the angle before that reduction.

**Backward.** Where autograd recorded the pattern (a training step), :meth:`Matcher.watch` puts hooks on the
autograd nodes of its ops: a pre-hook on the output's node takes its gradient g, a hook on each node that used an
input (found by walking the graph back from the output to the input) takes that use's contribution to the
input's gradient; once all have come they are summed in arrival order and in their dtype, as autograd's input
buffer adds them: the pattern's own gradient of x (of q), without x's other uses (a residual). An rms_norm's
gradients of x and, where the stream multiplied by the module's own parameter, of its weight are judged by
:func:`refkern.compare_backward` of ``rms_norm`` (:func:`judge_backward`); a rotary's gradient of q, with the
angles equal within each rotated pair, is the rotation of g by ``-theta`` and is judged as the forward is. The
hooks hold no tensor of the graph (the input detached, copies of the weight and angles): no reference cycle
through a node keeps a graph alive.

The matcher holds few activations: the angles of each cosine (a few rows of position times frequency)
while the cosine's result lives, the minuend ``a`` of each ``a - f(a)`` (a range reduction, or a
hand-written ``x - mean(x)``) while the difference lives, and an RMS statistic's input until its
module returns (or its inline output is consumed); integer index tensors of views. Everything else is weak references.
"""

import weakref

import torch

from refkern.torch import dispatch as dsp

__all__ = ["Matcher", "Pattern", "OFFSET_WEIGHT"]

#: Modules whose RMSNorm multiplies by ``1 + weight`` by definition (transformers 5.x, ``1.0 + self.weight``
#: in their forward): judged with that weight.
OFFSET_WEIGHT = frozenset(("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "Gemma3nRMSNorm", "Qwen3NextRMSNorm",
                           "PaliGemmaRMSNorm", "RecurrentGemmaRMSNorm", "ShieldGemma2RMSNorm", "T5GemmaRMSNorm",
                           "VaultGemmaRMSNorm", "Gemma3TextRMSNorm", "DiaRMSNorm"))  # fmt: skip
_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
_PLAIN = frozenset(("_to_copy", "clone", "contiguous", "alias", "detach", "lift_fresh", "lift_fresh_copy"))
_DEPTH = 12  # how far back a walk through the stream goes


class _In:
    """One tensor argument of a recorded op: the node that made it (None: a leaf, such as a parameter or
    the model's input) and a weak reference to the tensor."""

    __slots__ = ("node", "ref")

    def __init__(self, node, t):
        self.node = node
        self.ref = weakref.ref(t)

    def tensor(self):
        return self.ref()

    def same(self, other):
        return (self.node is not None and self.node is other.node) or (
            self.node is None and other.node is None and self.ref() is other.ref() is not None
        )


class _Node:
    __slots__ = ("op", "func", "args", "kwargs", "ins", "counted", "keep", "shape", "view")

    def __init__(self, op, func, args, kwargs, ins, counted, shape):
        self.op, self.func, self.args, self.kwargs = op, func, args, kwargs
        self.ins = ins  # the tensor arguments (_In), in order; args/kwargs hold them as _In too
        self.counted = counted  # the audit judged it (not a view or a copy)
        self.keep = None  # tensors held: cos/sin: the angle
        self.shape = shape
        self.view = bool(getattr(func, "is_view", False))


class Pattern:
    """A composed operation found: ``kind`` ("rms_norm", "rotary"), its name in the audit ("rms_norm
    (composed: pow, mean, add, rsqrt, mul, mul)"), the tensors it is judged on, and where it ran."""

    def __init__(self, kind, name, out, **kw):
        self.kind, self.name, self.out = kind, name, out
        self.__dict__.update(kw)


def _param(w):
    """The weight an rms_norm pattern is judged with, where it is a parameter (a leaf with a gradient) the stream
    multiplied by itself, whose gradient its backward then judges too; else None (``1 + w``, no weight)."""
    return w if isinstance(w, torch.Tensor) and w.is_leaf and w.requires_grad else None


def _scalar(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dim() == 0 and not v.requires_grad:
        return float(v.item())
    return None


class Matcher:
    """Follows every op the audit sees in the forward pass (:meth:`see`) and module returns (:meth:`done`);
    both return the :class:`Pattern` s completed, which :meth:`watch` then follows into the backward pass."""

    def __init__(self):
        self._by_id = {}  # id(tensor) -> (weakref, node)
        self._size = 1024
        self._rms = {}  # id(module) -> [statistic], while the module runs
        self._held = {}  # id(node of a reduction a - f(a)) -> a, while the reduction's result lives
        self._later = []  # (weakref to a pattern's output, the pattern, done): watched once autograd has its node
        self.errors = []  # what went wrong inside the matcher (never raised into the model)

    def watch(self, p, done):
        """:func:`watch` pattern p, now where autograd has recorded its output, else at the next op the matcher
        sees (a rotary is found at its own add, inside the dispatch, before autograd makes the add's node)."""
        y = p.out
        if isinstance(y, torch.Tensor) and y.grad_fn is None and not y.requires_grad:
            p.out = None
            self._later.append((weakref.ref(y), p, done))
            return None
        return watch(p, done)

    def _watch_later(self):
        later, self._later = self._later, []
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():
            for ref, p, done in later:
                p.out = ref()
                try:
                    watch(p, done)
                except Exception as exc:  # the matcher must never break the audit
                    self.errors.append(f"{p.name}: {type(exc).__name__}: {exc}")

    # -------------------------------------------------------------- the stream
    def _in(self, t):
        e = self._by_id.get(id(t))
        return _In(e[1] if e is not None and e[0]() is t else None, t)

    def _wrap(self, v, ins):
        if isinstance(v, torch.Tensor):
            i = self._in(v)
            ins.append(i)
            return i
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(self._wrap(x, ins) for x in v)
        return v

    def see(self, func, args, kwargs, out, module, kind):
        """Record one op (forward pass only); returns the patterns it completes (a rotary at its add)."""
        try:
            return self._see(func, args, kwargs, out, module, kind)
        except Exception as exc:  # the matcher must never break the audit
            self.errors.append(f"{dsp.op_name(func)}: {type(exc).__name__}: {exc}")
            return []

    def _see(self, func, args, kwargs, out, module, kind):
        if self._later:
            self._watch_later()
        outs = dsp._tensors(out)
        if not outs:
            return []
        ins = []
        a = tuple(self._wrap(v, ins) for v in args)
        k = {n: self._wrap(v, ins) for n, v in (kwargs or {}).items()}
        name = dsp.op_name(func)
        node = _Node(name, func, a, k, ins, kind not in ("move",), tuple(outs[0].shape))
        if kind == "move":  # keep the integer tensors a replay of this view needs (index's indices)
            node.keep = [t.tensor() for t in ins[1:] if t.tensor() is not None and not t.tensor().is_floating_point()]
        found = []
        if self._rms and node.counted and not self._normalising(node):
            found += self._inline(ins)
        if name in ("cos", "sin") and ins:
            node.keep = self._angle(ins[0])
        elif self._reduction(node):  # an angle reduced before a cosine, maybe: its angle kept while it lives
            self._held[id(node)] = ins[0].tensor()
            weakref.finalize(outs[0], self._held.pop, id(node), None)
        stat = self._rms_stat(node) if name in ("rsqrt", "pow", "reciprocal") and ins and module is not None else None
        if stat is not None:
            stat["module"] = module
            self._rms.setdefault(id(module), []).append(stat)
        elif node.counted and module is not None:
            for stat in self._rms.get(id(module), ()):
                stat["ops"].append(name)
        if name == "add" and len(ins) == 2 and _scalar(k.get("alpha", 1)) == 1.0:
            found += self._rotary(node, outs[0])
        for t in outs:
            self._by_id[id(t)] = (weakref.ref(t), node)
        if len(self._by_id) > 2 * self._size:
            self._by_id = {i: e for i, e in self._by_id.items() if e[0]() is not None}
            self._size = max(1024, len(self._by_id))
        return found

    @staticmethod
    def _ancestor(n, target, depth=_DEPTH):
        """Whether node ``target`` made (a tensor that went into) node n, within ``depth`` steps."""
        seen, todo = set(), [(n, 0)]
        while todo:
            m, d = todo.pop()
            if m is None or id(m) in seen or d > depth:
                continue
            if m is target:
                return True
            seen.add(id(m))
            todo += [(i.node, d + 1) for i in m.ins]
        return False

    def _reduction(self, n):
        """Whether node n is ``a - f(a)``, ``remainder(a, c)`` or ``fmod(a, c)`` of a float a (a range reduction)."""
        if n.op not in ("sub", "remainder", "fmod") or not n.ins or n.ins[0].tensor() is None:
            return False
        if not n.ins[0].tensor().is_floating_point():
            return False
        return n.op != "sub" or (len(n.ins) == 2 and n.ins[0].node is not None
                                 and self._ancestor(n.ins[1].node, n.ins[0].node, 6))  # fmt: skip

    def _angle(self, i):
        """The angle a cosine or sine is taken of: its input, or the angle before a reduction the stream did
        itself (``a - f(a)``, ``remainder(a, c)``, ``fmod(a, c)``); the tensor, held."""
        t = i.tensor()
        for _ in range(4):
            n = i.node
            held = self._held.get(id(n)) if n is not None else None
            if held is None:
                break
            i, t = n.ins[0], held
        return t

    def _rms_stat(self, node):
        """The RMS statistic ``rsqrt(mean(x**2, -1, keepdim=True) + eps)`` ending at ``node`` (rsqrt, pow(., -0.5),
        reciprocal(sqrt(.))), or None: {x, eps, ops, end}."""
        ops = [node.op]
        if node.op == "pow" and _scalar(node.args[1] if len(node.args) > 1 else None) != -0.5:
            return None
        n = node.ins[0].node
        if node.op == "reciprocal":
            if n is None or n.op != "sqrt":
                return None
            ops.insert(0, "sqrt")
            n = n.ins[0].node
        eps = 0.0
        while n is not None and n.op == "add" and len(n.args) > 1:
            other = n.args[1].tensor() if isinstance(n.args[1], _In) else n.args[1]  # a number, or a 0-d tensor
            if _scalar(other) is None or not isinstance(n.args[0], _In):
                break
            eps += _scalar(other)
            ops.insert(0, "add")
            n = n.args[0].node
        if n is None or n.op != "mean" or not n.ins:
            return None
        x_in = n.ins[0]
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if len(dims) != 1 or dims[0] not in (-1, len(n.shape) - 1) or not keep:
            return None
        ops.insert(0, "mean")
        sq = x_in.node
        if sq is None:
            return None
        if sq.op == "pow" and _scalar(sq.args[1] if len(sq.args) > 1 else None) == 2.0:
            x = sq.ins[0]
        elif sq.op == "mul" and len(sq.ins) == 2 and sq.ins[0].same(sq.ins[1]):
            x = sq.ins[0]
        else:
            return None
        ops.insert(0, sq.op)
        while x.node is not None and x.node.op == "_to_copy" and x.node.ins and x.node.ins[0].tensor() is not None:
            src = x.node.ins[0].tensor()
            if not (src.is_floating_point() and torch.finfo(src.dtype).bits <= torch.finfo(torch.float32).bits):
                break
            x = x.node.ins[0]
        xt = x.tensor()
        if xt is None or xt.dim() < 1:
            return None
        return {"x": xt, "x_in": x, "eps": eps, "ops": ops, "end": node}

    # -------------------------------------------------------------- module returns: rms_norm
    def done(self, module, output):
        """The module returned ``output``: an RMS statistic computed inside it whose result it returns is an
        rms_norm pattern."""
        stats = self._rms.pop(id(module), None)
        if not stats or not isinstance(output, torch.Tensor):
            return []
        try:
            return self._done(module, output, stats)
        except Exception as exc:
            self.errors.append(f"{type(module).__name__}: {type(exc).__name__}: {exc}")
            return []

    def _done(self, module, y, stats):
        e = self._by_id.get(id(y))
        ynode = e[1] if e is not None and e[0]() is y else None
        for stat in reversed(stats):
            x = stat["x"]
            if stat.get("found") or tuple(y.shape) != tuple(x.shape) or not self._normalises(ynode, stat["end"]):
                continue
            d = x.shape[-1]
            w = getattr(module, "weight", None)
            how = ""
            if isinstance(w, torch.Tensor) and tuple(w.shape) == (d,):
                if type(module).__name__ in OFFSET_WEIGHT:
                    w, how = 1.0 + w.detach().float(), "; weight 1 + w"
            else:
                w = self._stream_weight(ynode, d)
                how = "; weight from the stream" if w is not None else "; no weight"
            eps = next((float(v) for v in (getattr(module, a, None) for a in _EPS_ATTRS)
                        if isinstance(v, (int, float)) and not isinstance(v, bool)), stat["eps"])  # fmt: skip
            name = f"rms_norm (composed: {', '.join(stat['ops'])}{how})"
            param = _param(w)
            return [Pattern("rms_norm", name, y, x=x, weight=None if w is None else w.detach(), eps=eps, d=d,
                            param=param)]  # fmt: skip
        return []

    @staticmethod
    def _normalising(n):
        """Whether node n is a step a normalised tensor may still take (a product, a conversion, a view)."""
        return n.op in ("mul", *_PLAIN, "expand") or n.view

    def _inline(self, ins):
        """The inline rms_norm patterns (module docstring) whose output is one of ``ins``, the operands of an op
        that is not a normalising step: each pending statistic that an operand normalises (``x * r`` on the
        way), once."""
        found = []
        for stats in list(self._rms.values()):
            for stat in stats:
                if stat.get("found"):
                    continue
                for i in ins:
                    x = stat["x"]
                    i = self._laid_out(i, tuple(x.shape))  # through the views that fed it (linear's 2-d view)
                    y = None if i is None else i.tensor()
                    if y is None or not self._scales_x(i.node, stat):
                        continue
                    stat["found"] = True
                    d = x.shape[-1]
                    w = self._stream_weight(i.node, d)
                    how = "; inline, weight from the stream" if w is not None else "; inline, no weight"
                    name = f"rms_norm (composed: {', '.join(stat['ops'])}{how})"
                    found.append(Pattern("rms_norm", name, y, x=x, weight=None if w is None else w.detach(),
                                         eps=stat["eps"], d=d, module=stat["module"], param=_param(w)))  # fmt: skip
                    break
        return found

    @staticmethod
    def _laid_out(i, shape):
        """Tensor i, or the tensor it is a view or copy of (a few steps back), that has ``shape``; else None."""
        for _ in range(4):
            t = i.tensor()
            if t is not None and tuple(t.shape) == shape:
                return i
            n = i.node
            if n is None or not (n.view or n.op in _PLAIN) or not n.ins:
                return None
            i = n.ins[0]
        return None

    def _scales_x(self, n, stat, depth=6):
        """Whether node n is made by normalising steps from ``x * r``: a product of the statistic's result (through
        views and conversions) and its input x (or x's widened copy)."""
        todo, seen, end, x_in = [(n, 0)], set(), stat["end"], stat["x_in"]
        while todo:
            m, d = todo.pop()
            if m is None or id(m) in seen or d > depth or not self._normalising(m):
                continue
            seen.add(id(m))
            if m.op == "mul" and len(m.ins) == 2:
                for a, b in ((m.ins[0], m.ins[1]), (m.ins[1], m.ins[0])):
                    if self._plain_of(a, x_in) and self._normalises(b.node, end):
                        return True
                if not any(self._per_feature(i) for i in m.ins):
                    continue  # a product by a tensor that varies along the rows (rotary's cos): not a weight
            todo += [(i.node, d + 1) for i in m.ins]
        return False

    @staticmethod
    def _per_feature(i):
        """Whether tensor i is a scalar or one value per feature (every dimension but the last of size 1): a
        product by it keeps a normalised row a normalised row (a weight), where a product by cos of the positions
        does not (an RMSNorm followed by a rotary embedding is not an rms_norm of the rotated values)."""
        t = i.tensor()
        return t is not None and all(k == 1 for k in tuple(t.shape)[:-1])

    @staticmethod
    def _plain_of(i, x_in):
        """Whether tensor i is x_in, or made from it by conversions only."""
        for _ in range(4):
            if i.same(x_in):
                return True
            n = i.node
            if n is None or n.op not in _PLAIN or not n.ins:
                return False
            i = n.ins[0]
        return False

    @staticmethod
    def _normalises(n, end, depth=6):
        """Whether node n is made from the statistic's node ``end`` by products, conversions and views only
        (``w * (x * r).to(dtype)``, Gemma's ``(x r (1 + w)).type_as(x)``): the module returns the normalised
        tensor, not something computed from it."""
        todo, seen = [(n, 0)], set()
        while todo:
            m, d = todo.pop()
            if m is None or id(m) in seen or d > depth:
                continue
            if m is end:
                return True
            seen.add(id(m))
            if m.op in ("mul", *_PLAIN, "expand") or m.view:
                todo += [(i.node, d + 1) for i in m.ins]
        return False

    @staticmethod
    def _stream_weight(n, d):
        for _ in range(4):
            if n is None:
                return None
            if n.op == "mul" and len(n.ins) == 2:
                for i in n.ins:
                    t = i.tensor()
                    if t is not None and tuple(t.shape) == (d,):
                        return t
            n = n.ins[0].node if n.ins and n.op in _PLAIN else None
        return None

    # -------------------------------------------------------------- rotary, at its add
    def _to_cos(self, i):
        """(cos node, the views from cos's result to i, the scale) where tensor i is, through views, float
        conversions and scalings by a number, a cosine; else None."""
        steps, scale, n = [], 1.0, i.node
        for _ in range(_DEPTH):
            if n is None:
                return None
            if n.op == "cos":
                return (n, steps[::-1], scale) if n.keep is not None else None
            if n.op == "mul" and len(n.ins) == 1 and _scalar(n.args[1] if len(n.args) > 1 else None) is not None:
                scale *= _scalar(n.args[1])
            elif n.op in _PLAIN:
                pass
            elif n.view or n.op in ("index", "index_select", "expand"):
                steps.append(n)
            else:
                return None
            n = n.ins[0].node if n.ins else None
        return None

    def _rotary(self, node, y):
        found = []
        for a, b in ((node.ins[0], node.ins[1]), (node.ins[1], node.ins[0])):
            m = a.node
            if m is None or m.op != "mul" or len(m.ins) != 2:
                continue
            for p, c in ((m.ins[0], m.ins[1]), (m.ins[1], m.ins[0])):
                hit = self._to_cos(c)
                q = p.tensor()
                if hit is None or q is None or tuple(q.shape) != tuple(y.shape) or q.shape[-1] % 2:
                    continue
                cos_node, steps, scale = hit
                theta = self._replay(cos_node.keep, steps, q.shape)
                conv = self._convention(b.node, p, q)
                if theta is None or conv is None:
                    continue
                ops = ["cos", "sin", "mul", *self._ops_between(b.node, p), "add"]
                return [Pattern("rotary", f"rotary (composed: {', '.join(ops)})", y, q=q, theta=theta, scale=scale,
                                convention=conv)]  # fmt: skip
        return found

    def _convention(self, n, p, q):
        """The rotation the other product n applies to q (``p``): its operand made from q by selections,
        negations and concatenations, replayed on a probe (q's last-axis positions 1..d): "half" where it is
        ``cat(-q[..., d/2:], q[..., :d/2])``, "interleaved" where it is GPT-J's pairs ``(-q[2i+1], q[2i])``;
        None for anything else (``q.roll(1, -1)`` is not a rotation: not a rotary)."""
        if n is None or n.op != "mul" or len(n.ins) != 2:
            return None
        d = q.shape[-1]
        probe = torch.arange(1, d + 1, dtype=torch.int32 if d > 32000 else torch.int16).expand(q.shape).contiguous()
        for i in n.ins:
            got = self._probe(i, p, probe, 8)
            if got is None or tuple(got.shape) != tuple(q.shape):
                continue
            one = got.reshape(-1, d)
            if not bool((one == one[:1]).all()):
                continue
            r, h = one[0].tolist(), d // 2
            if r == [-(j + h + 1) for j in range(h)] + [j + 1 for j in range(h)]:
                return "half"
            if r == [-(j + 2) if j % 2 == 0 else j for j in range(d)]:
                return "interleaved"
        return None

    def _probe(self, i, p, probe, depth):
        """The value of tensor i with q (``p``) replaced by ``probe``, through views, concatenations,
        negations and copies; None where i is made otherwise."""
        if i.same(p):
            return probe
        n = i.node
        if n is None or depth == 0 or not (n.view or n.op in ("cat", "stack", "neg", "clone", "contiguous",
                                                               "_unsafe_view", "flip", "roll")):  # fmt: skip
            return None

        def sub(v):
            if isinstance(v, _In):
                t = self._probe(v, p, probe, depth - 1)
                if t is None:
                    raise LookupError
                return t
            if isinstance(v, (list, tuple)):
                return type(v)(sub(x) for x in v)
            return v

        try:
            return n.func(*(sub(v) for v in n.args), **{k: sub(v) for k, v in n.kwargs.items()})
        except (LookupError, RuntimeError):
            return None

    @staticmethod
    def _derives(n, p, depth=6):
        """Whether tensor ``p`` went into node n, within ``depth`` steps."""
        seen, todo = set(), [(n, 0)]
        while todo:
            m, d = todo.pop()
            if m is None or id(m) in seen or d > depth:
                continue
            seen.add(id(m))
            for i in m.ins:
                if i.same(p):
                    return True
                todo.append((i.node, d + 1))
        return False

    def _ops_between(self, n, p):
        """The judged ops from q (``p``) to the other product's node n: its rotation, then the product."""
        if n is None or n.op != "mul" or len(n.ins) != 2:
            return []
        r = next((i for i in n.ins if i.same(p) or self._derives(i.node, p)), None)
        ops, m = [], r.node if r is not None else None
        for _ in range(8):  # back along the operand that comes from q (cat(-x2, x1): neg; the views uncounted)
            if m is None or m.op in ("sin", "cos"):
                break
            if m.counted:
                ops.append(m.op)
            m = next((i.node for i in m.ins if self._derives(i.node, p) and i.node is not None), None)
        return [*ops[::-1], "mul"]

    @staticmethod
    def _replay(theta, steps, shape):
        """The angles laid out as the cosine reached the product: the same views, replayed on float64."""
        t = theta.detach().to("cpu", torch.float64)
        for n in steps:
            feed = [t, *(n.keep or ())]  # the view's input first, then the integer tensors it kept, in order

            def sub(v, feed=feed):
                if isinstance(v, _In):
                    return feed.pop(0)
                if isinstance(v, (list, tuple)):
                    return type(v)(sub(x) for x in v)
                return torch.device("cpu") if isinstance(v, torch.device) else v

            args = tuple(sub(v) for v in n.args)
            t = n.func(*args, **{k: sub(v) for k, v in n.kwargs.items()})
        try:  # laid out to broadcast to q's shape (the audit's row shows its own shape)
            return t if torch.broadcast_shapes(t.shape, shape) == tuple(shape) else None
        except RuntimeError:
            return None


def judge(p, judge_norm, sample=None):
    """(Report, number of elements sampled or 0) of pattern ``p``: an rms_norm through ``judge_norm(OpCall,
    actual)`` (the audit's :meth:`~refkern.torch.audit.Audit._judge`: its sampling applies), a rotary by
    :mod:`refkern.analysis.rotary` in the convention the stream rotates q by, with ``sample`` on at most that
    many elements: whole rows (the last axis, which the rotation mixes) evenly spaced, exact for them."""
    from refkern.torch.ops import OpCall

    cpu = _cpu_of
    if p.kind == "rms_norm":
        spec = OpCall("rms_norm", "rms_norm", (cpu(p.x),), dict(normalized_shape=(p.d,), weight=cpu(p.weight),
                                                                 eps=p.eps))  # fmt: skip
        return judge_norm(spec, cpu(p.out))
    from refkern.analysis.rotary import compare_rotary

    # the output on its device: the rotation's cos and sin are judged by that device's accuracy classes
    out, q, theta, sampled = p.out.detach().as_subclass(torch.Tensor), cpu(p.q), cpu(p.theta), 0
    d = q.shape[-1]
    if sample is not None and q.numel() > sample and q.dim() > 1:
        n = q.numel() // d
        rows = torch.linspace(0, n - 1, max(1, sample // d)).round().long().unique()
        at = torch.unravel_index(rows, tuple(q.shape[:-1]))
        out, q, theta = out[at], q[at], torch.broadcast_to(theta, q.shape)[at]
        sampled = out.numel()
    return compare_rotary(out, q, theta, scale=p.scale, convention=p.convention), sampled


def _cpu_of(t):
    if t is None:
        return None
    t = t.detach().to("cpu")
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


# ------------------------------------------------------------------ the backward pass
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

        got = {k: _cpu_of(g) for k, g in p.grads.items()}
        return compare_backward(got, "rms_norm", _cpu_of(p.grad_output), _cpu_of(p.x), normalized_shape=(p.d,),
                                weight=_cpu_of(p.weight), eps=p.eps), 0  # fmt: skip
    rot = Pattern("rotary", p.name, p.grads["input"], q=p.grad_output, theta=-p.theta, scale=p.scale,
                  convention=p.convention)  # fmt: skip
    rep, sampled = judge(rot, None, sample)
    return {"input": rep}, sampled
