"""The byte tokenizer is reversible for every id a model can emit."""

from __future__ import annotations

import json
import random

import pytest

from decodecliff.engine.config import PRESETS
from decodecliff.server.tokenizer import MAX_VOCAB, ByteTokenizer, write_hf


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


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_hugging_face_files_round_trip_every_id(preset, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = PRESETS[preset].vocab_size
    folder = write_hf(tmp_path / preset, vocab, 4096)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ours = ByteTokenizer(vocab)
    ids = list(range(vocab))
    assert tok.decode(ids) == ours.decode(ids)
    assert tok.encode(ours.decode(ids)).ids == ids
    assert tok.encode("a\n\nb").ids == ours.encode("a\n\nb")  # newlines are tokens too
    assert write_hf(tmp_path / preset, vocab, 4096) == folder  # rewriting is harmless
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
