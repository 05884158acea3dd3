"""Request validation for SGLang's /generate and OpenAI's /v1/completions bodies.

Every problem raises BadRequest with a message naming the offending field, which the server answers
with a 400 JSON error; nothing here touches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from decodecliff.engine.request import SamplingParams

from . import tokenizer

MAX_TEMPERATURE = 100.0


class BadRequest(ValueError):
    """The request body is invalid (HTTP 400)."""


@dataclass
class ParsedRequest:
    prompt: list[int]
    params: SamplingParams
    stream: bool


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(value: object, name: str, lo: int, hi: int) -> int:
    if not _is_int(value):
        raise BadRequest(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {value!r}")
    return value


def _temperature(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"temperature must be a number, got {type(value).__name__}")
    if not 0.0 <= float(value) <= MAX_TEMPERATURE:
        raise BadRequest(f"temperature must be in [0, {MAX_TEMPERATURE}], got {value}")
    return float(value)


def _token_ids(value: object, name: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be a list of token ids")
    if value and isinstance(value[0], list):
        raise BadRequest(f"{name}: batched requests are not supported; send one prompt per request")
    for tok in value:
        if not _is_int(tok):
            raise BadRequest(f"{name} must hold integers, got {tok!r}")
        if not 0 <= tok < vocab_size:
            raise BadRequest(f"{name}: token id {tok} is outside the vocabulary [0, {vocab_size})")
    return list(value)


def _prompt(value: object, name: str, vocab_size: int, allow_text: bool = True) -> list[int]:
    if isinstance(value, str) and allow_text:
        ids = tokenizer.encode(value)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        raise BadRequest(f"{name}: batched requests are not supported; send one prompt per request")
    else:
        ids = _token_ids(value, name, vocab_size)
    if not ids:
        raise BadRequest(f"{name} is empty")
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise BadRequest(f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})")
    return ids


def _seed(value: object, name: str) -> int | None:
    return None if value is None else _int(value, name, 0, 2**63 - 1)


def _object(body: object) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_generate(body: object, vocab_size: int, max_tokens: int) -> ParsedRequest:
    """SGLang /generate: input_ids or text, sampling_params, stream."""
    body = _object(body)
    has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
    if has_ids == has_text:
        raise BadRequest("give exactly one of input_ids or text")
    if has_ids:
        prompt = _prompt(body["input_ids"], "input_ids", vocab_size, allow_text=False)
    else:
        if not isinstance(body["text"], str):
            raise BadRequest("text must be a string (batched requests are not supported)")
        prompt = _prompt(body["text"], "text", vocab_size)
    sp = body.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be a JSON object")
    params = SamplingParams(
        max_new_tokens=_int(sp.get("max_new_tokens", 128), "max_new_tokens", 1, max_tokens),
        temperature=_temperature(sp.get("temperature", 0.0)),
        ignore_eos=_bool(sp.get("ignore_eos", False), "ignore_eos"),
        stop_token_ids=tuple(
            _token_ids(sp.get("stop_token_ids") or [], "stop_token_ids", vocab_size)
        ),
        seed=_seed(sp.get("sampling_seed"), "sampling_seed"),
    )
    return ParsedRequest(prompt, params, _bool(body.get("stream", False), "stream"))


def parse_completions(body: object, vocab_size: int, max_tokens: int) -> ParsedRequest:
    """OpenAI /v1/completions: prompt (string or token ids), max_tokens, temperature, stream."""
    body = _object(body)
    if body.get("prompt") is None:
        raise BadRequest("prompt is required")
    prompt = _prompt(body["prompt"], "prompt", vocab_size)
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    if body.get("stop"):
        raise BadRequest("stop strings are not supported; use stop_token_ids")
    params = SamplingParams(
        max_new_tokens=_int(body.get("max_tokens", 16), "max_tokens", 1, max_tokens),
        temperature=_temperature(body.get("temperature", 0.0)),
        ignore_eos=_bool(body.get("ignore_eos", False), "ignore_eos"),
        stop_token_ids=tuple(
            _token_ids(body.get("stop_token_ids") or [], "stop_token_ids", vocab_size)
        ),
        seed=_seed(body.get("seed"), "seed"),
    )
    return ParsedRequest(prompt, params, _bool(body.get("stream", False), "stream"))
