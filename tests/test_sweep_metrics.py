"""Metric arithmetic on recorded streams, and the exact-length prompts."""

from __future__ import annotations

import pytest

from decodecliff.analysis import summarize
from decodecliff.sweep import client, metrics, prompts


def test_one_token_per_chunk():
    events = [(0.5, 1), (0.6, 2), (0.8, 3), (0.9, 4)]
    m = metrics.compute(events, prompt_tokens=1000, e2e_s=0.95)
    assert m["ttft_s"] == 0.5
    assert m["prefill_tok_s"] == pytest.approx(2000.0)
    assert m["completion_tokens"] == 4
    assert m["decode_wall_s"] == pytest.approx(0.4)
    assert m["decode_tok_s"] == pytest.approx(3 / 0.4)
    assert m["tpot_ms"] == pytest.approx((0.95 - 0.5) / 3 * 1e3)
    assert m["itl_ms_p50"] == pytest.approx(100.0)
    assert m["itl_ms_mean"] == pytest.approx(400.0 / 3)
    assert m["itl_ms_p99"] == pytest.approx(198.0)  # linear interpolation of [100, 100, 200]
    assert m["e2e_s"] == 0.95
    assert m["token_chunks"] == 4


def test_several_tokens_per_chunk_split_the_gap_evenly():
    # A verify step that accepts 3 tokens in 0.3 s gives three ITL samples of 100 ms.
    events = [(1.0, 1), (1.3, 4), (1.5, 5)]
    assert metrics.itl_samples(events) == pytest.approx([0.1, 0.1, 0.1, 0.2])
    m = metrics.compute(events, prompt_tokens=10, e2e_s=1.5)
    assert m["itl_ms_p50"] == pytest.approx(100.0)
    assert m["itl_ms_p90"] == pytest.approx(170.0)
    assert m["decode_tok_s"] == pytest.approx(4 / 0.5)
    assert m["tpot_ms"] == pytest.approx(125.0)
    assert metrics.compute(events, prompt_tokens=10)["tpot_ms"] is None  # stream cut short
    assert m["token_chunks"] == 3


def test_itl_samples_sum_to_the_decode_wall_time():
    events = [(0.25, 2), (0.5, 5), (0.55, 6), (1.75, 10)]
    m = metrics.compute(events, prompt_tokens=5)
    assert sum(metrics.itl_samples(events)) == pytest.approx(m["decode_wall_s"])
    assert len(metrics.itl_samples(events)) == 10 - 2


def test_single_token_has_no_decode_metrics():
    m = metrics.compute([(0.2, 1)], prompt_tokens=64, e2e_s=0.25)
    assert m["ttft_s"] == 0.2
    assert m["prefill_tok_s"] == pytest.approx(320.0)
    assert m["completion_tokens"] == 1
    assert m["decode_wall_s"] == 0.0
    for key in ("decode_tok_s", "tpot_ms", "itl_ms_mean", "itl_ms_p50", "itl_ms_p99"):
        assert m[key] is None, key


def test_chunks_without_new_tokens_roll_into_the_next_gap():
    events = [(0.3, 1), (0.4, 1), (0.6, 2)]
    assert metrics.itl_samples(events) == pytest.approx([0.3])
    assert metrics.compute(events, 8)["token_chunks"] == 2


def test_empty_stream_and_reported_totals():
    m = metrics.compute([], prompt_tokens=None)
    assert m["ttft_s"] is None and m["completion_tokens"] == 0 and m["prefill_tok_s"] is None
    # A final usage total larger than the counted chunks wins (OpenAI streams without usage).
    m = metrics.compute([(0.1, 1), (0.2, 2)], prompt_tokens=4, e2e_s=0.3, completion_tokens=3)
    assert m["completion_tokens"] == 3
    assert m["decode_tok_s"] == pytest.approx(2 / 0.1)


def test_time_going_backwards_is_an_error():
    with pytest.raises(ValueError, match="must not decrease"):
        metrics.compute([(0.5, 1), (0.4, 2)], prompt_tokens=1)


def test_prompts_are_exact_unique_and_reproducible():
    ids = prompts.IdRange(0, 50, "server_info")
    a = prompts.make_input_ids(1000, ids, seed=1, ctx=1000)
    assert len(a) == 1000 and min(a) >= 0 and max(a) < 50
    assert a == prompts.make_input_ids(1000, ids, seed=1, ctx=1000)
    b = prompts.make_input_ids(2000, ids, seed=1, ctx=2000)
    c = prompts.make_input_ids(1000, ids, seed=2, ctx=1000)
    assert b[:16] != a[:16] and c[:16] != a[:16]  # no shared prefix for a cache to reuse
    with pytest.raises(ValueError, match="at least 1"):
        prompts.make_input_ids(0, ids, seed=1, ctx=0)


def test_id_range_prefers_the_server_then_the_option_then_a_default():
    assert prompts.id_range(1024, 5000) == prompts.IdRange(0, 1024, "server_info")
    assert prompts.id_range(None, 5000) == prompts.IdRange(0, 5000, "--vocab-size")
    assert prompts.id_range(None, None) == prompts.IdRange(*prompts.DEFAULT_ID_RANGE, "default")
    with pytest.raises(ValueError, match="at least 2"):
        prompts.id_range(None, 1)


def test_step_rates_from_the_client_clock_and_the_server_step_times():
    m = {"decode_wall_s": 2.0}
    rates = metrics.step_rates(m, {"spec_verify_ct": 10, "verify_step_ms": 125.0})
    assert rates == {
        "verify_steps": 10,
        "verify_steps_s_client": 5.0,
        "verify_step_ms_server": 125.0,
        "verify_steps_s_server": 8.0,
    }
    # without speculation SGLang says spec_verify_ct 0: the decode steps count
    plain = metrics.step_rates(m, {"spec_verify_ct": 0, "decode_steps": 4, "decode_step_ms": 50})
    assert plain["verify_steps"] == 4 and plain["verify_steps_s_client"] == 2.0
    assert plain["verify_steps_s_server"] == 20.0
    # a server that reports neither (a plain OpenAI server): nothing is made up
    assert set(metrics.step_rates(m, {}).values()) == {None}


def test_point_summary_is_the_median_over_requests_with_their_counts():
    reqs = [
        {"metrics": {"decode_tok_s": v, "verify_steps": 5, "completion_tokens": 6}}
        for v in (3.0, 1.0, 2.0, 100.0)
    ]
    s = metrics.point_summary(reqs)
    assert s["decode_tok_s"] == 2.5  # one slow or fast request does not set the number
    assert s["requests"] == 4 and s["verify_steps"] == 20
    assert s["ttft_s"] is None  # not recorded: no number invented


@pytest.mark.parametrize(
    ("value", "count", "amount"),
    [
        (3, True, True),
        (3.0, True, True),
        (2.5, False, True),
        (0, True, True),
        (-1, False, False),
        (True, False, False),
        (float("nan"), False, False),
        (float("inf"), False, False),
        (10**400, False, False),  # json reads integers of up to 4,300 digits
        (1e300, False, True),
        ("3", False, False),
        (None, False, False),
    ],
)
def test_what_a_server_may_report_as_a_count_or_an_amount(value, count, amount):
    assert (metrics.is_count(value), metrics.is_amount(value)) == (count, amount)
    figures, notes = metrics.server_figures({"spec_verify_ct": value, "verify_step_ms": value})
    assert figures["spec_verify_ct"] == (int(value) if count else None)
    assert figures["verify_step_ms"] == (value if amount else None)
    assert len(notes) == (value is not None) * ((not count) + (not amount))


def test_a_stream_chunk_with_a_count_that_is_not_one_is_a_malformed_chunk():
    rec = client.StreamRecord()
    for bad in (10**400, -1, 1.5, True):
        with pytest.raises(ValueError, match="completion_tokens is .*not a token count"):
            client._fold(rec, "generate", {"meta_info": {"completion_tokens": bad}}, 0)
    assert client._fold(rec, "generate", {"meta_info": {"completion_tokens": 4.0}}, 0) == 4


def test_an_old_point_s_figures_of_the_wrong_kind_give_no_rates():
    point = {"status": "ok", "metrics": {"decode_wall_s": 2.0, "completion_tokens": 8}}
    point["meta_info"] = {"spec_verify_ct": 1.5, "verify_step_ms": -3}
    (req,) = summarize.point_requests(point)
    assert (
        req["metrics"]["verify_steps"] is None and req["metrics"]["verify_step_ms_server"] is None
    )
    point["meta_info"] = {"spec_verify_ct": 4, "verify_step_ms": 125.0}
    (req,) = summarize.point_requests(point)
    assert req["metrics"]["verify_steps_s_client"] == 2.0 and req["metrics"]["verify_steps"] == 4
