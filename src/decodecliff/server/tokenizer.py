"""A deterministic, reversible tokenizer for the synthetic model's text prompts and outputs.

Token id t decodes to one Unicode character, code point t (ids from 0xD800 up skip the surrogate
block, which cannot appear in text). Encoding is the inverse: a character whose code point is an id
of the vocabulary is that token; any other character becomes its UTF-8 bytes (ids 0..255). So
``encode(decode(ids)) == ids`` for every id of the vocabulary, decoded text grows by exactly one
character per token (streamed deltas and stop strings are exact), and plain ASCII text is one token
per byte. The weights are random, so the text has no meaning; it exists so that text clients work.
"""

from __future__ import annotations

_SURROGATES = 0xD800
_GAP = 0x800  # size of the surrogate block 0xD800..0xDFFF
MAX_VOCAB = 0x110000 - _GAP


def _char(t: int) -> str:
    return chr(t if t < _SURROGATES else t + _GAP)


def _id(c: str) -> int:
    o = ord(c)
    return o if o < _SURROGATES else o - _GAP


class ByteTokenizer:
    def __init__(self, vocab_size: int) -> None:
        if not 256 <= vocab_size <= MAX_VOCAB:
            raise ValueError(f"vocab size must be in [256, {MAX_VOCAB}], got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for c in text:
            t = _id(c)
            if t < self.vocab_size and not 0xD800 <= ord(c) < 0xE000:
                ids.append(t)
            else:
                ids.extend(c.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(map(_char, ids))

    def representable(self, text: str) -> bool:
        """Whether decoded output can contain text (every character is some token)."""
        return all(_id(c) < self.vocab_size and not 0xD800 <= ord(c) < 0xE000 for c in text)


def decode(ids: list[int]) -> str:
    """Decode with no vocabulary bound (every id has its own character)."""
    return "".join(map(_char, ids))
