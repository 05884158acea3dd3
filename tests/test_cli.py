"""The top-level command line: help, version, and clear failures for unknown commands."""

from __future__ import annotations

import subprocess
import sys

from decodecliff import __version__
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
