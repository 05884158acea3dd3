"""The top-level command line: help, version, and clear failures for unknown commands."""

from __future__ import annotations

import subprocess
import sys

from decodecliff import __version__, helpformat
from decodecliff.cli import COMMANDS


def decodecliff(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "decodecliff.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_help_lists_every_command_without_importing_torch() -> None:
    probe = (
        "import sys; from decodecliff import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('torch' in sys.modules, code)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("False 0"), done.stdout + done.stderr
    for name in COMMANDS:
        assert name in done.stdout


def test_version() -> None:
    done = decodecliff("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"decodecliff {__version__}"


def test_unknown_command_says_so_on_stderr_and_exits_2() -> None:
    done = decodecliff("frobnicate")
    assert done.returncode == 2
    assert "invalid choice: 'frobnicate'" in done.stderr and not done.stdout


def test_no_command_is_a_usage_error() -> None:
    done = decodecliff()
    assert done.returncode == 2 and "required" in done.stderr


def test_a_command_answers_its_own_help() -> None:
    done = decodecliff("build-kernel", "--help")
    assert done.returncode == 0 and "usage: decodecliff build-kernel" in done.stdout


def test_a_mistyped_name_is_one_line_with_the_valid_ones_closest_first() -> None:
    done = decodecliff("bench-kernel")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "did you mean 'bench-kernels'? (valid: bench-kernels," in done.stderr
    done = decodecliff("serve", "--backend", "trtion")  # parsed before anything imports torch
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'trtion'; did you mean 'triton'? (valid: triton, " in done.stderr
    assert "see decodecliff serve --help" in done.stderr and "Traceback" not in done.stderr


def test_one_line_reads_the_commands_own_choice_errors() -> None:
    choices = "['cublas', 'custom', 'torch', 'triton']"
    for message in (
        f"unknown backend 'trtion'; choose from {choices}",
        f"argument --backends: unknown attention backend 'trtion'; choose one of {choices}",
    ):
        line = helpformat.one_line(message)
        assert line.endswith(
            "'trtion'; did you mean 'triton'? (valid: triton, cublas, custom, torch)"
        )
    assert helpformat.one_line("the following arguments\n are required: --out") == (
        "the following arguments are required: --out"
    )
    assert helpformat.did_you_mean("zzz", ["a", "b"]) == "(valid: a, b)"


def test_a_backend_this_machine_cannot_run_is_one_line_before_any_model_is_built() -> None:
    for backend in ("sglang", "flashinfer", "custom"):
        done = decodecliff("serve", "--device", "cpu", "--backend", backend, "--port", "0")
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (
            f"decodecliff serve: error: the {backend} backend needs a CUDA GPU (the device is cpu)"
        )
