"""The README's Quick start is exactly two commands, and CI runs the second one as written."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def quick_start_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Quick start\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, "README.md has no '## Quick start' section"
    return [b.strip() for b in re.findall(r"^```[a-z]*\n(.*?)^```", match.group(1), re.S | re.M)]


def test_quick_start_is_two_one_line_commands() -> None:
    blocks = quick_start_blocks()
    assert len(blocks) == 2, blocks
    for block in blocks:
        assert "\n" not in block, f"one command per block, got:\n{block}"
    study, tests = blocks
    assert study.endswith("snakemake --cores 2")
    assert tests.endswith("pytest -q")
    for block in blocks:
        assert block.startswith("python3 -m venv .venv && . .venv/bin/activate")


def test_ci_runs_the_readme_test_command() -> None:
    ci = ROOT / ".ci" / "run"
    assert ci.stat().st_mode & 0o111, ".ci/run must be executable"
    done = subprocess.run(
        [str(ci), "--print-test-command"], capture_output=True, text=True, check=True, timeout=30
    )
    assert done.stdout.strip() == quick_start_blocks()[1]


def test_headline_section_is_marked() -> None:
    text = (ROOT / "README.md").read_text()
    assert re.search(r"<!-- headline:start.*?-->.*<!-- headline:end -->", text, re.S)


def test_headline_is_generated_from_the_published_study():
    """The README's headline numbers are the published report's own, regenerated verbatim."""
    from decodecliff.analysis import readme

    study = ROOT / "results/published/h200"
    text = (ROOT / "README.md").read_text()
    start, end = text.index(readme.START), text.index(readme.END) + len(readme.END)
    assert text[start:end] == readme.section(study, "results/published/h200")


def test_the_kernel_table_puts_each_mode_under_its_floor():
    """One floor row per mode, no time below it; the custom kernel as its auto rule runs it."""
    from decodecliff.analysis import readme

    table = readme.kernel_rows(ROOT / "results/published/h200", [1024, 16384, 65536, 185000])
    assert not table["backend"].str.match(r"custom \(v\d").any()
    assert not table["backend"].isin(["torch", "cublas"]).any()
    for mode, group in table.groupby("mode"):
        assert group["backend"].iloc[0] == "**floor**", mode
        times = group.iloc[:, 2:].apply(pd.to_numeric, errors="coerce")
        assert (times.iloc[1:] >= times.iloc[0]).all().all(), mode
        assert "custom" in set(group["backend"]), mode
