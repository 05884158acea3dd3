"""The byte tokenizer is reversible for every id a model can emit."""

from __future__ import annotations

import random

import pytest

from decodecliff.engine.config import PRESETS
from decodecliff.server.tokenizer import MAX_VOCAB, ByteTokenizer


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_id_round_trips(preset):
    vocab = PRESETS[preset].vocab_size
    tok = ByteTokenizer(vocab)
    ids = list(range(vocab))
    text = tok.decode(ids)
    assert len(text) == vocab  # one character per token: streamed deltas are exact
    assert tok.encode(text) == ids
    rng = random.Random(1)
    for _ in range(200):
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 64))]
        assert tok.encode(tok.decode(seq)) == seq


def test_the_largest_vocabulary_skips_surrogates():
    tok = ByteTokenizer(MAX_VOCAB)
    ids = list(range(0xD700, 0xD900)) + [MAX_VOCAB - 1]
    text = tok.decode(ids)
    assert not any(0xD800 <= ord(c) < 0xE000 for c in text)
    assert tok.encode(text) == ids
    with pytest.raises(ValueError, match="vocab size"):
        ByteTokenizer(MAX_VOCAB + 1)


def test_text_encodes_to_bytes_beyond_the_vocabulary():
    tok = ByteTokenizer(512)
    assert tok.encode("hello world") == list(b"hello world")
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.encode("é") == [0xE9]  # a token of its own (code point < 512)
    assert tok.encode("€") == list("€".encode())  # U+20AC is no token: its UTF-8 bytes
    assert tok.representable("hé") and not tok.representable("€")
