"""Processes a test starts, found through /proc and always cleaned up, so that a fault test that
kills a process tree by force leaves nothing behind, whether it passes or fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from decodecliff.sweep.watchdog import descendants  # the keeper's own walk of /proc

T = TypeVar("T")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running (a zombie has ended: it only waits for its parent to reap it)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def session(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[3])


def started(pid: int) -> int | None:
    """The start time in clock ticks since boot: a pid reused later is another process."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
    except OSError:
        return []


def wait_for(what: str, probe: Callable[[], T], timeout: float = 60.0) -> T:
    """``probe()`` once it is truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
    return value


def gone(pids: list[int], timeout: float = 60.0) -> bool:
    """Whether every one of ``pids`` has ended within ``timeout`` s."""
    with contextlib.suppress(AssertionError):
        wait_for("the processes to end", lambda: not any(alive(p) for p in pids), timeout)
    return not any(alive(p) for p in pids)


class Leftovers:
    """What a test started: at the end every tracked process still running, and every process
    below one, is SIGKILLed (by pid and start time, so never a stranger that reused a pid)."""

    def __init__(self) -> None:
        self.procs: dict[int, int] = {}  # pid -> start time
        self.popens: list[subprocess.Popen] = []
        self.pid_files: list[Path] = []

    def track(self, pid: int) -> int:
        start = started(pid)
        if start is not None:
            self.procs.setdefault(pid, start)
        return pid

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(*args, **kwargs)
        self.popens.append(proc)
        self.track(proc.pid)
        return proc

    def pid_file(self, path: Path) -> None:
        """A file where a process writes its pid (read at the end: it may come late)."""
        self.pid_files.append(path)

    def kill_all(self) -> list[int]:
        """SIGKILL what is left; the pids that were still running."""
        for path in self.pid_files:
            with contextlib.suppress(OSError, ValueError):
                self.track(int(path.read_text()))
        for pid in list(self.procs):
            if self._same(pid):
                for below in descendants(pid):
                    self.track(below)
        left = [pid for pid in self.procs if self._same(pid) and alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        return left

    def _same(self, pid: int) -> bool:
        return started(pid) == self.procs[pid]
