"""A server's attention per step is its own kernel's time: the variant it ran, not the fastest."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from published_study import copy_study, fail_points

from decodecliff.analysis import notes, summarize, tables
from decodecliff.analysis.notes import _attention_ms


def kernels() -> pd.DataFrame:
    row = {"backend": "flashinfer", "mode": "chain16", "heads": 8, "page_size": 1,
           "ctx": 185000, "status": "ok"}  # fmt: skip
    return pd.DataFrame([
        {**row, "series": "flashinfer (fa2)", "ms": 0.226},
        {**row, "series": "flashinfer (fa3)", "ms": 0.121},
    ])  # fmt: skip


def test_the_servers_variant_picks_its_series() -> None:
    assert _attention_ms(kernels(), "flashinfer", 1, 185000, "fa2")["ms"] == 0.226
    assert _attention_ms(kernels(), "flashinfer", 1, 185000, "fa3")["ms"] == 0.121


def test_without_a_variant_the_fastest_series_stands_in() -> None:
    assert _attention_ms(kernels(), "flashinfer", 1, 185000)["ms"] == 0.121
    assert _attention_ms(kernels(), "flashinfer", 1, 185000, "v9")["ms"] == 0.121


def test_a_servers_variant_comes_from_its_backends_description() -> None:
    from decodecliff.analysis.summarize import _variant

    assert _variant({"backend": "flashinfer", "variant": "fa2"}) == "fa2"
    assert _variant({"backend": "sglang", "kernel": "extend"}) == "extend"  # recorded before
    assert _variant({"backend": "triton", "arch_config": "sm90"}) == "sm90"
    assert _variant({"backend": "torch"}) is None


def test_a_server_run_as_on_sm120_takes_only_the_series_timed_that_way() -> None:
    row = kernels().iloc[0].to_dict()
    modelled = pd.concat(
        [kernels(), pd.DataFrame([{**row, "series": "flashinfer (fa2-sm120)", "ms": 0.553}])]
    )
    assert _attention_ms(modelled, "flashinfer", 1, 185000, "fa2", "sm120")["ms"] == 0.553
    assert _attention_ms(kernels(), "flashinfer", 1, 185000, "fa2", "sm120") is None  # not timed
    # and no server on the GPU's own resources takes the sm_120 series, not even as the fastest
    slow = modelled.assign(ms=[0.3, 0.4, 0.1])
    assert _attention_ms(slow, "flashinfer", 1, 185000)["series"] == "flashinfer (fa2)"


def test_a_server_on_auto_takes_the_series_auto_ran_not_a_faster_pinned_variant() -> None:
    row = {"backend": "custom", "mode": "chain16", "heads": 8, "page_size": 1, "ctx": 131072,
           "status": "ok"}  # fmt: skip
    timed = pd.DataFrame([
        {**row, "series": "custom", "ms": 0.1914},  # what the auto rule runs
        {**row, "series": "custom (v4)", "ms": 0.1912},  # a pinned variant, a hair faster
    ])  # fmt: skip
    assert _attention_ms(timed, "custom", 1, 128000, "auto")["series"] == "custom"
    assert _attention_ms(timed, "custom", 1, 128000)["series"] == "custom"  # none recorded
    assert _attention_ms(timed, "custom", 1, 128000, "v4")["series"] == "custom (v4)"


def test_a_custom_server_whose_longest_point_failed_cites_auto_s_time(tmp_path: Path) -> None:
    """The published H200 study at 131,072 tokens: custom (v4) timed 0.1912 ms, auto's own
    series 0.1914; a custom server whose longest point is 128k runs the latter."""
    study = copy_study(tmp_path / "study")
    fail_points(study, ["custom-graph-p1"], [185000], "the server died")
    loaded = summarize.load_study(study)
    row = next(r for r in notes.server_rows(loaded) if r["server"] == "custom-graph-p1")
    k = loaded.kernels
    auto = k[(k["series"] == "custom") & (k["mode"] == "chain16") & (k["heads"] == 8)]
    auto = auto[(auto["page_size"] == 1) & (auto["ctx"] == 131072)]["ms"].iloc[0]
    assert row["ctx_label"] == "128k"
    assert (row["attention_series"], row["attention_layer_ms"]) == ("custom", tables.num(auto))
