"""`decodecliff serve`: the synthetic MLA engine behind SGLang's native HTTP API and OpenAI's, so
the same streaming sweep (and SGLang's, vLLM's and GuideLLM's benchmark clients) run against this
server or a real SGLang one.

Endpoints: POST /generate (one prompt or a batch), POST /v1/completions, POST /v1/chat/completions,
GET /v1/models, GET /health, GET /health_generate, GET /get_server_info (/server_info),
GET /get_model_info, GET|POST /flush_cache, GET /metrics (Prometheus, SGLang's names).
Errors are JSON in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, 404 and 405
included: 400 for bad input (naming the parameter), 413 for a body over the size limit, 503 when the
server is shutting down or device memory runs out inside a request (its memory is given back
first), 500 for internal errors. A stream that fails after it began ends with an error chunk and
``data: [DONE]``. Requests are admitted while the KV pool can hold their worst case and queue
otherwise; one that could never fit is a 400 at once. A client that disconnects cancels its
requests. Unlike SGLang, temperature defaults to 0 (greedy) so runs are deterministic.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import signal
import sys
import time

import torch
from aiohttp import web

from decodecliff import envinfo
from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import SamplingParams

from .jobs import Batch, Choice, error_body, error_response, respond
from .metrics import Metrics
from .openai_api import OpenAIResponder
from .protocol import (
    BadRequest,
    Limits,
    ParsedRequest,
    parse_chat,
    parse_completions,
    parse_generate,
)
from .tokenizer import ByteTokenizer, decode

log = logging.getLogger("decodecliff.server")
ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", dict)
METRICS = web.AppKey("metrics", Metrics)
LIMITS = web.AppKey("limits", Limits)
STARTED = web.AppKey("started", int)

# A 185k-token prompt as JSON is ~1.5 MB; bigger bodies are refused (413) while being read, so a
# huge upload never sits in memory, and bodies over PARSE_OFF_LOOP are parsed off the event loop.
MAX_BODY = 16 * 2**20
PARSE_OFF_LOOP = 2**20


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """Every error as JSON in OpenAI's shape: bad input, unknown routes and methods, bugs."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return error_response(400, str(exc), exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        resp = error_response(exc.status, f"{message} ({request.method} {request.path})")
        if "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.exception("request failed: %s %s", request.method, request.path)
        return error_response(500, f"internal error: {exc!r}")


async def read_json(request: web.Request) -> object:
    """The body as JSON: size-limited, charset-checked, nesting-safe, big ones parsed off-loop."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=request.content_length)
    raw = await request.read()  # raises 413 past client_max_size without reading further
    charset = request.charset or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        raise BadRequest(f"unsupported charset {charset!r} in Content-Type") from None
    try:
        text = raw.decode(charset)
        if len(raw) > PARSE_OFF_LOOP:
            return await asyncio.get_running_loop().run_in_executor(None, json.loads, text)
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise BadRequest("malformed JSON body: nested too deeply") from None


def _check_alive(engine: Engine) -> None:
    if not engine.alive:
        reason = "shutting down" if engine.failed is None else repr(engine.failed)
        raise web.HTTPServiceUnavailable(text=f"engine not running: {reason}")


def _batch(request: web.Request, parsed: ParsedRequest) -> Batch:
    try:
        return Batch(request.app[ENGINE], parsed, request.app[METRICS])
    except ValueError as exc:  # can never fit this engine
        raise BadRequest(str(exc)) from None


# SGLang's native API -----------------------------------------------------------------------------
def sglang_meta(choice: Choice, parsed: ParsedRequest) -> dict:
    meta = dict(choice.meta)
    stop = choice.matched_stop()
    if stop is not None:  # report the stop string, as SGLang does
        meta["finish_reason"] = {**meta["finish_reason"], "matched": parsed.stop_strings[stop]}
    if choice.req.params.logprobs is not None:
        meta["output_token_logprobs"] = [
            [lp, t, None] for t, (lp, _) in zip(choice.ids, choice.logprobs, strict=True)
        ]
        if choice.req.params.logprobs:
            meta["output_top_logprobs"] = [
                [[v, a, None] for a, v in alts] for _, alts in choice.logprobs
            ]
    return meta


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    _check_alive(engine)
    parsed = parse_generate(await read_json(request), request.app[LIMITS])
    batch = _batch(request, parsed)
    multi = parsed.batched or parsed.n > 1

    def chunk(choice: Choice) -> dict:
        out = {
            "text": decode(choice.ids[: choice.visible(parsed)]),
            "output_ids": list(choice.ids),
            "meta_info": sglang_meta(choice, parsed),
        }
        return out | {"index": choice.index} if multi else out

    def body(choices: list[Choice]) -> object:
        outs = [chunk(c) for c in sorted(choices, key=lambda c: c.index)]
        return outs if multi else outs[0]

    def error_chunk(choice: Choice) -> dict:
        out = {**error_body(choice.status, choice.error), "meta_info": choice.meta}
        return out | {"index": choice.index} if multi else out

    return await respond(request, batch, chunk, body, error_chunk)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


async def _openai(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE]
    _check_alive(engine)
    body = await read_json(request)
    parse = parse_chat if chat else parse_completions
    parsed = parse(body, request.app[LIMITS])
    batch = _batch(request, parsed)
    model = str(body.get("model") or engine.cfg.preset)
    return await OpenAIResponder(parsed, model, chat).run(request, batch)


async def health(request: web.Request) -> web.Response:
    _check_alive(request.app[ENGINE])
    return web.Response(text="OK")


async def health_generate(request: web.Request) -> web.Response:
    """Healthy when a one-token request goes through the engine (as SGLang checks)."""
    _check_alive(request.app[ENGINE])
    parsed = ParsedRequest([[1]], [SamplingParams(max_new_tokens=1, ignore_eos=True)], False)
    batch = _batch(request, parsed)
    with batch:
        try:
            while not batch.done:
                await asyncio.wait_for(batch.next(), timeout=20)
        except TimeoutError:
            return error_response(503, "health check: no token within 20 s")
    if (bad := batch.first_error()) is not None:
        return error_response(503, f"health check failed: {bad.error}")
    return web.Response(text="OK")


async def server_info(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    stats = request.app[ENGINE].stats()
    info = dict(request.app[INFO])
    info.update(
        running_requests=stats.running,
        waiting_requests=stats.queued,
        fragmentation=stats.fragmentation,
        cuda_graphs_captured=stats.cuda_graphs_captured,
        internal_states=[
            {
                "avg_spec_accept_length": metrics.avg_accept_length,
                "num_running_reqs": stats.running,
                "num_queue_reqs": stats.queued,
                "num_used_tokens": stats.used_tokens,
                "token_usage": stats.token_usage,
            }
        ],
    )
    return web.json_response(info)


async def model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return web.json_response(
        {
            "model_path": engine.cfg.preset,
            "tokenizer_path": None,
            "is_generation": True,
            "vocab_size": engine.mcfg.vocab_size,
        }
    )


def _model_card(app: web.Application) -> dict:
    engine = app[ENGINE]
    name = engine.cfg.preset
    return {
        "id": name,
        "object": "model",
        "created": app[STARTED],
        "owned_by": "decodecliff",
        "root": name,
        "parent": None,
        "max_model_len": engine.max_total_num_tokens,
        "permission": [],
    }


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app)]})


async def get_model(request: web.Request) -> web.Response:
    card = _model_card(request.app)
    if request.match_info["model"] != card["id"]:
        raise web.HTTPNotFound(text=f"model {request.match_info['model']!r} does not exist")
    return web.json_response(card)


async def flush_cache(request: web.Request) -> web.Response:
    # There is no prefix cache to drop; answer as SGLang does so clients can call it between points.
    return web.Response(text="Cache flushed.\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def static_info(engine: Engine) -> dict:
    cfg, stats = engine.cfg, engine.stats()
    return {
        "preset": cfg.preset,
        "model_path": cfg.preset,
        "backend": cfg.backend,
        "attention_backend": cfg.backend,
        "attention_backend_detail": engine.backend.describe(),
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
        "weight_bytes": stats.weight_bytes,
        "kv_cache_bytes": stats.kv_cache_bytes,
        "env": envinfo.collect(),
    }


def make_app(engine: Engine) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[json_errors])
    app[ENGINE] = engine
    app[INFO] = static_info(engine)
    app[METRICS] = Metrics(engine, engine.cfg.preset)
    app[STARTED] = int(time.time())
    app[LIMITS] = Limits(
        vocab_size=engine.mcfg.vocab_size,
        max_tokens=engine.max_total_num_tokens,
        tokenizer=ByteTokenizer(engine.mcfg.vocab_size),
        draft_reserve=engine.cfg.spec_tokens - 1,
    )
    routes = [
        web.post("/generate", generate),
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
        web.get("/v1/models", list_models),
        web.get("/v1/models/{model}", get_model),
        web.get("/health", health),
        web.get("/health_generate", health_generate),
        web.get("/get_server_info", server_info),
        web.get("/server_info", server_info),
        web.get("/get_model_info", model_info),
        web.get("/model_info", model_info),
        web.get("/flush_cache", flush_cache),
        web.post("/flush_cache", flush_cache),
        web.get("/metrics", metrics),
    ]
    app.add_routes(routes)
    return app


async def serve(engine: Engine, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT; then in-flight requests end with "server shutting down"."""
    # handler_cancellation: a client that disconnects cancels its handler and so its requests
    runner = web.AppRunner(
        make_app(engine), access_log=None, handler_cancellation=True, shutdown_timeout=5
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"decodecliff server ready at http://{host}:{port}", flush=True)
    await stop.wait()
    log.warning("shutting down: ending requests in flight")
    await loop.run_in_executor(None, engine.shutdown, 10)  # their last updates reach the handlers
    await runner.cleanup()  # lets those handlers answer (at most shutdown_timeout), then closes


def run(cfg: EngineConfig, host: str, port: int) -> int:
    """Build the engine and serve it (see serve); the exit code of `decodecliff serve`."""
    try:
        engine = Engine(cfg)
    except ValueError as exc:
        print(f"decodecliff serve: error: {exc}", file=sys.stderr)
        return 2
    engine.start()
    try:
        asyncio.run(serve(engine, host, port))
    except OSError as exc:  # port in use, bad host
        print(f"decodecliff serve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.shutdown()
    return 0
