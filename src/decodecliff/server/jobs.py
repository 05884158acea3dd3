"""The engine requests behind one HTTP request, and answering with them as JSON or SSE.

The engine hands each request's new tokens (deltas, never cumulative snapshots) to the event loop;
a `Batch` folds them into one `Choice` per request. Leaving a batch by any path (finished, the
client disconnected and aiohttp cancelled the handler, a write to a closed stream failed) cancels
every request still running, so an abandoned request stops at the engine's next step. A client
that leaves mid-stream is no error of the server's: a debug line at most, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from decodecliff.engine.engine import Engine
from decodecliff.engine.request import Request, TokenLogprob, Update

from .metrics import Metrics
from .protocol import BadRequest, ParsedRequest

log = logging.getLogger("decodecliff.server")
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    415: "UnsupportedMediaTypeError",
    499: "ClientClosedRequest",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error shape (vLLM's too: the code is the HTTP status)."""
    kind = ERROR_TYPES.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: dict | None = None
) -> web.Response:
    return web.json_response(error_body(status, message, param), status=status, headers=headers)


def warning_headers(parsed: ParsedRequest) -> dict[str, str]:
    """A Warning header (code 299) naming the accepted fields that were ignored, if any."""
    if not parsed.ignored:
        return {}
    return {"Warning": f'299 decodecliff "ignored: {", ".join(parsed.ignored)}"'}


def check_fits(engine: Engine, parsed: ParsedRequest) -> None:
    """BadRequest when a prompt can never be served by the engine (its n copies check once)."""
    for prompt, params in zip(parsed.prompts, parsed.params, strict=True):
        try:
            engine.check(prompt, params)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None


def sse(payload: object) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


@dataclass
class Choice:
    index: int
    prompt: list[int]
    req: Request
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    finished: bool = False
    error: str | None = None
    status: int = 200
    sent: int = 0  # output tokens already streamed to the client
    opened: bool = False  # a chunk of this choice has been streamed
    forming: list[int] = field(default_factory=list)  # how much of each stop string ends the output
    scanned: int = 0  # output tokens read into `forming`
    last_token_at: float | None = None

    def _matched(self) -> object:
        """What ended the output, as the engine's finish reason gives it: a stop string's tokens
        (a list), a stop token's id, or None."""
        return (self.meta.get("finish_reason") or {}).get("matched")

    def matched_stop(self) -> tuple[int, ...] | None:
        """The tokens of the stop string that ended the output, if one did."""
        matched = self._matched()
        return tuple(matched) if isinstance(matched, list) else None

    def trimmed(self) -> int:
        """Output tokens the text leaves out once finished: a matched stop string's, or a
        matched stop token (EOS too) as SGLang's detokenizer trims it, id 0 excepted (its
        ``trim_matched_stop`` reads a falsy match as none)."""
        matched = self._matched()
        if isinstance(matched, list):
            return len(matched)
        return 1 if isinstance(matched, int) and matched else 0

    def visible(self, parsed: ParsedRequest) -> int:
        """Output tokens the client may see: a stop string that may be forming is held back."""
        n = len(self.ids)
        if self.finished:
            return n - self.trimmed() if parsed.trim_stop else n
        stops = list(parsed.stop_strings)
        if len(self.forming) != len(stops):
            self.forming, self.scanned = [0] * len(stops), 0
        for token in self.ids[self.scanned :]:  # each token read once, whatever the stops' length
            self.forming = [_forming(s, k, token) for s, k in zip(stops, self.forming, strict=True)]
        self.scanned = n
        return n - max(self.forming, default=0)


@functools.lru_cache(maxsize=256)
def _borders(seq: tuple[int, ...]) -> tuple[int, ...]:
    """For each prefix of ``seq``, the length of its longest proper prefix that is also its suffix
    (Knuth-Morris-Pratt), so a partial match falls back without reading the output again."""
    borders, k = [0] * len(seq), 0
    for i in range(1, len(seq)):
        while k and seq[i] != seq[k]:
            k = borders[k - 1]
        k += seq[i] == seq[k]
        borders[i] = k
    return tuple(borders)


def _forming(seq: tuple[int, ...], k: int, token: int) -> int:
    """How much of ``seq`` the output ends with once ``token`` follows an end matching ``k`` of
    it: the longest proper prefix (a whole match finishes the request, in the engine)."""
    borders = _borders(seq)
    while k and seq[k] != token:
        k = borders[k - 1]
    k += seq[k] == token
    return borders[k - 1] if k == len(seq) else k


class Batch:
    """``metrics``: None for a health probe, which is no one's request (as in SGLang)."""

    def __init__(self, engine: Engine, parsed: ParsedRequest, metrics: Metrics | None) -> None:
        self.engine, self.parsed, self.metrics = engine, parsed, metrics
        self.loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue[tuple[int, Update]] = asyncio.Queue()
        self.choices: list[Choice] = []
        for index, prompt, params in parsed.choices():  # checked by check_fits beforehand
            req = Request(prompt=prompt, params=params, on_update=self._pusher(index))
            self.choices.append(Choice(index, prompt, req))
        self.unfinished = len(self.choices)  # counted, not scanned: a batch can be large

    def _pusher(self, index: int) -> Callable[[Update], None]:
        def push(update: Update) -> None:  # engine thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening
                self.loop.call_soon_threadsafe(self._arrive, index, update)

        return push

    def _arrive(self, index: int, update: Update) -> None:
        # counted as the engine makes them: after its client left too, when nobody reads them
        if self.metrics is not None and update.new_ids:
            self.metrics.generated(len(update.new_ids))
        self.inbox.put_nowait((index, update))

    def __enter__(self) -> Batch:
        for choice in self.choices:
            self.engine.submit(choice.req)
        return self

    def __exit__(self, *exc: object) -> None:
        for choice in self.choices:
            if not choice.finished:  # its client left (or the response failed): abort it
                choice.req.cancelled = True
                if self.metrics is not None:
                    self.metrics.dropped(len(choice.prompt))

    @property
    def done(self) -> bool:
        return self.unfinished == 0

    async def next(self) -> Choice:
        """Wait for the next update of any choice and fold it in."""
        index, update = await self.inbox.get()
        choice = self.choices[index]
        if self.metrics is not None:
            self._measure(self.metrics, choice, update)
        choice.ids += update.new_ids
        choice.logprobs += update.new_logprobs or []
        choice.meta = update.meta_info
        choice.error, choice.status = update.error, update.status
        if update.finished and not choice.finished:
            choice.finished = True
            self.unfinished -= 1
        return choice

    def _measure(self, metrics: Metrics, choice: Choice, update: Update) -> None:
        """Count an update of ``choice`` before it is folded in."""
        now = self.loop.time()
        if update.new_ids:
            if choice.last_token_at is None and update.meta_info.get("ttft") is not None:
                metrics.ttft.observe(update.meta_info["ttft"])
            elif choice.last_token_at is not None:
                gap = (now - choice.last_token_at) / len(update.new_ids)
                for _ in update.new_ids:
                    metrics.itl.observe(gap)
            choice.last_token_at = now
        if update.finished and not choice.finished:
            metrics.finished(update.meta_info, update.error is None)

    def first_error(self) -> Choice | None:
        return next((c for c in self.choices if c.error is not None), None)


async def respond(
    request: web.Request,
    batch: Batch,
    chunk: Callable[[Choice], dict | None],
    body: Callable[[list[Choice]], object],
    error_chunk: Callable[[Choice], dict],
    tail: Callable[[], list[dict]] = list,
) -> web.StreamResponse:
    """Answer body(choices) as JSON once every choice has finished, or stream SSE chunks.

    A stream sends chunk(choice) after each update (None: nothing new to send), error_chunk for a
    choice that failed, then tail() and [DONE]; it ends where its client left. A failure before
    anything was sent is a plain HTTP error, for streams too.
    """
    headers = warning_headers(batch.parsed)
    with batch:
        if not batch.parsed.stream:
            while not batch.done:
                await batch.next()
            if (bad := batch.first_error()) is not None:
                return error_response(bad.status, bad.error, headers=headers)
            return web.json_response(body(batch.choices), headers=headers)
        first = await batch.next()
        if first.error is not None:
            return error_response(first.status, first.error, headers=headers)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        try:
            await resp.prepare(request)
            choice: Choice | None = first
            while choice is not None:
                payload = error_chunk(choice) if choice.error is not None else chunk(choice)
                if payload is not None:
                    await resp.write(sse(payload))
                choice = None if batch.done else await batch.next()
            for payload in tail():
                await resp.write(sse(payload))
            await resp.write(sse("[DONE]"))
        except ConnectionResetError:
            # The client left: its socket closed before aiohttp saw it and cancelled this handler
            # (aiohttp's ClientConnectionResetError, "Cannot write to closing transport", is one).
            # Raised on, aiohttp logged it as an error with its traceback; returned, the end of
            # the response fails quietly too (aiohttp ignores a client gone by then).
            log.debug("%s %s: the client left mid-stream", request.method, request.path)
        return resp
