"""Copies of the published H200 study with point files edited, for the cases its own files never
show: a point that failed, a server that never ran, a target not measured."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "h200"
CUSTOM = ("custom-graph-p1", "custom-sm120-graph-p1", "custom-p1", "custom-defrag-p1")
# what a copy leaves out: nothing the README's section or the sentences read (the figure is
# drawn again into figures/)
LEFT_OUT = ("gpu-logs", "notebooks", "figures", "report.html", "summary", "*.log")


def copy_study(dest: Path) -> Path:
    """The published study's raw files and report tables, copied to ``dest``."""
    shutil.copytree(PUBLISHED, dest, ignore=shutil.ignore_patterns(*LEFT_OUT))
    return dest


def edit_points(study: Path, servers: Iterable[str], ctxs: Iterable[int], edit: Callable) -> None:
    """``edit(doc)`` on each point file of ``servers`` at ``ctxs`` (every context: ``[]``)."""
    ctxs = list(ctxs)
    for server in servers:
        for path in sorted((study / "sweep" / server).glob("ctx*.json")):
            doc = json.loads(path.read_text())
            if not ctxs or doc["requested_ctx"] in ctxs:
                edit(doc)
                path.write_text(json.dumps(doc))


def fail_points(study: Path, servers: Iterable[str], ctxs: Iterable[int], reason: str) -> None:
    """Mark the points failed, as the sweep records a point whose server died."""
    edit_points(study, servers, ctxs, lambda doc: doc.update(status="failed", reason=reason))
