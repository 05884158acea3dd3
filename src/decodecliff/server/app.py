"""`decodecliff serve`: the synthetic MLA engine behind SGLang's native HTTP API and OpenAI's, so
the same streaming sweep (and SGLang's, vLLM's and GuideLLM's benchmark clients) run against this
server or a real SGLang one.

Endpoints: POST /generate (one prompt or a batch), POST /v1/completions, POST /v1/chat/completions,
GET /v1/models, GET /health, GET /health_generate, GET|POST /ping, GET /get_server_info
(/server_info), GET /get_model_info, GET|POST /flush_cache, GET /metrics (Prometheus, SGLang's
names). The served model's name is the path of a Hugging Face tokenizer the server writes at start
(tokenizer.write_hf), so a client that loads "the model's tokenizer" needs nothing else.
Errors are JSON in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, 404 and 405
included: 400 for bad input (naming the parameter, values truncated), 401 without the API key, 403
for a foreign Host or Origin, 408 for an upload slower than its deadline, 413 for a body over the
size limit, 415 for a body that is not JSON, 503 when the server is shutting down, its queue is
full, or device memory runs out inside a request (its memory is given back first), 500 for internal
errors (guard.py bounds what a request may cost); only what aiohttp's HTTP parser refuses before
any handler runs (headers over 8 KB, a Content-Encoding other than gzip or deflate) is its own
plain-text 400. A stream that fails after it began ends with an
error chunk and ``data: [DONE]``. Requests are admitted as SGLang admits them (engine/engine.py: on
their next step plus a share of the rest, the youngest retracted when the pool runs out); one that
could never fit is a 400 at once, and one beyond the queue's bound a 503 with Retry-After. A client
that disconnects cancels its requests. Unlike SGLang, temperature defaults to 0 (greedy) so runs
are deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from aiohttp import web
from aiohttp.typedefs import Handler

from decodecliff import envinfo
from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import SamplingParams
from decodecliff.sweep.launcher import LAUNCH_ID_ENV, http_url

from .guard import Settings, access_middleware, is_loopback, parse_body
from .jobs import Batch, Choice, check_fits, error_body, error_response, respond
from .metrics import Metrics
from .openai_api import OpenAIResponder
from .protocol import (
    BadRequest,
    Limits,
    ParsedRequest,
    parse_chat,
    parse_completions,
    parse_generate,
    show,
)
from .tokenizer import ByteTokenizer, decode, write_hf

log = logging.getLogger("decodecliff.server")
ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", dict)
METRICS = web.AppKey("metrics", Metrics)
LIMITS = web.AppKey("limits", Limits)
SETTINGS = web.AppKey("settings", Settings)
MODEL = web.AppKey("model", str)  # the served model's name: its tokenizer's path
STARTED = web.AppKey("started", int)
# Seconds a connection whose body was not read (408, 413) stays open so the client reads the
# answer before the close (aiohttp's default, 10, keeps a stalled upload for that long).
LINGER = 2.0


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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
        for name in ("Allow", "WWW-Authenticate", "Retry-After"):
            if name in exc.headers:
                resp.headers[name] = exc.headers[name]
        if exc.status in (408, 413):  # no keep-alive after a body that was not read
            resp.force_close()
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.exception("request failed: %s %s", request.method, request.path)
        return error_response(500, f"internal error: {show(exc)}")


async def read_request(
    request: web.Request, parse: Callable[[object, Limits], ParsedRequest]
) -> tuple[dict, ParsedRequest]:
    """(body, parsed request), checked against the engine; big bodies handled in a thread."""
    engine, limits = request.app[ENGINE], request.app[LIMITS]

    def work(body: object) -> ParsedRequest:
        parsed = parse(body, limits)
        check_fits(engine, parsed)
        return parsed

    return await parse_body(request, request.app[SETTINGS], work)


def _check_alive(engine: Engine) -> None:
    if not engine.alive:
        reason = "shutting down" if engine.failed is None else repr(engine.failed)
        raise web.HTTPServiceUnavailable(text=f"engine not running: {reason}")


# Seconds a client refused for a full queue is told to wait: about a few requests' decode.
RETRY_AFTER = 1


def check_queue(engine: Engine, parsed: ParsedRequest, limit: int) -> None:
    """Refuse generations the queue cannot take: 503 while it is full, 400 if it never could."""
    wanted = len(parsed.prompts) * parsed.n
    if wanted > limit:
        raise BadRequest(
            f"{wanted} generations exceed the server's queue of {limit} (--max-queued-requests)"
        )
    queued = engine.num_queued
    if queued + wanted > limit:
        raise web.HTTPServiceUnavailable(
            text=f"server busy: {queued} of {limit} queued generations taken, {wanted} more "
            "asked; retry later",
            headers={"Retry-After": str(RETRY_AFTER)},
        )


def _batch(request: web.Request, parsed: ParsedRequest) -> Batch:
    """The engine requests of an HTTP request, within the queue's bound."""
    # checked and submitted without an await between: no other handler runs
    check_queue(request.app[ENGINE], parsed, request.app[SETTINGS].max_queued)
    if parsed.ignored:
        _log_ignored(parsed.ignored)
    return Batch(request.app[ENGINE], parsed, request.app[METRICS])


_warned: set[str] = set()


def _log_ignored(names: list[str]) -> None:
    new = [n for n in names if n not in _warned]
    if new:  # once per field: a benchmark sends the same fields with every request
        _warned.update(new)
        log.warning("accepted and ignored (they change no output here): %s", ", ".join(new))


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
    _, parsed = await read_request(request, parse_generate)
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
    body, parsed = await read_request(request, parse_chat if chat else parse_completions)
    batch = _batch(request, parsed)
    model = body.get("model") or request.app[MODEL]
    return await OpenAIResponder(parsed, model, chat).run(request, batch)


async def health(request: web.Request) -> web.Response:
    _check_alive(request.app[ENGINE])
    return web.Response(text="OK")


async def ping(request: web.Request) -> web.Response:
    """Liveness of the HTTP server alone (vLLM's and SageMaker's /ping)."""
    return web.Response(text="pong")


async def health_generate(request: web.Request) -> web.Response:
    """Healthy when a one-token request goes through the engine (as SGLang checks); never
    refused for load, and not counted in /metrics as a served request (SGLang's isn't either)."""
    _check_alive(request.app[ENGINE])
    parsed = ParsedRequest([[1]], [SamplingParams(max_new_tokens=1, ignore_eos=True)], False)
    batch = Batch(request.app[ENGINE], parsed, None)
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
        # what the backend planned last (after a step: the variant and splits it resolved to)
        attention_backend_detail=request.app[ENGINE].backend.describe(),
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
            "model_path": request.app[MODEL],
            "tokenizer_path": request.app[MODEL],
            "preset": engine.cfg.preset,
            "is_generation": True,
            "vocab_size": engine.mcfg.vocab_size,
        }
    )


def _model_card(app: web.Application) -> dict:
    engine = app[ENGINE]
    name = app[MODEL]
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
    if request.match_info["model"] not in (card["id"], request.app[ENGINE].cfg.preset):
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
        "gemm": cfg.gemm,  # the weight GEMMs' path: the engine bench's rows are named by it
        "max_total_num_tokens": engine.max_total_num_tokens,
        "max_running_requests": cfg.max_running_requests,
        "new_token_ratio": cfg.new_token_ratio,
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


def make_app(engine: Engine, settings: Settings, model: str) -> web.Application:
    """The application; ``model`` is the served model's name (its tokenizer's path)."""
    middlewares = [json_errors, access_middleware(settings)]
    app = web.Application(client_max_size=settings.max_body, middlewares=middlewares)
    app[ENGINE] = engine
    app[SETTINGS] = settings
    app[MODEL] = model
    app[INFO] = static_info(engine) | {
        "model_path": model,
        "tokenizer_path": model,
        "max_queued_requests": settings.max_queued,
        # the token of the launch that started it (None by hand): the sweep's check that the
        # server answering on its port is the one it launched
        "launch_id": os.environ.get(LAUNCH_ID_ENV),
    }
    app[METRICS] = Metrics(engine, engine.cfg.preset)
    app[STARTED] = int(time.time())
    app[LIMITS] = Limits(
        vocab_size=engine.mcfg.vocab_size,
        max_tokens=engine.max_total_num_tokens,
        tokenizer=ByteTokenizer(engine.mcfg.vocab_size),
        draft_reserve=engine.cfg.spec_tokens - 1,
        max_choices=settings.max_choices,
        # a request without max_tokens: its share of the pool among a full running batch
        fair_share=engine.max_total_num_tokens // engine.cfg.max_running_requests,
    )
    routes = [
        web.post("/generate", generate),
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
        web.get("/v1/models", list_models),
        web.get("/v1/models/{model:.+}", get_model),
        web.get("/health", health),
        web.get("/ping", ping),
        web.post("/ping", ping),
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


async def serve(engine: Engine, host: str, port: int, settings: Settings, model: str) -> None:
    """Serve until SIGTERM, SIGINT or SIGHUP; then in-flight requests end with "server shutting
    down" and the server exits within seconds."""
    # handler_cancellation: a client that disconnects cancels its handler and so its requests
    runner = web.AppRunner(
        make_app(engine, settings, model),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=5,
        lingering_time=LINGER,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    port = runner.addresses[0][1]  # the one bound: port 0 asks the system for a free one
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    if not is_loopback(host) and settings.api_key is None:
        log.warning("listening on %s without --api-key: anyone who can reach it may use it", host)
    print(f"decodecliff server ready at {http_url(host, port)}", flush=True)
    await stop.wait()
    log.warning("shutting down: ending requests in flight")
    await loop.run_in_executor(None, engine.shutdown, 10)  # their last updates reach the handlers
    await runner.cleanup()  # lets those handlers answer (at most shutdown_timeout), then closes


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        max_body=int(args.max_request_mb * 2**20),
        max_depth=args.max_json_depth,
        max_choices=args.max_generations,
        max_queued=args.max_queued_requests,
        upload_timeout=args.upload_timeout,
        api_key=args.api_key or None,
        host=args.host,
        tokenizer_dir=args.tokenizer_dir,
    )


def tokenizer_dir(settings: Settings, preset: str) -> Path:
    if settings.tokenizer_dir is not None:
        return settings.tokenizer_dir.resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (cache / "decodecliff" / "models" / preset).resolve()


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [repr(exc)]
    return lines[-1] if "enforce fail" not in lines[0] else lines[0].split("] ", 1)[-1]


def run(cfg: EngineConfig, host: str, port: int, settings: Settings | None = None) -> int:
    """Build the engine and serve it (see serve); the exit code of `decodecliff serve`."""
    settings = settings or Settings(host=host)
    try:
        engine = Engine(cfg)
        folder = write_hf(
            tokenizer_dir(settings, cfg.preset), engine.mcfg.vocab_size, engine.max_total_num_tokens
        )
    except (ValueError, RuntimeError, MemoryError, OverflowError, OSError) as exc:
        # a pool or batch too big to allocate, an unwritable tokenizer folder: one line
        print(f"decodecliff serve: error: {_error(exc)}", file=sys.stderr)
        return 2
    engine.start()
    try:
        asyncio.run(serve(engine, host, port, settings, str(folder)))
    except (OSError, OverflowError) as exc:  # port in use, bad host
        print(f"decodecliff serve: error: {_error(exc)}", file=sys.stderr)
        return 1
    finally:
        engine.shutdown()
    return 0
