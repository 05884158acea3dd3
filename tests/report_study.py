"""A study folder built from the recorded results in tests/data, analysed by the real rules.

Snakemake runs the analysis and report rules (summarize, the papermill notebooks, nbconvert) on
copies of recorded raw results; the raw stages are not rerun. Shared by the notebook and browser
tests, executed once per test session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
STUDY = DATA / "study"  # a real CPU run: bench-kernels, kernel build, sweep of the tiny server
PUBLISHED = DATA / "published"  # hand-written, GPU-shaped study folder (see data/README.md)
REFERENCE = REPO / "data" / "reference" / "seed-rtx-pro-6000-triton.csv"
ANALYSIS_RULES = [
    "summarize",
    "notebook_kernels",
    "notebook_sweep",
    "notebook_compare",
    "notebook_report",
    "render_report",
    "notes",
]
SERVERS = {
    "torch-chain16-p1": ("torch", [[256, 1024, 4096]]),
    "torch-chain16-p1-k4": ("torch", [[256]]),
    "triton-chain16-p1": ("triton", [[64], [512]]),
}
CONCURRENCY = {"torch-chain16-p1-k4": 4}  # streams per round (the others: 1)
_RUNS: dict[Path, subprocess.CompletedProcess] = {}


def study_config() -> dict:
    """The default config with the servers and contexts of the recorded run."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    template = cfg["sweep"]["servers"][0]
    cfg["sweep"]["servers"] = [
        template
        | {
            "name": name,
            "backend": backend,
            "chunks": [{"contexts": c, "timeout_s": 300, "point_timeout_s": 120} for c in chunks],
            "concurrency": CONCURRENCY.get(name, 1),
        }
        for name, (backend, chunks) in SERVERS.items()
    ]
    cfg.pop("engine", None)  # the step anatomy is measured (bench_engine): not in recorded data
    cfg["published"] = str(PUBLISHED)
    cfg["reference"] = str(REFERENCE)
    return cfg


def make_workdir(root: Path) -> Path:
    """A working directory holding the recorded raw results, older than anything derived."""
    shutil.copytree(STUDY, root / "results")
    for templates in ("notebooks", "workflow"):  # read by the report rules, relative to the workdir
        (root / templates).symlink_to(REPO / templates)
    (root / "config.yaml").write_text(yaml.safe_dump(study_config(), sort_keys=False))
    lib = root / "results" / "build" / "libdecodecliff_mla.so"
    lib.write_bytes(b"")  # the build rule's other output; the analysis never reads it
    stamp = 1_700_000_000
    for path in [lib, *sorted((root / "results").rglob("*.json"))]:
        os.utime(path, (stamp, stamp))
        stamp += 1
    return root


def tools_env() -> dict[str, str]:
    """This environment with this interpreter's scripts (snakemake, decodecliff) first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return os.environ | {"PATH": path}


def run_analysis(root: Path) -> subprocess.CompletedProcess:
    """Run the analysis and report rules in ``root`` up to results/report.html."""
    env = tools_env()
    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(root),
        "--configfile", str(root / "config.yaml"), "--cores", "2", "--nolock",
        "--allowed-rules", *ANALYSIS_RULES, "--", "results/report.html", "results/NOTES.md",
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)


def executed(root: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The analysed study folder (run once per ``root``)."""
    if root not in _RUNS:
        _RUNS[root] = run_analysis(make_workdir(root))
    return root, _RUNS[root]
