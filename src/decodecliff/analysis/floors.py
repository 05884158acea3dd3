"""A served verify step's floor, counted as the engine bench counts it (bench/engine.py, floors).

The step reads every weight but the embedding's (it reads T rows of that), at the measured copy
rate or, if slower, does its GEMMs' FLOPs at the measured matmul rate; and each layer's attention
reads the context's latent KV at the copy rate or does its FLOPs at the matmul rate, the larger
(at 16 query rows and 8 heads the FLOPs set it, as they do for the kernels' floors). Everything
comes from a point's file: the served model (``server_info``: preset, layers, vocabulary, weight
bytes, draft tokens) and the ceilings the study's kernel bench measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from decodecliff.bench import roofline
from decodecliff.engine.config import PRESETS

WEIGHT_ELEMENT_BYTES = 2  # bf16, as every GPU study serves
MODEL_COLUMNS = ("preset", "num_layers", "vocab_size", "weight_bytes", "draft_tokens")


@dataclass(frozen=True)
class StepFloor:
    weights_ms: float  # the projections: their weights at the copy rate (or FLOPs, the larger)
    attention_ms: float  # every layer's attention
    attention_by: str  # what sets attention's floor: "FLOPs" (matmul rate) or "bytes" (copy rate)

    @property
    def ms(self) -> float:
        return self.weights_ms + self.attention_ms


def step_floor(model: Mapping, ctx: int, copy_gbs: float, matmul_tflops: float) -> StepFloor | None:
    """The floor of one verify step of ``model`` (a sweep row's MODEL_COLUMNS) at ``ctx`` cached
    tokens; None where the model's shape is not known here."""
    cfg = PRESETS.get(model.get("preset"))
    if cfg is None or any(pd.isna(model.get(k)) for k in MODEL_COLUMNS):
        return None
    layers, q = int(model["num_layers"]), int(model["draft_tokens"])
    embedding = int(model["vocab_size"]) * cfg.hidden * WEIGHT_ELEMENT_BYTES
    weights = float(model["weight_bytes"]) - embedding
    gemm_flops = 2 * q * weights / WEIGHT_ELEMENT_BYTES  # one multiply-add per weight and row
    kv_bytes, attention_flops = roofline.step_attention(ctx, q, cfg.num_heads, layers)
    by_bytes = kv_bytes / (copy_gbs * 1e9) >= attention_flops / (matmul_tflops * 1e12)
    return StepFloor(
        weights_ms=roofline.floor_ms(weights, gemm_flops, copy_gbs, matmul_tflops),
        attention_ms=roofline.floor_ms(kv_bytes, attention_flops, copy_gbs, matmul_tflops),
        attention_by="bytes" if by_bytes else "FLOPs",
    )


def steps_s(sweep: pd.DataFrame, ceilings: Mapping) -> pd.Series:
    """Verify steps/s per requested context if every step took its floor; empty without the
    ceilings or the served model, or where the servers serve different models."""
    ctxs = sorted(sweep["requested_ctx"].unique()) if len(sweep) else []
    floors = [step_ms(sweep, ceilings, int(c)) for c in ctxs]
    if not floors or any(f is None for f in floors):
        return pd.Series(dtype=float)
    return pd.Series([1e3 / f for f in floors], index=ctxs)


def step_ms(sweep: pd.DataFrame, ceilings: Mapping | None, ctx: int) -> float | None:
    """The floor of the study's served verify step at ``ctx`` (ms); None without the ceilings or
    the served model, or where the servers serve different models."""
    ceilings = ceilings or {}
    copy_gbs, matmul = ceilings.get("copy_gbs"), ceilings.get("matmul_tflops")
    if not copy_gbs or not matmul or sweep.empty or not set(MODEL_COLUMNS) <= set(sweep):
        return None
    models = sweep[list(MODEL_COLUMNS)].dropna().drop_duplicates()
    if len(models) != 1:
        return None
    floor = step_floor(models.iloc[0], ctx, copy_gbs, matmul)
    return None if floor is None else floor.ms
