"""The roofline of one attention call: what it must move and compute, and the measured ceilings.

Work of one call (batch of B requests, each with ``ctx`` cached tokens, ``q_len`` query tokens,
``heads`` query heads), counting the full prefix for every query row as the dense kernels do:

* bytes = B * ctx * 576 * elem_size: the shared latent read once (V is a view of it), the minimum
  any kernel must read; queries and outputs are negligible beside it.
* flops = B * rows * ctx * (576 + 512) * 2 with rows = q_len * heads: one multiply-add per element
  of Q K^T (576 wide) and of P V (512 wide).

The floor is max(bytes / copy bandwidth, flops / matmul rate) with both ceilings *measured* on the
same device in the same run: a device-to-device copy of >= 1 GiB (bytes read + written per second)
and a bf16 matmul of 8192^3 random values (on a CPU: 2048^3 in fp32, the CPU's fast path). A GPU's
ceiling is the median of its timed calls; a CPU's the fastest, since another process on a shared
CPU only slows a call, and a ceiling taken below the CPU's rate would put kernels over 100% of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..kernels.api import D_QK, D_V
from .timing import median_ms, wall_times_ms


def attention_bytes(ctx: int, batch: int = 1, elem_size: int = 2) -> int:
    return batch * ctx * D_QK * elem_size


def attention_flops(ctx: int, q_len: int, heads: int, batch: int = 1) -> int:
    return batch * q_len * heads * ctx * (D_QK + D_V) * 2


def step_attention(
    context: int, q_len: int, heads: int, layers: int, batch: int = 1, elem_size: int = 2
) -> tuple[int, int]:
    """A verify step's attention over its layers: the latent KV bytes it reads (the context and
    the step's own q_len rows) and its FLOPs."""
    kv_len = context + q_len
    kv_bytes = attention_bytes(kv_len, batch, elem_size) * layers
    return kv_bytes, attention_flops(kv_len, q_len, heads, batch) * layers


def floor_ms(bytes_: float, flops: float, copy_gbs: float, matmul_tflops: float) -> float:
    return max(bytes_ / (copy_gbs * 1e9), flops / (matmul_tflops * 1e12)) * 1e3


def copy_bandwidth_gbs(device: torch.device, repeats: int = 10) -> float:
    """Bytes read + written per second by a device-to-device copy (1 GiB on GPU, 64 MiB on CPU)."""
    size = 2**30 if device.type == "cuda" else 64 * 2**20
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size / (_ceiling_ms(lambda: dst.copy_(src), device, repeats) * 1e-3) / 1e9


def matmul_tflops(device: torch.device, repeats: int = 10) -> tuple[float, str]:
    """Dense matmul rate on random data: bf16 8192^3 on GPU, fp32 2048^3 on CPU."""
    if device.type == "cuda":
        n, dtype = 8192, torch.bfloat16
    else:
        n, dtype = 2048, torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    ms = _ceiling_ms(lambda: torch.matmul(a, b, out=c), device, repeats)
    return 2 * n**3 / (ms * 1e-3) / 1e12, f"{str(dtype).removeprefix('torch.')} {n}^3"


def _ceiling_ms(step: Callable[[], object], device: torch.device, repeats: int) -> float:
    """A ceiling's time per call: the median on a GPU, the fastest call on a CPU."""
    if device.type == "cuda":
        return median_ms(step, device, repeats, warmup=2, flush=False)
    return min(wall_times_ms(step, device, repeats, warmup=2))


def measure_ceilings(device: torch.device, repeats: int = 10) -> dict:
    """The device's measured copy bandwidth and matmul rate, with how they were measured."""
    start = time.perf_counter()
    copy = copy_bandwidth_gbs(device, repeats)
    rate, how = matmul_tflops(device, repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": name,
        "copy_gbs": copy,
        "copy_bytes": 2**30 if device.type == "cuda" else 64 * 2**20,
        "matmul_tflops": rate,
        "matmul": how,
        "seconds": time.perf_counter() - start,
    }
