"""`decodecliff check-kernel` without a GPU: its options, a clear failure on a CPU, and the pieces
that need no GPU (cases, shapes, the checks themselves on the torch backend, the summary)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodecliff.bench import check_kernel as ck
from decodecliff.bench import core
from decodecliff.helpformat import DefaultsHelpFormatter
from decodecliff.kernels.planted import PLANTED_TOL
from decodecliff.kernels.reference import TorchAttention, reference_attention


def torch_backend(num_splits: int | None = None, variant: str | None = None) -> TorchAttention:
    """The torch backend in the kernel's place: the checks run as they do on the GPU."""
    return TorchAttention()


def test_options_and_their_defaults() -> None:
    args = ck.parse_args([])
    assert args.variants == ["v1", "v2", "v3", "v4"] and not args.quick and not args.sanitize
    assert args.cases is None and args.seed is None and args.launch is None
    assert args.out == Path("results/kernel-check") and args.launches == 3
    args = ck.parse_args(["--variants", "v3", "v1", "v3", "--quick", "--grid", "--cases", "0"])
    assert args.variants == ["v3", "v1"] and args.quick and args.grid and args.cases == 0
    args = ck.parse_args(["--launch", "185000:64:8:64:tree", "--launches", "1"])
    assert args.launch == {
        "kv_lens": [185000], "q_len": 64, "heads": 8, "page_size": 64, "tree": True,
        "num_splits": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["--variants", "v9"], ["--cases", "-1"], ["--launches", "0"], ["--launch", "16:185000:8"]],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        ck.parse_args(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_a_usage_error(tmp_path, capsys) -> None:
    (tmp_path / "kept.json").write_text("{}")
    for out in (tmp_path / "kept.json", tmp_path / "kept.json" / "sub"):
        with pytest.raises(SystemExit) as exc:
            ck.parse_args(["--out", str(out)])
        said = capsys.readouterr().err
        assert exc.value.code == 2 and "kept.json is a file, not a folder" in said
    assert (tmp_path / "kept.json").read_text() == "{}"


def test_every_option_says_its_default_and_no_markup() -> None:
    parser = ck.parser()
    text = parser.format_help()
    assert "``" not in text and "``" not in ck.DESCRIPTION
    formatter = DefaultsHelpFormatter("check-kernel")
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
            continue
        assert "default" in formatter._get_help_string(action), action.option_strings


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failure without a GPU")
def test_on_a_cpu_it_fails_at_once_with_a_clear_message(tmp_path: Path) -> None:
    out = tmp_path / "check"
    cmd = [sys.executable, "-m", "decodecliff.cli", "check-kernel", "--quick", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "check-kernel: needs a CUDA GPU, and torch sees none" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("1024:16:8", ([1024], 16, 8, 1, False)),
        ("1024:1:64:16", ([1024], 1, 64, 16, False)),
        ("300:64:8:tree", ([300], 64, 8, 1, True)),
        ("1000:1:8:batch=4", ([1000, 750, 500, 250], 1, 8, 1, False)),
        ("1000:16:8:64:tree:splits=7", ([1000], 16, 8, 64, True)),
    ],
)
def test_parse_shape(text: str, shape: tuple) -> None:
    parsed = ck.parse_shape(text)
    assert tuple(parsed[k] for k in ("kv_lens", "q_len", "heads", "page_size", "tree")) == shape
    assert parsed["num_splits"] == (7 if "splits" in text else None)


@pytest.mark.parametrize(
    "text",
    [
        "1024:16", "a:16:8", "8:16:8", "1024:16:0", "1024:16:8:1:2", "1024:16:8:batch=0",
        "1024:16:8:splits=x", "1024:16:8:split=4",
    ],
)  # fmt: skip
def test_parse_shape_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="CTX:Q_LEN:HEADS"):
        ck.parse_shape(text)


def test_cases_are_the_fixed_ones_then_reproducible_random_ones() -> None:
    cases = ck.correctness_cases(30, seed=5)
    fixed = ck.correctness_cases(0, seed=5)
    assert cases[: len(fixed)] == fixed and len(cases) == len(fixed) + 30
    assert cases == ck.correctness_cases(30, seed=5)
    assert cases[len(fixed) :] != ck.correctness_cases(30, seed=6)[len(fixed) :]
    for case in cases:
        assert all(n >= case["q_len"] for n in case["kv_lens"]), case
        assert case["page_size"] in (1, 16, 64) and 1 <= len(case["kv_lens"]) <= 5
        assert 1 <= case.get("num_splits", 1) <= 1024


def test_timing_points() -> None:
    quick, full, grid = (
        ck.timing_points(True),
        ck.timing_points(False),
        ck.timing_points(True, True),
    )
    assert len(quick) == 14 and len(full) == 24 and len(grid) == 48
    assert set(quick) < set(full)
    assert {(p[0], p[1], p[2], p[4]) for p in grid} == {
        (c, q, h, ps) for c in (1024, 16384, 65536, 185000) for q in (1, 16, 64)
        for h in (8, 64) for ps in (1, 64)
    }  # fmt: skip
    assert all(ctx >= q_len for ctx, q_len, *_ in full + grid)


def test_the_random_check_on_the_torch_backend() -> None:
    """The check as it runs on a kernel: two NaN-poisoned runs, one float64 reference."""
    cases = [c for c in ck.correctness_cases(0, seed=0) if sum(c["kv_lens"]) <= 5000]
    assert len(cases) > 5 and any(c["tree"] for c in cases)
    lines: list[str] = []
    for case in cases:
        for res in ck.run_case(case, ["v1"], lines.append, torch_backend):
            assert res["ok"] and res["finite"] and res["deterministic"], res
            assert res["rel_err"] < core.REL_TOL and res["splits"] is None
    assert not lines  # nothing failed, nothing diagnosed


class FaultyAttention(TorchAttention):
    """The torch backend with a fault planted in its output after each call: a broken kernel, on
    a machine that has only the CPU (``fault(out, call)``, calls counted from 1)."""

    def __init__(self, fault) -> None:
        super().__init__()
        self.fault, self.calls = fault, 0

    def prepare(self, batch, out):
        launch = super().prepare(batch, out)

        def faulty() -> None:
            launch()
            self.calls += 1
            self.fault(out, self.calls)

        return faulty


def _scaled(out: torch.Tensor, call: int) -> None:
    out.mul_(1.05)  # 5% off everywhere: over REL_TOL


def _one_nan(out: torch.Tensor, call: int) -> None:
    out.view(-1)[7] = float("nan")


def _zeros(out: torch.Tensor, call: int) -> None:
    out.zero_()


def _flaky(out: torch.Tensor, call: int) -> None:
    if call % 2 == 0:  # the second run differs in one element: within REL_TOL by the norm
        out.view(-1)[0] = out.view(-1)[0] * 1.05 + 0.01


@pytest.mark.parametrize(
    ("fault", "finite", "deterministic", "why"),
    [
        (_scaled, True, True, "rel err"),
        (_one_nan, False, False, "NaN/inf"),  # NaN equals nothing, itself included
        (_zeros, True, True, "all zeros"),
        (_flaky, True, False, None),
    ],
)
def test_the_random_check_fails_a_kernel_that_is_wrong(fault, finite, deterministic, why):
    case = {"kv_lens": [300, 41], "q_len": 4, "heads": 2, "page_size": 16, "tree": False}
    lines: list[str] = []
    backend = FaultyAttention(fault)
    [res] = ck.run_case({**case, "seed": 5}, ["v1"], lines.append, lambda **_: backend)
    assert not res["ok"]
    assert (res["finite"], res["deterministic"]) == (finite, deterministic)
    assert lines[0].startswith("FAIL ") and any("err by head" in line for line in lines)
    batch = ck.case_batch({**case, "seed": 5}, "cpu")
    err, reason = core.output_error(
        core.run_once(FaultyAttention(fault), batch), core.reference(batch)
    )
    assert (reason is None) == (why is None) and (why is None or why in reason)
    assert why != "rel err" or err > core.REL_TOL


def test_a_case_without_hints_plans_from_the_tensors() -> None:
    case = {"kv_lens": [40, 3], "q_len": 3, "heads": 2, "page_size": 16, "tree": False}
    batch = ck.case_batch({**case, "seed": 1, "drop_hints": True}, "cpu")
    assert batch.meta.max_q_len is None and batch.meta.max_kv_len is None
    assert batch.kv_cache.shape[0] == 3 + 1 + core.SPARE_PAGES  # 40 and 3 tokens in 16-token pages
    assert torch.equal(core.reference(batch), reference_attention(batch))


def test_the_planted_check_on_the_torch_backend() -> None:
    shape = ([700, 40], 4, 2, 16, False)
    results = ck.planted_checks(shape, ["v1", "v2"], 3, lambda line: None, torch_backend)
    assert [r["variant"] for r in results] == ["v1", "v2"]
    for res in results:
        assert res["ok"] and res["row_err"] <= PLANTED_TOL and res["batch"] == 2
        assert res["worst_row"].startswith("token ")


def test_summary_and_verdict() -> None:
    report = {
        "variants": ["v1", "v3"],
        "correctness": [
            {"variant": "v1", "rel_err": 2e-3, "ok": True},
            {"variant": "v1", "rel_err": 5e-3, "ok": True},
            {"variant": "v3", "rel_err": 0.5, "ok": False},
        ],
        "planted": [{"variant": "v1", "row_err": 1e-3, "ok": True}],
        "sanitizers": [{"tool": "memcheck", "rc": 0, "summary": ["0 errors"], "ok": True}],
    }
    assert ck.summary_lines(report) == [
        "correctness v1: 2/2 ok, max rel err 5.00e-03",
        "planted v1: 1/1 ok, max row err 1.00e-03",
        "correctness v3: 0/1 ok, max rel err 5.00e-01",
        "sanitizer memcheck: rc 0 ['0 errors']",
    ]
    assert not ck.passed(report)
    report["correctness"].pop()
    assert ck.passed(report)


CEILINGS = {"copy_gbs": 4000.0, "matmul_tflops": 700.0}  # as roofline.measure_ceilings returns


def test_timing_table_and_floor() -> None:
    # decode: 185k tokens x 576 x 2 bytes at 4000 GB/s; chain16 x 8 heads: its FLOPs at the
    # measured matmul rate take longer
    assert ck.point_floor_ms(185000, 1, 8, CEILINGS) == pytest.approx(185000 * 576 * 2 / 4e9)
    flops = 16 * 8 * 185000 * (576 + 512) * 2
    assert ck.point_floor_ms(185000, 16, 8, CEILINGS) == pytest.approx(flops / 700e9)
    timed = {"splits": 66, "ms": 0.1, "GBps": 2131.0, "TFLOPs": 32.0, "of_floor": 0.53}
    row = {"ctx": 185000, "L": 16, "heads": 8, "tree": False, "page": 1, "floor_ms": 0.053}
    row["variants"] = {"v1": timed, "v3": {**timed, "ms": 0.05}}
    row["triton_ms"] = 1.0
    lines = ck.timing_table([row], ["v1", "v3"], CEILINGS)
    assert lines[0].startswith("copy bandwidth 4000 GB/s, matmul 700 TFLOP/s") and len(lines) == 3
    assert "2.00x" in lines[2] and lines[2].endswith(" 10.0")


def test_sanitizer_runs_this_command_on_the_custom_kernels() -> None:
    cmd = ck.sanitizer_command("compute-sanitizer", "racecheck", ["v1", "v2"])
    assert cmd[:3] == ["compute-sanitizer", "--tool", "racecheck"] and "kns=mla_" in cmd
    assert cmd[cmd.index(sys.executable) :] == [
        sys.executable, "-m", "decodecliff.cli", "check-kernel", "--sanitizer-child",
        "--variants", "v1", "v2",
    ]  # fmt: skip


def test_a_sanitizer_that_times_out_is_a_failed_check_not_a_lost_report(
    tmp_path, monkeypatch
) -> None:
    """Every check before it has run: the timeout is recorded as that sanitizer's failure, with
    what it wrote, and the next sanitizer still runs."""
    import subprocess

    tool = tmp_path / "compute-sanitizer"
    tool.write_text("")
    monkeypatch.setattr(ck.shutil, "which", lambda name: str(tool))
    calls = []

    def run(cmd, **kw):
        calls.append(cmd[2])
        if cmd[2] == "memcheck":
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"partial\n", stderr=None)
        return subprocess.CompletedProcess(cmd, 0, "========= ERROR SUMMARY: 0 errors\n", "")

    monkeypatch.setattr(ck.subprocess, "run", run)
    logged = []
    results = ck.run_sanitizers(tmp_path, ["v1"], logged.append)
    assert calls == ["memcheck", "racecheck"]
    memcheck, racecheck = results
    assert memcheck["ok"] is False and memcheck["rc"] is None
    assert memcheck["summary"] == [f"timed out after {ck.SANITIZER_TIMEOUT_S} s"]
    assert "partial" in (tmp_path / "sanitizer_memcheck.log").read_text()
    assert racecheck["ok"] is True and racecheck["rc"] == 0
    assert not ck.passed({"correctness": [], "planted": [], "sanitizers": results})


def test_a_timing_point_on_the_torch_backend() -> None:
    point = (256, 4, 2, True, 16, None)
    batch = ck.point_batch(point, "cpu")
    m = batch.meta
    assert m.max_kv_len == 256 and m.tree_mask is not None and m.page_size == 16
    ceilings = {"copy_gbs": 50.0, "matmul_tflops": 0.5}
    row = ck.time_point(point, batch, ["v1", "v3"], ceilings, (2, 0), torch_backend)
    assert row["floor_ms"] == ck.point_floor_ms(256, 4, 2, ceilings)
    assert list(row["variants"]) == ["v1", "v3"]
    for timed in row["variants"].values():
        assert timed["ms"] > 0 and timed["splits"] is None
        assert timed["GBps"] == pytest.approx(256 * 576 * 2 / timed["ms"] / 1e6)
        assert timed["of_floor"] == pytest.approx(row["floor_ms"] / timed["ms"])


def test_a_run_that_dies_leaves_no_earlier_report_beside_its_log(tmp_path, monkeypatch) -> None:
    """check.json from an earlier run must not sit beside the log of one that died mid-way (a
    kill, here a check that raises: no GPU here to run one), read as that run's verdict."""
    (tmp_path / "check.json").write_text('{"correctness": []}')
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def dies(args, log):
        log("seed 1")
        raise RuntimeError("killed")

    monkeypatch.setattr(ck, "run", dies)
    with pytest.raises(RuntimeError, match="killed"):
        ck.cli(["--out", str(tmp_path)])
    assert (tmp_path / "check.log").read_text() == "seed 1\n"
    assert not (tmp_path / "check.json").exists()
