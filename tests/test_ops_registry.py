"""The op registry (refkern.ops): every record resolves, agrees with what the library does with the op,
and an unknown name gets one error listing the valid names."""

import importlib.util
import subprocess
import sys

import pytest

import refkern
import refkern.ops as ops
from refkern.accumulate.formats import FLOAT16, FLOAT32

NAMES = tuple(ops.REGISTRY)


def test_unknown_name_lists_every_op():
    with pytest.raises(ValueError, match=r"^ops: unknown op='conv4d'; choose one of 'dot', 'matmul'") as e:
        ops.get("conv4d")
    msg = str(e.value)
    assert all(repr(n) in msg for n in NAMES)
    assert msg.endswith("Did you mean 'conv3d'?")
    with pytest.raises(ValueError, match=r"^compare: unknown op=<built-in function len>; choose one of 'dot'"):
        ops.lookup(len, "compare")


def test_torch_function_of_an_unknown_op_lists_the_ops():
    pytest.importorskip("torch")
    from refkern.torch import torch_function

    with pytest.raises(ValueError, match=r"^torch_function: unknown op='lienar'; choose one of 'dot'.* Did you mean"):
        torch_function("lienar")


@pytest.mark.parametrize("name", NAMES)
def test_record_resolves_to_the_public_functions(name):
    import refkern.truth

    r = ops.get(name)
    assert r.reference is getattr(refkern, name)
    assert r.truth is getattr(refkern.truth, name)
    assert ops.lookup(r.reference, "compare") == name
    assert r.operands and 1 <= r.required <= len(r.operands)
    assert list(r.signature.parameters)[: 1 if not r.positional else r.required] == list(
        r.operands[: 1 if not r.positional else r.required]
    )
    assert set(r.differentiable) <= set(r.signature.parameters)


def test_registry_order_and_error_models():
    from refkern.analysis.envelope import OPS as ENVELOPE_OPS
    from refkern.analysis.evaluate import OPS as SUM_OPS

    elementwise = ops.names(error_model="elementwise")  # judged by refkern.analysis.elementwise
    losses = ops.names(error_model="loss")  # judged by refkern.analysis.losses
    gather = ops.names(error_model="gather")  # judged by refkern.analysis.embedding
    assert SUM_OPS + ENVELOPE_OPS + elementwise + losses + gather == NAMES  # the products first: compare's error lists them so
    assert set(refkern.__all__) >= set(NAMES)


def test_each_error_model_is_judged_by_compare_or_by_the_judge_its_entry_names():
    import inspect

    from refkern.analysis.envelope import OPS as ENVELOPE_OPS
    from refkern.analysis.evaluate import OPS as SUM_OPS

    assert set(ops.JUDGES) == set(ops.ERROR_MODELS) - {"sum", "envelope"}
    assert {n for n in NAMES if ops.get(n).judge is None} == set(SUM_OPS + ENVELOPE_OPS)
    for model, path in ops.JUDGES.items():
        judge = ops.resolve_path(path)
        assert list(inspect.signature(judge).parameters) == ["actual", "name", "args", "kwargs", "rtol", "atol",
                                                             "arrays"], path  # fmt: skip
        assert all(ops.get(n).judge is judge for n in ops.names(error_model=model))


def test_compare_gives_the_judges_report():
    """compare hands an op of a judged error model to its record's judge: the same verdict and figures."""
    import numpy as np

    x = np.array([0.5, -1.25, 3.0, 1e-3], np.float32)
    for name, args, kw, got in [
        ("exp", (x,), {}, np.exp(x.astype(np.float64)).astype(np.float32)),
        ("mse_loss", (x, x[::-1].copy()), {}, np.float32(np.mean((x - x[::-1]) ** 2.0))),
        ("embedding", (np.array([1, 0]), x.reshape(2, 2)), {}, x.reshape(2, 2)[[1, 0]]),
    ]:
        direct, _ = ops.get(name).judge(got, name, args, kw, None, None, False)
        rep = refkern.compare(got, name, *args, **kw)
        assert rep.op == direct.op == name
        assert (rep.verdict, rep.max_ulp) == (direct.verdict, direct.max_ulp)


def test_the_ops_with_a_backward_are_the_records_that_name_one():
    """refkern.gradients, the truth's gradients, the judging and the audit read each op's backward from its
    record (issue 25): every path a record names resolves, and every aten backward kernel has its reading."""
    from refkern import gradients

    with_backward = tuple(n for n in NAMES if ops.get(n).backward is not None)
    assert gradients.OPS == with_backward == ops.names(backward=True)
    for name in with_backward:
        r = ops.get(name)
        assert r.differentiable, name
        for path in (r.backward.rule, r.backward.truth, r.backward.judge):
            assert callable(ops.resolve_path(path)), (name, path)
        assert bool(r.aten_backward) <= bool(r.backward.audit), name
    for name in NAMES:
        if ops.get(name).backward is None:
            assert not ops.get(name).differentiable and not ops.get(name).aten_backward, name


def test_the_audit_reads_every_aten_backward_kernel_from_the_registry():
    pytest.importorskip("torch")
    from refkern.torch import dispatch_backward

    for r in ops.REGISTRY.values():
        for k in r.aten_backward:
            assert dispatch_backward._KERNELS[k].backward.audit == r.backward.audit, k
            assert callable(ops.resolve_path(r.backward.audit)), k


@pytest.mark.parametrize("name", ops.names(error_model="sum"))
def test_sum_hypotheses_are_the_verdicts_models(name):
    """The hypotheses a record names are the families of models the verdict weighs for it."""
    from refkern.analysis.hypotheses import models

    r = ops.get(name)
    seen = set()
    for out in (FLOAT16, FLOAT32):
        for m in models(out, 53, "bias" in r.operands, name):
            seen |= {"tf32"} if m.precision == "tf32" else set()
            seen |= {"autocast"} if m.key.endswith("autocast") else set()
            seen |= {"accumulators"} if m.order is not None else set()
            seen |= {"epilogue"} if m.epilogue else set()
            seen |= {"taps"} if m.taps else set()
    assert seen == set(r.hypotheses)


def test_torch_callables_and_aten_ops_resolve():
    torch = pytest.importorskip("torch")
    from refkern.torch import dispatch
    from refkern.torch.ops import FUNCTIONS, from_call, torch_function

    for name, r in ops.REGISTRY.items():
        for c in r.calls:
            f = ops.resolve_path(c.path)
            assert FUNCTIONS[f] == (c.torch_name or name)
        for a in (*r.aten, *r.aten_backward):
            assert hasattr(torch.ops.aten, a), (name, a)  # a misspelt aten name would never match
        assert set(r.aten) <= dispatch._REFERENCED and set(r.aten_backward) <= dispatch._BACKWARD
        assert callable(torch_function(name))
    x = torch.randn(3, 4)
    assert from_call(torch.Tensor.sum, (x,), {"dim": 1}).op == "sum"
    assert from_call(torch.mm, (x, x.T), {}).torch_name == "mm"


def test_reading_the_registry_imports_neither_torch_nor_mpmath():
    code = ("import sys, refkern.ops as o; [r.reference for r in o.REGISTRY.values()]; "
            "print([m for m in ('torch', 'mpmath') if m in sys.modules])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _envelope_examples():
    """A small float32 call of every envelope op (a new op must add one: the test below lists them all)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    img = rng.standard_normal((2, 3, 6)).astype(np.float32)
    img2 = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    img3 = rng.standard_normal((2, 3, 4, 4, 4)).astype(np.float32)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    red = {"x": x, "dim": -1}
    return {
        "sum": red, "mean": red, "var": red, "std": red, "cumsum": red,
        "layer_norm": {"input": x, "normalized_shape": (6,)}, "rms_norm": {"input": x, "normalized_shape": (6,)},
        "group_norm": {"input": img, "num_groups": 3}, "batch_norm": {"input": img, "running_mean": None,
                                                                      "running_var": None, "training": True},
        "avg_pool1d": {"input": img, "kernel_size": 2}, "avg_pool2d": {"input": img2, "kernel_size": 2},
        "avg_pool3d": {"input": img3, "kernel_size": 2},
        "max_pool1d": {"input": img, "kernel_size": 2}, "max_pool2d": {"input": img2, "kernel_size": 2},
        "adaptive_avg_pool1d": {"input": img, "output_size": 4},
        "adaptive_avg_pool2d": {"input": img2, "output_size": 4},
        "softmax": {"input": x, "dim": -1}, "log_softmax": {"input": x, "dim": -1},
        "scaled_dot_product_attention": {"query": q, "key": q, "value": q},
    }  # fmt: skip


def test_envelope_hypotheses_are_the_verdicts():
    """The hypotheses an envelope record names are those refkern.analysis.envelope weighs for it (beyond a
    correct rounding and rounded inputs)."""
    import numpy as np

    from refkern.analysis.envelope import envelopes

    calls = _envelope_examples()
    assert set(calls) == set(ops.names(error_model="envelope"))
    for name, kw in calls.items():
        r = ops.get(name)
        a = r.signature.bind(**kw)
        a.apply_defaults()
        ref = r.reference(**kw)
        ref = np.asarray(ref[0] if isinstance(ref, tuple) else ref, np.float64)
        hyps, _ = envelopes(name, dict(a.arguments), ref, FLOAT32, lazy=True)
        keys = {h[0] for h in hyps}
        seen = {"one-pass variance"} & keys
        seen |= {"stored output"} if {"fp16 output", "bf16 output"} & keys else set()
        seen |= {"P@V"} if any("P@V" in k for k in keys) else set()
        seen |= {"named bugs"} if "no max" in keys else set()
        assert seen == set(r.hypotheses), (name, sorted(keys))


def test_autograd_nodes_are_torchs():
    """Every autograd node a record names is the node torch records for that op (a misspelt one would never
    match, and the audit would not know which parameter a gradient belongs to)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    seen = {
        F.conv2d(x, w).grad_fn.name(), F.linear(x[0, 0], x[0, 1], x[0, 2, 0]).grad_fn.name(),
        (x[0, 0] @ x[0, 0]).grad_fn.name(), torch.bmm(x[0], x[0]).grad_fn.name(),
        F.layer_norm(x, (8,), w[0, 0, 0].repeat(3)[:8], None).grad_fn.name(),
        F.group_norm(x, 3, w[0, :, 0, 0]).grad_fn.name(), F.batch_norm(x, None, None, training=True).grad_fn.name(),
        F.softmax(x, -1).grad_fn.name(), F.log_softmax(x, -1).grad_fn.name(), F.max_pool2d(x, 2).grad_fn.name(),
        F.avg_pool2d(x, 2).grad_fn.name(), F.adaptive_avg_pool2d(x, 3).grad_fn.name(),
        F.scaled_dot_product_attention(x, x, x).grad_fn.name(),  # 4-d: the fused CPU kernel
    }  # fmt: skip
    named = {node for r in ops.REGISTRY.values() for node, _ in r.autograd}
    missing = {n for n in seen if n not in named}
    assert not missing, missing


def test_the_backward_dispatch_compares_no_op_name():
    """The modules that once chose an op's backward by its name (issue 25) read the registry: no comparison of a
    value with a registered op's name in refkern.gradients, refkern.truth.backward, the judge dispatch of
    refkern.analysis.gradients and the audit's backward_call."""
    import ast
    import inspect

    import refkern.analysis.gradients as ag
    import refkern.gradients as g
    import refkern.truth.backward as tb

    sources = [inspect.getsource(g), inspect.getsource(tb), inspect.getsource(ag.judge)]
    if importlib.util.find_spec("torch") is not None:
        from refkern.torch import dispatch_backward

        sources.append(inspect.getsource(dispatch_backward.backward_call))
    names = set(NAMES)
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Compare):
                consts = [c.value for side in (node.left, *node.comparators) for c in ast.walk(side)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]  # fmt: skip
                assert not names & set(consts), ast.unparse(node)


def test_integer_inputs_are_converted_to_the_dtype_torch_computes_in():
    """``from_call`` hands refkern's op integer and bool inputs converted as torch converts them: the unary functions
    (records with ``promotes_integers``) to the default dtype, softmax, sum and cumsum to their ``dtype``, pow to ``torch.result_type``
    of its operands; an integer result (a sum of integers, an integer power) is not converted. torch converts before
    it computes: int64 2**24 + 1 is float32's 2**24, whose square root is 4096 exactly (not 4096.000122)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from refkern.analysis.compare import compare
    from refkern.torch.ops import from_call

    ints = torch.tensor([0, 1, 9, 2**24 + 1])
    assert [n for n, r in ops.REGISTRY.items() if r.promotes_integers] == [
        "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf",
        "sin", "cos"]  # fmt: skip
    calls = [(torch.sqrt, (ints,), {}, torch.float32, {}), (torch.exp, (ints > 1,), {}, torch.float32, {}),
             (F.softmax, (ints.to(torch.int8), 0), {"dtype": torch.float16}, torch.float16, {"dtype": torch.float16}),
             (torch.sum, (ints > 1,), {"dtype": torch.float16}, torch.float16, {"dtype": torch.float16}),
             (torch.cumsum, (ints, 0), {"dtype": torch.float64}, torch.float64, {"dim": 0}),
             (torch.pow, (ints, 2.5), {}, torch.float32, {"exponent": 2.5}),
             (torch.pow, (2.0, ints), {}, torch.float32, {}),
             (torch.pow, (ints, torch.full((4,), 0.5, dtype=torch.float64)), {}, torch.float64, {})]  # fmt: skip
    for func, args, kwargs, dtype, keywords in calls:
        spec = from_call(func, args, kwargs)
        assert spec.unsupported is None, spec.unsupported
        assert [a.dtype for a in spec.args if isinstance(a, torch.Tensor)][0] == dtype
        assert spec.kwargs.items() >= keywords.items()
        out = func(*args, **kwargs)
        assert out.dtype == dtype
        assert compare(out, spec.op, *spec.args, **spec.kwargs).verdict in ("exact", "rounding")
    assert torch.sqrt(ints)[3].item() == 4096.0 and from_call(torch.sqrt, (ints,), {}).args[0][3].item() == 2.0**24
    default = torch.get_default_dtype()  # torch's global: set back whatever happens
    torch.set_default_dtype(torch.float64)
    try:
        assert from_call(torch.exp, (ints,), {}).args[0].dtype == torch.float64
    finally:
        torch.set_default_dtype(default)
    for func, args in ((torch.sum, (ints,)), (torch.pow, (ints, 2))):  # integer results: integer arithmetic,
        spec = from_call(func, args, {})  # judged to the bit on the integers as given (refkern.analysis.integers)
        assert spec.unsupported is None and spec.args[0].dtype == torch.int64
        assert compare(func(*args), spec.op, *spec.args, **spec.kwargs).verdict == "exact"
    assert from_call(torch.pow, (ints, "2"), {}).unsupported.startswith(
        "pow with input of type Tensor, exponent of type str")  # fmt: skip


@pytest.mark.parametrize("name", ops.names(family="pool"))
def test_a_pool_module_and_its_aten_ops_are_read_from_its_record(name):
    """A pool is one record: ``nn.<Pool>`` (``Op.modules``) is its first call with the module's attributes of the
    call's parameter names, a subclass too; its aten ops (the ``_with_indices`` forms included) are judged as the
    record's op, their argmax positions the record's ``aten_unjudged`` (torch runs F.avg_pool1d as aten's avg_pool2d).
    torch's own results are judged against
    refkern's reference: exact or rounding."""
    torch = pytest.importorskip("torch")
    from refkern.analysis.compare import compare
    from refkern.torch import audit
    from refkern.torch.ops import from_call, from_module

    r = ops.get(name)
    (path,) = r.modules
    cls = ops.resolve_path(path)
    params = r.calls[0].params[1:]
    example = eval(f"dict({r.needs})")  # noqa: S307  (the record's own example: kernel_size=3, output_size=4)
    nd = int(name[-2])  # the test's input rank: (N, C) and the pooled dimensions
    x = torch.randn(2, 3, *(9,) * nd, generator=torch.Generator().manual_seed(nd))
    settings = [example] if "output_size" in example else [example, dict(example, stride=2, padding=1, ceil_mode=True)]
    for kw in settings:
        for m in (cls(**kw), type("Sub", (cls,), {})(**kw)):
            spec = from_module(m, x)
            assert (spec.op, spec.torch_name) == (name, type(m).__name__)
            assert spec.kwargs == {p: getattr(m, p) for p in params}
            out = m(x)
            out = out[0] if isinstance(out, tuple) else out
            assert compare(out, spec.op, *spec.args, **spec.kwargs).verdict in ("exact", "rounding")
    for c in r.calls:  # F.max_pool2d_with_indices: max_pool2d with return_indices=True
        assert from_call(ops.resolve_path(c.path), (x, 3), {}).kwargs.items() >= dict(c.fixed).items()
    with audit() as a:
        for c in r.calls:
            ops.resolve_path(c.path)(x, *example.values())
    pools = [c for c in a.calls if c.op in ops.names(family="pool")]  # F.avg_pool1d runs aten's avg_pool2d
    assert pools and all(c.verdict in ("exact", "rounding") for c in pools), [(c.aten, c.verdict) for c in a.calls]
    judged = [c for c in pools if c.aten.split(".")[1] in r.aten]
    assert all(c.op == name for c in judged)
    for c in judged:
        unjudged = {k: v for k, v in c.parts.items() if isinstance(v, str)}
        assert unjudged == (dict(r.aten_unjudged) if c.aten.split(".")[1].endswith("_with_indices") else {})


def test_the_pool_dispatch_names_no_pool():
    """The audit's reading of a pool's aten call and ``from_module``'s of a pool module take the op from its record
    (issue 25): no pool's name, dimension or module class is written in them."""
    pytest.importorskip("torch")
    import ast
    import inspect

    from refkern.torch import dispatch
    from refkern.torch import ops as torch_ops

    # (from_module's convolutions read their dimension from the module: only the pools' words are looked for there)
    for fn, words in ((dispatch._pool, ("pool", "1d", "2d", "3d")), (torch_ops.from_module, ("pool",))):
        (tree,) = ast.parse(inspect.getsource(fn)).body
        for node in (n for stmt in tree.body[1:] for n in ast.walk(stmt)):  # after the docstring
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else (
                node.attr if isinstance(node, ast.Attribute) else "")  # fmt: skip
            assert not any(w in text.lower() for w in words), (fn.__name__, text)


def test_every_path_a_record_names_resolves():
    """Every ``"module:function"`` a record names (the reference, the truth, the backward's rule, truth, judge,
    audit and broadcast, the integer kernel, the judges of the error models) imports and is callable, and none is
    the package root's (pow's broadcast gradient, refkern.kernels.pow_backward, moved there from the root)."""
    paths = [*ops.JUDGES.values()]
    for r in ops.REGISTRY.values():
        paths += [r.reference_path, r.truth_path, r.integer_reference]
        if r.backward is not None:
            b = r.backward
            paths += [b.rule, b.truth, b.judge, b.audit if importlib.util.find_spec("torch") else None, b.broadcast]
    paths = [p for p in paths if p]
    assert not [p for p in paths if p.partition(":")[0] == "refkern"]
    assert all(callable(ops.resolve_path(p)) for p in paths)
    assert ops.get("pow").backward.broadcast == "refkern.kernels.pow_backward:pow_reduced"


def test_a_pools_kind_and_pooled_dimensions_are_what_torch_computes():
    """``Op.pool`` and ``Op.spatial`` against torch: on (N, C) and ``spatial`` dimensions of 4, windows of 2
    (``kernel_size=2``, or ``output_size=2`` for the adaptive ones) give 2 in each pooled dimension, and each output
    is the maximum (``"max"``) or the mean (``"avg"``, ``"adaptive_avg"``) of its 2 x ... x 2 block, computed here
    with numpy. A convolution's ``spatial`` is the dimensions its kernel slides over (a 3-tap kernel in each)."""
    torch = pytest.importorskip("torch")
    import numpy as np

    assert ops.POOL_KINDS == ("avg", "max", "adaptive_avg")
    assert [(n, ops.get(n).pool, ops.get(n).spatial) for n in ops.names(family="pool")] == [
        ("avg_pool1d", "avg", 1), ("avg_pool2d", "avg", 2), ("avg_pool3d", "avg", 3), ("max_pool1d", "max", 1),
        ("max_pool2d", "max", 2), ("adaptive_avg_pool1d", "adaptive_avg", 1),
        ("adaptive_avg_pool2d", "adaptive_avg", 2)]  # fmt: skip
    assert all(r.pool is None for r in ops.REGISTRY.values() if r.family != "pool")
    for name in ops.names(family="pool"):
        r = ops.get(name)
        nd = r.spatial
        # integers: each block's sum is exact and its mean a division by a power of two, exact in any order
        x = torch.randint(-50, 50, (2, 3, *(4,) * nd), generator=torch.Generator().manual_seed(nd)).double()
        got = ops.resolve_path(r.torch_function)(x, **({"output_size": 2} if r.pool == "adaptive_avg" else
                                                        {"kernel_size": 2})).numpy()  # fmt: skip
        blocks = x.numpy().reshape(2, 3, *(q for _ in range(nd) for q in (2, 2)))  # (.., out_i, tap_i, ..)
        taps = tuple(3 + 2 * i for i in range(nd))
        want = blocks.max(axis=taps) if r.pool == "max" else blocks.mean(axis=taps)
        np.testing.assert_array_equal(got, want)
    for name in ops.names(family="conv") + ops.names(family="conv_transpose"):
        r = ops.get(name)
        nd = r.spatial
        x, w = torch.ones(1, 1, *(5,) * nd), torch.ones(1, 1, *(3,) * nd)
        size = 3 if r.family == "conv" else 7  # 5 - 3 + 1, and (5 - 1) + 3
        assert tuple(ops.resolve_path(r.torch_function)(x, w).shape) == (1, 1, *(size,) * nd)
    assert all(r.spatial == 0 for r in ops.REGISTRY.values() if r.family not in ("pool", "conv", "conv_transpose"))


def test_a_pools_backward_and_envelope_read_its_record():
    """A pool's backward rule (its call's validation) and the pool part of the forward envelope's layout take the
    kind and the pooled dimensions from the record (issue 25): no pool's name or dimension is written in them,
    nor is the op's name sliced or matched (``int(op[-2])``, ``name.startswith("max_pool")``)."""
    import ast
    import inspect
    import textwrap

    from refkern.analysis import _envelope_ops
    from refkern.kernels import pool_grad

    src = inspect.getsource(_envelope_ops.layout)
    start, end = src.index("    rec = REGISTRY.get(name)"), src.index('    if name in ("softmax", "log_softmax")')
    pool_part = ast.parse(textwrap.dedent(src[start:end]))  # the statements from the record's lookup to softmax's
    for tree, arg in ((ast.parse(inspect.getsource(pool_grad._pool_call)), "op"), (pool_part, "name")):
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not any(w in node.value for w in ("_pool", "1d", "2d", "3d")), node.value
            if isinstance(node, ast.Subscript):
                assert ast.unparse(node.value) != arg, ast.unparse(node)
            if isinstance(node, ast.Attribute) and node.attr in ("startswith", "endswith"):
                raise AssertionError(ast.unparse(node))


def test_the_ops_backward_lists_are_the_registrys():
    """refkern.backward's docstring names every op with a backward (it once lacked avg_pool3d): the quoted names,
    with "the losses" and "the elementwise ops" those families' ops with a backward, are :data:`OPS`, each once."""
    import re

    from refkern import gradients

    doc = refkern.backward.__doc__
    text = doc[doc.index("``op``:") : doc.index("(:data:`OPS`")]
    listed = re.findall(r'"(\w+)"', text)
    assert "the losses" in text and "the elementwise ops" in text
    listed += [*ops.names(family="loss", backward=True), *ops.names(family="elementwise", backward=True)]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(ops.names(backward=True)) == sorted(gradients.OPS)


def test_conv_op_is_the_record_over_those_dimensions():
    """:func:`refkern.ops.conv_op` gives the record whose family and ``Op.spatial`` are asked for, written out
    by hand; None for a dimension no record has."""
    assert [(t, nd, ops.conv_op(t, nd).name) for t in (False, True) for nd in (1, 2, 3)] == [
        (False, 1, "conv1d"), (False, 2, "conv2d"), (False, 3, "conv3d"),
        (True, 1, "conv_transpose1d"), (True, 2, "conv_transpose2d"), (True, 3, "conv_transpose3d")]  # fmt: skip
    for t in (False, True):
        r = ops.conv_op(t, 2)
        assert r is ops.get(r.name) and r.spatial == 2 and r.family == ("conv_transpose" if t else "conv")
    assert ops.conv_op(False, 0) is None and ops.conv_op(True, 4) is None


# the modules that once read a convolution's dimensions from its name or wrote its name from them (issue 25)
_CONV_READERS = ("refkern.kernels.conv_grad", "refkern.truth.backward", "refkern.analysis.evaluate",
                 "refkern.torch.ops", "refkern.torch.dispatch_backward")  # fmt: skip


def _conv_name_reading(src):
    """What in ``src`` reads a convolution's dimensions from an op's name (``int(name[-2])``, ``name.startswith(
    "conv_transpose")``), writes its name from them (``f"conv{nd}d"``, ``f"conv_transpose{nd}d"``) or names one
    (``"conv2d"`` outside a docstring)."""
    import ast

    convs = set(ops.names(family="conv") + ops.names(family="conv_transpose"))
    tree = ast.parse(src)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" and node.args:
            sub = node.args[0]
            if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.UnaryOp):  # name[-2]: from the end
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith"):  # fmt: skip
            if any(isinstance(a, ast.Constant) and str(a.value).startswith("conv") for a in node.args):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.JoinedStr):
            pairs = zip(node.values, node.values[1:])  # "conv" or "conv_transpose", then the dimensions
            if any(isinstance(a, ast.Constant) and a.value.endswith(("conv", "conv_transpose"))
                   and isinstance(b, ast.FormattedValue) for a, b in pairs):  # fmt: skip
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Constant) and node.value in convs and id(node) not in docs:
            found.append(repr(node.value))
    return found


@pytest.mark.parametrize("module", _CONV_READERS)
def test_a_convolutions_dimensions_are_its_records(module):
    """The convolutions' backward rules and truths, the analysis' ``problem``, the adapter's torch functions and
    module reading and the audit's ``convolution_backward`` reading take a convolution's dimensions from its record
    (``Op.spatial``) and a convolution of given dimensions from :func:`refkern.ops.conv_op`: none slices an op's
    name for its digit, matches its prefix, or writes a convolution's name."""
    src = open(importlib.util.find_spec(module).origin, encoding="utf-8").read()
    assert _conv_name_reading(src) == []


def test_the_conv_name_reading_check_finds_what_it_forbids():
    """The check above fails on the code it replaced (refkern/kernels/conv_grad.py's ``_dims``,
    refkern/torch/dispatch_backward.py's ``convolution``, refkern/analysis/evaluate.py's ``problem``)."""
    old = '''
def _dims(op):
    return int(op[-2])
op = f"conv_transpose{nd}d" if transposed else f"conv{nd}d"
if name.startswith("conv_transpose"):
    pass
if name in ("conv1d", "conv2d", "conv3d"):
    pass
'''
    assert sorted(_conv_name_reading(old)) == sorted(["int(op[-2])", "f'conv_transpose{nd}d'", "f'conv{nd}d'",
                                                      "name.startswith('conv_transpose')", "'conv1d'", "'conv2d'",
                                                      "'conv3d'"])  # fmt: skip
    assert _conv_name_reading('def f(n):\n    """conv2d\'s."""\n    return int(b["x"]), f"F.{n}"\n') == []


def test_a_convolution_record_needs_its_own_dimensions(monkeypatch):
    """The registry refuses a convolution record without ``spatial``, a second record of a family over the same
    dimensions (:func:`refkern.ops.conv_op` would be ambiguous), and ``spatial`` on a family that slides nothing."""
    import dataclasses

    conv2d, softmax, original = ops.get("conv2d"), ops.get("softmax"), ops.RECORDS
    for bad, match in ((dataclasses.replace(conv2d, spatial=0), "a convolution needs"),
                       (dataclasses.replace(ops.get("conv3d"), spatial=2), "two conv records over 2 dimensions"),
                       (dataclasses.replace(softmax, spatial=1), "only a convolution or a pool")):  # fmt: skip
        records = tuple(bad if r.name == bad.name else r for r in original)
        monkeypatch.setattr(ops, "RECORDS", records)
        with pytest.raises(RuntimeError, match=match):
            ops._build()
    monkeypatch.undo()
    assert ops._build() == ops.REGISTRY
