"""NOTES.md shows the config's sweep points only, as the summary table does: a point file an
earlier config left under results/sweep/ (a server or a context since dropped) is not this study's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from published_study import copy_study, edit_points
from report_study import STUDY, study_config

from decodecliff.analysis import notes, summarize
from decodecliff.study.plan import Study

REPO = Path(__file__).resolve().parents[1]
LONGEST = "verify steps per second at 1k: torch-chain16-p1"  # a target at the dropped context


def _config() -> dict:
    """The recorded run's config with torch-chain16-p1's 1k point dropped, a target there."""
    cfg = study_config()
    server = next(s for s in cfg["sweep"]["servers"] if s["name"] == "torch-chain16-p1")
    server["chunks"][0]["contexts"] = [256, 4096]
    cfg["targets"] = [
        {"kind": "verify_steps_per_s", "server": "torch-chain16-p1", "ctx": 1024, "min": 1.0},
    ]
    return cfg


def _summarize(root: Path, cfg: dict) -> Path:
    """summary/sweep.csv as the summarize rule writes it: from the config's point files."""
    points = [str(root / p) for p in Study(cfg).point_files()]
    servers = json.dumps(cfg["sweep"]["servers"])
    out = root / "results" / "summary"
    args = ["--sweep", *points, "--servers", servers, "--out", str(out), "--no-parquet"]
    assert summarize.cli(args) == 0
    return out / "sweep.csv"


def _render(root: Path, cfg: dict, sweep: Path) -> str:
    """As the notes rule runs it: the study folder, the config (a file here, stdin there), the
    summary."""
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = root / "results" / "NOTES.md"
    args = [str(root / "results"), "--config", str(config), "--sweep", str(sweep)]
    assert notes.cli([*args, "--out", str(out)]) == 0
    return out.read_text()


def test_a_server_and_a_context_dropped_from_the_config_are_not_in_the_notes(
    tmp_path: Path,
) -> None:
    shutil.copytree(STUDY, tmp_path / "results")
    sweep = tmp_path / "results" / "sweep"
    # a server an earlier config ran, since removed: its point file is still on disk
    point = json.loads((sweep / "torch-chain16-p1" / "ctx1024.json").read_text())
    (sweep / "torch-extra-p1").mkdir()
    (sweep / "torch-extra-p1" / "ctx1024.json").write_text(
        json.dumps(point | {"name": "torch-extra-p1"})
    )
    cfg = _config()
    text = _render(tmp_path, cfg, _summarize(tmp_path, cfg))
    assert "torch-extra-p1 |" not in text  # no row of the dropped server
    # torch-chain16-p1's longest point that ran is 256 now (4096 was skipped), not the dropped 1k
    assert "| torch-chain16-p1 | 256 |" in text and "| torch-chain16-p1 | 1k |" not in text
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines()}
    assert rows[LONGEST].endswith("| not measured: no point within 10% of 1k (ran: 256, 4k) |")


def test_the_summary_gives_the_same_notes_as_the_point_files_it_was_written_from(
    tmp_path: Path,
) -> None:
    shutil.copytree(STUDY, tmp_path / "results")
    cfg = study_config()
    text = _render(tmp_path, cfg, _summarize(tmp_path, cfg))
    assert text == notes.render(tmp_path / "results", cfg, cfg["study"]["name"])


def test_an_engine_bench_outside_the_config_is_not_cited(tmp_path: Path) -> None:
    """The recorded study holds engine/bench.json; a config without an engine section (the rule
    then waits for no engine bench) cites no step anatomy from it."""
    shutil.copytree(STUDY, tmp_path / "results")
    cfg = study_config()  # no engine section
    cfg["targets"] = [_config()["targets"][0] | {"min": 1e6}]  # missed: its why is rendered
    sweep = _summarize(tmp_path, cfg)
    anatomy = "`torch-chain16-p1`: torch eager at 1k: step"
    assert anatomy not in _render(tmp_path, cfg, sweep)
    cfg["engine"] = yaml.safe_load((REPO / "config.yaml").read_text())["engine"]
    assert anatomy in _render(tmp_path, cfg, sweep)


def test_a_cpu_study_s_speedups_are_said_to_be_the_interpreter_s() -> None:
    """On a CPU the Triton baseline runs in its interpreter: a speedup over it is no GPU's."""
    caveat = "On this CPU Triton runs in its interpreter"
    assert caveat in notes.render(STUDY, study_config(), "cpu")
    assert caveat not in (REPO / "results/published/h200/NOTES.md").read_text()


def test_drafts_the_servers_accept_are_not_said_to_be_never_accepted(tmp_path: Path) -> None:
    """The published study's servers accept no draft (1 token per verify step); where its points
    record 2.5, the notes say so instead of calling tokens/s verify steps/s."""
    study = copy_study(tmp_path / "study")
    cfg = yaml.safe_load((REPO / "config/h200.yaml").read_text())
    never = "almost never accepted\n(median tokens per verify step: 1), so tokens/s equal"
    assert never in notes.render(study, cfg, "h200")

    def accept(doc: dict) -> None:
        for request in doc["requests"]:
            request["metrics"]["spec_accept_length"] = 2.5

    edit_points(study, [p.name for p in (study / "sweep").iterdir()], [], accept)
    text = notes.render(study, cfg, "h200")
    assert "almost never accepted" not in text and "tokens/s equal verify steps/s" not in text
    assert "a median of 2.5 tokens per verify step" in text


def test_a_step_just_over_its_floor_is_worded_as_every_ratio(tmp_path: Path) -> None:
    """'step over floor' is a ratio, worded as tables.times words them: a step 0.2% over its
    floor reads 1.002x, not 1x, in the table and in the line under it."""
    from decodecliff.analysis import floors, tables

    study = copy_study(tmp_path / "study")
    cfg = yaml.safe_load((REPO / "config/h200.yaml").read_text())
    loaded = summarize.load_study(study)
    server = "custom-graph-p1"
    row = tables.ok(loaded.sweep).query("server == @server").sort_values("requested_ctx").iloc[-1]
    ctx = int(row["requested_ctx"])
    floor = floors.step_floor(
        row, ctx, loaded.ceilings["copy_gbs"], loaded.ceilings["matmul_tflops"]
    ).ms
    scale = 1e3 / (floor * 1.002) / row["verify_steps_s_server"]

    def slower(doc: dict) -> None:
        for request in doc["requests"]:
            request["metrics"]["verify_steps_s_server"] *= scale

    edit_points(study, [server], [ctx], slower)
    text = notes.render(study, cfg, "h200")
    line = next(li for li in text.splitlines() if li.startswith(f"| {server} |"))
    assert line.endswith("| 1.002x |"), line
    assert "the step is 1.002x it." in text
    assert "the step is 1x it" not in text and "xx it" not in text
