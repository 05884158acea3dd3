"""Where a number came from: hardware, driver, library versions and git revision."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path


def _run(cmd: list[str], cwd: str | Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_revision(path: str | Path | None = None) -> str | None:
    """The commit of the checkout (DECODECLIFF_GIT_REV wins, for copies without .git)."""
    cwd = path or Path(__file__).resolve().parent
    rev = os.environ.get("DECODECLIFF_GIT_REV") or _run(["git", "rev-parse", "HEAD"], cwd)
    if rev and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd):
        rev += "-dirty"
    return rev


@functools.cache
def collect() -> dict:
    """A JSON-ready description of this machine and software stack."""
    import torch

    info: dict = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "git": git_revision(),
        "gpu": None,
        "driver": None,
    }
    try:  # no `import triton` here: that would fix TRITON_INTERPRET before a CPU backend sets it
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_capability"] = f"sm_{props.major}{props.minor}"
        info["gpu_sms"] = props.multi_processor_count
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return info
