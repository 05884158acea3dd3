"""OpenAI's /v1/completions and /v1/chat/completions over the engine (as vLLM serves them).

Choices are numbered prompt * n + j. Streams send text deltas; with stream_options.include_usage a
final chunk with no choices carries the usage (every other chunk has "usage": null), and vLLM's
continuous_usage_stats adds the choice's running usage to every chunk. Logprobs are the model's
(before temperature, top_p and top_k).
"""

from __future__ import annotations

import time

from aiohttp import web

from decodecliff.engine.request import TokenLogprob

from .jobs import Batch, Choice, error_body, respond
from .protocol import ParsedRequest
from .tokenizer import decode


def finish_reason(choice: Choice) -> str | None:
    if not choice.finished:
        return None
    reason = choice.meta.get("finish_reason") or {}
    return {"length": "length", "stop": "stop"}.get(reason.get("type"), "abort")


def usage(choices: list[Choice], n: int) -> dict:
    """Prompt tokens once per prompt, completion tokens of every choice."""
    prompt = sum(len(c.prompt) for c in choices if c.index % n == 0)
    completion = sum(len(c.ids) for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_logprobs(lps: list[TokenLogprob], ids: list[int], offset: int) -> dict:
    tokens = [decode([t]) for t in ids]
    tops = [
        {decode([t]): lp, **{decode([a]): v for a, v in alts}}
        for t, (lp, alts) in zip(ids, lps, strict=True)
    ]
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _ in lps],
        "top_logprobs": tops,
        "text_offset": list(range(offset, offset + len(ids))),
    }


def chat_logprobs(lps: list[TokenLogprob], ids: list[int]) -> dict:
    def entry(t: int, lp: float) -> dict:
        s = decode([t])
        return {"token": s, "logprob": lp, "bytes": list(s.encode())}

    content = [
        {**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in alts]}
        for t, (lp, alts) in zip(ids, lps, strict=True)
    ]
    return {"content": content}


class OpenAIResponder:
    """Builds one request's chunks and body; `chat` picks the chat.completion shapes."""

    def __init__(self, parsed: ParsedRequest, model: str, chat: bool) -> None:
        self.parsed, self.chat = parsed, chat
        prefix = "chatcmpl" if chat else "cmpl"
        self.base = {
            "id": f"{prefix}-{time.time_ns():x}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self.batch: Batch | None = None

    def _piece(self, choice: Choice, start: int, end: int, first: bool) -> dict:
        """The choice's output tokens start..end as one choice object."""
        ids = choice.ids[start:end]
        text = decode(ids)
        lps = None
        if self.parsed.params[0].logprobs is not None:
            got = choice.logprobs[start:end]
            lps = chat_logprobs(got, ids) if self.chat else completion_logprobs(got, ids, start)
        out: dict = {"index": choice.index, "logprobs": lps, "finish_reason": finish_reason(choice)}
        if self.chat:
            return out | {
                "delta": {"role": "assistant", "content": text} if first else {"content": text}
            }
        if self.parsed.echo and first:
            text = decode(choice.prompt) + text
        return out | {"text": text}

    def chunk(self, choice: Choice) -> dict | None:
        end = choice.visible(self.parsed)
        if end <= choice.sent and not choice.finished:
            return None
        first, choice.opened = not choice.opened, True
        payload = {**self.base, "choices": [self._piece(choice, choice.sent, end, first)]}
        choice.sent = end
        if self.parsed.continuous_usage:
            payload["usage"] = usage([choice], 1) | {"prompt_tokens": len(choice.prompt)}
        elif self.parsed.include_usage:
            payload["usage"] = None
        return payload

    def error_chunk(self, choice: Choice) -> dict:
        return {**self.base, **error_body(choice.status, choice.error), "choices": []}

    def tail(self) -> list[dict]:
        if not self.parsed.include_usage:
            return []
        return [{**self.base, "choices": [], "usage": usage(self.batch.choices, self.parsed.n)}]

    def body(self, choices: list[Choice]) -> dict:
        out = []
        for c in sorted(choices, key=lambda c: c.index):
            piece = self._piece(c, 0, c.visible(self.parsed), True)
            if self.chat:
                delta = piece.pop("delta")
                piece["message"] = {"role": "assistant", "content": delta["content"]}
            out.append(piece)
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self.base, "object": obj, "choices": out, "usage": usage(choices, self.parsed.n)}

    async def run(self, request: web.Request, batch: Batch) -> web.StreamResponse:
        self.batch = batch
        return await respond(request, batch, self.chunk, self.body, self.error_chunk, self.tail)
