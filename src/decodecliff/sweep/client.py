"""Streaming client for SGLang's native ``POST /generate`` and OpenAI ``POST /v1/completions``.

One request is recorded as a list of events ``(t, tokens)`` (seconds since the request was sent,
cumulative generated tokens) into a :class:`StreamRecord` that the caller owns, so a request cut
short by a timeout or a dying server still leaves the timings it got so far.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from httpx_sse import aconnect_sse

from decodecliff.sweep import launcher, metrics

APIS = ("generate", "openai")
OnEvent = Callable[[float, int], None]


@dataclass
class StreamRecord:
    """What one streamed request produced, filled in as the stream arrives."""

    events: list[tuple[float, int]] = field(default_factory=list)
    sent_at: float | None = None  # perf_counter at send
    first_byte_s: float | None = None  # the first and the latest server-sent event
    last_byte_s: float | None = None
    e2e_s: float | None = None  # send -> [DONE]
    done: bool = False
    http_status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: object = None
    meta_info: dict = field(default_factory=dict)
    error: str | None = None

    def elapsed(self) -> float:
        return 0.0 if self.sent_at is None else time.perf_counter() - self.sent_at


def silence(seconds: float) -> str:
    """How long a stream went without an event, as the sweep and bench-load word it: to a tenth
    of a second, two digits below one (a stall timeout of 0.25 s reads as set)."""
    shown = f"{seconds:.1f}".removesuffix(".0") if seconds >= 1 else f"{seconds:.2g}"
    return f"no event for the last {shown} s"


def request_body(api: str, input_ids: list[int], gen_tokens: int, model: str) -> tuple[str, dict]:
    """(path, JSON body) of a greedy request for exactly ``gen_tokens`` tokens (EOS ignored)."""
    if api == "generate":
        sampling = {"max_new_tokens": gen_tokens, "temperature": 0.0, "ignore_eos": True}
        return "/generate", {"input_ids": input_ids, "sampling_params": sampling, "stream": True}
    if api == "openai":
        return "/v1/completions", {
            "model": model,
            "prompt": input_ids,
            "max_tokens": gen_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    raise ValueError(f"unknown api {api!r}; choose one of {APIS}")


def _count(fields: dict, key: str) -> int | None:
    """``fields[key]`` as a token count (None if absent); ValueError where it cannot be one."""
    v = fields.get(key)
    if v is None:
        return None
    if not metrics.is_count(v):
        raise ValueError(f"{key} is {json.dumps(v)[:50]}, not a token count")
    return int(v)


def _apply_generate(rec: StreamRecord, data: dict) -> int | None:
    """Fold one /generate chunk into ``rec``; return the cumulative token count it reports."""
    meta = data.get("meta_info") or {}
    if not isinstance(meta, dict):
        raise TypeError(f"meta_info is {type(meta).__name__}, not an object")
    rec.meta_info = meta
    if (prompt := _count(meta, "prompt_tokens")) is not None:
        rec.prompt_tokens = prompt
    if meta.get("finish_reason") is not None:
        rec.finish_reason = meta["finish_reason"]
    if (completion := _count(meta, "completion_tokens")) is not None:
        return completion
    ids = data.get("output_ids")
    return len(ids) if isinstance(ids, list) else None


def _apply_openai(rec: StreamRecord, data: dict, last: int) -> int | None:
    """Fold one /v1/completions chunk into ``rec``; return the cumulative token count."""
    usage = data.get("usage") or {}
    if (prompt := _count(usage, "prompt_tokens")) is not None:
        rec.prompt_tokens = prompt
    choices = data.get("choices") or []
    text = "".join(c.get("text") or "" for c in choices)
    for c in choices:
        if c.get("finish_reason") is not None:
            rec.finish_reason = c["finish_reason"]
    if (completion := _count(usage, "completion_tokens")) is not None:
        if not choices:  # final usage-only chunk: a total, not a token arrival
            rec.completion_tokens = completion
            return None
        return completion
    # Without per-chunk usage, count one token per text chunk (vLLM's bench convention).
    return last + 1 if text else None


def _fold(rec: StreamRecord, api: str, data: object, last: int) -> int | None:
    """One chunk into ``rec`` (its cumulative token count); ValueError where its shape is not
    the API's (a chunk that is no object, a field of another type)."""
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object: {json.dumps(data)[:200]}")
    try:
        return _apply_generate(rec, data) if api == "generate" else _apply_openai(rec, data, last)
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"a field of another type than the API's ({exc})") from None


async def stream(
    client: httpx.AsyncClient,
    base_url: str,
    api: str,
    input_ids: list[int],
    gen_tokens: int,
    rec: StreamRecord,
    on_event: OnEvent | None = None,
    model: str = "default",
) -> StreamRecord:
    """Send one streaming request and record its chunks into ``rec``.

    Protocol and HTTP errors end up in ``rec.error``; cancellation (timeouts) propagates, with
    ``rec`` holding whatever arrived before it.
    """
    path, body = request_body(api, input_ids, gen_tokens, model)
    last = 0
    rec.sent_at = time.perf_counter()
    try:
        async with aconnect_sse(client, "POST", base_url.rstrip("/") + path, json=body) as source:
            resp = source.response
            rec.http_status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:500]
                rec.error = f"HTTP {resp.status_code}: {text}"
                return rec
            async for event in source.aiter_sse():
                t = rec.elapsed()
                if rec.first_byte_s is None:
                    rec.first_byte_s = t
                rec.last_byte_s = t
                if event.data == "[DONE]":
                    rec.done, rec.e2e_s = True, t
                    break
                if event.event == "error":  # SSE's own error event, whatever its data holds
                    rec.error = f"server error: {event.data[:500] or '(no message)'}"
                    return rec
                if not event.data:
                    continue  # a named event with no data: nothing of the request's
                data = launcher.strict_json(event.data)
                if isinstance(data, dict) and data.get("error"):
                    rec.error = f"server error: {json.dumps(data['error'])[:500]}"
                    return rec
                count = _fold(rec, api, data, last)
                if count is not None and count > last:
                    rec.events.append((t, count))
                    last = count
                    if on_event is not None:
                        on_event(t, count)
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except ValueError as exc:  # JSONDecodeError, a NaN / Infinity, a chunk of the wrong shape
        rec.error = f"malformed stream chunk: {exc}"
    finally:  # also a stream cut short: cancelled (a timeout), or ended by an error event
        if rec.completion_tokens is None or rec.completion_tokens < last:
            rec.completion_tokens = last
    if rec.error is None and not rec.done:
        rec.error = "stream ended before [DONE]"
    elif rec.error is None and (_aborted(rec.finish_reason) or not rec.completion_tokens):
        why = json.dumps(rec.finish_reason)[:300]
        rec.error = f"the stream finished with {rec.completion_tokens or 0} tokens: finish {why}"
    return rec


def _aborted(reason: object) -> bool:
    """Whether a finish reason says the server gave the request up (SGLang's {"type": "abort"})."""
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return kind == "abort"
