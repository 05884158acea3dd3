"""The Snakemake workflow for real: a small study end to end, one point rerun alone, bad configs
stopped before any work, and the linter.

The workflow is copied into a temporary folder with a config of two small servers, so the
repository's own results/ is never touched. The end-to-end run happens once per module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from report_study import tools_env

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ["Snakefile", "workflow", "envs", "profiles", "notebooks", "data"]
TIMEOUT_S = 1200

pytestmark = pytest.mark.slow


def small_config() -> dict:
    """Two torch servers on the tiny model, two requests per point; one point fills its server's
    KV pool (a point beyond it is a config error, see test_bad_config_stops_before_any_work)."""
    default = yaml.safe_load((ROOT / "config.yaml").read_text())
    chunk = {"timeout_s": 180, "point_timeout_s": 120}
    return {
        "study": {"name": "pipeline-test", "description": "The workflow's own test study."},
        "build": {"archs": [120, 90]},
        "kernels": {
            "device": "cpu",
            "backends": ["torch", "custom"],
            "contexts": [128],
            "modes": ["decode"],
            "page_sizes": [1],
            "heads": [8],
            "repeats": 1,
            "max_seconds_per_point": 10,
        },
        "sweep": {
            "gen_tokens": 4,
            "requests_per_point": 2,
            "start_timeout_s": 120,
            "preset": "tiny",
            "device": "cpu",
            "command": default["sweep"]["command"],
            "servers": [
                {
                    "name": "torch-a",
                    "backend": "torch",
                    "page_size": 1,
                    "spec": {"mode": "chain", "draft_len": 4},
                    "chunk_size": 64,
                    "chunks": [{"contexts": [64, 96], **chunk}],
                },
                {
                    "name": "torch-b",
                    "backend": "torch",
                    "page_size": 16,
                    "spec": {"mode": "none"},
                    "args": "--max-total-tokens 512",
                    "chunks": [{"contexts": [64], **chunk}, {"contexts": [448], **chunk}],
                },
            ],
        },
        "published": None,
        "reference": "data/reference/seed-rtx-pro-6000-triton.csv",
    }


POINTS = [
    "results/sweep/torch-a/ctx64.json",
    "results/sweep/torch-a/ctx96.json",
    "results/sweep/torch-b/ctx64.json",
    "results/sweep/torch-b/ctx448.json",
]


def copy_workflow(dest: Path, config: dict) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def snakemake(workdir: Path, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run Snakemake of this interpreter in ``workdir``; the rules find `decodecliff` beside it."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        env=tools_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake run or dry run."""
    stats = output.split("Job stats:", 1)[1] if "Job stats:" in output else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}


def snapshot(workdir: Path, paths: list[str]) -> dict[str, tuple[int, bytes]]:
    return {p: ((workdir / p).stat().st_mtime_ns, (workdir / p).read_bytes()) for p in paths}


def have_nvcc() -> bool:
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return bool(shutil.which("nvcc")) or Path(cuda_home, "bin", "nvcc").is_file()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small study, run once from nothing to the rendered report."""
    if not have_nvcc():
        pytest.skip("the study builds the CUDA kernel: nvcc (the CUDA toolkit) is not installed")
    workdir = copy_workflow(tmp_path_factory.mktemp("study"), small_config())
    done = snakemake(workdir, "--cores", "2")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    return workdir


def test_end_to_end_writes_every_stage(study: Path) -> None:
    for path in [
        "results/build/libdecodecliff_mla.so",
        "results/build/build.json",
        "results/kernels/bench.json",
        *POINTS,
        "results/summary/kernels.csv",
        "results/summary/sweep.csv",
        "results/report.html",
    ]:
        assert (study / path).is_file(), path
        assert (study / path).stat().st_size > 0, path
    for log in ["build/build_kernel", "kernels/bench_kernels", "sweep/torch-a/ctx64"]:
        assert (study / f"results/logs/{log}.log").is_file(), log
    for bench in ["build/build_kernel", "kernels/bench_kernels", "sweep/torch-b/ctx448"]:
        assert (study / f"results/benchmarks/{bench}.tsv").is_file(), bench


def test_points_record_their_status(study: Path) -> None:
    status = {p: json.loads((study / p).read_text())["status"] for p in POINTS}
    assert status == {
        "results/sweep/torch-a/ctx64.json": "ok",
        "results/sweep/torch-a/ctx96.json": "ok",
        "results/sweep/torch-b/ctx64.json": "ok",
        "results/sweep/torch-b/ctx448.json": "ok",  # 448 + 4 tokens of its 512-token pool
    }
    for path in POINTS:
        point = json.loads((study / path).read_text())
        assert len(point["requests"]) == 2 and point["metrics"]["requests"] == 2
        # each point's server logs to its own file (points of a server may run at once)
        server, ctx = point["config"]["name"], point["requested_ctx"]
        log = f"results/sweep/{server}/server-{server}-ctx{ctx}.log"
        assert point["server_log"] == log and (study / log).read_text().count("==== launch") == 1


def test_custom_kernel_is_skipped_on_cpu_with_its_reason(study: Path) -> None:
    bench = json.loads((study / "results/kernels/bench.json").read_text())
    custom = [p for p in bench["points"] if p["backend"] == "custom"]
    torch_points = [p for p in bench["points"] if p["backend"] == "torch"]
    assert custom and all(p["status"] == "skipped" and p["reason"] for p in custom)
    assert torch_points and all(p["status"] == "ok" for p in torch_points)
    build = json.loads((study / "results/build/build.json").read_text())
    assert "120" in json.dumps(build) and "90" in json.dumps(build)


def test_second_run_has_nothing_to_do(study: Path) -> None:
    done = snakemake(study, "--cores", "2", "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Nothing to be done" in done.stdout + done.stderr


def test_an_edited_kernel_source_rebuilds_the_library(tmp_path: Path) -> None:
    """A library older than the source it is built from is rebuilt, not reused: every file the
    build compiles is an input of build_kernel."""
    from decodecliff.kernels import build

    workdir = copy_workflow(tmp_path, small_config())
    built = [workdir / "results" / "build" / name for name in (build.LIB_NAME, "build.json")]
    built[0].parent.mkdir(parents=True)
    for path in built:  # a build older than any source file (2001; Snakemake ignores time 0)
        path.write_text("")
        os.utime(path, (978_307_200, 978_307_200))
    done = snakemake(workdir, "--cores", "1", "--dry-run", "results/build/build.json", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert job_counts(done.stdout).get("build_kernel") == 1, done.stdout[-2000:]
    assert {path.name for path in build.SOURCES} == {
        "mla_verify.cu", "mla_ptx.cuh", "smem_per_sm_shim.c"
    }  # fmt: skip


def test_one_point_reruns_alone(study: Path) -> None:
    target = "results/sweep/torch-a/ctx64.json"
    others = [p for p in POINTS if p != target]
    before = snapshot(study, POINTS)
    done = snakemake(study, target, "--cores", "1", "--force")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert job_counts(done.stdout + done.stderr) == {"sweep_point": 1, "total": 1}
    after = snapshot(study, POINTS)
    assert after[target][0] > before[target][0]
    assert json.loads(after[target][1])["status"] == "ok"
    for path in others:
        assert after[path] == before[path], f"{path} was touched"
    # What a plain run does next: only what depends on the new point, no other point.
    plan = job_counts(snakemake(study, "--cores", "2", "--dry-run").stdout)
    assert "sweep_point" not in plan and plan.get("summarize") == 1, plan


def test_forcerun_of_a_point_plans_that_point_and_its_dependents(study: Path) -> None:
    done = snakemake(
        study, "--cores", "1", "--dry-run", "--forcerun", "results/sweep/torch-b/ctx64.json"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    plan = job_counts(done.stdout)
    assert plan["sweep_point"] == 1 and "build_kernel" not in plan and "bench_kernels" not in plan
    assert plan.get("render_report") == 1, plan


def test_a_config_value_given_again_reruns_nothing(study: Path) -> None:
    """--config and --configfile reorder the config's keys (Snakemake puts what they set
    first): the same values so given must not rerun the notes and the report."""
    # the tests before leave jobs to do; the study is brought up to date first
    current = snakemake(study, "--cores", "2")
    assert current.returncode == 0, current.stderr[-3000:]
    again = ["--config", "reference=" + small_config()["reference"]]
    done = snakemake(study, "--cores", "1", "--dry-run", *again)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Nothing to be done" in done.stdout + done.stderr, job_counts(done.stdout)


def test_a_changed_parameter_reruns_the_notebooks_that_show_it(study: Path) -> None:
    """The notebooks' papermill parameters are recorded with their jobs, so a config edit that
    reaches only them (tau, the description the report embeds) reruns them, and no point."""
    changed = small_config()
    changed["sweep"]["acceptance_length"] = 2.5
    changed["study"]["description"] = "The same study, described again."
    (study / "changed.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    done = snakemake(study, "--cores", "1", "--dry-run", "--configfile", "changed.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = job_counts(done.stdout)
    assert plan.get("notebook_report") == 1 and plan.get("notebook_compare") == 1, plan
    assert plan.get("notebook_sweep") == 2 and plan.get("render_report") == 1, plan
    assert "sweep_point" not in plan and "bench_kernels" not in plan, plan


def test_a_changed_timeout_measures_no_point_again(study: Path) -> None:
    """A timeout raised to rescue a failed point is the job's resource, not a param: Snakemake
    measures no ok point again for it (a GPU study's points take hours)."""
    changed = small_config()
    changed["sweep"]["start_timeout_s"] = 150
    for server in changed["sweep"]["servers"]:
        for chunk in server["chunks"]:
            chunk["timeout_s"], chunk["point_timeout_s"] = 200, 150
    (study / "timeouts.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    done = snakemake(study, "--cores", "1", "--dry-run", "--configfile", "timeouts.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = job_counts(done.stdout)  # the summary (it records each server's config) and after it
    assert "sweep_point" not in plan and "bench_kernels" not in plan, plan


def test_snakemake_report_has_the_captions(study: Path) -> None:
    done = snakemake(study, "--report", "results/snakemake-report.html")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    html = (study / "results/snakemake-report.html").read_text(errors="replace")
    for caption_text in ["Build record of the custom MLA", "One context point of the end-to-end"]:
        assert caption_text in html, caption_text


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda c: c["sweep"].update(gen_tokens=0), "config.sweep.gen_tokens"),
        (lambda c: c["kernels"].update(devise="cpu"), "config.kernels.devise"),
        (
            lambda c: c["sweep"]["servers"][1]["spec"].update(mode="beam"),
            "config.sweep.servers[1].spec.mode",
        ),
        (lambda c: c["sweep"]["servers"][1].update(name="torch-a"), "config.sweep.servers[1].name"),
        (
            lambda c: c["sweep"]["servers"][0]["chunks"].append(
                {"contexts": [96], "timeout_s": 10, "point_timeout_s": 5}
            ),
            "config.sweep.servers[0].chunks[1].contexts",
        ),
        (lambda c: c["build"].pop("archs"), "config.build.archs"),
        (
            lambda c: c["sweep"].update(command=c["sweep"]["command"].replace("{port}", "8000")),
            "config.sweep.command",
        ),
        (
            lambda c: c["sweep"]["servers"][0].update(command="serve --port {port} {prot}"),
            "config.sweep.servers[0].command",
        ),
        (
            lambda c: c["sweep"]["servers"][1]["chunks"][1].update(contexts=[1024]),
            "config.sweep.servers[1].chunks[1].contexts",
        ),
        (
            lambda c: c["sweep"]["servers"][1].update(concurrency=2),
            "config.sweep.servers[1].concurrency",
        ),
        (
            lambda c: c["sweep"]["servers"][0]["chunks"][0].update(point_timeout_s=600),
            "config.sweep.servers[0].chunks[0].point_timeout_s",
        ),
        (lambda c: c["sweep"].update(requests_per_point=0), "config.sweep.requests_per_point"),
        (lambda c: c.update(reference="data/reference/nope.csv"), "config.reference"),
    ],
    ids=[
        "minimum",
        "unknown-key",
        "enum",
        "duplicate-server",
        "duplicate-point",
        "missing",
        "no-port",
        "unknown-placeholder",
        "beyond-pool",
        "streams-beyond-pool",
        "point-timeout-over-chunk",
        "no-requests",
        "no-reference-file",
    ],  # fmt: skip
)
def test_bad_config_stops_before_any_work(tmp_path: Path, change, key: str) -> None:
    """`snakemake` (and `-n`) fails at once, naming the key, with nothing run."""
    config = small_config()
    change(config)
    workdir = copy_workflow(tmp_path, config)
    done = snakemake(workdir, "--cores", "1", timeout=120)
    assert done.returncode != 0
    assert f"invalid study config at {key}" in done.stdout + done.stderr, done.stderr[-2000:]
    assert not (workdir / "results").exists(), "nothing may run before the config is valid"


def test_a_yaml_slip_and_a_command_line_value_are_named_where_they_are(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path, small_config())
    good = (workdir / "config.yaml").read_text()
    (workdir / "config.yaml").write_text(good.replace("gen_tokens: ", "gen_tokens: [", 1))
    done = snakemake(workdir, "-n", timeout=120)
    said = done.stdout + done.stderr
    line = 1 + good.splitlines().index(next(x for x in good.splitlines() if "gen_tokens" in x))
    assert done.returncode != 0
    assert "invalid study config at config.yaml, line" in said, said[-2000:]
    assert f"while parsing a flow sequence from line {line})" in said
    (workdir / "config.yaml").write_text(good)
    done = snakemake(workdir, "-n", "--config", "sweep={gen_tokens: 8}", timeout=120)
    said = done.stdout + done.stderr
    assert "at config.sweep.gen_tokens (--config; nested values" in said, said[-2000:]
    done = snakemake(workdir, "-n", "--config", "published=results/nope", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]  # a warning: the report shows none
    assert "warning: published: results/nope: no such study folder" in done.stderr
    assert not (workdir / "results").exists()


def test_a_published_folder_without_a_study_is_warned_of_and_shown_as_none(tmp_path: Path) -> None:
    """`published:` naming the folder that holds the published studies, not one of them: the
    notebooks were handed it, and the compare notebook stopped the run on its empty tables."""
    config = small_config()
    config["published"] = "published"
    workdir = copy_workflow(tmp_path, config)
    shutil.copytree(ROOT / "tests" / "data" / "published", workdir / "published" / "h200")
    done = snakemake(workdir, "-n", "-p", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning: published: published: no study " in done.stderr, done.stderr[-2000:]
    assert "did you mean 'published/h200'?" in done.stderr
    assert """-y '{"published": ""}'""" in done.stdout  # the notebooks show none
    assert """-y '{"published": "published"}'""" not in done.stdout


def test_a_mistyped_target_is_one_line_with_the_valid_names(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path, small_config())
    done = snakemake(workdir, "-n", "results/sweep/torch-aa/ctx64.json", timeout=120)
    assert done.returncode != 0
    assert "no server 'torch-aa' in the config; did you mean 'torch-a'?" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    done = snakemake(workdir, "-n", "results/sweep/torch-a/ctx60.json", timeout=120)
    assert done.returncode != 0 and "did you mean 64?" in done.stderr, done.stderr
    for odd in ("ctx064.json", "ctx1k.json", "64.json", "ctx64", "ctx64.jsn"):  # no point file
        done = snakemake(workdir, "-n", f"results/sweep/torch-a/{odd}", timeout=120)
        assert done.returncode != 0 and "did you mean 'ctx" in done.stderr, done.stderr
        valid = done.stderr.split("(valid: ", 1)[-1]  # the closest first
        assert "ctx64.json" in valid and "ctx96.json" in valid, done.stderr
        assert "Traceback" not in done.stdout + done.stderr and "MissingRule" not in done.stderr


def test_a_dry_run_is_one_line_per_job_and_p_adds_the_commands(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path, small_config())
    quiet = snakemake(workdir, "-n", timeout=120)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    jobs = sum(job_counts(quiet.stdout).values()) // 2  # the total is a row of the table too
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert sum(bool(re.match(r"Job \d+: ", line)) for line in lines) == jobs
    assert len(lines) < 4 * jobs + 60, len(lines)
    assert "Shell command" not in quiet.stdout and "SNAKEMAKE" not in quiet.stdout
    shown = snakemake(workdir, "-n", "-p", timeout=120).stdout
    assert "exec decodecliff sweep" in shown and "--name torch-a --contexts 64 " in shown


def test_an_engine_bench_of_flashinfer_as_on_sm120_waits_for_the_build(tmp_path: Path) -> None:
    """FlashInfer run as on sm_120 preloads the shim that build_kernel writes beside the custom
    kernel: its engine bench runs after the build (and again after a rebuild)."""
    config = small_config()
    config["build"]["sm120_model"] = 90
    config["engine"] = {
        "preset": "tiny",
        "device": "cuda",
        "backends": ["flashinfer:backend=fa2,model=sm120"],
        "paths": ["eager"],
        "contexts": [64],
    }
    workdir = copy_workflow(tmp_path, config)
    done = snakemake(workdir, "-n", "results/engine/bench.json", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert job_counts(done.stdout) == {"build_kernel": 1, "bench_engine": 1, "total": 2}


def test_lint_is_clean() -> None:
    done = snakemake(ROOT, "--lint", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Lints for" not in done.stdout + done.stderr, done.stdout + done.stderr


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm-to-job", "hangup", "kill-snakemake"])
def test_stopping_a_point_stops_its_server(tmp_path: Path, stop: str) -> None:
    """The job execs the sweep runner, so a stop signal reaches it, and it takes its server down;
    a closed terminal (SIGHUP to the group) leaves Snakemake's locks released, and a Snakemake
    killed outright leaves no sweep measuring (the sweep stops with its parent)."""
    config = small_config()
    # The Triton baseline under the interpreter: slow enough to be stopped mid-point.
    config["sweep"]["servers"] = [
        {
            "name": "slow",
            "backend": "triton",
            "page_size": 1,
            "spec": {"mode": "chain", "draft_len": 16},
            "chunks": [{"contexts": [2048], "timeout_s": 300, "point_timeout_s": 240}],
        }
    ]
    workdir = copy_workflow(tmp_path, config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "results/sweep/slow/ctx2048.json", "--cores", "1"],
        cwd=workdir,
        env=tools_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal gives it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        sweep = keeper = server = None
        deadline = time.monotonic() + 120
        while server is None and time.monotonic() < deadline:
            time.sleep(0.5)
            jobs = children(proc.pid)
            sweep = jobs[0] if jobs else None
            keepers = children(sweep) if sweep else []  # the server runs under a keeper
            keeper = keepers[0] if keepers else None
            servers = children(keeper) if keeper else []
            server = servers[0] if servers else None
        assert server is not None, "the point's server never started"
        assert "sweep" in Path(f"/proc/{sweep}/cmdline").read_text(), "the job is not exec'd"
        time.sleep(3)  # into the point
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif stop == "hangup":
            os.killpg(proc.pid, signal.SIGHUP)
        elif stop == "kill-snakemake":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.kill(sweep, signal.SIGTERM)
        assert proc.wait(timeout=90) != 0
        if stop == "hangup":  # ended as on Ctrl-C: the same command can run again
            locks = list((workdir / ".snakemake/locks").glob("*"))
            assert not locks, f"Snakemake left its locks: {locks}"
        deadline = time.monotonic() + 30
        while alive(sweep) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(sweep), f"the sweep (pid {sweep}) outlived its Snakemake"
        deadline = time.monotonic() + 30  # the runner's SIGTERM -> SIGKILL grace is 10 s
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(server), f"the server (pid {server}) outlived its stopped point"
        point = workdir / "results/sweep/slow/ctx2048.json"
        if point.exists():  # written by the runner as interrupted (never as a finished point)
            doc = json.loads(point.read_text())
            assert doc["status"] == "failed" and "interrupted" in doc["reason"], doc["reason"]
    finally:
        for pid in [p for p in (server, keeper, sweep) if p and alive(p)]:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
