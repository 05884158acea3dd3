"""`decodecliff serve`: the synthetic MLA engine behind SGLang's native HTTP API (and OpenAI's
/v1/completions), so the same streaming sweep runs against this server or a real SGLang one.

Endpoints: POST /generate, GET /health, GET /get_server_info, GET /get_model_info,
POST /flush_cache, POST /v1/completions, GET /v1/models. Errors are JSON
``{"error": {"message", "type", "code"}}``: 400 for bad input, 503 when the KV pool or device memory
runs out inside a request (the request's memory is given back first), 500 for internal errors.
A stream that fails after it began ends with ``data: {"error": ..., "meta_info": ...}`` and
``data: [DONE]``. Unlike SGLang, temperature defaults to 0 (greedy) so runs are deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable

import torch
from aiohttp import web

from decodecliff import envinfo
from decodecliff.engine.config import (
    DTYPES,
    PREFILL_ATTENTION,
    PRESETS,
    SPEC_MODES,
    EngineConfig,
)
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import Request, Update
from decodecliff.kernels.registry import BACKENDS

from . import tokenizer
from .protocol import BadRequest, ParsedRequest, parse_completions, parse_generate

log = logging.getLogger("decodecliff.server")
ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", dict)


def error_response(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    body = {
        "error": {
            "message": message,
            "type": kind.get(status, "InternalServerError"),
            "code": status,
        }
    }
    return web.json_response(body, status=status)


async def _body(request: web.Request) -> object:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None


async def _updates(engine: Engine, parsed: ParsedRequest) -> tuple[Request, AsyncIterator[Update]]:
    """Submit a request; yields the engine's snapshots until the request finishes."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Update] = asyncio.Queue()
    req = Request(
        prompt=parsed.prompt,
        params=parsed.params,
        on_update=lambda update: loop.call_soon_threadsafe(inbox.put_nowait, update),
    )
    engine.check(req.prompt, req.params)

    async def stream() -> AsyncIterator[Update]:
        try:
            while True:
                update = await inbox.get()
                yield update
                if update.finished:
                    return
        finally:
            req.cancelled = True  # no effect once finished; frees the slots of an abandoned one

    engine.submit(req)
    return req, stream()


def _sse(payload: object) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


def _error_chunk(update: Update) -> dict:
    kind = "ServiceUnavailableError" if update.status == 503 else "InternalServerError"
    return {
        "error": {"message": update.error, "type": kind, "code": update.status},
        "meta_info": update.meta_info,
    }


async def _respond(
    request: web.Request,
    updates: AsyncIterator[Update],
    stream: bool,
    chunk: Callable[[Update], dict],
) -> web.StreamResponse:
    """Stream chunk(update) as SSE ending in [DONE], or answer chunk(last update) as plain JSON.

    An error before anything was sent is a plain HTTP error; a stream that fails later sends an
    error chunk (an error update is always the last one) and still ends with [DONE].
    """
    first = await anext(updates)
    if first.error is not None:
        return error_response(first.status, first.error)
    if not stream:
        last = first
        async for update in updates:
            last = update
        if last.error is not None:
            return error_response(last.status, last.error)
        return web.json_response(chunk(last))
    resp = await _open_stream(request)
    update: Update | None = first
    while update is not None:
        payload = _error_chunk(update) if update.error is not None else chunk(update)
        await resp.write(_sse(payload))
        update = await anext(updates, None)
    await resp.write(_sse("[DONE]"))
    return resp


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    if not engine.alive:
        return error_response(503, f"engine not running: {engine.failed!r}")
    try:
        parsed = parse_generate(
            await _body(request), engine.mcfg.vocab_size, engine.max_total_num_tokens
        )
        _, updates = await _updates(engine, parsed)
    except (BadRequest, ValueError) as exc:
        return error_response(400, str(exc))

    def chunk(update: Update) -> dict:
        ids = update.output_ids
        return {"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": update.meta_info}

    return await _respond(request, updates, parsed.stream, chunk)


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    if not engine.alive:
        return error_response(503, f"engine not running: {engine.failed!r}")
    try:
        body = await _body(request)
        parsed = parse_completions(body, engine.mcfg.vocab_size, engine.max_total_num_tokens)
        _, updates = await _updates(engine, parsed)
    except (BadRequest, ValueError) as exc:
        return error_response(400, str(exc))
    base = {
        "id": f"cmpl-{time.time_ns():x}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": str(body.get("model") or engine.cfg.preset),
    }

    def finish(update: Update) -> str | None:
        reason = update.meta_info["finish_reason"]
        return None if reason is None else reason["type"]

    def usage(update: Update) -> dict:
        p, c = update.meta_info["prompt_tokens"], update.meta_info["completion_tokens"]
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    sent = 0  # tokens already streamed; a plain answer is the one chunk of the finished request

    def chunk(update: Update) -> dict:
        nonlocal sent
        text = tokenizer.decode(update.output_ids[sent:])
        sent = len(update.output_ids)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish(update)}
        payload = {**base, "choices": [choice]}
        if update.finished:
            payload["usage"] = usage(update)
        return payload

    return await _respond(request, updates, parsed.stream, chunk)


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    if engine.alive:
        return web.Response(text="OK")
    return error_response(503, f"engine not running: {engine.failed!r}")


async def server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    info = dict(request.app[INFO])
    info.update(
        running_requests=len(engine.running),
        waiting_requests=len(engine.waiting) + engine.inbox.qsize(),
        fragmentation=engine.fragmentation(),
        cuda_graphs_captured=engine.graphs.captured_shapes() if engine.graphs else [],
    )
    return web.json_response(info)


async def model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return web.json_response(
        {
            "model_path": engine.cfg.preset,
            "is_generation": True,
            "vocab_size": engine.mcfg.vocab_size,
        }
    )


async def list_models(request: web.Request) -> web.Response:
    preset = request.app[ENGINE].cfg.preset
    return web.json_response({"object": "list", "data": [{"id": preset, "object": "model"}]})


async def flush_cache(request: web.Request) -> web.Response:
    # There is no prefix cache to drop; answer as SGLang does so clients can call it between points.
    return web.Response(text="Cache flushed.\n")


def static_info(engine: Engine) -> dict:
    cfg = engine.cfg
    return {
        "preset": cfg.preset,
        "model_path": cfg.preset,
        "backend": cfg.backend,
        "attention_backend": cfg.backend,
        "device": cfg.device,
        "dtype": str(cfg.torch_dtype).removeprefix("torch."),
        "page_size": cfg.page_size,
        "chunked_prefill_size": cfg.chunk_size,
        "prefill_attention": cfg.prefill_attention,
        "max_total_num_tokens": engine.max_total_num_tokens,
        "max_running_requests": cfg.max_running_requests,
        "vocab_size": engine.mcfg.vocab_size,
        "num_layers": engine.mcfg.num_layers,
        "speculative_algorithm": cfg.spec,
        "speculative_num_draft_tokens": cfg.spec_tokens,
        "draft_len": cfg.draft_len,
        "tree_nodes": cfg.tree_nodes,
        "cuda_graph": cfg.cuda_graph,
        "defrag": cfg.defrag,
        "defrag_threshold": cfg.defrag_threshold,
        "scatter_seed": cfg.scatter_seed,
        "seed": cfg.seed,
        "threads": torch.get_num_threads(),
        "weight_bytes": engine.model.weight_bytes(),
        "kv_cache_bytes": engine.pool.cache.numel() * engine.pool.cache.element_size(),
        "env": envinfo.collect(),
    }


def make_app(engine: Engine) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)  # a 185k-token prompt as JSON is ~1.5 MB
    app[ENGINE] = engine
    app[INFO] = static_info(engine)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/flush_cache", flush_cache)
    return app


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="decodecliff serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="torch")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on CPU"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=512, help="chunked prefill size (tokens)")
    p.add_argument(
        "--prefill-attention",
        choices=PREFILL_ATTENTION,
        default="backend",
        help="prefill chunks through the attention backend (absorbed) or, as SGLang does, "
        "multi-head attention over K/V decompressed from the latent; decode/verify use the backend",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    size.add_argument(
        "--mem-fraction", type=float, default=0.85, help="of free GPU memory after weights"
    )
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--spec", choices=SPEC_MODES, default="none")
    p.add_argument(
        "--draft-len", type=int, default=16, help="chain verify length (incl. last token)"
    )
    p.add_argument("--tree-nodes", type=int, default=64, help="tree verify size (incl. the root)")
    p.add_argument(
        "--cuda-graph", action="store_true", help="capture decode/verify steps (CUDA only)"
    )
    p.add_argument("--defrag", action="store_true", help="compact scattered KV pages")
    p.add_argument("--defrag-threshold", type=float, default=0.25)
    p.add_argument("--defrag-interval", type=int, default=32, help="steps between checks")
    p.add_argument("--scatter-seed", type=int, default=None, help="start from a shuffled free list")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: all)")
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is available")
    return EngineConfig(
        preset=args.preset,
        backend=args.backend,
        device=device,
        dtype=args.dtype,
        page_size=args.page_size,
        chunk_size=args.chunk_size,
        prefill_attention=args.prefill_attention,
        max_total_tokens=args.max_total_tokens,
        mem_fraction=args.mem_fraction,
        max_running_requests=args.max_running_requests,
        spec=args.spec,
        draft_len=args.draft_len,
        tree_nodes=args.tree_nodes,
        cuda_graph=args.cuda_graph,
        defrag=args.defrag,
        defrag_threshold=args.defrag_threshold,
        defrag_interval=args.defrag_interval,
        scatter_seed=args.scatter_seed,
        seed=args.seed,
        threads=args.threads,
    )


async def serve(engine: Engine, host: str, port: int) -> None:
    runner = web.AppRunner(make_app(engine), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"decodecliff server ready at http://{host}:{port}", flush=True)
    await stop.wait()
    await runner.cleanup()


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = engine_config(args)
        engine = Engine(cfg)
    except ValueError as exc:
        print(f"decodecliff serve: error: {exc}", file=sys.stderr)
        return 2
    engine.start()
    try:
        asyncio.run(serve(engine, args.host, args.port))
    except OSError as exc:  # port in use, bad host
        print(f"decodecliff serve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.shutdown()
    return 0
