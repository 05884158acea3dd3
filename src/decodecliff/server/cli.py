"""`decodecliff serve` options: the engine's settings (engine.config.EngineConfig, one option per
field) and where to listen. Parsing needs neither torch nor the server, so --help answers at once;
both load when the server starts (server/app.py)."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from decodecliff.engine.config import EngineConfig, add_options
from decodecliff.helpformat import DefaultsHelpFormatter
from decodecliff.kernels import registry

# The variable whose key the server requires where --api-key is not given; the sweep sends the
# key it holds, so a server it launches in the same environment is swept with its key.
API_KEY_ENV = "DECODECLIFF_API_KEY"

DESCRIPTION = (
    "Serve the synthetic MLA model over SGLang's native HTTP API and OpenAI's, so the same "
    "streaming sweep (and SGLang's, vLLM's and GuideLLM's benchmark clients) run against this "
    "server or a real SGLang one."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decodecliff serve", description=DESCRIPTION, formatter_class=DefaultsHelpFormatter
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the engine runs (auto: CUDA when a GPU is visible)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--port",
        type=port,
        default=30000,
        help="port to listen on (1-65535; 0: a free one, named in the ready line)",
    )
    p.add_argument(
        "--log-level", type=str.lower, choices=("debug", "info", "warning", "error"),
        default="warning", help="logging level",
    )  # fmt: skip
    add_limits(p)
    add_options(p)
    p.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=backend_option,
        help="an option of the attention backend, repeatable: e.g. backend=fa3 (flashinfer), "
        "variant=v4 (custom), index_dtype=int32 (triton, sglang)",
    )
    return p


def add_limits(p: argparse.ArgumentParser) -> None:
    """Who may call, and what one request may cost (server.guard.Settings)."""
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help="require 'Authorization: Bearer KEY' on every route but /health, /ping and /metrics, "
        "as SGLang's --api-key; set it when listening beyond loopback (default: "
        f"${API_KEY_ENV}, else no key)",
    )
    p.add_argument(
        "--max-request-mb",
        type=positive(float, least=1 / 1024),  # 1 KiB: a smaller limit refuses every request
        default=16.0,
        help="largest request body in MiB, at least 1/1024 (a 185k-token prompt as JSON is about "
        "1.5)",
    )
    p.add_argument(
        "--max-json-depth", type=positive(int), default=32, help="deepest nesting of a JSON body"
    )
    p.add_argument(
        "--max-generations",
        type=positive(int),
        default=256,
        help="generations one request may start: prompts of a batch times n",
    )
    p.add_argument(
        "--max-queued-requests",
        type=positive(int),
        default=1024,
        help="generations waiting for admission server-wide, a batch's fan-out counted; beyond "
        "it a request gets 503 with Retry-After (as SGLang's option of the same name)",
    )
    p.add_argument(
        "--upload-timeout",
        type=positive(float),
        default=30.0,
        help="seconds a client has to send a request body (then 408 and the connection closes)",
    )
    p.add_argument(
        "--tokenizer-dir",
        type=Path,
        default=None,
        help="where to write the Hugging Face tokenizer, whose path is then the served model "
        "name (default: $XDG_CACHE_HOME/decodecliff/models/PRESET, ~/.cache without it)",
    )


def positive(kind: type, least: float = 0.0) -> Callable[[str], float]:
    """An argparse type: ``kind`` (int or float), finite and greater than 0 (and at least
    ``least`` where given)."""

    def parse(text: str) -> float:
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive finite number")
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is less than {least:g}")
        return value

    parse.__name__ = kind.__name__
    return parse


def port(text: str) -> int:
    """An argparse type: a TCP port one can listen on (0: the system picks a free one)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {text} is not in 1-65535 (or 0 for a free one)")
    return value


def backend_option(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value as the backend takes it (registry.option_value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, registry.option_value(key, value)


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def check(argv: list[str], auto_device: str = "cpu") -> argparse.Namespace:
    """ValueError with serve's own message where ``argv`` would stop it before it serves (an
    unknown or malformed option, a value out of range), without torch or a device: the study's
    config check runs it on every server it launches, ``--device auto`` (or none) taken as the
    study's device. Backend option values are checked against the registry's CHOICES; the rest
    when the backend is built. Returns the options as serve reads them."""

    def fail(message: str) -> None:
        raise ValueError(message)

    p = parser()
    p.error = fail  # type: ignore[method-assign]  # every parse error raises, none exits
    if {"-h", "--help"} & set(argv):
        raise ValueError("--help in a server's command: it would print its help and exit")
    args = p.parse_args(argv)
    device = auto_device if args.device == "auto" else args.device
    options = dict(args.backend_option)
    registry.check_options(args.backend, options)
    EngineConfig.from_args(args, device=device, backend_options=options).validate()
    return args


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings from the parsed options, with --device resolved to cpu or cuda."""
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is available")
    return EngineConfig.from_args(args, device=device, backend_options=dict(args.backend_option))


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = engine_config(args)
    except ValueError as exc:
        print(f"decodecliff serve: error: {exc}", file=sys.stderr)
        return 2
    if why := registry.unavailable(args.backend, cfg.device):  # a GPU or a package it lacks
        print(f"decodecliff serve: error: {why}", file=sys.stderr)
        return 2
    options = dict(args.backend_option)
    if args.backend == "flashinfer" and options.get("model") == "sm120" and args.device != "cpu":
        from decodecliff.kernels import sm120_model

        sm120_model.preload_shim(["serve", *argv])  # FlashInfer as configured on sm_120
    from decodecliff.server import app  # torch, the engine, aiohttp

    return app.run(cfg, args.host, args.port, app.settings_from_args(args))
