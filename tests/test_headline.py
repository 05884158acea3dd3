"""The finding in one figure and three sentences (analysis/headline.py), computed from a study's
files: with the published study's servers, with the peer servers newer studies add, and with
neither a Triton nor a custom server."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from published_study import CUSTOM, copy_study, edit_points, fail_points

from decodecliff.analysis import floors, headline, style, summarize, tables
from decodecliff.analysis.tables import PRIMARY

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "h200"
CONTEXTS = [1024, 11000, 32000, 64000, 128000, 185000]  # the published sweep's
REFERENCE = ROOT / "data" / "reference" / "seed-rtx-pro-6000-triton.csv"
pytestmark = pytest.mark.skipif(not PUBLISHED.is_dir(), reason="no published study")

# (name, backend, server whose rates it copies, factor per context in order)
PEERS = [
    ("sglang-graph-p1", "sglang", "triton-graph-p1", [1.1] * 6),
    ("flashinfer-graph-p1", "flashinfer", "custom-graph-p1", [0.8] * 6),
    ("flashinfer-fa3-graph-p1", "flashinfer", "custom-graph-p1", [0.9, 0.95, 0.99, 1.1, 1.2, 1.3]),
]


@pytest.fixture(scope="module")
def sweep() -> pd.DataFrame:
    return summarize.load_study(PUBLISHED).sweep


@pytest.fixture(scope="module")
def engine() -> pd.DataFrame:
    return headline.engine_rows(json.loads((PUBLISHED / "engine/bench.json").read_text()))


def with_peers(sweep: pd.DataFrame) -> pd.DataFrame:
    """The published sweep's own servers plus the peer servers, their rates scaled from a measured
    server's (in place of the published peers)."""
    sweep = sweep[~sweep["backend"].isin(["sglang", "flashinfer"])]
    extra = []
    for name, backend, source, factors in PEERS:
        rows = sweep[sweep["server"] == source].sort_values("requested_ctx").copy()
        rows["server"], rows["backend"] = name, backend
        for col in [c for c in rows.columns if c.startswith(PRIMARY)]:
            rows[col] = rows[col].to_numpy() * factors
        extra.append(rows)
    return pd.concat([sweep, *extra], ignore_index=True)


def rate(sweep: pd.DataFrame, server: str, ctx: int) -> float:
    rows = sweep[(sweep["server"] == server) & (sweep["requested_ctx"] == ctx)]
    return float(rows[PRIMARY].iloc[0])


def test_sentences_state_the_published_numbers(sweep, engine) -> None:
    ref, _ = summarize.reference_table(REFERENCE)
    collapse, win, fastest, sm120, _ = headline.sentences(sweep, engine, ref)
    base = headline.baseline_server(sweep)  # SGLang's own server where it ran, else the baseline
    ctxs = sorted(sweep.loc[(sweep["server"] == base) & (sweep["status"] == "ok"), "requested_ctx"])
    short, long = rate(sweep, base, ctxs[0]), rate(sweep, base, ctxs[-1])
    span = f"at 1k to {tables.num(long)} at {tables.ctx_label(ctxs[-1])}"
    assert f"`{base}`" in collapse and f"from {tables.num(short)} verify steps/s {span}" in (
        collapse
    )
    assert f"{short / long:,.0f}x slower" in collapse and "attention grows from" in collapse
    assert "1.4 tok/s" in collapse  # the published RTX PRO 6000 table's cliff
    custom = sweep[(sweep["backend"] == "custom") & (sweep["requested_ctx"] == ctxs[-1])]
    winner = custom.set_index("server")[PRIMARY].idxmax()  # the fastest custom server there
    best = rate(sweep, winner, ctxs[-1])
    where = tables.ctx_label(ctxs[-1])
    assert f"`{winner}` runs {tables.num(best)} verify steps/s at {where}" in win
    assert f"{best / long:,.0f}x `{base}`" in win
    at = sweep[sweep["requested_ctx"] == 185000].set_index("server")[PRIMARY]
    assert f"`{at.idxmax()}` at" in fastest and "a peer wins there" in fastest
    hopper_or_model = (sweep["backend_variant"] == "fa3") | (sweep["model"] == "sm120")
    mma = at.drop(sweep.loc[hopper_or_model, "server"].unique())
    assert f"`{mma.idxmax()}` at" in sm120


def test_the_peer_servers_are_drawn_and_a_peer_that_wins_is_named(sweep, engine) -> None:
    both = with_peers(sweep)
    names = headline.servers_that_matter(both)
    assert names[0] == "sglang-graph-p1" and "custom-defrag-p1" not in names
    assert {"flashinfer-graph-p1", "flashinfer-fa3-graph-p1"} <= set(names)
    assert headline.baseline_server(both) == "sglang-graph-p1"
    collapse, _, fastest, *_ = headline.sentences(both, engine, None)
    assert "`sglang-graph-p1`, SGLang's Triton backend" in collapse
    assert "attention grows" in collapse  # the Triton engine's anatomy: the same algorithm
    assert "`flashinfer-fa3-graph-p1` at 64k–185k" in fastest and "a peer wins there" in fastest
    style.apply()
    fig = headline.figure(both, None, "with peers")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == names and len(labels) <= 8
    handles, drawn = fig.axes[0].get_legend_handles_labels()
    lines = [h.lines[0] if hasattr(h, "lines") else h for h in handles]  # errorbar: its line
    styles = {label: line.get_linestyle() for label, line in zip(drawn, lines, strict=True)}
    assert styles["triton-p1"] == "--" and styles["flashinfer-graph-p1"] == "-"
    plt.close(fig)


def test_a_study_without_triton_or_custom_servers_still_reads(sweep) -> None:
    only_custom = sweep[sweep["backend"] == "custom"]
    collapse, win, fastest, *_ = headline.sentences(only_custom, None, None)
    assert "shows no cliff" in collapse and "`custom-graph-p1`" in fastest
    only_triton = sweep[sweep["backend"] == "triton"]
    _, win, *_ = headline.sentences(only_triton, None, None)
    assert "no custom server ran" in win
    style.apply()
    for part in (only_custom, only_triton):
        plt.close(headline.figure(part, None, "part"))
    assert headline.alt_text(only_triton).startswith("Verify steps per second")


def test_a_fourth_sentence_names_the_fastest_server_on_what_sm120_has(sweep, engine) -> None:
    """FlashInfer's fa3 needs Hopper's wgmma: the RTX PRO 6000's race is told without it."""
    fa3 = sweep["backend_variant"] == "fa3"
    assert fa3.any(), "the published study holds a fa3 server"
    text = headline.sentences(sweep, engine)
    assert len(text) == 5 and "flashinfer-fa3-graph-p1" not in text[3]
    assert "sm_120" in text[3] and "sm120" not in text[3]  # the sm_120 model's servers: text[4]
    no_fa3 = sweep[~fa3]
    assert len(headline.sentences(no_fa3[no_fa3["model"] != "sm120"], engine)) == 3


def test_a_fifth_sentence_pairs_the_servers_configured_as_on_sm120(sweep) -> None:
    """The custom kernel and FlashInfer each as it configures itself for sm_120's shared memory:
    the numbers are the files', the ratio theirs, and the sentence goes with the pair."""
    text = headline.sm120_pairing(sweep)
    custom = rate(sweep, "custom-sm120-graph-p1", 185000)
    fi = rate(sweep, "flashinfer-sm120-graph-p1", 185000)
    assert text is not None and text.startswith("**As both configure themselves on sm_120**")
    assert f"{tables.num(custom)} verify steps/s at 185k" in text
    assert f"`flashinfer-sm120-graph-p1` {tables.num(fi)}, {tables.times(custom / fi)}" in text
    assert headline.sm120_pairing(sweep[sweep["server"] != "flashinfer-sm120-graph-p1"]) is None


def scaled(sweep: pd.DataFrame, server: str, factor: float, ctx: int | None = None) -> pd.DataFrame:
    """The sweep with one server's rates (at one context, or all) scaled by ``factor``."""
    sweep = sweep.copy()
    at = (sweep["server"] == server) & (ctx is None or sweep["requested_ctx"] == ctx)
    for col in [c for c in sweep.columns if c.startswith(PRIMARY)]:
        sweep.loc[at, col] *= factor
    return sweep


def copied(sweep: pd.DataFrame, server: str, like: str, ctx: int, factor: float) -> pd.DataFrame:
    """The sweep with ``server``'s verify steps/s at ``ctx`` (median, min and max) those of
    ``like`` there times ``factor``."""
    out = sweep.copy()
    at = (out["server"] == server) & (out["requested_ctx"] == ctx)
    source = (out["server"] == like) & (out["requested_ctx"] == ctx)
    for col in [c for c in out.columns if c.startswith(PRIMARY)]:
        out.loc[at, col] = float(out.loc[source, col].iloc[0]) * factor
    return out


def test_the_sm120_pairing_counts_the_contexts_it_says(sweep) -> None:
    """'behind at N' counts the contexts behind, and the range is the lowest to the highest."""
    mine = "custom-sm120-graph-p1"
    ratios = [rate(sweep, mine, c) / rate(sweep, "flashinfer-sm120-graph-p1", c) for c in CONTEXTS]
    assert min(ratios) > 1, "the published pair: custom ahead everywhere"
    slow = headline.sm120_pairing(scaled(sweep, mine, 0.5 / max(ratios)))
    assert f"behind at {len(CONTEXTS)} of {len(CONTEXTS)} contexts" in slow
    dip = headline.sm120_pairing(scaled(sweep, mine, 0.5 / ratios[-1], CONTEXTS[-1]))
    assert f"behind at 1 of {len(CONTEXTS)} contexts" in dip
    assert f"{tables.times(0.5)} to {tables.times(max(ratios[:-1]))} over 1k–185k" in dip


def test_the_sm120_pairing_is_of_the_headline_s_servers(sweep) -> None:
    """A defrag variant built for sm_120 is not the pair's custom server, even sorted first."""
    rows = scaled(sweep, "custom-sm120-graph-p1", 0.1).query("server == 'custom-sm120-graph-p1'")
    rows = rows.assign(server="custom-sm120-aaa-defrag-p1", defrag=True)
    text = headline.sm120_pairing(pd.concat([sweep, rows], ignore_index=True))
    assert "`custom-sm120-graph-p1`" in text and "aaa" not in text


def test_the_figure_draws_the_floor_from_the_study_s_ceilings(sweep) -> None:
    study = summarize.load_study(PUBLISHED)
    assert summarize.ceilings_of(study.kernels) == {
        k: study.ceilings[k] for k in ("copy_gbs", "matmul_tflops")
    }
    style.apply()
    fig = headline.figure(sweep, None, "with its floor", study.ceilings)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    floor = lines[headline.FLOOR_LABEL]
    expected = floors.steps_s(sweep, study.ceilings)
    assert list(floor.get_xdata()) == list(expected.index)
    assert list(floor.get_ydata()) == pytest.approx(list(expected.values))
    fastest = sweep.groupby("requested_ctx")[PRIMARY].max()
    assert (fastest.reindex(expected.index) < expected).all()  # no server beats its floor
    plt.close(fig)
    bare = headline.figure(sweep, None, "no ceilings")
    assert headline.FLOOR_LABEL not in [line.get_label() for line in bare.axes[0].get_lines()]
    plt.close(bare)


def test_the_win_cites_the_step_of_the_winner_s_own_configuration(sweep) -> None:
    """Where the custom kernel's sm_120 build wins, its own step anatomy is cited, not the
    H200 build's."""
    faster = sweep.copy()
    sm120 = faster["server"] == "custom-sm120-graph-p1"
    faster.loc[sm120, PRIMARY] = faster.loc[sm120, PRIMARY] * 1.5
    engine = pd.DataFrame([
        {"backend": label, "path": "graphs", "mode": "chain", "context": 185000,
         "step_ms": step, "attention_ms": attention, "step_floor_ms": floor}
        for label, step, attention, floor in (
            ("custom", 21.0, 15.0, float("nan")), ("custom (sm120)", 30.0, 27.0, 6.25)
        )
    ])  # fmt: skip
    text = headline.win(faster, engine)
    assert "`custom-sm120-graph-p1` runs" in text
    assert "90% of its 30 ms step there (floor 6.25 ms)" in text  # the time beside its floor
    assert "of its 21 ms step there (floor not measured)" in headline.win(sweep[~sm120], engine)


def test_a_server_on_another_gemm_path_cites_that_paths_step(sweep) -> None:
    """A custom server that recorded fused weight GEMMs is matched to the engine bench's
    "custom + fused GEMMs" rows, not to the cuBLAS ones."""
    fused = sweep.copy()
    fused["gemm"] = fused["gemm"].where(fused["server"] != "custom-graph-p1", "fused")
    rows = [
        {"backend": label, "path": "graphs", "mode": "chain", "context": 185000,
         "step_ms": step, "attention_ms": 15.0, "step_floor_ms": 6.25}
        for label, step in (("custom", 21.0), ("custom + fused GEMMs", 18.0))
    ]  # fmt: skip
    assert tables.engine_label(sweep, "custom-graph-p1") == "custom"
    assert tables.engine_label(fused, "custom-graph-p1") == "custom + fused GEMMs"
    assert tables.engine_label(fused, "custom-sm120-graph-p1") == "custom (sm120)"
    share = headline.attention_share(pd.DataFrame(rows), "custom + fused GEMMs", True)
    assert list(share["step_ms"]) == [18.0]


def test_the_sentences_state_the_step_floor_the_table_and_figure_draw(sweep, engine) -> None:
    ceilings = summarize.load_study(PUBLISHED).ceilings
    collapse, win, *_ = headline.sentences(sweep, engine, None, ceilings)
    floor = floors.step_ms(sweep, ceilings, 185000)
    assert floor == pytest.approx(1e3 / floors.steps_s(sweep, ceilings)[185000])
    assert f"floor {tables.num(floor)} ms;" in collapse
    assert f"(floor {tables.num(floor)} ms)" in win


def test_a_lead_within_the_requests_spread_is_no_win(sweep) -> None:
    pair = ["custom-graph-p1", "flashinfer-graph-p1"]
    two = sweep[sweep["server"].isin(pair)]
    # built, not read from the study: flashinfer a hair (0.1%) ahead of custom at 64k and 128k,
    # its requests inside custom's spread, and at 185k its slowest request 1% beyond custom's
    # fastest
    for ctx in (64000, 128000):
        two = copied(two, pair[1], pair[0], ctx, 1.001)
    mine = two[(two["server"] == pair[0]) & (two["requested_ctx"] == 185000)].iloc[0]
    two = copied(
        two, pair[1], pair[0], 185000, 1.01 * mine[f"{PRIMARY}_max"] / mine[f"{PRIMARY}_min"]
    )
    spans = two.set_index(["server", "requested_ctx"])[[f"{PRIMARY}_min", f"{PRIMARY}_max"]]
    fi, custom = spans.loc["flashinfer-graph-p1"], spans.loc["custom-graph-p1"]
    leads = [c for c in fi.index if rate(two, pair[1], c) > rate(two, pair[0], c)]
    overlap = [c for c in leads if custom.loc[c].iloc[1] >= fi.loc[c].iloc[0]]
    text = headline.fastest(two)
    assert {64000, 128000} <= set(overlap) and 185000 in leads and 185000 not in overlap
    for ctx in overlap:
        tie = f"at {tables.ctx_label(ctx)} within the requests' spread of `custom-graph-p1`"
        assert tie in text
    ratio = tables.times(rate(two, pair[1], 185000) / rate(two, pair[0], 185000))
    assert text.endswith(f": a peer wins there, {ratio} `custom-graph-p1` at 185k.")
    # custom's fastest request at 185k reaching flashinfer's slowest: a lead, no win
    at = (two["server"] == "custom-graph-p1") & (two["requested_ctx"] == 185000)
    two.loc[at, f"{PRIMARY}_max"] = float(fi.loc[185000].iloc[0])
    text = headline.fastest(two)
    assert "at 185k within the requests' spread of `custom-graph-p1`)" in text
    assert text.endswith(f": a peer leads there, {ratio} `custom-graph-p1` at 185k.")


def test_a_peer_wins_only_beyond_the_spread_of_every_custom_server(sweep) -> None:
    """A peer fastest from 32k to 185k wins at 185k, where the ratio is given, only where no
    custom server's requests reach its slowest there: not only the custom server fastest at 185k,
    whose rate the ratio is over."""
    ctx = 185000
    # the two custom CUDA-graph servers, the faster at 185k first
    best, other = sorted(
        ["custom-graph-p1", "custom-sm120-graph-p1"], key=lambda s: -rate(sweep, s, ctx)
    )
    ratio = tables.times(rate(sweep, "flashinfer-fa3-graph-p1", ctx) / rate(sweep, best, ctx))
    assert "`flashinfer-fa3-graph-p1` at 32k–185k" in headline.fastest(sweep)
    assert headline.fastest(sweep).endswith(f"a peer wins there, {ratio} `{best}` at 185k.")
    peer = (sweep["server"] == "flashinfer-fa3-graph-p1") & (sweep["requested_ctx"] == ctx)
    slower = (sweep["server"] == other) & (sweep["requested_ctx"] == ctx)
    reach = sweep.copy()
    reach.loc[slower, f"{PRIMARY}_max"] = float(sweep.loc[peer, f"{PRIMARY}_min"].iloc[0])
    text = headline.fastest(reach)
    assert f"at {tables.ctx_label(ctx)} within the requests' spread of `{other}`)" in text
    assert "a peer wins" not in text
    assert text.endswith(f"a peer leads there, {ratio} `{best}` at 185k.")


def test_a_cpu_study_does_not_claim_the_gpu_s_cliff(sweep, engine) -> None:
    ref, _ = summarize.reference_table(REFERENCE)
    on_gpu = headline.collapse(sweep, engine, ref)
    assert "the published RTX PRO 6000 sweep shows the same cliff, 119 → 1.4 tok/s" in on_gpu
    on_cpu = headline.collapse(sweep.assign(gpu=None), engine, ref)
    assert "same cliff" not in on_cpu and "Triton's interpreter stands in for a GPU" in on_cpu


def cliff_label(fig) -> tuple[tuple[float, float], np.ndarray]:
    """Where the cliff's label sits and the box it covers, in axes fraction."""
    ax = fig.axes[0]
    (text,) = [t for t in ax.texts if t.get_text().startswith("the cliff")]
    box = text.get_window_extent(fig.canvas.get_renderer()).transformed(ax.transAxes.inverted())
    return text.get_position(), box.get_points()


def covered_markers(fig, server: str) -> int:
    """How many of ``server``'s plotted points lie under the cliff's label."""
    ax = fig.axes[0]
    _, ((x0, y0), (x1, y1)) = cliff_label(fig)
    handles, labels = ax.get_legend_handles_labels()
    line = handles[labels.index(server)].lines[0]  # errorbar: its line
    xy = (ax.transData + ax.transAxes.inverted()).transform(line.get_xydata())
    return int(((xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)).sum())


def test_the_cliff_label_goes_where_no_point_lies(sweep) -> None:
    """On a GPU the lower left is empty; where the baseline's own points lie there (a CPU's
    rates), the label moves up the left edge rather than cover them."""
    style.apply()
    fig = headline.figure(sweep, None, "gpu")
    assert cliff_label(fig)[0] == (0.03, 0.04)
    plt.close(fig)
    base = headline.baseline_server(sweep)
    custom = sweep[sweep["backend"] == "custom"].set_index("server")[PRIMARY].groupby(level=0)
    two = sweep[sweep["server"].isin([base, custom.mean().idxmax()])].copy()
    ctxs = sorted(two["requested_ctx"].unique())
    low = dict(zip(ctxs, np.geomspace(0.55, 0.5, len(ctxs)), strict=True))  # flat at the bottom
    high = dict(zip(ctxs, np.geomspace(50.0, 40.0, len(ctxs)), strict=True))  # flat at the top
    for col in [c for c in two.columns if c.startswith(PRIMARY)]:
        two[col] = np.where(two["server"] == base, two["requested_ctx"].map(low),
                            two["requested_ctx"].map(high))  # fmt: skip
    fig = headline.figure(two, None, "cpu-like")
    assert cliff_label(fig)[0][1] not in (0.04, 0.96)  # both corners hold a line
    assert covered_markers(fig, base) == 0
    plt.close(fig)


def anatomy(engine: pd.DataFrame, backend: str, ctx: int) -> pd.Series:
    """The step anatomy's chain row of ``backend`` with CUDA graphs at ``ctx``."""
    rows = engine[(engine["backend"] == backend) & (engine["path"] == "graphs")]
    return rows[(rows["mode"] == "chain") & (rows["context"] == ctx)].iloc[0]


def test_a_context_where_every_custom_server_failed_is_said(tmp_path, engine) -> None:
    """The fastest server's lead over the custom kernel where none of its servers ran: said,
    not a crash (in the sm_120 sentence too)."""
    study = copy_study(tmp_path / "study")
    fail_points(study, CUSTOM, [1024, 185000], "server exited with code -9")
    sweep = summarize.load_study(study).sweep
    _, win, fastest, sm120, _ = headline.sentences(sweep, engine)
    fa3 = [tables.num(rate(sweep, "flashinfer-fa3-graph-p1", c)) for c in CONTEXTS]
    assert f"`flashinfer-fa3-graph-p1` at 1k ({fa3[0]} steps/s" in fastest
    assert "): no custom server ran at 1k; `custom-graph-p1` at 11k" in fastest
    assert f"`flashinfer-fa3-graph-p1` at 32k–185k ({', '.join(fa3[2:])} steps/s" in fastest
    assert fastest.endswith("): no custom server ran at 185k.")
    assert sm120.endswith("): no custom server ran at 185k.")
    assert win == (
        "**What the custom kernel wins:** no custom server ran at 185k, `sglang-graph-p1`'s "
        "longest context."
    )


def test_a_failed_baseline_point_is_named_and_the_anatomy_follows_the_cliff(
    tmp_path, engine
) -> None:
    """Where the baseline's longest point failed, the cliff ends a context earlier: the sentence
    says why, and the step anatomy cited is the one at the cliff's ends (128k: its 131,072)."""
    study = copy_study(tmp_path / "study")
    fail_points(study, ["sglang-graph-p1"], [185000], "point timeout (2700 s) in decode")
    sweep = summarize.load_study(study).sweep
    collapse, win, *_ = headline.sentences(sweep, engine)
    at = anatomy(engine, "sglang", 131072)
    share = at["attention_ms"] / at["step_ms"]
    short, long = rate(sweep, "sglang-graph-p1", 1024), rate(sweep, "sglang-graph-p1", 128000)
    assert (
        f"to {tables.num(long)} at 128k, {tables.times(short / long)} "
        "slower (its 185k point failed: point timeout (2700 s) in decode), because attention "
        f"grows from 68% of a verify step at 1k to {share:.1%} at 128k "
        f"({tables.num(at['attention_ms'])} of {tables.num(at['step_ms'])} ms"
    ) in collapse
    mine = anatomy(engine, "custom", 131072)  # custom-graph-p1 is fastest at 128k
    assert f"`custom-graph-p1` runs {tables.num(rate(sweep, 'custom-graph-p1', 128000))}" in win
    assert f"of its {tables.num(mine['step_ms'])} ms step there" in win


def test_an_anatomy_without_the_cliff_s_context_says_so(tmp_path, engine) -> None:
    """The anatomy has no 11k or 64k row: the sentences say the cliff's context it lacks, and
    the win cites no other context's step."""
    study = copy_study(tmp_path / "short")
    fail_points(study, ["sglang-graph-p1"], [1024], "server exited with code -9")
    sweep = summarize.load_study(study).sweep
    collapse = headline.collapse(sweep, engine)
    slower = tables.times(
        rate(sweep, "sglang-graph-p1", 11000) / rate(sweep, "sglang-graph-p1", 185000)
    )
    assert f"{slower} slower (its 1k point failed: server exited with code -9)" in collapse
    assert "sglang engine with CUDA graphs, which has no 11k point)" in collapse
    study = copy_study(tmp_path / "long")
    fail_points(study, ["sglang-graph-p1"], [128000, 185000], "server exited with code -9")
    sweep = summarize.load_study(study).sweep
    assert "(its 128k and 185k points failed: server exited" in headline.collapse(sweep, engine)
    win = headline.win(sweep, engine)
    assert "verify steps/s at 64k" in win and "attention is" not in win and "step there" not in win


def test_a_winner_without_the_shortest_context_gives_no_bracket(tmp_path, sweep, engine) -> None:
    """The fastest custom server at 185k failed at 1k: no '(2.5x at 1k)' after its speedup."""
    at = sweep[(sweep["backend"] == "custom") & (sweep["requested_ctx"] == 185000)]
    winner = at.set_index("server")[PRIMARY].idxmax()
    study = copy_study(tmp_path / "study")
    fail_points(study, [winner], [1024], "server exited with code -9")
    failed = summarize.load_study(study).sweep
    win = headline.win(failed, engine)
    mine, base = rate(failed, winner, 185000), rate(failed, "sglang-graph-p1", 185000)
    said = f"`{winner}` runs {tables.num(mine)} verify steps/s at 185k, {tables.times(mine / base)}"
    assert f"{said} `sglang-graph-p1`; attention is" in win
    assert "nan" not in win


def test_a_baseline_that_failed_everywhere_is_named_with_its_reason(tmp_path, engine) -> None:
    study = copy_study(tmp_path / "study")
    ctxs = [1024, 11000, 32000, 64000, 128000, 185000]
    fail_points(study, ["sglang-graph-p1"], ctxs, "server exited with code -9")
    fail_points(study, ["triton-graph-p1", "triton-p1"], ctxs, "timed out after 900 s")
    sweep = summarize.load_study(study).sweep
    assert sweep["server"].isin(["sglang-graph-p1", "triton-graph-p1"]).any()
    why = (
        "no SGLang Triton point ran (`sglang-graph-p1`: its 1k, 11k, 32k, 64k, 128k and 185k "
        "points failed: server exited with code -9; `triton-graph-p1`: its 1k, 11k, 32k, 64k, "
        "128k and 185k points failed: timed out after 900 s; `triton-p1`: its"
    )
    assert headline.collapse(sweep, engine).startswith(f"**What collapses:** {why}")
    assert why in headline.win(sweep, engine)


def test_a_study_whose_every_point_was_skipped_reads(tmp_path) -> None:
    """Every point skipped as the sweep writes one (no metrics, no requests): the sentences, the
    figure and the end-to-end tables say so, where the table lacked the rate's column."""
    study = copy_study(tmp_path / "study")

    def skip(doc: dict) -> None:
        doc.update(status="skipped", reason="no GPU", metrics={}, requests=[], rounds=[])

    edit_points(study, [p.name for p in (study / "sweep").iterdir()], [], skip)
    loaded = summarize.load_study(study)
    sweep = loaded.sweep
    collapse, win, fastest, *_ = headline.sentences(sweep, None, None, loaded.ceilings)
    assert "its 1k, 11k, 32k, 64k, 128k and 185k points were skipped: no GPU" in collapse
    assert fastest == "**Fastest:** no end-to-end point ran."
    style.apply()
    plt.close(headline.figure(sweep, None, "skipped", loaded.ceilings))
    base = tables.baseline_server(sweep)
    table = tables.sweep_headline(sweep, base, loaded.ceilings)
    assert (table.drop(index=tables.FLOOR_LABEL) == "skipped").all().all()
    assert tables.sweep_speedup(sweep, base)["speedup"].isna().all()
    assert (tables.sweep_long(sweep, 3.0)["verify steps/s (client)"] == "skipped").all()


def test_what_a_win_lacks_is_said_and_a_loss_is_no_win(sweep, engine) -> None:
    no_baseline = sweep[~sweep["backend"].isin(["sglang", "triton"])]
    assert headline.win(no_baseline, engine).endswith(
        "no SGLang Triton server ran to measure the custom kernel against."
    )
    one = headline.win(sweep[sweep["requested_ctx"] == 1024], engine)
    assert one.endswith("`sglang-graph-p1` ran at 1k only: no long context to compare at.")
    assert headline.win(sweep[sweep["backend"] == "custom"].iloc[:0], None).endswith(
        "neither a custom server nor an SGLang Triton server ran."
    )
    slow = sweep.copy()
    custom = slow["backend"] == "custom"
    for col in [c for c in slow.columns if c.startswith(PRIMARY)]:
        slow.loc[custom, col] = slow.loc[custom, col] * 0.005
    loss = headline.win(slow, engine)
    ratio = rate(slow, "custom-sm120-graph-p1", 185000) / rate(slow, "sglang-graph-p1", 185000)
    assert loss.startswith("**What the custom kernel loses:** `custom-sm120-graph-p1` runs")
    assert f"185k, {tables.times(ratio)} the rate of `sglang-graph-p1` (" in loss
    style.apply()
    fig = headline.figure(slow, None, "a loss")
    assert any(t.get_text().startswith("the loss: ") for t in fig.axes[0].texts)
    plt.close(fig)


def test_ratios_read_without_an_exponent(sweep) -> None:
    fast = sweep.copy()
    at = (fast["server"] == "flashinfer-fa3-graph-p1") & (fast["requested_ctx"] == 185000)
    for col in [c for c in fast.columns if c.startswith(PRIMARY)]:
        fast.loc[at, col] = fast.loc[at, col] * 300
    text = headline.fastest(fast)
    ratio = rate(fast, "flashinfer-fa3-graph-p1", 185000) / rate(
        fast, "custom-sm120-graph-p1", 185000
    )
    assert ratio > 100 and "e+" not in text
    assert f"a peer wins there, {ratio:,.0f}x `custom-sm120-graph-p1` at 185k." in text


def test_a_lead_of_under_five_percent_is_not_written_1x(sweep) -> None:
    near = sweep.copy()
    custom = near.loc[near["server"] == "custom-sm120-graph-p1"].set_index("requested_ctx")
    for server, scale in (("flashinfer-fa3-graph-p1", 1.005), ("flashinfer-graph-p1", 0.9)):
        at = (near["server"] == server) & (near["requested_ctx"] == 185000)
        for col in [c for c in near.columns if c.startswith(PRIMARY)]:
            near.loc[at, col] = custom.loc[185000, col] * scale
    text = headline.fastest(near)
    assert "a peer leads there, 1.005x `custom-sm120-graph-p1` at 185k." in text
    assert [tables.times(r) for r in (1.0, 0.998, 1.004, 1.0514, 0.95, 1.969, 84.2)] == [
        "1x", "0.998x", "1.004x", "1.05x", "0.95x", "1.97x", "84x"
    ]  # fmt: skip


def test_a_baseline_that_does_not_slow_down_is_no_cliff(sweep, engine) -> None:
    """Where the baseline runs faster at its longest context than at its shortest, the sentence,
    the alt text and the figure's label say so: nothing 'falls', nothing is '0.5x slower'."""
    flat = sweep.copy()
    at = (flat["server"] == "sglang-graph-p1") & (flat["requested_ctx"] == 185000)
    for col in [c for c in flat.columns if c.startswith(PRIMARY)]:
        flat.loc[at, col] = 100.0
    ratio = tables.times(100.0 / rate(flat, "sglang-graph-p1", 1024))
    ref = summarize.reference_table(REFERENCE)[0]
    collapse = headline.collapse(flat, engine, ref)
    assert collapse.startswith("**What collapses:** nothing: `sglang-graph-p1`")
    assert f"at 1k and 100 at 185k, {ratio} faster." in collapse
    assert "falls" not in collapse and "slower" not in collapse and "same cliff" not in collapse
    alt = headline.alt_text(flat)
    short = tables.num(rate(flat, "sglang-graph-p1", 1024))
    assert f"sglang-graph-p1 rises from {short} to 100 verify steps/s" in alt and "falls" not in alt
    style.apply()
    fig = headline.figure(flat, None, "no cliff")
    (label,) = [t.get_text() for t in fig.axes[0].texts if "cliff" in t.get_text()]
    assert label.startswith("no cliff: sglang-graph-p1") and f"({ratio} faster)" in label
    plt.close(fig)


def tied(sweep: pd.DataFrame, server: str, like: str, ctx: int) -> pd.DataFrame:
    """``sweep`` with ``server``'s verify steps/s at ``ctx`` (median, min and max) those of
    ``like`` there: the two tie exactly."""
    return copied(sweep, server, like, ctx, 1.0)


def test_servers_that_tie_as_fastest_are_said_to_tie(sweep) -> None:
    """Where two servers' rates tie exactly, the sentence names both and says they tie: neither
    is crowned because its name sorts first."""
    two = tied(sweep, "flashinfer-graph-p1", "flashinfer-fa3-graph-p1", 185000)
    text = headline.fastest(two)
    fa3 = [tables.num(rate(two, "flashinfer-fa3-graph-p1", c)) for c in CONTEXTS]
    assert f"`flashinfer-fa3-graph-p1` at 32k–128k ({', '.join(fa3[2:5])} steps/s" in text
    custom = two[(two["backend"] == "custom") & (two["requested_ctx"] == 185000)]
    best = custom.set_index("server")[PRIMARY].idxmax()
    ratio = tables.times(rate(two, "flashinfer-fa3-graph-p1", 185000) / rate(two, best, 185000))
    assert text.endswith(
        f"`flashinfer-fa3-graph-p1` and `flashinfer-graph-p1` tie at 185k ({fa3[5]} steps/s): they "
        f"win there, {ratio} `{best}` at 185k."
    )
    # a custom server among those that tie: no peer leads there
    mixed = tied(sweep, "flashinfer-fa3-graph-p1", "custom-graph-p1", 1024)
    text = headline.fastest(mixed)
    first = tables.num(rate(mixed, "custom-graph-p1", 1024))
    assert f"`flashinfer-fa3-graph-p1` and `custom-graph-p1` tie at 1k ({first} steps/s)" in text
    assert "`custom-graph-p1` at 11k" in text


def test_custom_servers_that_tie_are_named_together(sweep, engine) -> None:
    """Custom servers that tie at the longest context: the peer's lead is over both, and the
    win is theirs together, each one's speedup at the shortest context given."""
    two = tied(sweep, "custom-graph-p1", "custom-sm120-graph-p1", 185000)
    text = headline.fastest(two)
    both = rate(two, "custom-sm120-graph-p1", 185000)
    lead = tables.times(rate(two, "flashinfer-fa3-graph-p1", 185000) / both)
    assert text.endswith(
        f"a peer wins there, {lead} `custom-graph-p1` and `custom-sm120-graph-p1` (tied) at 185k."
    )
    said = headline.win(two, engine)
    ratio = both / rate(two, "sglang-graph-p1", 185000)
    first = rate(two, "custom-graph-p1", 1024) / rate(two, "sglang-graph-p1", 1024)
    second = rate(two, "custom-sm120-graph-p1", 1024) / rate(two, "sglang-graph-p1", 1024)
    assert said.startswith(
        "**What the custom kernel wins:** `custom-graph-p1` and `custom-sm120-graph-p1` tie at "
        f"{tables.num(both)} verify steps/s at 185k, {tables.times(ratio)} `sglang-graph-p1` "
        f"(at 1k: `custom-graph-p1` {tables.times(first)}, "
        f"`custom-sm120-graph-p1` {tables.times(second)})"
    ), said
    assert f"runs {tables.num(both)}" not in said
