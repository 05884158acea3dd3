"""Exact-length prompts as token ids, unique per point, so no prefix cache can hide prefill.

Prompts are sent as ``input_ids``: no tokenizer sits between the requested and the real length.
The ids come from a RNG seeded by (seed, context), so each point gets its own random sequence
(no shared prefix with any other point) and a rerun of the point sends the same prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Without a known vocabulary, ids in this range are ordinary tokens for every common tokenizer
# (vocabularies of 32k and more keep their special tokens at the very start or the end).
DEFAULT_ID_RANGE = (1000, 30000)


@dataclass(frozen=True)
class IdRange:
    """Half-open range [low, high) the prompt ids are drawn from, and where it came from."""

    low: int
    high: int
    source: str  # "server_info", "--vocab-size" or "default"

    def as_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "source": self.source}


def id_range(server_vocab: int | None, cli_vocab: int | None) -> IdRange:
    """The server's vocabulary wins, then ``--vocab-size``, then a safe default range."""
    for vocab, source in ((server_vocab, "server_info"), (cli_vocab, "--vocab-size")):
        if vocab is not None:
            if int(vocab) < 2:
                raise ValueError(f"vocab size must be at least 2, got {vocab} ({source})")
            return IdRange(0, int(vocab), source)
    return IdRange(*DEFAULT_ID_RANGE, "default")


# Salt of the warm-up prompts: they share no prefix with any point's prompt.
WARMUP_SALT = 1


def make_input_ids(length: int, ids: IdRange, seed: int, ctx: int, salt: int = 0) -> list[int]:
    """``length`` random token ids in ``ids``, determined by (seed, ctx) and a non-zero salt."""
    if length < 1:
        raise ValueError(f"prompt length must be at least 1, got {length}")
    key = [seed, ctx] if salt == 0 else [seed, ctx, salt]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))
    return rng.integers(ids.low, ids.high, size=length, dtype=np.int64).tolist()
