"""The point record check (sweep/point.py): it agrees with jsonschema on point.schema.json, and the
runner refuses to write a record that breaks the schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from decodecliff.sweep import launcher, point
from decodecliff.sweep.runner import Chunk, Runner, SweepConfig, point_path

DATA = Path(__file__).with_name("data")
SCHEMA = json.loads(point.SCHEMA_PATH.read_text())


def _agree(record: object) -> bool:
    """Whether the check and jsonschema agree on ``record``; returns whether it is valid."""
    ours = point.error(record)
    theirs = next(jsonschema.Draft202012Validator(SCHEMA).iter_errors(record), None)
    assert (ours is None) == (theirs is None), (ours, theirs and theirs.message)
    return ours is None


@pytest.fixture(scope="module")
def failed_point(tmp_path_factory) -> dict:
    """A point written by a real sweep (its server never answers)."""
    out = tmp_path_factory.mktemp("points")
    url = f"http://127.0.0.1:{launcher.free_port('127.0.0.1')}"
    cfg = SweepConfig(
        name="gone", chunks=[Chunk([16], 10.0, 5.0)], out=out, url=url, start_timeout_s=0.3,
        progress=False,
    )  # fmt: skip
    Runner(cfg).run()
    return json.loads(point_path(out, 16).read_text())


def test_check_agrees_with_jsonschema_on_the_recorded_points():
    paths = sorted(DATA.glob("*/sweep/*/ctx*.json"))
    assert paths
    valid = [_agree(json.loads(p.read_text())) for p in paths]
    assert any(valid) and not all(valid)  # the old schema's points fail both


MUTATIONS = {
    "missing key": lambda p: p.pop("rounds"),
    "wrong const": lambda p: p.update(schema="decodecliff.sweep-point/1"),
    "bad enum": lambda p: p.update(status="done"),
    "ok with a reason": lambda p: p.update(status="ok"),
    "bool as integer": lambda p: p.update(requested_ctx=True),
    "below minimum": lambda p: p.update(gen_tokens=0),
    "bad pattern": lambda p: p.update(name="a/b"),
    "unknown metric": lambda p: p["metrics"].update(speed=1.0),
    "negative duration": lambda p: p["metrics"].update(ttft_s=-1.0),
    "zero rate": lambda p: p["metrics"].update(decode_tok_s=0.0),
    "short timestamp": lambda p: p.update(token_timestamps=[[0.1]]),
    "zero tokens": lambda p: p.update(token_timestamps=[[0.1, 0]]),
    "bad nested": lambda p: p["chunk"].update(contexts=[0]),
    "bad timestamp": lambda p: p.update(started_at="yesterday"),
    "bad request": lambda p: p["requests"].append({"round": 0}),
    "bad warm-up": lambda p: p.update(warmup={"launch": 1}),
}
# Changes the schema allows (JSON has one number type; a metric may be unknown).
VALID = {
    "integral float": lambda p: p.update(requested_ctx=16.0),
    "null metric": lambda p: p["metrics"].update(ttft_s=None),
    "another launch": lambda p: p.update(server_launch=3),
}


@pytest.mark.parametrize("change", [*MUTATIONS, *VALID])
def test_check_agrees_with_jsonschema_on_changed_records(failed_point, change):
    assert _agree(failed_point)
    changed = copy.deepcopy(failed_point)
    {**MUTATIONS, **VALID}[change](changed)
    assert _agree(changed) is (change in VALID)


def test_the_runner_refuses_a_malformed_record_and_writes_nothing(failed_point, tmp_path):
    url = f"http://127.0.0.1:{launcher.free_port('127.0.0.1')}"
    cfg = SweepConfig(name="gone", chunks=[Chunk([16], 10.0, 5.0)], out=tmp_path, url=url)
    bad = {**failed_point, "status": "done"}
    with pytest.raises(point.PointError, match=r"ctx 16 .*point\.status: 'done' is not one of"):
        Runner(cfg)._write(bad)
    assert not list(tmp_path.iterdir())
    Runner(cfg)._write(failed_point)
    assert json.loads(point_path(tmp_path, 16).read_text()) == failed_point


def test_a_schema_keyword_the_check_does_not_know_is_refused(tmp_path, monkeypatch):
    strict = {**SCHEMA, "properties": {**SCHEMA["properties"], "warnings": {"uniqueItems": True}}}
    path = tmp_path / "point.schema.json"
    path.write_text(json.dumps(strict))
    monkeypatch.setattr(point, "SCHEMA_PATH", path)
    point.schema.cache_clear()
    try:
        with pytest.raises(point.PointError, match=r"does not know: \['uniqueItems'\]"):
            point.schema()
    finally:
        point.schema.cache_clear()
