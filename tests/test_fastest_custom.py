"""scripts/fastest_custom.py: per shape, the plan beside the fastest custom configuration."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/fastest_custom.py"
BENCH = REPO / "results/runs/h200/7fe4732/kernels/bench.json"  # auto and the variants, both builds


def fastest_custom():
    spec = importlib.util.spec_from_file_location("fastest_custom", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_shape_names_the_fastest_custom_configuration_of_its_build() -> None:
    mod = fastest_custom()
    points = json.loads(BENCH.read_text())["points"]
    shapes = mod.shapes(points)
    key = ("own", "chain16", 8, 32768, 1)
    found = shapes[key]
    customs = {k: p["ms"] for k, p in found.items() if k.startswith("custom/")}
    assert set(customs) >= {"custom/auto", "custom/v4", "custom/v5"}
    assert not any("sm120" in k for k in found)  # the model build is its own shape
    assert {k for k in shapes[("sm120 model", *key[1:])]} >= {"custom/auto", "flashinfer/fa2"}
    best = min(customs, key=customs.get).split("/")[1]
    line = mod.row(key, found)
    assert f"best {best:>10s} {customs['custom/' + best] * 1e3:7.1f}" in line, line
    assert f"plan {found['custom/auto']['ms'] * 1e3:7.1f}" in line, line


def test_set_split_counts_are_read_per_build() -> None:
    mod = fastest_custom()

    def point(backend: str, label: str | None, ms: float, splits: int | None = None) -> dict:
        return {
            "backend": backend, "triton_config": label, "status": "ok", "mode": "decode",
            "heads": 8, "ctx": 1024, "page_size": 1, "ms": ms, "floor_ms": 0.001,
            "detail": {"variant": (label or "v1").split("-")[0], "num_splits": splits},
        }  # fmt: skip

    points = [
        point("custom", None, 0.021, 4), point("custom", "auto-s16", 0.017, 16),
        point("custom", "v5-s16", 0.030, 16), point("flashinfer", "fa2", 0.019),
        point("custom", "auto-sm120", 0.020, 4), point("custom", "v4-sm120-s16", 0.016, 16),
        point("flashinfer", "fa2-sm120", 0.022),
        point("custom", "v4", 0.5, 4) | {"status": "failed"},
    ]  # fmt: skip
    shape = ("decode", 8, 1024, 1)
    own, model = mod.shapes(points)[("own", *shape)], mod.shapes(points)[("sm120 model", *shape)]
    assert set(own) == {"custom/auto", "custom/auto-s16", "custom/v5-s16", "flashinfer/fa2"}
    assert set(model) == {"custom/auto", "custom/v4-s16", "flashinfer/fa2"}
    assert "best   auto-s16    17.0 (auto/16)" in mod.row(("own", *shape), own)
    assert "best     v4-s16    16.0 (v4/16)" in mod.row(("sm120 model", *shape), model)
    assert mod.row(("own",), {"flashinfer/fa2": points[3]}) is None  # no plan: no row


def test_another_trees_plan_is_printed_beside_this_ones() -> None:
    run = REPO / "results/runs/h100/4b8be48/gpu-logs/short-ragged"
    now, before = run / "short-ragged.json", run / "short-ragged-before.json"
    done = subprocess.run([sys.executable, SCRIPT, now, before], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    prev = next(
        p for p in json.loads(before.read_text())["points"]
        if (p["backend"], p["triton_config"], p["mode"], p["heads"], p["ctx"])
        == ("custom", None, "chain16", 64, 185_000)
    )  # fmt: skip
    shape = ("own", "chain16", 64, 185_000, 1)
    words = ["own", "chain16", "h64", "185000"]
    line = next(ln for ln in done.stdout.splitlines() if ln.split()[:4] == words)
    assert f"before {prev['ms'] * 1e3:7.1f} (v5/{prev['detail']['num_splits']})" in line, line
    mod = fastest_custom()
    found = mod.shapes(json.loads(now.read_text())["points"])[shape]
    assert "before       -" in mod.row(shape, found, before={})  # a shape the other lacks


def test_it_runs_on_a_bench_file_and_says_how_otherwise(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, SCRIPT, BENCH], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.count("\n") > 100, done.stderr
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert done.returncode == 2 and "fastest_custom.py BENCH_JSON" in done.stderr
    empty = tmp_path / "bench.json"
    empty.write_text(json.dumps({"points": []}))
    done = subprocess.run([sys.executable, SCRIPT, empty], capture_output=True, text=True)
    assert done.returncode == 1 and "no shape with a custom plan" in done.stderr


def test_splits_prints_a_variant_at_each_split_count_of_several_files() -> None:
    run = REPO / "results/runs/h100/7dd8e8c/gpu-logs/ragged-v5"
    files = [run / "ragged-v5.json", run / "ragged-v5-long.json"]
    done = subprocess.run(
        [sys.executable, SCRIPT, "--splits", "v5", *files], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = {tuple(ln.split()[:5]): ln for ln in done.stdout.splitlines()}
    assert len(lines) == 10  # 1k-185k, both builds
    s4 = next(
        p for p in json.loads(files[1].read_text())["points"]
        if (p["triton_config"], p["ctx"]) == ("v5-s4", 185_000)
    )  # fmt: skip
    line = lines[("own", "chain16", "h64", "185000", "p1")]
    assert f"s4 {s4['ms'] * 1e3:.1f}  s8" in line and "s32" in line and "fa3" in line, line
    done = subprocess.run(
        [sys.executable, SCRIPT, "--splits", "v9", *files], capture_output=True, text=True
    )
    assert done.returncode == 1 and "no v9-sN point" in done.stderr
    done = subprocess.run(
        [sys.executable, SCRIPT, "--splits", "v5"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--splits VARIANT BENCH_JSON" in done.stderr, done.stderr


def test_help_says_how_and_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--splits VARIANT" in done.stdout, done.stderr
    missing = tmp_path / "none.json"
    done = subprocess.run([sys.executable, SCRIPT, missing], capture_output=True, text=True)
    assert done.returncode == 1 and f"{missing}: no bench-kernels document" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, SCRIPT, BENCH, BENCH, BENCH], capture_output=True)
    assert done.returncode == 2
