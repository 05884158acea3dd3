"""`decodecliff bench-engine` on the CPU: the step split, the floors, the targets, bad input."""

from __future__ import annotations

import json

import pytest

from decodecliff.bench import engine as bench
from decodecliff.bench import engine_merge


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "engine.json"
    argv = ["--device", "cpu", "--threads", "1", "--contexts", "64", "200", "--repeats", "2"]
    argv += ["--modes", "chain", "tree", "--tree-nodes", "16", "--draft-len", "6"]
    argv += ["--parts", "anatomy", "loop", "drafter", "host", "--loop-steps", "3", "--gen", "4"]
    argv += ["--drafter-steps", "3", "--out", str(out)]
    assert bench.cli(argv) == 0
    return json.loads(out.read_text())


def test_every_point_is_split_into_attention_gemms_and_the_rest(doc):
    assert [(r["mode"], r["context"], r["q_len"]) for r in doc["rows"]] == [
        ("chain", 64, 6),
        ("chain", 200, 6),
        ("tree", 64, 16),
        ("tree", 200, 16),
    ]
    for r in doc["rows"]:
        assert r["step_ms"] > 0 and r["gemm_ms"] > 0 and len(r["step_ms_all"]) == 2
        parts = r["attention_ms"] + r["gemm_ms"] + r["rest_ms"]
        assert parts == pytest.approx(r["step_ms"])
        assert 0 < r["weights_floor_ms"] <= r["gemm_floor_ms"] < r["step_floor_ms"]
        assert r["non_attention_over_floor"] == pytest.approx(
            r["non_attention_ms"] / r["weights_floor_ms"]
        )
    # the KV floor grows with the context, the weights floor does not
    chain = [r for r in doc["rows"] if r["mode"] == "chain"]
    assert chain[1]["kv_bytes"] > chain[0]["kv_bytes"]
    assert chain[1]["weight_bytes"] == chain[0]["weight_bytes"]
    assert doc["env"]["torch"] and doc["ceilings"]["copy_gbs"] > 0 and not doc["errors"]


def test_the_rest_of_a_step_is_timed_without_its_attention(tmp_path, monkeypatch):
    """attention = step - rest holds only if the rest's step runs no attention: the timed
    callables are watched (the backend's run counted), the bench itself runs as it does."""
    from decodecliff.kernels.reference import TorchAttention

    runs = {"n": 0}
    run = TorchAttention.run

    def counted(self, *args, **kwargs):
        runs["n"] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(TorchAttention, "run", counted)
    per_step: list[int] = []
    time_step = bench.time_step

    def watched(device, forward, warmup, repeats):
        before = runs["n"]
        forward()
        per_step.append(runs["n"] - before)
        return time_step(device, forward, warmup, repeats)

    monkeypatch.setattr(bench, "time_step", watched)
    argv = ["--device", "cpu", "--threads", "1", "--contexts", "64", "200", "--repeats", "1"]
    argv += ["--parts", "anatomy", "--out", str(tmp_path / "engine.json")]
    assert bench.cli(argv) == 0
    from decodecliff.engine.config import PRESETS

    layers = PRESETS["tiny"].num_layers  # one backend run a layer
    assert per_step == [layers, 0, layers, 0]  # (step, rest) at each context


def test_loop_drafter_and_host_parts_and_the_targets(doc):
    (loop,) = doc["loop"]
    assert loop["steps"] == 3 and loop["verify_steps_per_s"] > 0 and loop["context"] == 200
    assert {(r["mode"], r["context"]) for r in doc["drafter"]} == {
        (m, c) for m in ("chain", "tree") for c in (64, 200)
    }
    assert all(r["tokens"] == 4 for r in doc["host"])
    (target,) = doc["targets"]  # eager only on a CPU: the loop target alone applies
    assert target["target"] == "loop_verify_steps_per_s_min"
    assert (
        target["met"] == (target["value"] >= 40) and (target["missed_by"] is None) == target["met"]
    )


@pytest.mark.parametrize("spec", ["chain", "tree"])
def test_the_host_time_outside_a_step_leaves_out_every_step(spec):
    """Two tokens: the prefill emits the first, one decode step the second, so the time outside
    the step is the decode wall less that one step."""
    import argparse

    args = argparse.Namespace(gen=2, chunk_size=4096, draft_len=6, tree_nodes=16, threads=1, seed=0)
    row = bench.bench_host(64, spec, args)
    assert row["tokens"] == 2
    outside = row["decode_ms_per_token"] - row["step_ms_mean"]
    assert row["outside_step_ms_per_token"] == pytest.approx(outside, rel=1e-9, abs=1e-9)
    assert row["outside_step_ms_per_token"] < row["decode_ms_per_token"]


def test_bad_input_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.cli(["--device", "cpu", "--paths", "graphs", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "CUDA" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # else a document without the part, and no reason
        bench.cli(["--device", "cpu", "--parts", "gemms", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "--parts gemms needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(SystemExit) as exc:  # else every host point failed on an empty mean
        bench.cli(["--device", "cpu", "--parts", "host", "--gen", "1", "--contexts", "64",
                   "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert exc.value.code == 2 and "--gen must be >= 2" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(SystemExit):
        bench.cli(["--device", "cpu", "--contexts", "0", "--out", str(tmp_path / "x.json")])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench.cli(["--gemm-prefetch-mb", "65", "--out", str(tmp_path / "x.json")])
    assert "--gemm-prefetch-mb must be in 0..64" in capsys.readouterr().err
    for bad, said in (
        (["--dtype", "foo"], "dtype must be one of"),
        (["--draft-len", "0"], "draft len must be in 2..64"),
        (["--parts", "host", "--chunk-size", "0"], "chunk size must be >= 1"),
        (["--out", str(tmp_path)], "is a folder"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.cli(["--device", "cpu", "--out", str(tmp_path / "x.json"), *bad])
        assert exc.value.code == 2 and said in capsys.readouterr().err, bad
    assert not (tmp_path / "x.json").exists()


def _as_path(doc: dict, gemm: str) -> dict:
    """A CPU document as if its engines had run the GEMM path ``gemm`` (a CPU runs torch's
    matmul alone), named as the bench names such rows: for the merge's own logic."""
    rows = [{**r, "backend": bench.run_label("torch", gemm), "gemm": gemm} for r in doc["rows"]]
    loop = [{**r, "backend": bench.run_label("torch", gemm), "gemm": gemm} for r in doc["loop"]]
    return {**doc, "args": {**doc["args"], "gemm": [gemm]}, "rows": rows, "loop": loop}


def test_each_gemm_path_is_a_configuration_of_its_own(tmp_path, capsys):
    """--gemm cublas fused: a backend's two engines side by side, the second named by its path,
    and a part measured with another path merges beside them. A CPU runs torch's matmul alone:
    another path there is a usage error, not rows named after it."""
    base = ["--device", "cpu", "--threads", "1", "--contexts", "64", "--repeats", "1"]
    base += ["--draft-len", "4", "--parts", "anatomy", "loop", "--loop-steps", "2"]
    args = bench.parse_args([*base, "--gemm", "cublas", "--out", str(tmp_path / "x.json")])
    args.gemm = ["cublas", "fused"]
    named = [(bench.run_label(b, g), g) for b, g, _, _ in bench.configurations(args)]
    assert named == [("torch", "cublas"), ("torch + fused GEMMs", "fused")]
    for gemm in ("fused", "auto", "pdl", "cublas-pdl"):
        with pytest.raises(SystemExit) as exc:
            bench.cli([*base, "--gemm", "cublas", gemm, "--out", str(tmp_path / "x.json")])
        assert exc.value.code == 2
        assert f"--gemm {gemm} needs a CUDA device" in capsys.readouterr().err
    one = tmp_path / "one.json"
    assert bench.cli([*base, "--gemm", "cublas", "--out", str(one)]) == 0
    cpu = json.loads(one.read_text())
    doc = engine_merge.merge([cpu, _as_path(cpu, "fused")])
    assert [(r["backend"], r["gemm"]) for r in doc["rows"]] == named
    assert [(r["backend"], r["gemm"]) for r in doc["loop"]] == named
    auto = _as_path(cpu, "auto")
    merged = engine_merge.merge([doc, auto])
    assert [r["backend"] for r in merged["rows"]][-1] == "torch + auto GEMMs"
    assert merged["args"]["gemm"] == ["cublas", "fused", "auto"]
    # a group one part failed and another measured: named with its spaces, it is cleared
    failed = {"what": "anatomy torch + fused GEMMs eager chain", "error": "OutOfMemory"}
    kept = {"what": "loop torch + auto GEMMs eager 64", "error": "OutOfMemory"}
    cut = {**auto, "loop": [], "errors": [failed, kept]}
    assert engine_merge.merge([doc, cut])["errors"] == [kept]
    # the drafter and host parts' groups too
    late = [
        {"what": f"{part} 64", "error": "MemoryError()"} for part in ("drafter chain", "host tree")
    ]
    cut_late = {**cut, "errors": [*late, kept]}
    measured = {**auto, "rows": [], "loop": [], "errors": []}
    measured["drafter"] = [{"mode": "chain", "context": 64}]
    measured["host"] = [{"spec": "tree", "context": 64}]
    assert engine_merge.merge([cut_late, measured])["errors"] == [kept]
    # a document of the time --gemm took one path: its rows named by that path as now
    legacy = {**cut, "args": {**cut["args"], "gemm": "pdl", "contexts": [65]}, "errors": []}
    legacy["rows"] = [{**r, "backend": "torch", "gemm": "pdl", "context": 65} for r in cut["rows"]]
    assert engine_merge.merge([doc, legacy])["rows"][-1]["backend"] == "torch + pdl GEMMs"
    for bad, said in (
        (["fused", "fused"], "--gemm names fused twice"),
        (["cublas", "--contexts", "64", "64"], "--contexts names 64 twice"),  # rows written twice
        (["cublas", "pdl", "--parts", "gemms"], "--parts gemms takes one --gemm path"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.cli([*base, "--gemm", *bad, "--out", str(tmp_path / "x.json")])
        assert exc.value.code == 2 and said in capsys.readouterr().err, bad


def test_a_cpu_step_has_no_kernel_timeline(doc):
    assert all(r["timeline"] is None and r["profile"]["timeline"] is None for r in doc["rows"])


def test_parts_of_a_cut_bench_merge_into_one_document(tmp_path):
    """A run cut after its chain group and a second run of the rest make one document."""
    base = ["--device", "cpu", "--threads", "1", "--contexts", "64", "--repeats", "1"]
    base += ["--draft-len", "4", "--tree-nodes", "16", "--loop-steps", "2"]
    first, rest, out = tmp_path / "first.json", tmp_path / "rest.json", tmp_path / "bench.json"
    chain = ["--modes", "chain", "--parts", "anatomy", "loop"]
    assert bench.cli([*base, *chain, "--out", str(first)]) == 0
    tree = ["--modes", "tree", "--parts", "anatomy"]  # the group the cut left out
    assert bench.cli([*base, *tree, "--out", str(rest)]) == 0
    assert engine_merge.cli([str(first), str(rest), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    parts = [json.loads(p.read_text()) for p in (first, rest)]
    assert [r["mode"] for r in doc["rows"]] == ["chain", "tree"]
    assert doc["rows"] == parts[0]["rows"] + parts[1]["rows"]
    assert doc["loop"] == parts[0]["loop"] and len(doc["loop"]) == 1
    assert doc["args"]["modes"] == ["chain", "tree"] and doc["args"]["out"] == str(first)
    assert doc["args"]["parts"] == ["anatomy", "loop"]
    assert [p["command"] for p in doc["parts"]] == [p["command"] for p in parts]
    assert doc["targets"] == bench.check_targets(doc["rows"], doc["loop"])
    with pytest.raises(ValueError, match="measured in more than one part"):
        engine_merge.merge([parts[0], parts[0]])
    other = {**parts[1], "env": {**parts[1]["env"], "git": "0000000"}}
    with pytest.raises(ValueError, match="differ in git"):
        engine_merge.merge([parts[0], other])
    # one commit, whether its checkout was marked dirty or named by its full hash
    commit = "ae4ecc3" + "0" * 33
    gits = (commit, "ae4ecc3-dirty")
    alike = [{**p, "env": {**p["env"], "git": g}} for p, g in zip(parts, gits, strict=True)]
    assert len(engine_merge.merge(alike)["rows"]) == len(doc["rows"])
    otherwise = {**parts[1], "args": {**parts[1]["args"], "dtype": "float64", "repeats": 3}}
    with pytest.raises(ValueError, match="differ in dtype, repeats"):
        engine_merge.merge([parts[0], otherwise])
    twice = {**parts[1], "gemms": [{"m": 16}]}
    with pytest.raises(ValueError, match="gemms measured in more than one part"):
        engine_merge.merge([{**parts[0], "gemms": [{"m": 16}]}, twice])
    assert engine_merge.merge([parts[0], twice])["gemms"] == [{"m": 16}]
    # a merged document merges again, every part's command kept in order
    third = {
        **parts[1],
        "command": "third",
        "rows": [{**r, "context": 65} for r in parts[1]["rows"]],
    }
    again = engine_merge.merge([doc, third])
    assert [p["command"] for p in again["parts"]] == [*(p["command"] for p in parts), "third"]
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(SystemExit) as exc:
        engine_merge.cli([str(first), str(listed), "--out", str(tmp_path / "m.json")])
    assert exc.value.code == 2 and not (tmp_path / "m.json").exists()
    for field, value in (("env", None), ("args", []), ("rows", {}), ("loop", [1])):
        malformed = tmp_path / f"{field}.json"
        malformed.write_text(json.dumps({**parts[1], field: value}))
        with pytest.raises(SystemExit) as exc:
            engine_merge.cli([str(first), str(malformed), "--out", str(tmp_path / "m.json")])
        assert exc.value.code == 2 and not (tmp_path / "m.json").exists(), field


def test_a_merge_keeps_measured_ceilings_and_drops_errors_another_part_measured(tmp_path):
    base = ["--device", "cpu", "--threads", "1", "--contexts", "64", "--repeats", "1"]
    base += ["--draft-len", "4", "--tree-nodes", "16", "--loop-steps", "2"]
    loop, tree = tmp_path / "loop.json", tmp_path / "tree.json"
    assert bench.cli([*base, "--modes", "chain", "--parts", "loop", "--out", str(loop)]) == 0
    assert bench.cli([*base, "--modes", "tree", "--parts", "anatomy", "--out", str(tree)]) == 0
    looped, anatomy = (json.loads(p.read_text()) for p in (loop, tree))
    assert looped["ceilings"] is None and anatomy["ceilings"]  # a loop measures no ceilings
    row = anatomy["rows"][0]
    failed = {"what": f"anatomy {row['backend']} {row['path']} tree", "error": "OutOfMemory"}
    other = {"what": f"anatomy {row['backend']} {row['path']} chain", "error": "OutOfMemory"}
    looped["errors"] = [failed, other]  # the tree group failed here, the other part measured it
    doc = engine_merge.merge([looped, anatomy])
    assert doc["ceilings"] == anatomy["ceilings"]
    assert doc["errors"] == [other]
    assert doc["parts"][0]["errors"] == [failed, other] and doc["parts"][1]["ceilings"]
