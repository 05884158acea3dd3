"""`decodecliff serve` as a real subprocess on CPU (tiny preset), driven over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import httpx
import pytest

READY = "decodecliff server ready at http://"


class Server:
    """The server on a port it binds itself (--port 0: no port picked here that another process
    could take first), its URL read from its ready line."""

    def __init__(self, *args: str, stderr: int | IO[str] = subprocess.PIPE) -> None:
        """``stderr``: its log's destination (a file for a log too long for a pipe's buffer)."""
        cmd = [sys.executable, "-m", "decodecliff.cli", "serve", "--preset", "tiny"]
        cmd += ["--device", "cpu", "--port", "0", "--threads", "1", *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=os.environ.copy()
        )
        self.ready_line = self._wait_ready()
        self.url = self.ready_line.strip().removeprefix("decodecliff server ready at ")
        self.port = int(self.url.rsplit(":", 1)[1])

    def _wait_ready(self, timeout: float = 60) -> str:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()))
        reader.start()
        reader.join(timeout)
        if not lines or not lines[0].startswith(READY):
            self.proc.kill()
            said = self.proc.stderr.read() if self.proc.stderr else "(its log: the file given)"
            raise RuntimeError(f"server did not start: {lines} {said}")
        return lines[0]

    def post(self, path: str, body: object, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=60, **kw)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def stream(self, path: str, body: dict) -> list[str]:
        """The raw SSE events ('data: ...' payloads) of a streamed request, checking framing."""
        events = []
        with httpx.stream("POST", self.url + path, json=body, timeout=60) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            raw = resp.read().decode()
        assert raw.endswith("\n\n")
        for block in raw.split("\n\n")[:-1]:
            assert block.startswith("data: "), block
            events.append(block[len("data: ") :])
        assert events[-1] == "[DONE]"
        return events[:-1]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.kill()


@contextmanager
def server(*args: str, stderr: int | IO[str] = subprocess.PIPE) -> Iterator[Server]:
    srv = Server(*args, stderr=stderr)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with server("--max-total-tokens", "4096", "--chunk-size", "64") as s:
        yield s


def gen(srv: Server, ids: list[int], n: int = 12, **extra) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    return srv.post("/generate", {**body, **extra})


PROMPT_A = list(range(3, 140))
PROMPT_B = [(7 * i) % 500 + 1 for i in range(200)]


def test_ready_line_health_and_server_info(srv):
    # --port 0: the ready line names the port the system gave
    ready = srv.ready_line.strip()
    assert re.fullmatch(r"decodecliff server ready at http://127\.0\.0\.1:[1-9]\d*", ready)
    assert srv.get("/health").status_code == 200
    info = srv.get("/get_server_info").json()
    assert info["max_total_num_tokens"] == 4096
    assert info["preset"] == "tiny" and info["backend"] == "torch" and info["page_size"] == 1
    assert info["vocab_size"] == 512 and info["chunked_prefill_size"] == 64
    assert info["speculative_algorithm"] == "none" and info["cuda_graph"] is False
    assert info["prefill_attention"] == "backend"
    assert "request_fragmentation" in info["fragmentation"]
    assert info["env"]["torch"]
    assert srv.post("/flush_cache", {}).status_code == 200


def test_generate_returns_the_requested_tokens(srv):
    resp = gen(srv, PROMPT_A, 12)
    assert resp.status_code == 200
    out = resp.json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 12
    assert meta["prompt_tokens"] == len(PROMPT_A) and meta["cached_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["e2e_latency"] > 0 and meta["decode_step_ms"] > 0
    assert meta["spec_verify_ct"] == 0
    assert len(out["text"]) == 12
    assert gen(srv, PROMPT_A, 12).json()["output_ids"] == out["output_ids"]  # deterministic


def test_stream_is_sse_with_cumulative_output(srv):
    body = {"input_ids": PROMPT_A, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    events = [json.loads(e) for e in srv.stream("/generate", {**body, "stream": True})]
    ids = [e["output_ids"] for e in events]
    assert all(len(a) < len(b) and b[: len(a)] == a for a, b in zip(ids, ids[1:], strict=False))
    assert events[-1]["output_ids"] == gen(srv, PROMPT_A, 12).json()["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert [e["meta_info"]["completion_tokens"] for e in events] == [len(i) for i in ids]
    assert all(len(e["text"]) == len(e["output_ids"]) for e in events)


def test_text_prompt_and_openai_completions(srv):
    out = srv.post("/generate", {"text": "hello world", "sampling_params": {"max_new_tokens": 4}})
    assert out.status_code == 200 and out.json()["meta_info"]["prompt_tokens"] == 11
    body = {"prompt": PROMPT_A, "max_tokens": 12, "ignore_eos": True}
    plain = srv.post("/v1/completions", body).json()
    assert plain["object"] == "text_completion"
    assert plain["usage"] == {
        "prompt_tokens": len(PROMPT_A),
        "completion_tokens": 12,
        "total_tokens": len(PROMPT_A) + 12,
    }
    chunks = [json.loads(e) for e in srv.stream("/v1/completions", {**body, "stream": True})]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == plain["choices"][0]["text"] == gen(srv, PROMPT_A, 12).json()["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


BAD_BODIES = [
    ({}, "exactly one of input_ids or text"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": [1, 2, 512]}, "outside the vocabulary"),
    ({"input_ids": [1, -1]}, "outside the vocabulary"),
    ({"input_ids": "abc"}, "token ids"),
    ({"input_ids": [1, 2.5]}, "integers"),
    ({"input_ids": [[1, 2], []]}, "empty"),
    ({"text": [1, 2]}, "string"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
    ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "regex"),
    ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "sampling_params.bogus"),
    ({"input_ids": [1], "lora_path": "x"}, "lora_path"),
    ({"input_ids": [1], "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
    ({"input_ids": [1], "text": "a"}, "exactly one"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 10**9}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}, "integer"),
    ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature"),
    # an integer too big for a float is out of range, not an internal error
    ({"input_ids": [1], "sampling_params": {"temperature": 10**400}}, "temperature must be in"),
    ({"input_ids": [1], "sampling_params": {"top_p": -(10**400)}}, "top_p must be in"),
    ({"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}, "ignore_eos"),
    ({"input_ids": [1], "sampling_params": []}, "sampling_params"),
    ({"input_ids": [1], "stream": "yes"}, "stream"),
    ({"input_ids": [1], "stream": 0}, "stream must be true or false"),
    ({"input_ids": [1], "logprob_start_len": "x"}, "logprob_start_len must be an integer"),
    ({"input_ids": [1], "top_logprobs_num": ""}, "top_logprobs_num must be an integer"),
    ({"input_ids": [1], "return_logprob": True, "top_logprobs_num": False}, "top_logprobs_num"),
    ({"input_ids": [1], "sampling_params": {"top_k": -1.0}}, "top_k must be an integer"),
    ({"input_ids": [1], "sampling_params": {"skip_special_tokens": "x"}}, "skip_special_tokens"),
    ({"input_ids": [1], "return_entropy": "yes"}, "return_entropy must be true or false"),
    ({"input_ids": [1] * 4000, "sampling_params": {"max_new_tokens": 100}}, "max_total_num_tokens"),
    ([1, 2, 3], "JSON object"),
]


@pytest.mark.parametrize("body,message", BAD_BODIES)
def test_bad_input_is_a_clear_400(srv, body, message):
    resp = srv.post("/generate", body)
    assert resp.status_code == 400
    assert message in resp.json()["error"]["message"]


def test_malformed_json_and_bad_completions_keep_the_server_up(srv):
    resp = httpx.post(srv.url + "/generate", content=b"{not json", timeout=10)
    assert resp.status_code == 400 and "malformed JSON" in resp.json()["error"]["message"]
    assert srv.post("/v1/completions", {"max_tokens": 3}).status_code == 400
    assert srv.post("/v1/completions", {"prompt": []}).status_code == 400
    assert srv.post("/v1/completions", {"prompt": "a", "max_tokens": 0}).status_code == 400
    for field in ({"model": [1]}, {"echo": ""}, {"stream": 0}):
        resp = srv.post("/v1/completions", {"prompt": "a", **field})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == next(iter(field))
    named = [{"role": "user", "content": "hi", "name": 5}]
    assert srv.post("/v1/chat/completions", {"messages": named}).status_code == 400
    assert srv.get("/health").status_code == 200
    assert gen(srv, [1, 2, 3], 2).status_code == 200


def test_concurrent_streams_do_not_corrupt_each_other(srv):
    solo = {
        "a": gen(srv, PROMPT_A, 20).json()["output_ids"],
        "b": gen(srv, PROMPT_B, 20).json()["output_ids"],
    }
    results: dict[str, list] = {}

    def run(name: str, ids: list[int]) -> None:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
        events = srv.stream("/generate", {**body, "stream": True})
        results[name] = json.loads(events[-1])["output_ids"]

    threads = [threading.Thread(target=run, args=a) for a in (("a", PROMPT_A), ("b", PROMPT_B))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == solo


@pytest.mark.slow  # a server of its own
def test_requests_beyond_the_pool_queue_until_it_frees():
    # At the default new-token ratio (0.7) each request books 80 + 1 + 0.7 x 199 = 221 of 300
    # slots: the second waits, none fails.
    with server("--max-total-tokens", "300", "--chunk-size", "64") as small:
        prompts = [[(31 + i) % 500 + 1 for i in range(80)], [(62 + i) % 500 + 1 for i in range(80)]]
        alone = [gen(small, p, 200).json()["output_ids"] for p in prompts]
        results: dict[int, dict] = {}

        def run(i: int) -> None:
            results[i] = gen(small, prompts[i], 200).json()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [results[i]["output_ids"] for i in range(2)] == alone
        first, second = sorted((results[i]["meta_info"] for i in range(2)),
                               key=lambda meta: meta["e2e_latency"])  # fmt: skip
        # sent together, the second's first token came only once the first had finished (an
        # order, not a speed: it holds however loaded the machine; 0.2 s for the two arrivals)
        assert second["ttft"] >= first["e2e_latency"] - 0.2
        never = gen(small, prompts[0], 250)  # 80 + 250 can never fit: refused at once
        assert never.status_code == 400 and "max_total_num_tokens" in never.text
        frag = small.get("/get_server_info").json()["fragmentation"]
        assert frag["free_pages"] == frag["num_pages"]
        assert small.stop() == 0


def _retractions(metrics: str) -> float:
    return float(re.search(r"^sglang:num_retractions_total\{.*\} (\S+)$", metrics, re.M)[1])


@pytest.mark.slow  # a server of its own
def test_a_pool_outgrown_retracts_the_youngest_and_counts_it():
    # Admitted on their next step alone (ratio 0), two requests of 80 + 200 outgrow 300 slots:
    # the younger is retracted, recomputed once the older has finished, its tokens unchanged.
    prompts = [[(31 + i) % 500 + 1 for i in range(80)], [(62 + i) % 500 + 1 for i in range(80)]]
    with server("--max-total-tokens", "300", "--new-token-ratio", "0") as tight:
        alone = [gen(tight, p, 200).json()["output_ids"] for p in prompts]
        assert _retractions(tight.get("/metrics").text) == 0
        both = gen(tight, prompts, 200).json()  # one batch: the second is the younger
        assert [o["output_ids"] for o in both] == alone
        assert [o["meta_info"]["retractions"] for o in both] == [0, 1]
        assert _retractions(tight.get("/metrics").text) == 1
        info = tight.get("/get_server_info").json()
        assert info["new_token_ratio"] == 0 and info["fragmentation"]["free_pages"] == 300


@pytest.mark.slow  # generates through every spec mode
def test_tree_speculation_matches_plain_and_reports_verify_stats(srv):
    plain = gen(srv, PROMPT_B, 20).json()["output_ids"]
    with server("--max-total-tokens", "4096", "--spec", "tree", "--tree-nodes", "16") as spec:
        out = gen(spec, PROMPT_B, 20).json()
        info = spec.get("/get_server_info").json()
    assert out["output_ids"] == plain
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] > 0 and meta["verify_step_ms"] > 0
    assert 1 <= meta["spec_accept_length"] <= 16
    assert info["speculative_algorithm"] == "tree" and info["speculative_num_draft_tokens"] == 16
    avg = info["internal_states"][0]["avg_spec_accept_length"]  # what bench_serving reads
    assert avg == pytest.approx(meta["spec_accept_length"])


@pytest.mark.slow  # a second server
def test_mha_prefill_serves_the_same_tokens_and_reports_it(srv):
    plain = gen(srv, PROMPT_B, 20).json()["output_ids"]
    args = ("--max-total-tokens", "4096", "--chunk-size", "48", "--prefill-attention", "mha")
    with server(*args) as mha:
        out = gen(mha, PROMPT_B, 20).json()
        info = mha.get("/get_server_info").json()
    assert out["output_ids"] == plain and out["meta_info"]["prefill_ms"] > 0
    assert info["prefill_attention"] == "mha" and info["chunked_prefill_size"] == 48


@pytest.mark.slow  # a server of its own
def test_sigterm_ends_requests_in_flight_with_a_reason_and_exits_in_seconds():
    # room for both requests at once, so admission control queues neither
    srv = Server("--max-total-tokens", "8192")
    body = {"input_ids": PROMPT_A, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    plain: dict[str, httpx.Response] = {}
    waiter = threading.Thread(target=lambda: plain.update(r=gen(srv, PROMPT_B, 3000)))
    waiter.start()
    deadline = time.monotonic() + 30
    while srv.get("/get_server_info").json()["running_requests"] < 1:
        assert time.monotonic() < deadline, "the plain request never started"
        time.sleep(0.05)
    with httpx.stream(
        "POST", srv.url + "/generate", json={**body, "stream": True}, timeout=30
    ) as r:
        lines = r.iter_lines()
        next(lines)
        srv.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        rest = [line for line in lines if line.startswith("data: ")]
    assert srv.proc.wait(timeout=30) == 0
    assert time.monotonic() - start < 10
    waiter.join(30)
    last = json.loads(rest[-2][len("data: ") :])
    assert rest[-1] == "data: [DONE]" and last["error"]["code"] == 503
    assert last["meta_info"]["finish_reason"]["message"] == "server shutting down"
    assert plain["r"].status_code == 503 and "shutting down" in plain["r"].text
    assert "Event loop is closed" not in srv.proc.stderr.read()


@pytest.mark.slow  # a second server
def test_defrag_serves_the_same_tokens(srv):
    plain = {n: gen(srv, p, 20).json()["output_ids"] for n, p in (("a", PROMPT_A), ("b", PROMPT_B))}
    args = ("--max-total-tokens", "4096", "--scatter-seed", "3", "--defrag")
    with server(*args, "--defrag-threshold", "0", "--defrag-interval", "1") as d:
        results: dict[str, list] = {}

        def run(name: str, ids: list[int]) -> None:
            results[name] = gen(d, ids, 20).json()["output_ids"]

        threads = [threading.Thread(target=run, args=a) for a in (("a", PROMPT_A), ("b", PROMPT_B))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        info = d.get("/get_server_info").json()
    assert results == plain
    assert info["defrag"] is True and info["fragmentation"]["defrag_runs"] > 0


@pytest.mark.slow  # a long request
def test_health_answers_while_a_long_request_runs(srv):
    ids = [(13 * i) % 500 + 1 for i in range(3000)]
    done = threading.Event()

    def long_request() -> None:
        gen(srv, ids, 300)
        done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + 30
    while srv.get("/get_server_info").json()["running_requests"] != 1:
        assert time.monotonic() < deadline and not done.is_set(), "the request never ran"
        time.sleep(0.05)
    start = time.monotonic()
    health = srv.get("/health")
    elapsed, running = time.monotonic() - start, not done.is_set()
    worker.join(120)
    assert health.status_code == 200 and elapsed < 5
    assert running, "the request ended before /health answered, so nothing was shown"


@pytest.mark.slow  # starts servers that fail
def test_impossible_configuration_exits_with_a_clear_error():
    cmd = [sys.executable, "-m", "decodecliff.cli", "serve", "--device", "cpu", "--cuda-graph"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CUDA" in done.stderr
    assert "ready" not in done.stdout


def test_a_client_that_goes_away_gives_its_slots_back(srv):
    body = {"input_ids": PROMPT_A, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with httpx.stream(
        "POST", srv.url + "/generate", json={**body, "stream": True}, timeout=30
    ) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = srv.get("/get_server_info").json()
        if info["running_requests"] == 0:
            break
        time.sleep(0.1)
    frag = info["fragmentation"]
    assert info["running_requests"] == 0 and frag["free_pages"] == frag["num_pages"]
