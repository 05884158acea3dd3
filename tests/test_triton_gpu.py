"""GPU backends against the float64 reference (skipped without CUDA): the Triton baseline on
random problems, and every GPU backend (triton, custom and the peers) on planted problems whose
per-row errors show any wrong mask decision."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from decodecliff.kernels.reference import reference_attention
from decodecliff.kernels.synthetic import random_batch, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def random_case(rng: random.Random) -> dict:
    q_len = rng.choice([1, 1, 2, 16, 33, 64])
    batch = rng.choice([1, 1, 2, 3])
    kv_lens = [rng.randint(q_len, rng.choice([300, 5_000, 70_000])) for _ in range(batch)]
    return dict(
        kv_lens=kv_lens, q_len=q_len, heads=rng.choice([8, 16, 64]),
        page_size=rng.choice([1, 16, 64]), tree=q_len > 1 and rng.random() < 0.5,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "options",
    [dict(arch_config="sm90"), dict(arch_config="sm120", num_kv_splits=64), dict(decode="extend")],
)
def test_triton_gpu_matches_float64(seed: int, options: dict) -> None:
    from decodecliff.kernels.triton_baseline import TritonAttention

    case = random_case(random.Random(seed))
    batch = random_batch(**case, device="cuda", seed=seed, spare_pages=5)
    out = batch.new_output().fill_(float("nan"))
    TritonAttention(**options)(batch, out)
    torch.cuda.synchronize()
    err = relative_error(out, reference_attention(batch))
    assert err < 2e-2, f"rel err {err} for {case} {options}"


def test_triton_gpu_long_context_verify_and_decode() -> None:
    from decodecliff.kernels.triton_baseline import TritonAttention

    for q_len, tree in [(16, False), (64, True), (1, False)]:
        batch = random_batch([185_000], q_len, 8, 1, tree, device="cuda", seed=q_len)
        out = TritonAttention(num_kv_splits=64)(batch)
        assert relative_error(out, reference_attention(batch)) < 2e-2


# Planted mask checks (kernels/planted.py) for every GPU backend, this repository's and the peers'.
GPU_BACKENDS = [
    ("triton", dict(arch_config="sm90")),
    ("triton", dict(arch_config="sm120", num_kv_splits="sglang")),
    ("custom", {}),
    ("sglang", dict(kernel="extend")),
    ("sglang", dict(kernel="verify")),
    ("sglang", dict(kernel="decode", num_kv_splits="sglang")),
    ("flashinfer", dict(backend="fa2")),
    ("flashinfer", dict(backend="fa3")),
    ("cublas", {}),
]
PLANTED_CASES = [
    # (kv_lens, q_len, page_size, tree, heads): contexts 1 .. 185k, page sizes 1 and 64, ragged
    ([1], 1, 1, False, 8),
    ([185_000], 1, 1, False, 64),
    ([185_000, 33, 4097], 1, 64, False, 8),
    ([185_000], 16, 1, False, 8),
    ([185_000], 16, 64, False, 64),
    ([5_000, 77, 16], 16, 64, False, 8),
    ([185_000], 64, 1, True, 8),
    ([300, 64, 1_000], 16, 64, True, 64),
]


@functools.cache
def planted_case(case: int):
    """The planted problem on the GPU and its float64 reference (computed there too)."""
    from decodecliff.kernels.planted import planted_batch
    from decodecliff.kernels.reference import TorchAttention

    kv_lens, q_len, page_size, tree, heads = PLANTED_CASES[case]
    plant = planted_batch(kv_lens, q_len, heads, page_size, tree, device="cuda", seed=case)
    exact = plant.batch.meta.batch(plant.batch.q.double(), plant.batch.kv_cache.double())
    return plant, TorchAttention(torch.float64)(exact)


def gpu_backend(name: str, options: dict):
    from decodecliff.kernels import get_backend
    from decodecliff.kernels.abi import StaleLibrary

    try:
        return get_backend(name, **options)
    except StaleLibrary:
        raise  # built from other source: a failure, not a backend this machine lacks
    except (ImportError, FileNotFoundError, RuntimeError) as exc:  # not installed / not this GPU
        pytest.skip(f"{name} {options}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("case", range(len(PLANTED_CASES)))
@pytest.mark.parametrize("which", range(len(GPU_BACKENDS)), ids=lambda i: str(GPU_BACKENDS[i]))
def test_planted_masks_on_gpu(which: int, case: int) -> None:
    from decodecliff.kernels.planted import PLANTED_TOL, worst_row

    name, options = GPU_BACKENDS[which]
    plant, ref = planted_case(case)
    backend = gpu_backend(name, options)
    why = backend.unsupported(plant.batch.meta) if hasattr(backend, "unsupported") else None
    if why:
        pytest.skip(why)
    out = plant.batch.new_output().fill_(float("nan"))
    backend(plant.batch, out)
    torch.cuda.synchronize()
    worst = worst_row(plant, out, ref)
    assert worst["max_err"] < PLANTED_TOL, f"{name} {options} {PLANTED_CASES[case]}: {worst}"


def test_graph_timing_replays_the_step_it_would_launch() -> None:
    """The kernel bench's CUDA-graph timing: a replay of the captured step writes the eager
    step's output, and the replays take no longer than eager launches (only launch gaps go)."""
    from decodecliff.bench import core
    from decodecliff.bench.timing import capture, graph_median_ms, median_ms
    from decodecliff.kernels.triton_baseline import TritonAttention

    batch = random_batch([20_000], 16, 8, 1, tree=False, device="cuda", seed=3)
    backend = TritonAttention()
    eager, replayed = batch.new_output(), batch.new_output()
    backend.prepare(batch, eager)()
    step = backend.prepare(batch, replayed)
    graph = capture(step)
    replayed.fill_(float("nan"))  # after the eager warm-up and the capture: only a replay writes
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(replayed, eager, rtol=0, atol=0)
    graph_ms = graph_median_ms(step, repeats=10)
    events_ms = median_ms(step, batch.device, repeats=10)
    assert 0 < graph_ms < math.inf and 0 < events_ms < math.inf, (graph_ms, events_ms)
    assert core.timing_label(backend, batch.device, graph=True) == "graph"
    assert core.timing_label(backend, batch.device, graph=False) == "events"
