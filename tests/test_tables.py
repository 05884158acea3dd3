"""The end-to-end headline table (analysis/tables.py): a row per server, a column per context."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodecliff.analysis import tables


def point(server: str, ctx: int, rate: float | None, status: str = "ok", k: int = 1) -> dict:
    lo, hi = (None, None) if rate is None else (0.9 * rate, 1.1 * rate)
    return {"server": server, "backend": server.split("-")[0], "requested_ctx": ctx,
            "status": status, "concurrency": k, tables.PRIMARY: rate,
            f"{tables.PRIMARY}_min": lo, f"{tables.PRIMARY}_max": hi}  # fmt: skip


def test_rows_are_servers_fastest_at_the_longest_context_first() -> None:
    sweep = pd.DataFrame(
        [
            point("triton-graph", 1024, 50.0),
            point("triton-graph", 8192, 5.0),
            point("custom-graph", 1024, 100.0),
            point("custom-graph", 8192, 40.0),
            point("flashinfer-graph", 1024, 90.0),
            point("flashinfer-graph", 8192, 60.0),
            point("custom-eager", 1024, None, status="failed"),
            point("custom-k4", 1024, 30.0, k=4),
        ]  # fmt: skip
    )
    table = tables.sweep_headline(sweep, "triton-graph")
    assert list(table.columns) == ["1k (1,024)", "8k (8,192)"]
    assert list(table.index) == [
        "flashinfer-graph", "custom-graph", "triton-graph", "custom-k4 (4 streams)", "custom-eager"
    ]  # fmt: skip
    # median (min–max), then the speedup over the baseline's median at the same context
    assert table.loc["custom-graph", "8k (8,192)"] == "40 (36–44) · 8x"
    assert table.loc["flashinfer-graph", "1k (1,024)"] == "90 (81–99) · 1.8x"
    assert table.loc["triton-graph", "1k (1,024)"] == "50 (45–55)"  # the baseline itself
    assert table.loc["custom-eager", "1k (1,024)"] == "failed"
    assert table.loc["custom-eager", "8k (8,192)"] == "not in the sweep"
    # 4 streams are not compared with one
    assert table.loc["custom-k4 (4 streams)", "1k (1,024)"] == "30 (27–33)"


def test_servers_without_the_longest_context_are_ordered_by_the_next_one() -> None:
    sweep = pd.DataFrame(
        [
            point("a", 1024, 10.0),
            point("b", 1024, 30.0),
            point("c", 1024, 20.0),
            point("c", 8192, 1.0),
            point("d", 1024, None, status="failed"),
        ]  # fmt: skip
    )
    assert list(tables.sweep_headline(sweep, None).index) == ["c", "b", "a", "d"]
    nothing = pd.DataFrame(
        [point("x", 1024, None, status="failed"), point("y", 64, None, "skipped")]
    )
    assert list(tables.sweep_headline(nothing, None).index) == ["x", "y"]


def test_a_failed_point_s_partial_rate_gives_no_tok_s_at_tau() -> None:
    """A failed point may carry its failing request's rate: every rate of its line reads
    'failed', tok/s at tau too."""
    sweep = pd.DataFrame([point("a", 1024, 2.0), point("a", 8192, 0.5, status="failed")])
    long = tables.sweep_long(sweep, 3.0).set_index("context")
    assert long.loc["1k", "tok/s at tau=3"] == "6"
    assert long.loc["8k", "verify steps/s (client)"] == "failed"
    assert long.loc["8k", "tok/s at tau=3"] == "failed"


def test_a_failed_point_gives_no_speedup_even_with_a_partial_rate() -> None:
    """A failed point may carry its failing request's rate; it is compared with nothing."""
    sweep = pd.DataFrame(
        [
            point("base", 1024, 5.0, status="failed"),
            point("base", 8192, 5.0),
            point("fast", 1024, 40.0),
            point("fast", 8192, 20.0, status="failed"),
        ]  # fmt: skip
    )
    table = tables.sweep_headline(sweep, "base")
    assert table.loc["fast", "1k (1,024)"] == "40 (36–44)"
    assert table.loc["fast", "8k (8,192)"] == "failed"
    speed = tables.sweep_speedup(sweep, "base")
    assert speed["speedup"].isna().all()


def test_flashinfer_s_sm120_configuration_is_one_sentence_from_its_table(tmp_path) -> None:
    published = Path(__file__).resolve().parents[1] / "results/published/h200"
    check = published / "tables/kernels/flashinfer_sm120.csv"
    if check.is_file():
        row = pd.read_csv(check).iloc[0]
        text = tables.flashinfer_sm120(check)
        assert f"in {int(row['smem_per_block']):,} B of shared memory per block (fits" in text
    skipped = tmp_path / "skipped.csv"
    skipped.write_text("status,reason\nskipped,no flashinfer_sm120 JSON given\n")
    assert tables.flashinfer_sm120(skipped).endswith("skipped: no flashinfer_sm120 JSON given.")
    assert "not checked" in tables.flashinfer_sm120(tmp_path / "none.csv")


def test_a_large_speedup_reads_without_an_exponent() -> None:
    sweep = pd.DataFrame([point("base", 1024, 0.1), point("fast", 1024, 123.4)])
    table = tables.sweep_headline(sweep, "base")
    assert table.loc["fast", "1k (1,024)"] == "123 (111–136) · 1,234x"


def test_a_speedup_near_1_keeps_the_digits_that_show_it() -> None:
    """The cells' speedups are worded by tables.times, as every speedup the analysis prints: a
    server 0.05% slower than the baseline is 0.9995x, not '1x'."""
    sweep = pd.DataFrame(
        [point("base", 1024, 100.0), point("near", 1024, 99.95), point("far", 1024, 5873.0)]
    )
    table = tables.sweep_headline(sweep, "base")
    assert table.loc["near", "1k (1,024)"].endswith(" · 0.9995x")
    assert table.loc["far", "1k (1,024)"].endswith(f" · {tables.times(58.73)}")  # '59x'


def test_the_baseline_is_a_triton_server_the_one_stream_servers_compare_to() -> None:
    """Speedups are taken at equal streams: a Triton server of four streams, first by name, was
    the table's baseline and left every one-stream server without a speedup."""
    sweep = pd.DataFrame(
        [
            point("custom-p1", 1024, 50.0),
            point("custom-p1-k4", 1024, 80.0, k=4),
            point("triton-k4-p1", 1024, 20.0, k=4),
            point("triton-p1", 1024, 10.0),
        ]
    )
    base = tables.baseline_server(sweep)
    assert base == "triton-p1"
    table = tables.sweep_headline(sweep, base)
    assert table.loc["custom-p1", "1k (1,024)"].endswith(" · 5x")
    # a study with no one-stream Triton server still has its Triton baseline
    assert tables.baseline_server(sweep[sweep["server"] != "triton-p1"]) == "triton-k4-p1"


def test_the_baseline_serves_as_sglang_does_with_cuda_graphs_and_no_defragmentation() -> None:
    """Among one-stream Triton servers, the one with CUDA graphs (as the headline's baseline)
    and without defragmentation, whatever their names' order; the first by name among equals."""
    rows = [
        point("custom-graph-p1", 1024, 50.0) | {"cuda_graph": True, "defrag": False},
        point("triton-a-defrag-graph-p1", 1024, 9.0) | {"cuda_graph": True, "defrag": True},
        point("triton-b-p1", 1024, 5.0) | {"cuda_graph": False, "defrag": False},
        point("triton-c-graph-p1", 1024, 10.0) | {"cuda_graph": True, "defrag": False},
        point("triton-d-graph-p1", 1024, 10.0) | {"cuda_graph": True, "defrag": False},
    ]
    assert tables.baseline_server(pd.DataFrame(rows)) == "triton-c-graph-p1"
    eager = [r for r in rows if not r["cuda_graph"] or r["server"].startswith("custom")]
    assert tables.baseline_server(pd.DataFrame(eager)) == "triton-b-p1"
    assert tables.baseline_server(pd.DataFrame(rows), "triton-b-p1") == "triton-b-p1"  # named


def test_the_baseline_prefers_one_stream_then_no_defragmentation_then_graphs() -> None:
    """The baseline's preferences in order: one stream (speedups are taken at equal streams),
    then no defragmentation, then CUDA graphs; a defragmenting one-stream Triton server beats a
    four-stream one with graphs, and a four-stream one without defragmentation beats one with."""
    rows = [
        point("custom-p1", 1024, 50.0) | {"cuda_graph": False, "defrag": False},
        point("triton-a-graph-k4", 1024, 9.0, k=4) | {"cuda_graph": True, "defrag": False},
        point("triton-b-defrag-p1", 1024, 5.0) | {"cuda_graph": False, "defrag": True},
    ]
    assert tables.baseline_server(pd.DataFrame(rows)) == "triton-b-defrag-p1"
    four = [
        point("triton-a-defrag-k4", 1024, 9.0, k=4) | {"cuda_graph": False, "defrag": True},
        point("triton-b-k4", 1024, 5.0, k=4) | {"cuda_graph": False, "defrag": False},
    ]
    assert tables.baseline_server(pd.DataFrame(four)) == "triton-b-k4"


def test_tokens_per_verify_step_are_said_as_the_points_record_them() -> None:
    """What the notebooks say of tokens/s against verify steps/s is the points' acceptance: equal
    where every point accepted no draft (1 token per verify step), verify steps/s times the
    measured tokens per verify step where they accepted more, and possibly different where no
    point records its acceptance."""
    from decodecliff.analysis import summarize

    data = Path(__file__).resolve().parent / "data"
    none = summarize.load_study(data / "study").sweep  # 1 token per verify step
    accepted = summarize.load_study(data / "published").sweep  # 2 tokens per verify step
    said = tables.tokens_said(none)
    assert said.startswith("Random weights accept no draft (1 token per verify step")
    assert "tokens/s equal verify steps/s" in said
    said = tables.tokens_said(accepted)
    assert "no draft" not in said and "equal" not in said
    assert "measured: 2 tokens per verify step" in said and "times that" in said
    said = tables.tokens_said(none.drop(columns="spec_accept_length"))
    assert "no draft" not in said and "record no acceptance" in said
    # a point accepting more than the bonus token is enough to take back 'no draft'
    more = none.copy()
    first = tables.ok(more).dropna(subset=[tables.PRIMARY]).index[0]
    more.loc[first, "spec_accept_length"] = 1.5
    assert "measured: 1–1.5 tokens per verify step" in tables.tokens_said(more)


def test_the_report_and_the_notes_say_drafts_were_accepted_by_one_rule() -> None:
    """A point at 1.002 tokens per verify step reads 1: the report said drafts were accepted
    ('measured: 1 tokens per verify step ... times that') where the notes, reading the median,
    said tokens/s equal verify steps/s. Both now say it as tables.acceptance_said does."""
    from decodecliff.analysis import notes, summarize

    sweep = summarize.load_study(Path(__file__).resolve().parent / "data" / "study").sweep
    drawn = tables.ok(sweep).dropna(subset=[tables.PRIMARY]).index
    sweep.loc[drawn[0], "spec_accept_length"] = 1.002
    assert tables.acceptance_said(sweep) == tables.NO_DRAFT
    assert notes.acceptance(sweep) == {"accept": "1", "accepted": False}
    sweep.loc[drawn, "spec_accept_length"] = 2.0  # every point drawn: the notes agree again
    assert tables.acceptance_said(sweep) == "measured: 2 tokens per verify step"
    assert notes.acceptance(sweep) == {"accept": "2", "accepted": True}
