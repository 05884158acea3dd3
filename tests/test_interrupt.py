"""SIGHUP as an interrupt in Snakemake's process, and never over nohup's ignore."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import os, signal, sys
from decodecliff.study.interrupt import hangup_as_interrupt
# each mode sets the disposition it names: a suite run under nohup would pass its ignore on
signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[1] == "nohup" else signal.SIG_DFL)
print(hangup_as_interrupt(), flush=True)
try:
    os.kill(os.getpid(), signal.SIGHUP)
    signal.pause() if sys.argv[1] != "nohup" else None
    print("survived")
except KeyboardInterrupt:
    print("interrupted")
"""


def probe(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_hangup_unwinds_as_ctrl_c() -> None:
    assert probe("default") == ["True", "interrupted"]


def test_nohup_keeps_ignoring_hangup() -> None:
    assert probe("nohup") == ["False", "survived"]
