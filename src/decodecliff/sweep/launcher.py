"""The server under test: launched from a command template, or reached at a URL.

A launched server runs under a keeper process (watchdog.py, in a session of its own) that stops
the server's whole process tree, daemonised descendants included (SIGCONT so a stopped one can
die, SIGTERM, SIGKILL after a grace period): when the sweep stops it, when the server exits, and
when the sweep dies without stopping it (SIGKILL), which the keeper learns from a pipe only the
sweep holds. So nothing the server spawned outlives the sweep.

A launch's output goes to the server log through its keeper, which keeps the log under a cap by
cutting the middle of a launch's output (its start and its latest output stay); a log over half
the cap when a server is launched is moved to LOG.1 first (one earlier generation kept). The
keeper, not the sweep, copies the output: no thread of the sweep's takes the time of the points
it measures, and the cap holds through a point however long it runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import httpx

from decodecliff.server.cli import API_KEY_ENV  # the key `decodecliff serve` requires

_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ServerError(RuntimeError):
    """The server could not be started or reached."""


class PortTaken(ServerError):
    """Another launch's server answered on the port picked for this one."""


# The key of a server info that could not be used, with the reason (e.g. a NaN in it).
INVALID = "invalid"


def _no_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in the server's JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} out of range in the server's JSON")
    return value


WATCHDOG = Path(__file__).with_name("watchdog.py")
REPORT_TIMEOUT_S = 60.0  # for the keeper to start the command (a Python start on a busy host)
INFO_S = 10.0  # for the server info (server_info), in all
PORT_ATTEMPTS = 3  # launches on fresh ports when another process took the one picked
PORT_TAKEN = re.compile(r"address already in use|errno 98\b|EADDRINUSE", re.IGNORECASE)
# Each launch's own token in the launched command's environment, which `decodecliff serve` reports
# as its server info's launch_id: a server answering on the port with another token is another
# launch's, which holds the port the one launched could not bind.
LAUNCH_ID_ENV = "DECODECLIFF_LAUNCH_ID"


def strict_json(text: str) -> object:
    """Parse JSON as the standard defines it: NaN, Infinity and overflowing numbers are errors
    (Python's json accepts them, and they would end up in result files that cannot hold them).
    JSON nested deeper than the parser recurses is an error of the text too, a ValueError like
    the rest: the server's malformed answer, not a fault of the sweep."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def free_port(host: str) -> int:
    """A TCP port that is free on ``host`` (a name or an IPv4 or IPv6 address) right now."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.bind(address)
        return int(s.getsockname()[1])


def http_url(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def render_command(template: str, host: str, port: int | str) -> tuple[dict[str, str], list[str]]:
    """(leading VAR=value assignments, argv) of the template with {host} and {port} filled in."""
    try:
        text = template.format(host=host, port=port)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"bad server command template {template!r}: only {{host}} and {{port}} are "
            f"placeholders (write {{{{ and }}}} for literal braces): {exc}"
        ) from exc
    words = shlex.split(text)
    env: dict[str, str] = {}
    while words and _ENV_ASSIGNMENT.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words:
        raise ValueError(f"server command template {template!r} names no program")
    return env, words


def auth() -> dict[str, str]:
    """The headers of every request to the server: the key of the variable API_KEY_ENV names,
    as a server started in the same environment requires it (and as an OpenAI client sends its
    key)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def healthy(url: str, timeout: float = 5.0) -> bool:
    """GET /health answers 200 within ``timeout``."""
    return health_problem(url, timeout) is None


def health_problem(url: str, timeout: float = 5.0) -> str | None:
    """Why GET /health does not answer 200 within ``timeout`` (the error or the status), or None."""
    try:
        status = httpx.get(url.rstrip("/") + "/health", timeout=timeout).status_code
    except httpx.HTTPError as exc:
        return f"GET /health: {type(exc).__name__}: {exc}"
    return None if status == 200 else f"GET /health answered {status}"


def server_info(url: str, timeout: float = INFO_S) -> dict:
    """The server's self-description (/get_server_info, or /server_info on newer SGLang), asked
    for within ``timeout`` s in all; {} where neither answers in time."""
    deadline = time.monotonic() + timeout
    for path in ("/get_server_info", "/server_info"):
        if (left := deadline - time.monotonic()) <= 0:
            break
        try:
            resp = httpx.get(url.rstrip("/") + path, timeout=left, headers=auth())
        except httpx.HTTPError:
            continue
        if resp.status_code == 200:
            try:
                info = strict_json(resp.text)
            except ValueError as exc:
                reason = f"{path}: {exc}"
                return {INVALID: reason, "raw": resp.text[:2000]}
            return info if isinstance(info, dict) else {"raw": info}
    return {}


def info_field(info: dict, key: str) -> object:
    """A field of the server info, also looked up in SGLang's per-rank ``internal_states``."""
    if info.get(key) is not None:
        return info[key]
    for state in info.get("internal_states") or []:
        if isinstance(state, dict) and state.get(key) is not None:
            return state[key]
    return None


def flush_cache(url: str, timeout: float = 30.0) -> bool:
    """Ask the server to drop its prefix cache; False when it cannot."""
    try:
        resp = httpx.post(url.rstrip("/") + "/flush_cache", timeout=timeout, headers=auth())
        return resp.status_code == 200
    except httpx.HTTPError:
        return False


class Server:
    """A server process launched from a template, or an already running one at ``url``.

    A template with ``{port}`` gets a free port on every launch; without it, ``url`` says where
    the launched server listens.
    """

    def __init__(
        self,
        template: str | None = None,
        url: str | None = None,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        stop_grace_s: float = 10.0,
        log_cap: int = 0,
    ) -> None:
        if template is None and url is None:
            raise ValueError("give a server command template or a URL")
        if template is not None and "{port}" not in template and url is None:
            raise ValueError("a server command template without {port} needs the server's URL")
        self.template, self.host, self.log_path = template, host, log_path
        self.stop_grace_s = stop_grace_s
        self.log_cap = log_cap  # bytes the log may hold (0: no cap)
        self.log_start = 0  # where the last launch's part of the log begins
        self.url = url.rstrip("/") if url else None
        self.proc: subprocess.Popen | None = None  # the keeper (watchdog.py)
        self.server_pid: int | None = None  # the command it runs
        self.lifeline: int | None = None  # the pipe end whose closing stops the keeper
        self.command: list[str] | None = None
        self.launches = 0
        self.launch_id: str | None = None  # the last launch's (LAUNCH_ID_ENV)

    @property
    def launched(self) -> bool:
        return self.template is not None

    @property
    def pid(self) -> int | None:
        """The launched command's process (the keeper's child)."""
        return self.server_pid if self.proc else None

    def exit_code(self) -> int | None:
        """The launched command's exit code (as its keeper passes it on), None while it runs (or
        for a URL server)."""
        return self.proc.poll() if self.proc else None

    def start(self, timeout_s: float, info_deadline: float | None = None) -> dict:
        """Launch (if a template) and wait until healthy; return its server info, asked for
        within INFO_S s, and not past ``info_deadline`` (a time.monotonic()) where given: {}
        where no time is left for it.

        A port picked free can be taken by another process before the server binds it; a
        server that exits saying so (in its log) is launched again on a fresh port, within what
        is left of ``timeout_s``: a server binds its port once loaded (SGLang does), so a whole
        timeout for each launch would let one start take several.
        """
        deadline = time.monotonic() + timeout_s
        if not self.launched:
            return self._wait_healthy(deadline, timeout_s, info_deadline)
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start_once(deadline, timeout_s, info_deadline)
            except ServerError as exc:
                if not isinstance(exc, PortTaken) and not self._lost_its_port():
                    raise
                if time.monotonic() >= deadline:
                    raise ServerError(
                        f"server not healthy within the start timeout ({timeout_s:g} s); "
                        f"last: {exc}"
                    ) from None
        return self._start_once(deadline, timeout_s, info_deadline)

    def _last_words(self, limit: int = 300) -> str:
        """The last line the last launch wrote to its log (its error, as a rule), shortened."""
        if self.log_path is None or not self._log_is_file():  # a FIFO's read would wait
            return ""
        try:
            text = self.log_path.read_bytes()[-8192:].decode(errors="replace")
        except OSError:
            return ""
        launch = text.rsplit("\n==== launch ", 1)[-1].splitlines()[1:]  # past the header line
        lines = [line.strip() for line in launch if line.strip()]
        last = lines[-1] if lines else ""
        return last if len(last) <= limit else last[: limit - 1] + "…"

    def _log_is_file(self) -> bool:
        """The log is a regular file (or none yet): one that can be read back, cut and moved."""
        return self.log_path is not None and (self.log_path.is_file() or not self.log_path.exists())

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def _lost_its_port(self) -> bool:
        """The last launch took a fresh port and its log says it was taken."""
        if not self._log_is_file() or "{port}" not in self.template or self.exit_code() is None:
            return False
        with open(self.log_path, "rb") as log:
            log.seek(self.log_start)
            return PORT_TAKEN.search(log.read().decode(errors="replace")) is not None

    def _start_once(self, deadline: float, timeout_s: float, info_deadline: float | None) -> dict:
        self.stop()
        port = free_port(self.host) if "{port}" in self.template else 0
        env, argv = render_command(self.template, self.host, port)
        self.url = http_url(self.host, port) if port else self.url
        self.command = argv
        self.launches += 1
        self.launch_id = f"{os.getpid()}-{time.monotonic_ns()}"
        log = self._open_log()
        try:
            self._launch(argv, {**env, LAUNCH_ID_ENV: self.launch_id}, log)
        finally:
            log.close()
        return self._wait_healthy(deadline, timeout_s, info_deadline)

    def _launch(self, argv: list[str], env: dict[str, str], log: BinaryIO) -> None:
        """Start the keeper running ``argv``; learn the command's pid from it."""
        lifeline_r, self.lifeline = os.pipe()  # neither end is inherited by other children
        report_r, report_w = os.pipe()
        # what this launch may write: the cap less what the log holds (about half of it at most)
        cap = max(self.log_cap - self._log_size(), 1) if self.log_cap and self._log_is_file() else 0
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(WATCHDOG), str(self.stop_grace_s), str(report_w)]
                + [str(cap), "--", *argv],
                stdin=lifeline_r,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
                pass_fds=(report_w,),
            )
        except BaseException as exc:  # no keeper (no Python there, a bad argument, a signal):
            # the sweep's ends of its pipes are closed too, none is left open
            os.close(report_r)
            os.close(self.lifeline)
            self.lifeline = None
            if isinstance(exc, OSError):
                raise ServerError(f"cannot launch the server's keeper: {exc}") from exc
            raise
        finally:
            os.close(lifeline_r)
            os.close(report_w)
        with open(report_r, "rb") as report:
            answer = _read_report(report)
        if not answer.isdigit():
            self.stop()
            reason = answer.removeprefix("error: ") or "its keeper gave no answer"
            raise ServerError(f"cannot launch {argv[0]!r}: {reason}")
        self.server_pid = int(answer)

    def _open_log(self):
        """The log, open to append this launch to (and to read: the keeper cuts it)."""
        if self.log_path is None:
            return open(os.devnull, "wb")  # noqa: SIM115 (closed by start)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        mode = "a+b"  # read too: the keeper cuts it
        if not self._log_is_file():  # a FIFO, a terminal: written through, never cut or read
            mode = "ab"
        elif self.log_cap and self._log_size() > self.log_cap // 2:
            self.log_path.replace(f"{self.log_path}.1")
        self.log_start = self._log_size()
        log = open(self.log_path, mode)  # noqa: SIM115 (closed by start)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        log.write(f"\n==== launch {self.launches} at {stamp}: {self.command}\n".encode())
        log.flush()
        return log

    def _wait_healthy(
        self, deadline: float, timeout_s: float, info_deadline: float | None = None
    ) -> dict:
        """The server info once healthy before ``deadline`` (of the start's ``timeout_s``), asked
        for until ``info_deadline`` at most (``start``)."""
        problem = "not asked"
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                said = self._last_words()
                raise ServerError(
                    f"server exited with code {code} while starting"
                    + (f": {said}" if said else "")
                    + (f" (log: {self.log_path})" if self.log_path else "")
                )
            problem = health_problem(self.url, min(5.0, max(0.5, deadline - time.monotonic())))
            if problem is None:
                wait = INFO_S
                if info_deadline is not None:
                    wait = min(wait, info_deadline - time.monotonic())  # <= 0: not asked
                return self._own_info(server_info(self.url, wait))
            time.sleep(0.25)
        self.stop()
        raise ServerError(
            f"server not healthy within the start timeout ({timeout_s:g} s); last: {problem}"
        )

    def _own_info(self, info: dict) -> dict:
        """``info``, unless another launch's server answered on the port (PortTaken): one that
        reports a launch_id other than this launch's. A server that reports none (another
        program, or one started by hand) cannot be told apart and is taken as launched."""
        other = info.get("launch_id")
        if self.proc is None or other is None or other == self.launch_id:
            return info
        self.stop()
        raise PortTaken(f"{self.url} answers for another launch ({other}), which holds its port")

    def stop(self) -> None:
        """Stop a launched server's whole process tree; a no-op for a URL server."""
        proc, self.proc = self.proc, None
        lifeline, self.lifeline = self.lifeline, None
        if lifeline is not None:
            os.close(lifeline)  # the keeper reads end-of-file: stop
        if proc is None:
            return
        for sig in (signal.SIGCONT, signal.SIGTERM):  # the keeper passes them on to the tree
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout=self.stop_grace_s + 10)  # the keeper's own SIGKILL comes at grace
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)  # a keeper that hung: its process group at least
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if _group_alive(proc.pid):  # a keeper killed outright left the server in its group
            _killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace_s
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _killpg(proc.pid, signal.SIGKILL)


def _read_report(report: BinaryIO) -> str:
    """What the keeper reports before it closes the pipe (at most REPORT_TIMEOUT_S)."""
    data = b""
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0 and select.select([report], [], [], left)[0]:
        chunk = os.read(report.fileno(), 512)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
