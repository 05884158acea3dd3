"""Every figure and table the analysis notebooks write, by name, and where they go.

The one list of them: a notebook saves through ``figure_path`` / ``table_path``, which refuse a
name not listed here; the workflow declares these files as its notebook rules' outputs; the report
page shows the figures in this order under their titles. A figure's caption in Snakemake's report
is workflow/report/figures/<analysis>_<name>.rst (a test keeps the two lists equal).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

# analysis -> figure name -> its caption on the report page, also the figure's alt text
# ({study}: this run's title, {tau:g}: the acceptance length). The report page shows the headline
# first, then the evidence in the order of REPORT_EVIDENCE, then the rest in this order.
FIGURES: dict[str, dict[str, str]] = {
    "kernels": {
        "time_per_layer": "Attention time per layer vs context of the study's own backends "
        "(log-log; line style: page size).",
        "bandwidth": "Effective bandwidth (latent read once) vs the measured copy bandwidth.",
        "roofline": "Attained TFLOP/s vs arithmetic intensity under the measured ceilings "
        "(colour: backend, marker: mode, size: context).",
        "speedup": "Speedup of the custom kernel over the Triton baseline per context.",
        "peers": "Attention time per layer (page size 1) of the custom kernel beside the peers a "
        "user could pick instead (SGLang's own kernels as SGLang runs them, FlashInfer, cuBLAS), "
        "with each point's roofline floor.",
    },
    "compare": {
        "headline": "Verify steps/s against context per server (solid: CUDA graphs, dashed: "
        "eager), the published RTX PRO 6000 table overlaid in its own unit (tok/s), the cliff "
        "and the custom kernel's win annotated.",
        "relative": "Verify steps/s over each server's own at its shortest context (legend: "
        "the absolute rates at the shortest and longest context); dotted: the RTX PRO 6000 "
        "table's tok/s over its own (like with like).",
        "absolute": "Tokens/s at an assumed acceptance length tau={tau:g} (verify steps/s x "
        "{tau:g}; each panel notes what its points accepted) beside the RTX PRO 6000 table's "
        "measured tok/s.",
        "speedup": "End-to-end verify steps/s over the Triton baseline server configuration.",
    },
    "sweep": {"metrics": "{study}: end-to-end metrics of one server configuration"},
    "engine": {
        "anatomy": "Time per verify step vs context (attention, GEMMs, rest) per configuration, "
        "the measured step marked on each bar, with the floor: the weights at the copy rate, "
        "attention at the copy or matmul rate.",
    },
}
TABLES: dict[str, tuple[str, ...]] = {
    "kernels": ("speedup", "not_ok", "peers", "flashinfer_sm120"),
    "sweep": ("points",),
    "compare": ("speedup",),
    "engine": ("anatomy",),
    "report": ("headline", "kernels_at_key_contexts", "targets", "sweep"),
}
# the evidence under the headline, in reading order: (heading, figure keys "analysis/name")
REPORT_EVIDENCE: list[tuple[str, tuple[str, ...]]] = [
    ("Attention time per layer against context, beside the peers", ("kernels/peers",)),
    ("Where a verify step's time goes", ("engine/anatomy",)),
    ("How far from the floor", ("kernels/roofline", "kernels/bandwidth")),
]
HEADLINE = "compare/headline"
PER_SERVER = ("sweep",)  # drawn once per server configuration, in a folder of the server's name
PUBLISHED = "published_"  # file name prefix of a figure drawn from the published study
PUBLISHED_TITLE = "the published study"


def _folder(results: str | Path, kind: str, analysis: str, server: str | None) -> Path:
    folder = Path(results) / kind / analysis
    return folder / server if server else folder


def figure_dir(results: str | Path, analysis: str, server: str | None = None) -> Path:
    return _folder(results, "figures", analysis, server)


def table_dir(results: str | Path, analysis: str, server: str | None = None) -> Path:
    return _folder(results, "tables", analysis, server)


def _listed(kind: str, listed: dict, analysis: str, name: str) -> None:
    if name not in listed.get(analysis, ()):
        raise KeyError(
            f"{kind} {analysis}/{name} is not listed in decodecliff/analysis/layout.py "
            f"(listed for {analysis}: {', '.join(listed.get(analysis, ())) or 'none'})"
        )


def figure_path(
    results: str | Path,
    analysis: str,
    name: str,
    server: str | None = None,
    published: bool = False,
) -> Path:
    """The PNG of one listed figure (``published``: that figure drawn from the published study)."""
    _listed("figure", FIGURES, analysis, name)
    return figure_dir(results, analysis, server) / f"{PUBLISHED if published else ''}{name}.png"


def table_path(results: str | Path, analysis: str, name: str, server: str | None = None) -> Path:
    """The CSV of one listed table."""
    _listed("table", TABLES, analysis, name)
    return table_dir(results, analysis, server) / f"{name}.csv"


def figure_paths(results: str | Path, analysis: str, server: str | None = None) -> list[str]:
    """The PNG files an analysis notebook writes (per server for the sweep notebook)."""
    return [str(figure_path(results, analysis, n, server)) for n in FIGURES.get(analysis, ())]


def table_paths(results: str | Path, analysis: str, server: str | None = None) -> list[str]:
    """The CSV files an analysis notebook writes."""
    return [str(table_path(results, analysis, n, server)) for n in TABLES[analysis]]


def report_figures(
    results: str | Path,
    analyses: Collection[str] | None = None,
    servers: Sequence[str] | None = None,
    published: bool = True,
) -> list[tuple[str, str, Path]]:
    """(key, title, path) of every figure the report page shows, in FIGURES order: per analysis
    of the study this run's figures, expected even if missing, then those drawn from the
    published study that exist (``published``: whether the study shows one); a per-server
    analysis once per server. ``analyses`` and ``servers`` are the study's, from its config, so
    a figure an earlier config left (a server since removed) is not shown; None takes the
    folders on disk."""
    shown = []
    for analysis, titles in FIGURES.items():
        if not in_study(results, analysis, analyses):
            continue  # not part of this study (the engine's step anatomy is optional)
        each: Sequence[str | None] = [None]
        if analysis in PER_SERVER:
            each = servers if servers is not None else _server_folders(results, analysis)
        for server in each:
            folder = f"{analysis}/{server}" if server else analysis
            for name, title in titles.items():
                path = figure_path(results, analysis, name, server)
                shown.append((f"{folder}/{name}", title, path))
            for name in titles if published else ():
                path = figure_path(results, analysis, name, server, published=True)
                if path.is_file():
                    shown.append((f"{folder}/{PUBLISHED}{name}", PUBLISHED_TITLE, path))
    return shown


def in_study(results: str | Path, analysis: str, analyses: Collection[str] | None) -> bool:
    """Whether ``analysis`` is one of the study's ``analyses`` (None: its folder is on disk)."""
    return figure_dir(results, analysis).is_dir() if analyses is None else analysis in analyses


def _server_folders(results: str | Path, analysis: str) -> list[str]:
    return sorted(p.name for p in figure_dir(results, analysis).iterdir() if p.is_dir())
