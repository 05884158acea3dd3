"""The study's figures, drawn with seaborn in the one style (see style.py).

Every function takes tidy tables (summarize.py) and returns a matplotlib Figure. Points that failed
or were skipped are drawn as markers on the context axis, never left out silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter
from matplotlib.transforms import blended_transform_factory

from . import style
from .tables import PRIMARY, acceptance_said, ctx_label, mode_order, ok

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# One scale per quantity, whatever the data: rates and times span orders of magnitude along the
# context (the cliff), counts per step do not.
SCALES = {"rate": "log", "time": "log", "ratio": "log", "per_step": "linear"}
# (column, axis label with unit, scale kind) of the per-server panels
SWEEP_PANELS = [
    ("steps", "verify steps (steps/s)", "rate"),
    ("tokens", "decode (tok/s)", "rate"),
    ("ttft_s", "TTFT (s)", "time"),
    ("prefill_tok_s", "prefill (tok/s)", "rate"),
    ("itl", "inter-token latency (ms)", "time"),
    ("spec_accept_length", "accepted (tokens/verify step)", "per_step"),
]
ITL = [("itl_ms_p50", "p50", "-"), ("itl_ms_p90", "p90", "--"), ("itl_ms_p99", "p99", ":")]
STEPS = [
    ("verify_steps_s_client", "client clock", "-", "o"),
    ("verify_steps_s_server", "server step time", "--", "^"),
]
# the smallest gap between two level context labels' centres, in inches ('128k' at the tick font
# size and a space);
# where level labels would collide (128k beside 185k on a narrow panel) they are slanted by SLANT
# degrees and set a little smaller, and then need only a line's height over sin(SLANT) between them
LABEL_GAP_IN = 0.42
SLANT, SLANT_FONT_SCALE = 65, 0.85


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def context_axis(ax: Axes, contexts: Iterable[float], secondary: Iterable[float] = ()) -> None:
    """Log-scaled context axis labelled at the contexts that ran ('1k', '128k'), slanted where
    level labels would collide; labels closer than even a slanted one needs are dropped (the
    largest context always keeps its label).
    ``secondary`` contexts (the reference table's) widen the axis and get a label where one fits.
    """
    have = sorted({int(c) for c in contexts if pd.notna(c)})
    extra = sorted({int(c) for c in secondary if pd.notna(c)} - set(have))
    ax.set_xscale("log")
    ax.set_xlabel("context (tokens)")
    every = sorted(have + extra)
    if not every:
        return
    lo, hi = every[0] / 1.3, every[-1] * 1.3
    ax.set_xlim(lo, hi)
    fig = ax.get_figure()
    width_in = max(ax.get_position().width * fig.get_figwidth(), 0.5)
    decades_per_in = np.log10(hi / lo) / width_in
    ticks = _spaced_ticks(have, extra, 10 ** (LABEL_GAP_IN * decades_per_in))
    slant = not set(have) <= set(ticks)  # a measured context lost its label
    if slant:
        ticks = _spaced_ticks(have, extra, 10 ** (_slant_gap_in() * decades_per_in))
    ax.set_xticks(ticks, [ctx_label(c) for c in ticks])
    if slant:
        ax.tick_params(axis="x", labelrotation=SLANT, labelsize=_slant_font_pt())
        for label in ax.get_xticklabels():
            label.set(ha="right", rotation_mode="anchor")
    ax.minorticks_off()


def _slant_font_pt() -> float:
    level = FontProperties(size=mpl.rcParams["xtick.labelsize"]).get_size_in_points()
    return SLANT_FONT_SCALE * level


def _slant_gap_in() -> float:
    line_in = 1.2 * _slant_font_pt() / 72  # a text line's box is about 1.2 font sizes high
    return line_in / np.sin(np.radians(SLANT))


def _spaced_ticks(have: list[int], extra: list[int], min_ratio: float) -> list[int]:
    """The contexts to label, none closer than ``min_ratio`` to another: from the largest down
    (so it keeps its label), the measured ones first, then the reference ones where they fit."""

    def fits(c: int, kept: list[int]) -> bool:
        return all(max(c, k) / min(c, k) >= min_ratio for k in kept)

    ticks: list[int] = []
    for c in reversed(have or extra):
        if fits(c, ticks):
            ticks.append(c)
    ticks += [c for c in reversed(extra) if fits(c, ticks)] if have else []
    return sorted(ticks)


def _plain(value: float, _pos=None) -> str:
    return f"{value:g}"


def set_scale(ax: Axes, kind: str) -> None:
    """The y scale chosen for this kind of quantity (SCALES), the same in every figure; log axes
    are labelled in plain numbers (0.1, 30, 200), minor ticks too when under two decades (all of
    them under one decade, else those at 2, 3 and 5 times a power of ten)."""
    ax.set_yscale(SCALES[kind])
    if SCALES[kind] == "linear":
        ax.set_ylim(bottom=0)
        return
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    lo, hi = ax.get_ylim()
    span = hi / lo if lo > 0 else np.inf
    minor = FuncFormatter(_plain) if span < 10 else FuncFormatter(_minor)
    ax.yaxis.set_minor_formatter(minor if span < 100 else NullFormatter())


def _minor(value: float, _pos=None) -> str:
    """Minor log ticks labelled at 2, 3 and 5 times a power of ten only (7, 8, 9 would crowd)."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** np.floor(np.log10(value)), 6)
    return _plain(value) if mantissa in (2.0, 3.0, 5.0) else ""


def median_line(ax: Axes, df: pd.DataFrame, col: str, color: str, label: str, **kw: Any) -> bool:
    """``col`` (medians) vs context with the min–max over the requests as error bars."""
    d = df.dropna(subset=[col]).sort_values("ctx")
    if d.empty:
        return False
    lo, hi = d.get(f"{col}_min"), d.get(f"{col}_max")
    yerr = None
    if lo is not None and hi is not None and (lo.notna() & hi.notna()).any():
        yerr = np.vstack([(d[col] - lo.fillna(d[col])), (hi.fillna(d[col]) - d[col])]).clip(0)
    ax.errorbar(
        d["ctx"], d[col], yerr=yerr, color=color, label=label, capsize=3, elinewidth=1,
        marker=kw.pop("marker", "o"), ms=kw.pop("ms", 5), **kw,
    )  # fmt: skip
    return True


def mark_not_ok(ax: Axes, points: pd.DataFrame, color_by: str | None = None) -> list[Line2D]:
    """Failed/skipped points as markers on the context axis, a dotted line up; legend handles."""
    bad = points[points["status"] != "ok"]
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for _, row in bad.iterrows():
        c = style.color(row[color_by]) if color_by else "#444444"
        marker = style.STATUS_MARKERS.get(row["status"], "X")
        ax.axvline(row["ctx"], color=c, ls=":", lw=1, alpha=0.6)
        ax.scatter(
            [row["ctx"]],
            [0.04],
            transform=trans,
            marker=marker,
            s=70,
            color=c,
            edgecolor="black",
            linewidth=0.6,
            zorder=5,
            clip_on=False,
        )
    return [
        Line2D(
            [],
            [],
            ls="",
            marker=style.STATUS_MARKERS.get(s, "X"),
            color="#888888",
            markeredgecolor="black",
            label=s,
        )
        for s in sorted(set(bad["status"]))
    ]


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_yticks([])


def figure_legend(fig: Figure, axes: Iterable[Axes], extra: list[Line2D] = ()) -> None:
    """One legend for all panels, right of them (panels share backends and line styles); the
    panels' own legends are removed first, so the layout is fitted to the panels alone."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for handle in extra:
        seen.setdefault(handle.get_label(), handle)
    fig.tight_layout()
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen.keys()),
            loc="upper left",
            bbox_to_anchor=(1.0, 0.95),
            fontsize=8,
        )


OWN = ("torch", "triton", "custom")  # the study's own backends; the peers have their figure
# a set split count: a decode's (s8, s64) or a custom variant's (bench-kernels --custom-splits)
_FIXED_SPLITS = re.compile(r"(?:\((?:grouped|decode)|^custom \(.*)-s\d+\)$")
_TRITON_ARCH = re.compile(r"^triton \((sm\d+)\)$")
_PINNED_VARIANT = re.compile(r"^custom \(v\d+(-sm120)?\)$")  # a variant the auto rule picks from


def main_series(kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernel series a figure draws: a backend's decode at fixed split counts (s8, s64) only
    where its default count did not run, the custom kernel as its auto rule runs it (not each
    variant it picks from), and the Triton block config of the GPU it ran on only (all of them
    on a CPU); the tables keep every series."""
    keep = pd.Series(True, index=kernels.index)
    for _, group in kernels.groupby(["backend", "mode"]):
        names = set(group["series"])
        fixed = {n for n in names if _FIXED_SPLITS.search(n) or _PINNED_VARIANT.match(n)}
        drop = fixed if fixed and names - fixed else set()
        cap = group["gpu_capability"].dropna() if "gpu_capability" in group else pd.Series()
        arch = {n for n in names if _TRITON_ARCH.match(n)}
        native = f"triton ({str(cap.iloc[0]).replace('_', '')})" if len(cap) else None
        if native in arch:
            drop |= arch - {native}
        keep[group.index[group["series"].isin(drop)]] = False
    return kernels[keep]


def _page(df: pd.DataFrame) -> pd.Series:
    return "page size " + df["page_size"].astype(int).astype(str)


def _kernel_grid(kernels: pd.DataFrame, height: float = 3.4) -> tuple[Figure, list]:
    """A figure with one panel per head count (rows) and mode (columns): (fig, [(ax, rows)]).
    A pair the bench lacks (one merged by hand from two runs) keeps its panel, marked "not in
    this bench", and is left out of the panels returned: each has rows to draw from."""
    modes = mode_order(kernels)
    heads = sorted(kernels["heads"].unique())
    fig, axes = plt.subplots(
        len(heads), len(modes), figsize=(4.2 * len(modes), height * len(heads)), squeeze=False
    )
    panels = []
    for i, h in enumerate(heads):
        for j, m in enumerate(modes):
            q = int(kernels.loc[kernels["mode"] == m, "q_len"].max())
            axes[i, j].set_title(f"{m} (q_len {q}), {h} heads", fontsize=10)
            rows = kernels[(kernels["heads"] == h) & (kernels["mode"] == m)]
            if rows.empty:
                _empty(axes[i, j], "not in this bench")
                axes[i, j].set_xticks([])
                continue
            panels.append((axes[i, j], rows))
    return fig, panels


def kernel_lines(kernels: pd.DataFrame, y: str, ylabel: str, ceiling: str | None = None) -> Figure:
    """``y`` vs context of the study's own backends (colour: the series, line style: the page
    size), log-log; the peers are in ``kernel_vs_peers``."""
    extra = []
    own = main_series(kernels[kernels["backend"].isin(OWN)])
    names = list(dict.fromkeys(own["series"]))
    fig, panels = _kernel_grid(kernels)
    for ax, panel in panels:
        panel = panel[panel.index.isin(own.index)]
        good = ok(panel).assign(page=lambda d: _page(d))
        context_axis(ax, panel["ctx"])
        if good.empty:
            _empty(ax, "no point ran")
        else:
            sns.lineplot(
                good, x="ctx", y=y, hue="series", style="page", markers=True, dashes=True,
                palette=style.palette(names), ax=ax, legend="auto",
                hue_order=[n for n in names if n in set(good["series"])],
            )  # fmt: skip
        if ceiling and panel[ceiling].notna().any():
            level = float(panel[ceiling].dropna().iloc[0])
            ax.axhline(level, color="black", lw=1.2, ls="--")
            ax.annotate(
                f"measured copy {level:,.0f} GB/s",
                (0.02, level),
                xycoords=("axes fraction", "data"),
                va="bottom",
                fontsize=8,
            )
        if not good.empty:  # after the ceiling: the labels fit the whole range
            set_scale(ax, "time" if y == "ms" else "rate")
        ax.set_ylabel(ylabel)
        extra += mark_not_ok(ax, panel, "series")
    figure_legend(fig, fig.axes, extra)
    return fig


def roofline(kernels: pd.DataFrame) -> Figure:
    """Attained TFLOP/s vs arithmetic intensity under the measured copy and matmul ceilings:
    colour the backend, marker the mode, size the context."""
    good = ok(main_series(kernels)).copy()
    good["intensity"] = good["tflops"] * 1e3 / good["gbs"]  # flop per byte
    copy_gbs = float(kernels["copy_gbs"].dropna().iloc[0])
    peak = float(kernels["matmul_tflops"].dropna().iloc[0])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    lo = min(good["intensity"].min(), 1.0) / 2 if len(good) else 1.0
    hi = max(good["intensity"].max(), peak * 1e3 / copy_gbs) * 2 if len(good) else 1e4
    x = np.geomspace(lo, hi, 200)
    ax.plot(
        x, np.minimum(peak, copy_gbs * x / 1e3), color="black", lw=1.5, label="roofline (measured)"
    )
    ax.axhline(peak, color="black", lw=0.8, ls=":")
    ax.annotate(f"matmul {peak:,.3g} TFLOP/s", (lo * 1.1, peak), va="bottom", fontsize=8)
    ax.annotate(
        f"copy {copy_gbs:,.0f} GB/s",
        (lo * 1.1, copy_gbs * lo * 1.1 / 1e3),
        va="bottom",
        fontsize=8,
        rotation=0,
    )
    handles = _roofline_points(ax, good)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte of latent KV)",
        ylabel="attained (TFLOP/s)",
        title=f"roofline of {kernels['device'].iloc[0]}",
    )
    ax.legend(
        handles=[*ax.get_legend_handles_labels()[0], *handles], fontsize=7.5, loc="upper left",
        bbox_to_anchor=(1.02, 1), title="marker size: context", title_fontsize=7.5,
    )  # fmt: skip
    fig.tight_layout()
    return fig


MODE_MARKERS = ("o", "^", "s", "D", "v", "P")


def _roofline_points(ax, good: pd.DataFrame) -> list[Line2D]:
    """The points (colour: backend, marker: mode, size: context); the legend handles."""
    if good.empty:
        return []
    modes = list(dict.fromkeys(good["mode"]))
    markers = dict(zip(modes, MODE_MARKERS, strict=False))
    span = np.log(good["ctx"].max() / good["ctx"].min()) or 1.0
    for (backend, mode), df in good.groupby(["backend", "mode"], sort=False):
        sizes = 25 + 135 * np.log(df["ctx"] / good["ctx"].min()) / span
        ax.scatter(
            df["intensity"], df["tflops"], s=sizes, marker=markers.get(mode, "o"),
            color=style.color(backend), edgecolor="white", linewidth=0.5, alpha=0.85,
        )  # fmt: skip
    backends = [
        Line2D([], [], ls="", marker="o", color=style.color(b), label=b)
        for b in dict.fromkeys(good["backend"])
    ]
    shapes = [Line2D([], [], ls="", marker=markers[m], color="#555555", label=m) for m in modes]
    return backends + shapes


def kernel_speedup(speedup: pd.DataFrame, kernels: pd.DataFrame) -> Figure:
    """custom over the baseline per context, one panel per mode and head count."""
    fig, panels = _kernel_grid(kernels, height=3.2)
    speedup = speedup[speedup["baseline"].isin(set(main_series(kernels)["series"]))]
    for ax, panel in panels:
        s = speedup[
            (speedup["mode"] == panel["mode"].iloc[0])
            & (speedup["heads"] == panel["heads"].iloc[0])
        ]
        context_axis(ax, panel["ctx"])
        ax.axhline(1.0, color="black", lw=0.8)
        if s.empty:
            _empty(ax, "no context where both ran")
        else:
            s = s.assign(pair="over " + s["baseline"] + ", page size " + s["page_size"].astype(str))
            sns.lineplot(
                s,
                x="ctx",
                y="speedup",
                style="pair",
                color=style.color("custom"),
                markers=True,
                ax=ax,
            )
            set_scale(ax, "ratio")
        ax.set_ylabel("speedup over Triton (x)")
    figure_legend(fig, fig.axes)
    return fig


def sweep_metrics(points: pd.DataFrame, server: str, title: str, tau: float) -> Figure:
    """The end-to-end metrics of one server configuration vs context, non-ok points marked.

    Medians over each point's requests, the min–max as error bars; ``title`` names the run.
    """
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    good = ok(points)
    color, extra = style.color(server), []
    for ax, (key, label, kind) in zip(axes.flat, SWEEP_PANELS, strict=True):
        context_axis(ax, points["ctx"])
        drawn = False
        if key == "steps":
            for col, name, ls, marker in STEPS:
                drawn |= median_line(ax, good, col, color, name, ls=ls, marker=marker)
        elif key == "tokens":
            drawn = median_line(ax, good, "decode_tok_s", color, "measured")
            if PRIMARY in good and good[PRIMARY].notna().any():
                at_tau = good.assign(at_tau=good[PRIMARY] * tau)
                label_tau = f"at acceptance length \N{GREEK SMALL LETTER TAU}={tau:g} (derived)"
                median_line(ax, at_tau, "at_tau", color, label_tau, ls=":", marker="D", ms=4)
        elif key == "itl":
            for col, name, ls in ITL:
                drawn |= median_line(ax, good, col, color, name, ls=ls)
        else:
            drawn = median_line(ax, good, key, color, None)
        if not drawn:
            _empty(ax, "not recorded" if len(good) else "no point ran")
        else:
            set_scale(ax, kind)
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        extra += mark_not_ok(ax, points)
    k = int(points["concurrency"].max()) if "concurrency" in points else 1
    streams = f", {k} streams at once" if k > 1 else ""
    n = _n_text(good)
    fig.suptitle(f"{title}: {server}{streams} ({n})", fontweight="bold")
    fig.tight_layout()
    if extra:
        figure_legend(fig, [], extra)
    return fig


def _n_text(good: pd.DataFrame) -> str:
    if good.empty:
        return "no point ran"
    if "requests" not in good:
        return "n = 1 request per point"
    lo, hi = int(good["requests"].min()), int(good["requests"].max())
    n = str(lo) if lo == hi else f"{lo}–{hi}"
    return f"median of n = {n} request{'s' if hi > 1 else ''} per point, bars min–max"


def _reference_points(reference: pd.DataFrame) -> pd.DataFrame:
    return reference.dropna(subset=["decode_tok_s"]).sort_values("actual_ctx")


def _server_lines(ax, sweep: pd.DataFrame, value, label) -> None:
    """One line per server (its colour; solid with CUDA graphs, dashed eager): ``value(rows)``
    gives (column, rows with that column and its _min / _max), ``label(server, rows)`` the name."""
    graphs = style.graph_servers(sweep)
    good = ok(sweep)
    for server in dict.fromkeys(sweep["server"]):
        rows = good[good["server"] == server].dropna(subset=[PRIMARY]).sort_values("ctx")
        if rows.empty:
            continue
        col, drawn = value(rows)
        ls = style.linestyle(graphs.get(server))
        median_line(ax, drawn, col, style.color(server), label(server, rows), ls=ls)


def _rate_span(server: str, rows: pd.DataFrame) -> str:
    """'triton-graph-p1: 58.1 → 0.546/s': the absolute rates at its shortest and longest context."""
    first, last = rows[PRIMARY].iloc[0], rows[PRIMARY].iloc[-1]
    return f"{server}: {first:.3g} → {last:.3g}/s"


def compare_relative(
    sweeps: dict[str, pd.DataFrame], reference: pd.DataFrame | None, titles: dict[str, str]
) -> Figure:
    """Like with like: each server's verify steps/s over its own at its shortest context, and the
    published RTX PRO 6000 decode tok/s over its own at its shortest, one panel per study; the
    legend gives each line's absolute rates at its shortest and longest context."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), squeeze=False)
    extra = []

    def relative(rows: pd.DataFrame) -> tuple[str, pd.DataFrame]:
        first = rows[PRIMARY].iloc[0]
        rel = rows.assign(rel=rows[PRIMARY] / first)
        for end in ("min", "max"):
            rel[f"rel_{end}"] = rows.get(f"{PRIMARY}_{end}", rows[PRIMARY]) / first
        return "rel", rel

    for ax, (study, sweep) in zip(axes[0], sweeps.items(), strict=True):
        ref_ctx = [] if reference is None else list(_reference_points(reference)["actual_ctx"])
        context_axis(ax, sweep["ctx"], ref_ctx)
        _server_lines(ax, sweep, relative, _rate_span)
        if reference is not None:
            ref = _reference_points(reference)
            tok = ref["decode_tok_s"]
            ax.plot(
                ref["actual_ctx"], tok / tok.iloc[0], color=style.REFERENCE_COLOR, ls=":",
                marker="D", ms=5, label=f"RTX PRO 6000 table: {tok.iloc[0]:.3g} → "
                f"{tok.iloc[-1]:.3g} tok/s",
            )  # fmt: skip
        ax.axhline(1.0, color="black", lw=0.8)
        extra += mark_not_ok(ax, sweep, "server")
        set_scale(ax, "ratio")
        ax.set(ylabel="rate over its own at its shortest context (x)", title=titles[study])
    figure_legend(fig, fig.axes, extra)
    return fig


def compare_absolute(
    sweeps: dict[str, pd.DataFrame],
    reference: pd.DataFrame | None,
    titles: dict[str, str],
    tau: float,
) -> Figure:
    """Tokens/s where the units agree: each server's verify steps/s x tau (its tokens/s if a
    real drafter accepted tau tokens per step) beside the published table's measured tok/s; the
    assumed tau is written in every panel, with what the panel's points accepted where they
    record it (tables.acceptance_said)."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), squeeze=False)
    extra = []
    tau_text = f"\N{GREEK SMALL LETTER TAU}={tau:g}"

    def at_tau(rows: pd.DataFrame) -> tuple[str, pd.DataFrame]:
        scaled = rows.assign(at_tau=rows[PRIMARY] * tau)
        for end in ("min", "max"):
            scaled[f"at_tau_{end}"] = rows.get(f"{PRIMARY}_{end}", rows[PRIMARY]) * tau
        return "at_tau", scaled

    for ax, (study, sweep) in zip(axes[0], sweeps.items(), strict=True):
        ref_ctx = [] if reference is None else list(_reference_points(reference)["actual_ctx"])
        context_axis(ax, sweep["ctx"], ref_ctx)
        _server_lines(ax, sweep, at_tau, lambda server, rows: server)
        if reference is not None:
            ref = _reference_points(reference)
            ax.plot(
                ref["actual_ctx"], ref["decode_tok_s"], color=style.REFERENCE_COLOR, ls=":",
                marker="D", ms=5, label=style.REFERENCE_LABEL + ", measured tok/s",
            )  # fmt: skip
        extra += mark_not_ok(ax, sweep, "server")
        set_scale(ax, "rate")
        accepted = acceptance_said(sweep)
        ax.text(
            0.98, 0.97, f"assumed acceptance length {tau_text}:\nservers' tok/s = verify "
            f"steps/s x {tau:g}" + (f"\n({accepted})" if accepted else ""),
            transform=ax.transAxes, ha="right", va="top", fontsize=8,
            bbox={"fc": "white", "ec": "#999999", "lw": 0.6},
        )  # fmt: skip
        ax.set(
            ylabel=f"tokens/s (servers: verify steps/s x {tau:g})",
            title=f"{titles[study]}, assumed {tau_text}",
        )
    figure_legend(fig, fig.axes, extra)
    return fig


def compare_speedup(
    speedups: dict[str, pd.DataFrame],
    baseline: dict[str, str | None],
    titles: dict[str, str],
    graphs: dict[str, dict[str, bool]] | None = None,
) -> Figure:
    """Each server configuration's verify steps/s over the baseline's, per context and study;
    ``graphs``: per study, which servers replay CUDA graphs (drawn solid, eager dashed)."""
    fig, axes = plt.subplots(1, len(speedups), figsize=(6.5 * len(speedups), 4.2), squeeze=False)
    for ax, (study, s) in zip(axes[0], speedups.items(), strict=True):
        context_axis(ax, s["requested_ctx"])
        if baseline[study]:
            ax.axhline(
                1.0,
                color=style.color(baseline[study]),
                lw=1,
                ls="--",
                label=f"{baseline[study]} (baseline)",
            )
        good = s.dropna(subset=["speedup"])
        if good.empty:
            _empty(ax, "no context where both ran" if baseline[study] else "no Triton baseline")
        else:
            solid = (graphs or {}).get(study, {})
            for server in dict.fromkeys(good["server"]):
                rows = good[good["server"] == server].sort_values("requested_ctx")
                ax.plot(
                    rows["requested_ctx"], rows["speedup"], color=style.color(server),
                    marker="o", label=server, ls=style.linestyle(solid.get(server, True)),
                )  # fmt: skip
            set_scale(ax, "ratio")
        ax.set(
            ylabel=f"verify steps/s over {baseline[study]} (x)",
            title=f"{titles[study]}: speedup, medians",
        )
    figure_legend(fig, fig.axes)
    return fig


def kernel_vs_peers(kernels: pd.DataFrame, candidate: str = "custom") -> Figure:
    """ms per layer vs context at page size 1: the candidate and the peers' series (SGLang's
    kernels as SGLang runs them, FlashInfer, cuBLAS), with each point's roofline floor."""
    from .tables import PEERS

    fig, panels = _kernel_grid(kernels)
    shown = main_series(ok(kernels))
    shown = shown[shown["backend"].isin((candidate, *PEERS)) & (shown["page_size"] == 1)]
    names = list(dict.fromkeys(shown["series"])) if len(shown) else []
    for ax, panel in panels:
        good = shown.merge(panel[["mode", "heads"]].drop_duplicates(), on=["mode", "heads"])
        context_axis(ax, panel["ctx"])
        if good.empty:
            _empty(ax, f"no {candidate} or peer point ran")
            continue
        sns.lineplot(
            good, x="ctx", y="ms", hue="series", palette=style.palette(names), marker="o", ax=ax,
            hue_order=[n for n in names if n in set(good["series"])],
        )  # fmt: skip
        floor = good.groupby("ctx")["floor_ms"].first()
        ax.plot(floor.index, floor.values, "k_--", ms=14, lw=1.2, label="roofline floor")
        set_scale(ax, "time")
        ax.set_ylabel("time per layer (ms), page size 1")
    figure_legend(fig, fig.axes)
    return fig


ANATOMY_PARTS = [("attention_ms", "attention"), ("gemm_ms", "GEMMs"), ("rest_ms", "rest")]
ANATOMY_COLUMNS = 4  # panels per row: a study of seven backends on two paths reads as a grid


def engine_anatomy(table: pd.DataFrame, title: str) -> Figure:
    """Stacked attention / GEMMs / rest per context, one panel per engine configuration (its
    title in its backend's colour), with the floor (weights + attention) and the weights' floor."""
    configs = list(table.groupby(["mode", "backend", "path"], sort=False)) if len(table) else []
    cols = min(max(len(configs), 1), ANATOMY_COLUMNS)
    rows = -(-max(len(configs), 1) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.6 * rows + 0.2), squeeze=False)
    axes = grid.ravel()
    for ax, ((mode, backend, path), df) in zip(axes, configs, strict=False):
        _anatomy_panel(ax, df.sort_values("context"))
        ax.set_title(f"{backend}, {path} ({mode})", color=style.color(backend), fontsize=10)
    if not configs:
        _empty(axes[0], "no step anatomy measured")
    for ax in axes[max(len(configs), 1) :]:
        ax.set_visible(False)  # the last row's empty places
    for row in grid:
        row[0].set_ylabel("time per verify step (ms)")
    fig.suptitle(title, fontweight="bold")
    figure_legend(fig, axes[:1])
    return fig


def _anatomy_panel(ax, df: pd.DataFrame) -> None:
    """The parts stacked, the measured step marked on each bar: the parts come from separate
    timings and a profile, so where one is below zero (noise above its size, as on a busy CPU)
    the bar stands over the step and the panel says so."""
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for col, label in ANATOMY_PARTS:
        height = df[col].clip(lower=0).to_numpy()
        ax.bar(x, height, bottom=bottom, color=style.PART_COLORS[label], label=label, width=0.7)
        bottom += height
    ax.plot(x, df["step_ms"], "wo", mec="k", ms=5, ls="none", label="measured step")
    ax.plot(x, df["step_floor_ms"], "k_-", ms=18, lw=1, label="floor (weights + attention)")
    ax.plot(x, df["weights_floor_ms"], "k--", lw=0.8, label="weights floor")
    ax.set_xticks(x, [ctx_label(c) for c in df["context"]])
    ax.set_xlabel("context (tokens)")
    top = max(bottom.max(), df["step_ms"].max())
    ax.set_ylim(0, top * 1.15)  # each panel its own scale: Triton's 185k is ~2 s
    unresolved = int((df[[col for col, _ in ANATOMY_PARTS]] < 0).any(axis=1).sum())
    if unresolved:
        note = f"{unresolved} of {len(df)} contexts: a part below 0 (noise), drawn as 0"
        ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=7, color="#aa3333")
