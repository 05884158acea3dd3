"""The study's finding in one figure and three sentences, computed from its files.

The figure: verify steps/s against context (log x), one line per server that matters (the SGLang
Triton servers, FlashInfer's, the custom kernel's; CUDA-graph servers solid, eager dashed), the
published RTX PRO 6000 table overlaid in its own units (tok/s), the cliff and the win annotated.
The sentences: what collapses and why (attention's share of a verify step, from the step
anatomy), what the custom kernel wins, and which server is fastest at each context. The report
page and the README both open with them (``analysis/readme.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from . import floors, style
from .figures import context_axis, median_line, set_scale
from .tables import PRIMARY, comparable, ctx_label, engine_label, listed, num, ok, times

FLOOR_LABEL = "floor: weights and attention\nat the measured copy and matmul rates"
REFERENCE_LABEL = "RTX PRO 6000 x8, SGLang Triton, Kimi K2.6\n(published table; tok/s, not steps/s)"
FAMILY_ORDER = ("sglang", "triton", "flashinfer", "custom")  # legend order: the baseline first
WHO = {
    "sglang": "SGLang's Triton backend with its own kernels",
    "triton": "the Triton verify baseline (SGLang's extend-attention algorithm)",
}
PEERS = ("sglang", "flashinfer")  # servers a user could run instead of the custom kernel
BASELINES = ("sglang", "triton")  # SGLang Triton: its own kernels, else the Triton baseline
LABEL_BOX = {"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1.5}  # annotations over lines
ANATOMY_TOLERANCE = 0.1  # an anatomy row stands for a sweep context within 10% (128,000: 131,072)
ALT = (
    "Verify steps per second against context (log-log) for each server: {servers}; "
    "the published RTX PRO 6000 table in tok/s; {cliff} {win}"
)


@dataclass(frozen=True)
class Facts:
    """The numbers the figure annotates and the sentences state."""

    baseline: str | None  # the SGLang Triton server the cliff is measured on
    short: int  # the baseline's shortest and longest context that ran
    long: int
    rate_short: float
    rate_long: float
    winner: str | None  # the fastest custom server at the baseline's longest context
    win_rate: float
    win_short: float  # its speedup over the baseline at the shortest context
    missing: str = ""  # the baseline's points that did not run, with why ('' where all ran)
    tied: tuple[str, ...] = ()  # other custom servers at exactly the winner's rate there


def falls(f: Facts) -> bool:
    """Whether the baseline's rate fell from its shortest to its longest context."""
    return bool(f.rate_long < f.rate_short)


def change(f: Facts) -> str:
    """'99x slower' where the baseline's rate fell, '1.73x faster' where it did not."""
    if falls(f):
        return f"{times(f.rate_short / f.rate_long)} slower"
    return f"{times(f.rate_long / f.rate_short)} faster"


def family(server: str, backend: object) -> str:
    """Which kind of server it is: sglang, triton, flashinfer, custom, or its backend."""
    for name in FAMILY_ORDER:
        if server.startswith(name):
            return name
    return str(backend)


def servers_that_matter(sweep: pd.DataFrame) -> list[str]:
    """The servers the headline draws: one stream per round, no defragmentation variant; SGLang
    Triton first, then FlashInfer, then the custom kernel, CUDA-graph servers before eager ones."""
    good = comparable(ok(sweep).dropna(subset=[PRIMARY]))
    meta = good.groupby("server", sort=False)["backend"].first()
    graphs = style.graph_servers(good)

    def key(server: str) -> tuple:
        fam = family(server, meta[server])
        rank = FAMILY_ORDER.index(fam) if fam in FAMILY_ORDER else len(FAMILY_ORDER)
        return rank, not graphs[server], server

    return sorted(meta.index, key=key)


def _rates(sweep: pd.DataFrame, server: str) -> pd.Series:
    rows = ok(sweep)[lambda d: d["server"] == server].dropna(subset=[PRIMARY])
    return rows.set_index("requested_ctx")[PRIMARY].sort_index()


def baseline_server(sweep: pd.DataFrame) -> str | None:
    """SGLang Triton as SGLang runs it: SGLang's own kernels with CUDA graphs where they ran,
    else the Triton baseline with CUDA graphs, else any Triton server."""
    names = servers_that_matter(sweep)
    backend = ok(sweep).groupby("server")["backend"].first()
    graphs = style.graph_servers(sweep)
    for fam in BASELINES:
        mine = [s for s in names if family(s, backend.get(s)) == fam]
        if mine:
            return next((s for s in mine if graphs[s]), mine[0])
    return None


def facts(sweep: pd.DataFrame) -> Facts:
    """The cliff between the baseline's shortest and longest context that ran (its points that
    did not run named in ``missing``, since they move the cliff) and the custom kernel's win."""
    base = baseline_server(sweep)
    rates = _rates(sweep, base) if base else pd.Series(dtype=float)
    if rates.empty:
        return Facts(None, 0, 0, np.nan, np.nan, None, np.nan, np.nan)
    short, long = int(rates.index[0]), int(rates.index[-1])
    missing = _not_run(sweep, base)
    cliff = Facts(base, short, long, rates[short], rates[long], None, np.nan, np.nan, missing)
    if short == long:  # one context: no cliff, no win to measure
        return cliff
    at_long = {s: _rates(sweep, s).get(long, np.nan) for s in custom_servers(sweep)}
    at_long = {s: v for s, v in at_long.items() if pd.notna(v)}
    if not at_long:
        return cliff
    winner = max(at_long, key=at_long.get)  # the figure's arrow: the first of any that tie
    tied = tuple(s for s, v in at_long.items() if s != winner and v == at_long[winner])
    win_short = _rates(sweep, winner).get(short, np.nan) / rates[short]
    return replace(cliff, winner=winner, win_rate=at_long[winner], win_short=win_short, tied=tied)


def custom_servers(sweep: pd.DataFrame) -> list[str]:
    """The custom kernel's servers among those that matter."""
    backend = ok(sweep).groupby("server")["backend"].first()
    return [s for s in servers_that_matter(sweep) if family(s, backend[s]) == "custom"]


def _not_run(sweep: pd.DataFrame, server: str) -> str:
    """'its 185k point failed: <reason>' for each of a server's points that did not run, points
    with one status and reason together ('' where every point ran)."""
    rows = sweep[(sweep["server"] == server) & (sweep["status"] != "ok")]
    if rows.empty:
        return ""
    rows = rows.sort_values("requested_ctx")
    why = rows["reason"].fillna("") if "reason" in rows else pd.Series("", index=rows.index)
    why = why.astype(str).str.strip().str.split("\n").str[0]
    parts = []
    for (status, reason), group in rows.groupby([rows["status"], why], sort=False):
        ctxs = [ctx_label(c) for c in group["requested_ctx"]]
        where, one = listed(ctxs), len(ctxs) == 1
        verb = status if status == "failed" else f"{'was' if one else 'were'} {status}"
        noun = "point" if one else "points"
        parts.append(f"its {where} {noun} {verb}" + (f": {reason}" if reason else ""))
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# the figure


def figure(
    sweep: pd.DataFrame,
    reference: pd.DataFrame | None,
    title: str,
    ceilings: Mapping | None = None,
) -> Figure:
    """Verify steps/s vs context per server that matters, the reference overlaid, annotated;
    with the study's ceilings, the rate of a step at its floor above them (analysis/floors.py)."""
    fig, ax = plt.subplots(figsize=(9.6, 5.0))
    fig.subplots_adjust(left=0.08, right=0.66, bottom=0.12, top=0.92)  # the legend goes right
    ref = _reference(reference)
    context_axis(ax, sweep["requested_ctx"])  # the reference's contexts lie inside, unlabelled
    graphs = style.graph_servers(sweep)
    for server in servers_that_matter(sweep):
        rows = ok(sweep)[lambda d, s=server: d["server"] == s]
        rows = rows.assign(ctx=rows["requested_ctx"])
        line = style.linestyle(graphs[server])
        median_line(ax, rows, PRIMARY, style.color(server), server, ls=line)
    floor = floors.steps_s(sweep, ceilings or {})
    if len(floor):
        ax.plot(floor.index, floor.values, "k--", lw=1, label=FLOOR_LABEL)
    if len(ref):
        ax.plot(
            ref["actual_ctx"], ref["decode_tok_s"], color=style.REFERENCE_COLOR, ls=":",
            marker="D", ms=5, label=REFERENCE_LABEL,
        )  # fmt: skip
    set_scale(ax, "rate")
    _annotate(ax, facts(sweep))
    ax.set(ylabel="verify steps/s (median over requests)", title=title)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] in (FLOOR_LABEL, REFERENCE_LABEL))
    ax.legend(
        [handles[i] for i in order], [labels[i] for i in order], fontsize=7.5,
        loc="upper left", bbox_to_anchor=(1.01, 1.0), title="solid: CUDA graphs, dashed: eager",
        title_fontsize=7.5,
    )  # fmt: skip
    return fig


def _reference(reference: pd.DataFrame | None) -> pd.DataFrame:
    if reference is None:
        return pd.DataFrame(columns=["actual_ctx", "decode_tok_s"])
    return reference.dropna(subset=["decode_tok_s"]).sort_values("actual_ctx")


def _annotate(ax, f: Facts) -> None:
    """The cliff where its label covers the fewest lines, the win as an arrow at the longest
    context."""
    if f.baseline is None or f.short == f.long:
        return
    label = ax.text(
        0, 0, f"{'the' if falls(f) else 'no'} cliff: {f.baseline}\n{num(f.rate_short)} → "
        f"{num(f.rate_long)} steps/s from {ctx_label(f.short)} to {ctx_label(f.long)} "
        f"({change(f)})", transform=ax.transAxes, ha="left", fontsize=8,
        color=style.color(f.baseline), fontweight="bold", bbox=LABEL_BOX,
    )  # fmt: skip
    _place_clear(ax, label)
    if f.winner is None:
        return
    ax.annotate(
        "", (f.long, f.win_rate), xytext=(f.long, f.rate_long),
        arrowprops={"arrowstyle": "->", "color": style.color(f.winner), "lw": 1.6},
    )  # fmt: skip
    what = "the win" if f.win_rate >= f.rate_long else "the loss"
    ax.annotate(
        f"{what}: {f.winner}\n{times(f.win_rate / f.rate_long)} at {ctx_label(f.long)}",
        (f.long, float(np.sqrt(f.win_rate * f.rate_long))), xytext=(-8, 0),
        textcoords="offset points", ha="right", va="center", fontsize=8,
        color=style.color(f.winner), fontweight="bold", bbox=LABEL_BOX,
    )  # fmt: skip


# Where a label may stand along the left edge (axes fraction, vertical alignment), in order of
# preference: the lower left is empty on a GPU, where the long contexts' low rates lie at the
# right; a CPU's rates can put the baseline's own points there.
LEFT_SLOTS = ((0.04, "bottom"), (0.96, "top"), (0.5, "center"), (0.27, "center"), (0.73, "center"))


def _place_clear(ax, label) -> None:
    """Moves ``label`` to the first slot of LEFT_SLOTS where it covers the fewest points of the
    plotted lines (sampled along each segment), once the axes' limits are final."""
    to_axes = ax.transData + ax.transAxes.inverted()
    points = [_along(to_axes.transform(line.get_xydata())) for line in ax.get_lines()]
    points = np.concatenate(points) if points else np.empty((0, 2))
    renderer = ax.figure.canvas.get_renderer()

    def covered(slot: tuple[float, str]) -> int:
        label.set_position((0.03, slot[0]))
        label.set_va(slot[1])
        (x0, y0), (x1, y1) = (
            label.get_window_extent(renderer).transformed(ax.transAxes.inverted()).get_points()
        )
        x, y = points[:, 0], points[:, 1]
        return int(((x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)).sum())

    best = min(LEFT_SLOTS, key=covered)
    label.set_position((0.03, best[0]))
    label.set_va(best[1])


def _along(xy: np.ndarray, steps: int = 16) -> np.ndarray:
    """Points along a polyline's segments (its vertices included), so a label over a segment
    between two vertices counts as covering it."""
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) < 2:
        return xy
    t = np.linspace(0.0, 1.0, steps, endpoint=False)[:, None, None]
    inner = xy[:-1] + t * (xy[1:] - xy[:-1])
    return np.concatenate([inner.reshape(-1, 2), xy[-1:]])


def alt_text(sweep: pd.DataFrame) -> str:
    """The figure's alt text: what it shows, with the numbers it annotates."""
    f = facts(sweep)
    cliff = win = ""
    if f.baseline and f.short != f.long:
        cliff = (
            f"{f.baseline} {'falls' if falls(f) else 'rises'} from {num(f.rate_short)} to "
            f"{num(f.rate_long)} verify steps/s between {ctx_label(f.short)} and "
            f"{ctx_label(f.long)}."
        )
    if f.winner:
        win = f"{f.winner} runs {num(f.win_rate)}, {times(f.win_rate / f.rate_long)} that."
    return ALT.format(servers=", ".join(servers_that_matter(sweep)), cliff=cliff, win=win).strip()


# ---------------------------------------------------------------------------------------------
# the sentences


def attention_share(engine: pd.DataFrame | None, backend: str, graphs: bool) -> pd.DataFrame:
    """Per context: a chain verify step's time and attention's share of it, for one engine
    configuration of the step anatomy (empty where it was not measured)."""
    cols = ["context", "step_ms", "attention_ms", "share", "step_floor_ms"]
    if engine is None or engine.empty or "attention_ms" not in engine:
        return pd.DataFrame(columns=cols)
    path = "graphs" if graphs else "eager"
    rows = engine[(engine["backend"] == backend) & (engine["path"] == path)]
    rows = rows[rows["mode"] == "chain"] if "mode" in rows else rows
    rows = rows.dropna(subset=["step_ms", "attention_ms"]).sort_values("context")
    if "step_floor_ms" not in rows:
        rows = rows.assign(step_floor_ms=np.nan)
    return rows.assign(share=rows["attention_ms"] / rows["step_ms"])[cols]


def _floor(row: pd.Series, sweep: pd.DataFrame, ceilings: Mapping | None) -> str:
    """', floor 6.1 ms' at an anatomy row's context: the study's step floor, the one its tables
    and figure draw (the kernel bench's ceilings), else the engine bench's own; nothing where
    neither is known."""
    floor = floors.step_ms(sweep, ceilings, int(row["context"]))
    floor = row["step_floor_ms"] if floor is None else floor
    return "" if pd.isna(floor) else f", floor {num(floor)} ms"


def _near(share: pd.DataFrame, ctx: int) -> pd.Series | None:
    """The anatomy row nearest to ``ctx`` (relative distance), None where none lies within
    ANATOMY_TOLERANCE of it."""
    if share.empty:
        return None
    off = np.abs(share["context"].to_numpy(dtype=float) / ctx - 1)
    i = int(np.argmin(off))
    return share.iloc[i] if off[i] <= ANATOMY_TOLERANCE else None


def _why(
    engine: pd.DataFrame | None,
    f: Facts,
    backend: str,
    graphs: bool,
    sweep: pd.DataFrame,
    ceilings: Mapping | None,
) -> str:
    share = attention_share(engine, backend, graphs)
    if share.empty and backend == "sglang":  # the Triton baseline runs SGLang's algorithm
        backend = "triton"
        share = attention_share(engine, backend, graphs)
    if len(share) < 2:
        return " (the study has no step anatomy of it to say why)"
    # the cliff's own contexts where the anatomy has them; else its ends, and the gap said
    lo, hi = _near(share, f.short), _near(share, f.long)
    gaps = [ctx_label(c) for c, row in ((f.short, lo), (f.long, hi)) if row is None]
    lo = share.iloc[0] if lo is None else lo
    hi = share.iloc[-1] if hi is None else hi
    if lo["context"] >= hi["context"]:  # the cliff's ends map to one anatomy row
        lo, hi, gaps = share.iloc[0], share.iloc[-1], [ctx_label(f.short), ctx_label(f.long)]
    how = "with CUDA graphs" if graphs else "eager"
    gap = f", which has no {' or '.join(gaps)} point" if gaps else ""
    return (
        f", because attention grows from {lo['share']:.0%} of a verify step at "
        f"{ctx_label(lo['context'])} to {hi['share']:.1%} at {ctx_label(hi['context'])} "
        f"({num(hi['attention_ms'])} of {num(hi['step_ms'])} ms{_floor(hi, sweep, ceilings)}; "
        f"step anatomy, {backend} engine {how}{gap})"
    )


def _reference_clause(reference: pd.DataFrame | None, sweep: pd.DataFrame) -> str:
    ref = _reference(reference)
    if len(ref) < 2:
        return ""
    a, b = ref.iloc[0], ref.iloc[-1]
    cliff = (
        f"{num(a['decode_tok_s'])} → {num(b['decode_tok_s'])} tok/s from "
        f"{ctx_label(a['actual_ctx'])} to {ctx_label(b['actual_ctx'])}"
    )
    if "gpu" in sweep and sweep["gpu"].notna().any():
        return f"; the published RTX PRO 6000 sweep shows the same cliff, {cliff}"
    return (  # a CPU study runs Triton's interpreter: its slowdown is no GPU's cliff
        f"; on this CPU Triton's interpreter stands in for a GPU, so this slowdown is no "
        f"measure of the cliff, which the published RTX PRO 6000 sweep shows: {cliff}"
    )


def collapse(
    sweep: pd.DataFrame,
    engine: pd.DataFrame | None,
    reference: pd.DataFrame | None = None,
    ceilings: Mapping | None = None,
) -> str:
    f = facts(sweep)
    if f.baseline is None:
        return f"**What collapses:** {_no_baseline(sweep)} in this study: it shows no cliff."
    missing = f" ({f.missing})" if f.missing else ""  # they move the cliff's ends: say so
    if f.short == f.long:
        one = f"{ctx_label(f.short)} only{missing}"
        return f"**What collapses:** `{f.baseline}` ran at {one}: no cliff to measure."
    backend = str(ok(sweep).groupby("server")["backend"].first()[f.baseline])
    graphs = style.graph_servers(sweep)[f.baseline]
    who = WHO.get(family(f.baseline, backend), "the baseline")
    if not falls(f):  # no cliff: nothing for the step anatomy to explain
        return (
            f"**What collapses:** nothing: `{f.baseline}`, {who}, runs {num(f.rate_short)} "
            f"verify steps/s at {ctx_label(f.short)} and {num(f.rate_long)} at "
            f"{ctx_label(f.long)}, {change(f)}{missing}."
        )
    return (
        f"**What collapses:** `{f.baseline}`, {who}, falls from "
        f"{num(f.rate_short)} verify steps/s at {ctx_label(f.short)} to {num(f.rate_long)} at "
        f"{ctx_label(f.long)}, {times(f.rate_short / f.rate_long)} slower{missing}"
        f"{_why(engine, f, backend, graphs, sweep, ceilings)}{_reference_clause(reference, sweep)}."
    )


def win(sweep: pd.DataFrame, engine: pd.DataFrame | None, ceilings: Mapping | None = None) -> str:
    """The fastest custom server at the baseline's longest context against the baseline there
    (a loss where it is slower), with its step anatomy at that context where measured; custom
    servers that tie there exactly are named together, each one's speedup at the shortest
    context and step anatomy given."""
    f = facts(sweep)
    if f.winner is None:
        return f"**What the custom kernel wins:** {_no_win(sweep, f)}."
    names = (f.winner, *f.tied)
    graphs = style.graph_servers(sweep)
    rows = {
        s: _near(attention_share(engine, engine_label(sweep, s), graphs[s]), f.long) for s in names
    }
    owner = {s: "its" if len(names) == 1 else f"`{s}`'s" for s in names}
    steps = [
        f"{row['share']:.0%} of {owner[s]} {num(row['step_ms'])} ms step there "
        f"({_floor(row, sweep, ceilings)[2:] or 'floor not measured'})"
        for s, row in rows.items()
        if row is not None
    ]
    step = f"; attention is {listed(steps)}" if steps else ""
    short = {s: _rates(sweep, s).get(f.short, np.nan) / f.rate_short for s in names}
    short = {s: times(v) for s, v in short.items() if pd.notna(v)}
    where = ctx_label(f.short)
    if len(set(short.values())) == 1 and len(short) == len(names):  # one, or all alike
        short = f" ({next(iter(short.values()))} at {where})"
    elif short:
        short = f" (at {where}: {', '.join(f'`{s}` {v}' for s, v in short.items())})"
    else:
        short = ""
    ratio = f.win_rate / f.rate_long
    head, than = ("wins", "") if ratio >= 1 else ("loses", "the rate of ")
    who = f"`{f.winner}` runs" if not f.tied else f"{listed([f'`{s}`' for s in names])} tie at"
    return (
        f"**What the custom kernel {head}:** {who} {num(f.win_rate)} verify steps/s "
        f"at {ctx_label(f.long)}, {times(ratio)} {than}`{f.baseline}`{short}{step}."
    )


def _no_baseline(sweep: pd.DataFrame) -> str:
    """'no SGLang Triton server ran', naming each one that was launched and why none of its
    points ran (a baseline failing everywhere is a finding, not an absence)."""
    backend = sweep.groupby("server")["backend"].first() if "backend" in sweep else {}
    names = dict.fromkeys(sweep["server"])
    ran = set(ok(sweep)["server"])
    tried = [s for s in names if family(s, backend.get(s)) in BASELINES and s not in ran]
    if not tried:
        return "no SGLang Triton server ran"
    why = "; ".join(f"`{s}`: {_not_run(sweep, s)}" for s in tried)
    return f"no SGLang Triton point ran ({why})"


def _no_win(sweep: pd.DataFrame, f: Facts) -> str:
    """What is missing for a win to be measured."""
    custom = custom_servers(sweep)
    if f.baseline is None:
        if custom:
            return f"{_no_baseline(sweep)} to measure the custom kernel against"
        return "neither a custom server nor an SGLang Triton server ran"
    if not custom:
        return "no custom server ran"
    if f.short == f.long:
        return f"`{f.baseline}` ran at {ctx_label(f.short)} only: no long context to compare at"
    return f"no custom server ran at {ctx_label(f.long)}, `{f.baseline}`'s longest context"


def fastest(sweep: pd.DataFrame, title: str = "**Fastest at each context:**") -> str:
    """Which server is fastest at each context, runs of contexts with one winner merged; where a
    peer is fastest, by how much over the fastest custom server at the run's last context, and
    whether it wins there (beyond the requests' spread of every custom server) or only leads."""
    names = servers_that_matter(sweep)
    rates = pd.DataFrame({s: _rates(sweep, s) for s in names}).sort_index()
    if rates.empty:
        return "**Fastest:** no end-to-end point ran."
    # per context the servers at its fastest rate: one, or every one that ties there exactly
    best = pd.Series([tuple(r.index[r == r.max()]) for _, r in rates.iterrows()], rates.index)
    runs = (best.map(" ".join) != best.map(" ".join).shift()).cumsum()
    parts = []
    for _, group in best.groupby(runs):
        parts.append(_run_text(group, rates, sweep))
    return f"{title} " + "; ".join(parts) + "."


# Backend variants that need Hopper's wgmma: sm_120 (the RTX PRO 6000 this study is about) lacks it
HOPPER_ONLY = {"fa3"}


def on_sm120(sweep: pd.DataFrame) -> pd.DataFrame | None:
    """The points of servers whose kernels sm_120 can run, on this GPU's own resources (the sm_120
    model's servers are the pairing's); None when every server can."""
    if "backend_variant" not in sweep.columns:
        return None
    hopper = sweep["backend_variant"].isin(HOPPER_ONLY)
    if "model" in sweep.columns:
        hopper |= sweep["model"] == "sm120"
    return sweep[~hopper] if hopper.any() else None


def sm120_pairing(sweep: pd.DataFrame) -> str | None:
    """The custom and FlashInfer servers run as both configure themselves on sm_120 (its 100 KB
    of shared memory per SM; kernels/sm120_model.py), side by side: among the headline's servers
    (no defrag variant, one stream), the first custom one and the FlashInfer one with its CUDA-graph
    setting; None where the study has no such pair."""
    if "model" not in sweep.columns:
        return None
    rows = ok(sweep)
    sm120 = set(rows.loc[rows["model"] == "sm120", "server"])
    names = [s for s in servers_that_matter(sweep) if s in sm120]
    backend = rows.groupby("server")["backend"].first()
    graphs = style.graph_servers(rows)
    pairs = [
        (mine, theirs)
        for mine in names
        if family(mine, backend[mine]) == "custom"
        for theirs in names
        if family(theirs, backend[theirs]) == "flashinfer" and graphs[theirs] == graphs[mine]
    ]
    if not pairs:
        return None
    mine, theirs = pairs[0]
    mine_rates, their_rates = _rates(sweep, mine), _rates(sweep, theirs)
    ratio = (mine_rates / their_rates).dropna()
    if ratio.empty:
        return None
    long, ahead = ratio.index[-1], int((ratio >= 1).sum())
    lead = (
        f"ahead at {ahead} of {len(ratio)} contexts"
        if ratio[long] >= 1
        else f"behind at {len(ratio) - ahead} of {len(ratio)} contexts"
    )
    return (
        "**As both configure themselves on sm_120** (100 KB of shared memory per SM; the custom "
        f"kernel's sm_120 build, FlashInfer's fa2 in its sm_120 configuration, on this GPU): "
        f"`{mine}` {num(mine_rates[long])} verify steps/s at {ctx_label(long)} against "
        f"`{theirs}` {num(their_rates[long])}, {times(ratio[long])}; {lead}, "
        f"{times(ratio.min())} to {times(ratio.max())} over {ctx_label(ratio.index[0])}–"
        f"{ctx_label(long)}."
    )


def _run_text(group: pd.Series, rates: pd.DataFrame, sweep: pd.DataFrame) -> str:
    """A run of contexts with the same fastest server, or the same servers that tie there."""
    tops, ctxs = group.iloc[0], list(group.index)
    server = tops[0]  # each of them has its rate
    span = ctx_label(ctxs[0]) if len(ctxs) == 1 else f"{ctx_label(ctxs[0])}–{ctx_label(ctxs[-1])}"
    span = f"at every context, {span}" if len(group) == len(rates) else f"at {span}"
    values = ", ".join(f"{num(rates.loc[c, server])}" for c in ctxs)
    # the servers whose requests reach the slowest request of any of them
    reach = {c: [n for t in tops for n in _within_spread(sweep, rates.columns, t, c)] for c in ctxs}
    near = {c: [s for s in dict.fromkeys(reach[c]) if s not in tops] for c in ctxs}
    close = "".join(
        f"; at {ctx_label(c)} within the requests' spread of "
        + ", ".join(f"`{s}`" for s in near[c])
        for c in ctxs
        if near[c]
    )
    names = listed([f"`{s}`" for s in tops])
    text = f"{names} {'tie ' if len(tops) > 1 else ''}{span} ({values} steps/s{close})"
    backend = ok(sweep).groupby("server")["backend"].first()
    if any(family(s, backend[s]) == "custom" for s in tops):
        return text
    custom = [s for s in rates.columns if family(s, backend[s]) == "custom"]
    if not custom:
        return text
    c = ctxs[-1]
    rivals = rates.loc[c, custom].dropna()
    if rivals.empty:
        return f"{text}: no custom server ran at {ctx_label(c)}"
    fastest_custom = list(rivals.index[rivals == rivals.max()])  # each one that ties
    rival = listed([f"`{s}`" for s in fastest_custom])
    rival += " (tied)" if len(fastest_custom) > 1 else ""
    ratio = rates.loc[c, server] / rivals.max()
    # at c, where the ratio is given: a win beyond the requests' spread of every custom server,
    # a lead where any of them reaches into it (not only the fastest, whose rate it is over)
    within = any(s in custom for s in near[c])
    if len(tops) > 1:
        who = "they lead" if within else "they win"
    else:
        who = "a peer" if family(server, backend[server]) in PEERS else "no custom server"
        who += " leads" if within else " wins"
    return f"{text}: {who} there, {times(ratio)} {rival} at {ctx_label(c)}"


def _span(sweep: pd.DataFrame, server: str, ctx: int) -> tuple[float, float] | None:
    """The min and max over a point's requests of its verify steps/s (None where none ran)."""
    rows = ok(sweep)[lambda d: (d["server"] == server) & (d["requested_ctx"] == ctx)]
    cols = [f"{PRIMARY}_min", f"{PRIMARY}_max"]
    if rows.empty or not set(cols) <= set(rows) or rows[cols].iloc[0].isna().any():
        return None
    return tuple(rows[cols].iloc[0])


def _within_spread(sweep: pd.DataFrame, names: Iterable[str], best: str, ctx: int) -> list[str]:
    """The servers whose requests at ``ctx`` reach the fastest one's slowest request: its lead
    there is within what the requests scatter, no measured win."""
    mine = _span(sweep, best, ctx)
    if mine is None:
        return []
    return [
        s for s in names
        if s != best and (theirs := _span(sweep, s, ctx)) is not None and theirs[1] >= mine[0]
    ]  # fmt: skip


def sentences(
    sweep: pd.DataFrame,
    engine: pd.DataFrame | None,
    reference: pd.DataFrame | None = None,
    ceilings: Mapping | None = None,
) -> list[str]:
    """The sentences under the headline figure (Markdown); a step's floor at the study's
    ceilings (the kernel bench's), as the table and the figure draw it."""
    out = [
        collapse(sweep, engine, reference, ceilings),
        win(sweep, engine, ceilings),
        fastest(sweep),
    ]
    sm120 = on_sm120(sweep)
    if sm120 is not None:
        title = (
            "**Fastest on the instructions sm_120 has, with this GPU's shared memory** "
            "(mma.sync; FlashInfer's fa3 needs wgmma):"
        )
        out.append(fastest(sm120, title))
    if (pairing := sm120_pairing(sweep)) is not None:
        out.append(pairing)
    return out


def engine_rows(doc: dict | None) -> pd.DataFrame | None:
    """The step anatomy's rows of an engine bench document (None without one)."""
    if not doc or not doc.get("rows"):
        return None
    return pd.DataFrame(doc["rows"])
