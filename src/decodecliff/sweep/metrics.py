"""Per-point latency metrics from a recorded stream, defined as in SGLang's bench_serving.

A stream is recorded as events ``(t, tokens)``: ``t`` seconds since the request was sent,
``tokens`` the cumulative number of generated tokens the server had reported at that chunk.

- ``ttft_s``: send -> first chunk that carries a token.
- ``e2e_s``: send -> end of the stream (``[DONE]``), bench_serving's "E2E latency".
- ``tpot_ms``: ``(e2e - ttft) / (completion_tokens - 1)``, bench_serving's TPOT.
- ``itl_ms_*``: inter-token latency. A chunk may carry several tokens (speculative decoding
  accepts a block per verify step); like bench_serving, its gap to the previous token-bearing
  chunk is split evenly over its new tokens (``[gap / n] * n``), so every token after the first
  chunk contributes one ITL sample and the samples sum to ``decode_wall_s``. Chunks that add
  no token are ignored and their gap rolls into the next token-bearing chunk.
- ``decode_tok_s``: ``(completion_tokens - 1) / (t_last - t_first)``; ``decode_wall_s`` is that
  denominator (first to last token-bearing chunk).
- ``prefill_tok_s``: ``prompt_tokens / ttft``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

Event = tuple[float, int]


def itl_samples(events: Sequence[Event]) -> list[float]:
    """Inter-token latencies in seconds, one per token after the first (bench_serving rule)."""
    samples: list[float] = []
    last_t: float | None = None
    last_n = 0
    for t, n in events:
        if n <= last_n:
            continue
        if last_t is not None:
            new = n - last_n
            samples.extend([(t - last_t) / new] * new)
        last_t, last_n = t, n
    return samples


def _token_events(events: Sequence[Event]) -> list[Event]:
    """The events that brought new tokens, in order."""
    out: list[Event] = []
    last_n = 0
    for t, n in events:
        if n > last_n:
            out.append((t, n))
            last_n = n
    return out


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def compute(
    events: Sequence[Event],
    prompt_tokens: int | None,
    e2e_s: float | None = None,
    completion_tokens: int | None = None,
) -> dict:
    """Metrics of one request; fields that cannot be defined (e.g. ITL of one token) are None.

    ``completion_tokens`` defaults to the last event's count; ``e2e_s`` is None for a stream
    that never finished (then TPOT is undefined too).
    """
    for (t0, _), (t1, _) in zip(events, events[1:], strict=False):
        if t1 < t0:
            raise ValueError(f"event times must not decrease: {t0} then {t1}")
    tokens = _token_events(events)
    n = completion_tokens if completion_tokens is not None else (tokens[-1][1] if tokens else 0)
    ttft = tokens[0][0] if tokens else None
    decode_wall = tokens[-1][0] - tokens[0][0] if tokens else None
    itl = itl_samples(events)
    m: dict = {
        "ttft_s": ttft,
        "e2e_s": e2e_s,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n,
        "prefill_tok_s": _ratio(prompt_tokens, ttft) if prompt_tokens and ttft else None,
        "decode_wall_s": decode_wall,
        "decode_tok_s": _ratio(n - 1, decode_wall) if decode_wall is not None and n > 1 else None,
        "tpot_ms": None,
        "token_chunks": len(tokens),
        "itl_ms_mean": _ms(float(np.mean(itl))) if itl else None,
    }
    if ttft is not None and e2e_s is not None and n > 1:
        m["tpot_ms"] = _ms((e2e_s - ttft) / (n - 1))
    for q in (50, 90, 99):
        m[f"itl_ms_p{q}"] = _ms(float(np.percentile(itl, q))) if itl else None
    return m


# -- per-request step rates, and a point's summary over its requests ---------------------------

# Metrics summarised over a point's requests (median and spread); the rest are per request only.
SUMMARY_KEYS = (
    "ttft_s", "e2e_s", "prefill_tok_s", "decode_tok_s", "decode_wall_s", "tpot_ms",
    "itl_ms_mean", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "spec_accept_length",
    "verify_steps_s_client", "verify_steps_s_server", "verify_step_ms_server",
)  # fmt: skip


# The optional figures a server may report per request (meta_info), and whether each is a count.
SERVER_FIGURES = {
    "spec_accept_length": False,
    "spec_verify_ct": True,
    "decode_steps": True,
    "verify_step_ms": False,
    "decode_step_ms": False,
}


MAX_COUNT = 2**53  # a count a server reports; above this a float no longer holds every integer


def is_amount(v: object) -> bool:
    """Whether ``v`` is a finite non-negative number (not a bool; an integer up to MAX_COUNT)."""
    if isinstance(v, float):
        return math.isfinite(v) and v >= 0
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def is_count(v: object) -> bool:
    """Whether ``v`` is a whole number from 0 to MAX_COUNT (3 or 3.0; not True, NaN or 1e300)."""
    return is_amount(v) and v <= MAX_COUNT and v == int(v)


def server_figures(meta: dict) -> tuple[dict, list[str]]:
    """The figures of SERVER_FIGURES that ``meta`` reports, each a non-negative finite number (a
    whole one for a count) or None, and a note for each value dropped as not one."""
    figures, notes = {}, []
    for key, whole in SERVER_FIGURES.items():
        v = meta.get(key)
        ok = is_count(v) if whole else is_amount(v)
        figures[key] = (int(v) if whole else v) if ok else None
        if v is not None and not ok:
            kind = "count" if whole else "non-negative number"
            notes.append(f"the server's {key} {json.dumps(v)[:50]} is not a {kind}: not recorded")
    return figures, notes


def step_rates(m: dict, meta: dict) -> dict:
    """Verify (or decode) steps per second from the client's clock and from the server's own
    step times, and the steps counted: what tokens/s is made of when acceptance varies.

    Client: the steps the server reports for the request (``spec_verify_ct``, else, without
    speculation, ``decode_steps``) over ``decode_wall_s``; every step after the first token
    emits at least one token, so this is the step rate a user sees. Server: 1000 / its mean
    step time (``verify_step_ms``, else ``decode_step_ms``), where it reports one (SGLang
    does not).
    """
    # without speculation SGLang reports spec_verify_ct 0: the steps are then decode steps
    candidates = (meta.get("spec_verify_ct"), m.get("spec_verify_ct"), meta.get("decode_steps"))
    steps = next((v for v in candidates if v), None)
    step_ms = meta.get("verify_step_ms")
    if step_ms is None:
        step_ms = meta.get("decode_step_ms")
    wall = m.get("decode_wall_s")
    good = isinstance(steps, int | float) and steps > 0
    return {
        "verify_steps": int(steps) if good else None,
        "verify_steps_s_client": steps / wall if good and wall else None,
        "verify_step_ms_server": float(step_ms) if step_ms else None,
        "verify_steps_s_server": 1e3 / float(step_ms) if step_ms else None,
    }


def median(values: Sequence[float | None]) -> float | None:
    """Median of the values that are not None (None when there are none)."""
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def point_summary(requests: Sequence[dict]) -> dict:
    """A point's metrics: the median over its requests of every summarised metric, the counts."""
    ms = [r["metrics"] for r in requests]
    out: dict = {k: median([m.get(k) for m in ms]) for k in SUMMARY_KEYS}
    out["prompt_tokens"] = ms[0].get("prompt_tokens") if ms else None
    out["completion_tokens"] = int(min(m.get("completion_tokens") or 0 for m in ms)) if ms else 0
    out["token_chunks"] = int(median([m.get("token_chunks") for m in ms]) or 0)
    steps = [m.get("verify_steps") for m in ms]
    out["verify_steps"] = int(sum(s for s in steps if s)) if any(steps) else None
    out["spec_verify_ct"] = median([m.get("spec_verify_ct") for m in ms])
    if out["spec_verify_ct"] is not None:
        out["spec_verify_ct"] = int(out["spec_verify_ct"])
    out["requests"] = len(ms)
    return out
