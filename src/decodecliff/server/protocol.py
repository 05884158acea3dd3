"""Request validation for SGLang's /generate and OpenAI's /v1/completions and /v1/chat/completions.

Every parameter of SGLang's GenerateReqInput and of OpenAI's requests is accepted: honoured where
it applies; one that changes no token of the output (store, metadata, rid, return_routed_experts)
is ignored, once its value is of its API's type (IGNORED_TYPES), and named in the request's
`ignored` list (the server says so in a Warning header);
one that would change the output but cannot be honoured is accepted only at its neutral value (a
penalty of 0, an empty logit_bias). An unknown parameter is refused, as OpenAI's API does. A
problem raises BadRequest with a short message naming the offending field (and `param`), which the
server answers with a 400 JSON error; values are shown truncated. Nothing here touches the engine.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field

from decodecliff.engine.request import SamplingParams
from decodecliff.values import is_int

from .tokenizer import ByteTokenizer

MAX_TEMPERATURE = 100.0
MAX_N = 64
MAX_TOP_LOGPROBS = 20
MAX_STOP = 16
MAX_STOP_CHARS = 4096  # a stop string's length: each is matched as the output grows
MAX_CHOICES = 256  # engine requests one HTTP request may start (prompts x n)

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 2, 60, 60
_short.maxlist = _short.maxdict = _short.maxtuple = 4


def show(value: object) -> str:
    """A value for an error message: short, and safe for any nesting or size."""
    return _short.repr(value)


class BadRequest(ValueError):
    """The request body is invalid (HTTP 400); `param` names the field when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ParsedRequest:
    """One HTTP request: a prompt per input, n choices each (choice i * n + j)."""

    prompts: list[list[int]]
    params: list[SamplingParams]  # per prompt; choice j of a seeded prompt samples with seed + j
    stream: bool
    n: int = 1
    batched: bool = False  # the input was a list: answer with a list (or indexed chunks)
    stop_strings: dict[tuple[int, ...], str] = field(default_factory=dict)
    trim_stop: bool = True  # drop a matched stop string or stop token from the text
    echo: bool = False
    include_usage: bool = False  # a final usage chunk with no choices
    continuous_usage: bool = False  # usage on every chunk (vLLM's continuous_usage_stats)
    ignored: list[str] = field(default_factory=list)  # accepted fields that change nothing

    def choices(self) -> list[tuple[int, list[int], SamplingParams]]:
        """(index, prompt, params) of every choice, seeds spread over a prompt's choices."""
        out = []
        for i, (prompt, params) in enumerate(zip(self.prompts, self.params, strict=True)):
            for j in range(self.n):
                p = params
                if j and params.seed is not None:
                    p = dataclasses.replace(params, seed=params.seed + j)
                out.append((i * self.n + j, prompt, p))
        return out


@dataclass
class Limits:
    vocab_size: int
    max_tokens: int  # the KV pool: no prompt + output may exceed it
    tokenizer: ByteTokenizer
    draft_reserve: int = 0  # KV slots a verify step's drafts take beyond the output
    max_choices: int = MAX_CHOICES
    fair_share: int | None = None  # output tokens of a chat request that names no max_tokens


# value checks ----------------------------------------------------------------------------------
def _int(value: object, name: str, lo: int, hi: int) -> int:
    if not is_int(value):
        raise BadRequest(f"{name} must be an integer, got {type(value).__name__}", name)
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be in [{lo}, {hi}], got {show(value)}", name)
    return value


def _number(value: object, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number, got {type(value).__name__}", name)
    # compared as given (an int beyond a float's range cannot be converted); refuses NaN too
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be in [{lo}, {hi}], got {show(value)}", name)
    return float(value)


def _optional_int(value: object, name: str, lo: int, hi: int, default: int | None) -> int | None:
    """An optional integer field: null (or absent) is the default, anything else an integer."""
    return default if value is None else _int(value, name, lo, hi)


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {show(value)}", name)
    return value


def _flag(body: dict, key: str, where: str = "", default: bool = False) -> bool:
    """An optional true/false field: absent or null is the default, anything else a bool."""
    value = body.get(key)
    return default if value is None else _bool(value, where + key)


def _object(body: object, name: str = "the request body") -> dict:
    if not isinstance(body, dict):
        raise BadRequest(f"{name} must be a JSON object", None if name.startswith("the") else name)
    return body


def _token_ids(value: object, name: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be a list of token ids", name)
    for tok in value:
        if not is_int(tok):
            raise BadRequest(f"{name} must hold integers, got {show(tok)}", name)
        if not 0 <= tok < vocab_size:
            raise BadRequest(
                f"{name}: token id {tok} is outside the vocabulary [0, {vocab_size})", name
            )
    return list(value)


def _prompts(value: object, name: str, lim: Limits, text: bool, ids: bool) -> tuple[list, bool]:
    """Every prompt form: a string, a list of strings, token ids, a list of token-id lists.

    Returns (prompts, batched).
    """
    is_list = isinstance(value, list) and bool(value)
    kinds = (str,) * text + (list,) * ids  # what a batch may hold
    if isinstance(value, str) and text:
        items, batched = [value], False
    elif is_list and any(all(isinstance(v, k) for v in value) for k in kinds):
        items, batched = value, True
    elif isinstance(value, list) and ids:
        items, batched = [value], False
    else:
        want = " or ".join(
            w for w, ok in (("a string or list of strings", text), ("token ids", ids)) if ok
        )
        raise BadRequest(f"{name} must be {want}", name)
    if len(items) > lim.max_choices:  # before any is read: a body may hold millions of tiny ones
        raise BadRequest(
            f"{len(items)} prompts are {len(items)} generations or more; at most "
            f"{lim.max_choices} per request",
            name,
        )
    prompts = []
    for item in items:
        toks = lim.tokenizer.encode(item) if isinstance(item, str) else None
        toks = _token_ids(item, name, lim.vocab_size) if toks is None else toks
        if not toks:
            raise BadRequest(f"{name} is empty", name)
        prompts.append(toks)
    return prompts, batched


def _stop(value: object, name: str, lim: Limits) -> dict[tuple[int, ...], str]:
    """Stop strings as token sequences (one character is one token, so matching is exact).

    A string with a character no token decodes to can never appear in the output: it is kept out.
    """
    if value is None:
        return {}
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise BadRequest(f"{name} must be a string or a list of strings", name)
    if len(items) > MAX_STOP or any(not s for s in items):
        raise BadRequest(f"{name} takes 1..{MAX_STOP} non-empty strings", name)
    if any(len(s) > MAX_STOP_CHARS for s in items):
        raise BadRequest(f"{name}: each string takes at most {MAX_STOP_CHARS} characters", name)
    tok = lim.tokenizer
    return {tuple(tok.encode(s)): s for s in items if tok.representable(s)}


def _refuse(
    body: dict,
    known: set[str],
    neutral: dict[str, object],
    ignored: dict[str, object] | None = None,
    where: str = "",
) -> list[str]:
    """Unknown keys, and known ones the server cannot honour at a non-neutral value, are 400s.

    Returns the keys of `ignored` given a value other than their default (they change nothing).
    """
    ignored = ignored or {}
    unknown = sorted(k for k in body if k not in known and k not in neutral and k not in ignored)
    if unknown:
        names = ", ".join(show(where + k) for k in unknown[:8])
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise BadRequest(f"unsupported parameter(s): {names}{more}")
    for key, ok in neutral.items():
        value = body.get(key)
        if value is None or _neutral(value, ok):
            continue
        raise BadRequest(f"{where}{key} = {show(value)} is not supported", where + key)
    for key in ignored:  # it changes nothing, but is still of its API's type
        value, kind = body.get(key), IGNORED_TYPES[key]
        if value is not None and not JSON_TYPES[kind](value):
            raise BadRequest(f"{where}{key} must be {kind}, got {show(value)}", where + key)
    return [where + k for k, default in ignored.items() if body.get(k) not in (None, default)]


def _number_ok(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _or_list(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    """One value, or a list of them (one per prompt of a batch; null entries allowed)."""
    return lambda v: ok(v) or (isinstance(v, list) and all(x is None or ok(x) for x in v))


def _str_ok(value: object) -> bool:
    return isinstance(value, str)


# JSON types, named as an error message says them
BOOL, INT, NUMBER, STR, OBJECT, LIST = (
    "true or false",
    "an integer",
    "a number",
    "a string",
    "an object",
    "a list",
)
STRS, INTS = "a string or a list of strings", "an integer or a list of integers"
BOOLS = "true or false, or a list of them"
JSON_TYPES: dict[str, Callable[[object], bool]] = {
    BOOL: lambda v: isinstance(v, bool),
    INT: is_int,
    NUMBER: _number_ok,
    STR: _str_ok,
    OBJECT: lambda v: isinstance(v, dict),
    LIST: lambda v: isinstance(v, list),
    STRS: _or_list(_str_ok),
    INTS: _or_list(is_int),
    BOOLS: _or_list(lambda v: isinstance(v, bool)),
    "a string or a number": lambda v: _str_ok(v) or _number_ok(v),
    "a string or an object": lambda v: isinstance(v, str | dict),
}


def _neutral(value: object, ok: object) -> bool:
    """Whether ``value`` is the neutral ``ok`` of its field, as a value of the field's own type:
    () stands for an empty list, object or string, a bool is no number, a number no bool."""
    if ok == ():
        return isinstance(value, (list, dict, str)) and not value
    if isinstance(ok, list):  # a list of strings, e.g. modalities ["text"]
        return isinstance(value, list) and value == ok
    if isinstance(ok, bool) or isinstance(value, bool):
        return value is ok
    return isinstance(value, (int, float)) and value == ok


def _fan_out(prompts: list, n: int, lim: Limits) -> None:
    if len(prompts) * n > lim.max_choices:
        raise BadRequest(
            f"{len(prompts)} prompts x n = {n} is {len(prompts) * n} generations; "
            f"at most {lim.max_choices} per request",
            "n",
        )


def _sampling(
    sp: dict, lim: Limits, names: dict[str, str], defaults: dict[str, object], logprobs: int | None
) -> SamplingParams:
    """SamplingParams from a dict whose keys are mapped by `names` (our field -> client key)."""

    def get(ours: str) -> object:
        key = names.get(ours, ours)
        value = sp.get(key)
        return defaults.get(ours) if value is None else value

    for key in ("skip_special_tokens", "spaces_between_special_tokens"):
        _flag(sp, key)  # the tokenizer has no special tokens to skip or space: checked only
    top_k = get("top_k")
    if is_int(top_k) and top_k == -1:  # -1 is "off" as in SGLang and vLLM (-1.0 is no integer)
        top_k = 0
    top_k = _int(top_k, names.get("top_k", "top_k"), 0, lim.vocab_size)
    return SamplingParams(
        max_new_tokens=_int(get("max_new_tokens"), names["max_new_tokens"], 1, lim.max_tokens),
        temperature=_number(get("temperature"), "temperature", 0.0, MAX_TEMPERATURE),
        top_p=_number(get("top_p"), "top_p", 1e-9, 1.0),
        top_k=top_k,
        ignore_eos=_bool(get("ignore_eos"), "ignore_eos"),
        stop_token_ids=frozenset(
            _token_ids(get("stop_token_ids"), "stop_token_ids", lim.vocab_size)
        ),
        seed=_optional_int(get("seed"), names.get("seed", "seed"), 0, 2**63 - 1, None),
        logprobs=logprobs,
    )


BASE_DEFAULTS = {
    "temperature": 0.0,  # unlike OpenAI and SGLang: deterministic runs unless asked otherwise
    "top_p": 1.0,
    "top_k": 0,
    "ignore_eos": False,
    "stop_token_ids": [],
}


# SGLang /generate ------------------------------------------------------------------------------
GENERATE_KEYS = {
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
}
GENERATE_NEUTRAL = {
    "lora_path": (),
    "image_data": (),
    "audio_data": (),
    "video_data": (),
    "input_embeds": (),
    "custom_logit_processor": (),
    "return_hidden_states": False,
    "session_params": (),
    "modalities": (),
    "positional_embed_overrides": (),
    "multi_item_delimiter_indices": (),
    "require_reasoning": False,
}
# GenerateReqInput's fields that change no output token (routing, tracing, disaggregation,
# extra outputs this model has not), with their defaults: accepted and ignored.
GENERATE_IGNORED: dict[str, object] = {
    "rid": None,
    "session_id": None,
    "return_text_in_logprobs": False,
    "return_routed_experts": False,
    "routed_experts_start_len": 0,
    "return_indexer_topk": False,
    "return_entropy": False,
    "return_bytes": False,
    "return_prompt_token_ids": False,
    "return_sampling_mask": False,
    "return_flat_raw_top_logprobs": False,
    "return_flat_raw_top_logprobs_b64": False,
    "token_ids_logprob": None,
    "log_metrics": True,
    "lora_id": None,
    "bootstrap_host": None,
    "bootstrap_port": None,
    "bootstrap_room": None,
    "bootstrap_pair_key": None,
    "decode_tp_size": None,
    "routed_dp_rank": None,
    "data_parallel_rank": None,
    "disagg_prefill_dp_rank": None,
    "kv_router_hint": None,
    "routing_key": None,
    "conversation_id": None,
    "http_worker_ipc": None,
    "background": False,
    "priority": None,
    "extra_key": None,
    "cache_salt": None,
    "no_logs": False,
    "custom_labels": None,
    "external_trace_header": None,
    "received_time": None,
    "max_thinking_tokens": None,
    "mm_hashes": None,
    "mm_content_hashes": None,
    "use_audio_in_video": False,
    "video_config": None,
    "need_wait_for_mm_inputs": None,
    "num_items_assigned": None,
    "encoder_urls": None,
    "max_dynamic_patch": None,
    "min_dynamic_patch": None,
    "image_max_dynamic_patch": None,
    "video_max_dynamic_patch": None,
    "images_config": None,
}
SAMPLING_KEYS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "sampling_seed",
}
SAMPLING_NEUTRAL = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "json_schema": (),
    "regex": (),
    "ebnf": (),
    "structural_tag": (),
    "custom_params": (),
    "logit_bias": (),
    "stop_regex": (),
}
SAMPLING_IGNORED: dict[str, object] = {"stream_interval": None}


def parse_generate(body: object, lim: Limits) -> ParsedRequest:
    """SGLang /generate: input_ids or text (one or a batch), sampling_params (one or per input)."""
    body = _object(body)
    ignored = _refuse(body, GENERATE_KEYS, GENERATE_NEUTRAL, GENERATE_IGNORED)
    has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
    if has_ids == has_text:
        raise BadRequest("give exactly one of input_ids or text", "input_ids")
    if has_ids:
        prompts, batched = _prompts(body["input_ids"], "input_ids", lim, text=False, ids=True)
    else:
        prompts, batched = _prompts(body["text"], "text", lim, text=True, ids=False)
    sps = body.get("sampling_params")
    sps = {} if sps is None else sps
    if isinstance(sps, list):
        if len(sps) != len(prompts):
            raise BadRequest("sampling_params: give one object or one per input", "sampling_params")
    else:
        sps = [sps] * len(prompts)
    sps = [_object(sp, "sampling_params") for sp in sps]
    # one object given for the whole batch is read once, not once per prompt
    unique = list({id(sp): sp for sp in sps}.values())
    for sp in unique:
        ignored += _refuse(
            sp, SAMPLING_KEYS, SAMPLING_NEUTRAL, SAMPLING_IGNORED, "sampling_params."
        )
    logprob = _flag(body, "return_logprob")
    # null is absent; false or "" is no integer
    top = _optional_int(body.get("top_logprobs_num"), "top_logprobs_num", 0, MAX_TOP_LOGPROBS, 0)
    start = body.get("logprob_start_len")  # SGLang's: one for all prompts, or one per prompt
    starts = start if isinstance(start, list) else [] if start is None else [start]
    starts = [_int(v, "logprob_start_len", -1, 2**31 - 1) for v in starts]
    if logprob and any(v != -1 for v in starts):
        raise BadRequest(
            "logprob_start_len: prompt logprobs are not supported", "logprob_start_len"
        )
    defaults = {**BASE_DEFAULTS, "max_new_tokens": 128}
    names = {"max_new_tokens": "max_new_tokens", "seed": "sampling_seed"}
    read, stops, ns, trims = {}, {}, set(), set()
    for sp in unique:
        stop = _stop(sp.get("stop"), "sampling_params.stop", lim)
        p = _sampling(sp, lim, names, defaults, top if logprob else None)
        read[id(sp)] = dataclasses.replace(p, stop_sequences=tuple(stop))
        stops.update(stop)
        ns.add(_optional_int(sp.get("n"), "sampling_params.n", 1, MAX_N, 1))
        trims.add(not _flag(sp, "no_stop_trim", "sampling_params."))
    params = [read[id(sp)] for sp in sps]
    if len(ns) > 1 or len(trims) > 1:
        raise BadRequest("sampling_params: n and no_stop_trim must agree across the batch")
    n = ns.pop()
    _fan_out(prompts, n, lim)
    return ParsedRequest(
        prompts,
        params,
        _flag(body, "stream"),
        n=n,
        batched=batched,
        stop_strings=stops,
        trim_stop=trims.pop(),
        ignored=sorted(set(ignored)),
    )


# OpenAI ------------------------------------------------------------------------------------------
OPENAI_KEYS = {
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "seed",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "no_stop_trim",
}
OPENAI_NEUTRAL = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_tokens": 0,
    "logit_bias": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
    "json_schema": (),
    "regex": (),
    "ebnf": (),
    "stop_regex": (),
    "lora_path": (),
    "session_params": (),
    "custom_params": (),
    "custom_logit_processor": (),
    "return_hidden_states": False,
}
# OpenAI's (and SGLang's OpenAI-API) fields that change no output token, with their defaults.
OPENAI_IGNORED: dict[str, object] = {
    "user": None,
    "store": False,
    "metadata": None,
    "service_tier": None,
    "prompt_cache_key": None,
    "safety_identifier": None,
    "reasoning_effort": None,
    "verbosity": None,
    "rid": None,
    "priority": None,
    "extra_key": None,
    "cache_salt": None,
    "return_routed_experts": False,
    "routed_dp_rank": None,
    "data_parallel_rank": None,
    "bootstrap_host": None,
    "bootstrap_port": None,
    "bootstrap_room": None,
    "separate_reasoning": True,
    "stream_reasoning": True,
}
COMPLETION_KEYS = OPENAI_KEYS | {"prompt", "logprobs", "echo", "best_of"}
COMPLETION_NEUTRAL = {**OPENAI_NEUTRAL, "suffix": ()}
CHAT_KEYS = OPENAI_KEYS | {
    "messages",
    "logprobs",
    "top_logprobs",
    "add_generation_prompt",
    "response_format",
    "tool_choice",
    "parallel_tool_calls",
}
CHAT_NEUTRAL = {
    **OPENAI_NEUTRAL,
    "tools": (),
    "functions": (),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "modalities": ["text"],
    "echo": False,
    "continue_final_message": False,
    "chat_template": (),
    "chat_template_kwargs": (),
    "documents": (),
}
CHAT_IGNORED = {**OPENAI_IGNORED, "function_call": None}  # there are no functions to call
# The type of every field accepted and ignored above (GENERATE_, SAMPLING_, OPENAI_ and
# CHAT_IGNORED), as SGLang's GenerateReqInput, SamplingParams and OpenAI-API requests and
# OpenAI's API reference type it: it changes nothing, but a value of another type is a 400 (null
# is its default).
IGNORED_TYPES: dict[str, str] = {
    # SGLang /generate
    "rid": STRS,
    "session_id": STR,
    "return_text_in_logprobs": BOOL,
    "return_routed_experts": BOOL,
    "routed_experts_start_len": INT,
    "return_indexer_topk": BOOL,
    "return_entropy": BOOL,
    "return_bytes": BOOL,
    "return_prompt_token_ids": BOOL,
    "return_sampling_mask": BOOLS,  # one per prompt of a batch, as SGLang types it
    "return_flat_raw_top_logprobs": BOOL,
    "return_flat_raw_top_logprobs_b64": BOOL,
    "token_ids_logprob": LIST,
    "log_metrics": BOOL,
    "lora_id": STRS,
    "bootstrap_host": STRS,
    "bootstrap_port": INTS,
    "bootstrap_room": INTS,
    "bootstrap_pair_key": STRS,
    "decode_tp_size": INTS,
    "routed_dp_rank": INT,
    "data_parallel_rank": INT,
    "disagg_prefill_dp_rank": INT,
    "kv_router_hint": OBJECT,
    "routing_key": STR,
    "conversation_id": STR,
    "http_worker_ipc": STR,
    "background": BOOL,
    "priority": INT,
    "extra_key": STRS,
    "cache_salt": STRS,
    "no_logs": BOOL,
    "custom_labels": OBJECT,
    "external_trace_header": OBJECT,
    "received_time": NUMBER,
    "max_thinking_tokens": INT,
    "mm_hashes": LIST,
    "mm_content_hashes": LIST,
    "use_audio_in_video": BOOL,
    "video_config": OBJECT,
    "need_wait_for_mm_inputs": BOOL,
    "num_items_assigned": OBJECT,
    "encoder_urls": LIST,
    "max_dynamic_patch": INT,
    "min_dynamic_patch": INT,
    "image_max_dynamic_patch": INT,
    "video_max_dynamic_patch": INT,
    "images_config": OBJECT,
    # SGLang's sampling_params
    "stream_interval": INT,
    # OpenAI (and SGLang's OpenAI API)
    "user": STR,
    "store": BOOL,
    "metadata": OBJECT,
    "service_tier": STR,
    "prompt_cache_key": STR,
    "safety_identifier": STR,
    "reasoning_effort": "a string or a number",  # SGLang takes an effort in [0, 1) too
    "verbosity": STR,
    "separate_reasoning": BOOL,
    "stream_reasoning": BOOL,
    "function_call": "a string or an object",  # "none", "auto" or {"name": ...}
}
CHAT_ROLES = ("system", "user", "assistant", "developer")


def _max_tokens(body: dict, lim: Limits, default: int) -> int:
    # each checked on its own: compared first, 2.0 or true would pass as the other's 2 or 1
    names = ("max_tokens", "max_completion_tokens")
    given = [_int(body[k], k, 1, lim.max_tokens) for k in names if body.get(k) is not None]
    if len(set(given)) > 1:
        raise BadRequest("max_tokens and max_completion_tokens disagree", "max_tokens")
    return given[0] if given else _int(default, "max_tokens", 1, lim.max_tokens)


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    opts = _object(opts, "stream_options")
    if not stream:
        raise BadRequest("stream_options needs stream = true", "stream_options")
    unknown = sorted(set(opts) - {"include_usage", "continuous_usage_stats"})
    if unknown:
        raise BadRequest(f"unsupported stream_options: {', '.join(unknown)}", "stream_options")
    usage = _flag(opts, "include_usage", "stream_options.")
    every = _flag(opts, "continuous_usage_stats", "stream_options.")
    return usage, every


def _openai(body: dict, lim: Limits, prompts: list, batched: bool, logprobs: int | None, **kw):
    if not isinstance(body.get("model", ""), (str, type(None))):
        raise BadRequest(f"model must be a string, got {show(body['model'])}", "model")
    n = _int(body.get("n", 1) if body.get("n") is not None else 1, "n", 1, MAX_N)
    _fan_out(prompts, n, lim)
    stream = _flag(body, "stream")
    usage, every = _stream_options(body, stream)
    stop = _stop(body.get("stop"), "stop", lim)
    params = _sampling(
        {**body, "max_tokens": _max_tokens(body, lim, kw.pop("default_max"))},
        lim,
        {"max_new_tokens": "max_tokens"},
        BASE_DEFAULTS,
        logprobs,
    )
    params = dataclasses.replace(params, stop_sequences=tuple(stop))
    keep = _flag(body, "include_stop_str_in_output")
    keep |= _flag(body, "no_stop_trim")  # SGLang's name for it
    return ParsedRequest(
        prompts,
        [params] * len(prompts),
        stream,
        n=n,
        batched=batched,
        stop_strings=stop,
        trim_stop=not keep,
        include_usage=usage,
        continuous_usage=every,
        **kw,
    )


def parse_completions(body: object, lim: Limits) -> ParsedRequest:
    """OpenAI /v1/completions: a prompt in any form, n, stop, logprobs, echo, sampling."""
    body = _object(body)
    ignored = _refuse(body, COMPLETION_KEYS, COMPLETION_NEUTRAL, OPENAI_IGNORED)
    if body.get("prompt") is None:
        raise BadRequest("prompt is required", "prompt")
    prompts, batched = _prompts(body["prompt"], "prompt", lim, text=True, ids=True)
    best_of = body.get("best_of")
    if best_of is not None and (not is_int(best_of) or best_of != (body.get("n") or 1)):
        raise BadRequest("best_of other than n is not supported", "best_of")
    lp = _optional_int(body.get("logprobs"), "logprobs", 0, MAX_TOP_LOGPROBS, None)
    echo = _flag(body, "echo")
    if echo and lp is not None:
        raise BadRequest("echo with logprobs (prompt logprobs) is not supported", "echo")
    return _openai(body, lim, prompts, batched, lp, echo=echo, default_max=16, ignored=ignored)


def chat_prompt(messages: object, lim: Limits) -> list[int]:
    """A plain chat template: '<|role|>\\ncontent\\n' per message, then '<|assistant|>\\n'."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    parts = []
    for m in messages:
        # a null field is an absent one, as in the body: a reply fed back carries several
        m = {k: v for k, v in _object(m, "messages").items() if v is not None or k == "content"}
        role, content = m.get("role"), m.get("content")
        if role not in CHAT_ROLES:
            raise BadRequest(
                f"messages: role must be one of {CHAT_ROLES}, got {show(role)}", "messages"
            )
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise BadRequest(f"messages: unsupported field(s) {', '.join(extra)}", "messages")
        if not isinstance(m.get("name", ""), str):
            raise BadRequest(f"messages: name must be a string, got {show(m['name'])}", "messages")
        parts.append(f"<|{role}|>\n{_content(content)}\n")
    return lim.tokenizer.encode("".join(parts) + "<|assistant|>\n")


def _content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadRequest("messages: only text content parts are supported", "messages")
            if not isinstance(part.get("text"), str):
                raise BadRequest("messages: a text part needs a string text", "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest("messages: content must be a string or a list of text parts", "messages")


def parse_chat(body: object, lim: Limits) -> ParsedRequest:
    """OpenAI /v1/chat/completions over the plain chat template."""
    body = _object(body)
    ignored = _refuse(body, CHAT_KEYS, CHAT_NEUTRAL, CHAT_IGNORED)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise BadRequest("response_format other than text is not supported", "response_format")
    _flag(body, "parallel_tool_calls")  # with no tools it changes nothing, but is still a flag
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise BadRequest("tool_choice is not supported (no tools)", "tool_choice")
    if not _flag(body, "add_generation_prompt", default=True):
        raise BadRequest("add_generation_prompt = false is not supported", "add_generation_prompt")
    prompt = chat_prompt(body.get("messages"), lim)
    want = _flag(body, "logprobs")
    top = _optional_int(body.get("top_logprobs"), "top_logprobs", 0, MAX_TOP_LOGPROBS, None)
    if top is not None and not want:
        raise BadRequest("top_logprobs needs logprobs = true", "top_logprobs")
    logprobs = (top or 0) if want else None
    # Up to the context, as vLLM and SGLang, but at most a fair share of the KV pool. Retraction
    # alone would not do: it frees the youngest request, so an old one that grows to the whole
    # pool would starve every later request (retracted or never admitted) until it ends.
    room = lim.max_tokens - len(prompt) - lim.draft_reserve
    if room < 1:
        drafts = f" and a verify step's {lim.draft_reserve} drafts" if lim.draft_reserve else ""
        raise BadRequest(
            f"messages: the prompt ({len(prompt)} tokens{drafts}) leaves no room to generate in "
            f"max_total_num_tokens ({lim.max_tokens})",
            "messages",
        )
    room = min(room, lim.fair_share or room)
    return _openai(body, lim, [prompt], False, logprobs, default_max=room, ignored=ignored)
