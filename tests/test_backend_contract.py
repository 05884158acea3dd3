"""Every backend in the registry keeps the one contract (kernels/api.py): built by name, it plans a
step once, runs layers against the float64 reference, describes itself, and, on a GPU, replays the
captured layers after a new plan with the same result as eager calls."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from decodecliff.kernels.abi import StaleLibrary
from decodecliff.kernels.api import AttentionBackend
from decodecliff.kernels.reference import reference_attention
from decodecliff.kernels.registry import (
    BACKENDS,
    get_backend,
    parse_spec,
    spec_label,
    unavailable,
)
from decodecliff.kernels.synthetic import random_batch, relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 kernels on a GPU; on the CPU the Triton interpreter needs fp32 (its bf16 dot is wrong)
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOL = 2e-2
INT32 = {"dtype": torch.int32, "device": DEVICE}


def built(name: str) -> AttentionBackend:
    why = unavailable(name, DEVICE)
    if why:
        pytest.skip(why)
    try:
        return get_backend(name)
    except StaleLibrary:
        raise  # built from other source: a failure, not a library this machine lacks
    except (ImportError, OSError, RuntimeError) as exc:  # e.g. the custom library not built here
        pytest.skip(f"{name} cannot be built here: {exc}")


def layers(seed: int, lens: list[int], heads: int = 4) -> list:
    """Two layers' problems of one step: same metadata, their own queries and caches."""
    base = random_batch(lens, 4, heads=heads, page_size=16, dtype=DTYPE, device=DEVICE, seed=seed)
    other = random_batch(lens, 4, heads=heads, page_size=16, dtype=DTYPE, device=DEVICE,
                         seed=seed + 1)  # fmt: skip
    return [base, base.meta.batch(other.q, other.kv_cache)]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_plans_once_and_runs_each_layer(name: str) -> None:
    backend = built(name)
    assert isinstance(backend, AttentionBackend) and backend.name == name
    steps = layers(3, [70, 33])
    meta = steps[0].meta
    if backend.unsupported(meta):
        pytest.skip(f"{name}: {backend.unsupported(meta)}")
    backend.plan(meta)
    for layer in steps:
        out = layer.new_output().fill_(float("nan"))  # poisoned: every row must be written
        backend.run(layer.q, layer.kv_cache, out)
        assert relative_error(out, reference_attention(layer)) < TOL
    described = backend.describe()
    assert described["backend"] == name
    json.dumps(described)  # it goes into result files as it is


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_an_empty_step_writes_nothing_and_the_next_step_runs(name: str) -> None:
    """A step of no requests (a server between requests) is planned as one that launches nothing;
    the plan after it serves its step as if the empty one had not been."""
    backend = built(name)
    steps = layers(5, [70, 33])
    meta = steps[0].meta
    if backend.unsupported(meta):
        pytest.skip(f"{name}: {backend.unsupported(meta)}")
    empty = dataclasses.replace(
        meta, kv_lens=meta.kv_lens[:0], q_indptr=meta.q_indptr[:1], num_tokens=0, max_q_len=0,
        max_kv_len=0, total_kv_len=0,
    )  # fmt: skip
    backend.plan(empty)
    q, none = steps[0].q[:0], steps[0].new_output()[:0]
    assert backend.run(q, steps[0].kv_cache, none).shape == none.shape
    backend.plan(meta)
    for layer in steps:
        out = layer.new_output().fill_(float("nan"))
        backend.run(layer.q, layer.kv_cache, out)
        assert relative_error(out, reference_attention(layer)) < TOL


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_backend_says_why_it_declines_a_step(name: str) -> None:
    backend = built(name)
    tree = random_batch([40], 5, heads=2, page_size=16, tree=True, dtype=DTYPE, device=DEVICE)
    why = backend.unsupported(tree.meta)
    assert why is None or (isinstance(why, str) and why)
    if why:
        with pytest.raises(ValueError, match=why[:20]):
            backend(tree)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_plan_that_reads_the_lengths_refuses_a_request_of_fewer_kv_than_query_tokens(
    name: str,
) -> None:
    """A request's query tokens are the last q_len of its KV (kernels/api.py): a kv_len under its
    q_len is no step, and the kernels read it before the request's own slots. A backend that
    reads the lengths on the host refuses it in plan(), naming the request; one whose plan is
    captured in a CUDA graph reads no device lengths and is not asked."""
    backend = built(name)
    meta = layers(3, [70, 33])[0].meta  # q_len 4
    if DEVICE == "cuda" and backend.capturable and not backend.plan_outside_graph:
        pytest.skip(f"{name} plans inside a CUDA graph: the lengths stay on the device")
    if backend.unsupported(meta):
        pytest.skip(f"{name}: {backend.unsupported(meta)}")
    meta.kv_lens[1] = 3
    with pytest.raises(ValueError, match=rf"{name} attention: request 1 has kv_len 3 < q_len 4"):
        backend.plan(meta)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_captured_layers_replay_after_a_new_plan(name: str) -> None:
    """As the engine's graphs run them: plan outside the graph (or inside, captured with the
    layer), capture, then change the lengths, plan again and replay."""
    backend = built(name)
    if not backend.capturable:
        pytest.skip(f"{name} is not capturable")
    first, fresh = layers(5, [300, 120])
    meta = first.meta
    meta.max_kv_len = 512  # a bound past both steps, as a graph pins it
    second = dataclasses.replace(meta, kv_lens=torch.tensor([250, 90], **INT32)).batch(
        fresh.q, fresh.kv_cache
    )
    out = first.new_output()

    def step() -> None:
        if not backend.plan_outside_graph:
            backend.plan(meta)
        backend.run(first.q, first.kv_cache, out)

    backend.plan(meta)
    step()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # the second step's problem in the first one's tensors, then a new plan and a replay
    first.q.copy_(second.q)
    first.kv_cache.copy_(second.kv_cache)
    meta.kv_lens.copy_(second.meta.kv_lens)
    if backend.plan_outside_graph:
        backend.plan(meta)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, reference_attention(second)) < TOL


def test_backend_specs_name_options() -> None:
    assert parse_spec("flashinfer:backend=fa3") == ("flashinfer", {"backend": "fa3"})
    assert parse_spec("custom:variant=v4,num_splits=8") == (
        "custom", {"variant": "v4", "num_splits": 8},
    )  # fmt: skip
    assert spec_label("flashinfer:backend=fa3") == "flashinfer (fa3)"
    assert spec_label("flashinfer:backend=fa2,model=sm120") == "flashinfer (fa2-sm120)"
    assert spec_label("custom") == "custom"
    assert spec_label("custom:num_splits=8") == "custom (num_splits=8)"
    for bad in ("custom:num_splits=-1", "custom:num_splits=many"):
        with pytest.raises(ValueError, match="num_splits must be an integer >= 0"):
            parse_spec(bad)
    with pytest.raises(ValueError, match="unknown attention backend"):
        parse_spec("flashinfr")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_spec("triton:sm90")


def test_unavailable_names_the_reason_without_building() -> None:
    assert "CUDA GPU" in unavailable("custom", "cpu")
    assert unavailable("torch", "cpu") is None
    assert "unknown" in unavailable("nope", "cpu")


def test_a_peer_loaded_through_its_stub_package_stays_available(monkeypatch) -> None:
    """The sglang peer registers its package as a stub without a spec (kernels/peers.py): a later
    check must not take that for a missing package (find_spec raises on it)."""
    import types

    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    assert unavailable("sglang", "cuda") is None
