"""The baseline is SGLang's kernel as SGLang calls it: the index dtype SGLang passes, and the
fidelity table that pairs each baseline point with SGLang's own kernel on the same inputs."""

from __future__ import annotations

import re

import pytest

from decodecliff.analysis.fidelity import fidelity_rows, sglang_label


def point(backend: str, label: str, ms: float, mode: str = "chain16", **detail) -> dict:
    return {"backend": backend, "triton_config": label, "mode": mode, "heads": 8, "ctx": 185000,
            "page_size": 1, "batch": 1, "status": "ok", "ms": ms, "detail": detail}  # fmt: skip


def test_each_baseline_variant_is_paired_with_the_sglang_kernel_it_reproduces() -> None:
    assert sglang_label("sm90", "sm90") == "extend"
    assert sglang_label("sm90-int32", "sm90") == "extend-int32"
    assert sglang_label("sm120", "sm90") is None  # a config SGLang does not pick on this GPU
    assert sglang_label("grouped-sglang", "sm90") == "decode-sglang"
    assert sglang_label("grouped-s64-int32", "sm90") == "decode-s64-int32"
    points = [
        point("triton", "sm90", 28.3, index_dtype="int64"),
        point("triton", "sm90-int32", 22.5, index_dtype="int32"),
        point("triton", "sm120", 37.4),
        point("sglang", "extend", 28.2),
        point("sglang", "extend-int32", 22.2),
        point("sglang", "verify", 1.07),
        point("triton", "grouped-sglang", 0.21, mode="decode"),
        point("sglang", "decode-sglang", 0.19, mode="decode"),
        {**point("sglang", "decode-s8", 1.0, mode="decode"), "status": "failed"},
        point("triton", "grouped-s8", 3.8, mode="decode"),
    ]
    rows = {(r["baseline"], r["sglang"]): r for r in fidelity_rows(points, "sm90")}
    assert set(rows) == {
        ("sm90", "extend"), ("sm90-int32", "extend-int32"), ("grouped-sglang", "decode-sglang"),
    }  # fmt: skip
    assert rows[("sm90-int32", "extend-int32")]["ratio"] == pytest.approx(22.5 / 22.2)
    assert rows[("sm90", "extend")]["index_dtype"] == "int64"


def test_the_index_dtype_is_the_one_the_pinned_sglang_passes() -> None:
    """SGLang's Triton backend builds kv_indices for target verify and decode (eager and graph
    buffers) in one dtype; the baseline and the sglang peer default to it."""
    from decodecliff.kernels.peers import SGLANG_KV_INDEX_DTYPE, sglang_root

    try:
        root = sglang_root()
    except ModuleNotFoundError as exc:
        pytest.skip(f"sglang's source cannot be read here: {exc}")
    source = (root / "srt" / "layers" / "attention" / "triton_backend.py").read_text()
    found = re.findall(r"kv_indices = torch\.empty\(\s*seq_lens_sum, dtype=torch\.(int\d+)", source)
    graph = re.findall(r"cuda_graph_kv_indices = torch\.zeros\([^)]*\),\s*dtype=torch\.(int\d+)",
                       source)  # fmt: skip
    assert found and graph, "SGLang's kv_indices allocations moved: read triton_backend.py again"
    assert set(found) | set(graph) == {SGLANG_KV_INDEX_DTYPE}
