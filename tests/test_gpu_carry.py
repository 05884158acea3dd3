"""scripts/gpu_carry.sh fetches the peers a lent GPU machine runs: the `peers` extra's versions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def test_the_carried_peers_are_the_peers_extra_s_versions() -> None:
    script = (REPO / "scripts" / "gpu_carry.sh").read_text()
    pins = dict(re.findall(r"\b(FLASHINFER|TVM_FFI|SGLANG)=(\S+)", script))
    names = {"FLASHINFER": "flashinfer-python", "TVM_FFI": "apache-tvm-ffi", "SGLANG": "sglang"}
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    peers = {r.name: r.specifier for r in map(Requirement, extra["optional-dependencies"]["peers"])}
    assert pins.keys() == names.keys()
    for var, version in pins.items():
        assert peers[names[var]].contains(version), (names[var], version, peers[names[var]])


def test_the_carried_sse_reader_is_one_the_package_takes() -> None:
    script = (REPO / "scripts" / "gpu_carry.sh").read_text()
    pin = re.search(r"\bHTTPX_SSE=(\S+)", script).group(1)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [r.specifier for r in map(Requirement, deps) if r.name == "httpx-sse"]
    assert spec.contains(pin), (pin, spec)


def test_a_download_that_fails_keeps_the_folders_there_were(tmp_path) -> None:
    """pip without a network (a stand-in python3 that fails) must not cost the carried folders."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_carry.sh", tree / "scripts")
    for folder in (".whl", ".sgl"):
        (tree / folder).mkdir()
        (tree / folder / "kept").write_text(folder)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\necho 'no network' >&2\nexit 1\n")
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", "scripts/gpu_carry.sh"], cwd=tree, env=env, capture_output=True)
    assert run.returncode != 0
    assert [(tree / f / "kept").read_text() for f in (".whl", ".sgl")] == [".whl", ".sgl"]
