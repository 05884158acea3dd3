"""The engine on a CUDA device: the full-size preset, CUDA graphs and defragmentation."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from decodecliff.engine.config import PRESETS, EngineConfig
from decodecliff.engine.engine import Engine
from decodecliff.engine.model import StepInput, SyntheticMLA, mha_spans
from decodecliff.engine.request import SamplingParams
from decodecliff.kernels.reference import TorchAttention

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


def test_mha_prefill_gives_the_absorbed_path_s_tokens_on_the_gpu():
    assert run(dtype="float32", prefill_attention="mha") == run(dtype="float32")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_mha_prefill_layer_matches_at_kimi_shapes(dtype, tol):
    # One kimi-rank layer, a 512-token chunk after 3000 cached tokens (flash / mem-efficient SDPA).
    cfg = dataclasses.replace(PRESETS["kimi-k2-tp8-rank"], num_layers=1)
    model = SyntheticMLA(cfg, "cuda", dtype, seed=0)
    prefix, chunk, total = 3000, 512, 3512
    g = torch.Generator(device="cuda").manual_seed(1)
    cache = torch.randn(total, 1, cfg.kv_row_dim, device="cuda", generator=g).to(dtype)
    t = torch.arange(prefix, total, device="cuda")
    step = StepInput(
        input_ids=t,
        positions=t,
        out_slots=t,
        page_table=torch.arange(total, dtype=torch.int32, device="cuda")[None],
        kv_lens=torch.tensor([total], dtype=torch.int32, device="cuda"),
        q_indptr=torch.tensor([0, chunk], dtype=torch.int32, device="cuda"),
        tree_mask=None,
        max_q_len=chunk,
        max_kv_len=total,
    )
    h = torch.randn(chunk, cfg.hidden, device="cuda", generator=g).to(dtype)
    layer = model.layers[0]
    absorbed = model._attention(layer, h, step, cache.clone(), TorchAttention())
    mha = model._attention(layer, h, step, cache, TorchAttention(), mha_spans(step, 1))
    err = (mha.float() - absorbed.float()).norm() / absorbed.float().norm()
    assert err < tol


@pytest.mark.parametrize("backend", capturable_backends())
def test_mha_prefill_keeps_prefill_chunks_away_from_the_backend(backend):
    eng = engine(backend=backend, chunk_size=4096, prefill_attention="mha")
    real, q_lens = eng.backend, []

    def recording(batch, out=None):
        q_lens.append(batch.max_q_len)
        return real(batch, out)

    eng.backend = recording
    assert [len(o) for o in outputs(eng)] == [16, 16]
    assert set(q_lens) == {1}
