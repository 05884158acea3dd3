"""A served step's floor from a point's files (analysis/floors.py) is the engine bench's floor."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from decodecliff.analysis import floors, tables
from decodecliff.bench.engine import floors as engine_floors
from decodecliff.engine.config import PRESETS
from decodecliff.engine.model import SyntheticMLA

CEILINGS = {"copy_gbs": 4228.0, "matmul_tflops": 797.0}


def served(model: SyntheticMLA, q: int) -> dict:
    """What a point's file says of the served model (its server_info, as summarize reads it)."""
    cfg = model.cfg
    return {"preset": cfg.name, "num_layers": cfg.num_layers, "vocab_size": cfg.vocab_size,
            "weight_bytes": model.weight_bytes(), "draft_tokens": q}  # fmt: skip


@pytest.mark.parametrize(("ctx", "q"), [(64, 16), (4096, 16), (100_000, 16), (5000, 64)])
def test_the_floor_of_a_served_step_is_the_engine_bench_s(ctx, q):
    model = SyntheticMLA(PRESETS["tiny"], "cpu", torch.bfloat16, seed=0)
    engine = engine_floors(model, q, 1, ctx, q, CEILINGS)
    floor = floors.step_floor(served(model, q), ctx, **CEILINGS)
    assert floor.ms == pytest.approx(engine["step_floor_ms"])
    assert floor.weights_ms == pytest.approx(engine["gemm_floor_ms"])
    assert floor.attention_ms == pytest.approx(engine["attention_floor_ms"])
    by_flops = engine["attention_flops"] / 797e12 > engine["kv_bytes"] / 4228e9
    assert floor.attention_by == ("FLOPs" if by_flops else "bytes")


def test_the_headline_states_the_floor_only_for_one_known_model():
    model = SyntheticMLA(PRESETS["tiny"], "cpu", torch.bfloat16, seed=0)
    rows = [{"server": s, "requested_ctx": c, "status": "ok", tables.PRIMARY: 10.0,
             **served(model, 16)} for s in ("a", "b") for c in (1024, 8192)]  # fmt: skip
    sweep = pd.DataFrame(rows)
    table = tables.sweep_headline(sweep, "a", CEILINGS)
    expected = [1e3 / floors.step_floor(served(model, 16), c, **CEILINGS).ms for c in (1024, 8192)]
    assert list(table.loc[tables.FLOOR_LABEL]) == [tables.num(v) for v in expected]
    assert "e+" not in "".join(table.loc[tables.FLOOR_LABEL])  # read as people read numbers
    assert expected[0] > expected[1]
    assert tables.FLOOR_LABEL not in tables.sweep_headline(sweep, "a").index  # no ceilings
    other = sweep.assign(num_layers=[2, 2, 3, 3])  # two models: no one floor per context
    assert tables.FLOOR_LABEL not in tables.sweep_headline(other, "a", CEILINGS).index
    unknown = sweep.assign(preset="not-a-preset")
    assert tables.FLOOR_LABEL not in tables.sweep_headline(unknown, "a", CEILINGS).index
