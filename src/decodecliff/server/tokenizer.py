"""A deterministic, reversible tokenizer for the synthetic model's text prompts and outputs.

Token id t decodes to one Unicode character, code point t (ids from 0xD800 up skip the surrogate
block, which cannot appear in text). Encoding is the inverse: a character whose code point is an id
of the vocabulary is that token; any other character becomes its UTF-8 bytes (ids 0..255). So
``encode(decode(ids)) == ids`` for every id of the vocabulary, decoded text grows by exactly one
character per token (streamed deltas and stop strings are exact), and plain ASCII text is one token
per byte. The weights are random, so the text has no meaning; it exists so that text clients work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def hf_files(vocab_size: int, max_length: int) -> dict[str, dict]:
    """tokenizer.json and tokenizer_config.json of this tokenizer in Hugging Face's format.

    Every character is a word of a WordLevel model, so the ids of a decoded text round-trip. A
    character beyond the vocabulary, which `encode` spells as its UTF-8 bytes, has no equivalent
    there: it becomes the unknown token "?".
    """
    vocab = {_char(t): t for t in range(vocab_size)}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": "[\\s\\S]"},  # one piece per character, newlines included
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},  # no spaces between tokens
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "?"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def write_hf(folder: Path, vocab_size: int, max_length: int) -> Path:
    """Write the Hugging Face files into ``folder`` (atomically: servers may start together)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in hf_files(vocab_size, max_length).items():
        text = json.dumps(content, ensure_ascii=False, indent=None)
        path = folder / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        finally:  # a write that failed (a full disk) leaves no partial file behind
            tmp.unlink(missing_ok=True)
    return folder
