"""A closed terminal stops a Snakemake run as Ctrl-C does (installed by the Snakefile)."""

from __future__ import annotations

import signal
import threading


def hangup_as_interrupt() -> bool:
    """Make SIGHUP raise KeyboardInterrupt in this process, Snakemake's main one.

    Left alone, SIGHUP kills Snakemake holding its locks, so the same command then refuses to
    run; as an interrupt, Snakemake waits for its running jobs and releases the locks, and the
    same command resumes. (A closed terminal's SIGHUP reaches the jobs too, in the same process
    group: each sweep writes its point as interrupted and stops its server.) A SIGHUP already
    ignored (``nohup``) or handled is kept; off the main thread nothing can be installed.
    Returns whether the handler was installed.
    """
    hup = getattr(signal, "SIGHUP", None)  # none on Windows
    if hup is None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(hup) is not signal.SIG_DFL:
        return False
    signal.signal(hup, signal.default_int_handler)
    return True
