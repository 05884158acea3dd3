"""Timing a step: CUDA events with the L2 flushed before every repeat, or a synchronised CPU clock.

Both return the median of ``repeats`` timed calls in milliseconds, after ``warmup`` untimed calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H200: 50 MB), as triton.testing


def _cuda_median_ms(step: Callable[[], None], repeats: int, warmup: int, flush: bool) -> float:
    for _ in range(warmup):
        step()
    cache = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends, strict=True):
        if cache is not None:
            cache.zero_()  # evicts the previous repeat's KV from L2
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def _cpu_median_ms(step: Callable[[], None], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def median_ms(
    step: Callable[[], None],
    device: torch.device,
    repeats: int,
    warmup: int = 1,
    flush: bool = True,
) -> float:
    """Median milliseconds of ``step()`` (cuda: events + L2 flush; cpu: wall clock)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if device.type == "cuda":
        return _cuda_median_ms(step, repeats, warmup, flush)
    return _cpu_median_ms(step, repeats, warmup)
