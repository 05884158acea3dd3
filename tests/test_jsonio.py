"""The one atomic JSON writer: whole files only, strict JSON on request, no temporary left."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from decodecliff.jsonio import write_json


def test_writes_a_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "point.json"
    write_json(path, {"ms": 1.5, "out": tmp_path}, default=str)
    assert json.loads(path.read_text()) == {"ms": 1.5, "out": str(tmp_path)}
    assert path.read_text().endswith("}\n")
    write_json(path, {"ms": 2.0})
    assert json.loads(path.read_text()) == {"ms": 2.0}
    assert [p.name for p in path.parent.iterdir()] == ["point.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "point.json"
    write_json(path, {"ok": True})
    with pytest.raises(ValueError):
        write_json(path, {"ms": math.nan}, allow_nan=False)
    with pytest.raises(TypeError):
        write_json(path, {"out": tmp_path})  # no default: a path is not JSON
    assert json.loads(path.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["point.json"]
