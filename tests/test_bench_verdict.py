"""benchmarks/bench_verdict.py's command line for the power families in parts: ``--ops``, ``--sizes`` and
``--dtypes`` select cases, ``--jsonl`` appends each case's rows as it ends, ``--summarize`` rebuilds from such
files the summary and markdown table a whole run writes; and a call's equal outputs are judged once."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

CASE = ["--family", "power", "--ops", "sum", "--sizes", "1000", "--dtypes", "float32"]


def _summary(path, key="power"):
    with open(path) as f:
        return json.load(f)[key]["summary"]


def test_jsonl_parts_summarize_as_the_whole_run(bv, tmp_path):
    """A run with --jsonl and --summarize of its file give the same summary and markdown as the run itself;
    a case measured again replaces its first rows (not counted twice); a line cut short is skipped."""
    jl, md1, md2, j1, j2 = (str(tmp_path / f) for f in ("p.jsonl", "a.md", "b.md", "a.json", "b.json"))
    assert bv.main(CASE + ["--jsonl", jl, "--markdown", md1, "--json", j1]) == 0
    with open(jl) as f:
        lines = [json.loads(x) for x in f]
    assert lines and {r["family"] for r in lines} == {"power"} and {r["op"] for r in lines} == {"sum"}
    assert {r["n"] for r in lines} == {1000} and {r["dtype"] for r in lines} == {"float32"}
    assert len({r["part"] for r in lines}) == 1  # one case, one part
    assert bv.main(["--summarize", jl, "--markdown", md2, "--json", j2]) == 0
    with open(md1) as a, open(md2) as b:
        assert a.read() == b.read()
    assert _summary(j1) == _summary(j2)
    # the same case measured again (a rerun of a stopped part) and a half-written last line
    assert bv.main(CASE + ["--jsonl", jl]) == 0
    with open(jl, "a") as f:
        f.write('{"family": "power", "op": "sum"')
    assert bv.main(["--summarize", jl, "--json", j2]) == 0
    s1, s2 = _summary(j1), _summary(j2)
    assert s2["compares"] == s1["compares"] == len(lines)
    assert s2["correct"] == s1["correct"] and s2["bugs_ge_8x"] == s1["bugs_ge_8x"]


def test_power_plan_sizes_keep_only_the_sizes_asked(bv):
    """--sizes restricts each axis of the size table to the sizes it names; the others are left empty."""
    s = bv.power_plan_sizes("power", False, {8192, 10_000_000})
    assert s == {"features": (8192,), "keys": (8192,), "terms": (10_000_000,), "scan": ()}
    assert bv.power_plan_sizes("power", True, None) == bv.PW_SIZES_QUICK
    b = bv.power_plan_sizes("power-backward", False, {1024})
    assert b["softmax"] == ((1024,), (1024,)) and b["sdpa"] == ((), (1024,)) and b["mean"] == ((), ())
    assert bv._sizes_of("8192, 1e7") == {8192, 10_000_000}


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--family", "power", "--ops", "layer_norm,sofmax"], "--ops"),
        (["--family", "power-backward", "--ops", "cumsum"], "--ops"),
        (["--family", "power", "--sizes", "1e-3"], "--sizes"),
        (["--family", "power", "--dtypes", "float64"], "--dtypes"),
        (["--family", "gemm", "--jsonl", "x.jsonl"], "--family power or power-backward"),
        (["--summarize", "x.jsonl", "--ops", "sum"], "--summarize"),
    ],
)
def test_bad_arguments_name_themselves(bv, capsys, argv, names):
    with pytest.raises(SystemExit) as e:
        bv.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert names in err and ("expected" in err or "runs nothing" in err)


def test_equal_outputs_are_judged_once_with_the_same_rows(bv, monkeypatch):
    """A bfloat16 mean of 10^5 terms (torch's CPU kernel on 2 to 4 threads among its correct implementations, some
    equal bit for bit): pw_case with its memo gives the rows of judging every output afresh."""
    scales = (0.5, 8)
    calls = []
    compare = bv.rk.compare
    monkeypatch.setattr(bv.rk, "compare", lambda *a, **k: calls.append(1) or compare(*a, **k))
    with_memo = bv.pw_case("mean", 100_000, "randn", "bfloat16", 0, scales, log=lambda *a: None)
    monkeypatch.setattr(bv.rk, "compare", compare)
    assert any("threads" in r["name"] for r in with_memo if r["truth"] == "correct")
    assert 0 < len(calls) < len(with_memo)  # some outputs equal: judged once
    orig = bv._pw_judge
    monkeypatch.setattr(bv, "_pw_judge", lambda op, args, kw, out, memo=None: orig(op, args, kw, out, None))
    afresh = bv.pw_case("mean", 100_000, "randn", "bfloat16", 0, scales, log=lambda *a: None)

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert json.dumps(strip(with_memo), default=str) == json.dumps(strip(afresh), default=str)
    assert np.isfinite([r["seconds"] for r in with_memo]).all()
