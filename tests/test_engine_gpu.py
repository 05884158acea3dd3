"""The engine on a CUDA device: the full-size preset, CUDA graphs and defragmentation."""

from __future__ import annotations

import importlib

import pytest
import torch

from decodecliff.engine.config import EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)


def capturable_backends() -> list[str]:
    names = []
    for name, module in (("triton", "triton_baseline"), ("custom", "custom")):
        try:
            importlib.import_module(f"decodecliff.kernels.{module}")
            names.append(name)
        except Exception:
            pass
    return names


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 512, (n,), generator=g).tolist()
    return ids + ids[: n // 2]


def engine(**cfg) -> Engine:
    base = {"device": "cuda", "max_total_tokens": 8192, "chunk_size": 128, "tree_nodes": 16}
    return Engine(EngineConfig(**{**base, **cfg}))


def outputs(eng: Engine) -> list[list[int]]:
    return [r.output for r in eng.generate([prompt(300, 1), prompt(500, 2)], GREEDY)]


def run(**cfg) -> list[list[int]]:
    return outputs(engine(**cfg))


def test_kimi_rank_preset_is_finite_on_the_gpu():
    eng = Engine(
        EngineConfig(
            preset="kimi-k2-tp8-rank", device="cuda", max_total_tokens=4096, chunk_size=256
        )
    )
    req = eng.generate([prompt(600, 3)], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    assert len(req.output) == 4
    assert torch.isfinite(eng.pool.cache[:, : eng.pool.pages_for(600)]).all()


@pytest.mark.parametrize("backend", capturable_backends())
@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_cuda_graphs_match_eager(backend, spec):
    eager = run(backend=backend, spec=spec)
    eng = engine(backend=backend, spec=spec, cuda_graph=True)
    assert outputs(eng) == eager
    assert eng.graphs.captured_shapes()  # replayed, not fallen back to eager
    assert not eng.graphs.uncapturable


@pytest.mark.parametrize("backend", ["torch", *capturable_backends()])
def test_defrag_matches_on_the_gpu(backend):
    plain = run(backend=backend, scatter_seed=1)
    defrag = run(
        backend=backend, scatter_seed=1, defrag=True, defrag_threshold=0.0, defrag_interval=1
    )
    assert defrag == plain
