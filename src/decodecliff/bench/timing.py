"""Timing a step, the one place the benches sync the device and read a clock.

``median_ms``: CUDA events with the L2 flushed before every repeat (a kernel's device time), or the
synchronised wall clock on a CPU. ``graph_median_ms``: the same events around replays of the step
captured once in a CUDA graph, as a graph-mode server runs its layers (no host launch gaps).
``times_ms`` and ``graph_times_ms`` give every repeat's time, for a spread beside the median.
``wall_ms`` / ``wall_times_ms``: the synchronised wall clock on either device (a step whose host
work counts, or a first call that also compiles). ``refuse_unusable``: a bench's arguments
checked against the device and the file system before it measures anything.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from decodecliff.jsonio import unwritable

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H200: 50 MB), as triton.testing
# A GPU that idled (the host building a point's problem) runs its first milliseconds of work slow:
# an H100's first ~20 replays of a 0.2 ms memory-bound launch took 17% longer, so the first
# variant timed at a point read slower than the same launch timed after it (notes/kernel.md,
# "The first variant at a point"). Every CUDA timing first keeps the device busy this long.
WARM_MS = 25.0


def refuse_unusable(parser: argparse.ArgumentParser, device: str, out: str | os.PathLike) -> None:
    """Exit through ``parser.error`` (status 2) on a CUDA device torch cannot see or an ``--out``
    that could not be written: what a bench measured would be lost."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but torch sees no CUDA device")
    if (why := unwritable(out)) is not None:
        parser.error(f"--out: {why}")


def refuse_repeats(parser: argparse.ArgumentParser, **lists: list | None) -> None:
    """Exit through ``parser.error`` where a list option names a value twice (its points would be
    measured and written twice): ``refuse_repeats(p, contexts=args.contexts)``."""
    for name, values in lists.items():
        values = values or []
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            parser.error(f"--{name.replace('_', '-')} names {twice[0]} twice")


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(step: Callable[[], object], device: torch.device | str) -> float:
    """Milliseconds of one call of ``step``, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return (time.perf_counter() - start) * 1e3


def wall_times_ms(
    step: Callable[[], object], device: torch.device | str, repeats: int, warmup: int = 0
) -> list[float]:
    """``wall_ms`` of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    return [wall_ms(step, device) for _ in range(repeats)]


def _cuda_times_ms(step: Callable[[], None], repeats: int, warmup: int, flush: bool) -> list[float]:
    for _ in range(warmup):
        step()
    return _events_times_ms(step, repeats, flush)


def busy_for(step: Callable[[], object], device: torch.device | str, min_ms: float) -> int:
    """Call ``step`` until ``min_ms`` of synchronised wall time have passed (at least once), in
    rounds of at most as many calls as came before, each sized by the time a call took so far,
    so the queue stays full and a long step runs about ``min_ms`` in all; returns the calls."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    calls = 1
    while (elapsed := (time.perf_counter() - start) * 1e3) < min_ms:
        more = min(calls, math.ceil((min_ms - elapsed) / max(elapsed / calls, 1e-6)))
        for _ in range(more):
            step()
        sync(device)
        calls += more
    return calls


def _events_times_ms(step: Callable[[], None], repeats: int, flush: bool) -> list[float]:
    cache = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]

    def flushed_step() -> None:
        if cache is not None:
            cache.zero_()  # evicts the previous repeat's KV from L2
        step()

    busy_for(flushed_step, "cuda", WARM_MS)  # the timed repeats follow with no idle gap
    for start, end in zip(starts, ends, strict=True):
        if cache is not None:
            cache.zero_()
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def times_ms(
    step: Callable[[], None],
    device: torch.device,
    repeats: int,
    warmup: int = 1,
    flush: bool = True,
) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``step()`` (cuda: events + L2 flush; cpu: wall
    clock)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if device.type == "cuda":
        return _cuda_times_ms(step, repeats, warmup, flush)
    return wall_times_ms(step, device, repeats, warmup)


def median_ms(
    step: Callable[[], None],
    device: torch.device,
    repeats: int,
    warmup: int = 1,
    flush: bool = True,
) -> float:
    """Median milliseconds of ``step()`` (cuda: events + L2 flush; cpu: wall clock)."""
    return statistics.median(times_ms(step, device, repeats, warmup, flush))


def capture(step: Callable[[], None], warmup: int = 1) -> torch.cuda.CUDAGraph:
    """``step`` captured in a CUDA graph, after ``warmup`` (at least one) eager runs, so lazy
    compilation and allocation happen outside the capture."""
    for _ in range(max(warmup, 1)):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def graph_times_ms(step: Callable[[], None], repeats: int, warmup: int = 1) -> list[float]:
    """Milliseconds of each of ``repeats`` replays of ``step`` captured once in a CUDA graph (cuda
    only; L2 flushed before every replay)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    graph = capture(step, warmup)
    graph.replay()
    return _events_times_ms(graph.replay, repeats, flush=True)


def graph_median_ms(step: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    """Median milliseconds of replays of ``step`` captured once in a CUDA graph (as
    ``graph_times_ms``)."""
    return statistics.median(graph_times_ms(step, repeats, warmup))
