"""Speculative decoding is lossless: chain and tree verify emit exactly plain greedy decoding's
tokens, on the torch and triton (interpreter) backends, with the n-gram drafter and with an oracle
drafter that proposes the known continuation most of the time, so verify steps accept many tokens
and tree paths need compaction (the accepted nodes are not the first ones of the tree).
"""

from __future__ import annotations

import random

import pytest

from decodecliff.engine.config import PRESETS, EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import SamplingParams
from decodecliff.engine.spec import DraftTree

VOCAB = PRESETS["tiny"].vocab_size


pytestmark = pytest.mark.usefixtures("one_thread")


def prompts() -> list[list[int]]:
    g = random.Random(5)
    a = [g.randrange(1, VOCAB) for _ in range(30)]
    b = [g.randrange(1, VOCAB) for _ in range(12)]
    return [a + a[:15], b * 4]  # repeats give the n-gram drafter something to find


def engine(backend: str, spec: str, **kw) -> Engine:
    if backend == "triton":
        pytest.importorskip("decodecliff.kernels.triton_baseline")
    cfg = EngineConfig(
        preset="tiny",
        backend=backend,
        device="cpu",
        spec=spec,
        draft_len=6,
        tree_nodes=16,
        max_total_tokens=2048,
        chunk_size=32,
        **kw,
    )
    return Engine(cfg)


class OracleDrafter:
    """Drafts the known greedy continuation, wrong at one random position in `error_rate` of steps.

    A tree puts a wrong sibling before every node of the known path, so the accepted path's nodes
    are never 0, 1, 2, ... and their KV must be moved next to the prefix.
    """

    def __init__(self, references: list[list[int]], error_rate: float = 0.3) -> None:
        self.references, self.error_rate = references, error_rate
        self.rng = random.Random(11)
        self.proposed = 0

    def new_state(self) -> None:
        return None

    def observe(self, state: None, history: list[int], end: int) -> None:
        pass

    def _truth(self, history: list[int], n: int) -> list[int]:
        ref = next((r for r in self.references if r[: len(history)] == history), history)
        truth = ref[len(history) : len(history) + n]  # diverged from the reference: nothing
        truth += [1] * (n - len(truth))  # past the reference's end: anything
        if self.rng.random() < self.error_rate:
            k = self.rng.randrange(n)
            truth[k] = (truth[k] + 1) % VOCAB
        self.proposed += 1
        return truth

    def draft_chain(self, state: None, history: list[int], n: int) -> list[int]:
        return self._truth(history, n)

    def draft_tree(self, state: None, history: list[int], num_nodes: int) -> DraftTree:
        tokens, parents = [history[-1]], [-1]
        parent = 0
        for tok in self._truth(history, (num_nodes - 1) // 2):
            tokens += [(tok + 7) % VOCAB, tok]  # a wrong sibling first, then the known token
            parents += [parent, parent]
            parent = len(tokens) - 1
        while len(tokens) < num_nodes:  # a leaf below the wrong sibling of the root
            tokens.append((tokens[-1] + 3) % VOCAB)
            parents.append(1)
        return DraftTree(tokens, parents)


def serve(eng: Engine, n: int) -> list:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    return eng.generate(prompts(), params)


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    return [r.output for r in serve(engine("torch", "none"), 40)]


def check(eng: Engine, drafter: str, plain: list[list[int]]) -> None:
    oracle = None
    if drafter == "oracle":
        oracle = eng.drafter = OracleDrafter([p + o for p, o in zip(prompts(), plain, strict=True)])
    reqs = serve(eng, len(plain[0]))
    assert [r.output for r in reqs] == plain
    assert eng.pool.allocator.num_free == eng.pool.num_pages
    if oracle is not None:
        assert oracle.proposed > 0
        # Mostly right drafts: most steps accept several tokens, so far fewer steps than tokens.
        for r in reqs:
            assert r.accepted / len(r.verify_ms) > 2.0, (r.accepted, len(r.verify_ms))


@pytest.mark.parametrize("spec", ["chain", "tree"])
@pytest.mark.parametrize("drafter", ["ngram", "oracle"])
def test_speculation_emits_plain_greedy_tokens(plain, spec, drafter):
    check(engine("torch", spec), drafter, plain)


@pytest.fixture(scope="module")
def triton_plain(plain) -> list[list[int]]:
    """The interpreter is slow: 12 tokens, which plain decoding on triton must also give."""
    out = [r.output for r in serve(engine("triton", "none"), 12)]
    assert out == [p[:12] for p in plain]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["chain", "tree"])
def test_speculation_is_lossless_on_triton(triton_plain, spec):
    check(engine("triton", spec), "oracle", triton_plain)


@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_the_length_limit_goes_before_a_stop_token_one_token_at_a_time(plain, spec):
    # As SGLang's check_finished after each accepted token: the limit first, then stop tokens.
    # The oracle's whole drafts are accepted: a chain step emits 6 tokens, a tree step 8 (its
    # path of 7 drafts and the bonus); token k is in the middle of one, with more after it.
    out, eos = plain[0], PRESETS["tiny"].eos_token_id
    k = next(i for i in range(2, len(out)) if out[i] not in out[:i] + [eos] and i % 6 and i % 8)
    for limit, reason in [
        (k + 1, {"type": "length", "length": k + 1}),  # the stop token is the last one allowed
        (k + 2, {"type": "stop", "matched": out[k]}),  # one before: the next one is dropped
    ]:
        eng = engine("torch", spec)
        if spec != "none":
            refs = [p + o for p, o in zip(prompts(), plain, strict=True)]
            eng.drafter = OracleDrafter(refs, error_rate=0.0)
        params = SamplingParams(max_new_tokens=limit, stop_token_ids=frozenset({out[k]}))
        req = eng.generate([prompts()[0]], params)[0]
        assert (req.output, req.finish_reason) == (out[: k + 1], reason)
        assert req.accepted == (k if spec != "none" else 0)  # the prefill emitted token 0
