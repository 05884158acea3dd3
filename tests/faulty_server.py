"""A server that speaks the sweep's protocol but answers with a NaN where asked (the fault that a
buggy or real server can produce: Python's json writes NaN unless told not to), or ends a stream
with an error event mid-generation, as SGLang's server does when a request fails inside it.

    python tests/faulty_server.py --port P --nan-in info|meta|after
    python tests/faulty_server.py --port P --error-mid-stream
    python tests/faulty_server.py --port P --shape list-chunk|text-meta|vocab0|vocab-huge|
        bad-figures|negative-prompt|abort
    python tests/faulty_server.py --port P --chatty BYTES
    python tests/faulty_server.py --port P --unhealthy-after N --max-total-tokens T
    python tests/faulty_server.py --port P --stall-on generate|info [--stall-at N]

(--shape: a stream chunk that is a JSON list, a meta_info that is a string, or a vocab_size of
0 or 10^30 in its info: JSON of the wrong shape; a last chunk whose optional figures are of the
wrong kind (spec_verify_ct 1.5, verify_step_ms -3, spec_accept_length "3"), or a prompt_tokens
of -1 in every chunk: values of the wrong kind; or, for abort, one chunk of no token whose
finish reason is SGLang's abort, then [DONE]: a request the server gave up.)

(--chatty: a line on its start, then BYTES of log lines and a last line, "request N done", on
its standard output for every /generate request: a server that logs much. --unhealthy-after:
/health answers 503 from its N+1-th call on, the server running on: a server gone bad between
two points. --max-total-tokens: the KV pool its info reports, 100000 unless given. --stall-on:
the server stops itself (SIGSTOP) on its N-th /generate or /get_server_info request, the first
unless --stall-at says otherwise, and answers nothing more: a server that hangs, as on a GPU
fault, until it is stopped.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from aiohttp import web

NAN = float("nan")


def build(
    nan_in: str | None,
    error_mid_stream: bool = False,
    shape: str | None = None,
    chatty: int = 0,
    unhealthy_after: int | None = None,
    max_total_tokens: int = 100000,
    stall: tuple[str, int] | None = None,
) -> web.Application:
    calls = {"info": 0, "generate": 0, "health": 0}

    def count(endpoint: str) -> None:
        calls[endpoint] += 1
        if stall == (endpoint, calls[endpoint]):
            os.kill(os.getpid(), signal.SIGSTOP)

    async def health(_request: web.Request) -> web.Response:
        calls["health"] += 1
        if unhealthy_after is not None and calls["health"] > unhealthy_after:
            return web.Response(status=503, text="unhealthy")
        return web.Response(text="ok")

    async def info(_request: web.Request) -> web.Response:
        count("info")
        bad = nan_in == "info" or (nan_in == "after" and calls["info"] > 1)
        vocab = {"vocab0": 0, "vocab-huge": 10**30}.get(shape, 1000)
        body = {"max_total_num_tokens": max_total_tokens, "vocab_size": vocab}
        body["load"] = NAN if bad else 0.0
        body["launch_id"] = os.environ.get("DECODECLIFF_LAUNCH_ID")  # as `decodecliff serve`
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def flush(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = body["sampling_params"]["max_new_tokens"]
        count("generate")
        if chatty:
            line = f"request {calls['generate']} chatter ".ljust(99, "x") + "\n"
            sys.stdout.write(line * (chatty // len(line)) + f"request {calls['generate']} done\n")
            sys.stdout.flush()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if shape == "abort":
            reason = {"type": "abort", "message": "aborted"}
            meta = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": 0}
            chunk = {"text": "", "output_ids": [], "meta_info": meta | {"finish_reason": reason}}
            await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
            return resp
        for i in range(1, n + 1):
            prompt = -1 if shape == "negative-prompt" else len(body["input_ids"])
            meta = {"prompt_tokens": prompt, "completion_tokens": i}
            if shape == "bad-figures" and i == n:
                meta |= {"spec_verify_ct": 1.5, "verify_step_ms": -3, "spec_accept_length": "3"}
            if nan_in == "meta" and i == n:
                meta["spec_accept_length"] = NAN
            if error_mid_stream and i == 2:
                error = {"error": {"message": "CUDA out of memory", "code": 500}}
                await resp.write(f"data: {json.dumps(error)}\n\n".encode())
                return resp
            chunk = {"list-chunk": [1, 2, 3], "text-meta": {"meta_info": "done"}}.get(shape)
            chunk = chunk if chunk is not None and i == n else {"meta_info": meta}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/get_server_info", info)
    app.router.add_post("/flush_cache", flush)
    app.router.add_post("/generate", generate)
    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nan-in", choices=["info", "meta", "after"])
    p.add_argument("--error-mid-stream", action="store_true")
    p.add_argument(
        "--shape",
        choices=[
            "list-chunk",
            "text-meta",
            "vocab0",
            "vocab-huge",
            "bad-figures",
            "negative-prompt",
            "abort",
        ],  # fmt: skip
    )
    p.add_argument("--chatty", type=int, default=0, metavar="BYTES")
    p.add_argument("--unhealthy-after", type=int, metavar="N")
    p.add_argument("--max-total-tokens", type=int, default=100000, metavar="T")
    p.add_argument("--stall-on", choices=["generate", "info"])
    p.add_argument("--stall-at", type=int, default=1, metavar="N")
    args = p.parse_args()
    if args.chatty:
        print("faulty server starting", flush=True)
    app = build(
        args.nan_in,
        args.error_mid_stream,
        args.shape,
        args.chatty,
        args.unhealthy_after,
        args.max_total_tokens,
        (args.stall_on, args.stall_at) if args.stall_on else None,
    )
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)
