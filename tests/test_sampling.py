"""Sampling in the engine (tiny preset, CPU): failures stay with their request; tiny temperatures,
top_k = 1 and a vanishing top_p are greedy; seeds reproduce; top_p keeps the tokens SGLang keeps."""

from __future__ import annotations

import pytest
import torch

from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine, nucleus, sample
from decodecliff.engine.request import Request, SamplingParams

PROMPT = [(5 * i) % 500 + 1 for i in range(30)]


@pytest.fixture(scope="module")
def eng() -> Engine:
    torch.set_num_threads(1)
    return Engine(EngineConfig(preset="tiny", device="cpu", max_total_tokens=2048))


def run(eng: Engine, params: list[SamplingParams]) -> list[Request]:
    reqs = [Request(prompt=list(PROMPT), params=p) for p in params]
    eng.waiting.extend(reqs)
    while any(r.finish_reason is None for r in reqs):
        eng.step()
    return reqs


def test_a_failed_sample_ends_only_its_own_request(eng):
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone = run(eng, [greedy])[0].output
    # NaN passes no HTTP validation; fed to the engine directly it makes sampling fail.
    broken = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=float("nan"))
    ok, bad = run(eng, [greedy, broken])
    assert ok.output == alone and ok.finish_reason["type"] == "length"
    assert bad.finish_reason["type"] == "abort" and bad.status == 500
    assert "sampling failed" in bad.error
    assert eng.pool.allocator.num_free == eng.pool.num_pages


@pytest.mark.parametrize(
    "kw", [{"temperature": 1e-40}, {"temperature": 1e-5}, {"temperature": 2.0, "top_k": 1}]
)
def test_degenerate_sampling_is_greedy(eng, kw):
    greedy = run(eng, [SamplingParams(max_new_tokens=10, ignore_eos=True)])[0].output
    assert run(eng, [SamplingParams(max_new_tokens=10, ignore_eos=True, **kw)])[0].output == greedy


def test_top_p_and_seeds(eng):
    greedy = run(eng, [SamplingParams(max_new_tokens=10, ignore_eos=True)])[0].output
    nucleus = SamplingParams(
        max_new_tokens=10, ignore_eos=True, temperature=1.0, top_p=1e-6, seed=1
    )
    assert run(eng, [nucleus])[0].output == greedy  # only the top token survives
    hot = [
        SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=1.0, seed=s)
        for s in (2, 2, 3)
    ]
    a, b, c = (r.output for r in run(eng, hot))
    assert a == b != c


def drawn(logits: list[float], **kw) -> set[int]:
    """The tokens 256 seeded draws from one distribution give: the ones sampling keeps."""
    rows = torch.tensor([logits]).expand(256, -1)
    params = SamplingParams(temperature=1.0, **kw)
    return set(sample(rows, params, torch.Generator().manual_seed(0)).tolist())


@pytest.mark.parametrize(
    ("n", "top_p", "kept"), [(2, 0.5, 2), (4, 0.25, 2), (4, 0.5, 3), (4, 0.75, 4), (4, 0.2, 1)]
)
def test_top_p_keeps_a_token_whose_more_likely_tokens_hold_top_p_exactly(n, top_p, kept):
    # As SGLang's sampler: a token goes once the mass before it exceeds top_p, so a tie stays.
    # n equal logits give exactly 1/n each, so the mass before each token ties with top_p.
    assert len(drawn([0.0] * n, top_p=top_p)) == kept


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.3, [1]), (0.5, [1, 2]), (0.79, [1, 2]), (0.8, [0, 1, 2]), (0.9, [0, 1, 2])],
)
def test_nucleus_keeps_the_tokens_sglang_keeps(top_p, kept):
    # The mass before the tokens, most likely first: 0, 0.5 and 0.8 (0.5 + 0.3 is float32's 0.8).
    probs = torch.tensor([[0.2, 0.5, 0.3]])  # out of order: the mask is in vocabulary order
    assert nucleus(probs, top_p)[0].nonzero()[:, 0].tolist() == kept


def test_top_p_measures_the_whole_distribution_with_top_k():
    # SGLang filters top_k and top_p jointly on the distribution before either: with top_k = 2
    # the mass before the second token is 0.4 <= 0.5, not 0.4 / 0.7 of the two tokens kept.
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert drawn(logits, top_k=2, top_p=0.5) == {0, 1}
    assert drawn(logits, top_k=2) == {0, 1} and drawn(logits, top_p=0.5) == {0, 1}
