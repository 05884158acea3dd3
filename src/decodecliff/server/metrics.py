"""Prometheus metrics under SGLang's names (`sglang:*`), so dashboards made for SGLang read them.

Gauges are read from the engine when /metrics is scraped; counters and histograms are fed by the
server as requests stream (time to first token, inter-token latency, end-to-end latency); the
one-token probe of /health_generate is not a request and is not counted (SGLang's is not either).
generation_tokens counts every token the engine makes, read by its client or not (one that left
stops its request only at the engine's next step); gen_throughput is those tokens per second over
the last THROUGHPUT_WINDOW seconds; cache_hit_rate is 0, as there is no prefix cache (every prompt
token is computed). Retractions (running requests sent back to the queue to free the KV pool) are
counted under SGLang's name, num_retracted_requests, and as num_retractions.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from decodecliff.engine.engine import Engine

THROUGHPUT_WINDOW = 10.0  # seconds
LATENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class Metrics:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        label = {"labelnames": ["model_name"], "registry": self.registry}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, **label).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, **label).labels(model_name)

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=LATENCY_BUCKETS, **label).labels(model_name)

        self.running = gauge("sglang:num_running_reqs", "Requests in the running batch")
        self.queued = gauge("sglang:num_queue_reqs", "Requests waiting for admission")
        self.used_tokens = gauge("sglang:num_used_tokens", "KV slots in use")
        self.token_usage = gauge("sglang:token_usage", "Fraction of the KV pool in use")
        self.accept_length = gauge(
            "sglang:spec_accept_length", "Mean tokens emitted per verify step (incl. the bonus)"
        )
        self.gen_throughput = gauge(
            "sglang:gen_throughput",
            f"Output tokens per second over the last {THROUGHPUT_WINDOW:g} s",
        )
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate", "Fraction of prompt tokens served from a prefix cache (none)"
        )
        self.prompt_tokens = counter(
            "sglang:prompt_tokens", "Prompt tokens of ended requests (finished, failed or left)"
        )
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens")
        self.requests = counter("sglang:num_requests", "Ended requests (finished, failed or left)")
        self.aborted = counter("sglang:num_aborted_requests", "Requests ended by abort or error")
        self.retracted = [
            counter("sglang:num_retracted_requests", "Running requests retracted to free the pool"),
            counter("sglang:num_retractions", "Running requests retracted to free the pool"),
        ]
        self.retracted_seen = 0  # the engine's count when last scraped
        self.ttft = hist("sglang:time_to_first_token_seconds", "Time to the first output token")
        self.itl = hist("sglang:inter_token_latency_seconds", "Time between output tokens")
        self.e2e = hist("sglang:e2e_request_latency_seconds", "Request latency, arrival to end")
        self.verify_steps = 0
        self.verify_tokens = 0
        self.recent: deque[tuple[float, int]] = deque()  # (time, output tokens) in the window

    def generated(self, tokens: int) -> None:
        """Output tokens the engine just made."""
        self.generation_tokens.inc(tokens)
        now = time.monotonic()
        self.recent.append((now, tokens))
        self._prune(now)

    def _prune(self, now: float) -> None:
        while self.recent and self.recent[0][0] < now - THROUGHPUT_WINDOW:
            self.recent.popleft()

    def throughput(self) -> float:
        self._prune(time.monotonic())
        return sum(n for _, n in self.recent) / THROUGHPUT_WINDOW

    def dropped(self, prompt_tokens: int) -> None:
        """A request its client left before it finished: an aborted one."""
        self.requests.inc()
        self.aborted.inc()
        self.prompt_tokens.inc(prompt_tokens)

    def finished(self, meta: dict, ok: bool) -> None:
        self.requests.inc()
        if not ok:
            self.aborted.inc()
        self.prompt_tokens.inc(meta["prompt_tokens"])
        self.e2e.observe(meta["e2e_latency"])
        self.verify_steps += meta["spec_verify_ct"]
        self.verify_tokens += meta["spec_accepted_tokens"]

    @property
    def avg_accept_length(self) -> float | None:
        return self.verify_tokens / self.verify_steps if self.verify_steps else None

    def render(self) -> bytes:
        stats = self.engine.stats()
        self.running.set(stats.running)
        self.queued.set(stats.queued)
        self.used_tokens.set(stats.used_tokens)
        self.token_usage.set(stats.token_usage)
        self.accept_length.set(self.avg_accept_length or 0.0)
        self.gen_throughput.set(self.throughput())
        self.cache_hit_rate.set(0.0)
        for retracted in self.retracted:  # counters: add what the engine counted since
            retracted.inc(stats.retractions - self.retracted_seen)
        self.retracted_seen = stats.retractions
        return generate_latest(self.registry)
