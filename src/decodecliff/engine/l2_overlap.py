"""A layer's later weights read into the L2 while its latency-bound middle runs.

Between the q_a|kv_a projection and the o projection a verify step's layer runs small kernels
(the kv part's norm and cache write, q_b, the per-head GEMMs) and attention, which at short
contexts leave DRAM mostly idle; the weight GEMMs after it (o, then gate|up) are streams of weights
whose ramp keeps them below the copy rate. ``L2Overlap`` forks a side stream after the q_a|kv_a
GEMM, asks the L2 there for the layer's later weights in the order they are read (q_b, the
absorbed heads' W_kc and W_vc, o, then the head of gate|up; one ``prefetch.global.L2`` per 128-byte
line), and joins before the o GEMM, so in a CUDA graph the prefetch is a parallel branch of the
layer.

Where the layer's KV would not leave the prefetched lines room in the L2 (long contexts: attention
streams it through the L2 and is DRAM-bound itself), the kernel returns at once; it reads the step's
KV lengths on the device, so a captured graph decides per replay.

Measured on an H200 (notes/engine.md, run a5d7cd7): the GEMMs it feeds gain 2%, the kernels it
shares the SMs with lose more; the step is no faster, so the engine's default is off.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .skinny_gemm import L2_LINE_BYTES, _prefetch_l2

LINES_PER_PROGRAM = 1024  # 8 per thread of 4 warps: one loop trip
PROGRAMS = 66  # half an H200's SMs: the layer's small kernels and attention keep the rest
MAX_BATCH = 256  # kv_lens read in one block (the engine's running requests, padded)


@triton.jit
def _l2_prefetch_kernel(
    ptr, lines, kv_lens, batch, max_kv_tokens,
    LINE_ELEMS: tl.constexpr, BLOCK: tl.constexpr, BATCH: tl.constexpr,
):  # fmt: skip
    rb = tl.arange(0, BATCH)
    kv = tl.sum(tl.load(kv_lens + rb, mask=rb < batch, other=0).to(tl.int64))
    if kv <= max_kv_tokens:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        for start in range(0, lines, tl.num_programs(0) * BLOCK):
            at = start + offs
            _prefetch_l2(ptr + tl.where(at < lines, at, 0) * LINE_ELEMS, at < lines)


class L2Overlap:
    """``fork(weights, kv_lens)`` after the layer's first GEMM, ``join()`` before its o GEMM."""

    def __init__(self, budget_bytes: int, device: torch.device, kv_row_bytes: int) -> None:
        props = torch.cuda.get_device_properties(device)
        self.budget = min(budget_bytes, props.L2_cache_size // 2)
        # the KV of a layer that still leaves the prefetched lines their room in the L2
        self.max_kv_tokens = (props.L2_cache_size - self.budget) // kv_row_bytes
        self.side = torch.cuda.Stream(device)

    def fork(self, weights: list[torch.Tensor], kv_lens: torch.Tensor) -> None:
        """Prefetch the first ``budget`` bytes of ``weights``, in order, on the side stream."""
        self.side.wait_stream(torch.cuda.current_stream())
        left = self.budget
        with torch.cuda.stream(self.side):
            for w in weights:
                nbytes = min(left, w.numel() * w.element_size())
                if nbytes < L2_LINE_BYTES:
                    break
                self._launch(w, nbytes // L2_LINE_BYTES, kv_lens)
                left -= nbytes

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.side)

    def _launch(self, w: torch.Tensor, lines: int, kv_lens: torch.Tensor) -> None:
        dense = w.is_contiguous() or (w.dim() == 2 and w.t().is_contiguous())
        if not dense or kv_lens.numel() > MAX_BATCH:
            raise ValueError("L2 prefetch needs a dense weight and at most 256 requests")
        programs = min(triton.cdiv(lines, LINES_PER_PROGRAM), PROGRAMS)
        _l2_prefetch_kernel[(programs,)](
            w, lines, kv_lens, kv_lens.numel(), self.max_kv_tokens,
            LINE_ELEMS=L2_LINE_BYTES // w.element_size(), BLOCK=LINES_PER_PROGRAM,
            BATCH=MAX_BATCH, num_warps=4,
        )  # fmt: skip
