"""analysis/layout.py is the one list of the notebooks' figures and tables: paths refuse what it
does not list, every figure has a title and a caption, and the report page shows them in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decodecliff.analysis import layout

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = ROOT / "workflow" / "report"


def caption_files(kind: str) -> set[tuple[str, str]]:
    """(analysis, name) of every caption under workflow/report/<kind>/ (<analysis>_<name>.rst)."""
    return {tuple(p.stem.split("_", 1)) for p in (CAPTIONS / kind).glob("*.rst")}


def test_every_figure_has_a_title_and_a_caption_and_every_caption_a_figure() -> None:
    listed = {(a, n) for a, names in layout.FIGURES.items() for n in names}
    assert caption_files("figures") == listed
    for analysis, names in layout.FIGURES.items():
        for name, title in names.items():
            text = title.format(study="a study", tau=3.0)
            assert text and "{" not in text, (analysis, name)
            assert (CAPTIONS / "figures" / f"{analysis}_{name}.rst").read_text().strip()


def test_report_tables_have_captions_and_every_table_caption_a_table() -> None:
    listed = {(a, n) for a, names in layout.TABLES.items() for n in names}
    assert caption_files("tables") <= listed
    assert {("report", n) for n in layout.TABLES["report"]} <= caption_files("tables")


def test_notebooks_write_figures_and_tables_only_through_layout() -> None:
    """A path built by hand would bypass the list: every write names its file through layout
    (or through a drawing helper's `path` argument, given a layout path by its callers)."""
    for source in (ROOT / "notebooks").glob("*.py"):
        text = source.read_text()
        writes = re.findall(r"(?:\.to_csv|\.savefig|figures\.save)\((?:fig, )?([^,)]+)", text)
        for target in writes:
            assert target.startswith("layout.") or target == "path", (source.name, target)
        for analysis, name in re.findall(r'figure_path\(results, "(\w+)", "(\w+)"', text):
            assert name in layout.FIGURES[analysis], (source.name, analysis, name)
        for analysis, name in re.findall(r'table_path\(results, "(\w+)", "(\w+)"', text):
            assert name in layout.TABLES[analysis], (source.name, analysis, name)


def test_paths_refuse_names_not_listed(tmp_path: Path) -> None:
    assert layout.figure_path(tmp_path, "sweep", "metrics", "s1") == (
        tmp_path / "figures" / "sweep" / "s1" / "metrics.png"
    )
    assert layout.figure_path(tmp_path, "kernels", "speedup", published=True).name == (
        "published_speedup.png"
    )
    assert layout.table_path(tmp_path, "report", "headline") == (
        tmp_path / "tables" / "report" / "headline.csv"
    )
    with pytest.raises(KeyError, match="kernels/latency is not listed"):
        layout.figure_path(tmp_path, "kernels", "latency")
    with pytest.raises(KeyError, match="report/figures is not listed"):
        layout.table_path(tmp_path, "report", "figures")


def test_report_figures_in_layout_order_with_the_published_beside_them(tmp_path: Path) -> None:
    for analysis, server in [("kernels", None), ("sweep", "b"), ("sweep", "a"), ("compare", None)]:
        layout.figure_dir(tmp_path, analysis, server).mkdir(parents=True)
    published = layout.figure_path(tmp_path, "kernels", "roofline", published=True)
    published.write_bytes(b"png")
    keys = [key for key, _, _ in layout.report_figures(tmp_path)]
    kernels = [f"kernels/{n}" for n in layout.FIGURES["kernels"]]
    compare = [f"compare/{n}" for n in layout.FIGURES["compare"]]
    # no engine folder: the study has no step anatomy, so none of its figures is expected
    assert keys == [
        *kernels,
        "kernels/published_roofline",
        *compare,
        "sweep/a/metrics",
        "sweep/b/metrics",
    ]
    shown = {key: (title, path) for key, title, path in layout.report_figures(tmp_path)}
    assert shown["kernels/published_roofline"] == (layout.PUBLISHED_TITLE, published)
    assert shown["sweep/a/metrics"][1] == layout.figure_path(tmp_path, "sweep", "metrics", "a")


def test_report_figures_are_the_studys_own_whatever_an_earlier_config_left(tmp_path: Path) -> None:
    for analysis, server in [("kernels", None), ("sweep", "gone"), ("engine", None)]:
        layout.figure_dir(tmp_path, analysis, server).mkdir(parents=True)
    layout.figure_path(tmp_path, "kernels", "roofline", published=True).write_bytes(b"png")
    keys = [
        key for key, _, _ in layout.report_figures(tmp_path, ["kernels", "sweep"], ["a"], False)
    ]
    assert keys == [
        *(f"kernels/{n}" for n in layout.FIGURES["kernels"]),
        *(f"sweep/a/{n}" for n in layout.FIGURES["sweep"]),
    ]  # no engine figure, no server "gone", no published figure: none is this study's


def test_two_studies_notes_never_share_an_anchor() -> None:
    from decodecliff.analysis import page

    notes = "# Notes on a study\n\n## Targets\n\ntext with `code`\n\n## The `k4` server\n"
    mine, theirs = (page.nested_notes(notes, p) for p in ("notes-this-run", "notes-published"))
    assert '<h4 id="notes-this-run-Targets">Targets</h4>' in mine
    assert '<h4 id="notes-published-The-k4-server">The <code>k4</code> server</h4>' in theirs
    assert "text with `code`" in mine  # the body stays Markdown
    ids = re.findall(r'id="([^"]+)"', mine + theirs)
    assert len(ids) == len(set(ids)) == 6
