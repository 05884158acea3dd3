"""The kernel microbenchmark on the CPU at tiny sizes: the real CLI, its JSON, its error paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from decodecliff.bench import core, kernels, roofline

POINT_KEYS = {
    "backend", "triton_config", "heads", "ctx", "mode", "q_len", "page_size", "batch", "ms", "gbs",
    "tflops", "floor_ms", "roofline_frac", "rel_err", "status", "reason", "ragged", "timing",
    "ms_min", "ms_max",
}  # fmt: skip


def bench(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The command as a user runs it, in a process of its own."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "decodecliff.cli", "bench-kernels", "--device", "cpu"]
    cmd += ["--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300), out


def bench_here(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    """The same command in this process (no second torch import): its exit code and JSON path."""
    out = tmp_path / "bench.json"
    try:
        code = kernels.cli(["--device", "cpu", "--out", str(out), *extra])
    except SystemExit as exc:  # an option error
        code = exc.code
    return code, out


@pytest.mark.slow  # 40 points in a process of its own, the Triton interpreter among them
def test_bench_cli_tiny_cpu_run(tmp_path: Path) -> None:
    done, out = bench(
        tmp_path, "--contexts", "40", "100", "--modes", "decode", "chain4", "tree5",
        "--heads", "2", "--page-sizes", "1", "16", "--backends", "torch", "triton", "custom",
        "--repeats", "1", "--decode-splits", "8", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "decodecliff.kernel-bench/1"
    assert {"copy_gbs", "matmul_tflops", "device"} <= doc["ceilings"].keys()
    assert doc["ceilings"]["copy_gbs"] > 0 and doc["ceilings"]["matmul_tflops"] > 0
    assert doc["env"]["torch"] and doc["config"]["device"] == "cpu"
    assert doc["complete"] is True  # written at the end: a call cut short leaves it false
    points = doc["points"]
    # per (page size, ctx): decode torch + 2 triton variants + custom; chain and tree 3 each
    assert len(points) == 2 * 2 * (4 + 3 + 3)
    for p in points:
        assert p.keys() >= POINT_KEYS
        if p["backend"] == "custom":
            assert p["status"] == "skipped" and p["reason"]
            continue
        assert p["status"] == "ok", p
        assert p["ms"] > 0 and p["gbs"] > 0 and p["tflops"] > 0 and p["floor_ms"] > 0
        assert 0 < p["ms_min"] <= p["ms"] <= p["ms_max"]  # the median within its repeats
        assert p["roofline_frac"] == pytest.approx(p["floor_ms"] / p["ms"])
        assert p["gbs"] == pytest.approx(p["ctx"] * 576 * 2 / (p["ms"] * 1e-3) / 1e9)
        if p["backend"] in ("torch", "triton"):  # every backend against the float64 reference
            assert p["rel_err"] is not None and p["rel_err"] < core.REL_TOL
    labels = {p["triton_config"] for p in points if p["backend"] == "triton"}
    assert labels == {"grouped-s8", "sm90-extend", "sm90"}
    assert "roofline" in done.stdout  # the printed table
    # progress, one line per point: done / total, elapsed, an estimate of the time left
    progress = re.findall(r"^\[(\d+)/(\d+) (\d+)s, ~(\d+)s left\] (\w+)", done.stderr, re.M)
    assert [(int(i), int(n)) for i, n, *_ in progress] == [(i, 40) for i in range(1, 41)]
    assert [int(e) for _, _, e, _, _ in progress] == sorted(int(e) for _, _, e, _, _ in progress)
    assert progress[-1][3] == "0" and {b for *_, b in progress} == {"torch", "triton", "custom"}


def test_bench_skips_points_over_the_time_budget(tmp_path: Path) -> None:
    code, out = bench_here(
        tmp_path, "--contexts", "64", "--modes", "chain4", "--heads", "2", "--page-sizes", "1",
        "--backends", "triton", "--repeats", "2", "--max-seconds-per-point", "0.001", "--quiet",
    )  # fmt: skip
    assert code == 0
    (point,) = json.loads(out.read_text())["points"]
    assert point["status"] == "skipped" and "would pass" in point["reason"]
    assert point["rel_err"] is not None  # the correctness guard still ran once


@pytest.mark.parametrize(
    "args, message",
    [
        (["--modes", "spiral3"], "is not decode, chainN or treeN"),
        (["--backends", "cudnn"], "unknown backend"),
        (["--contexts", "0"], "must be positive"),
        (["--triton-config", "sm75"], "unknown --triton-config"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--warmup", "-3"], "--warmup must be >= 0"),
        (["--max-seconds-per-point", "nan"], "--max-seconds-per-point must be positive"),
        (["--seed", str(2**64)], "--seed must be in"),
        (["--contexts", "64", "64"], "--contexts names 64 twice"),  # its points measured twice
        (["--backends", "torch", "torch"], "--backends names torch twice"),
    ],
)
def test_bench_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str, capsys) -> None:
    code, out = bench_here(tmp_path, *args)
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "option, values",
    [
        ("--decode-splits", ["8", "8"]),
        ("--index-dtypes", ["int32", "int32"]),
        ("--flashinfer-backends", ["fa2", "fa2"]),
        ("--custom-variants", ["v4", "v4"]),
    ],
)
def test_a_variant_named_twice_is_refused(tmp_path: Path, option, values, capsys) -> None:
    """Each would time the same variant twice and write two points of one label."""
    code, out = bench_here(
        tmp_path, "--backends", "torch", "--contexts", "64", "--modes", "decode", "--heads", "2",
        "--page-sizes", "1", "--repeats", "1", "--quiet", option, *values,
    )  # fmt: skip
    assert code == 2 and f"{option} names {values[0]} twice" in capsys.readouterr().err
    assert not out.exists()


def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys) -> None:
    (tmp_path / "bench.json").mkdir()  # bench_here's --out is a folder
    code, _ = bench_here(tmp_path, "--backends", "torch", "--contexts", "64")
    assert code == 2 and "--out: " in capsys.readouterr().err


def test_every_option_says_its_default_in_plain_text() -> None:
    p = kernels.parser()
    assert "``" not in p.description
    for action in p._actions:
        if action.dest != "help":
            assert "(default: " in action.help and "``" not in action.help, action.dest
    helps = {action.dest: action.help for action in p._actions}
    assert helps["contexts"].endswith("(default: 1024 4096 16384 32768 65536 131072 185000)")


def test_a_failing_backend_is_recorded_and_the_bench_goes_on(tmp_path, monkeypatch) -> None:
    from decodecliff.kernels.api import AttentionBackend

    class Broken(AttentionBackend):
        name = "broken"

        def plan(self, meta):
            return None

        def run(self, q, kv_cache, out):
            raise RuntimeError("kernel launch failed")

    real = kernels.get_backend
    monkeypatch.setitem(kernels.BACKENDS, "broken", ("unused", "unused"))
    monkeypatch.setattr(
        kernels,
        "get_backend",
        lambda name, **kw: Broken() if name == "broken" else real(name, **kw),
    )
    out = tmp_path / "b.json"
    argv = ["--device", "cpu", "--contexts", "32", "64", "--modes", "chain2", "--heads", "2"]
    argv += ["--page-sizes", "1", "--backends", "broken", "torch", "--repeats", "1"]
    assert kernels.cli([*argv, "--quiet", "--out", str(out)]) == 0
    points = json.loads(out.read_text())["points"]
    assert [p["status"] for p in points] == ["failed", "ok", "failed", "ok"]
    assert "kernel launch failed" in points[0]["reason"]


def test_modes_and_roofline_definitions() -> None:
    assert kernels.parse_mode("decode") == (1, False)
    assert kernels.parse_mode("chain16") == (16, False)
    assert kernels.parse_mode("tree64") == (64, True)
    for bad in ("chain0", "tree", "decode1"):
        with pytest.raises(ValueError):
            kernels.parse_mode(bad)
    # verify L=16, 8 heads, 185k: 213 MB and 51.5 GFLOP (the reference card's numbers)
    assert roofline.attention_bytes(185_000) == 185_000 * 576 * 2
    assert roofline.attention_flops(185_000, 16, 8) / 1e9 == pytest.approx(51.5, rel=1e-3)
    assert roofline.floor_ms(4.3e9, 1e9, copy_gbs=4300, matmul_tflops=1000) == pytest.approx(1.0)
    assert roofline.floor_ms(1e6, 1e12, copy_gbs=4300, matmul_tflops=1000) == pytest.approx(1.0)


def test_bench_peers_on_cpu_skip_with_reasons_and_check_planted(tmp_path: Path, capsys) -> None:
    code, out = bench_here(
        tmp_path, "--contexts", "33", "--modes", "decode", "chain4", "--heads", "2",
        "--page-sizes", "16", "--backends", "triton", "sglang", "flashinfer", "cublas",
        "--repeats", "1", "--decode-splits", "sglang", "8", "--quiet",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["peers"]) == {"sglang", "flashinfer-python", "apache-tvm-ffi"}
    by = {(p["backend"], p["triton_config"], p["mode"]): p for p in doc["points"]}
    decode = [("triton", "grouped-sglang"), ("triton", "grouped-s8"), ("sglang", "decode-sglang")]
    decode += [("sglang", "decode-s8"), ("flashinfer", "fa2"), ("flashinfer", "fa3")]
    chain = [("triton", "sm90"), ("sglang", "extend"), ("sglang", "verify"), ("flashinfer", "fa2")]
    chain += [("flashinfer", "fa3")]
    expect = {(*v, "decode") for v in decode} | {(*v, "chain4") for v in chain}
    assert set(by) == expect | {("cublas", None, "decode"), ("cublas", None, "chain4")}
    for p in doc["points"]:
        if p["backend"] in ("sglang", "flashinfer"):
            assert p["status"] == "skipped" and "needs a CUDA GPU" in p["reason"]
        else:
            assert p["status"] == "ok" and p["planted_err"] < 3e-2 and p["planted_row"], p
    # without a GPU SGLang's rule sees no SM count and takes its base of 8 splits
    assert by[("triton", "grouped-sglang", "decode")]["detail"]["num_kv_splits"] == 8
    assert "[13/13" in capsys.readouterr().err  # progress: points done / total, elapsed, estimate


def test_the_planted_check_fails_a_backend_with_an_off_by_one_mask(tmp_path, monkeypatch) -> None:
    """A backend that is right on random data (rel err ~1e-3 at 4096) but sees one draft token
    too many: the planted pre-timing check fails its point."""
    import torch

    from decodecliff.kernels import reference

    good_mask = reference.visible_mask

    def off_by_one(q_len, kv_len, tree, device):
        mask = good_mask(q_len, kv_len, tree, device)
        mask[:, kv_len - q_len :] = torch.ones(q_len, q_len, dtype=torch.bool).tril(1)
        return mask

    class OffByOne(reference.TorchAttention):
        def plan(self, meta):
            monkeypatch.setattr(reference, "visible_mask", off_by_one)
            try:
                return super().plan(meta)
            finally:
                monkeypatch.setattr(reference, "visible_mask", good_mask)

    real = kernels.get_backend
    monkeypatch.setitem(kernels.BACKENDS, "offbyone", ("unused", "unused"))
    monkeypatch.setattr(
        kernels, "get_backend", lambda n, **kw: OffByOne() if n == "offbyone" else real(n, **kw)
    )
    out = tmp_path / "b.json"
    argv = ["--device", "cpu", "--contexts", "4096", "--modes", "chain16", "--heads", "2"]
    argv += ["--page-sizes", "64", "--backends", "offbyone", "--repeats", "1", "--quiet"]
    assert kernels.cli([*argv, "--out", str(out)]) == 1  # every point failed
    (point,) = json.loads(out.read_text())["points"]
    assert point["rel_err"] < core.REL_TOL  # the random-data check alone would have passed it
    assert point["status"] == "failed" and "planted mask check" in point["reason"]
    assert "next" in point["reason"] or "next" in (point["planted_row"] or "")


def test_flashinfer_sm120_build_check(tmp_path: Path, monkeypatch) -> None:
    import importlib.util
    import shutil

    from decodecliff.bench import flashinfer_sm120 as check

    out = tmp_path / "fi.json"
    if importlib.util.find_spec("flashinfer") is None or shutil.which("nvcc") is None:
        doc = check.run(out)
        assert doc["status"] == "skipped" and doc["reason"]
        return
    doc = check.run(out)
    assert json.loads(out.read_text()) == doc
    assert doc["status"] == "ok" and doc["builds"] and doc["registers"] > 0
    assert doc["sm120_config"]["min_smem_per_sm"] <= check.SM120_SMEM_PER_SM
    assert doc["fits"] == (doc["smem_per_block"] <= check.SM120_SMEM_PER_BLOCK)
    assert doc["h200_smem_per_block"] > doc["smem_per_block"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert check.run(out)["status"] == "skipped"


def test_custom_variants_are_timed_side_by_side_and_skipped_without_a_gpu(
    tmp_path: Path, capsys
) -> None:
    code, out = bench_here(
        tmp_path, "--contexts", "33", "--modes", "chain4", "--heads", "2", "--page-sizes", "16",
        "--backends", "custom", "--custom-variants", "v3", "v4", "auto",
        "--repeats", "1", "--quiet",
    )  # fmt: skip
    assert code == 0
    points = json.loads(out.read_text())["points"]
    assert [p["triton_config"] for p in points] == ["v3", "v4", None]  # auto keeps no label
    assert all(p["status"] == "skipped" and "CUDA GPU" in p["reason"] for p in points)
    capsys.readouterr()
    code, _ = bench_here(tmp_path, "--backends", "custom", "--custom-variants", "v9")
    assert code == 2 and "invalid choice: 'v9'" in capsys.readouterr().err


def test_custom_split_counts_are_timed_beside_each_variants_own_plan(tmp_path, capsys) -> None:
    code, out = bench_here(
        tmp_path, "--contexts", "33", "--modes", "chain4", "--heads", "2", "--page-sizes", "16",
        "--backends", "custom", "--custom-variants", "v4", "auto", "--custom-splits", "8", "16",
        "--repeats", "1", "--quiet",
    )  # fmt: skip
    assert code == 0
    points = json.loads(out.read_text())["points"]
    labels = [p["triton_config"] for p in points]
    assert labels == ["v4", None, "v4-s8", "auto-s8", "v4-s16", "auto-s16"]
    args = kernels.parse_args(["--custom-variants", "v5", "--custom-splits", "16", "--sm120-model"])
    forced = {v.label: dict(v.options) for v in kernels.custom_variants(args)}
    assert forced["v5-sm120-s16"] == {"variant": "v5", "model": "sm120", "num_splits": 16}
    assert "num_splits" not in forced["v5"] and "num_splits" not in forced["v5-sm120"]
    capsys.readouterr()
    code, _ = bench_here(tmp_path, "--backends", "custom", "--custom-splits", "0")
    assert code == 2 and "--custom-splits must be positive" in capsys.readouterr().err


def test_a_ragged_batch_reads_its_mixed_lengths_and_floors_their_sum(tmp_path: Path) -> None:
    assert kernels.kv_lengths(900, 16, 3, ragged=False) == [900, 900, 900]
    assert kernels.kv_lengths(900, 16, 3, ragged=True) == [900, 600, 300]
    assert kernels.kv_lengths(20, 16, 4, ragged=True) == [20, 16, 16, 16]  # never under q_len
    code, out = bench_here(
        tmp_path, "--contexts", "96", "--modes", "chain4", "--heads", "2", "--page-sizes", "1",
        "--backends", "torch", "--repeats", "1", "--batch", "3", "--ragged", "--quiet",
    )  # fmt: skip
    assert code == 0
    (point,) = json.loads(out.read_text())["points"]
    assert point["status"] == "ok" and point["ragged"] and point["batch"] == 3, point
    assert point["timing"] == "wall"  # a CPU's clock, never a CUDA graph
    # the floor counts 96 + 64 + 32 tokens, not 3 x 96
    tokens_per_s = point["gbs"] * 1e9 / (576 * 2)
    assert tokens_per_s * point["ms"] * 1e-3 == pytest.approx(96 + 64 + 32)


def test_a_check_skipped_on_a_cpu_says_so(tmp_path: Path, monkeypatch) -> None:
    """Past its size on a CPU a check is skipped, and the point says which, as it is timed."""
    monkeypatch.setattr(kernels, "CPU_PLANTED_FLOPS", 1e5)  # 2 heads x chain4 x 64: 1.1e6
    code, out = bench_here(
        tmp_path, "--contexts", "64", "--modes", "chain4", "--heads", "2", "--page-sizes", "1",
        "--backends", "torch", "--repeats", "1", "--quiet",
    )  # fmt: skip
    (point,) = json.loads(out.read_text())["points"]
    assert code == 0 and point["status"] == "ok" and point["rel_err"] is not None
    assert point["planted_err"] is None
    assert point["reason"] == "planted mask check skipped on CPU at this size"
    monkeypatch.setattr(kernels, "CPU_GUARD_FLOPS", 1e5)  # now both
    code, out = bench_here(
        tmp_path, "--contexts", "64", "--modes", "chain4", "--heads", "2", "--page-sizes", "1",
        "--backends", "torch", "--repeats", "1", "--quiet",
    )  # fmt: skip
    (point,) = json.loads(out.read_text())["points"]
    assert point["status"] == "ok" and point["rel_err"] is None and point["planted_err"] is None
    assert point["reason"] == (
        "correctness guard skipped on CPU at this size; planted mask check skipped on CPU at this "
        "size"
    )


def test_a_shape_whose_inputs_cannot_be_built_is_failed_and_the_bench_goes_on(tmp_path) -> None:
    """A context far past the machine's memory: its inputs fail to allocate (a real error of the
    allocator, as an out-of-memory is on a GPU), its points are recorded failed, the next runs."""
    code, out = bench_here(
        tmp_path, "--backends", "torch", "--contexts", str(10**12), "64", "--modes", "decode",
        "--heads", "2", "--page-sizes", "1", "--repeats", "1", "--quiet",
    )  # fmt: skip
    points = {p["ctx"]: p for p in json.loads(out.read_text())["points"]}
    assert code == 0 and set(points) == {10**12, 64}
    assert points[10**12]["status"] == "failed"
    assert points[10**12]["reason"].startswith("inputs not built: ")
    assert points[64]["status"] == "ok"


def test_busy_for_keeps_calling_until_the_time_has_passed(monkeypatch) -> None:
    """The warm-up before every CUDA timing (timing.WARM_MS): calls until the time has passed,
    at least once, in rounds no longer than what came before (a clock the step advances)."""
    from decodecliff.bench import timing

    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def step_of(ms: float):
        def step() -> None:
            now[0] += ms / 1e3

        return step

    assert timing.busy_for(step_of(1.0), "cpu", 20.0) == 20  # 1, 1, 2, 4, 8, then the 4 left
    assert timing.busy_for(step_of(7.0), "cpu", 20.0) == 3
    assert timing.busy_for(step_of(30.0), "cpu", 20.0) == 1
    assert timing.busy_for(step_of(0.001), "cpu", 20.0) == 20_000
