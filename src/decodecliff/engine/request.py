"""A generation request: parameters, progress, per-step statistics and SGLang-style meta_info."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

_ids = itertools.count()


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # sampling seed at temperature > 0 (default: server seed + request no.)


@dataclass
class Update:
    """What a client learns after an engine step: a snapshot, safe to hand to another thread."""

    output_ids: list[int]
    meta_info: dict
    finished: bool
    error: str | None = None
    status: int = 200  # HTTP status for errors: 503 out of memory, 500 internal


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    on_update: Callable[[Update], None] = lambda update: None
    rid: str = field(default_factory=lambda: f"req-{next(_ids)}")
    # progress (engine thread only)
    tokens: list[int] = field(default_factory=list)  # prompt + output
    row: int | None = None  # page-table row while running
    prefilled: int = 0  # prompt tokens whose KV is cached
    kv_len: int = 0  # tokens whose KV is cached (the last output token's KV comes next step)
    finish_reason: dict | None = None
    error: str | None = None
    status: int = 200
    cancelled: bool = False  # set by the server when the client goes away
    drafter_state: object = None
    generator: torch.Generator | None = None
    # statistics
    created: float = field(default_factory=time.perf_counter)
    finished_at: float | None = None
    prefill_ms: float = 0.0
    decode_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    accepted: int = 0  # tokens emitted by verify steps

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def prefill_done(self) -> bool:
        return self.prefilled == len(self.prompt)

    def meta_info(self) -> dict:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        verify_ct = len(self.verify_ms)
        mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
        return {
            "id": self.rid,
            "prompt_tokens": len(self.prompt),
            "completion_tokens": len(self.output),
            "cached_tokens": 0,
            "finish_reason": self.finish_reason,
            "e2e_latency": end - self.created,
            "prefill_ms": self.prefill_ms,
            "decode_step_ms": mean(self.decode_ms),
            "decode_steps": len(self.decode_ms),
            "spec_verify_ct": verify_ct,
            "spec_accept_length": self.accepted / verify_ct if verify_ct else None,
            "verify_step_ms": mean(self.verify_ms),
        }

    def snapshot(self) -> Update:
        return Update(
            output_ids=list(self.output),
            meta_info=self.meta_info(),
            finished=self.finish_reason is not None,
            error=self.error,
            status=self.status,
        )
