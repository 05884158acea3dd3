"""The launched server's keeper: it runs the server command as its child and takes the command's
whole process tree down with it, daemonised descendants included.

    python -I watchdog.py GRACE_S REPORT_FD LOG_CAP -- COMMAND [ARG ...]

A process group and a parent-death signal do not reach a descendant that calls setsid() (it leaves
the group) after its parent exited (it is re-parented to init). So the keeper makes itself a child
subreaper (Linux's PR_SET_CHILD_SUBREAPER): every orphaned descendant is re-parented to the keeper
instead of init, and walking the keeper's descendants in /proc finds every process the command
started. The keeper stops that tree (SIGCONT and SIGTERM to each process, SIGKILL after GRACE_S)

- when its standard input, a pipe whose other end only the sweep holds, reaches end-of-file: the
  sweep has ended, however it ended (SIGKILL included);
- on SIGTERM, SIGINT or SIGHUP (the sweep stopping its server);
- when the command exits on its own (what it left behind goes too).

Then it exits as the command did (the same code, or killed by the same signal), so the sweep sees
the server's fate. It writes the command's pid, or ``error: <reason>`` when the command cannot be
started, to REPORT_FD and closes it. It uses the standard library only, run isolated (-I), so that
nothing of the server's environment can break it.

The command's output (stdout and stderr) goes to the keeper's standard output, the server's log:
with a LOG_CAP above 0 through a pipe the keeper copies from, keeping at most LOG_CAP bytes of it
(past that the middle is cut: the log keeps how the server came up and its latest output, what
came before a failure); with 0 straight to the log, whatever its size.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
READ_SIZE = 1 << 16  # bytes of the command's output copied at a time


def become_subreaper() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def descendants(root: int) -> list[int]:
    """Every process below ``root``, from /proc (parents before their children)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def signal_tree(sig: int, command: int | None) -> None:
    """Signal every descendant (without /proc, elsewhere than Linux: the command alone)."""
    pids = descendants(os.getpid()) if os.path.isdir("/proc") else [command]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.kill(pid, sig)


class CappedLog:
    """The command's output appended to the log file ``fd`` (opened for reading and appending),
    at most ``cap`` bytes of it: past that, its middle is cut, the first half of the cap kept and
    the latest quarter (from a line's start), with a line that says how much is gone."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.start = os.lseek(fd, 0, os.SEEK_END)  # where this launch's output begins
        self.total = 0  # bytes of output received

    def write(self, data: bytes) -> None:
        self.total += len(data)
        self._append(data)
        end = os.lseek(self.fd, 0, os.SEEK_END)
        if end - self.start > self.cap:
            self._cut(end)

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def _cut(self, end: int) -> None:
        head, keep = self.cap // 2, self.cap // 4
        latest = os.pread(self.fd, keep, end - keep)
        latest = latest[latest.find(b"\n") + 1 :]
        os.ftruncate(self.fd, self.start + head)
        gone = self.total - head - len(latest)
        note = f"\n[decodecliff watchdog: {gone} bytes of the server's output cut here]\n"
        self._append(note.encode() + latest)


class Keeper:
    def __init__(self, wake: int) -> None:
        self.wake = wake  # readable when a signal arrived (signal.set_wakeup_fd)
        self.proc: subprocess.Popen | None = None  # the command (reaped here, not by Popen)
        self.pid: int | None = None
        self.status: int | None = None  # its wait status, once reaped
        self.out: int | None = None  # the pipe of the command's output, while it is open
        self.log: CappedLog | None = None

    def pump(self) -> None:
        """Copy what the command wrote (one read's worth) to the log; close the pipe once every
        writer has closed it."""
        if self.out is None:
            return
        try:
            data = os.read(self.out, READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            os.close(self.out)
            self.out = None
            return
        with contextlib.suppress(OSError):  # a full disk: the output is lost, the watch goes on
            self.log.write(data)

    def wait(self, fds: list[int], timeout: float | None) -> list[int]:
        """Those of ``fds`` readable within ``timeout`` s; the command's output wakes it too
        (and is copied), so it may return none of them early."""
        outs = [] if self.out is None else [self.out]
        ready = select.select([*fds, *outs], [], [], timeout)[0]
        if self.out is not None and self.out in ready:
            self.pump()
        return ready

    def drain(self) -> None:
        """Copy what the pipe still holds, without waiting for more (once the tree has ended,
        every writer is gone)."""
        while self.out is not None and select.select([self.out], [], [], 0)[0]:
            self.pump()

    def reap(self) -> bool:
        """Reap every exited child; False once no child is left (so no descendant either)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.pid:
                self.status = status

    def signals(self, timeout: float | None) -> bytes:
        """The signal numbers that arrived, waiting up to ``timeout`` s for one (or output)."""
        self.wait([self.wake], timeout)
        with contextlib.suppress(BlockingIOError):
            return os.read(self.wake, 512)
        return b""

    def wait_empty(self, timeout: float) -> bool:
        """Reap until no child is left (True) or ``timeout`` s passed (False)."""
        deadline = time.monotonic() + timeout
        while self.reap():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.signals(left)  # SIGCHLD wakes it (and output, which is copied meanwhile)
        return True

    def stop_tree(self, grace: float) -> None:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            signal_tree(sig, self.pid)
        if self.wait_empty(grace):
            return
        while True:  # descendants may fork meanwhile: until none is left
            signal_tree(signal.SIGKILL, self.pid)
            if self.wait_empty(0.5):
                return


def exit_as(status: int | None) -> None:
    """Exit as the command did: its exit code, or killed by its signal (without a core file)."""
    if status is None or not os.WIFSIGNALED(status):
        os._exit(0 if status is None else os.waitstatus_to_exitcode(status))
    sig = os.WTERMSIG(status)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not kill by default


def spawn(keeper: Keeper, command: list[str], report: int, log_cap: int) -> bool:
    """Start the command (its output through a pipe to a log of ``log_cap`` bytes at most, where
    that is above 0) and report its pid, or why it cannot start (then False, the pipe closed)."""
    out = None
    try:
        if log_cap > 0:
            keeper.log = CappedLog(sys.stdout.fileno(), log_cap)
            keeper.out, out = os.pipe()
            os.set_blocking(keeper.out, False)
        keeper.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        keeper.pid = keeper.proc.pid
        answer = str(keeper.pid)
    except (OSError, ValueError) as exc:
        print(f"decodecliff watchdog: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        answer = f"error: {exc}"
    with contextlib.suppress(OSError):  # the sweep died meanwhile: the lifeline says so next
        os.write(report, answer.encode())
    os.close(report)
    if out is not None:
        os.close(out)  # the command's, and its descendants', alone
    if keeper.pid is None and keeper.out is not None:
        os.close(keeper.out)  # no command: nothing will write to it
        keeper.out = None
    return keeper.pid is not None


def main(argv: list[str]) -> None:
    grace, report, log_cap, command = float(argv[0]), int(argv[1]), int(argv[2]), argv[4:]
    with contextlib.suppress(OSError, AttributeError):  # Linux only
        become_subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGCHLD, *STOP_SIGNALS):
        signal.signal(sig, lambda *_: None)  # the wakeup fd carries them
    keeper = Keeper(wake_r)
    if not spawn(keeper, command, report, log_cap):
        os._exit(127)
    watch(keeper)
    keeper.stop_tree(grace)
    keeper.drain()
    exit_as(keeper.status)


def watch(keeper: Keeper) -> None:
    """Return when the sweep is gone, asks to stop, or the command has exited."""
    lifeline = sys.stdin.fileno()
    while True:
        ready = keeper.wait([lifeline, keeper.wake], None)
        if lifeline in ready and not os.read(lifeline, 512):
            return  # end-of-file: the sweep has ended
        if keeper.wake in ready:
            got = keeper.signals(0)
            if any(sig in got for sig in STOP_SIGNALS):
                return
            keeper.reap()
            if keeper.status is not None:
                return


if __name__ == "__main__":
    main(sys.argv[1:])
