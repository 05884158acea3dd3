"""The README's Quick start is exactly two commands, and CI runs the second one as written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from published_study import copy_study, edit_points

from decodecliff.analysis import readme, summarize

ROOT = Path(__file__).resolve().parents[1]


MARKED = f"# A README\n\n{readme.START} -->\n{readme.END}\n"  # a README the section goes into


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
    """The README's headline numbers are those of the published study its marker names,
    regenerated verbatim."""
    from decodecliff.analysis import readme

    text = (ROOT / "README.md").read_text()
    named = re.search(re.escape(readme.START) + r" — generated from (\S+) by", text)
    assert named and (ROOT / named[1] / "kernels/bench.json").is_file()
    start, end = text.index(readme.START), text.index(readme.END) + len(readme.END)
    assert text[start:end] == readme.section(ROOT / named[1], named[1])


@pytest.mark.parametrize("name", ["h200", "h100"])
def test_the_kernel_table_puts_each_mode_under_its_floor(name: str):
    """One floor row per mode, no time below it; the custom kernel as its auto rule runs it."""
    from decodecliff.analysis import readme

    table = readme.kernel_rows(ROOT / "results/published" / name, [1024, 16384, 65536, 185000])
    assert not table["backend"].str.match(r"custom \(v\d").any()
    assert not table["backend"].isin(["torch", "cublas"]).any()
    for mode, group in table.groupby("mode"):
        assert group["backend"].iloc[0] == "**floor**", mode
        # a cell whose repeats spread reads "median (fastest–slowest)": its median
        times = group.iloc[:, 2:].apply(lambda col: pd.to_numeric(col.str.split().str[0]))
        assert times.notna().all().all(), mode
        assert (times.iloc[1:] >= times.iloc[0]).all().all(), mode
        assert "custom" in set(group["backend"]), mode


def test_targets_not_measured_are_listed_and_an_empty_list_reads_none(tmp_path) -> None:
    study = copy_study(tmp_path / "study")
    path = study / "tables/report/targets.csv"
    table = pd.read_csv(path).astype({"reason": object})
    first, why = table.loc[0, "target"], "no point within 10% of 185k (ran: 1k, 16k)"
    table.loc[0, ["status", "reason"]] = ["not measured", why]
    table.to_csv(path, index=False)
    text = readme.section(study, "s")
    assert f"Not measured: {first} ({why}). Why, and what would close them:" in text
    assert first not in text.split("Missed: ")[1].split("Not measured")[0]
    table["status"] = "met"
    table.to_csv(path, index=False)
    text = readme.section(study, "s")
    assert "Missed: none. How each was measured: [`s/NOTES.md`](s/NOTES.md)." in text
    assert "Not measured" not in text


def test_without_a_triton_server_no_speedup_is_claimed(tmp_path) -> None:
    study = copy_study(tmp_path / "study")
    for server in ("triton-graph-p1", "triton-p1"):
        shutil.rmtree(study / "sweep" / server)
    text = readme.section(study, "s")
    assert "`None`" not in text and "speedup over" not in text and " · " not in text
    assert "the larger). With random weights no draft token is accepted" in text


def test_the_commits_named_include_the_step_anatomy_s(tmp_path) -> None:
    """The sentences quote the engine bench: its commit is among those the section names, and
    several link the file that says which measured what."""
    import json

    study = copy_study(tmp_path / "study")
    engine = study / "engine/bench.json"
    doc = json.loads(engine.read_text())
    doc["env"]["git"] = "1234567"
    engine.write_text(json.dumps(doc))
    text = readme.section(study, "s")
    assert "`1234567`" in text and "(which measured what: [`s/RUNS.md`](s/RUNS.md))" in text


def test_the_end_to_end_sentence_states_the_points_own_workload(tmp_path) -> None:
    """The model, the verify step's length and the acceptance are the point files' own."""
    study = copy_study(tmp_path / "study")

    def accept_some(doc: dict) -> None:
        doc["server_info"]["speculative_num_draft_tokens"] = 8
        for request in doc["requests"]:
            request["metrics"]["spec_accept_length"] = 1.25

    edit_points(study, [p.name for p in (study / "sweep").iterdir()], [], accept_some)
    text = readme.section(study, "s")
    assert "**End to end** (synthetic `kimi-k2-tp8-rank`, 8-token verify steps):" in text
    assert "no draft token is accepted" not in text
    assert "The servers emit 1.25 tokens per verify step (the bonus token included)" in text
    sweep = summarize.load_study(study).sweep
    two = sweep.assign(preset="tiny", spec_accept_length=1.0)
    two.loc[two["server"] == "triton-p1", "draft_tokens"] = 16
    two.loc[two["server"] == "custom-p1", "spec_accept_length"] = 2.5
    ran, tok_s = readme.workload(two)
    assert ran == "synthetic `tiny`, 8- and 16-token verify steps"
    assert tok_s.startswith("The servers emit 1–2.5 tokens per verify step")


def test_a_missing_study_or_readme_stops_with_one_line(tmp_path) -> None:
    marked = tmp_path / "README.md"
    marked.write_text(MARKED)
    study = copy_study(tmp_path / "study")
    (study / "tables/report/targets.csv").unlink()
    for argv, said in (
        ([str(tmp_path / "none"), str(marked)], f"{tmp_path / 'none'}: no such study folder"),
        ([str(study), str(tmp_path / "NONE.md")], "NONE.md: no such README"),
        ([str(study), str(marked)], "lacks tables/report/targets.csv"),
    ):
        with pytest.raises(SystemExit) as stop:
            readme.main(argv)
        assert said in str(stop.value.code) and "\n" not in str(stop.value.code), argv
    assert not (study / "figures").exists() and marked.read_text() == MARKED
    pointless = tmp_path / "pointless"  # a study's files but its points
    (pointless / "kernels").mkdir(parents=True)
    (pointless / "tables/report").mkdir(parents=True)
    (pointless / "tables/report/targets.csv").write_text("target\n")
    shutil.copy(study / "kernels/bench.json", pointless / "kernels/bench.json")
    with pytest.raises(SystemExit, match=r"lacks sweep/<server>/ctx<N>\.json$"):
        readme.main([str(pointless), str(marked)])
    done = subprocess.run(
        [sys.executable, "-m", "decodecliff.analysis.readme", str(tmp_path / "none"), str(marked)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("no such study folder")


def test_a_section_that_fails_leaves_the_figure_and_readme_as_they_were(
    tmp_path, monkeypatch
) -> None:
    marked = tmp_path / "README.md"
    marked.write_text(MARKED)
    study = copy_study(tmp_path / "study")
    drawn = []
    monkeypatch.setattr(readme, "draw_headline", lambda study, *_: drawn.append(study))

    def broken(*_, **__) -> str:
        raise ValueError("no section")

    monkeypatch.setattr(readme, "section", broken)
    with pytest.raises(ValueError, match="no section"):
        readme.update(marked, study)
    assert drawn == [] and marked.read_text() == MARKED


def test_links_are_relative_to_the_readme_s_folder(tmp_path, monkeypatch) -> None:
    """An absolute or ./ study path links the same: from the README's folder to the study."""
    study = copy_study(tmp_path / "results" / "h200")
    marked = tmp_path / "docs" / "README.md"
    marked.parent.mkdir()
    marked.write_text(MARKED)
    monkeypatch.chdir(tmp_path)
    readme.main([str(study), "docs/README.md"])
    text = marked.read_text()
    assert "(../results/h200/report.html)" in text and str(tmp_path) not in text
    assert "](../results/h200/figures/compare/headline.png)" in text
    assert (study / "figures/compare/headline.png").is_file()
    readme.main(["./results/h200", "./docs/README.md"])
    assert marked.read_text() == text
    drawn = (study / "figures/compare/headline.png").read_bytes()
    monkeypatch.chdir(study)  # "." names the study all the same: the figure's title says h200
    readme.main([".", "../../docs/README.md"])
    assert marked.read_text() == text
    assert (study / "figures/compare/headline.png").read_bytes() == drawn
