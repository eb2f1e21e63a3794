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
from refkern.torch._pattern import Pattern, judge
from refkern.torch.patterns_backward import judge_backward, watch

__all__ = ["Matcher", "Pattern", "OFFSET_WEIGHT", "judge", "judge_backward", "watch"]

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
