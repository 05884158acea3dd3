"""The real server (tiny preset, CPU) driven by the real `openai` client and by the raw request
shapes SGLang's, vLLM's and GuideLLM's benchmark clients send; error shapes and faults."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from test_server import Server, server

from decodecliff.server import protocol, tokenizer
from decodecliff.server.tokenizer import ByteTokenizer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
IDS = [(11 * i) % 500 + 1 for i in range(40)]


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with server("--max-total-tokens", "4096", "--chunk-size", "64") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv) -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def native(srv: Server, ids: list[int], tokens: int, **sp) -> dict:
    sp = {"max_new_tokens": tokens, "ignore_eos": True, **sp}
    body = {"input_ids": ids, "sampling_params": sp}
    resp = srv.post("/generate", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def events(srv: Server, path: str, body: dict) -> list[dict]:
    return [json.loads(e) for e in srv.stream(path, body)]


# OpenAI, through the official client ------------------------------------------------------------
def test_completions_accept_every_prompt_form(client, srv):
    greedy = native(srv, IDS, 8)["text"]
    for prompt in (IDS, [IDS]):
        out = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert [c.text for c in out.choices] == [greedy]
        assert out.usage.prompt_tokens == len(IDS) and out.usage.completion_tokens == 8
    out = client.completions.create(
        model="tiny",
        prompt=[PROMPT, "hi", PROMPT],
        max_tokens=5,
        n=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == list(range(6))
    texts = [c.text for c in out.choices]
    assert texts[0] == texts[1] == texts[4] == texts[5] != texts[2]  # greedy: n copies agree
    assert out.usage.prompt_tokens == 2 * len(PROMPT) + 2 and out.usage.completion_tokens == 30


def test_streamed_completions_end_with_a_usage_chunk(client):
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**kw).choices[0].text
    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks[:-1]) == plain
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"
    bare = list(client.completions.create(**kw, stream=True))
    assert all(c.choices for c in bare)  # no usage chunk unless asked


def test_chat_completions_plain_and_streamed(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    out = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=10, extra_body={"ignore_eos": True}
    )
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    text = out.choices[0].message.content
    assert len(text) == 10 and out.usage.completion_tokens == 10
    stream = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.total_tokens == out.usage.total_tokens


def test_stop_strings_end_the_text_before_them(client, srv):
    full = native(srv, IDS, 30)["text"]
    stop = full[9:12]
    cut = full.index(stop)
    kw = {"model": "tiny", "prompt": IDS, "max_tokens": 30, "stop": [stop, "\x00never"]}
    out = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert out.choices[0].text == full[:cut] and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == cut + len(stop)
    streamed = client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == full[:cut]  # the stop string held back
    kept = client.completions.create(
        **kw, extra_body={"ignore_eos": True, "include_stop_str_in_output": True}
    )
    assert kept.choices[0].text == full[: cut + len(stop)]
    sp = {"max_new_tokens": 30, "stop": stop, "ignore_eos": True}
    body = {"input_ids": IDS, "sampling_params": sp}
    meta = srv.post("/generate", body).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}


def test_a_matched_stop_token_is_left_out_of_the_text_as_sglang_trims_it(client, srv):
    ids = native(srv, IDS, 30)["output_ids"]
    # a stop token first seen at k, before any EOS (id 0: ignore_eos would ignore stop tokens too)
    k = next(i for i in range(3, 30) if 0 not in ids[: i + 1] and ids[i] not in ids[:i])
    want = tokenizer.decode(ids[:k])
    sp = {"max_new_tokens": 30, "stop_token_ids": [ids[k]]}
    out = srv.post("/generate", {"input_ids": IDS, "sampling_params": sp}).json()
    assert out["output_ids"] == ids[: k + 1] and out["text"] == want  # counted, not shown
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]}
    kw = {"model": "tiny", "prompt": IDS, "max_tokens": 30}
    extra = {"stop_token_ids": [ids[k]]}
    done = client.completions.create(**kw, extra_body=extra)
    assert done.choices[0].text == want and done.usage.completion_tokens == k + 1
    streamed = client.completions.create(**kw, stream=True, extra_body=extra)
    assert "".join(c.choices[0].text for c in streamed) == want
    sp["no_stop_trim"] = True
    kept = srv.post("/generate", {"input_ids": IDS, "sampling_params": sp}).json()
    assert kept["text"] == tokenizer.decode(ids[: k + 1])


def test_logprobs_and_echo(client):
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, logprobs=3, extra_body={"ignore_eos": True}
    )
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == 6
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and tok in top and max(top.values()) == pytest.approx(value)  # greedy
    echo = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, echo=True, extra_body={"ignore_eos": True}
    )
    assert echo.choices[0].text == PROMPT + out.choices[0].text
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and len(content[0].top_logprobs) == 2


def test_sampling_parameters_are_honoured(client, srv):
    greedy = native(srv, IDS, 16)["output_ids"]
    seeded = [
        native(srv, IDS, 16, temperature=1.0, sampling_seed=s)["output_ids"] for s in (3, 3, 4)
    ]
    assert seeded[0] == seeded[1] != seeded[2] and seeded[0] != greedy
    assert native(srv, IDS, 16, temperature=1.0, top_k=1)["output_ids"] == greedy
    assert native(srv, IDS, 16, temperature=1.0, top_p=1e-6)["output_ids"] == greedy
    kw = {"model": "tiny", "prompt": IDS, "max_tokens": 16, "extra_body": {"ignore_eos": True}}
    a = client.completions.create(**kw, temperature=0.9, seed=7).choices[0].text
    assert a == client.completions.create(**kw, temperature=0.9, seed=7).choices[0].text


def test_tiny_temperatures_act_as_greedy_beside_other_requests(srv):
    greedy = native(srv, IDS, 20)["output_ids"]
    results = {}

    def run(name: str, temp: float) -> None:
        results[name] = native(srv, IDS, 20, temperature=temp)["output_ids"]

    threads = [
        threading.Thread(target=run, args=a) for a in (("a", 1e-40), ("b", 0.0), ("c", 1e-6))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"a": greedy, "b": greedy, "c": greedy}


REFUSED = [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 1.0}, "frequency_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"best_of": 3}, "best_of"),
    ({"suffix": "x"}, "suffix"),
    ({"n": 0}, "n"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": 10**400}, "temperature"),
    ({"best_of": True}, "best_of"),  # a flag, not the integer 1
    ({"max_tokens": 2, "max_completion_tokens": 2.0}, "max_completion_tokens"),
    ({"logprobs": 99}, "logprobs"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize("extra,param", REFUSED)
def test_unsupported_parameters_are_refused_by_name(client, extra, param):
    with pytest.raises(BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body=extra)
    assert param in err.value.message and err.value.body["param"] == param


def test_unknown_parameters_and_chat_features_are_refused(srv):
    bad = srv.post("/v1/completions", {"prompt": "a", "mystery": 1})
    assert bad.status_code == 400 and "mystery" in bad.json()["error"]["message"]
    msgs = [{"role": "user", "content": "hi"}]
    for extra, param in (
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ):
        resp = srv.post("/v1/chat/completions", {"messages": msgs, **extra})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert srv.post("/v1/chat/completions", {"messages": image}).status_code == 400


def test_a_chat_reply_fed_back_with_its_null_fields_is_taken(srv):
    reply = {"role": "assistant", "content": "yo", "tool_calls": None, "refusal": None}
    msgs = [
        {"role": "user", "content": "hi", "name": None},
        reply,
        {"role": "user", "content": "x"},
    ]
    body = {"messages": msgs, "max_tokens": 2, "ignore_eos": True}
    plain = [{k: v for k, v in m.items() if v is not None} for m in msgs]
    got, want = (srv.post("/v1/chat/completions", {**body, "messages": m}) for m in (msgs, plain))
    assert got.status_code == 200, got.text
    assert got.json()["usage"] == want.json()["usage"]
    assert got.json()["choices"][0]["message"] == want.json()["choices"][0]["message"]
    tools = [reply | {"tool_calls": [{"id": "c", "type": "function"}]}]  # a real one still is not
    bad = srv.post("/v1/chat/completions", {**body, "messages": tools})
    assert bad.status_code == 400 and "tool_calls" in bad.json()["error"]["message"]


def test_models_as_openai_and_vllm_read_them(client, srv):
    # the model's name is its tokenizer's folder: what a benchmark client loads as the tokenizer
    [name] = [m.id for m in client.models.list()]
    assert Path(name).name == "tiny" and (Path(name) / "tokenizer.json").is_file()
    card = srv.get("/v1/models").json()["data"][0]
    assert card["root"] == name and card["max_model_len"] == 4096 and card["owned_by"]
    assert client.models.retrieve(name).id == name == client.models.retrieve("tiny").id
    info = srv.get("/get_model_info").json()
    assert info["model_path"] == info["tokenizer_path"] == name


# SGLang's native API -----------------------------------------------------------------------------
def test_generate_takes_batches_and_answers_lists(srv):
    a, b = native(srv, IDS, 6), native(srv, IDS[:20], 6)
    batch = native(srv, [IDS, IDS[:20]], 6)
    assert [o["output_ids"] for o in batch] == [a["output_ids"], b["output_ids"]]
    assert [o["index"] for o in batch] == [0, 1]
    sps = [{"max_new_tokens": 4, "ignore_eos": True}, {"max_new_tokens": 3, "ignore_eos": True}]
    texts = srv.post("/generate", {"text": ["hi", "there"], "sampling_params": sps}).json()
    assert [o["meta_info"]["completion_tokens"] for o in texts] == [4, 3]
    assert [o["meta_info"]["prompt_tokens"] for o in texts] == [2, 5]
    body = {
        "input_ids": [IDS, IDS[:20]],
        "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
    }
    chunks = events(srv, "/generate", {**body, "stream": True})
    last = {c["index"]: c for c in chunks}
    assert last[0]["output_ids"] == a["output_ids"] and last[1]["output_ids"] == b["output_ids"]
    two = native(srv, IDS, 4, n=2)
    assert len(two) == 2 and two[0]["output_ids"] == two[1]["output_ids"]


def test_meta_info_logprobs_and_server_info(srv):
    body = {
        "input_ids": IDS,
        "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    out = srv.post("/generate", body).json()
    meta = out["meta_info"]
    for key in ("id", "prompt_tokens", "completion_tokens", "finish_reason", "e2e_latency"):
        assert key in meta
    assert meta["spec_verify_ct"] == 0
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert len(meta["output_top_logprobs"][0]) == 2
    for path in ("/get_server_info", "/server_info"):
        state = srv.get(path).json()["internal_states"][0]
        assert "avg_spec_accept_length" in state and state["num_running_reqs"] == 0
    assert srv.get("/health_generate").status_code == 200
    assert (
        srv.get("/flush_cache").status_code == 200
        and srv.post("/flush_cache", {}).status_code == 200
    )


def test_metrics_use_sglang_names(srv):
    native(srv, IDS, 6)
    text = srv.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:spec_accept_length",
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
    ):
        assert name in families, name
    count = lambda f: next(s.value for s in families[f].samples if s.name.endswith("_count"))  # noqa: E731
    assert count("sglang:time_to_first_token_seconds") >= 1
    assert count("sglang:inter_token_latency_seconds") >= 5


def test_a_health_probe_is_not_counted_as_a_served_request(srv):
    """/health_generate runs a token through the engine but is no one's request (SGLang's probe
    is sent with log_metrics=False): a sweep that probes health leaves the counts as they were."""
    served = ("num_requests", "prompt_tokens", "generation_tokens")
    served += ("time_to_first_token_seconds", "e2e_request_latency_seconds")

    def counts() -> dict:
        text = srv.get("/metrics").text
        return {
            n: float(re.search(rf"^sglang:{n}_(?:total|count)\{{.*\}} (\S+)$", text, re.M)[1])
            for n in served
        }

    before = counts()
    assert srv.get("/health_generate").status_code == 200
    assert counts() == before


# The benchmark clients' request shapes, as raw HTTP ----------------------------------------------
def _usage_of(chunks: list[dict]) -> int:
    return chunks[-1]["usage"]["completion_tokens"]


BENCH_SHAPES = {
    "sglang-bench_serving-native": (
        "/generate",
        {
            "input_ids": IDS,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True},
            "stream": True,
            "lora_path": None,
            "return_logprob": False,
            "return_routed_experts": False,
            "logprob_start_len": -1,
        },
    ),
    "sglang-bench_serving-oai": (
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": PROMPT,
            "temperature": 0.0,
            "best_of": 1,
            "max_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    ),
    "sglang-bench_serving-oai-chat": (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPT}],
            "temperature": 0.0,
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    ),
    "vllm-bench-serve-completions": (
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": PROMPT,
            "temperature": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": 7,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    ),
    "vllm-bench-serve-chat": (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
            "temperature": 0.0,
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    ),
    "guidellm-chat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
            "model": "tiny",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 7,
            "max_completion_tokens": 7,
            "stop": None,
            "ignore_eos": True,
        },
    ),
    "guidellm-text": (
        "/v1/completions",
        {
            "prompt": PROMPT,
            "model": "tiny",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 7,
            "max_completion_tokens": 7,
            "stop": None,
            "ignore_eos": True,
        },
    ),
}


@pytest.mark.parametrize("name", sorted(BENCH_SHAPES))
def test_benchmark_clients_request_shapes(srv, name):
    path, body = BENCH_SHAPES[name]
    chunks = events(srv, path, body)
    if path == "/generate":
        assert chunks[-1]["meta_info"]["completion_tokens"] == 7
    else:
        assert _usage_of(chunks) == 7 and chunks[-1]["choices"] == []


def test_generate_takes_every_field_of_sglangs_request(srv):
    # what `bench_serving --backend sglang` sends, with SGLang's routing and tracing fields set
    body = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True},
        "stream": True,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": True,
        "logprob_start_len": -1,
        "rid": "bench-1",
        "priority": 3,
        "custom_labels": {"team": "a"},
        "log_metrics": True,
    }
    with httpx.stream("POST", srv.url + "/generate", json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        warning = resp.headers["warning"]
        resp.read()
    assert "return_routed_experts" in warning and "rid" in warning and "log_metrics" not in warning
    bad = srv.post("/generate", {**body, "return_routed_expertz": True})
    assert bad.status_code == 400 and "return_routed_expertz" in bad.json()["error"]["message"]


def test_openai_sdk_fields_that_change_nothing_are_accepted(client):
    msgs = [{"role": "user", "content": "hi"}]
    for extra in ({"store": False}, {"store": True, "metadata": {"run": "1"}, "user": "u"}):
        resp = client.chat.completions.with_raw_response.create(
            model="tiny", messages=msgs, max_tokens=3, **extra
        )
        assert resp.parse().usage.completion_tokens <= 3
        assert ("store" in resp.headers.get("warning", "")) == extra["store"]


# Fields accepted and ignored still have their API's types: a value of another type is a 400.
BASES = {
    "/generate": {"text": "a", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "a", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2},
}
WRONG_TYPES = [
    ("/v1/chat/completions", {"user": 5}, "user"),
    ("/v1/chat/completions", {"metadata": "run 1"}, "metadata"),
    ("/v1/chat/completions", {"function_call": 3}, "function_call"),
    ("/v1/chat/completions", {"reasoning_effort": True}, "reasoning_effort"),
    ("/v1/chat/completions", {"separate_reasoning": "no"}, "separate_reasoning"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"service_tier": 1}, "service_tier"),
    ("/v1/completions", {"rid": 5}, "rid"),
    ("/v1/completions", {"priority": "high"}, "priority"),
    ("/v1/completions", {"store": "yes"}, "store"),
    ("/generate", {"rid": ["a", 1]}, "rid"),
    ("/generate", {"custom_labels": ["a"]}, "custom_labels"),
    ("/generate", {"routed_experts_start_len": "0"}, "routed_experts_start_len"),
    ("/generate", {"bootstrap_port": "8998"}, "bootstrap_port"),
    ("/generate", {"received_time": "now"}, "received_time"),
    ("/generate", {"need_wait_for_mm_inputs": 1}, "need_wait_for_mm_inputs"),
    ("/generate", {"sampling_params": {"max_new_tokens": 2, "stream_interval": 1.5}},
     "sampling_params.stream_interval"),
]  # fmt: skip


@pytest.mark.parametrize("path,field,param", WRONG_TYPES)
def test_fields_that_change_nothing_are_still_typed(srv, path, field, param):
    resp = srv.post(path, {**BASES[path], **field})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param} must be"), err
    assert srv.get("/health").status_code == 200


def test_every_ignored_field_has_a_type_its_default_and_its_values_pass():
    ignored = {**protocol.GENERATE_IGNORED, **protocol.SAMPLING_IGNORED, **protocol.CHAT_IGNORED}
    assert set(protocol.IGNORED_TYPES) == set(ignored)
    lim = protocol.Limits(vocab_size=512, max_tokens=4096, tokenizer=ByteTokenizer(512))
    good = {  # a value of each type, as SGLang's and OpenAI's clients send them
        "true or false": True,
        "an integer": 3,
        "a number": 1.5,
        "a string": "x",
        "an object": {"k": "v"},
        "a list": [[1, 2]],
        "a string or a list of strings": ["x", "y"],
        "an integer or a list of integers": [1, None],
        "true or false, or a list of them": [True, False],
        "a string or a number": "low",
        "a string or an object": {"name": "f"},
    }
    for key, kind in protocol.IGNORED_TYPES.items():
        check = protocol.JSON_TYPES[kind]
        assert ignored[key] is None or check(ignored[key]), key
        if key in protocol.SAMPLING_IGNORED:
            body = {"text": "a", "sampling_params": {key: good[kind]}}
            protocol.parse_generate(body, lim)
        if key in protocol.GENERATE_IGNORED:
            protocol.parse_generate({"text": "a", key: good[kind]}, lim)
        if key in protocol.OPENAI_IGNORED:
            protocol.parse_completions({"prompt": "a", key: good[kind]}, lim)
        if key in protocol.CHAT_IGNORED:
            protocol.parse_chat(
                {"messages": [{"role": "user", "content": "a"}], key: good[kind]}, lim
            )


def test_optional_flags_and_counts_given_as_null_take_their_defaults(srv):
    # SGLang's GenerateReqInput has return_logprob = None; OpenAI's fields are "boolean or null"
    sp = {"max_new_tokens": 2, "n": None, "no_stop_trim": None}
    body = {"input_ids": IDS, "sampling_params": sp, "return_logprob": None, "stream": None}
    resp = srv.post("/generate", body)
    assert resp.status_code == 200, resp.text
    assert "output_token_logprobs" not in resp.json()["meta_info"]
    nulls = {"include_stop_str_in_output": None, "no_stop_trim": None, "max_tokens": 2}
    resp = srv.post("/v1/completions", {"prompt": "a", **nulls})
    assert resp.status_code == 200, resp.text
    msgs = [{"role": "user", "content": "hi"}]
    resp = srv.post(
        "/v1/chat/completions", {"messages": msgs, "add_generation_prompt": None, **nulls}
    )
    assert resp.status_code == 200, resp.text
    opts = {"include_usage": None, "continuous_usage_stats": None}
    body = {"prompt": "a", "max_tokens": 2, "stream": True, "stream_options": opts}
    assert all(c.get("usage") is None for c in events(srv, "/v1/completions", body))


def test_a_chat_asking_for_text_output_alone_is_served(client, srv):
    msgs = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=3, modalities=["text"]
    )
    assert chat.usage.completion_tokens <= 3
    for other in (["text", "audio"], ["audio"], "text"):
        resp = srv.post("/v1/chat/completions", {"messages": msgs, "modalities": other})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "modalities"


def retractions(srv) -> float:
    """The server's count of running requests sent back to the queue (its /metrics)."""
    found = re.search(r"^sglang:num_retractions_total\{.*\} (\S+)$", srv.get("/metrics").text, re.M)
    return float(found[1])


def test_a_chat_whose_prompt_fills_the_pool_is_told_so(srv):
    """Not "prompt + max_new_tokens (1)": the client named no such parameter."""
    body = {"messages": [{"role": "user", "content": "x" * 5000}]}
    resp = srv.post("/v1/chat/completions", body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "messages"
    assert "leaves no room to generate in max_total_num_tokens (4096)" in error["message"]
    assert "max_new_tokens" not in error["message"]
    resp = srv.post("/v1/completions", {"prompt": [1] * 4000, "max_tokens": 200})
    assert resp.status_code == 400 and "200 tokens to generate" in resp.text
    assert "max_new_tokens" not in resp.text


@pytest.mark.slow  # a long chat streams beside the short requests
def test_a_chat_without_max_tokens_leaves_room_for_the_others(srv):
    # Without max_tokens a chat request generates at most its fair share of the pool (pool / max
    # running requests), not the whole pool, so short requests run beside it instead of waiting
    # for it (they all end before it) or being retracted for it (the server counts none). Their
    # latency beside it is not asserted: a wall-clock ratio follows the machine's other load.
    done: list[str] = []
    msgs = [{"role": "user", "content": "tell me everything"}]

    def long_chat() -> None:
        body = {"messages": msgs, "ignore_eos": True, "stream": True}
        chunks = events(srv, "/v1/chat/completions", body)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        done.append("chat")

    def shorts() -> None:
        """16 concurrent short requests, each noted in ``done`` as it ends."""

        def short(i: int) -> None:
            native(srv, IDS[i:], 4)
            done.append("short")

        threads = [threading.Thread(target=short, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    shorts()
    done.clear()
    retracted = retractions(srv)
    chat = threading.Thread(target=long_chat)
    chat.start()
    while srv.get("/get_server_info").json()["running_requests"] == 0 and chat.is_alive():
        time.sleep(0.01)
    shorts()
    chat.join(120)
    assert done == ["short"] * 16 + ["chat"]
    assert retractions(srv) == retracted
    body = {"messages": msgs, "ignore_eos": True}
    out = srv.post("/v1/chat/completions", body).json()
    assert out["usage"]["completion_tokens"] == 4096 // 8  # the fair share of this pool


def test_the_served_tokenizer_round_trips_the_servers_ids(srv):
    tokenizers = pytest.importorskip("tokenizers")
    name = srv.get("/v1/models").json()["data"][0]["id"]
    tok = tokenizers.Tokenizer.from_file(str(Path(name) / "tokenizer.json"))
    out = native(srv, IDS, 40)
    assert tok.decode(out["output_ids"]) == out["text"]
    assert tok.encode(out["text"]).ids == out["output_ids"]
    assert (
        len(tok.encode(PROMPT).ids)
        == srv.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}).json()[
            "meta_info"
        ]["prompt_tokens"]
    )


def test_auto_tokenizer_loads_the_model_name(srv):
    transformers = pytest.importorskip("transformers")  # what GuideLLM, AIPerf, bench_serving use
    name = srv.get("/v1/models").json()["data"][0]["id"]
    tok = transformers.AutoTokenizer.from_pretrained(name)
    out = native(srv, IDS, 40)
    assert tok.decode(out["output_ids"]) == out["text"]
    assert tok.encode(out["text"], add_special_tokens=False) == out["output_ids"]


def test_bench_one_batch_server_flow(srv):
    srv.post("/flush_cache", {})
    body = {
        "input_ids": [IDS] * 3,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
        "return_logprob": False,
        "stream": True,
    }
    chunks = events(srv, "/generate", body)
    final = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"]}
    assert sorted(final) == [0, 1, 2]
    assert all(c["meta_info"]["completion_tokens"] == 5 for c in final.values())
    info = srv.get("/get_server_info").json()
    assert "avg_spec_accept_length" in info["internal_states"][0]


# errors and faults -------------------------------------------------------------------------------
def test_errors_are_json_in_openai_shape(srv):
    for resp, status in (
        (srv.get("/nowhere"), 404),
        (httpx.delete(srv.url + "/generate"), 405),
        (srv.get("/v1/models/other"), 404),
    ):
        assert resp.status_code == status
        err = resp.json()["error"]
        assert err["code"] == status and err["message"] and "type" in err and "param" in err
    charset = httpx.post(
        srv.url + "/generate",
        content=b'{"text": "hi"}',
        headers={"Content-Type": "application/json; charset=klingon"},
    )
    assert charset.status_code == 400 and "charset" in charset.json()["error"]["message"]
    deep = httpx.post(srv.url + "/generate", content=b"[" * 200_000, timeout=30)
    assert deep.status_code == 400 and "nested" in deep.json()["error"]["message"]


def test_a_huge_body_is_refused_without_stalling_health(srv):
    stalls: list[float] = []
    statuses: list[int] = []  # asserted here: a failed assert in the thread would only warn
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            start = time.monotonic()
            statuses.append(srv.get("/health").status_code)
            stalls.append(time.monotonic() - start)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        resp = httpx.post(srv.url + "/generate", content=b" " * (50 * 2**20), timeout=60)
    except httpx.HTTPError:
        resp = None  # the server may close the connection before the upload ends
    stop.set()
    poller.join(30)
    assert resp is None or resp.status_code == 413
    assert statuses and set(statuses) == {200}
    assert max(stalls) < 1.0
    assert srv.get("/health").status_code == 200  # and it is still up


def _idle(srv: Server, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = srv.get("/get_server_info").json()
        if info["running_requests"] == 0 and info["waiting_requests"] == 0:
            break
        time.sleep(0.05)
    return info


def _counter(srv: Server, name: str) -> float:
    found = re.search(rf"^sglang:{name}_total\{{.*\}} (\S+)$", srv.get("/metrics").text, re.M)
    return float(found[1])


def test_a_plain_client_that_disconnects_cancels_its_request(srv):
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    counts = {n: _counter(srv, n) for n in ("num_requests", "num_aborted_requests")}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/generate", json=body, timeout=1.0)
    start = time.monotonic()
    info = _idle(srv)
    assert info["running_requests"] == 0 and time.monotonic() - start < 5
    frag = info["fragmentation"]
    assert frag["free_pages"] == frag["num_pages"]
    # counted as an aborted request, as its help says
    assert {n: _counter(srv, n) - c for n, c in counts.items()} == {
        "num_requests": 1, "num_aborted_requests": 1,
    }  # fmt: skip


def test_tokens_a_departed_client_never_read_are_counted_as_generated(srv):
    """A stream its client stops reading (cumulative logprobs fill the socket's buffers after a
    hundred tokens or so) runs to its end in the engine; the client then leaves. Every token the
    engine made is a generated token, though most never reached the client."""
    body = {"input_ids": IDS, "stream": True, "return_logprob": True, "top_logprobs_num": 20}
    body = json.dumps({**body, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
    counts = {n: _counter(srv, n) for n in ("num_requests", "generation_tokens")}
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
        while srv.get("/get_server_info").json()["running_requests"] == 0:
            time.sleep(0.02)  # admitted
        _idle(srv, timeout=120)  # and run to its end
    while _counter(srv, "num_requests") == counts["num_requests"]:
        time.sleep(0.05)  # the handler has seen the client leave
    assert _counter(srv, "generation_tokens") - counts["generation_tokens"] == 400
