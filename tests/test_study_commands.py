"""A GPU study measured in parts: scripts/study_commands.py lists the rules' own commands, and
scripts/gpu_study_run.sh runs them by key, one GPU per worker, packing what they wrote."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from decodecliff.study import config, runs
from decodecliff.study.plan import Study

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "scripts" / "gpu_study_run.sh"


def study_commands():
    spec = importlib.util.spec_from_file_location(
        "study_commands", REPO / "scripts/study_commands.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commands_are_keyed_by_rule_and_point() -> None:
    key = study_commands().key
    sweep = (
        "export A=1; exec decodecliff sweep --server-cmd 'x' --name custom-p1 --contexts 1024 --x"
    )
    assert key(sweep) == "custom-p1:1024"
    assert key("exec decodecliff bench-kernels --device cuda --out x") == "bench_kernels"
    assert key("decodecliff build-kernel --arch 90 --out results/build") == "build_kernel"
    assert key("jupytext --to ipynb notebooks/report.py") is None


def test_the_h200_commands_are_the_configs_every_point() -> None:
    lines = (REPO / "scripts" / "study-h200.txt").read_text().splitlines()
    keys = [line.split("\t")[0] for line in lines]
    h200 = Study(config.load([REPO / "config.yaml", REPO / "config" / "h200.yaml"]))
    points = {f"{name}:{ctx}" for name, ctx in h200.order()}
    assert sorted(keys) == sorted({"build_kernel", "bench_kernels", "bench_engine"} | points)
    assert not any("--skip-reason" in line for line in lines)  # every peer runs there


def test_the_h200_commands_are_the_rules_own_commands() -> None:
    """The file is written once (where the peers are visible) and the rules move on: every command
    the dry run gives here (a peer missing here is planned as a skip) must be the file's line."""
    sc = study_commands()
    given = dict(
        line.split("\t", 1)
        for line in (REPO / "scripts" / "study-h200.txt").read_text().splitlines()
    )
    planned = re.findall(r"^Shell command: (.*)$", sc.dry_run(REPO / "config/h200.yaml"), re.M)
    checked = 0
    for command in planned:
        if "--skip-reason" not in command and (name := sc.key(command)) is not None:
            assert given[name] == command, f"{name}: regenerate scripts/study-h200.txt"
            checked += 1
    assert checked >= 3 + 5 * 6  # the build and the benches, and the custom and Triton servers


def test_the_h100_study_is_measured_by_the_h200_study_s_commands(tmp_path, capsys) -> None:
    """The H100 study (config/h100.yaml over config/h200.yaml, given as publish_study.sh takes
    it) plans the commands of scripts/study-h200.txt, the file its calls ran."""
    sc = study_commands()
    given = dict(
        line.split("\t", 1)
        for line in (REPO / "scripts" / "study-h200.txt").read_text().splitlines()
    )
    plan = sc.dry_run(REPO / "config/h200.yaml", REPO / "config/h100.yaml")
    planned = {
        name: command
        for command in re.findall(r"^Shell command: (.*)$", plan, re.M)
        if (name := sc.key(command)) is not None
    }
    assert sorted(planned) == sorted(given)
    ran = [n for n, c in planned.items() if "--skip-reason" not in c]  # a peer missing here
    assert len(ran) >= 3 + 5 * 6 and all(planned[n] == given[n] for n in ran)
    with pytest.raises(SystemExit):  # each file of the study checked, as publish_study.sh does
        sc.main([f"{REPO / 'config/h200.yaml'}:{tmp_path / 'none.yaml'}"])
    assert f"no config file {tmp_path / 'none.yaml'}\n" in capsys.readouterr().err


def test_missing_lists_the_keys_a_run_has_no_result_for(tmp_path: Path, capsys) -> None:
    commands = tmp_path / "cmds.txt"
    keys = ["bench_engine", "build_kernel", "a-p1:1024", "a-p1:2048", "a-p1:4096", "a-p1:8192"]
    commands.write_text("".join(f"{k}\tx\n" for k in keys))
    sweep = tmp_path / "run" / "sweep" / "a-p1"
    sweep.mkdir(parents=True)
    (sweep / "ctx1024.json").write_text('{"status": "ok"}')
    (sweep / "ctx4096.json").write_text('{"status": "failed", "reason": "server died"}')
    (sweep / "ctx8192.json").write_text('{"status": "skipped"}')  # the rule's result all the same
    (tmp_path / "run" / "build").mkdir()
    (tmp_path / "run" / "build" / "build.json").write_text("{}")
    run = tmp_path / "run"
    missing = study_commands().missing(commands, run)
    assert missing == ["bench_engine", "a-p1:2048", "a-p1:4096"]
    # a mistyped run folder is said so, not read as one that lacks every key
    wrong = {"run folder": [commands, tmp_path / "rnu"], "commands file": [tmp_path / "x", run]}
    for what, args in wrong.items():
        with pytest.raises(SystemExit):
            study_commands().main(["--missing", *map(str, args)])
        assert f"no {what} {args[0] if what == 'commands file' else args[1]}" in (
            capsys.readouterr().err
        )


def test_a_bench_cut_short_or_a_part_of_one_is_measured_only_once_finished(tmp_path, capsys):
    """Both benches rewrite their document as they go: one a call cut short is still missing
    (the engine's lacks its targets, the kernel bench's says it is not complete); the halves of
    the engine bench count as measured once finished, or once joined into its document."""
    import json

    keys = ["bench_kernels", "bench_engine", "bench_engine_slow", "bench_engine_fast"]
    commands = tmp_path / "cmds.txt"
    commands.write_text("".join(f"{k}\tx\n" for k in keys))
    run = tmp_path / "run"
    (run / "kernels").mkdir(parents=True)
    (run / "engine").mkdir()
    missing = study_commands().missing
    bench = run / "kernels/bench.json"
    bench.write_text(json.dumps({"env": {}, "points": [], "complete": False}))
    (run / "engine/bench.json").write_text(json.dumps({"env": {}, "rows": []}))  # no targets
    (run / "engine/bench-slow.json").write_text(json.dumps({"env": {}, "rows": [], "targets": []}))
    assert missing(commands, run) == ["bench_kernels", "bench_engine", "bench_engine_fast"]
    bench.write_text(json.dumps({"env": {}, "points": []}))  # written before `complete` was
    (run / "engine/bench.json").write_text(json.dumps({"env": {}, "rows": [], "targets": []}))
    assert missing(commands, run) == []  # the halves joined
    commands.write_text("bench_engine_slow\tx\nbench_kernel\tx\n")  # a key of no rule
    with pytest.raises(SystemExit):
        study_commands().main(["--missing", str(commands), str(run)])
    assert "unknown key 'bench_kernel'" in capsys.readouterr().err


def test_the_engine_bench_splits_into_parts_that_join_back(tmp_path: Path, capsys) -> None:
    """Each part is the rule's command with a share of its backends, its own output and log."""
    module = study_commands()
    commands = (REPO / "scripts" / "study-h200.txt").read_text()
    split = module.split_engine(commands, ["slow=triton sglang"]).splitlines()
    assert split[: len(commands.splitlines())] == commands.splitlines()  # the file as it was
    parts = dict(line.split("\t", 1) for line in split[len(commands.splitlines()) :])
    assert list(parts) == ["bench_engine_slow", "bench_engine_rest"]
    whole = dict(line.split("\t", 1) for line in commands.splitlines())["bench_engine"]
    backends = re.search(r"--backends (.+?) --", whole)[1].split()
    chosen = [re.search(r"--backends (.+?) --", c)[1].split() for c in parts.values()]
    assert chosen[0] == ["triton", "sglang"] and sorted(chosen[0] + chosen[1]) == sorted(backends)
    for name, command in parts.items():
        part = name.removeprefix("bench_engine_")
        assert f"--out results/engine/bench-{part}.json " in command
        assert f"> results/logs/engine/bench_engine-{part}.log 2>&1" in command
        assert re.sub(r"--backends .+? --", "", command).replace(f"-{part}.", ".") == re.sub(
            r"--backends .+? --", "", whole
        )  # nothing else changed
    for bad in (["slow=triton nvidia"], ["slow=triton", "again=triton"], ["rest=triton"], ["x"]):
        with pytest.raises(ValueError):
            module.split_engine(commands, bad)
    # a file split already is split no further: its keys would repeat, a backend run twice
    with pytest.raises(ValueError, match="split already .bench_engine_slow bench_engine_rest."):
        module.split_engine("\n".join(split), ["fast=custom"])
    with pytest.raises(SystemExit):
        module.main(["--split-engine", str(REPO / "scripts" / "study-h200.txt"), "slow=cuda"])
    assert "not a split of" in capsys.readouterr().err


def fake_runner(tmp_path: Path) -> Path:
    """The runner in a tree of its own, its GPU machine's set-up left out, with commands that
    write where the rules write."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(RUNNER, tmp_path / "scripts")
    (tmp_path / "scripts" / "gpu_env.sh").write_text("")
    (tmp_path / "results").mkdir()
    log = "results/logs/sweep/{0}/ctx1.log"
    lines = ["build_kernel\tmkdir -p results/build > results/logs/build/build.log 2>&1"]
    for name, status in (("a", "ok"), ("b", "ok"), ("c", "ok"), ("d", "failed")):
        fields = '{"status": "%s", "gpu": "%s"}'
        point = f"printf '{fields}' {status} \"${{CUDA_VISIBLE_DEVICES:-}}\""
        write = f"mkdir -p results/sweep/{name}; {point} > {POINT.format(name)}"
        lines.append(f"{name}:1\t{{ echo run; sleep 1; {write}; }} > {log.format(name)}")
    lines.append(f"slow:1\t{{ echo started; sleep 60; }} > {log.format('slow')}")
    (tmp_path / "cmds.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


POINT = "results/sweep/{0}/ctx1.json"


def point_of(tree: Path, name: str) -> dict:
    import json

    return json.loads((tree / POINT.format(name)).read_text())


def run(tree: Path, *keys: str, **env: str) -> subprocess.CompletedProcess:
    out = tree / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", "scripts/gpu_study_run.sh", "abc1234", "cmds.txt", *keys],
        cwd=tree, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "OUT": str(out), **env},
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock (util-linux)")
def test_keys_spread_over_the_gpus_and_what_they_wrote_comes_back(tmp_path: Path) -> None:
    tree = fake_runner(tmp_path)
    done = run(tree, "a:1", "b:1", "c:1", GPUS="2")
    assert done.returncode == 0, done.stderr
    assert "build_kernel: rc 0" in done.stdout  # the rule's build first
    assert {point_of(tree, n)["gpu"] for n in "abc"} == {"0", "1"}
    assert "[gpu 0] == " in done.stdout and "[gpu 1] == " in done.stdout
    with tarfile.open(tree / "out" / "study.tar") as tar:
        names = set(tar.getnames())
    assert {"./sweep/a/ctx1.json", "./sweep/c/ctx1.json", "./logs/sweep/b/ctx1.log"} <= {
        n if n.startswith("./") else f"./{n}" for n in names
    }


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock (util-linux)")
def test_a_call_names_what_it_did_not_measure_and_measures_nothing_twice(tmp_path) -> None:
    tree = fake_runner(tmp_path)
    done = run(tree, "d:1", "a:1", "d:1")
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout.count("d:1: rc 0") == 1  # a key given twice runs once, failed or not
    assert done.stdout.rstrip().endswith("not measured: d:1")  # its point records a failure
    # the same machine at the same commit, called again: the point it holds is not measured again
    (tree / "results/logs/sweep/a/ctx1.log").write_text("the earlier call's\n")
    done = run(tree, "a:1", "b:1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a:1: measured on this machine already" in done.stdout
    assert (tree / "results/logs/sweep/a/ctx1.log").read_text() == "the earlier call's\n"


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock (util-linux)")
def test_a_key_still_running_at_the_call_s_limit_is_stopped_and_packed(tmp_path) -> None:
    tree = fake_runner(tmp_path)
    done = run(tree, "slow:1", "a:1", CALL_S="15")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "slow:1: stopped at CALL_S (15 s)" in done.stdout
    assert "skipped a:1: past BUDGET_S or CALL_S" in done.stdout  # under 10 s left
    assert "not measured: a:1 slow:1" in done.stdout
    with tarfile.open(tree / "out" / "study.tar") as tar:
        log = tar.extractfile("logs/sweep/slow/ctx1.log").read()
    assert log == b"started\n"  # what the stopped key wrote comes back


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock (util-linux)")
def test_no_key_starts_past_the_budget_and_an_unknown_key_says_so(tmp_path: Path) -> None:
    tree = fake_runner(tmp_path)
    done = run(tree, "a:1", "nope:9", "b:1", BUDGET_S="-1")
    assert done.returncode == 4, done.stderr
    assert "skipped a:1: past BUDGET_S" in done.stdout
    assert not (tree / POINT.format("a")).exists()
    done = run(tree, "nope:9")
    assert "no command for nope:9" in done.stdout and done.returncode == 4
    # a key with two lines in the file (one appended again) runs neither
    with (tree / "cmds.txt").open("a") as f:
        f.write("b:1\techo again > results/logs/sweep/b/ctx1.log\n")
    done = run(tree, "b:1")
    assert "2 commands for b:1 in cmds.txt: none run" in done.stdout and done.returncode == 4
    assert not (tree / POINT.format("b")).exists()


@pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock (util-linux)")
def test_a_call_on_another_gpu_than_required_measures_nothing(tmp_path: Path) -> None:
    tree = fake_runner(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB'\n")
    smi.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    done = run(tree, "a:1", REQUIRE_GPU="H200", PATH=path)
    assert done.returncode == 3
    assert "not an H200 (REQUIRE_GPU): nothing measured" in done.stdout
    assert not (tree / "results/build").exists() and not (tree / "out/study.tar").exists()
    done = run(tree, "a:1", REQUIRE_GPU="H100", PATH=path)
    assert done.returncode == 0 and point_of(tree, "a")["status"] == "ok"


def _tar(path: Path, files: dict[str, str], inner: bool = False) -> Path:
    """A study.tar of ``files`` (results/ paths), or a call's tar holding one at s/study.tar."""
    import io

    def pack(target, members: dict[str, bytes]) -> None:
        opened = {"fileobj": target} if isinstance(target, io.BytesIO) else {"name": target}
        with tarfile.open(mode="w", **opened) as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    members = {f"./{name}": text.encode() for name, text in files.items()}
    if not inner:
        pack(path, members)
        return path
    buf = io.BytesIO()
    pack(buf, members)
    pack(path, {"./s/env.txt": b"H200\n", "./s/study.tar": buf.getvalue()})
    return path


LOG = "sweep/custom-p1/server-custom-p1.log"


def launch(n: int) -> str:
    return f"\n==== launch 1 at 2026-12-04T1{n}:00:00: ['decodecliff', 'serve']\nready\nbye\n"


def test_a_run_folder_is_filled_from_calls_by_merging(tmp_path: Path) -> None:

    run = tmp_path / "run"
    (run / "sweep/custom-p1").mkdir(parents=True)
    (run / "build").mkdir()
    (run / "sweep/custom-p1/ctx1024.json").write_text("{1k}")
    (run / LOG).write_text(launch(1))
    (run / "build/build.json").write_text("{build}")
    (run / "build/ptxas.log").write_text("ptxas /tmp/a")
    (run / "logs/build").mkdir(parents=True)
    (run / "logs/build/build_kernel.log").write_text("k1\nk2")
    first = {
        "sweep/custom-p1/ctx1024.json": "{1k}",  # the same bytes: left alone
        "sweep/custom-p1/ctx64000.json": "{64k}",
        LOG: launch(1) + launch(2),
        "build/build.json": "{build}",
        "build/ptxas.log": "ptxas /tmp/b",  # the same build's log, another temporary name
        "logs/build/build_kernel.log": "k2\nk1",  # its rule's log, the kernels in another order
        "build/.built-by-rule-abc": "",
        "build/lib.so": "ELF",
    }
    second = {**first, "sweep/custom-p1/ctx128000.json": "{128k}", LOG: launch(1) + launch(2)}
    second[LOG] += launch(3)
    merge = runs.merge_calls(
        [_tar(tmp_path / "c1.tar", first, inner=True), _tar(tmp_path / "c2.tar", second)], run
    )
    assert (run / LOG).read_text() == launch(1) + launch(2) + launch(3)
    assert (run / "sweep/custom-p1/ctx64000.json").read_text() == "{64k}"
    assert (run / "sweep/custom-p1/ctx128000.json").read_text() == "{128k}"
    assert (run / "build/ptxas.log").read_text() == "ptxas /tmp/a"
    assert (run / "logs/build/build_kernel.log").read_text() == "k1\nk2"
    assert not (run / "build/.built-by-rule-abc").exists() and not (run / "build/lib.so").exists()
    assert set(merge.added) == {"sweep/custom-p1/ctx64000.json", "sweep/custom-p1/ctx128000.json"}
    again = runs.merge_calls([tmp_path / "c2.tar"], run)  # a second unpacking changes nothing
    assert not again.added and not again.extended


def test_a_point_measured_twice_stops_the_merge_before_anything_is_written(tmp_path, capsys):

    run = tmp_path / "run"
    (run / "sweep/custom-p1").mkdir(parents=True)
    (run / "sweep/custom-p1/ctx1024.json").write_text("{1k}")
    call = _tar(
        tmp_path / "c.tar",
        {"sweep/custom-p1/ctx1024.json": "{1k again}", "sweep/custom-p1/ctx11000.json": "{11k}"},
    )
    with pytest.raises(ValueError, match=r"other bytes for 1 file.*ctx1024\.json"):
        runs.merge_calls([call], run)
    assert not (run / "sweep/custom-p1/ctx11000.json").exists()
    assert runs.main(["merge", str(call), "--into", str(run)]) == 1
    assert "nothing written" in capsys.readouterr().err


def test_a_failed_attempt_is_filed_apart_and_the_point_measured_again_takes_its_place(tmp_path):
    import json

    def point(status: str, n: int) -> str:
        return json.dumps({"env": {"git": "abc1234"}, "status": status, "reason": f"try {n}"})

    run, key = tmp_path / "run", "sweep/s/ctx1.json"
    log = "logs/sweep/s/ctx1.log"
    runs.merge_calls([_tar(tmp_path / "a.tar", {key: point("failed", 1), log: "died"})], run)
    assert json.loads((run / key).read_text())["status"] == "failed"  # the key's only attempt
    # measured again: the ok point and its log take the failed one's place, which is kept
    merge = runs.merge_calls([_tar(tmp_path / "b.tar", {key: point("ok", 2), log: "ok"})], run)
    assert set(merge.replaced) == {key, log} and len(merge.filed) == 2
    assert json.loads((run / key).read_text())["status"] == "ok"
    assert (run / log).read_text() == "ok"
    filed = sorted(str(p.relative_to(run)) for p in (run / "failed").rglob("*.*"))
    assert [f.rsplit("-", 1)[0] for f in filed] == [
        "failed/logs/sweep/s/ctx1",
        "failed/sweep/s/ctx1",
    ]
    assert len({f.rsplit("-", 1)[1].split(".")[0] for f in filed}) == 1  # one attempt's pair
    # a later failure never displaces it, and a key cut short (a log, no point) is filed too
    later = {key: point("failed", 3), log: "died again", "logs/sweep/s/ctx2.log": "started"}
    runs.merge_calls([_tar(tmp_path / "c.tar", later)], run)
    assert json.loads((run / key).read_text())["status"] == "ok"
    assert not (run / "logs/sweep/s/ctx2.log").exists()
    assert len(list((run / "failed").rglob("*.*"))) == 5
    again = runs.merge_calls([tmp_path / "a.tar", tmp_path / "c.tar"], run)  # nothing new
    assert not again.added and not again.replaced and not again.filed
    described = runs.describe(run)
    assert "2 failed points kept apart (their keys measured again, or failed again): try 1; " in (
        described
    )
    assert "try 3; 1 logs of keys cut short before their point" in described
    with pytest.raises(ValueError, match="other bytes"):  # two results: the publisher decides
        runs.merge_calls([_tar(tmp_path / "d.tar", {key: point("ok", 4)})], run)


def test_a_bench_cut_short_stands_until_a_finished_one_takes_its_place(tmp_path) -> None:
    import json

    def engine(n: int, finished: bool) -> str:
        doc = {"env": {"git": "abc1234"}, "rows": [{"n": i} for i in range(n)]}
        return json.dumps({**doc, "targets": []} if finished else doc)

    run, key, log = tmp_path / "run", "engine/bench-slow.json", "logs/engine/bench_engine-slow.log"
    runs.merge_calls([_tar(tmp_path / "a.tar", {key: engine(2, False), log: "cut"})], run)
    assert "| `engine/bench-slow.json` | `abc1234` | - | 2 rows, 0 failed, cut short |" in (
        runs.describe(run)
    )
    merge = runs.merge_calls([_tar(tmp_path / "b.tar", {key: engine(4, True), log: "done"})], run)
    assert set(merge.replaced) == {key, log} and len(merge.filed) == 2
    assert len(json.loads((run / key).read_text())["rows"]) == 4
    # a later call cut short never displaces it; its document and log are kept on record
    merge = runs.merge_calls([_tar(tmp_path / "c.tar", {key: engine(1, False), log: "cut"})], run)
    assert not merge.replaced and len(merge.filed) == 2  # named by this attempt's document
    assert len(json.loads((run / key).read_text())["rows"]) == 4
    described = runs.describe(run)
    assert "4 rows, 0 failed |" in described and "; 2 benches cut short, measured again |" in (
        described
    )
    assert "0 logs of keys cut short before their point" in described  # each beside its bench
    with pytest.raises(ValueError, match="other bytes"):  # two finished: the publisher decides
        runs.merge_calls([_tar(tmp_path / "d.tar", {key: engine(5, True)})], run)


def test_filed_logs_pair_with_their_points_wherever_the_run_folder_lies(tmp_path) -> None:

    run = tmp_path / "logs" / "run"  # a folder named like the rule logs' above the run folder
    (run / "failed/sweep/s").mkdir(parents=True)
    (run / "failed/logs/sweep/s").mkdir(parents=True)
    (run / "failed/sweep/s/ctx1-aaaa.json").write_text('{"env": {"git": "a"}, "status": "failed"}')
    (run / "failed/logs/sweep/s/ctx1-aaaa.log").write_text("its log")
    (run / "failed/logs/sweep/s/ctx2-bbbb.log").write_text("cut short")
    assert "1 logs of keys cut short" in runs.describe(run)


def test_a_tar_reaching_outside_the_folder_or_holding_nothing_is_refused(tmp_path) -> None:

    run = tmp_path / "deep" / "run"
    for name in ("../escaped.json", "/tmp/decodecliff-escaped.json"):
        call = _tar(tmp_path / "t.tar", {name: "{}", "sweep/s/ctx1.json": "{}"})
        with pytest.raises(ValueError, match="would land outside the run folder"):
            runs.merge_calls([call], run)
    assert not (tmp_path / "deep/escaped.json").exists() and not run.exists()
    assert not Path("/tmp/decodecliff-escaped.json").exists()
    with pytest.raises(ValueError, match="holds no study files"):
        runs.merge_calls([_tar(tmp_path / "e.tar", {"build/lib.so": "ELF"})], run)
    # a call that stopped before packing (another GPU, a failed build) brings back its env.txt
    with pytest.raises(ValueError, match="'s/env.txt' is no study file"):
        runs.merge_calls([_tar(tmp_path / "f.tar", {"s/env.txt": "H100\n"})], run)
    assert not run.exists()
    # in a call's tar, its study.tar is named by the call's: which of the calls merged it was
    named = re.escape(f"{tmp_path / 'g.tar'}:./s/study.tar: ")
    call = _tar(tmp_path / "g.tar", {"../x.json": "{}"}, inner=True)
    with pytest.raises(ValueError, match=f"^{named}'../x.json' would land outside"):
        runs.merge_calls([_tar(tmp_path / "a.tar", {"sweep/s/ctx1.json": "{}"}), call], run)
    call = _tar(tmp_path / "g.tar", {"env.txt": "H100\n"}, inner=True)
    with pytest.raises(ValueError, match=f"^{named}'env.txt' is no study file"):
        runs.merge_calls([call], run)
    assert not run.exists()


def test_a_rerun_cut_short_beside_the_point_it_left_is_filed(tmp_path) -> None:
    """A key measured again on the same machine and cut short brings back the earlier point
    unchanged (a point is written whole at its end) beside a new log: the log is the attempt."""

    run, key, log = tmp_path / "run", "sweep/s/ctx1.json", "logs/sweep/s/ctx1.log"
    point = '{"env": {"git": "abc1234"}, "status": "failed", "reason": "timeout"}'
    runs.merge_calls([_tar(tmp_path / "a.tar", {key: point, log: "first try"})], run)
    merge = runs.merge_calls([_tar(tmp_path / "b.tar", {key: point, log: "second try"})], run)
    assert (run / log).read_text() == "first try"
    assert [n.rsplit("-", 1)[0] for n in merge.filed] == ["failed/logs/sweep/s/ctx1"]


def test_a_server_log_cut_inside_a_character_merges(tmp_path) -> None:
    """A log packed while its server wrote may end inside a UTF-8 character (tqdm's bars)."""

    run, log = tmp_path / "run", "sweep/s/server-s.log"
    full = "\n==== launch 1 at 2026-12-04T10:00:00: ['serve']\nprefill █████\nbye\n".encode()
    cut = full[: full.index("█".encode()) + 2]
    for name, data in (("cut", cut), ("full", full)):
        (tmp_path / name).write_bytes(data)
    calls = []
    for name in ("cut", "full"):
        calls.append(tmp_path / f"{name}.tar")
        with tarfile.open(calls[-1], "w") as tar:
            tar.add(tmp_path / name, arcname=log)
    runs.merge_calls(calls[:1], run)
    runs.merge_calls(calls[1:], run)
    assert (run / log).read_bytes() == full


def test_a_merge_that_cannot_write_every_file_writes_none(tmp_path: Path) -> None:

    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep").write_text("a file where a folder must go")
    call = _tar(tmp_path / "c.tar", {"kernels/a.json": "{}", "sweep/s/ctx1.json": "{}"})
    with pytest.raises(ValueError, match=r"sweep/s/ctx1\.json \(a folder, or under a file\)"):
        runs.merge_calls([call], run)
    assert not (run / "kernels").exists()  # the file it could write, not written either


def test_a_merge_stopped_part_way_is_completed_by_merging_again(tmp_path, monkeypatch) -> None:
    """Stopped inside any one file's write (^C, a full disk): no half file is left, no failed
    attempt that a point displaced is lost, and the same merge again gives the whole result."""
    import json

    def point(status: str) -> str:
        return json.dumps({"env": {"git": "abc1234"}, "status": status, "pad": "x" * 100})

    key, log = "sweep/s/ctx1.json", "logs/sweep/s/ctx1.log"
    failed = _tar(tmp_path / "a.tar", {key: point("failed"), log: "server died"})
    measured = {key: point("ok"), log: "ok", "sweep/s/ctx2.json": point("ok"), LOG: launch(1)}
    measured["logs/sweep/s/ctx2.log"] = "ok too"
    again = _tar(tmp_path / "b.tar", measured)

    def tree(run: Path) -> dict[str, bytes]:
        return {
            f.relative_to(run).as_posix(): f.read_bytes() for f in run.rglob("*") if f.is_file()
        }

    whole = tmp_path / "whole"
    runs.merge_calls([failed], whole)
    runs.merge_calls([again], whole)
    assert len(tree(whole)) == 7  # the failed point and its log filed apart
    write_bytes = Path.write_bytes
    for stop in range(1, 8):
        run = tmp_path / f"run{stop}"
        runs.merge_calls([failed], run)
        writes = []

        def cut(path: Path, data: bytes, stop=stop, writes=writes) -> int:
            writes.append(path)
            if len(writes) == stop:
                write_bytes(path, data[: len(data) // 2])
                raise KeyboardInterrupt
            return write_bytes(path, data)

        monkeypatch.setattr(Path, "write_bytes", cut)
        with pytest.raises(KeyboardInterrupt):
            runs.merge_calls([again], run)
        monkeypatch.setattr(Path, "write_bytes", write_bytes)
        runs.merge_calls([again], run)
        assert tree(run) == tree(whole), stop


def test_an_empty_file_then_another_in_one_merge_is_a_conflict(tmp_path: Path) -> None:

    calls = [
        _tar(tmp_path / f"c{i}.tar", {"sweep/s/ctx1.json": text})
        for i, text in enumerate(("", '{"status": "ok"}'))
    ]
    with pytest.raises(ValueError, match="other bytes for 1 file"):
        runs.merge_calls(calls, tmp_path / "run")


def test_a_launch_logged_further_is_taken_whole_and_one_logged_otherwise_stops(tmp_path) -> None:

    run = tmp_path / "run"
    cut = launch(1).removesuffix("bye\n")
    runs.merge_calls([_tar(tmp_path / "a.tar", {LOG: cut})], run)
    runs.merge_calls([_tar(tmp_path / "b.tar", {LOG: launch(1) + launch(2)})], run)
    assert (run / LOG).read_text() == launch(1) + launch(2)
    other = launch(1).replace("ready", "crashed")
    with pytest.raises(ValueError, match="a launch logged otherwise"):
        runs.merge_calls([_tar(tmp_path / "c.tar", {LOG: other})], run)
    # every call again, the cut one first: what the folder holds already (nothing to do)
    again = runs.merge_calls([tmp_path / "a.tar", tmp_path / "b.tar"], run)
    assert not again.added and not again.extended
    assert runs.merged_log("no launch here\n", "no launch, other text\n") is None


def test_a_server_log_moved_to_log_1_merges_with_its_log(tmp_path, monkeypatch) -> None:
    """The keeper moves a server log over half its cap to LOG.1 when it launches a server: a
    later call brings back the launch the folder holds (logged further) in LOG.1, the next one in
    the log. The two are one log, merged by its launches, each kept in the file the latest call
    has it in; the folder's LOG.1 keeps what a call's no longer holds."""
    older = LOG + ".1"
    calls = {
        "a.tar": {LOG: launch(1).removesuffix("bye\n")},  # launch 1, packed as it ran
        "b.tar": {older: launch(1), LOG: launch(2)},  # moved at launch 2
        "c.tar": {older: launch(2), LOG: launch(3)},  # moved again at launch 3
    }
    tars = [_tar(tmp_path / name, files) for name, files in calls.items()]
    run = tmp_path / "run"
    runs.merge_calls(tars[:2], run)
    assert (run / older).read_text() == launch(1) and (run / LOG).read_text() == launch(2)
    runs.merge_calls(tars[2:], run)
    assert (run / older).read_text() == launch(1) + launch(2)
    assert (run / LOG).read_text() == launch(3)
    again = runs.merge_calls(tars, run)  # every call again: nothing to do
    assert not again.added and not again.extended
    other = launch(2).replace("ready", "crashed")
    with pytest.raises(ValueError, match=r"custom-p1\.log \(a launch logged otherwise\)"):
        runs.merge_calls([_tar(tmp_path / "d.tar", {older: other})], run)
    # a merge stopped between the two files' writes is completed by merging the call again
    write_bytes = Path.write_bytes
    for stop in (1, 2):
        part = tmp_path / f"part{stop}"
        runs.merge_calls(tars[:1], part)
        writes = []

        def cut(path: Path, data: bytes, stop=stop, writes=writes) -> int:
            writes.append(path)
            if len(writes) == stop:
                raise KeyboardInterrupt
            return write_bytes(path, data)

        monkeypatch.setattr(Path, "write_bytes", cut)
        with pytest.raises(KeyboardInterrupt):
            runs.merge_calls(tars[1:2], part)
        monkeypatch.setattr(Path, "write_bytes", write_bytes)
        runs.merge_calls(tars[1:], part)
        assert (part / older).read_text() == launch(1) + launch(2), stop
        assert (part / LOG).read_text() == launch(3), stop


def test_a_run_folder_holds_one_commit(tmp_path: Path) -> None:
    import json

    def point(git: str) -> str:
        return json.dumps({"env": {"git": git}, "status": "ok"})

    run = tmp_path / "run"
    runs.merge_calls([_tar(tmp_path / "a.tar", {"sweep/s/ctx1.json": point("abc1234")})], run)
    same = _tar(tmp_path / "b.tar", {"sweep/s/ctx2.json": point("abc1234-dirty")})
    assert set(runs.merge_calls([same], run).added) == {"sweep/s/ctx2.json"}
    other = _tar(tmp_path / "c.tar", {"sweep/t/ctx1.json": point("fff0000")})
    with pytest.raises(ValueError, match="one commit's measurements; these are of abc1234"):
        runs.merge_calls([other], run)
    assert not (run / "sweep/t").exists()


def test_a_run_folder_holds_one_gpu(tmp_path: Path) -> None:
    # A lease may lend another GPU than the run's: its points must not join the run.
    import json

    def point(gpu: str | None) -> str:
        return json.dumps({"env": {"git": "abc1234", "gpu": gpu}, "status": "ok"})

    run = tmp_path / "run"
    # a build compiled on another GPU is the commit's build all the same
    built = {"build/build.json": point("NVIDIA H100 80GB HBM3")}
    runs.merge_calls([_tar(tmp_path / "build.tar", built)], run)
    first = {"sweep/s/ctx1.json": point("NVIDIA H200"), "kernels/bench.json": point(None)}
    runs.merge_calls([_tar(tmp_path / "a.tar", first)], run)
    same = _tar(tmp_path / "b.tar", {"sweep/s/ctx2.json": point("NVIDIA H200")})
    assert set(runs.merge_calls([same], run).added) == {"sweep/s/ctx2.json"}
    other = _tar(tmp_path / "c.tar", {"sweep/t/ctx1.json": point("NVIDIA H100 80GB HBM3")})
    with pytest.raises(ValueError, match="one GPU's measurements; these are of NVIDIA H200 .*H100"):
        runs.merge_calls([other], run)
    assert not (run / "sweep/t").exists()


def test_a_run_folder_named_for_a_commit_and_gpu_takes_no_other_s_measurements(tmp_path) -> None:
    """results/runs/h200/05f0426 names its commit and GPU: the first call merged into it is held
    to them too, not only the calls after it to the first's."""
    import json

    def point(git: str, gpu: str) -> dict[str, str]:
        return {"sweep/s/ctx1.json": json.dumps({"env": {"git": git, "gpu": gpu}, "status": "ok"})}

    run = tmp_path / "results/runs/h200/05f0426"
    for git, gpu, what in (
        ("7fe4732", "NVIDIA H200", "another commit"),
        ("05f0426", "NVIDIA H100 80GB HBM3", "another GPU"),
    ):
        call = _tar(tmp_path / "c.tar", point(git, gpu))
        with pytest.raises(ValueError, match=f"named for {what} than its measurements'"):
            runs.merge_calls([call], run)
        assert not run.exists()
    for git in ("05f0426-dirty", "05f0426" + "0" * 33):
        call = _tar(tmp_path / "c.tar", point(git, "NVIDIA H200"))
        assert set(runs.merge_calls([call], run).added) == {"sweep/s/ctx1.json"}
        shutil.rmtree(run)
    # a folder laid out otherwise names nothing
    call = _tar(tmp_path / "c.tar", point("7fe4732", "NVIDIA H100 80GB HBM3"))
    assert runs.merge_calls([call], tmp_path / "runs/05f0426").added


def test_one_commit_s_build_recorded_on_two_machines_and_hand_kept_logs_merge(tmp_path) -> None:
    import json

    def record(host: str) -> str:
        return json.dumps({"ok": True, "env": {"git": "abc1234", "host": host, "cpu_count": 16}})

    run = tmp_path / "run"
    (run / "gpu-logs/sm120/check.json").mkdir(parents=True)  # a folder named like a result
    (run / "gpu-logs/x.json").write_text(json.dumps({"env": {"git": "0000000+patch"}}))
    point = json.dumps({"env": {"git": "abc1234" + "0" * 33}, "status": "ok"})  # git's full hash
    first = {"build/build.json": record("a"), "sweep/s/ctx1.json": point}
    runs.merge_calls([_tar(tmp_path / "a.tar", first)], run)
    later = {"build/build.json": record("b"), "sweep/s/ctx2.json": point}
    merge = runs.merge_calls([_tar(tmp_path / "b.tar", later)], run)
    assert set(merge.added) == {"sweep/s/ctx2.json"} and "build/build.json" in merge.unchanged
    assert json.loads((run / "build/build.json").read_text())["env"]["host"] == "a"
    # a rebuild lists the kernels in the order nvcc's threads ended: the same build
    kernels = [{"kernel": "k1", "arch": 90}, {"kernel": "k2", "arch": 120}]
    ordered = [
        json.loads(record(h)) | {"kernels": k} for h, k in (("a", kernels), ("b", kernels[::-1]))
    ]
    runs.merge_calls(
        [_tar(tmp_path / "k1.tar", {"build/build.json": json.dumps(ordered[0])})], tmp_path / "k"
    )
    merge = runs.merge_calls(
        [_tar(tmp_path / "k2.tar", {"build/build.json": json.dumps(ordered[1])})], tmp_path / "k"
    )
    assert "build/build.json" in merge.unchanged

    # a rebuild of the same tree in another folder (a copy sent beside the working tree) is the
    # same build; another nvcc flag is not
    def placed(root: str, *flags: str) -> str:
        cmd = ["/usr/local/cuda/bin/nvcc", *flags, "-I", f"{root}/csrc", f"{root}/csrc/mla.cu"]
        return json.dumps(json.loads(record("a")) | {"command": cmd, "library": f"{root}/x.so"})

    runs.merge_calls(
        [_tar(tmp_path / "p1.tar", {"build/build.json": placed("/w")})], tmp_path / "p"
    )
    moved = _tar(tmp_path / "p2.tar", {"build/build.json": placed("/w/.run/tree")})
    assert "build/build.json" in runs.merge_calls([moved], tmp_path / "p").unchanged
    flagged = _tar(tmp_path / "p3.tar", {"build/build.json": placed("/w/.run/tree", "-G")})
    with pytest.raises(ValueError, match=r"other bytes for 1 file.*build/build\.json"):
        runs.merge_calls([flagged], tmp_path / "p")
    other = json.dumps({"ok": False, "env": {"git": "abc1234", "host": "c"}})
    with pytest.raises(ValueError, match=r"other bytes for 1 file.*build/build\.json"):
        runs.merge_calls([_tar(tmp_path / "c.tar", {"build/build.json": other})], run)


def test_describe_refuses_what_is_no_run_folder(tmp_path: Path, capsys) -> None:

    assert runs.main(["describe", str(tmp_path / "missing")]) == 1
    assert "no run folder" in capsys.readouterr().err
    (tmp_path / "run/sweep/s").mkdir(parents=True)
    (tmp_path / "run/sweep/s/ctx1.json").write_text("{")
    assert runs.main(["describe", str(tmp_path / "run")]) == 1
    assert "ctx1.json" in capsys.readouterr().err
    (tmp_path / "run/sweep/s/ctx1.json").write_text('{"env": {"git": "abc1234"}}')  # no status
    assert "(1 no status)" in runs.describe(tmp_path / "run")  # ctx1: a context of 1
    (tmp_path / "run/kernels").mkdir()
    (tmp_path / "run/kernels/bench.json").write_text('{"env": {}, "points": {"a": 1}}')
    assert runs.main(["describe", str(tmp_path / "run")]) == 1
    assert "its 'points' is no list of objects" in capsys.readouterr().err


def test_a_run_folder_describes_itself_from_its_files(tmp_path: Path) -> None:
    import json

    def point(ctx: int, status: str, start: str, requests: int) -> None:
        doc = {"env": {"git": "abc1234"}, "status": status, "requests": [{}] * requests,
               "started_at": f"2026-12-04T{start}:00.000+00:00",
               "finished_at": f"2026-12-04T{start}:30.000+00:00"}  # fmt: skip
        (tmp_path / f"sweep/triton-p1/ctx{ctx}.json").write_text(json.dumps(doc))

    (tmp_path / "sweep/triton-p1").mkdir(parents=True)
    point(185000, "failed", "19:05", 0)
    point(1024, "ok", "17:44", 3)
    (tmp_path / "kernels").mkdir()
    bench = {"env": {"git": "abc1234"}, "points": [{"status": "ok"}, {"status": "failed"}]}
    (tmp_path / "kernels/bench.json").write_text(json.dumps(bench))
    table = runs.describe(tmp_path).splitlines()
    assert table[2] == "| `kernels/bench.json` | `abc1234` | - | 2 points, 1 failed |"
    assert table[3] == (
        "| `sweep/triton-p1/` | `abc1234` | 2026-12-04 17:44 - 19:05 | 2 points "
        "(1k ok, 185k failed), 0 or 3 requests each |"
    )


def test_runs_md_names_each_run_the_same_way_however_its_path_was_typed(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """RUNS.md heads each run with its folder relative to the repository root, however it was
    typed on the command line (./, a trailing /, from another folder); a run outside the
    repository by its absolute path."""
    import json

    repo, outside = tmp_path / "repo", tmp_path / "elsewhere" / "run-b"
    run = repo / "results/runs/h200/7fe4732"
    for folder in (run, outside):
        (folder / "kernels").mkdir(parents=True)
        bench = {"env": {"git": "7fe4732"}, "points": [{"status": "ok"}]}
        (folder / "kernels/bench.json").write_text(json.dumps(bench))
    (repo / "results/runs/h100").mkdir()
    monkeypatch.chdir(repo)
    typed = ["results/runs/h200/7fe4732/", "./results/runs/h200/7fe4732",
             "results/runs/h100/../h200/7fe4732", str(run)]  # fmt: skip
    for path in typed:
        assert runs.main(["record", "--root", str(repo), path]) == 0
        text = capsys.readouterr().out
        assert text.splitlines()[:3] == [runs.RUNS_TITLE, "", "## `results/runs/h200/7fe4732`"]
    monkeypatch.chdir(repo / "results")
    assert runs.main(["record", "--root", "..", "runs/h200/7fe4732", str(outside)]) == 0
    text = capsys.readouterr().out
    assert text == (
        f"{runs.RUNS_TITLE}\n\n## `results/runs/h200/7fe4732`\n\n{runs.describe(run)}\n\n"
        f"## `{outside}`\n\n{runs.describe(outside)}\n"
    )


def test_what_a_run_lacks_is_packed_into_calls_by_an_earlier_run_s_times(tmp_path, capsys):
    import json

    earlier = tmp_path / "earlier"
    for key, seconds in {"a:1": 300, "b:1": 200, "c:1": 150, "d:1": 100, "e:1": 50}.items():
        server, ctx = key.split(":")
        (earlier / "sweep" / server).mkdir(parents=True)
        finish = f"2026-12-04T17:{seconds // 60:02d}:{seconds % 60:02d}.500+00:00"
        doc = {"env": {"git": "abc1234"}, "started_at": "2026-12-04T17:00:00.000+00:00",
               "finished_at": finish}  # fmt: skip
        (earlier / "sweep" / server / f"ctx{ctx}.json").write_text(json.dumps(doc))
    seconds = runs.point_seconds(earlier)
    assert seconds == {"a:1": 300.5, "b:1": 200.5, "c:1": 150.5, "d:1": 100.5, "e:1": 50.5}
    keys = ["bench_engine", "e:1", "d:1", "c:1", "b:1", "a:1"]
    calls, unknown = runs.plan_calls(keys, seconds, 402)
    assert calls == [["a:1", "d:1"], ["b:1", "c:1", "e:1"]]  # each <= 402 s, longest first
    assert unknown == ["bench_engine"]
    assert runs.plan_calls(["a:1", "e:1"], seconds, 100)[0] == [["a:1"], ["e:1"]]  # too long

    commands = tmp_path / "cmds.txt"
    commands.write_text("".join(f"{k}\tx\n" for k in keys))
    (tmp_path / "run/sweep/e").mkdir(parents=True)
    (tmp_path / "run/sweep/e/ctx1.json").write_text('{"status": "ok"}')
    main = study_commands().main
    assert main(["--missing", str(commands), str(tmp_path / "run"), "--like", str(earlier),
                 "--call-s", "402"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["a:1 d:1", "b:1 c:1", "bench_engine"]
    assert lines[0].endswith(f"# call 1: ~401 s in {earlier}")


def test_an_earlier_run_whose_point_gives_no_time_is_said_so(tmp_path, capsys) -> None:
    """--like reads each point's start and finish: a file that gives none is named, no traceback."""
    import json

    commands = tmp_path / "cmds.txt"
    commands.write_text("a:1\tx\n")
    (tmp_path / "run").mkdir()
    earlier = tmp_path / "earlier" / "sweep" / "a"
    earlier.mkdir(parents=True)

    def point(finish: str) -> str:
        return json.dumps(
            {"env": {}, "started_at": "2026-12-04T17:00:00+00:00", "finished_at": finish}
        )

    for text, said in (
        ("{", "Expecting property name"),
        (point("later"), "Invalid isoformat string"),
        (point("2026-12-04T17:01:00"), "offset-naive"),
    ):
        (earlier / "ctx1.json").write_text(text)
        args = ["--missing", str(commands), str(tmp_path / "run"), f"--like={earlier.parents[1]}"]
        with pytest.raises(SystemExit) as stopped:
            study_commands().main(args)
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and f"--like: {earlier / 'ctx1.json'}: " in err, err
        assert said in err


@pytest.mark.parametrize(
    ("name", "recorded", "same"),
    [
        ("h100", "NVIDIA H100 80GB HBM3", True),
        ("H200", "NVIDIA H200", True),
        ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
        ("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
        ("H20", "NVIDIA H200", False),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("L4", "NVIDIA L40S", False),
        ("H100", "NVIDIA H200", False),
        ("", "NVIDIA H200", False),
    ],
)
def test_a_gpu_is_named_by_its_whole_words(name: str, recorded: str, same: bool) -> None:
    assert runs.gpu_named(name, recorded) is same


@pytest.mark.parametrize(("study", "gpu"), [("h200", "H200"), ("h100", "H100")])
def test_each_published_study_is_one_study_of_its_config_s_gpu(study: str, gpu: str) -> None:
    folder = REPO / "results/published" / study
    assert runs.gpu_mismatch(folder, gpu) is None
    other = {"H200": "H100", "H100": "H200"}[gpu]
    assert f"study.gpu {other}" in (runs.gpu_mismatch(folder, other) or "")
