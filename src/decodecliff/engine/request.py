"""A generation request: parameters, progress, per-step statistics and SGLang-style meta_info."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

_ids = itertools.count()
_arrivals = itertools.count()  # arrival order: retraction takes the youngest request first

# Temperatures at or below this sample as greedy (as SGLang does): dividing logits by a smaller
# number overflows float32 (1e-40 is subnormal) and the distribution is one-hot anyway.
GREEDY_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # <= GREEDY_TEMPERATURE: greedy
    top_p: float = 1.0  # nucleus sampling (1: off)
    top_k: int = 0  # keep the k most likely tokens (0: off)
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()  # a set: each output token is looked up in it
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # token sequences that end the output
    seed: int | None = None  # sampling seed at temperature > 0 (default: server seed + request no.)
    logprobs: int | None = None  # report each output token's logprob and this many alternatives

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE or self.top_k == 1

    def needed_tokens(self, prompt_len: int, spec_tokens: int) -> int:
        """KV slots the request can hold at most: prompt, outputs and a step's draft tokens."""
        return prompt_len + self.max_new_tokens + spec_tokens - 1


TokenLogprob = tuple[float, list[tuple[int, float]]]  # (logprob, [(alternative id, logprob)])


@dataclass
class Update:
    """What a client learns after an engine step: the new tokens only (a delta), thread-safe."""

    new_ids: list[int]
    meta_info: dict
    finished: bool
    error: str | None = None
    status: int = 200  # HTTP status for errors: 503 out of memory / shutting down, 500 internal
    new_logprobs: list[TokenLogprob] | None = None


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    on_update: Callable[[Update], None] = lambda update: None
    rid: str = field(default_factory=lambda: f"req-{next(_ids)}")
    seq: int = field(default_factory=lambda: next(_arrivals))
    # progress (engine thread only)
    tokens: list[int] = field(default_factory=list)  # prompt + output
    row: int | None = None  # page-table row while running
    prefilled: int = 0  # tokens of the prefill whose KV is cached
    # Tokens the prefill computes: the prompt, or after a retraction all but the last token.
    fill_len: int = 0
    kv_len: int = 0  # tokens whose KV is cached (the last output token's KV comes next step)
    finish_reason: dict | None = None
    error: str | None = None
    status: int = 200
    cancelled: bool = False  # set by the server when the client goes away
    drafter_state: object = None
    generator: torch.Generator | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, if asked
    row_logprobs: list[TokenLogprob] = field(default_factory=list)  # per query row of a step
    reported: int = 0  # output tokens already handed to on_update
    # statistics
    created: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    prefill_ms: float = 0.0
    decode_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    accepted: int = 0  # tokens emitted by verify steps
    retractions: int = 0  # times its KV was freed for older requests (then recomputed)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)
        self.fill_len = len(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.fill_len

    def meta_info(self) -> dict:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        verify_ct = len(self.verify_ms)
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        ttft = None if self.first_token_at is None else self.first_token_at - self.created
        return {
            "id": self.rid,
            "prompt_tokens": len(self.prompt),
            "completion_tokens": len(self.tokens) - len(self.prompt),
            "cached_tokens": 0,
            "finish_reason": self.finish_reason,
            "e2e_latency": end - self.created,
            "ttft": ttft,
            "prefill_ms": self.prefill_ms,
            "decode_step_ms": mean(self.decode_ms),
            "decode_steps": len(self.decode_ms),
            "spec_verify_ct": verify_ct,
            "spec_accept_length": self.accepted / verify_ct if verify_ct else None,
            "spec_accepted_tokens": self.accepted,
            "verify_step_ms": mean(self.verify_ms),
            "retractions": self.retractions,
        }

    def snapshot(self) -> Update:
        """The tokens emitted since the previous snapshot, and the request's current meta_info."""
        n_out = len(self.tokens) - len(self.prompt)
        start, self.reported = self.reported, n_out
        new = self.tokens[len(self.prompt) + start :]
        if new and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        lps = self.logprobs[start:n_out] if self.params.logprobs is not None else None
        return Update(
            new_ids=new,
            meta_info=self.meta_info(),
            finished=self.finish_reason is not None,
            error=self.error,
            status=self.status,
            new_logprobs=lps,
        )
