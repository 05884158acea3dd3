"""A server's attention per step is its own kernel's time: the variant it ran, not the fastest."""

from __future__ import annotations

import pandas as pd

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
