"""Speculative decoding: drafters and greedy acceptance for chains and trees.

A verify step scores a fixed number of query tokens per request, so its shapes never change and the
step can be captured once: a chain is [last token, d_1 .. d_{L-1}]; a tree has N nodes in
topological order, node 0 the last token, each other node a draft token under its parent.

Acceptance compares the drafts with the target's own choice at every position (argmax, or a sample
at temperature > 0): the longest matching chain prefix or tree path is accepted, plus the target's
token after it (the bonus). Greedy, the emitted tokens are exactly those plain decoding would
produce; sampled, each is the target's own draw at its position, so they follow plain decoding's
distribution, but a seed gives other tokens than plain decoding's (a step draws one sample per
query row, accepted or not).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftTree:
    tokens: list[int]  # [N], tokens[0] is the last committed token
    parents: list[int]  # [N], parents[0] = -1, parents[i] < i

    def depths(self) -> list[int]:
        depth = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: node i sees node j when j is i or one of its ancestors."""
        n = len(self.parents)
        mask = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):  # parents come first: copy the parent's row
            if parent >= 0:
                mask[i] = mask[parent]
            mask[i, i] = True
        return torch.from_numpy(mask)


class NgramIndex:
    """Where each n-gram of a growing token list occurred: n-gram -> positions of the next token.

    The index grows with the list (each position is indexed once, positions in ascending order per
    n-gram), so a lookup costs the same at any context length.
    """

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        # Most n-grams of a long history occur once: their entry is a bare position, which (unlike
        # a one-element list) the cyclic collector does not track and rescan while the table grows,
        # so indexing a long prompt is about 3x faster. `table` shows every entry as a list.
        self._entries: dict[tuple[int, ...], int | list[int]] = {}
        self.table: Mapping[tuple[int, ...], list[int]] = _Positions(self._entries)
        self.indexed = 0  # positions < indexed are in the table

    def update(self, history: list[int], end: int | None = None) -> None:
        """Index positions up to end (default: all of history) not indexed yet."""
        end = len(history) if end is None else min(end, len(history))
        start = max(self.indexed, 1)
        entries = self._entries
        for n in range(1, self.max_ngram + 1):
            first = max(start, n)
            if first >= end:
                continue
            # The n tokens before each position, built by zip in C: key i is history[pos-n:pos].
            keys = zip(*(history[first - n + i : end - n + i] for i in range(n)), strict=True)
            for key, pos in zip(keys, range(first, end), strict=True):
                entry = entries.get(key)
                if entry is None:
                    entries[key] = pos
                elif type(entry) is int:
                    entries[key] = [entry, pos]
                else:
                    entry.append(pos)
        self.indexed = max(self.indexed, end)

    def continuations(self, context: list[int], limit: int) -> list[int]:
        """Up to limit positions whose preceding tokens match the context's tail, best first."""
        found: list[int] = []
        for n in range(min(self.max_ngram, len(context)), 0, -1):
            for pos in reversed(self.table.get(tuple(context[-n:]), ())):
                if pos not in found:
                    found.append(pos)
                    if len(found) >= limit:
                        return found
        return found


class _Positions(Mapping[tuple[int, ...], list[int]]):
    """Read-only view of an index's entries, each as the list of its positions."""

    def __init__(self, entries: dict[tuple[int, ...], int | list[int]]) -> None:
        self._entries = entries

    def __getitem__(self, key: tuple[int, ...]) -> list[int]:
        entry = self._entries[key]
        return [entry] if type(entry) is int else entry

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class NgramDrafter:
    """Prompt lookup: continue the most recent longest n-gram match of the history's tail.

    When the history offers fewer tokens than asked the drafter keeps guessing (it looks up its own
    continuation again, then repeats the last token), so every draft has the full size.
    """

    def __init__(self, max_ngram: int = 4, max_candidates: int = 8) -> None:
        self.max_ngram, self.max_candidates = max_ngram, max_candidates

    def new_state(self) -> NgramIndex:
        return NgramIndex(self.max_ngram)

    def observe(self, state: NgramIndex, history: list[int], end: int) -> None:
        """Index history[:end] ahead of drafting (the prompt, one prefill chunk at a time)."""
        state.update(history, end)

    def draft_chain(self, state: NgramIndex, history: list[int], n: int) -> list[int]:
        state.update(history)
        return self._chain(state, history, history, n)

    @staticmethod
    def _chain(state: NgramIndex, history: list[int], prefix: list[int], n: int) -> list[int]:
        """n tokens after prefix (history plus uncommitted guesses), looked up in history."""
        draft: list[int] = []
        while len(draft) < n:
            context = prefix[-state.max_ngram :] + draft
            starts = state.continuations(context, 1)
            if not starts:
                draft.extend([context[-1]] * (n - len(draft)))
                break
            draft.extend(history[starts[0] : starts[0] + n - len(draft)])
        return draft[:n]

    def draft_tree(self, state: NgramIndex, history: list[int], num_nodes: int) -> DraftTree:
        state.update(history)
        tree = DraftTree(tokens=[history[-1]], parents=[-1])
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node

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
        for start in state.continuations(history, self.max_candidates):
            insert(0, history[start : start + depth])
        # Pad with best guesses below the newest node (a leaf, so every guess adds nodes).
        while len(tree.tokens) < num_nodes:
            leaf = len(tree.tokens) - 1
            path, node = [], leaf
            while node > 0:
                path.append(tree.tokens[node])
                node = tree.parents[node]
            prefix = history[-self.max_ngram :] + path[::-1]
            guess = self._chain(state, history, prefix, num_nodes - len(tree.tokens))
            insert(leaf, guess)
        return tree


def accept_chain(draft: list[int], target: list[int]) -> list[int]:
    """Tokens emitted by one chain verify step.

    draft = [d_1 .. d_{L-1}] (the tokens after the last committed one); target[i] is the target's
    token after query position i. Returns the accepted drafts plus the bonus token.
    """
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target[accepted]:
        accepted += 1
    return draft[:accepted] + [target[accepted]]


def accept_tree(tree: DraftTree, target: list[int]) -> tuple[list[int], list[int]]:
    """(accepted node path starting at the root, emitted tokens) for one tree verify step."""
    children: dict[int, dict[int, int]] = {}
    for node in range(1, len(tree.parents)):
        children.setdefault(tree.parents[node], {}).setdefault(tree.tokens[node], node)
    path, node = [0], 0
    while (nxt := children.get(node, {}).get(target[node])) is not None:
        path.append(nxt)
        node = nxt
    emitted = [tree.tokens[n] for n in path[1:]] + [target[node]]
    return path, emitted
