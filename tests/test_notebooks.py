"""The analysis rules on recorded results: summaries, papermill notebooks, the report page."""

from __future__ import annotations

import itertools
import json
import struct
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from report_study import PUBLISHED, REPO, SERVERS, STUDY, executed

from decodecliff.analysis import floors, layout, style, summarize, tables

NOTEBOOKS = ["kernels", "compare", "report"] + [f"sweep-{s}" for s in SERVERS]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root, done = executed(tmp_path_factory.getbasetemp() / "analysed-study")
    assert done.returncode == 0, (
        f"analysis rules failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return root


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def raw_points() -> list[dict]:
    return [json.loads(p.read_text()) for p in summarize.sweep_files(STUDY / "sweep")]


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_summary_keeps_every_point_with_status_and_reason(study: Path) -> None:
    sweep = pd.read_csv(study / "results/summary/sweep.csv")
    raw = raw_points()
    assert len(sweep) == len(raw)
    assert set(sweep["status"]) == {"ok", "failed", "skipped"}
    bad = sweep[sweep["status"] != "ok"]
    assert bad["reason"].notna().all()
    assert bad.set_index("requested_ctx").loc[4096, "reason"].count("max_total_num_tokens") == 1
    # backends come from the config's server entries
    assert dict(zip(sweep["server"], sweep["backend"], strict=True)) == {
        name: backend for name, (backend, _) in SERVERS.items()
    }
    for point in raw:
        row = sweep[
            (sweep["server"] == point["name"]) & (sweep["requested_ctx"] == point["requested_ctx"])
        ]
        expected = point["metrics"].get("decode_tok_s")
        assert (
            row["decode_tok_s"].isna().all()
            if expected is None
            else row["decode_tok_s"].item() == pytest.approx(expected)
        )
    kernels = pd.read_csv(study / "results/summary/kernels.csv")
    bench = json.loads((STUDY / "kernels/bench.json").read_text())
    assert len(kernels) == len(bench["points"])
    assert (kernels["copy_gbs"] == bench["ceilings"]["copy_gbs"]).all()
    assert len(pd.read_parquet(study / "results/summary/sweep.parquet")) == len(sweep)


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executed_with_parameters_and_no_error(study: Path, name: str) -> None:
    nb = nbformat.read(study / f"results/notebooks/{name}.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1, "papermill did not inject the rule's parameters"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    if name.startswith("sweep-"):
        assert f'server = "{name.removeprefix("sweep-")}"' in injected[0].source
    html = [str(o.get("data", {}).get("text/html", "")) for o in outputs]
    shown = any("image/png" in o.get("data", {}) for o in outputs)
    assert shown or any("data:image/png" in h for h in html), "no figure shown"


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_every_declared_figure_and_table_is_written(study: Path) -> None:
    figures = layout.figure_paths("results", "kernels") + layout.figure_paths("results", "compare")
    tables = layout.table_paths("results", "kernels") + layout.table_paths("results", "compare")
    for server in SERVERS:
        figures += layout.figure_paths("results", "sweep", server)
        tables += layout.table_paths("results", "sweep", server)
    tables += layout.table_paths("results", "report")
    for fig in figures:
        width, height = png_size(study / fig)
        assert width > 300 and height > 200, fig
    for table in tables:
        assert (study / table).is_file(), table
    # the published study is drawn beside this run's
    assert (study / "results/figures/kernels/published_speedup.png").is_file()
    # and nothing else: every file the notebooks wrote is listed in analysis/layout.py
    written = [p for kind in ("figures", "tables") for p in (study / "results" / kind).rglob("*.*")]
    for path in written:
        listed = str(path.relative_to(study)).replace("/published_", "/")
        assert listed in figures + tables, listed


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_failed_and_skipped_points_are_listed_not_dropped(study: Path) -> None:
    triton = pd.read_csv(study / "results/tables/sweep/triton-chain16-p1/points.csv")
    failed = triton[triton["status"] == "failed"]
    assert list(failed["requested_ctx"]) == [512] and "timeout" in failed["reason"].item()
    headline = pd.read_csv(study / "results/tables/report/headline.csv", index_col=0)
    cells = set(headline.to_numpy().ravel().astype(str))
    assert {"failed", "skipped"} <= cells
    not_ok = pd.read_csv(study / "results/tables/kernels/not_ok.csv")
    assert (not_ok["reason"].str.contains("CUDA GPU")).any()


def _spread_text(values: list[float]) -> str:
    """What a headline cell says for these per-request values: median (min–max)."""
    med, lo, hi = (tables.num(float(f(values))) for f in (np.median, min, max))
    return med if lo == hi else f"{med} ({lo}–{hi})"


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_headline_numbers_are_the_raw_files_numbers(study: Path) -> None:
    """Each cell is the median (min–max) over the point's recorded requests, from the raw file."""
    headline = pd.read_csv(study / "results/tables/report/headline.csv", index_col=0)
    ceilings = json.loads((study / "results/kernels/bench.json").read_text())["ceilings"]
    checked = 0
    for point in raw_points():
        if point["status"] != "ok":
            continue
        col = next(c for c in headline.columns if c.endswith(f"({point['requested_ctx']:,})"))
        info = point["server_info"]  # the served model, as the point's file records it
        model = {k: info[k] for k in ("preset", "num_layers", "vocab_size", "weight_bytes")}
        model["draft_tokens"] = info["speculative_num_draft_tokens"]
        floor = floors.step_floor(
            model, point["requested_ctx"], ceilings["copy_gbs"], ceilings["matmul_tflops"]
        )
        assert headline.loc[tables.FLOOR_LABEL, col] == tables.num(1e3 / floor.ms)
        k = point["concurrency"]
        row = point["name"] if k == 1 else f"{point['name']} ({k} streams)"
        steps = [r["metrics"]["verify_steps_s_client"] for r in point["requests"]]
        assert len(steps) == point["requests_per_point"] * k
        assert headline.loc[row, col].split(" · ")[0] == _spread_text(steps)
        checked += 1
    assert checked == 4
    # torch and triton share no context here: no speedups (tests/test_tables.py has them)
    assert not any(" · " in str(v) for v in headline.to_numpy().ravel())
    assert "torch-chain16-p1-k4 (4 streams)" in headline.index


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_summary_says_what_each_number_rests_on(study: Path) -> None:
    sweep = pd.read_csv(study / "results/summary/sweep.csv").set_index(["server", "requested_ctx"])
    requests = pd.read_csv(study / "results/summary/requests.csv")
    for point in raw_points():
        row = sweep.loc[(point["name"], point["requested_ctx"])]
        assert row["requests"] == len(point["requests"])
        mine = requests[
            (requests["server"] == point["name"])
            & (requests["requested_ctx"] == point["requested_ctx"])
        ]
        assert len(mine) == len(point["requests"])
        if point["status"] == "ok":
            steps = sum(r["metrics"]["verify_steps"] for r in point["requests"])
            assert row["verify_steps"] == steps
            values = [r["metrics"]["decode_tok_s"] for r in point["requests"]]
            assert row["decode_tok_s_min"] == pytest.approx(min(values))
            assert row["decode_tok_s_max"] == pytest.approx(max(values))
            assert row["defrag_runs"] == 0  # read from the server after the point
    html = (study / "results/report.html").read_text()
    # the published fixture predates several requests per point: it says n = 1
    assert "n = 1 request and" in html
    assert "n = 2–8 requests" in html


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_notes_are_rendered_from_the_results(study: Path) -> None:
    notes = (study / "results/NOTES.md").read_text()
    assert "do not edit by hand" in notes
    checked = pd.read_csv(study / "results/tables/report/targets.csv")
    rows: dict[str, str] = {}  # a table row by its first cell, the first such row
    for line in notes.splitlines():
        rows.setdefault(line.split(" | ")[0].removeprefix("| "), line)
    for target, status in zip(checked["target"], checked["status"], strict=True):
        last = rows[target].rstrip(" |").split(" | ")[-1]  # the target's row, its status cell
        assert last == status or last.startswith(f"{status}: "), rows[target]
    # one line per server at its longest context that ran (the Triton one's 512 failed)
    longest = {"torch-chain16-p1": "1k", "torch-chain16-p1-k4": "256", "triton-chain16-p1": "64"}
    for server, ctx in longest.items():
        assert f"| {server} | {ctx} |" in notes


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_report_page_is_self_contained(study: Path) -> None:
    html = (study / "results/report.html").read_text()
    assert 'id="headline"' in html and 'id="headline-published"' in html
    assert html.count("data:image/png;base64,") >= 8
    assert "<script src=" not in html, "the page must not fetch scripts"
    assert "import pandas" not in html, "code must be hidden"
    for fact in ("PyTorch", "Triton", "NVIDIA driver", "commit", "What ran where"):
        assert fact in html
    # every figure of layout.py that this study draws, under its key, its caption as alt text
    for key, _, _ in layout.report_figures(study / "results"):
        assert f'<figure id="{key}"' in html, key
    assert html.count("<img ") == html.count(' alt="') and "No description has been" not in html
    # one H1, a real title, the finding (figure and sentences) before any table
    assert html.count("<h1") == 1 and "<title>report</title>" not in html
    first_table = html.index("<table")
    assert html.index('id="compare/published_headline"') < first_table
    assert html.index("What collapses") < first_table
    assert html.index('<details id="setup"') > html.index('id="headline-kernels"')


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_report_kernel_speedups_keep_a_slowdown_visible(study: Path) -> None:
    """Each speedup cell is the ratio as tables.times words it: 0.967x stays below 1."""
    import re

    html = (study / "results/report.html").read_text()  # a CPU run: the published study's table
    start = html.index('id="kernel-speedup-published"')
    cells = re.findall(r"<td>([^<]*)</td>", html[start : html.index("</table>", start)])
    speedup = tables.kernel_speedup(summarize.load_study(PUBLISHED).kernels)["speedup"]
    assert cells and set(cells) <= {tables.times(r) for r in speedup} | {"–"}


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_report_checks_the_targets_of_both_studies(study: Path) -> None:
    checked = pd.read_csv(study / "results/tables/report/targets.csv")
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert len(checked) == len(schema["properties"]["targets"]["default"])  # the default targets
    # on a CPU nothing of the custom kernel runs: every target says why it was not measured
    assert set(checked["status"]) == {"not measured"}
    kernel = checked[checked["kind"].str.startswith("kernel")]
    assert kernel["reason"].str.contains("custom backend needs a CUDA GPU").all()
    assert (
        checked.loc[~checked.index.isin(kernel.index), "reason"] == "no custom server in the sweep"
    ).all()
    html = (study / "results/report.html").read_text()
    assert 'id="targets"' in html and 'id="targets-published"' in html
    assert html.index('id="headline"') < html.index('id="targets"') < html.index("headline-kernels")
    # the published study's NOTES.md, rendered as HTML under its targets table
    notes = html.index("Why targets were missed")
    assert html.index('id="targets-published"') < notes
    assert "<strong>failed</strong>" in html[notes:] and "<li>" in html[notes:]


@pytest.mark.slow  # reads the `study` fixture: the analysis rules on a whole study
def test_each_study_s_part_of_a_section_is_headed_by_the_study_s_title(study: Path) -> None:
    """Where a section shows this run and the study beside it one after the other, each part is
    headed by its study's title (summarize.study_title, as the figures name it: the study's name
    and its GPU), never the report's own key for it ('this run', 'published')."""
    import re

    html = (study / "results/report.html").read_text()
    cfg = yaml.safe_load((study / "config.yaml").read_text())
    here = summarize.study_title(
        cfg["study"]["name"], pd.read_csv(study / "results/summary/sweep.csv")
    )
    beside = summarize.study_title(PUBLISHED.name, summarize.load_study(PUBLISHED).sweep, True)
    sections = {part.split(">", 1)[1].split("<", 1)[0]: part for part in html.split("<h2 id=")[1:]}
    setup = "Setup: hardware, versions, what ran where, configuration"
    for name, parts in (("The evidence", 2), ("End to end, every number", 1), ("Targets", 1),
                        ("Kernels, every number", 1), (setup, 1)):  # fmt: skip
        headings = re.findall(r"<p><strong>([^<]*?):?</strong>", sections[name])
        named = [h for h, _ in itertools.groupby(h for h in headings if h in (here, beside))]
        assert named == [here, beside] * parts, (name, headings)
        keys = [h for h in headings if h.lower() in ("this run", "published")]
        keys += [h for h in headings if h.lower().startswith(("this run (", "published ("))]
        assert not keys, (name, keys)
    notes = re.findall(r"<em>Notes on ([^<]*) \(<code>NOTES.md", sections["Targets"])
    assert notes == [here, beside]


@pytest.mark.parametrize("name", ["kernels", "sweep", "compare", "report"])
def test_notebook_pairs_are_in_sync_and_parameterised(name: str) -> None:
    py = jupytext.read(REPO / "notebooks" / f"{name}.py")
    ipynb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    assert [c.source for c in py.cells] == [c.source for c in ipynb.cells], (
        f"notebooks/{name}.ipynb is out of date: run `jupytext --sync notebooks/{name}.py`"
    )
    tagged = [c for c in ipynb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1


@pytest.mark.parametrize("name", ["sweep", "report"])
def test_no_notebook_states_as_fixed_text_what_drafts_are_accepted(name: str) -> None:
    """How tokens/s relate to verify steps/s is what the points' acceptance shows
    (tables.tokens_said), said by the notebook's code: its prose states none of it."""
    nb = jupytext.read(REPO / "notebooks" / f"{name}.py")
    prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown").lower()
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "no draft" not in prose and "tokens/s equal" not in prose
    assert "tables.tokens_said(" in code


def test_summarize_rejects_bad_files_with_a_clear_message(tmp_path: Path) -> None:
    wrong = tmp_path / "bench.json"
    wrong.write_text(json.dumps({"schema": "something-else/1", "points": []}))
    cmd = [sys.executable, "-m", "decodecliff.analysis.summarize", "--out", str(tmp_path / "o")]
    done = subprocess.run([*cmd, "--bench", str(wrong)], capture_output=True, text=True)
    assert done.returncode == 1 and "decodecliff.kernel-bench/" in done.stderr
    missing = tmp_path / "sweep" / "s" / "ctx5.json"
    done = subprocess.run([*cmd, "--sweep", str(missing)], capture_output=True, text=True)
    assert done.returncode == 1 and "no such result file" in done.stderr
    assert not (tmp_path / "o").exists()


def test_published_study_loads_from_raw_files_without_summaries() -> None:
    published = summarize.load_study(PUBLISHED)
    assert set(published.sweep["server"]) == {"triton", "custom", "custom-graphs"}
    assert published.ceilings["copy_gbs"] > 0 and len(published.kernels) > 0


def test_server_colours_are_fixed_and_distinct() -> None:
    sweep = pd.DataFrame(
        {
            "server": ["zeta", "alpha", "beta", "triton"],
            "backend": ["custom", "custom", "torch", "triton"],
        }
    )
    style.register_servers(sweep)
    colours = {s: style.color(s) for s in sweep["server"]}
    assert len(set(colours.values())) == 4
    assert (
        colours["alpha"] == style.COLORS["custom"] and colours["triton"] == style.COLORS["triton"]
    )
    style.register_servers(sweep)
    assert {s: style.color(s) for s in sweep["server"]} == colours


def label_outline(label, renderer) -> Path:
    """A tick label's outline in display pixels, rotated as drawn (its window extent is the
    axis-aligned box around the rotated text, which overlaps a slanted neighbour's)."""
    from matplotlib.path import Path as MplPath
    from matplotlib.transforms import Affine2D

    angle = label.get_rotation()
    label.set_rotation(0)
    box = label.get_window_extent(renderer)
    label.set_rotation(angle)
    ax_x, ax_y = (box.x1, box.y1) if angle else (box.x0, box.y0)  # ha right, va top: anchor
    corners = [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    turn = Affine2D().rotate_deg_around(ax_x, ax_y, angle)
    return MplPath(turn.transform(corners), closed=True)


@pytest.mark.parametrize(
    ("width_in", "contexts"),
    [
        (3.7, [1024, 4096, 16384, 32768, 65536, 131072, 185000]),  # one of 3 kernel panels
        (6.5, [1024, 11000, 32000, 64000, 128000, 185000]),  # a sweep panel
        (12.0, [1024, 11000, 32000, 64000, 128000, 185000]),
    ],
)
def test_every_context_gets_a_label_and_no_two_collide(width_in: float, contexts) -> None:
    import matplotlib.pyplot as plt

    from decodecliff.analysis import figures, tables

    style.apply()
    fig, ax = plt.subplots(figsize=(width_in, 3.5))
    ax.plot(contexts, np.arange(len(contexts)))
    figures.context_axis(ax, contexts)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == [tables.ctx_label(c) for c in contexts]
    outlines = [label_outline(t, renderer) for t in labels]
    for i, (left, right) in enumerate(itertools.pairwise(outlines)):
        assert not left.intersects_path(right, filled=True), (width_in, labels[i].get_text())
    plt.close(fig)
