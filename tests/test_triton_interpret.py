"""The one decision whether Triton runs interpreted (decodecliff/triton_interpret.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from decodecliff import triton_interpret
from decodecliff.triton_interpret import triton_interpreted


@pytest.fixture
def gpu_file(tmp_path, monkeypatch):
    """Point the device-file pattern at a folder; returns a function that adds a 'GPU' there."""
    monkeypatch.setattr(triton_interpret, "NVIDIA_DEVICES", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return lambda: (tmp_path / "nvidia0").touch()


def test_without_a_gpu_the_interpreter_is_chosen(gpu_file) -> None:
    assert triton_interpreted() and os.environ["TRITON_INTERPRET"] == "1"


def test_with_a_gpu_triton_compiles(gpu_file) -> None:
    gpu_file()
    assert not triton_interpreted() and "TRITON_INTERPRET" not in os.environ


def test_hidden_gpus_count_as_none(gpu_file, monkeypatch) -> None:
    gpu_file()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert triton_interpreted() and os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.parametrize("value, interpreted", [("0", False), ("", False), ("1", True)])
def test_an_explicit_setting_wins(gpu_file, monkeypatch, value: str, interpreted: bool) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpreted() is interpreted and os.environ["TRITON_INTERPRET"] == value
    gpu_file()
    assert triton_interpreted() is interpreted


def test_importing_the_package_decides_before_triton_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, on any machine
    code = "import os, sys, decodecliff; "
    code += "print(os.environ['TRITON_INTERPRET'], 'triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["1", "False"], done.stderr


def test_the_triton_backend_refuses_a_triton_loaded_before_the_decision() -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the package decides for the interpreter
    code = "import triton; import decodecliff.kernels.triton_baseline"  # triton first: compiled
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "triton was imported before TRITON_INTERPRET=1" in done.stderr
