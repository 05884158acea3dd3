# Input and params functions of the analysis and report rules (included by analysis.smk).

import glob
import json

import yaml

from decodecliff.analysis import layout

SUMMARY_DIR = "results/summary"
NOTEBOOK_DIR = "results/notebooks"


def published_dir() -> str:
    """The published study folder named by the config, '' when there is none (yet)."""
    path = config.get("published") or ""
    return path if path and os.path.isdir(path) else ""


def published_param(wildcards) -> str:
    """The notebooks' `published` parameter as YAML (an empty -p value vanishes from the command)."""
    return json.dumps({"published": published_dir()})


def published_inputs(wildcards) -> list[str]:
    """The published study's tables, so a newly published study re-renders what shows it."""
    root = published_dir()
    if not root:
        return []
    patterns = ["summary/*.csv", "kernels/bench.json", "build/build.json", "sweep/*/ctx*.json"]
    patterns.append("NOTES.md")  # the publisher's account of the targets, shown in the report
    return sorted(p for pattern in patterns for p in glob.glob(f"{root}/{pattern}"))


def figure_outputs(analysis: str, category: str, server: str | None = None) -> dict:
    """Named report() outputs, one per figure an analysis notebook draws (see analysis/layout.py)."""
    extra = {"subcategory": server, "labels": {"server": server}} if server else {}
    return {
        name: report(
            path,
            caption=f"../report/{analysis}_{name}.rst",
            category=category,
            **extra,
        )
        for name, path in zip(
            layout.FIGURES[analysis], layout.figure_paths("results", analysis, server), strict=True
        )
    }


def analysis_figures(wildcards) -> list[str]:
    """Every figure the report embeds: kernels, compare, and the sweep of each server."""
    paths = layout.figure_paths("results", "kernels") + layout.figure_paths("results", "compare")
    for name in servers():
        paths += layout.figure_paths("results", "sweep", name)
    if "engine" in config:  # the step anatomy (engine.smk)
        paths += layout.figure_paths("results", "engine")
    return paths
