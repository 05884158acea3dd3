"""Weight GEMMs of a decode/verify step (M = 1..64 token rows): a weight-streaming Triton kernel.

At M = 16 a projection is a stream of its weights (the GEMM's FLOPs are 16 x fewer than the bytes
would allow), so the kernel is built for the copy rate, not the tensor cores: each program owns a
BLOCK_N-wide slice of the output and a 1/SPLIT_K share of K, reading its weight tile once through
a deep software pipeline. The SPLIT_K partial sums go to a float32 workspace; the last program of
a slice to arrive (an acq_rel ticket per slice) adds them in split order, so the result does not
depend on which program finished last, writes the output and re-arms the ticket for the next
launch (a CUDA graph replays the same buffers).

``WeightGemm`` picks, per (M, K, N, weight strides), the fastest of cuBLAS (``x @ w``) and the
configurations in ``CANDIDATES``, timed once on first use outside graph capture; a step captured
before a shape was timed takes cuBLAS for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    split_k: int
    warps: int = 4
    stages: int = 4

    @property
    def name(self) -> str:
        return f"n{self.block_n}k{self.block_k}s{self.split_k}w{self.warps}p{self.stages}"


# Slices of 16..64 columns and 1..8 K-splits: enough programs to cover 132 SMs at every
# projection of the served shapes (N = 1,536 .. 7,168, K = 1,024 .. 7,168). CONFIGS is what the
# GEMM bench times; CANDIDATES what ``WeightGemm`` tunes over at an engine's start.
CONFIGS = tuple(Config(n, k, s) for n in (16, 32, 64) for k in (128, 256) for s in (1, 2, 4, 8))
CANDIDATES = tuple(Config(n, 256, s) for n in (16, 32, 64) for s in (1, 2, 4, 8))
MAX_M = 64
TUNE_REPEATS = 5


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, ticket_ptr, M, N, K,
    sxm, sxk, swk, swn, sym, syn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_share = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = pid_k * k_share
    k_end = tl.minimum(k_begin + k_share, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rm[:, None] * sxm + rk[None, :] * sxk,
            mask=(rm[:, None] < M) & (rk[None, :] < k_end),
            other=0.0,
        )
        w = tl.load(
            w_ptr + rk[:, None] * swk + rn[None, :] * swn,
            mask=(rk[:, None] < k_end) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(x, w, acc)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    y_at = y_ptr + rm[:, None] * sym + rn[None, :] * syn
    if SPLIT_K == 1:
        tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = ws_ptr + (pid_k * BLOCK_M + rm[:, None]) * N + rn[None, :]
        tl.store(part, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the ticket releases it
        ticket = tl.atomic_add(ticket_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:  # the last share of this slice: sum all, in split order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                at = ws_ptr + (s * BLOCK_M + rm[:, None]) * N + rn[None, :]
                total += tl.load(at, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_at, total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(ticket_ptr + pid_n, 0)  # re-armed for the next launch


def block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


class SkinnyGemm:
    """y = x @ w for x [M <= 64, K], w a [K, N] view (row-major or the transpose of [N, K])."""

    def __init__(self) -> None:
        self._scratch: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def scratch(self, cfg: Config, m: int, n: int, device: torch.device):
        """Workspace and tickets per (config, BLOCK_M, N): allocated once, reused by replays."""
        key = (cfg.split_k, cfg.block_n, block_m(m), n, device)
        if key not in self._scratch:
            ws = torch.empty(cfg.split_k * block_m(m) * n, dtype=torch.float32, device=device)
            tickets = torch.zeros(triton.cdiv(n, cfg.block_n), dtype=torch.int32, device=device)
            self._scratch[key] = (ws, tickets)
        return self._scratch[key]

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, cfg: Config, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        m, k = x.shape
        n = w.shape[1]
        if m > MAX_M or w.shape[0] != k:
            shapes = f"{tuple(x.shape)} x {tuple(w.shape)}"
            raise ValueError(f"skinny GEMM takes [<= {MAX_M}, K] x [K, N], got {shapes}")
        y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
        ws, tickets = self.scratch(cfg, m, n, x.device)
        grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
        _skinny_gemm_kernel[grid](
            x, w, y, ws, tickets, m, n, k,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=block_m(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            num_warps=cfg.warps, num_stages=cfg.stages,
        )  # fmt: skip
        return y


class WeightGemm:
    """``x @ w`` for a step's projections: per shape the fastest of cuBLAS and ``CANDIDATES``.

    A shape is (M rounded up to the kernel's row tile, K, N, the weight's strides, dtype). Its
    choice is timed on its first call, with the L2 flushed before each repeat (a step streams
    weights the L2 cannot hold); a call during CUDA-graph capture before that takes cuBLAS.
    On a CPU, and above MAX_M rows (prefill chunks), it is cuBLAS's (torch's) ``x @ w``.
    """

    def __init__(self, candidates: tuple[Config, ...] = CANDIDATES) -> None:
        self.candidates = candidates
        self.skinny = SkinnyGemm()
        self.choices: dict[tuple, Config | None] = {}  # None: cuBLAS

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda or x.shape[0] > MAX_M:
            return x @ w
        key = (block_m(x.shape[0]), x.shape[1], w.shape[1], w.stride(), x.dtype)
        if key not in self.choices:
            if torch.cuda.is_current_stream_capturing():
                return x @ w
            self.choices[key] = self._tune(x, w)
        cfg = self.choices[key]
        return x @ w if cfg is None else self.skinny(x, w, cfg)

    def _tune(self, x: torch.Tensor, w: torch.Tensor) -> Config | None:
        from decodecliff.bench.timing import median_ms

        ref = x @ w
        best, best_ms = None, median_ms(lambda: x @ w, x.device, TUNE_REPEATS)
        for cfg in self.candidates:
            y = self.skinny(x, w, cfg)
            if not torch.allclose(
                y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item()
            ):
                continue  # never pick a configuration that disagrees with cuBLAS
            ms = median_ms(lambda cfg=cfg: self.skinny(x, w, cfg), x.device, TUNE_REPEATS)
            if ms < best_ms:
                best, best_ms = cfg, ms
        return best

    def describe(self) -> list[dict]:
        """What each tuned shape runs (for the bench's records)."""
        return [
            {"m_tile": m, "k": k, "n": n, "impl": "cublas" if c is None else "triton",
             "config": None if c is None else c.name}
            for (m, k, n, _, _), c in self.choices.items()
        ]  # fmt: skip
