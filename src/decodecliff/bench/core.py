"""The check-and-time core of `decodecliff check-kernel` and `decodecliff bench-kernels`.

Both commands build their random problems here (``problem``: scattered pages in a pool with spare
pages), check a backend the same way (``run_once`` on a NaN-poisoned output, then ``output_error``:
finite, not all zeros, relative L2 error against one float64 ``reference`` within ``REL_TOL``;
``planted_error``: every row of a planted mask problem within ``planted.PLANTED_TOL``) and time the
same launch-only step (``time_step``) against the same floor (``rates``, from the ceilings
``roofline.measure_ceilings`` measures in the run: never a typed number).
"""

from __future__ import annotations

import math
import statistics

import torch

from ..kernels import planted as planting
from ..kernels.api import AttentionBackend, AttnBatch
from ..kernels.reference import TorchAttention, reference_attention
from ..kernels.synthetic import random_batch, relative_error
from . import roofline
from .timing import graph_times_ms, sync, times_ms

# The one tolerance of both commands: relative L2 error against the float64 reference, for every
# backend. bf16 inputs and output with fp32 accumulation: rounding the output to bf16 alone costs
# ~2e-3. Measured on an H200 (16k and 185k, 8 and 64 heads, decode / chain16 / tree64): torch,
# Triton and the custom kernel 1.7e-3..2.1e-3, cuBLAS's gather path (bf16 probabilities) 4.5e-3;
# SGLang's and FlashInfer's kernels 2.7e-3 at most against the torch backend in the published run.
# A wrong index or a lost split moves the output by far more; a single wrong mask decision at long
# context moves it by ~1e-4, which is what the planted check (its own per-row bound) is for.
REL_TOL = 1e-2
SPARE_PAGES = 3  # pool pages no request owns, so pages scatter as in a churned pool
CPU_REFERENCE_WORK = 2e6  # kv tokens x query rows up to which the reference runs on the CPU


def problem(
    kv_lens: list[int],
    q_len: int,
    heads: int,
    page_size: int = 1,
    tree: bool = False,
    *,
    device: torch.device | str,
    seed: int,
) -> AttnBatch:
    """The random problem of both commands: bf16, pages scattered over a pool with spare pages."""
    return random_batch(
        kv_lens, q_len, heads, page_size, tree, device=device, seed=seed, spare_pages=SPARE_PAGES
    )


def float64_batch(batch: AttnBatch) -> AttnBatch:
    """The same problem with q and the cache in float64 (the reference's input), same device."""
    return batch.meta.batch(batch.q.double(), batch.kv_cache.double())


def reference(batch: AttnBatch) -> torch.Tensor:
    """The float64 reference, on the CPU: computed there for small problems, else on the batch's
    device (the same code, kernels/reference.py)."""
    m = batch.meta
    work = sum(m.kv_lens.tolist()) * m.num_tokens * m.num_heads // m.batch_size
    if work < CPU_REFERENCE_WORK:
        return reference_attention(batch)
    return TorchAttention(torch.float64)(float64_batch(batch)).cpu()


def poisoned_output(batch: AttnBatch) -> torch.Tensor:
    """An output buffer of NaN: a kernel that leaves any element unwritten fails the check."""
    return batch.new_output().fill_(float("nan"))


def run_once(backend: AttentionBackend, batch: AttnBatch) -> torch.Tensor:
    """One checked, planned and synchronised call on a NaN-poisoned output."""
    out = poisoned_output(batch)
    backend.prepare(batch, out)()
    sync(batch.device)
    return out


def output_error(out: torch.Tensor, ref: torch.Tensor | None) -> tuple[float | None, str | None]:
    """The relative error against the float64 reference (inf with NaN/inf, None without a reference)
    and why the output fails the check (None: it passes; without a reference only NaN/inf and zeros
    fail)."""
    if not bool(torch.isfinite(out).all()):
        return math.inf, "output has NaN/inf"
    err = None if ref is None else relative_error(out, ref)
    if float(out.abs().amax()) == 0.0:
        return err, "output is all zeros"
    if err is not None and not err < REL_TOL:
        return err, f"rel err {err:.3g} > {REL_TOL:g} vs the float64 reference"
    return err, None


def planted_problem(
    kv_lens: list[int],
    q_len: int,
    heads: int,
    page_size: int,
    tree: bool,
    *,
    device: torch.device | str,
    seed: int,
) -> tuple[planting.Planted, torch.Tensor]:
    """A planted mask problem (kernels/planted.py) and its float64 reference."""
    plant = planting.planted_batch(kv_lens, q_len, heads, page_size, tree, device=device, seed=seed)
    return plant, reference(plant.batch)


def planted_error(backend: AttentionBackend, plant: planting.Planted, ref: torch.Tensor) -> dict:
    """The backend's worst row on the planted problem (planted.worst_row) and whether it passes."""
    worst = planting.worst_row(plant, run_once(backend, plant.batch), ref)
    return {**worst, "ok": worst["max_err"] <= planting.PLANTED_TOL}


def step_times(
    backend: AttentionBackend, batch: AttnBatch, repeats: int, warmup: int, graph: bool = False
) -> list[float]:
    """Each repeat's ms of the backend's launch-only step on ``batch`` (planned outside the timed
    calls; L2 flushed on a GPU); replayed from a CUDA graph where ``graph`` and ``graph_timed``
    say so."""
    step = backend.prepare(batch, batch.new_output())
    if graph and graph_timed(backend, batch.device):
        return graph_times_ms(step, repeats, warmup)
    return times_ms(step, batch.device, repeats, warmup)


def time_step(
    backend: AttentionBackend, batch: AttnBatch, repeats: int, warmup: int, graph: bool = False
) -> float:
    """The median of ``step_times``."""
    return statistics.median(step_times(backend, batch, repeats, warmup, graph))


def graph_timed(backend: AttentionBackend, device: torch.device) -> bool:
    """Whether ``time_step(graph=True)`` replays this backend's step from a CUDA graph: on a GPU,
    for a backend whose run() can be captured (the torch reference and cuBLAS cannot)."""
    return torch.device(device).type == "cuda" and backend.capturable


def timing_label(backend: AttentionBackend, device: torch.device, graph: bool) -> str:
    """How ``time_step`` timed the backend: graph (CUDA-graph replays), events (eager launches
    between CUDA events) or wall (a CPU's clock)."""
    if torch.device(device).type != "cuda":
        return "wall"
    return "graph" if graph and graph_timed(backend, device) else "events"


def floor_ms(ctx: int, q_len: int, heads: int, batch: int, ceilings: dict) -> float:
    """The point's roofline floor: the latent read once at the measured copy bandwidth, or its
    FLOPs at the measured matmul rate, whichever takes longer."""
    nbytes = roofline.attention_bytes(ctx, batch)
    flops = roofline.attention_flops(ctx, q_len, heads, batch)
    return roofline.floor_ms(nbytes, flops, ceilings["copy_gbs"], ceilings["matmul_tflops"])


def rates(ms: float, ctx: int, q_len: int, heads: int, batch: int, ceilings: dict) -> dict:
    """Effective GB/s and TFLOP/s of a point timed at ``ms``, its floor and the fraction of it."""
    nbytes = roofline.attention_bytes(ctx, batch)
    flops = roofline.attention_flops(ctx, q_len, heads, batch)
    floor = floor_ms(ctx, q_len, heads, batch, ceilings)
    return {
        "gbs": nbytes / (ms * 1e-3) / 1e9,
        "tflops": flops / (ms * 1e-3) / 1e12,
        "floor_ms": floor,
        "roofline_frac": floor / ms,
    }
