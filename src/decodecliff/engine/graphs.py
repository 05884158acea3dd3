"""CUDA graphs for decode and verify steps.

A step's inputs are copied into fixed-size device buffers (token ids, positions, cache slots, a page
table [max_batch, max_pages], kv_lens, q_indptr, tree mask) and one graph per (batch size, query
tokens per request) replays the whole model over them. ``max_kv_len`` is pinned to the pool's
capacity when capturing, so a longer context never needs a new graph: the attention backend either
reads the true lengths from the ``kv_lens`` buffer on the device inside the graph (the custom and
Triton kernels), or plans on the host before every replay into buffers of fixed address (``plan``:
FlashInfer, SGLang's kernels, as SGLang replays them). A backend that is not ``capturable`` (the
`torch` one) runs eagerly. The runner knows the step functions and the buffer sizes only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .model import StepInput

log = logging.getLogger("decodecliff.graphs")

Forward = Callable[..., torch.Tensor]  # forward(step, planned=False) -> logits
Plan = Callable[[StepInput], None]


class GraphRunner:
    """Replays ``forward`` (a whole model step) from CUDA graphs over fixed-size input buffers.

    It knows only the step function and the sizes that fix the buffers: ``max_batch`` requests of
    ``q_len`` query tokens, ``max_pages`` pages per request, ``max_kv_len`` (the pool's capacity),
    ``tree`` (whether steps carry a tree mask). A forward whose backend is not ``capturable`` (see
    kernels/api.py) runs eagerly. With ``plan``, the graph holds the layers only (``forward(step,
    planned=True)``) and ``plan`` runs on the static inputs before capture and every replay.
    """

    def __init__(
        self,
        forward: Forward,
        *,
        plan: Plan | None = None,
        max_batch: int,
        q_len: int,
        max_pages: int,
        max_kv_len: int,
        tree: bool,
        device: torch.device,
        capturable: bool = True,
    ) -> None:
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.forward_eager, self.plan, self.capturable = forward, plan, capturable
        self.max_batch, self.q, self.max_kv_len = max_batch, q_len, max_kv_len
        n, dev = max_batch * q_len, device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        # Padding rows write to the scratch slot 0 of a page nobody reads past kv_len.
        self.out_slots = torch.zeros(n, dtype=torch.long, device=dev)
        self.page_table = torch.zeros(max_batch, max_pages, dtype=torch.int32, device=dev)
        self.kv_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.q_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=dev)
        self.tree_mask = None
        if tree:
            self.tree_mask = torch.zeros(max_batch, q_len, q_len, dtype=torch.bool, device=dev)
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
            page_table=self.page_table,  # every row: a host plan sizes its buffers once
            kv_lens=self.kv_lens[:bs],
            q_indptr=self.q_indptr[: bs + 1],
            tree_mask=None if self.tree_mask is None else self.tree_mask[:bs],
            max_q_len=q,
            max_kv_len=self.max_kv_len,
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

    def _capture(self, key: tuple[int, int]) -> None:
        static, planned = self._static_step(*key), self.plan is not None
        if planned:
            self.plan(static)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy initialisation and autotuning happen outside
                self.forward_eager(static, planned=planned)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.forward_eager(static, planned=planned)
        self.graphs[key] = (graph, out)

    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits for every query row of a decode/verify step, replayed from a graph if possible."""
        bs, T = step.kv_lens.shape[0], step.input_ids.shape[0]
        q = T // bs
        key = (bs, q)
        fixed_shape = step.logit_rows is None and bs * q == T and q == self.q
        if not (self.capturable and fixed_shape) or bs > self.max_batch:
            return self.forward_eager(step)
        if key in self.uncapturable:
            return self.forward_eager(step)
        self._load(step, bs, T)
        if key not in self.graphs:
            try:
                self._capture(key)
            except RuntimeError as exc:  # e.g. a workspace that would grow during capture
                log.warning("cannot capture a CUDA graph for %s (%r); running eagerly", key, exc)
                self.uncapturable.add(key)
                torch.cuda.synchronize()
                return self.forward_eager(step)
        elif self.plan is not None:
            self.plan(self._static_step(*key))
        graph, out = self.graphs[key]
        graph.replay()
        return out
