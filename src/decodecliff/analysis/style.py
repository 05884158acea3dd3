"""One look for every figure: a seaborn theme, a fixed colour per backend and server config.

Colours are keyed by name so a backend or a server configuration has the same colour in every plot
of every notebook; names the table does not know get a stable colour derived from the name.
"""

from __future__ import annotations

import hashlib

import matplotlib as mpl
import seaborn as sns

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
_OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442"]

COLORS: dict[str, str] = {
    # attention backends (kernel microbenchmark and the servers built on them)
    "triton": "#D55E00",
    "custom": "#0072B2",
    "torch": "#7F7F7F",
    # server configurations of the default and GPU studies, fixed by name so a configuration
    # keeps its colour in every report (this run, the published study, the comparison)
    "custom-graphs": "#009E73",
    "custom-defrag": "#CC79A7",
    "custom-graphs-defrag": "#E69F00",
    "triton-p1": "#D55E00",
    "triton-graph-p1": "#E69F00",
    "custom-p1": "#0072B2",
    "custom-graph-p1": "#009E73",
    "custom-defrag-p1": "#CC79A7",
    "torch-chain16-p1": "#7F7F7F",
    "triton-chain16-p1": "#D55E00",
    "torch-chain16-p1-k4": "#56B4E9",
    # the published RTX PRO 6000 table
    "reference": "#000000",
}
_SERVERS: dict[str, str] = {}  # colours given to server configurations by register_servers()
REFERENCE_LABEL = "published RTX PRO 6000 (Triton, TP8)"
STATUS_MARKERS = {"failed": "X", "skipped": "s"}


def color(name: str) -> str:
    """The colour of a backend or server configuration (stable for unknown names)."""
    if name in COLORS:
        return COLORS[name]
    if name in _SERVERS:
        return _SERVERS[name]
    digest = int(hashlib.sha1(name.encode()).hexdigest(), 16)
    return _OKABE_ITO[digest % len(_OKABE_ITO)]


def register_servers(sweep) -> None:
    """Give each server configuration of a sweep table its colour, the same in every notebook.

    A configuration takes its backend's colour unless another one already has it, then the first
    free colour; names are taken in sorted order, so the same table gives the same colours.
    """
    names = sorted(set(sweep["server"]))
    taken = {COLORS[n] for n in names if n in COLORS} | set(_SERVERS.values())
    for name in names:
        if name in COLORS or name in _SERVERS:
            continue
        backend = sweep.loc[sweep["server"] == name, "backend"].dropna()
        pick = COLORS.get(str(backend.iloc[0])) if len(backend) else None
        if pick is None or pick in taken:
            free = [c for c in _OKABE_ITO if c not in taken and c not in COLORS.values()]
            pick = free[0] if free else color(name)
        _SERVERS[name] = pick
        taken.add(pick)


def palette(names) -> dict[str, str]:
    """A seaborn ``palette=`` mapping for the given names."""
    return {n: color(n) for n in dict.fromkeys(names)}


def apply() -> None:
    """Set the one theme every notebook uses (call once at the top)."""
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    mpl.rcParams.update(
        {
            "figure.dpi": 110,
            "savefig.dpi": 130,
            "savefig.bbox": "tight",
            "axes.titleweight": "bold",
            "legend.frameon": False,
        }
    )
