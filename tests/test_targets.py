"""The study's targets checked against result tables: met, missed (by how much), not measured."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from report_study import PUBLISHED, REPO, STUDY

from decodecliff.analysis import figures, summarize, tables, targets
from decodecliff.analysis.targets import MET, MISSED, NOT_MEASURED, Target

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def check(study: summarize.Study, **spec) -> pd.Series:
    return targets.evaluate(study, targets.parse([spec])).iloc[0]


def kernel_study(points: list[dict], copy_gbs: float = 4000.0) -> summarize.Study:
    """A study of microbenchmark points: each dict overrides an 8-head, page-size-1 ok point."""
    bench = {"ceilings": {"copy_gbs": copy_gbs, "device": "test"}, "points": []}
    for p in points:
        q_len = {"decode": 1, "chain16": 16, "tree64": 64}[p["mode"]]
        bench["points"].append(
            {"heads": 8, "page_size": 1, "batch": 1, "q_len": q_len, "triton_config": None,
             "status": "ok", "reason": None, "gbs": 1000.0} | p
        )  # fmt: skip
    return summarize.Study(Path("."), summarize.kernel_table(bench), pd.DataFrame())


def raw_sweep(server: str, ctx: int) -> dict:
    return json.loads((PUBLISHED / "sweep" / server / f"ctx{ctx}.json").read_text())


@pytest.fixture(scope="module")
def published() -> summarize.Study:
    return summarize.load_study(PUBLISHED)


def test_kernel_speedups_on_recorded_data_are_the_worst_point_over_the_fastest_baseline(
    published: summarize.Study,
) -> None:
    bench = json.loads((PUBLISHED / "kernels" / "bench.json").read_text())
    ms = {}
    for p in bench["points"]:
        if p["status"] == "ok" and p["heads"] == 8 and p["page_size"] == 1:
            key = (p["mode"], p["ctx"])
            ms.setdefault(p["backend"], {}).setdefault(key, []).append(p["ms"])
    both = set(ms["custom"]) & set(ms["triton"])
    speedups = {k: min(ms["triton"][k]) / ms["custom"][k][0] for k in both}
    row = check(published, kind="kernel_speedup", min=1)
    assert row["status"] == MET and row["measured"] == pytest.approx(min(speedups.values()))
    assert row["margin"] == f"{tables.times(row['measured'])} over"
    from_16k = min(v for (_, ctx), v in speedups.items() if ctx >= 16000)
    row = check(published, kind="kernel_speedup", from_ctx=16000, min=20)
    assert row["measured"] == pytest.approx(from_16k) and row["status"] == MET


def test_missed_end_to_end_target_says_by_how_much(published: summarize.Study) -> None:
    custom, triton = raw_sweep("custom", 32768), raw_sweep("triton", 32768)
    ratio = custom["metrics"]["decode_tok_s"] / triton["metrics"]["decode_tok_s"]
    assert 25 < ratio < 50, "the recorded fixture changed; pick another threshold"
    row = check(published, kind="decode_speedup", ctx=32000, min=50)
    assert row["status"] == MISSED and row["measured"] == pytest.approx(ratio)
    assert row["margin"] == f"missed by {1 - ratio / 50:.0%}"
    assert row["subject"].startswith("custom vs triton, 32k (32,768)")


def test_the_default_baseline_is_the_baseline_backend_on_the_candidate_s_path(
    published: summarize.Study,
) -> None:
    """An eager candidate is measured against the eager Triton server, a CUDA-graph one against a
    CUDA-graph Triton server (none here: said so), and ``baseline`` picks the backend."""
    sweep = published.sweep
    assert targets.paired_baseline(sweep, "custom", "triton") == "triton"
    assert targets.paired_baseline(sweep, "custom-graphs", "triton") is None
    row = check(published, kind="decode_speedup", ctx=32000, min=1, server="custom-graphs")
    assert row["status"] == NOT_MEASURED and row["reason"].startswith(
        "no triton baseline server on custom-graphs's engine path"
    )
    graphs = sweep[sweep["server"] == "triton"].assign(server="triton-graphs", cuda_graph=True)
    study = dataclasses.replace(published, sweep=pd.concat([sweep, graphs], ignore_index=True))
    row = check(study, kind="decode_speedup", ctx=32000, min=1, server="custom-graphs")
    assert row["subject"].startswith("custom-graphs vs triton-graphs")
    row = check(published, kind="decode_speedup", ctx=32000, min=1, baseline="custom")
    assert row["subject"].startswith("custom vs custom,")


def test_verify_steps_are_counted_steps_over_the_decode_wall_time(
    published: summarize.Study,
) -> None:
    metrics = raw_sweep("custom", 1024)["metrics"]
    steps = metrics["spec_verify_ct"] / metrics["decode_wall_s"]
    row = check(published, kind="verify_steps_per_s", ctx=1024, min=100)
    assert row["measured"] == pytest.approx(steps) and row["status"] == MISSED
    # the plain custom server, not the one with CUDA graphs
    assert row["subject"].startswith("custom, 1k")


def test_not_measured_targets_give_the_reason(published: summarize.Study) -> None:
    row = check(published, kind="kernel_ms", mode="chain16", ctx=185000, max=0.15)
    assert row["status"] == NOT_MEASURED and pd.isna(row["measured"])
    assert row["reason"] == "no point within 10% of 185k (ran: 1k, 32k, 128k)"
    # 128k: the nearest requested context (131,072) is within 10%, but the baseline failed there
    failed = raw_sweep("triton", 131072)
    row = check(published, kind="decode_speedup", ctx=128000, min=50)
    assert row["status"] == NOT_MEASURED and failed["reason"] in row["reason"]
    assert row["reason"].startswith("baseline triton failed")
    local = summarize.load_study(STUDY)
    skipped = json.loads((STUDY / "kernels" / "bench.json").read_text())["points"]
    why = next(p["reason"] for p in skipped if p["backend"] == "custom")
    row = check(local, kind="kernel_copy_fraction", mode="decode", ctx=1024, min=0.7)
    assert row["status"] == NOT_MEASURED and row["reason"] == f"custom not run (skipped: {why})"
    row = check(published, kind="decode_speedup", ctx=1024, min=1, server="nope")
    assert row["reason"] == "no server 'nope' in the sweep"


def test_kernel_time_and_bandwidth_targets_met_and_missed() -> None:
    study = kernel_study(
        [
            {"backend": "custom", "mode": "chain16", "ctx": 185000, "ms": 0.10},
            {"backend": "custom", "mode": "tree64", "ctx": 185000, "ms": 1.45},
            {"backend": "custom", "mode": "decode", "ctx": 185000, "ms": 0.09, "gbs": 2248.0},
        ],
        copy_gbs=4193.0,
    )
    met = check(study, kind="kernel_ms", mode="chain16", ctx=185000, max=0.15)
    assert (met["status"], met["margin"], met["ratio"]) == (MET, "1.5x under", pytest.approx(1.5))
    missed = check(study, kind="kernel_ms", mode="tree64", ctx=185000, max=0.35)
    assert (missed["status"], missed["margin"]) == (MISSED, f"missed by {1.45 / 0.35:.3g}x")
    bw = check(study, kind="kernel_copy_fraction", mode="decode", ctx=185000, min=0.7)
    assert bw["measured"] == pytest.approx(2248 / 4193) and bw["status"] == MISSED
    assert bw["margin"] == f"missed by {1 - 2248 / 4193 / 0.7:.0%}"
    spec = {"kind": "kernel_copy_fraction", "mode": "decode", "ctx": 185000, "min": 0.7}
    shown = targets.display_table(targets.evaluate(study, targets.parse([spec])))
    assert shown.loc["decode at 185k: custom effective bandwidth"].to_dict() == {
        "threshold": ">= 70% of copy GB/s",
        "measured": "54% of copy GB/s",
        "margin": bw["margin"],
        "status": MISSED,
        "measured on": bw["subject"],
    }


def test_never_slower_counts_the_worst_point_and_the_fastest_baseline_variant() -> None:
    study = kernel_study(
        [
            {"backend": "custom", "mode": "decode", "ctx": 1024, "ms": 0.02},
            {"backend": "triton", "triton_config": "grouped-s8", "mode": "decode", "ctx": 1024,
             "ms": 0.03},
            {"backend": "triton", "triton_config": "grouped-s64", "mode": "decode", "ctx": 1024,
             "ms": 0.015},
            {"backend": "custom", "mode": "chain16", "ctx": 16384, "ms": 0.05},
            {"backend": "triton", "triton_config": "sm90", "mode": "chain16", "ctx": 16384,
             "ms": 2.0},
        ]
    )  # fmt: skip
    row = check(study, kind="kernel_speedup", min=1)
    assert row["status"] == MISSED and row["measured"] == pytest.approx(0.75)
    assert (
        row["margin"] == "missed by 25%"
        and "decode at 1k vs triton (grouped-s64)" in (row["subject"])
    )
    row = check(study, kind="kernel_speedup", from_ctx=16000, min=20)
    assert row["status"] == MET and row["measured"] == pytest.approx(40)
    row = check(study, kind="kernel_speedup", from_ctx=65536, min=20)
    assert row["status"] == NOT_MEASURED and row["reason"] == (
        "no point from 64k up where both backends ran"
    )


def test_the_custom_kernel_counts_as_its_auto_rule_runs_it_not_its_pinned_variants() -> None:
    study = kernel_study(
        [
            {"backend": "custom", "mode": "decode", "ctx": 185000, "ms": 0.08},
            {"backend": "custom", "triton_config": "v5", "mode": "decode", "ctx": 185000,
             "ms": 0.5},  # a variant auto does not pick here
            {"backend": "custom", "triton_config": "v4-sm120", "mode": "decode", "ctx": 185000,
             "ms": 0.3},
            {"backend": "custom", "triton_config": "auto-s16", "mode": "decode", "ctx": 185000,
             "ms": 0.6},  # a set split count (bench-kernels --custom-splits)
            {"backend": "custom", "triton_config": "v4-sm120-s16", "mode": "decode",
             "ctx": 185000, "ms": 0.7},
            {"backend": "triton", "triton_config": "grouped-sglang", "mode": "decode",
             "ctx": 185000, "ms": 0.2},
        ]
    )  # fmt: skip
    row = check(study, kind="kernel_speedup", min=1)
    assert row["measured"] == pytest.approx(0.2 / 0.08)
    row = check(study, kind="kernel_ms", mode="decode", ctx=185000, max=0.1)
    assert row["measured"] == pytest.approx(0.08)
    shown = set(figures.main_series(study.kernels)["series"])
    assert shown == {"custom", "triton (grouped-sglang)"}


def test_a_near_miss_is_not_shown_at_the_threshold_it_missed() -> None:
    """A measured value that rounds to its threshold keeps the digits that tell them apart: a
    bandwidth of 69.98% of the copy rate is not written '70%' under '>= 70%'."""
    study = kernel_study(
        [
            {"backend": "custom", "mode": "decode", "ctx": 185000, "ms": 0.09, "gbs": 2799.2},
            {"backend": "custom", "mode": "chain16", "ctx": 185000, "ms": 0.15004},
            {"backend": "custom", "mode": "tree64", "ctx": 185000, "ms": 0.35},
        ],
        copy_gbs=4000.0,
    )  # fmt: skip
    specs = [
        {"kind": "kernel_copy_fraction", "mode": "decode", "ctx": 185000, "min": 0.7},
        {"kind": "kernel_ms", "mode": "chain16", "ctx": 185000, "max": 0.15},
        {"kind": "kernel_ms", "mode": "tree64", "ctx": 185000, "max": 0.35},
    ]
    checked = targets.evaluate(study, targets.parse(specs))
    shown = targets.display_table(checked)
    assert list(checked["status"]) == [MISSED, MISSED, MET]
    assert list(shown["measured"]) == ["69.98% of copy GB/s", "0.15004 ms", "0.35 ms"]


def test_context_matching_takes_the_nearest_point_within_tolerance() -> None:
    points = [{"backend": "custom", "mode": "chain16", "ctx": c, "ms": c / 1e6} for c in (
        64000, 131072)]  # fmt: skip
    study = kernel_study(points)
    row = check(study, kind="kernel_ms", mode="chain16", ctx=128000, max=1)
    assert row["measured"] == pytest.approx(0.131072) and "128k (131,072)" in row["subject"]
    row = check(study, kind="kernel_ms", mode="chain16", ctx=100000, max=1)
    assert row["status"] == NOT_MEASURED
    row = check(study, kind="kernel_ms", mode="chain16", ctx=100000, max=1, ctx_tolerance=0.5)
    assert row["measured"] == pytest.approx(0.131072)


@pytest.mark.parametrize(
    ("op", "threshold", "measured", "text", "status"),
    [
        (">=", 50, 90, "1.8x over", MET),
        (">=", 100, 77, "missed by 23%", MISSED),
        (">=", 100, 10, "missed by 10x", MISSED),
        ("<=", 0.15, 0.15, "1x under", MET),
        ("<=", 0.15, 0.1845, "missed by 23%", MISSED),
        ("<=", 0.35, 1.45, "missed by 4.14x", MISSED),
        (">=", 100, 99.6, "missed by 0.4%", MISSED),
        ("<=", 0.15, 0.1506, "missed by 0.4%", MISSED),
        # ratios as tables.times words them: a lead under 0.5% keeps its digits, no exponent
        (">=", 1, 1.002, "1.002x over", MET),
        ("<=", 1, 0.9985, "1.002x under", MET),
        (">=", 1, 1234, "1,234x over", MET),
        (">=", 1000, 0.5, "missed by 2,000x", MISSED),
    ],
)
def test_margin_arithmetic(op, threshold, measured, text, status) -> None:
    assert targets.margin(op, threshold, measured)[1:] == (text, status)


@pytest.mark.parametrize(
    ("threshold", "measured", "unit", "text"),
    [
        (1, 1234, "x", "1,234x"),  # it read 1.23e+03x beside a margin of 1,234x
        (1, 84.44, "x", "84.4x"),
        (1234, 1234.4, "x", "1234.4x"),  # the digits that tell it from its threshold
        (100, 12345.6, "steps/s", "12,346 steps/s"),
        (0.15, 0.1506, "ms", "0.151 ms"),
    ],
)
def test_a_measured_value_is_never_written_as_an_exponent(threshold, measured, unit, text):
    assert targets._measured(measured, threshold, unit) == text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "kernel_fast", "min": 1}, "kind 'kernel_fast' is not one of"),
        ({"kind": "kernel_speedup", "min": 1, "max": 2}, "exactly one of min and max"),
        ({"kind": "kernel_ms", "mode": "decode", "max": 1}, "kind kernel_ms needs ctx"),
        ({"kind": "decode_speedup", "ctx": 1, "min": 0}, "must be a positive number"),
        ({"kind": "decode_speedup", "ctx": 1, "min": 1, "size": 2}, "unknown key 'size'"),
    ],
)
def test_bad_targets_are_rejected_with_the_entry_named(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match="targets\\[1\\]") as err:
        targets.parse([{"kind": "kernel_speedup", "min": 1}, spec])
    assert message in str(err.value)


def test_configured_targets_parse_and_name_what_they_measure() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    default = targets.parse(schema["properties"]["targets"]["default"])
    labels = [t.label for t in default]
    assert "chain16 at 185k: custom time per layer" in labels
    assert "end-to-end decode at 128k: custom over triton server" in labels
    for preset in ("h200", "rtx-pro-6000"):
        cfg = yaml.safe_load((REPO / "config" / f"{preset}.yaml").read_text())
        assert all(isinstance(t, Target) for t in targets.parse(cfg["targets"]))


def test_kernel_headline_shows_every_head_count() -> None:
    study = kernel_study(
        [{"backend": "custom", "mode": "decode", "ctx": 1024, "ms": 0.01, "heads": h}
         for h in (8, 64)]
    )  # fmt: skip
    table = tables.kernel_headline(study.kernels, [1024])
    assert list(table.index.get_level_values("heads")) == [8, 64]
    assert list(tables.kernel_headline(study.kernels, [1024], heads=64).index.get_level_values(0))
    assert tables.ctx_label(128000) == tables.ctx_label(131072) == "128k"


def test_kernel_headline_shows_a_wide_spread_beside_the_time() -> None:
    """A point whose repeats spread past SPREAD_SHOWN shows their range; a tight one, and one from
    a file without the repeats' range, show the median alone."""
    rows = [
        {"backend": "custom", "mode": "decode", "ctx": 1024, "ms": 0.5, "heads": 8,
         "ms_min": 0.4, "ms_max": 0.7},  # half of 0.3 over 0.5: 30%
        {"backend": "custom", "mode": "decode", "ctx": 1024, "ms": 0.5, "heads": 64,
         "ms_min": 0.49, "ms_max": 0.52},
        {"backend": "triton", "mode": "decode", "ctx": 1024, "ms": 0.5, "heads": 8},
    ]  # fmt: skip
    table = tables.kernel_headline(kernel_study(rows).kernels, [1024])
    keys = table.index.droplevel(["mode", "q_len", "page_size"])  # (heads, series)
    cells = dict(zip(keys, table["1k"], strict=True))
    assert cells == {(8, "custom"): "0.5 (0.4–0.7)", (8, "triton"): "0.5", (64, "custom"): "0.5"}


def test_cli_prints_the_table_and_rejects_a_config_without_targets(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "decodecliff.analysis.targets", str(PUBLISHED)]
    out = tmp_path / "targets.csv"
    done = subprocess.run(
        [*cmd, "--config", str(REPO / "config" / "h200.yaml"), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "every point: custom over triton kernel" in done.stdout
    configured = yaml.safe_load((REPO / "config" / "h200.yaml").read_text())["targets"]
    assert len(pd.read_csv(out)) == len(configured)
    empty = tmp_path / "empty.yaml"
    empty.write_text("study: {name: x}\n")
    done = subprocess.run([*cmd, "--config", str(empty)], capture_output=True, text=True)
    assert done.returncode == 1 and "no `targets` list" in done.stderr


@pytest.mark.parametrize(
    ("name", "configs"), [("h200", ["h200.yaml"]), ("h100", ["h200.yaml", "h100.yaml"])]
)
def test_published_notes_are_rendered_from_the_published_files(
    name: str, configs: list[str]
) -> None:
    """Each published study's NOTES.md is the template filled from its folder: never typed."""
    from decodecliff.analysis import notes
    from decodecliff.study.config import merged

    study = REPO / "results/published" / name
    cfg = merged(REPO / "config" / path for path in configs)
    assert (study / "NOTES.md").read_text() == notes.render(study, cfg, name)


def test_a_published_study_keeps_the_targets_it_was_judged_by() -> None:
    """The report shows a published study's own targets (its configuration's), not this run's:
    the H200 study pairs each custom server with the Triton server of its own engine path."""
    own = targets.published(REPO / "results/published/h200")
    h200 = yaml.safe_load((REPO / "config/h200.yaml").read_text())["targets"]
    assert list(own["target"]) == [t.label for t in targets.parse(h200)]
    default = yaml.safe_load(SCHEMA.read_text())["properties"]["targets"]["default"]
    assert set(own["target"]) != {t.label for t in targets.parse(default)}
    assert targets.published(PUBLISHED) is None  # no table of its own: judged by this run's


def test_a_point_without_decode_tok_s_is_not_measured_and_says_why(
    published: summarize.Study,
) -> None:
    """A point whose requests each returned one token has no decode rate: the target is not
    measured, with that reason, not with none."""
    sweep = published.sweep.copy()
    at = (sweep["server"] == "custom") & (sweep["requested_ctx"] == 32768)
    sweep.loc[at, "decode_tok_s"] = float("nan")
    study = dataclasses.replace(published, sweep=sweep)
    row = check(study, kind="decode_speedup", ctx=32000, min=1)
    assert row["status"] == NOT_MEASURED and pd.isna(row["measured"])
    assert row["reason"].startswith("no decode tok/s recorded for custom there")
    spec = targets.parse([{"kind": "decode_speedup", "ctx": 32000, "min": 1}])
    shown = targets.display_table(targets.evaluate(study, spec))
    assert shown["status"].iloc[0] == f"{NOT_MEASURED}: {row['reason']}"


def test_a_study_without_any_decode_tok_s_is_not_measured_and_says_why(tmp_path) -> None:
    """Where no point of the study recorded a decode rate (each request one token), the table
    holds None, not NaN: the target is not measured, with the reason, not a TypeError."""
    study = tmp_path / "study"
    shutil.copytree(PUBLISHED, study)
    for path in (study / "sweep").glob("*/ctx*.json"):
        doc = json.loads(path.read_text())
        doc["metrics"]["decode_tok_s"] = None
        path.write_text(json.dumps(doc))
    row = check(summarize.load_study(study), kind="decode_speedup", ctx=32000, min=1)
    assert row["status"] == NOT_MEASURED
    assert row["reason"].startswith("no decode tok/s recorded for custom and triton there")
    assert row["subject"].endswith(": – vs – tok/s")


def test_a_kernel_time_of_a_backend_of_several_series_is_its_fastest_named() -> None:
    """SGLang's extend and verify kernels both run a chain16 point: the target counts the faster
    one and names it, whichever the bench recorded first (a failed one never counts)."""
    study = kernel_study(
        [
            {"backend": "sglang", "triton_config": "extend", "mode": "chain16", "ctx": 185000,
             "ms": 29.0, "gbs": 7.0},
            {"backend": "sglang", "triton_config": "split", "mode": "chain16", "ctx": 185000,
             "ms": None, "status": "failed", "reason": "out of memory"},
            {"backend": "sglang", "triton_config": "verify", "mode": "chain16", "ctx": 185000,
             "ms": 1.06, "gbs": 200.0},
        ]
    )  # fmt: skip
    row = check(study, kind="kernel_ms", mode="chain16", ctx=185000, max=2, backend="sglang")
    assert row["measured"] == pytest.approx(1.06) and row["status"] == MET
    assert row["subject"].startswith("sglang (verify), chain16, 8 heads, page size 1, 185k")
    row = check(
        study, kind="kernel_copy_fraction", mode="chain16", ctx=185000, min=0.01, backend="sglang"
    )
    assert row["measured"] == pytest.approx(200.0 / 4000.0)
