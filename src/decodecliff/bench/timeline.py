"""A step's kernels folded by layer: what each kernel of a layer costs, and the gaps between them.

A step launches the same kernels in the same order in every layer (a prefix, the layers, a
suffix). Folding a profiled step's kernel records by their place in that repeat names each
kernel of a layer by position (the first weight GEMM of a layer is qkv_a, ...), with its mean
duration and the mean gap before it: the previous kernel's end to its start, launch latency and
ramp when positive, overlap when negative (a programmatic dependent starts before the kernel it
waits for has ended, and its duration then includes the wait). The step's busy time is the union
of its kernels' intervals, beside the span from the first start to the last end.

Where a layer's repeat could start at two places (a prefix kernel named like the layer's last
one), the earliest is taken: the engine's prefix (embedding, rope rows) shares no kernel with a
layer, so the positions start at the layer's first kernel.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.profiler import profile

NAME_CHARS = 60


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    end_us: float


def short_name(name: str) -> str:
    """A kernel's name without its return type, template arguments and parameters."""
    name = re.sub(r"^void\s+", "", name)
    depth, out = 0, []
    for ch in name:  # drop <...> and (...) spans, nested or not
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()[:NAME_CHARS] or name[:NAME_CHARS]


def layer_repeat(names: list[str], layers: int) -> tuple[int, int] | None:
    """(offset, period) of the longest run of ``layers`` equal blocks of ``names``, or None."""
    n = len(names)
    for period in range(n // layers, 0, -1):
        span = layers * period
        for offset in range(n - span + 1):
            block = names[offset : offset + period]
            if all(names[offset + i] == block[i % period] for i in range(span)):
                return offset, period
    return None


def busy_us(kernels: list[Kernel]) -> float:
    """Time covered by at least one kernel (overlapping intervals counted once)."""
    total, end = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        if k.end_us > end:
            total += k.end_us - max(k.start_us, end)
            end = k.end_us
    return total


def fold(kernels: list[Kernel], layers: int) -> dict:
    """The step's span, busy time and kernel count, and per position of a layer its kernel's
    name, mean duration and mean gap before it (None where no layer repeat is found)."""
    kernels = sorted(kernels, key=lambda k: k.start_us)
    if not kernels:
        return {"kernels": 0, "span_us": 0.0, "busy_us": 0.0, "layer": None}
    step = {
        "kernels": len(kernels),
        "span_us": kernels[-1].end_us - kernels[0].start_us,
        "busy_us": busy_us(kernels),
    }
    repeat = layer_repeat([short_name(k.name) for k in kernels], layers)
    if repeat is None:
        return {**step, "layer": None}
    offset, period = repeat
    layer = []
    for pos in range(period):
        at = range(offset + pos, offset + layers * period, period)
        # the first layer's first kernel follows the prefix (on a graph path, the launch): left out
        gaps = [kernels[i].start_us - kernels[i - 1].end_us for i in at if i > offset]
        layer.append({
            "position": pos,
            "kernel": short_name(kernels[offset + pos].name),
            "us": statistics.mean(kernels[i].end_us - kernels[i].start_us for i in at),
            "gap_us": statistics.mean(gaps) if gaps else None,
        })  # fmt: skip
    first, last = kernels[offset], kernels[offset + layers * period - 1]
    per_layer = (last.end_us - first.start_us) / layers
    return {**step, "offset": offset, "layer_us": per_layer, "layer": layer}


def of_profile(prof: profile) -> list[Kernel]:
    """The CUDA kernel records of a torch.profiler trace (no copies or fills), in start order."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    records = [
        Kernel(e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == cuda and not e.name.startswith(("Memcpy", "Memset"))
    ]
    return sorted(records, key=lambda k: k.start_us)


def describe(folded: dict) -> str:
    """A few lines: the step's busy share, then each kernel of a layer with its gap before."""
    if not folded["kernels"]:
        return "no kernel records"
    span, busy = folded["span_us"], folded["busy_us"]
    share = f" ({busy / span:.0%})" if span > 0 else ""
    lines = [
        f"{folded['kernels']} kernels, span {span / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms{share}, "
        f"idle {(span - busy) / 1e3:.3f} ms"
    ]
    if folded["layer"] is None:
        return lines[0] + "; no per-layer repeat found"
    lines[0] += f"; per layer {folded['layer_us']:.1f} us:"
    for k in folded["layer"]:
        gap = "" if k["gap_us"] is None else f"{k['gap_us']:+7.1f}"
        lines.append(f"  {k['position']:2d} {gap:>7} us gap  {k['us']:7.1f} us  {k['kernel']}")
    return "\n".join(lines)
