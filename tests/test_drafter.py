"""The n-gram drafter's incremental index proposes exactly what a scan of the whole history does."""

from __future__ import annotations

import random

import pytest
import torch

from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import SamplingParams
from decodecliff.engine.spec import DraftTree, NgramDrafter

MAX_NGRAM = 4


# A reference drafter: every lookup scans the whole history (the most recent longest match first).
def ref_continuations(history: list[int], context: list[int], limit: int) -> list[int]:
    found: list[int] = []
    for n in range(min(MAX_NGRAM, len(context)), 0, -1):
        tail = context[-n:]
        for pos in range(len(history) - 1, n - 1, -1):
            if history[pos - n : pos] == tail and pos not in found:
                found.append(pos)
                if len(found) >= limit:
                    return found
    return found


def ref_chain(history: list[int], prefix: list[int], n: int) -> list[int]:
    draft: list[int] = []
    while len(draft) < n:
        context = prefix[-MAX_NGRAM:] + draft
        starts = ref_continuations(history, context, 1)
        if not starts:
            draft.extend([context[-1]] * (n - len(draft)))
            break
        draft.extend(history[starts[0] : starts[0] + n - len(draft)])
    return draft[:n]


def ref_tree(history: list[int], num_nodes: int, candidates: int = 8) -> DraftTree:
    tree = DraftTree(tokens=[history[-1]], parents=[-1])
    children: dict[tuple[int, int], int] = {}

    def insert(parent: int, seq: list[int]) -> None:
        for tok in seq:
            if len(tree.tokens) >= num_nodes:
                return
            node = children.get((parent, tok))
            if node is None:
                node = len(tree.tokens)
                tree.tokens.append(tok)
                tree.parents.append(parent)
                children[(parent, tok)] = node
            parent = node

    depth = max(num_nodes // 4, 1)
    for start in ref_continuations(history, history, candidates):
        insert(0, history[start : start + depth])
    while len(tree.tokens) < num_nodes:
        leaf = len(tree.tokens) - 1
        path, node = [], leaf
        while node > 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        prefix = history[-MAX_NGRAM:] + path[::-1]
        insert(leaf, ref_chain(history, prefix, num_nodes - len(tree.tokens)))
    return tree


def stream(kind: str, n: int, rng: random.Random) -> list[int]:
    if kind == "random-small-vocab":  # many short matches, few long ones
        return [rng.randrange(6) for _ in range(n)]
    if kind == "random-large-vocab":  # hardly any match: the padding path
        return [rng.randrange(1000) for _ in range(n)]
    if kind == "constant":
        return [7] * n
    period = [rng.randrange(50) for _ in range(rng.randint(3, 20))]  # repetitive, with noise
    return [t if rng.random() > 0.1 else rng.randrange(50) for t in (period * n)[:n]]


@pytest.mark.parametrize(
    "kind", ["random-small-vocab", "random-large-vocab", "constant", "repetitive"]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_incremental_index_drafts_exactly_as_a_full_scan(kind, seed):
    rng = random.Random(seed)
    drafter = NgramDrafter(max_ngram=MAX_NGRAM)
    history = stream(kind, rng.randint(1, 300), rng)
    chain_state, tree_state = drafter.new_state(), drafter.new_state()
    end = 0
    while end < len(history):  # the prompt, indexed one prefill chunk at a time
        end = min(end + rng.randint(1, 64), len(history))
        drafter.observe(chain_state, history, end)
        drafter.observe(tree_state, history, end)
    for _ in range(25):
        n, nodes = rng.randint(1, 20), rng.choice([16, 33, 64])
        chain = drafter.draft_chain(chain_state, history, n)
        assert chain == ref_chain(history, history, n)
        tree = drafter.draft_tree(tree_state, history, nodes)
        ref = ref_tree(history, nodes)
        assert (tree.tokens, tree.parents) == (ref.tokens, ref.parents)
        accepted = chain[: rng.randint(0, n)]  # accepted drafts, then the bonus token
        history += accepted + stream(kind, 1, rng)


def test_observe_never_indexes_past_the_history_and_is_idempotent():
    drafter = NgramDrafter()
    history = [1, 2, 3, 1, 2]
    state = drafter.new_state()
    drafter.observe(state, history, 99)
    table = {k: list(v) for k, v in state.table.items()}
    drafter.observe(state, history, 3)  # already indexed: nothing changes
    assert state.table == table and state.indexed == 5
    assert state.table[(1, 2)] == [2] and state.table[(1,)] == [1, 4]


class CheckedDrafter(NgramDrafter):
    """The engine's drafter, compared with the full-scan reference at every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.mismatches = 0, []

    def draft_chain(self, state, history, n):
        out = super().draft_chain(state, history, n)
        self.calls += 1
        if out != ref_chain(history, history, n):
            self.mismatches.append(len(history))
        return out

    def draft_tree(self, state, history, num_nodes):
        out = super().draft_tree(state, history, num_nodes)
        ref = ref_tree(history, num_nodes)
        self.calls += 1
        if (out.tokens, out.parents) != (ref.tokens, ref.parents):
            self.mismatches.append(len(history))
        return out


@pytest.mark.parametrize("spec", ["chain", "tree"])
def test_engine_drafts_and_outputs_are_unchanged(spec):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    base = torch.randint(1, 512, (70,), generator=g).tolist()
    prompts = [[7, 8, 9] * 30, base[:30] * 3]  # repetitive: some drafts get accepted
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    cfg = {"max_total_tokens": 2048, "chunk_size": 32, "draft_len": 6, "tree_nodes": 16}
    plain = [r.output for r in Engine(EngineConfig(**cfg)).generate(prompts, params)]
    eng = Engine(EngineConfig(spec=spec, **cfg))
    eng.drafter = CheckedDrafter()
    reqs = eng.generate(prompts, params)
    assert [r.output for r in reqs] == plain
    assert eng.drafter.calls > 0 and eng.drafter.mismatches == []
    assert all(r.drafter_state.indexed == len(r.tokens) - 1 for r in reqs)  # prompt indexed
    assert sum(r.accepted for r in reqs) > sum(len(r.verify_ms) for r in reqs)  # drafts accepted
