"""scripts/gpu_carry.sh fetches the peers a lent GPU machine runs: the `peers` extra's versions."""

from __future__ import annotations

import re
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
