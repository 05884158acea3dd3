"""`decodecliff sweep` options: usage errors, chunk files, and points without a reachable server."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from decodecliff.sweep import cli, launcher, runner
from decodecliff.sweep.runner import SCHEMA_PATH, run_async

REPO = Path(__file__).resolve().parents[1]


def _dead_url() -> str:
    return f"http://127.0.0.1:{launcher.free_port('127.0.0.1')}"


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "give --contexts or --chunks-json"),
        (["--contexts", "64", "64"], "appears twice"),
        (["--contexts", "0"], "positive integers"),
        (["--contexts", "64", "--gen-tokens", "0"], "at least 2"),
        (["--contexts", "64", "--gen-tokens", "1"], "gen tokens must be at least 2, got 1"),
        (["--contexts", "64", "--seed", "-1"], "non-negative"),
        (["--contexts", "64", "--name", "a/b"], "letters, digits"),
        (["--contexts", "64", "--warmup-tokens", "-1"], "warm-up tokens must be >= 0"),
        (["--contexts", "64", "--warmup-gen-tokens", "0"], "warm-up gen tokens must be >= 1"),
        (["--contexts", "64", "--point-timeout", "nan"], "positive finite seconds"),
        (["--contexts", "64", "--chunk-timeout", "inf"], "positive finite seconds"),
        (["--contexts", "64", "--start-timeout", "nan"], "positive finite seconds"),
        (["--contexts", "64", "--stop-grace", "nan"], "finite seconds >= 0"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, extra, message):
    argv = ["--url", "http://127.0.0.1:1", "--name", "x", "--out", str(tmp_path), *extra]
    with pytest.raises(SystemExit) as exc:
        cli.cli(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "chunk, message",
    [
        ({"contexts": [64], "timeout_s": None}, "chunk 0: chunk and point timeouts"),
        ({"contexts": [[64]]}, "chunk 0: contexts must be positive integers"),
        ({"contexts": [64.0]}, "chunk 0: contexts must be positive integers"),
    ],
)
def test_a_bad_chunks_file_is_a_usage_error(tmp_path, capsys, chunk, message):
    chunks = tmp_path / "chunks.json"
    chunks.write_text(json.dumps([chunk]))
    argv = ["--url", "http://127.0.0.1:1", "--name", "x", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        cli.cli([*argv, "--chunks-json", str(chunks)])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_template_is_a_usage_error(tmp_path, capsys):
    argv = ["--server-cmd", "serve --port {prot}", "--name", "x", "--contexts", "8"]
    with pytest.raises(SystemExit) as exc:
        cli.cli([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "only {host} and {port}" in capsys.readouterr().err


def test_render_command_fills_placeholders_and_leading_env():
    env, argv = launcher.render_command("A=1 B='x y' srv --host {host} --port {port}", "h", 9)
    assert env == {"A": "1", "B": "x y"}
    assert argv == ["srv", "--host", "h", "--port", "9"]


def test_chunks_file_and_selecting_single_points(tmp_path):
    chunks = [
        {"contexts": [64, 128], "timeout_s": 50, "point_timeout_s": 5},
        {"contexts": [4096], "timeout_s": 900},
    ]
    path = tmp_path / "chunks.json"
    path.write_text(json.dumps({"chunks": chunks}))
    base = ["--url", "http://h:1", "--name", "x", "--out", str(tmp_path)]
    base += ["--chunks-json", str(path)]
    cfg = cli.config_from_args(cli._parser().parse_args([*base, "--point-timeout", "7"]))
    assert [c.contexts for c in cfg.chunks] == [[64, 128], [4096]]
    assert (cfg.chunks[1].timeout_s, cfg.chunks[1].point_timeout_s) == (900, 7)
    cfg = cli.config_from_args(cli._parser().parse_args([*base, "--contexts", "128"]))
    assert len(cfg.chunks) == 1 and cfg.chunks[0].contexts == [128]
    assert (cfg.chunks[0].timeout_s, cfg.chunks[0].point_timeout_s) == (50, 5)
    with pytest.raises(ValueError, match=r"\[999\] are in no chunk"):
        cli.config_from_args(cli._parser().parse_args([*base, "--contexts", "999"]))
    path.write_text(json.dumps([{"ctx": [1]}]))
    with pytest.raises(ValueError, match="needs 'contexts'"):
        cli.config_from_args(cli._parser().parse_args(base))


def test_unreachable_server_gives_failed_points_not_a_crash(tmp_path, monkeypatch):
    """The first point waits the whole start timeout for a URL server; once it stayed away that
    long, the later points look for it briefly, not a start timeout each."""
    monkeypatch.setattr(runner, "URL_RECHECK_S", 0.2)
    out = tmp_path / "out"
    argv = ["--url", _dead_url(), "--name", "gone", "--contexts", "16", "32", "64"]
    rc = cli.cli([*argv, "--start-timeout", "1", "--out", str(out), "--no-progress"])
    assert rc == cli.NO_SUCCESS  # no point succeeded, yet each has its file
    schema = json.loads(SCHEMA_PATH.read_text())
    for ctx in (16, 32, 64):
        point = json.loads((out / f"ctx{ctx}.json").read_text())
        jsonschema.validate(point, schema)
        assert point["status"] == "failed"
        assert point["reason"].startswith("server not reachable (")
        wait = "start timeout 1 s" if ctx == 16 else "rechecked for 0.2 s"
        assert wait in point["reason"], point["reason"]
        assert point["warmup"] is None  # no server came up, so nothing was warmed
    assert "whole start timeout at ctx 16" in point["reason"]
    assert not list(out.glob(".*tmp"))


@pytest.mark.parametrize("ok", [False, True])
def test_no_point_succeeded_exits_3_unless_failed_points_are_ok(tmp_path, capsys, ok):
    server = f"{sys.executable} -c 'raise SystemExit(1)' --port {{port}}"
    argv = ["--server-cmd", server, "--name", "dies", "--contexts", "16", "32", "--no-progress"]
    argv += ["--start-timeout", "30", "--out", str(tmp_path)]
    rc = cli.cli(argv + ["--failed-points-ok"] * ok)
    assert rc == (0 if ok else 3)
    assert ("no point succeeded" in capsys.readouterr().err) is not ok
    for ctx in (16, 32):
        point = json.loads((tmp_path / f"ctx{ctx}.json").read_text())
        assert point["status"] == "failed" and "exited with code 1" in point["reason"]


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.cli([*argv, "--no-progress"])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_what_a_sweep_could_not_write_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["--url", _dead_url(), "--name", "x", "--contexts", "16", "32", "--start-timeout", "9"]
    said = _usage_error([*argv, "--out", str(blocker / "out")], capsys)
    assert "--out: cannot write" in said and "cannot make its folder" in said
    (tmp_path / "out" / "ctx32.json").mkdir(parents=True)  # found before ctx16 is measured
    said = _usage_error([*argv, "--out", str(tmp_path / "out")], capsys)
    assert (
        f"--out: cannot write {tmp_path / 'out' / 'ctx32.json'}: " in said and "is a folder" in said
    )
    server = ["--server-cmd", "serve {port}", "--name", "x", "--contexts", "16"]
    said = _usage_error(
        [*server, "--out", str(tmp_path / "o2"), "--server-log", str(blocker / "l")], capsys
    )
    assert "--server-log: cannot write" in said
    assert not (tmp_path / "o2" / "ctx16.json").exists()


@pytest.mark.parametrize(
    "url, message",
    [
        ("127.0.0.1:30000", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
        ("ftp://h:1", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
        ("http://h:1/?x=1", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
        ("http://127.0.0.1:abc", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
        ("http://127.0.0.1:99999", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
        ("http://127.0.0.1:0", "--url must be http(s)://HOST[:PORT][/PREFIX]"),
    ],
)
def test_a_url_that_is_no_server_is_a_usage_error(tmp_path, capsys, url, message):
    argv = ["--url", url, "--name", "x", "--contexts", "16", "--out", str(tmp_path)]
    assert message in _usage_error(argv, capsys)


def test_a_rerun_keeps_an_ok_point_it_fails_and_never_takes_another_servers(tmp_path, capsys):
    recorded = REPO / "tests/data/study/sweep/torch-chain16-p1/ctx256.json"
    good = json.loads(recorded.read_text())
    assert good["status"] == "ok" and good["name"] == "torch-chain16-p1"
    (tmp_path / "ctx256.json").write_text(recorded.read_text())
    argv = ["--url", _dead_url(), "--contexts", "256", "--out", str(tmp_path)]
    said = _usage_error([*argv, "--name", "other"], capsys)
    assert "holds the point of server 'torch-chain16-p1': give --name torch-chain16-p1" in said
    rc = cli.cli([*argv, "--name", good["name"], "--start-timeout", "0.5", "--no-progress"])
    assert rc == cli.NO_SUCCESS
    assert json.loads((tmp_path / "ctx256.json.prev").read_text()) == good
    failed = json.loads((tmp_path / "ctx256.json").read_text())
    assert failed["status"] == "failed" and "last: GET /health: ConnectError" in failed["reason"]


def test_a_point_of_the_same_name_launched_with_another_command_is_never_taken(tmp_path, capsys):
    """A recorded point of torch-chain16-p1 (--draft-len 16): the same --name with --draft-len 8
    is refused before a server starts; a new host or port of the same command is not another
    server."""
    recorded = REPO / "tests/data/study/sweep/torch-chain16-p1/ctx256.json"
    template = json.loads(recorded.read_text())["config"]["server_cmd"]
    assert "--draft-len 16 " in template and "--host {host} --port {port}" in template
    (tmp_path / "ctx256.json").write_text(recorded.read_text())
    argv = ["--name", "torch-chain16-p1", "--contexts", "256", "--out", str(tmp_path)]
    eight = template.replace("--draft-len 16", "--draft-len 8")
    said = _usage_error([*argv, "--server-cmd", eight], capsys)
    assert (
        f"{tmp_path / 'ctx256.json'} holds a point of server 'torch-chain16-p1' launched with "
        "another command (`--draft-len 16` where this sweep has `--draft-len 8`)"
    ) in said
    assert not (tmp_path / "server-torch-chain16-p1.log").exists()  # nothing was launched
    assert (tmp_path / "ctx256.json").read_text() == recorded.read_text()
    # the same command, spaced and quoted otherwise, on another host: the same server
    same = template.replace(" --spec chain", "  --spec 'chain'")
    skip = ["--skip-reason", "not here", "--failed-points-ok", "--no-progress"]
    assert cli.cli([*argv, "--server-cmd", same, "--host", "localhost", *skip]) == 0
    assert json.loads((tmp_path / "ctx256.json").read_text())["status"] == "skipped"
    # a point of schema /1 kept its template as server_command
    old = REPO / "tests/data/published/sweep/custom-graphs/ctx1024.json"
    assert json.loads(old.read_text())["server_command"].endswith("--page-size 64 --port {port}")
    (tmp_path / "ctx1024.json").write_text(old.read_text())
    argv = ["--name", "custom-graphs", "--contexts", "1024", "--out", str(tmp_path)]
    cmd = "decodecliff serve --backend custom --page-size 1 --port {port}"
    said = _usage_error([*argv, "--server-cmd", cmd], capsys)
    assert "(`--page-size 64` where this sweep has `--page-size 1`)" in said
    # a failed point measured nothing: a rerun with another flag may replace it
    doc = json.loads(recorded.read_text())
    doc["status"], doc["reason"] = "failed", "point timeout"
    (tmp_path / "ctx256.json").write_text(json.dumps(doc))
    argv = ["--name", "torch-chain16-p1", "--contexts", "256", "--out", str(tmp_path)]
    assert cli.cli([*argv, "--server-cmd", eight, *skip]) == 0
    assert json.loads((tmp_path / "ctx256.json").read_text())["status"] == "skipped"


def test_schema_rejects_an_ok_point_without_a_stream():
    schema = json.loads(Path(SCHEMA_PATH).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    point = {
        "schema": "decodecliff.sweep-point/2",
        "name": "x",
        "requested_ctx": 8,
        "prompt_tokens": 8,
        "gen_tokens": 2,
        "status": "ok",
        "reason": None,
        "warnings": [],
        "metrics": {
            "ttft_s": 0.1,
            "e2e_s": 0.2,
            "completion_tokens": 2,
            "decode_tok_s": 10.0,
            "requests": 1,
        },
        "requests_per_point": 1,
        "concurrency": 1,
        "requests": [
            {
                "round": 0,
                "stream": 0,
                "prompt_salt": 0,
                "error": None,
                "metrics": {},
                "meta_info": {},
                "token_timestamps": [[0.1, 1], [0.2, 2]],
            }
        ],
        "rounds": [{"round": 0, "streams": 1, "wall_s": 0.2, "tokens": 2, "tok_s": 10.0}],
        "server_info_after": None,
        "api": "generate",
        "server_url": None,
        "server_info": {},
        "server_command": None,
        "server_log": None,
        "chunk": {"index": 0, "contexts": [8], "timeout_s": 1, "point_timeout_s": 1},
        "config": {"name": "x", "chunks": [], "gen_tokens": 2, "api": "generate", "seed": 0},
        "env": {"host": "h", "torch": "t", "git": None},
        "started_at": "2026-01-01T00:00:00.000+00:00",
        "finished_at": "2026-01-01T00:00:01.000+00:00",
        "token_timestamps": [[0.1, 1], [0.2, 2]],
    }
    jsonschema.validate(point, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**point, "token_timestamps": []}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**point, "status": "failed"}, schema)  # a failure needs a reason
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**point, "requests": []}, schema)  # an ok point rests on requests


def test_gpu_presets_record_at_least_three_requests_per_point():
    """Five after the warm-up; where device time is short (the Triton server's longest points)
    never fewer than three."""
    for preset in ("h200", "rtx-pro-6000"):
        cfg = yaml.safe_load((REPO / "config" / f"{preset}.yaml").read_text())
        assert cfg["sweep"]["requests_per_point"] == 5
        for server in cfg["sweep"]["servers"]:
            for chunk in server["chunks"]:
                assert chunk.get("requests_per_point", 5) >= 3, (preset, server["name"])


def test_skip_reason_writes_every_point_as_skipped_and_launches_nothing(tmp_path, capsys):
    marker = tmp_path / "launched"
    server = f"sh -c 'touch {marker}' --port {{port}}"  # would leave the marker if launched
    argv = ["--server-cmd", server, "--name", "peer", "--no-progress", "--failed-points-ok"]
    reason = "the sglang backend needs a CUDA GPU (the device is cpu)"
    argv += ["--contexts", "16", "32", "--skip-reason", reason, "--out", str(tmp_path / "out")]
    assert cli.cli(argv) == 0
    assert "0 ok, 0 failed, 2 skipped" in capsys.readouterr().err
    schema = json.loads(SCHEMA_PATH.read_text())
    for ctx in (16, 32):
        point = json.loads((tmp_path / "out" / f"ctx{ctx}.json").read_text())
        jsonschema.validate(point, schema)
        assert (point["status"], point["reason"]) == ("skipped", reason)
        assert point["server_launch"] == 0 and point["server_log"] is None
    assert not marker.exists()


def test_a_stop_signal_inside_the_event_loop_ends_the_sweep_without_a_traceback(caplog):
    # The CLI's SIGTERM handler raises SystemExit. Raised inside a stream's task, it would break
    # the stream mid-read (and asyncio log a traceback of what failed next); instead the signal
    # cancels the streams, and the sweep exits once the event loop has stopped.
    cancelled: list[str] = []

    async def stream() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append("stream")
            raise

    async def point() -> None:
        await asyncio.gather(stream())

    previous = signal.signal(signal.SIGTERM, cli._exit_on_signal)
    try:
        with pytest.raises(SystemExit) as ended:
            run_async(point())
    finally:
        signal.signal(signal.SIGTERM, previous)
    gc.collect()
    assert ended.value.code == 128 + signal.SIGTERM and cancelled == ["stream"]
    assert signal.getsignal(signal.SIGTERM) is previous
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_a_launch_host_resolves_and_an_ipv6_one_is_bracketed_in_urls(tmp_path, capsys):
    argv = ["--server-cmd", "serve --host {host} --port {port}", "--name", "x", "--contexts", "16"]
    said = _usage_error([*argv, "--host", "nohost.invalid", "--out", str(tmp_path)], capsys)
    assert "--host nohost.invalid: " in said
    assert launcher.http_url("::1", 8000) == "http://[::1]:8000"
    assert launcher.http_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert 0 < launcher.free_port("::1") < 65536  # a port of the host's own family


WATCH = """
import signal, sys, time
from decodecliff.sweep import cli
signal.signal(signal.SIGTERM, cli._exit_on_signal)
if sys.argv[1] == "unwinding":
    cli.STOPPING.set()
cli.stop_with_parent(parent=int(sys.argv[2]), poll_s=0.05)
time.sleep(3)
"""


@pytest.mark.parametrize("state", ["running", "unwinding"])
def test_a_parent_gone_before_the_watch_stops_the_sweep_at_once(state: str) -> None:
    """--stop-with-parent PID: the launcher's pid, so a parent that died before the watch began
    (here: a pid that is not our parent) stops the sweep at once; one already unwinding from a
    signal is left to finish its cleanup, not interrupted again."""
    not_ours = 2**22 + 12345  # above any pid_max default: never this process's parent
    done = subprocess.run(
        [sys.executable, "-c", WATCH, state, str(not_ours)], capture_output=True, timeout=60
    )
    if state == "running":
        assert done.returncode == 128 + signal.SIGTERM, done.stderr  # not the sleep's 0
    else:
        assert done.returncode == 0, done.stderr
