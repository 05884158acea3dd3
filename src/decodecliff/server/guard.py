"""What keeps a request from hurting the server: who may call, and how big and deep a body may be.

Bodies are read under a size limit and an upload deadline, must be JSON (a Content-Type other than
application/json is refused, so a web page cannot send one without a CORS preflight), in a text
charset, and no deeper than a few levels; big ones are decoded and validated off the event loop so
/health keeps answering. A server bound to loopback answers only requests whose Host names
loopback (no DNS rebinding) and refuses cross-site Origins; with an API key, every route but
/health, /ping and /metrics needs ``Authorization: Bearer <key>`` (as SGLang's --api-key).
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

from .protocol import MAX_CHOICES, BadRequest, show

T = TypeVar("T")

# JSON is UTF-8 (RFC 8259); UTF-16/32 and Latin-1 are still read, being text encodings.
TEXT_CHARSETS = {"utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"}
TEXT_CHARSETS |= {"ascii", "latin-1", "iso8859-1"}
JSON_TYPES = ("application/json", "application/octet-stream")
OPEN_PATHS = ("/health", "/ping", "/metrics")  # reachable without the API key, as in SGLang
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


@dataclass(frozen=True)
class Settings:
    """Bounds on what one request may cost, and who may send one (`decodecliff serve` options)."""

    max_body: int = 16 * 2**20  # a 185k-token prompt as JSON is ~1.5 MB
    max_depth: int = 32  # nesting of the body's arrays and objects
    upload_timeout: float = 30.0  # seconds to receive a whole body
    parse_off_loop: int = 64 * 2**10  # bodies bigger than this are decoded in a thread
    max_choices: int = MAX_CHOICES  # generations one request may start (prompts x n)
    max_queued: int = 1024  # generations waiting for admission, server-wide (then 503)
    api_key: str | None = None
    host: str = "127.0.0.1"  # the address the server listens on
    tokenizer_dir: Path | None = None  # None: under the user's cache folder


def depth_ok(obj: object, limit: int) -> bool:
    """Whether ``obj`` nests no deeper than ``limit`` (iterative: any depth is safe to check)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            if depth > limit:
                return False
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True


def _charset(request: web.Request) -> str:
    name = request.charset or "utf-8"
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        codec = None
    if codec not in TEXT_CHARSETS:
        raise BadRequest(f"unsupported charset {show(name)} in Content-Type (use utf-8)")
    return codec


def _media_type(request: web.Request) -> None:
    # A missing Content-Type is taken as JSON (plain HTTP clients); a form or text/plain body is
    # what a web page may send cross-site without asking: refused, so `curl -d` (a form) needs
    # -H 'Content-Type: application/json'.
    if "Content-Type" not in request.headers:
        return
    kind = request.content_type
    if kind not in JSON_TYPES and not kind.endswith("+json"):
        raise web.HTTPUnsupportedMediaType(text=f"Content-Type {show(kind)}: send application/json")


async def _read(request: web.Request, settings: Settings) -> bytes:
    if request.content_length is not None and request.content_length > settings.max_body:
        raise web.HTTPRequestEntityTooLarge(
            max_size=settings.max_body, actual_size=request.content_length
        )
    try:
        async with asyncio.timeout(settings.upload_timeout):
            return await request.read()  # 413 past client_max_size, without reading further
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"request body not received within {settings.upload_timeout:g} s"
        ) from None
    except web.HTTPException:
        raise
    except Exception as exc:  # a broken gzip or deflate body, a connection cut mid-upload
        reason = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else repr(exc)
        raise BadRequest(f"unreadable request body: {show(reason)}") from None


def decode_json(raw: bytes, charset: str, max_depth: int) -> object:
    """The body as JSON; BadRequest for anything malformed (never another exception)."""
    try:
        body = json.loads(raw.decode(charset))
    except RecursionError:
        raise BadRequest(f"malformed JSON body: nested too deeply (limit {max_depth})") from None
    except ValueError as exc:  # bad JSON, bad bytes, an integer of thousands of digits
        raise BadRequest(f"malformed JSON body: {show(str(exc))}") from None
    if not depth_ok(body, max_depth):
        raise BadRequest(f"malformed JSON body: nested too deeply (limit {max_depth})")
    return body


async def parse_body(
    request: web.Request, settings: Settings, parse: Callable[[object], T]
) -> tuple[object, T]:
    """(the JSON body, parse(body)): read, decoded and validated; big bodies in a thread."""
    _media_type(request)
    charset = _charset(request)
    raw = await _read(request, settings)

    def work() -> tuple[object, T]:
        body = decode_json(raw, charset, settings.max_depth)
        return body, parse(body)

    if len(raw) > settings.parse_off_loop:
        return await asyncio.get_running_loop().run_in_executor(None, work)
    return work()


# who may call ------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(url: str) -> str | None:
    """The host of a URL ("//" + a Host header's value, or an Origin); None where it cannot be
    one."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:  # e.g. an unclosed or invalid [IPv6] literal
        return None


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def access_middleware(settings: Settings) -> Callable:
    """Host/Origin checks for a loopback server and the API key, as one aiohttp middleware."""
    local = is_loopback(settings.host)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = _hostname(f"//{request.headers.get('Host', '')}")
        if host is None:
            raise web.HTTPBadRequest(text=f"malformed Host header {show(request.headers['Host'])}")
        if local and host and not is_loopback(host):  # a DNS-rebound name: a web page's request
            raise web.HTTPForbidden(text=f"Host {show(host)} is not this loopback server")
        origin = request.headers.get("Origin")
        if origin is not None:
            site = "" if origin == "null" else _hostname(origin)
            if site is None:
                raise web.HTTPBadRequest(text=f"malformed Origin header {show(origin)}")
            if not (site and (site == host or (local and is_loopback(site)))):
                raise web.HTTPForbidden(text=f"cross-site request from Origin {show(origin)}")
        if settings.api_key is not None and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            want = f"Bearer {settings.api_key}"
            # a header's bytes that are not UTF-8 come as surrogates: compared as the bytes sent
            if not hmac.compare_digest(_raw(given), _raw(want)):
                raise web.HTTPUnauthorized(
                    text="missing or wrong API key (Authorization: Bearer <key>)",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return guard
