"""One look for every figure: a seaborn theme, one colour per backend and per server.

Colours are defined here once, by name, so a backend, a kernel series ("flashinfer (fa3)") or a
server configuration has the same colour in every figure of every notebook, the README's too. A
series ``backend (variant)`` not listed takes its backend's colour; a server configuration not
listed takes its backend's (``register_servers``). A CUDA-graph server is drawn solid, an eager
one dashed (``linestyle``).
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib as mpl
import pandas as pd
import seaborn as sns

from . import tables

# attention backends: the study's own (custom, triton, torch) and the peers (sglang, flashinfer,
# cublas); Okabe-Ito and Tol's muted hues, distinguishable with the common colour deficiencies
BACKEND_COLORS: dict[str, str] = {
    "custom": "#0072B2",
    "triton": "#D55E00",
    "torch": "#7F7F7F",
    "sglang": "#882255",
    "flashinfer": "#009E73",
    "cublas": "#B8860B",
}
# kernel series that are peers in their own right get their own colour; any other variant of a
# backend ("triton (sm90)", "custom (v4)") is drawn in its backend's colour
SERIES_COLORS: dict[str, str] = {
    "sglang (extend)": "#882255",  # SGLang's Triton verify kernel, as SGLang runs it
    "sglang (decode-sglang)": "#882255",
    "sglang (verify)": "#CC6677",
    "sglang (decode-s8)": "#CC6677",
    "sglang (decode-s64)": "#AA4499",
    "flashinfer (fa2)": "#009E73",
    "flashinfer (fa3)": "#004D40",
    # as both configure themselves on sm_120 (kernels/sm120_model.py): the RTX PRO 6000 pairing
    "flashinfer (fa2-sm120)": "#44AA99",
    "custom (auto-sm120)": "#332288",
    "triton (grouped-s8)": "#E69F00",
    "triton (grouped-s64)": "#8C510A",
}
# server configurations of the studies' configs (config.yaml, config/*.yaml, the test studies):
# a CUDA-graph server in its backend's colour, its eager twin in a lighter tint of it
SERVER_COLORS: dict[str, str] = {
    "triton-graph-p1": "#D55E00",
    "triton-p1": "#E69F00",
    "sglang-graph-p1": "#882255",
    "flashinfer-graph-p1": "#009E73",
    "flashinfer-fa3-graph-p1": "#004D40",
    "custom-graph-p1": "#0072B2",
    "custom-sm120-graph-p1": "#332288",
    "flashinfer-sm120-graph-p1": "#44AA99",
    "custom-p1": "#56B4E9",
    "custom-defrag-p1": "#CC79A7",
    "torch-chain16-p1": "#7F7F7F",
    "triton-chain16-p1": "#D55E00",
    "torch-chain16-p1-k4": "#333333",
    "triton": "#D55E00",
    "custom": "#0072B2",
    "custom-graphs": "#009E73",
    "custom-defrag": "#CC79A7",
    "custom-graphs-defrag": "#E69F00",
}
REFERENCE_COLOR = "#000000"  # the published RTX PRO 6000 table
COLORS: dict[str, str] = {**BACKEND_COLORS, **SERIES_COLORS, **SERVER_COLORS}
COLORS["reference"] = REFERENCE_COLOR
FALLBACK = "#999999"  # a name no table knows (a test keeps every name a study can produce known)
# the parts of a verify step in the step anatomy
PART_COLORS = {"attention": "#0072B2", "GEMMs": "#E69F00", "rest": "#BBBBBB"}
_SERVERS: dict[str, str] = {}  # colours given to unlisted server configurations
REFERENCE_LABEL = "published RTX PRO 6000 (Triton, TP8)"
STATUS_MARKERS = {"failed": "X", "skipped": "s"}


def backend_of(name: str) -> str:
    """'flashinfer (fa3)' -> 'flashinfer', 'custom + fused GEMMs' (the engine bench's label of
    another GEMM path) -> 'custom'; a plain name is its own backend."""
    return name.split(" (", 1)[0].split(" + ", 1)[0]


def has_color(name: str) -> bool:
    """Whether ``name`` (a backend, a kernel series or a server) has a colour of its own."""
    return name in COLORS or name in _SERVERS or backend_of(name) in BACKEND_COLORS


def color(name: str) -> str:
    """The colour of a backend, a kernel series or a server configuration."""
    if name in COLORS:
        return COLORS[name]
    if name in _SERVERS:
        return _SERVERS[name]
    return BACKEND_COLORS.get(backend_of(name), FALLBACK)


def linestyle(cuda_graph: object) -> str:
    """Solid for a CUDA-graph server, dashed for an eager one."""
    return "-" if tables.flag(cuda_graph) else "--"


def graph_servers(sweep: pd.DataFrame) -> dict[str, bool]:
    """Server -> whether it replays CUDA graphs (False where the table does not say)."""
    return tables.server_flags(sweep, "cuda_graph")


def register_servers(sweep: pd.DataFrame) -> None:
    """Give each server configuration not listed above a colour, the same in every notebook.

    It takes its backend's colour unless another one already has it, then a colour no listed name
    uses; names are taken in sorted order, so the same table gives the same colours.
    """
    names = sorted(set(sweep["server"]))
    taken = {COLORS[n] for n in names if n in COLORS} | set(_SERVERS.values())
    spare = [c for c in _SPARE if c not in COLORS.values()]
    for name in names:
        if name in COLORS or name in _SERVERS:
            continue
        backend = sweep.loc[sweep["server"] == name, "backend"].dropna()
        pick = BACKEND_COLORS.get(str(backend.iloc[0])) if len(backend) else None
        if pick is None or pick in taken:
            free = [c for c in spare if c not in taken]
            pick = free[0] if free else FALLBACK
        _SERVERS[name] = pick
        taken.add(pick)


_SPARE = ["#F0E442", "#117733", "#332288", "#DDCC77", "#661100", "#6699CC", "#999933"]


def palette(names: Iterable[str]) -> dict[str, str]:
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
