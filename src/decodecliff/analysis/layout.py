"""Where the analyses write: the figure and table names shared by the notebooks and rules."""

from __future__ import annotations

from pathlib import Path

FIGURES: dict[str, tuple[str, ...]] = {
    "kernels": ("time_per_layer", "bandwidth", "roofline", "speedup", "peers"),
    "sweep": ("metrics",),
    "compare": ("relative", "absolute", "speedup"),
    "engine": ("anatomy",),
}
TABLES: dict[str, tuple[str, ...]] = {
    "kernels": ("speedup", "not_ok", "peers", "flashinfer_sm120"),
    "sweep": ("points",),
    "compare": ("speedup",),
    "engine": ("anatomy",),
    "report": ("headline", "kernels_at_key_contexts", "targets", "sweep"),
}


def _folder(results: str | Path, kind: str, analysis: str, server: str | None) -> Path:
    folder = Path(results) / kind / analysis
    return folder / server if server else folder


def figure_dir(results: str | Path, analysis: str, server: str | None = None) -> Path:
    return _folder(results, "figures", analysis, server)


def table_dir(results: str | Path, analysis: str, server: str | None = None) -> Path:
    return _folder(results, "tables", analysis, server)


def figure_paths(results: str | Path, analysis: str, server: str | None = None) -> list[str]:
    """The PNG files an analysis notebook writes (per server for the sweep notebook)."""
    return [str(figure_dir(results, analysis, server) / f"{n}.png") for n in FIGURES[analysis]]


def table_paths(results: str | Path, analysis: str, server: str | None = None) -> list[str]:
    """The CSV files an analysis notebook writes."""
    return [str(table_dir(results, analysis, server) / f"{n}.csv") for n in TABLES[analysis]]
