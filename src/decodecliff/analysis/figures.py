"""The study's figures, drawn with seaborn in the one style (see style.py).

Every function takes tidy tables (summarize.py) and returns a matplotlib Figure. Points that failed
or were skipped are drawn as markers on the context axis, never left out silently.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from . import style
from .tables import ctx_label, mode_order, ok

SWEEP_PANELS = [
    ("ttft_s", "TTFT (s)"),
    ("prefill_tok_s", "prefill (tok/s)"),
    ("decode_tok_s", "decode (tok/s)"),
    ("itl", "inter-token latency (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("spec_accept_length", "accepted tokens per verify step"),
]
ITL = [("itl_ms_p50", "p50", "-"), ("itl_ms_p90", "p90", "--"), ("itl_ms_p99", "p99", ":")]


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def context_axis(ax, contexts) -> None:
    """Log-scaled context axis labelled at the contexts that ran ('1k', '128k')."""
    ticks: list[int] = []
    for c in sorted({int(c) for c in contexts if pd.notna(c)}):
        if not ticks or c / ticks[-1] >= 1.25:  # labels of close contexts would overlap
            ticks.append(c)
    ax.set_xscale("log")
    if ticks:
        ax.set_xticks(ticks, [ctx_label(c) for c in ticks])
        ax.minorticks_off()
        ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xlabel("context (tokens)")


def log_y_if_wide(ax, values, ratio: float = 20.0) -> None:
    """Log y when the data spans more than ``ratio`` (a cliff hides on a linear axis)."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    v = v[v > 0]
    if len(v) and v.max() / v.min() > ratio:
        ax.set_yscale("log")


def mark_not_ok(ax, points: pd.DataFrame, color_by: str | None = None) -> list[Line2D]:
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


def figure_legend(fig: Figure, axes, extra: list[Line2D] = ()) -> None:
    """One legend for all panels, right of them (panels share backends and line styles)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for handle in extra:
        seen.setdefault(handle.get_label(), handle)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen.keys()),
            loc="upper left",
            bbox_to_anchor=(1.0, 0.95),
            fontsize=8,
        )


def _variant(df: pd.DataFrame) -> pd.Series:
    cfg = df["triton_config"].fillna("").astype(str)
    return "page " + df["page_size"].astype(int).astype(str) + np.where(cfg != "", ", " + cfg, "")


def _kernel_grid(kernels: pd.DataFrame, height: float = 3.2) -> tuple[Figure, list]:
    """A figure with one panel per head count (rows) and mode (columns): (fig, [(ax, rows)])."""
    modes = mode_order(kernels)
    heads = sorted(kernels["heads"].unique())
    fig, axes = plt.subplots(
        len(heads), len(modes), figsize=(4.2 * len(modes), height * len(heads)), squeeze=False
    )
    panels = []
    for i, h in enumerate(heads):
        for j, m in enumerate(modes):
            q = int(kernels.loc[kernels["mode"] == m, "q_len"].max())
            axes[i, j].set_title(f"{m} (q_len {q}), {h} heads")
            panels.append((axes[i, j], kernels[(kernels["heads"] == h) & (kernels["mode"] == m)]))
    return fig, panels


def kernel_lines(kernels: pd.DataFrame, y: str, ylabel: str, ceiling: str | None = None) -> Figure:
    """``y`` vs context per backend (colour) and page size / Triton config (line style), log-log."""
    extra = []
    backends = list(dict.fromkeys(kernels["backend"]))
    fig, panels = _kernel_grid(kernels)
    for ax, panel in panels:
        good = ok(panel).assign(variant=lambda d: _variant(d))
        context_axis(ax, panel["ctx"])
        if good.empty:
            _empty(ax, "no point ran")
        else:
            sns.lineplot(
                good,
                x="ctx",
                y=y,
                hue="backend",
                style="variant",
                markers=True,
                dashes=True,
                palette=style.palette(backends),
                hue_order=[b for b in backends if b in set(good["backend"])],
                ax=ax,
                legend="auto",
            )
            ax.set_yscale("log")
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
        ax.set_ylabel(ylabel)
        extra += mark_not_ok(ax, panel, "backend")
    fig.tight_layout()
    figure_legend(fig, fig.axes, extra)
    return fig


def roofline(kernels: pd.DataFrame) -> Figure:
    """Attained TFLOP/s vs arithmetic intensity under the measured copy and matmul ceilings."""
    good = ok(kernels).copy()
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
    if len(good):
        sns.scatterplot(
            good,
            x="intensity",
            y="tflops",
            hue="backend",
            style="mode",
            size="ctx",
            palette=style.palette(good["backend"]),
            ax=ax,
            sizes=(25, 160),
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte of latent KV)",
        ylabel="attained (TFLOP/s)",
        title=f"roofline of {kernels['device'].iloc[0]}",
    )
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    return fig


def kernel_speedup(speedup: pd.DataFrame, kernels: pd.DataFrame) -> Figure:
    """custom over the baseline per context, one panel per mode and head count."""
    fig, panels = _kernel_grid(kernels, height=3.0)
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
            s = s.assign(
                pair=s["candidate"] + " / " + s["baseline"] + ", page " + s["page_size"].astype(str)
            )
            sns.lineplot(
                s,
                x="ctx",
                y="speedup",
                style="pair",
                color=style.color("custom"),
                markers=True,
                ax=ax,
            )
            log_y_if_wide(ax, s["speedup"], 10)
        ax.set_ylabel("speedup over Triton (x)")
    fig.tight_layout()
    figure_legend(fig, fig.axes)
    return fig


def sweep_metrics(points: pd.DataFrame, server: str) -> Figure:
    """The end-to-end metrics of one server configuration vs context, non-ok points marked."""
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    good = ok(points)
    color, extra = style.color(server), []
    for ax, (key, label) in zip(axes.flat, SWEEP_PANELS, strict=True):
        context_axis(ax, points["ctx"])
        ax.set_ylabel(label)
        if key == "itl":
            for col, name, ls in ITL:
                if col in good and good[col].notna().any():
                    sns.lineplot(
                        good, x="ctx", y=col, color=color, ls=ls, marker="o", label=name, ax=ax
                    )
            values = pd.concat([good[c] for c, _, _ in ITL if c in good]) if len(good) else []
        elif key in good and good[key].notna().any():
            sns.lineplot(good, x="ctx", y=key, color=color, marker="o", ax=ax)
            values = good[key]
        else:
            values = []
            _empty(ax, "not recorded" if len(good) else "no point ran")
        ax.set_ylabel(label)
        log_y_if_wide(ax, values)
        extra += mark_not_ok(ax, points)
    fig.suptitle(f"server configuration: {server}", fontweight="bold")
    fig.tight_layout()
    figure_legend(fig, fig.axes, extra)
    return fig


def compare_decode(sweeps: dict[str, pd.DataFrame], reference: pd.DataFrame | None) -> Figure:
    """Decode tok/s vs context per server configuration, one panel per study, reference overlaid."""
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), squeeze=False)
    extra = []
    for ax, (study, sweep) in zip(axes[0], sweeps.items(), strict=True):
        context_axis(ax, sweep["ctx"])
        good = ok(sweep)
        servers = list(dict.fromkeys(sweep["server"]))
        if good["decode_tok_s"].notna().any():
            sns.lineplot(
                good,
                x="ctx",
                y="decode_tok_s",
                hue="server",
                hue_order=servers,
                palette=style.palette(servers),
                marker="o",
                ax=ax,
            )
        if reference is not None:
            ax.plot(
                reference["actual_ctx"],
                reference["decode_tok_s"],
                color=style.color("reference"),
                ls="--",
                marker="D",
                ms=5,
                label=style.REFERENCE_LABEL,
            )
        extra += mark_not_ok(ax, sweep, "server")
        ax.set(yscale="log", ylabel="decode (tok/s)", title=study)
        ax.autoscale(axis="x")
    fig.tight_layout()
    figure_legend(fig, fig.axes, extra)
    return fig


def compare_speedup(speedups: dict[str, pd.DataFrame], baseline: dict[str, str | None]) -> Figure:
    """Each server configuration's decode tok/s over the baseline's, per context and study."""
    fig, axes = plt.subplots(1, len(speedups), figsize=(6.5 * len(speedups), 4.2), squeeze=False)
    for ax, (study, s) in zip(axes[0], speedups.items(), strict=True):
        context_axis(ax, s["requested_ctx"])
        ax.axhline(
            1.0,
            color=style.color(baseline[study] or "triton"),
            lw=1,
            ls="--",
            label=f"{baseline[study]} (baseline)",
        )
        good = s.dropna(subset=["speedup"])
        if good.empty:
            _empty(ax, "no context where both ran" if baseline[study] else "no Triton baseline")
        else:
            servers = list(dict.fromkeys(good["server"]))
            sns.lineplot(
                good,
                x="requested_ctx",
                y="speedup",
                hue="server",
                palette=style.palette(servers),
                marker="o",
                ax=ax,
            )
            log_y_if_wide(ax, good["speedup"], 10)
        ax.set(ylabel=f"decode speedup over {baseline[study]} (x)", title=study)
    fig.tight_layout()
    figure_legend(fig, fig.axes)
    return fig
