"""The study on a SLURM cluster, through Snakemake's SLURM executor and profiles/slurm.

A single-node cluster is started for the module (see slurm_cluster.py; skipped without root or
without slurm-wlm and munge). A small study runs once locally and once through the cluster with
the workflow profile as shipped; the two must produce the same files and the same results. A
server that cannot start gives the same failed point either way, and a rerun submits only the
missing job.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from slurm_cluster import SlurmCluster, host_cpus, start_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
WORKFLOW_FILES = ("Snakefile", "workflow", "notebooks", "data", "profiles", "envs")
FAILED_POINT = "results/sweep/broken/ctx256.json"


def small_study() -> dict:
    """One real server with two points, and one whose launch command exits at once."""
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    return {
        "study": {"name": "slurm-check", "description": "A small study run locally and on SLURM."},
        "build": {"archs": [90]},
        "kernels": {
            "device": "cpu",
            "backends": ["torch"],
            "contexts": [256],
            "modes": ["decode"],
            "page_sizes": [1],
            "heads": [8],
            "repeats": 1,
            "max_seconds_per_point": 20,
        },
        "sweep": {
            "gen_tokens": 4,
            "start_timeout_s": 60,
            "preset": "tiny",
            "device": "cpu",
            "command": default["sweep"]["command"],
            "servers": [
                {
                    "name": "torch-p1",
                    "backend": "torch",
                    "page_size": 1,
                    "spec": {"mode": "chain", "draft_len": 16},
                    "chunk_size": 512,
                    "chunks": [{"contexts": [256, 512], "timeout_s": 120, "point_timeout_s": 60}],
                },
                {
                    "name": "broken",
                    "backend": "torch",
                    "page_size": 1,
                    "spec": {"mode": "chain", "draft_len": 16},
                    "command": "python -c 'raise SystemExit(3)' {host} {port}",
                    "chunks": [{"contexts": [256], "timeout_s": 60, "point_timeout_s": 30}],
                },
            ],
        },
        "published": None,
        "reference": "data/reference/seed-rtx-pro-6000-triton.csv",
    }


def profile_partitions(profile: dict) -> tuple[str, ...]:
    """Every partition the profile names, the default one first."""
    names = [profile["default-resources"]["slurm_partition"]]
    for resources in profile.get("set-resources", {}).values():
        name = resources.get("slurm_partition")
        if name and name not in names:
            names.append(name)
    return tuple(names)


def profile_memory_mb(profile: dict, cpus: int) -> int:
    """Memory the node must offer so that the largest job of the profile fits on it."""
    per_cpu = [profile["default-resources"].get("mem_mb_per_cpu", 0)]
    per_cpu += [r.get("mem_mb_per_cpu", 0) for r in profile.get("set-resources", {}).values()]
    return max(per_cpu) * cpus


def have_nvcc() -> bool:
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return bool(shutil.which("nvcc")) or Path(cuda_home, "bin", "nvcc").is_file()


@pytest.fixture(scope="module")
def cluster():
    if not have_nvcc():
        pytest.skip("the study builds the CUDA kernel: nvcc (the CUDA toolkit) is not installed")
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot start a SLURM test cluster: {reason}")
    profile = yaml.safe_load(PROFILE.read_text())
    started = start_cluster(profile_partitions(profile), profile_memory_mb(profile, host_cpus()))
    yield started
    started.stop()


def make_workspace(root: Path) -> Path:
    """A copy of the workflow with the small study as its config.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    (root / "config.yaml").write_text(yaml.safe_dump(small_study(), sort_keys=False))
    return root


def snakemake(
    workdir: Path, args: list[str], env: dict[str, str], timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """Run Snakemake (this interpreter's) in workdir on the small study."""
    # The rules call the package's tools; find them beside this interpreter.
    env = {**env, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "snakemake", *args]
    return subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def slurm_args(cluster: SlurmCluster) -> list[str]:
    """The profile as shipped, plus what this cluster needs: no slurmdbd, 2-core node."""
    return [
        "--workflow-profile",
        "profiles/slurm",
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--max-threads",
        str(cluster.cpus),
    ]


def explain(proc: subprocess.CompletedProcess[str], cluster: SlurmCluster | None = None) -> str:
    text = f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    return text + ("\n" + cluster.log_tail(15) if cluster else "")


class LocalRun(NamedTuple):
    ws: Path
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def local_started(cluster: SlurmCluster, tmp_path_factory) -> LocalRun:
    """The same study run locally, started in the background: it runs while the SLURM run's
    jobs wait on the scheduler. Asks for the cluster so that a machine without one skips."""
    ws = make_workspace(tmp_path_factory.mktemp("local") / "study")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(cluster.cpus)]
    log = (ws.parent / "snakemake.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ws, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    yield LocalRun(ws, proc)
    proc.kill()
    proc.wait()
    log.close()


@pytest.fixture(scope="module")
def local_run(local_started: LocalRun, slurm_run: SlurmRun) -> Path:
    # after the SLURM run (which was started second), so both studies ran at once
    code = local_started.proc.wait(timeout=600)
    assert code == 0, (local_started.ws.parent / "snakemake.log").read_text()[-6000:]
    return local_started.ws


class SlurmRun(NamedTuple):
    ws: Path
    jobs: list[dict[str, str]]  # the SLURM jobs of this run


@pytest.fixture(scope="module")
def slurm_run(cluster: SlurmCluster, local_started: LocalRun, tmp_path_factory) -> SlurmRun:
    ws = make_workspace(tmp_path_factory.mktemp("slurm") / "study")
    seen = {job["id"] for job in slurm_jobs(cluster)}
    proc = snakemake(ws, slurm_args(cluster), cluster.env)
    assert proc.returncode == 0, explain(proc, cluster)
    return SlurmRun(ws, [job for job in slurm_jobs(cluster) if job["id"] not in seen])


def result_files(ws: Path) -> set[str]:
    return {str(p.relative_to(ws)) for p in (ws / "results").rglob("*") if p.is_file()}


def slurm_jobs(cluster: SlurmCluster) -> list[dict[str, str]]:
    """Every job the cluster has seen (finished ones stay listed for MinJobAge)."""
    out = cluster.run("squeue", "--states=all", "--noheader", "--format=%i|%P|%k|%T").stdout
    keys = ("id", "partition", "comment", "state")
    jobs = [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines()]
    for job in jobs:
        job["gpus"] = job_gpus(cluster, job["id"])
    return jobs


def job_gpus(cluster: SlurmCluster, job_id: str) -> str:
    """The GPUs a job asked for (`gres:gpu:1` for `--gpus=1`), '' for none."""
    fields = cluster.run("scontrol", "show", "job", job_id).stdout.split()
    return next((f.split("=", 1)[1] for f in fields if f.startswith("TresPerJob=")), "")


def rule_of(job: dict[str, str]) -> str:
    """The rule name from the plugin's job comment `rule_<name>[_wildcards_<...>]`."""
    return job["comment"].removeprefix("rule_").split("_wildcards_")[0]


def no_digits(text: str | None) -> str | None:
    """A failure reason without its measured numbers (elapsed seconds, ports)."""
    return None if text is None else re.sub(r"\d+(\.\d+)?", "#", text)


def point_fields(path: Path) -> dict:
    point = json.loads(path.read_text())
    metrics = point.get("metrics") or {}
    return {
        "name": point["name"],
        "requested_ctx": point["requested_ctx"],
        "prompt_tokens": point["prompt_tokens"],
        "gen_tokens": point["gen_tokens"],
        "completion_tokens": metrics.get("completion_tokens"),
        "status": point["status"],
        "reason": no_digits(point["reason"]),
    }


def csv_rows(path: Path, keys: tuple[str, ...]) -> tuple[list[str], list[tuple[str, ...]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [tuple(row[k] for k in keys) for row in reader]
        return list(reader.fieldnames or []), sorted(rows)


def report_headings(path: Path) -> list[str]:
    html = path.read_text()
    return [
        re.sub(r"<[^>]+>|\s+", " ", h).strip()
        for h in re.findall(r"<h[1-3][^>]*>.*?</h[1-3]>", html, re.S)
    ]


def test_profile_names_only_rules_of_the_workflow(tmp_path: Path) -> None:
    # Needs no cluster: keeps profiles/slurm in step with the rule files.
    ws = make_workspace(tmp_path / "study")
    # the default study defines every optional rule (the engine bench among them)
    shutil.copy2(REPO / "config.yaml", ws / "config.yaml")
    proc = snakemake(ws, ["--list-rules"], dict(os.environ), timeout=120)
    assert proc.returncode == 0, explain(proc)
    rules = set(proc.stdout.split())
    profile = yaml.safe_load(PROFILE.read_text())
    named = set(profile["set-threads"]) | set(profile["set-resources"])
    assert named <= rules, f"profiles/slurm names rules the workflow lacks: {named - rules}"
    # every rule that runs as a job has its threads set (`all` only collects, on the host)
    assert rules - {"all"} <= set(profile["set-threads"]), rules - set(profile["set-threads"])
    for rule in ("bench_kernels", "bench_engine", "sweep_point"):
        assert (
            profile["set-resources"][rule]["slurm_partition"]
            != (profile["default-resources"]["slurm_partition"])
        ), f"{rule} should go to the GPU partition"


def bench_keys(ws: Path) -> list[tuple]:
    bench = json.loads((ws / "results/kernels/bench.json").read_text())
    keys = ("backend", "ctx", "mode", "page_size", "heads", "status")
    return sorted(tuple(point[k] for k in keys) for point in bench["points"])


def test_study_on_slurm_matches_local(local_run: Path, slurm_run: SlurmRun) -> None:
    remote = slurm_run.ws
    assert result_files(remote) == result_files(local_run)
    points = sorted(p.relative_to(local_run) for p in (local_run / "results/sweep").rglob("*.json"))
    assert len(points) == 3
    for rel in points:
        assert point_fields(remote / rel) == point_fields(local_run / rel), rel
    assert bench_keys(remote) == bench_keys(local_run)
    for name, keys in (
        ("sweep.csv", ("server", "requested_ctx", "prompt_tokens", "status", "completion_tokens")),
        ("kernels.csv", ("backend", "heads", "ctx", "mode", "page_size", "status")),
    ):
        local = csv_rows(local_run / "results/summary" / name, keys)
        assert csv_rows(remote / "results/summary" / name, keys) == local, name
    local_headings = report_headings(local_run / "results/report.html")
    assert local_headings
    assert report_headings(remote / "results/report.html") == local_headings


def test_every_job_ran_on_the_cluster_where_the_profile_says(slurm_run: SlurmRun) -> None:
    profile = yaml.safe_load(PROFILE.read_text())
    default = profile["default-resources"]["slurm_partition"]
    ran = sorted(rule_of(job) for job in slurm_run.jobs)
    # every job but `all` (it only collects, on the host): the build, the microbenchmark, the
    # FlashInfer sm_120 build check, three points, the summaries, four notebooks, the rendered
    # report and its notes
    assert ran == sorted(
        ["build_kernel", "bench_kernels", "flashinfer_sm120", *["sweep_point"] * 3, "summarize"]
        + ["notebook_kernels", "notebook_compare", *["notebook_sweep"] * 2, "notebook_report"]
        + ["render_report", "notes"]
    )
    for job in slurm_run.jobs:
        assert job["state"] == "COMPLETED", job
        wanted = profile["set-resources"].get(rule_of(job), {}).get("slurm_partition", default)
        assert job["partition"] == wanted, job
        # the CPU study asks for no GPU, even from the GPU rules
        assert job["gpus"] == "", job


def test_failed_point_is_reported_as_locally(local_run: Path, slurm_run: SlurmRun) -> None:
    local, remote = (point_fields(ws / FAILED_POINT) for ws in (local_run, slurm_run.ws))
    assert remote["status"] == local["status"] == "failed"
    assert remote["reason"] == local["reason"]
    assert "exited with code #" in remote["reason"]


def test_point_timeout_is_a_failed_point_on_slurm(cluster: SlurmCluster, tmp_path_factory) -> None:
    # A server that never becomes healthy uses up its chunk's whole timeout: the job's SLURM
    # time limit (whole minutes) must leave room for the job around it, or SLURM kills the job
    # (TIMEOUT) before the runner records the failed point, as it does on a workstation.
    ws = make_workspace(tmp_path_factory.mktemp("timeout") / "study")
    study = yaml.safe_load((ws / "config.yaml").read_text())
    hang = {**study["sweep"]["servers"][1], "name": "hang"}
    hang["command"] = "python -c 'import time; time.sleep(600)' {host} {port}"
    hang["chunks"] = [{"contexts": [256], "timeout_s": 20, "point_timeout_s": 10}]
    study["sweep"]["servers"].append(hang)
    (ws / "config.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    seen = {job["id"] for job in slurm_jobs(cluster)}

    target = "results/sweep/hang/ctx256.json"
    proc = snakemake(ws, [*slurm_args(cluster), target], cluster.env)
    new = [job for job in slurm_jobs(cluster) if job["id"] not in seen]
    assert [job["state"] for job in new] == ["COMPLETED"], explain(proc, cluster)
    assert proc.returncode == 0, explain(proc, cluster)
    point = point_fields(ws / target)
    assert point["status"] == "failed"
    assert "chunk timeout" in point["reason"], point


def test_gpu_study_points_ask_for_a_gpu(cluster: SlurmCluster, tmp_path_factory) -> None:
    # The same profile with a CUDA study: each point's job gets one GPU of the GPU partition.
    # Without CUDA here the server cannot start, which is recorded as a failed point.
    ws = make_workspace(tmp_path_factory.mktemp("gpu") / "study")
    study = yaml.safe_load((ws / "config.yaml").read_text())
    study["sweep"]["device"] = "cuda"
    (ws / "config.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    seen = {job["id"] for job in slurm_jobs(cluster)}

    target = "results/sweep/torch-p1/ctx256.json"
    proc = snakemake(ws, [*slurm_args(cluster), target], cluster.env)
    assert proc.returncode == 0, explain(proc, cluster)
    new = [job for job in slurm_jobs(cluster) if job["id"] not in seen]
    gpu_partition = yaml.safe_load(PROFILE.read_text())["set-resources"]["sweep_point"]
    assert [(job["partition"], job["gpus"], job["state"]) for job in new] == [
        (gpu_partition["slurm_partition"], "gres:gpu:1", "COMPLETED")
    ]
    assert point_fields(ws / target)["status"] in {"ok", "failed"}


def test_rerun_submits_only_the_missing_point(slurm_run: SlurmRun, cluster: SlurmCluster) -> None:
    ws = slurm_run.ws
    before = {rel: (ws / rel).stat().st_mtime_ns for rel in result_files(ws)}
    seen = {job["id"] for job in slurm_jobs(cluster)}
    (ws / FAILED_POINT).unlink()

    proc = snakemake(ws, [*slurm_args(cluster), FAILED_POINT], cluster.env)
    assert proc.returncode == 0, explain(proc, cluster)

    new = [job for job in slurm_jobs(cluster) if job["id"] not in seen]
    assert [job["comment"] for job in new] == ["rule_sweep_point_wildcards_broken_256"]
    assert point_fields(ws / FAILED_POINT)["status"] == "failed"
    changed = {rel for rel in result_files(ws) if before.get(rel) != (ws / rel).stat().st_mtime_ns}
    # the point, its log, benchmark and the server log it appends to; nothing else
    assert FAILED_POINT in changed
    assert all("/broken/" in rel for rel in changed), changed
