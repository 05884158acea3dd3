"""Fidelity of the Triton baseline to SGLang's own kernels: the baseline's time over SGLang's on the
same inputs, in the same kernel-bench run, point by point.

Pairs (kernel-bench labels): the baseline's extend kernel with the GPU's own block config (the one
SGLang's table picks there) against SGLang's ``extend_attention_fwd``; the grouped decode at a
split count against SGLang's ``decode_attention_fwd`` at the same count. Each at the same
``kv_indices`` dtype: SGLang's own keeps the plain label, another dtype is appended ("-int32").
"""

from __future__ import annotations

from collections.abc import Iterable

DTYPE_SUFFIXES = ("-int32", "-int64")
KEY = ("mode", "heads", "ctx", "page_size", "batch")


def split_dtype(label: str) -> tuple[str, str]:
    """("sm90", "-int32") from "sm90-int32"; the suffix is "" for SGLang's own dtype."""
    for suffix in DTYPE_SUFFIXES:
        if label.endswith(suffix):
            return label.removesuffix(suffix), suffix
    return label, ""


def sglang_label(triton_label: str, native_config: str) -> str | None:
    """The SGLang kernel a baseline variant reproduces, or None (a config SGLang does not pick)."""
    base, suffix = split_dtype(triton_label)
    if base == native_config:
        return f"extend{suffix}"
    if base.startswith("grouped-"):
        return f"decode-{base.removeprefix('grouped-')}{suffix}"
    return None


def fidelity_rows(points: Iterable[dict], native_config: str) -> list[dict]:
    """One row per timed baseline point that has its SGLang twin timed: both times and the ratio."""
    points = [p for p in points if p.get("status") == "ok" and p.get("ms")]
    sglang = {
        (*(p[k] for k in KEY), p["triton_config"]): p for p in points if p["backend"] == "sglang"
    }
    rows = []
    for p in points:
        if p["backend"] != "triton":
            continue
        twin_label = sglang_label(p["triton_config"], native_config)
        twin = sglang.get((*(p[k] for k in KEY), twin_label)) if twin_label else None
        if twin is None:
            continue
        rows.append({
            **{k: p[k] for k in KEY},
            "baseline": p["triton_config"], "sglang": twin_label,
            "index_dtype": (p.get("detail") or {}).get("index_dtype"),
            "baseline_ms": p["ms"], "sglang_ms": twin["ms"], "ratio": p["ms"] / twin["ms"],
        })  # fmt: skip
    return rows
