"""A deterministic byte-level tokenizer for the synthetic model's `text` prompts.

Encoding: the UTF-8 bytes of the text, one token per byte (ids 0..255). Decoding: token id t becomes
the Latin-1 character of ``t % 256``, one character per token, so decoded text only ever grows by
appending (streamed text deltas are exact) and any id of any vocabulary decodes. The weights are
random, so the text has no meaning; it exists so that text clients work unchanged.
"""

from __future__ import annotations


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return "".join(chr(t % 256) for t in ids)
