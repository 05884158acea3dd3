"""CUDA graphs for decode and verify steps.

A step's inputs are copied into fixed-size device buffers (token ids, positions, cache slots, a page
table [max_batch, max_pages], kv_lens, q_indptr, tree mask) and one graph per (batch size, query
tokens per request) replays the whole model over them. ``max_kv_len`` is pinned to the pool's
capacity when capturing, so a longer context never needs a new graph: the attention backend must
read the true lengths from the ``kv_lens`` buffer on the device (the custom kernel does; the `torch`
backend syncs to the host and cannot be captured, so its steps fall back to eager execution).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from decodecliff.kernels.api import AttentionBackend

from .model import StepInput

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("decodecliff.graphs")


class GraphRunner:
    def __init__(self, engine: Engine, backend: AttentionBackend | None = None) -> None:
        if engine.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.engine = engine
        self.backend = backend if backend is not None else engine.backend
        cfg, pool, dev = engine.cfg, engine.pool, engine.device
        self.max_batch, self.q = cfg.max_running_requests, cfg.spec_tokens
        n = self.max_batch * self.q
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        # Padding rows write to the scratch slot 0 of a page nobody reads past kv_len.
        self.out_slots = torch.zeros(n, dtype=torch.long, device=dev)
        self.page_table = torch.zeros(
            self.max_batch, pool.max_pages_per_req, dtype=torch.int32, device=dev
        )
        self.kv_lens = torch.ones(self.max_batch, dtype=torch.int32, device=dev)
        self.q_indptr = torch.zeros(self.max_batch + 1, dtype=torch.int32, device=dev)
        self.tree_mask = None
        if cfg.spec == "tree":
            self.tree_mask = torch.zeros(
                self.max_batch, self.q, self.q, dtype=torch.bool, device=dev
            )
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.uncapturable: set[tuple[int, int]] = set()
        self.mempool = torch.cuda.graph_pool_handle()

    def captured_shapes(self) -> list[list[int]]:
        return [list(k) for k in sorted(self.graphs)]

    def _static_step(self, bs: int, q: int) -> StepInput:
        T = bs * q
        return StepInput(
            input_ids=self.input_ids[:T],
            positions=self.positions[:T],
            out_slots=self.out_slots[:T],
            page_table=self.page_table[:bs],
            kv_lens=self.kv_lens[:bs],
            q_indptr=self.q_indptr[: bs + 1],
            tree_mask=None if self.tree_mask is None else self.tree_mask[:bs],
            max_q_len=q,
            max_kv_len=self.engine.pool.max_total_tokens,
        )

    def _load(self, step: StepInput, bs: int, T: int) -> None:
        self.input_ids[:T].copy_(step.input_ids)
        self.positions[:T].copy_(step.positions)
        self.out_slots[:T].copy_(step.out_slots)
        pages = step.page_table.shape[1]
        self.page_table[:bs, :pages].copy_(step.page_table[:bs])
        self.kv_lens[:bs].copy_(step.kv_lens)
        self.q_indptr[: bs + 1].copy_(step.q_indptr)
        if self.tree_mask is not None and step.tree_mask is not None:
            self.tree_mask[:bs].copy_(step.tree_mask)

    def _eager(self, step: StepInput) -> torch.Tensor:
        return self.engine.model.forward(step, self.engine.pool.cache, self.backend)

    def _capture(self, key: tuple[int, int]) -> None:
        static = self._static_step(*key)
        model, cache = self.engine.model, self.engine.pool.cache
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy initialisation and autotuning happen outside
                model.forward(static, cache, self.backend)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = model.forward(static, cache, self.backend)
        self.graphs[key] = (graph, out)

    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits for every query row of a decode/verify step, replayed from a graph if possible."""
        bs, T = step.kv_lens.shape[0], step.input_ids.shape[0]
        q = T // bs
        key = (bs, q)
        fixed_shape = step.logit_rows is None and bs * q == T and q == self.q
        if not fixed_shape or bs > self.max_batch or key in self.uncapturable:
            return self._eager(step)
        self._load(step, bs, T)
        if key not in self.graphs:
            try:
                self._capture(key)
            except Exception as exc:  # a backend that syncs or allocates cannot be captured
                log.warning("cannot capture a CUDA graph for %s (%r); running eagerly", key, exc)
                self.uncapturable.add(key)
                torch.cuda.synchronize()
                return self._eager(step)
        graph, out = self.graphs[key]
        graph.replay()
        return out
