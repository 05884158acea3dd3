"""scripts/publish_study.sh: a study measured in several runs is published as one.

The raw files of a recorded CPU run are split into two runs (as the GPU study is measured by
server), and the script renders them with the pipeline's real rules.
"""

from __future__ import annotations

import csv
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml
from report_study import REPO, STUDY, study_config, tools_env

from decodecliff.study import notebooks

SCRIPT = REPO / "scripts" / "publish_study.sh"
LATER_SERVER = "triton-chain16-p1"  # measured by the second run
needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="publishing builds the kernel: no nvcc"
)
pytestmark = pytest.mark.slow  # each test publishes a study through the pipeline


def split_runs(root: Path) -> tuple[Path, Path]:
    """Run A: build, kernels, engine and every server but one; run B: that server's points. Each
    holds what the publisher of a run writes beside its results: README.md, gpu-logs/env.txt."""
    first, second = root / "run-a", root / "run-b"
    shutil.copytree(STUDY, first)
    (second / "sweep").mkdir(parents=True)
    shutil.move(first / "sweep" / LATER_SERVER, second / "sweep" / LATER_SERVER)
    for run in (first, second):
        (run / "README.md").write_text(f"# How {run.name} was measured\n")
        (run / "gpu-logs").mkdir()
        (run / "gpu-logs" / "env.txt").write_text(f"{run.name}'s machine\n")
    return first, second


def publish(
    root: Path, *runs: Path | str, overlay: dict | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """publish_study.sh of ``runs`` (their paths as given, from ``root``) with the study's config
    (and ``overlay`` given after it)."""
    cfg = study_config() | {"published": None}
    configs = [root / "config.yaml"]
    configs[0].write_text(yaml.safe_dump(cfg, sort_keys=False))
    if overlay is not None:
        configs.append(root / "overlay.yaml")
        configs[1].write_text(yaml.safe_dump(overlay, sort_keys=False))
    dest = root / "published"
    cmd = ["bash", str(SCRIPT), ":".join(map(str, configs)), str(dest), *map(str, runs)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, env=tools_env(), cwd=root
    )
    return done, dest


@needs_nvcc
def test_two_runs_publish_as_one_study_under_an_overlaid_config(tmp_path: Path) -> None:
    overlay = {"study": {"name": "overlaid", "description": "the study under another name"}}
    kept = tmp_path / "published" / "gpu-logs" / "env.txt"  # hand-kept beside the publication
    kept.parent.mkdir(parents=True)
    kept.write_text("kept by hand\n")
    split_runs(tmp_path)
    # typed from the folder it runs in, as a shell completes it and as a user writes it
    done, dest = publish(tmp_path, "run-a/", "./run-b/", overlay=overlay)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # each run's own record under its folder's name, the hand-kept file as it was
    assert kept.read_text() == "kept by hand\n"
    for run in ("run-a", "run-b"):
        assert (dest / "gpu-logs" / run / "README.md").read_text() == f"# How {run} was measured\n"
        assert (dest / "gpu-logs" / run / "env.txt").read_text() == f"{run}'s machine\n"
    assert not (dest / "README.md").exists() and "write" in done.stderr  # the study's: by hand
    for server in ("torch-chain16-p1", LATER_SERVER):
        points = sorted((dest / "sweep" / server).glob("ctx*.json"))
        assert [p.name for p in points] == sorted(
            p.name for p in (STUDY / "sweep" / server).glob("ctx*.json")
        )
    with (dest / "summary" / "sweep.csv").open() as f:
        servers = {row["server"] for row in csv.DictReader(f)}
    assert servers == {server["name"] for server in study_config()["sweep"]["servers"]}
    assert "overlaid" in (dest / "report.html").read_text()  # the overlay's name, its servers
    assert (dest / "NOTES.md").read_text().strip()
    runs = (dest / "RUNS.md").read_text()  # what each run held, from its files
    # each run named by its folder, whatever way its path was typed (outside the repository:
    # its absolute path)
    headings = [line for line in runs.splitlines() if line.startswith("## ")]
    assert headings == [f"## `{tmp_path.resolve() / run}`" for run in ("run-a", "run-b")]
    later = runs.split("run-b")[1]
    assert f"| `sweep/{LATER_SERVER}/` |" in later and "kernels/bench.json" not in later
    assert "| `kernels/bench.json` |" in runs.split("run-b")[0]


@needs_nvcc
def test_one_run_s_record_is_the_study_s(tmp_path: Path) -> None:
    """As results/published/h200 holds it: the run's README.md is the study's, its gpu-logs/ go
    into the study's; the same file already there (a republication's) is no clash."""
    first, second = split_runs(tmp_path)
    shutil.move(second / "sweep" / LATER_SERVER, first / "sweep" / LATER_SERVER)  # one whole run
    kept = tmp_path / "published" / "gpu-logs"
    kept.mkdir(parents=True)
    (kept / "env.txt").write_text("run-a's machine\n")
    (kept / "other.log").write_text("kept by hand\n")
    done, dest = publish(tmp_path, first)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (dest / "README.md").read_text() == "# How run-a was measured\n"
    assert sorted(p.name for p in (dest / "gpu-logs").iterdir()) == ["env.txt", "other.log"]
    assert (kept / "other.log").read_text() == "kept by hand\n"


@needs_nvcc
def test_one_run_without_a_readme_says_the_study_s_is_to_be_written(tmp_path: Path) -> None:
    """A study's README.md says how its raw files were made: a run that brings none leaves it to
    be written by hand, and says so, as several runs do."""
    first, second = split_runs(tmp_path)
    shutil.move(second / "sweep" / LATER_SERVER, first / "sweep" / LATER_SERVER)  # one whole run
    (first / "README.md").unlink()
    done, dest = publish(tmp_path, first)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (dest / "README.md").exists()
    assert f"write {dest / 'README.md'} (how the study was measured) by hand" in done.stderr


@needs_nvcc
def test_a_measurement_no_run_holds_stops_the_publication(tmp_path: Path) -> None:
    first, second = split_runs(tmp_path)
    shutil.rmtree(first / "engine")  # measured on the GPU, never computed while publishing
    done, dest = publish(tmp_path, first, second)
    assert done.returncode != 0
    assert "Missing input files" in done.stderr and "results/engine/bench.json" in done.stderr
    assert not dest.exists()


def test_a_file_in_two_runs_stops_before_any_work(tmp_path: Path) -> None:
    first, second = split_runs(tmp_path)
    (second / "build").mkdir()
    shutil.copy(first / "build" / "build.json", second / "build" / "build.json")
    done, dest = publish(tmp_path, first, second)
    assert done.returncode != 0
    assert "in two runs" in done.stderr and "build/build.json" in done.stderr
    assert not dest.exists()


def test_a_bench_its_run_did_not_finish_stops_before_any_work(tmp_path: Path) -> None:
    import json

    first, second = split_runs(tmp_path)
    engine = first / "engine" / "bench.json"
    doc = json.loads(engine.read_text())
    del doc["targets"]  # the bench writes its targets last: a call stopped before they came
    engine.write_text(json.dumps(doc))
    done, dest = publish(tmp_path, first, second)
    assert done.returncode == 2 and "did not finish (measure it again): engine/bench.json" in (
        done.stderr
    )
    assert not dest.exists()


def measured_on(run: Path, gpu: str) -> None:
    """Mark every measured file of ``run`` as measured on ``gpu``, as a GPU's bench records it."""
    import json

    for path in [*(run / "kernels").glob("bench*.json"), *(run / "engine").glob("bench*.json"),
                 *(run / "sweep").glob("*/ctx*.json")]:  # fmt: skip
        doc = json.loads(path.read_text())
        doc["env"]["gpu"] = gpu
        path.write_text(json.dumps(doc))


def test_runs_of_two_gpus_or_of_another_than_the_config_s_stop_before_any_work(
    tmp_path: Path,
) -> None:
    """A study is one GPU's: runs of two are no study, and runs of an H100 under a config that
    names an H200 (config/h200.yaml without its config/h100.yaml overlay) are not that study."""
    first, second = split_runs(tmp_path)
    measured_on(first, "NVIDIA H200")
    measured_on(second, "NVIDIA H100 80GB HBM3")
    done, dest = publish(tmp_path, first, second)
    assert done.returncode == 2 and "measured on several GPUs" in done.stderr, done.stderr
    assert "NVIDIA H200 (" in done.stderr and "NVIDIA H100 80GB HBM3 (" in done.stderr
    assert not dest.exists()
    measured_on(first, "NVIDIA H100 80GB HBM3")
    done, dest = publish(tmp_path, first, second, overlay={"study": {"gpu": "H200"}})
    assert done.returncode == 2, done.stderr
    assert "names study.gpu H200, but its runs were measured on NVIDIA H100 80GB HBM3" in (
        done.stderr
    )
    assert not dest.exists()


def test_a_run_s_gpu_logs_never_replace_hand_kept_ones(tmp_path: Path) -> None:
    first, _ = split_runs(tmp_path)
    kept = tmp_path / "published" / "gpu-logs" / "env.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("an earlier run's machine, kept by hand\n")
    done, dest = publish(tmp_path, first)
    assert done.returncode == 2 and f"{kept} (hand-kept) differs from" in done.stderr
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "gpu-logs", "gpu-logs/env.txt"
    ]  # fmt: skip
    assert kept.read_text() == "an earlier run's machine, kept by hand\n"


def test_bad_arguments_and_an_earlier_publication_stop_before_any_work(tmp_path: Path) -> None:
    first, _ = split_runs(tmp_path)
    for args, said in (
        ([], "CONFIG DEST RAW_DIR"),  # its own usage line
        (["--help"], "CONFIG DEST RAW_DIR"),
        ([str(tmp_path / "none.yaml"), str(tmp_path / "dest"), str(first)], "no config file"),
        (
            [
                f"{REPO / 'config.yaml'}:{tmp_path / 'none.yaml'}",
                str(tmp_path / "dest"),
                str(first),
            ],
            f"no config file {tmp_path / 'none.yaml'}\n",  # the second of the two
        ),
        (["", str(tmp_path / "dest"), str(first)], "CONFIG DEST RAW_DIR"),
        ([str(REPO / "config.yaml"), str(tmp_path / "dest"), str(tmp_path / "nope")], "no run"),
    ):
        done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
    (tmp_path / "published" / "gpu-logs").mkdir(parents=True)
    (tmp_path / "published" / "NOTES.md").write_text("an earlier publication's")
    done, dest = publish(tmp_path, first)
    assert done.returncode == 2 and "remove all but gpu-logs/" in done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["NOTES.md", "gpu-logs"]


@pytest.mark.parametrize("name", ["h200", "h100"])
def test_the_published_report_is_what_its_files_render_to_today(tmp_path: Path, name: str) -> None:
    """Each published study's report page, executed and rendered again from the study's own
    files by the notebook and render_report rules' commands with the parameters its notebook
    records, says what the committed one says."""
    study = REPO / "results/published" / name
    shutil.copytree(study, tmp_path / "results", ignore=shutil.ignore_patterns("gpu-logs"))
    for shared in ("data", "notebooks"):
        (tmp_path / shared).symlink_to(REPO / shared)
    committed = nbformat.read(study / "notebooks/report.ipynb", as_version=4)
    options = notebooks.papermill_options(dict(committed.metadata.papermill.parameters))
    run = "papermill --no-progress-bar --engine ipc --start-timeout 300 -k python3"
    run += " notebooks/report.ipynb results/notebooks/report.ipynb " + options
    render = "jupyter nbconvert --to html --no-input --no-prompt --template-file"
    render += " notebooks/report.html.j2 results/notebooks/report.ipynb --output-dir results"
    render += " --output report"
    for cmd in (run, render):
        done = subprocess.run(
            shlex.split(cmd), capture_output=True, text=True, cwd=tmp_path, env=tools_env()
        )
        assert done.returncode == 0, done.stderr[-3000:]

    def said(path: Path) -> list[str]:
        """What the page says (its text and the figures' alt text): the markup and the images'
        bytes change with nbconvert's and matplotlib's versions, what the files give does not."""
        html = re.sub(r"<(script|style)\b.*?</\1>", " ", path.read_text(), flags=re.S)
        alts = re.findall(r'alt="([^"]*)"', html)
        return [*alts, *re.sub(r"<[^>]+>", " ", html).split()]

    assert said(tmp_path / "results/report.html") == said(study / "report.html")
