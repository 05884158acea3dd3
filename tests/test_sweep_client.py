"""The sweep's streaming client against small stand-in servers that answer badly on purpose."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx
from aiohttp import web
from aiohttp.test_utils import TestServer

from decodecliff.sweep import client

Writer = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


def _chunk(i: int) -> bytes:
    meta = {"prompt_tokens": 3, "completion_tokens": i, "finish_reason": None}
    return f"data: {json.dumps({'meta_info': meta})}\n\n".encode()


def _stream(write: Writer) -> client.StreamRecord:
    """One /generate request of the sweep's client to a server whose stream ``write`` sends."""

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await write(request, resp)
        return resp

    async def main() -> client.StreamRecord:
        app = web.Application()
        app.router.add_post("/generate", generate)
        rec = client.StreamRecord()
        async with TestServer(app) as srv, httpx.AsyncClient() as http:
            url = str(srv.make_url("/"))
            await asyncio.wait_for(client.stream(http, url, "generate", [1, 2, 3], 4, rec), 30)
        return rec

    return asyncio.run(main())


def test_a_chunk_nested_too_deeply_to_parse_is_a_malformed_chunk() -> None:
    """JSON nested deeper than the parser's recursion limit is the server's malformed output:
    the request fails with that reason and keeps the tokens before it (it was a RecursionError,
    which ended the point as a fault of the sweep itself)."""

    async def write(_request: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(_chunk(1))
        await resp.write(b"data: " + b"[" * 100_000 + b"\n\n")

    rec = _stream(write)
    assert rec.error is not None and rec.error.startswith("malformed stream chunk: ")
    assert "nested too deeply" in rec.error
    assert [n for _, n in rec.events] == [1] and rec.completion_tokens == 1


def _done(rec: client.StreamRecord) -> list[int]:
    assert rec.error is None and rec.done, rec.error
    return [n for _, n in rec.events]


def test_a_chunk_over_several_data_lines_is_one_chunk() -> None:
    """SSE joins an event's data lines with newlines, which JSON reads as whitespace: a chunk
    sent over two lines is one chunk, not a malformed one."""

    async def write(_request: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(_chunk(1))
        await resp.write(b'data: {"meta_info":\ndata: {"completion_tokens": 2}}\n\n')
        await resp.write(b"data: [DONE]\n\n")

    assert _done(_stream(write)) == [1, 2]


def test_lines_ended_by_cr_lf_and_comments_are_read_as_sse_says() -> None:
    async def write(_request: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(b": keep-alive\r\n\r\n")
        await resp.write(_chunk(1).replace(b"\n", b"\r\n"))
        await resp.write(b"event: ping\n\n")  # a named event without data: none of the request's
        await resp.write(b"data: [DONE]\r\n\r\n")

    assert _done(_stream(write)) == [1]


def test_an_error_event_fails_the_request_with_its_message() -> None:
    """`event: error` is the stream's own error, whether or not its data is OpenAI's shape."""

    async def write(_request: web.Request, resp: web.StreamResponse) -> None:
        await resp.write(_chunk(1))
        await resp.write(b"event: error\ndata: the engine ran out of KV pages\n\n")
        await resp.write(_chunk(2))

    rec = _stream(write)
    assert rec.error == "server error: the engine ran out of KV pages"
    assert [n for _, n in rec.events] == [1] and not rec.done


def test_an_answer_that_is_not_an_event_stream_fails_with_its_content_type() -> None:
    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text='{"text": "not streamed"}', content_type="application/json")

    async def main() -> client.StreamRecord:
        app = web.Application()
        app.router.add_post("/generate", generate)
        rec = client.StreamRecord()
        async with TestServer(app) as srv, httpx.AsyncClient() as http:
            await client.stream(http, str(srv.make_url("/")), "generate", [1], 4, rec)
        return rec

    rec = asyncio.run(main())
    assert rec.error is not None and "text/event-stream" in rec.error and not rec.events


def test_silence_is_worded_to_a_tenth_of_a_second_whole_seconds_bare() -> None:
    assert client.silence(123.456) == "no event for the last 123.5 s"
    assert client.silence(1234.0) == "no event for the last 1234 s"
    assert client.silence(2.0) == "no event for the last 2 s"
    assert client.silence(0.25) == "no event for the last 0.25 s"  # a short stall timeout as set
    assert client.silence(0.04) == "no event for the last 0.04 s"
