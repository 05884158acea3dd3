"""The launched server's keeper (sweep/watchdog.py): however the server or the sweep ends, the
server's whole process tree ends with it, a grandchild daemonised with setsid included. The
server here is tests/faulty_server.py (it answers /health), started through a shell that
daemonises a `sleep` the classic way (a subshell starts it with setsid and exits)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from proctree import Leftovers, alive, gone, parent, session, wait_for

from decodecliff.sweep import launcher, watchdog

FAULTY = Path(__file__).with_name("faulty_server.py")


FAULTY_CMD = f"{sys.executable} {FAULTY} --port {{port}} --nan-in meta"


def daemonising(server: str, pid_file: Path) -> str:
    """``server`` (a command template) run by a shell that first leaves a daemon behind, the
    daemon's pid in ``pid_file``."""
    return f"sh -c '(setsid sleep 600 & echo $! > {pid_file}); exec {server}'"


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half written


def orphaned_daemon(pid_file: Path, keeper: int, leftovers: Leftovers) -> int:
    """The daemon's pid once it runs in a session of its own, orphaned to the keeper."""
    daemon = leftovers.track(wait_for("the daemon's pid", lambda: _pid(pid_file)))
    wait_for("the daemon to be orphaned", lambda: parent(daemon) == keeper)
    assert alive(daemon) and session(daemon) == daemon != session(keeper)
    return daemon


def _start(tmp_path: Path, leftovers: Leftovers) -> tuple[launcher.Server, int]:
    """A started server (keeper and command tracked) and its daemon's pid."""
    pid_file = tmp_path / "daemon.pid"
    leftovers.pid_file(pid_file)
    server = launcher.Server(daemonising(FAULTY_CMD, pid_file), stop_grace_s=5)
    server.start(timeout_s=60)
    leftovers.track(server.proc.pid)
    leftovers.track(server.pid)
    assert parent(server.pid) == server.proc.pid
    return server, orphaned_daemon(pid_file, server.proc.pid, leftovers)


def test_stopping_the_server_stops_its_daemonised_grandchild(tmp_path, leftovers):
    server, daemon = _start(tmp_path, leftovers)
    command = server.pid
    server.stop()
    assert gone([command, daemon], timeout=0.1)  # stop() returns once the whole tree has ended


def test_a_server_that_dies_takes_its_daemon_along_and_its_fate_is_reported(tmp_path, leftovers):
    server, daemon = _start(tmp_path, leftovers)
    os.kill(server.pid, signal.SIGKILL)
    wait_for("the keeper to exit", lambda: server.exit_code() is not None)
    assert server.exit_code() == -signal.SIGKILL  # as if the command were the sweep's child
    assert gone([daemon], timeout=0.1)
    server.stop()


def test_a_keeper_killed_outright_leaves_no_server_behind_once_stopped(tmp_path, leftovers):
    server = launcher.Server(FAULTY_CMD, stop_grace_s=5)
    server.start(timeout_s=60)
    keeper, command = server.proc.pid, server.pid
    leftovers.track(keeper)
    leftovers.track(command)
    os.kill(keeper, signal.SIGKILL)  # the server stays, in the keeper's process group
    wait_for("the keeper to exit", lambda: server.exit_code() is not None)
    assert not gone([command], timeout=0.5)
    server.stop()
    assert gone([command], timeout=10)


def test_an_exit_code_is_passed_on_and_an_unknown_program_is_a_clear_error(leftovers):
    with pytest.raises(launcher.ServerError, match="exited with code 3 while starting"):
        launcher.Server("sh -c 'exit 3' {port}").start(timeout_s=30)
    missing = launcher.Server("no-such-program-here --port {port}")
    with pytest.raises(launcher.ServerError, match="cannot launch 'no-such-program-here'"):
        missing.start(timeout_s=30)
    assert missing.exit_code() is None and missing.proc is None


def test_a_port_taken_before_the_server_binds_it_is_replaced_by_a_fresh_one(
    tmp_path, leftovers, monkeypatch
):
    # The race itself cannot be timed: the first port handed out is one a socket here holds.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken])
        free = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda host: next(ports, None) or free(host))
        server = launcher.Server(FAULTY_CMD, log_path=tmp_path / "serve.log", stop_grace_s=5)
        try:
            server.start(timeout_s=60)
            leftovers.track(server.proc.pid)
            assert server.launches == 2 and not server.url.endswith(f":{taken}")
            assert launcher.healthy(server.url)
        finally:
            server.stop()
    assert "address already in use" in (tmp_path / "serve.log").read_text().lower()


def test_a_port_held_by_another_launchs_server_is_not_measured_as_this_ones(
    tmp_path, leftovers, monkeypatch
):
    """Another sweep's server holds the port handed out: it answers /health while the one
    launched fails to bind, and must not be taken for it."""
    other = launcher.Server(FAULTY_CMD, log_path=tmp_path / "other.log", stop_grace_s=5)
    try:
        other.start(timeout_s=60)
        leftovers.track(other.proc.pid)
        taken = int(other.url.rsplit(":", 1)[1])
        ports = iter([taken])
        free = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda host: next(ports, None) or free(host))
        server = launcher.Server(FAULTY_CMD, log_path=tmp_path / "serve.log", stop_grace_s=5)
        try:
            info = server.start(timeout_s=60)
            leftovers.track(server.proc.pid)
            assert server.launches == 2 and not server.url.endswith(f":{taken}")
            assert info["launch_id"] == server.launch_id != other.launch_id
        finally:
            server.stop()
        assert launcher.healthy(other.url)  # the other launch's server is left as it was
    finally:
        other.stop()


def test_a_server_failing_for_another_reason_is_not_relaunched(tmp_path, leftovers):
    server = launcher.Server("sh -c 'echo boom; exit 3' {port}", log_path=tmp_path / "serve.log")
    with pytest.raises(launcher.ServerError, match="exited with code 3 while starting: boom"):
        server.start(timeout_s=30)
    assert server.launches == 1
    said = "sh -c 'echo first; echo \"error: no such file: /proc/nope\" >&2; exit 2' {port}"
    again = launcher.Server(said, log_path=tmp_path / "serve.log")  # the same log, appended
    with pytest.raises(launcher.ServerError) as err:
        again.start(timeout_s=30)
    assert str(err.value) == (
        "server exited with code 2 while starting: error: no such file: /proc/nope "
        f"(log: {tmp_path / 'serve.log'})"
    )


def test_a_launcher_killed_outright_takes_the_whole_tree_along(tmp_path, leftovers):
    pid_file = tmp_path / "daemon.pid"
    leftovers.pid_file(pid_file)
    script = (
        "import time\nfrom decodecliff.sweep import launcher\n"
        f"s = launcher.Server({daemonising(FAULTY_CMD, pid_file)!r})\ns.start(timeout_s=60)\n"
        "print(s.proc.pid, s.pid, flush=True)\ntime.sleep(600)\n"
    )
    holder = leftovers.popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    keeper, command = map(int, holder.stdout.readline().split())
    leftovers.track(keeper)
    leftovers.track(command)
    daemon = orphaned_daemon(pid_file, keeper, leftovers)
    holder.kill()  # SIGKILL: nothing runs in the launcher any more
    holder.wait(timeout=30)
    assert gone([keeper, command, daemon], timeout=30), "the server's tree outlived its launcher"


def test_relaunches_on_a_fresh_port_share_one_start_timeout(tmp_path, leftovers):
    """A server that loses its port only once loaded (SGLang binds it after loading the model)
    is relaunched within what is left of the start timeout, not given a whole one again."""
    said = "OSError: [Errno 98] error while attempting to bind: address already in use"
    template = f"sh -c 'sleep 2; echo \"{said}\" >&2; exit 1' {{port}}"
    server = launcher.Server(template, log_path=tmp_path / "serve.log", stop_grace_s=1)
    with pytest.raises(launcher.ServerError, match=r"within the start timeout \(3 s\)"):
        server.start(timeout_s=3)
    # each launch takes 2 s to lose its port: a third one would start past the 3 s
    assert server.launches <= 2


def _open_fds() -> set[int]:
    """This process's open file descriptors (not the one that listed them, closed by then)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        fds.add(int(name))
    return fds


def test_a_keeper_that_cannot_be_started_leaves_no_pipe_open(tmp_path, monkeypatch, leftovers):
    # The keeper runs under this Python: a missing one fails its Popen before any keeper runs.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    server = launcher.Server("sleep 600 {port}")
    before = _open_fds()
    for _ in range(3):
        with pytest.raises(launcher.ServerError, match="cannot launch the server's keeper"):
            server.start(timeout_s=30)
    assert _open_fds() == before  # the report's read end and the lifeline were left open
    assert server.lifeline is None and server.proc is None


def test_a_command_the_keeper_cannot_start_leaves_it_no_pipe_open(tmp_path, monkeypatch):
    # In the keeper's own process (spawn, as main calls it), with a capped log: the pipe of the
    # command's output is made before the command fails to start.
    log = open(tmp_path / "serve.log", "a+b")  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", log)  # the keeper's standard output is the log
    report_r, report_w = os.pipe()
    before = _open_fds() - {report_w}  # spawn closes the report's write end
    keeper = watchdog.Keeper(wake=-1)
    try:
        assert not watchdog.spawn(keeper, [str(tmp_path / "no-such-program")], report_w, 4096)
        assert os.read(report_r, 512).decode().startswith("error: ")
        assert _open_fds() == before and keeper.out is None
    finally:
        os.close(report_r)
        log.close()
