"""Each kernel's main loop as its SASS has it: the static instruction mix a build records.

Static means what ptxas emitted, read with cuobjdump on any machine, not what a GPU ran: an
iteration's instructions counted once each, both sides of a branch included. It is the
instruction budget notes/kernel.md reasons with (issue slots per tile, the share that is HMMA)
made a build output instead of a hand count. The main loop is the longest backward branch's
span (the KV-tile loop in the attention kernels).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)")
# opcode families the notes count, by the opcode before its first '.'
CLASSES = {
    "hmma": {"HMMA"},
    "shared": {"LDS", "LDSM", "STS"},
    "global": {"LDG", "STG", "LDGSTS"},
    "local": {"LDL", "STL"},
    "barrier": {"BAR"},  # the CTA's barriers
    "wait": {"DEPBAR", "LDGDEPBAR"},  # waits on asynchronous copies
    "reconverge": {"BSSY", "BSYNC", "WARPSYNC"},  # a warp's divergent paths joined
}
TIMEOUT_S = 300


def dump(cuobjdump: str, lib: Path, arch: int, nvdisasm: str) -> str:
    """cuobjdump's SASS of every function of ``lib`` for sm_``arch`` (through ``nvdisasm``:
    NVDISASM_PATH wins over the one beside cuobjdump, so the record names the one used)."""
    out = subprocess.run(
        [cuobjdump, "-sass", "-arch", f"sm_{arch}", str(lib)],
        capture_output=True, text=True, timeout=TIMEOUT_S,
        env={**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)},
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed: {out.stderr.strip()}")
    return out.stdout


def functions(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """Function name -> its instructions as (address, opcode, operands)."""
    found: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            current = found.setdefault(m.group(1), [])
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return found


def main_loop(instructions: list[tuple[int, str, str]]) -> dict | None:
    """The longest backward branch's body: its instruction count and mix (None: no loop; a
    function's closing branch to itself is not one). Of several loops the longest is taken,
    which in the attention kernels is the KV-tile loop; in others it may differ by arch."""
    spans = [
        (int(t.group(1), 16), addr)
        for addr, op, operands in instructions
        if op == "BRA" and (t := _TARGET.search(operands)) and int(t.group(1), 16) < addr
    ]
    if not spans:
        return None
    start, end = max(spans, key=lambda s: s[1] - s[0])
    body = [op.split(".")[0] for addr, op, _ in instructions if start <= addr <= end]
    mix = {name: sum(op in ops for op in body) for name, ops in CLASSES.items()}
    return {"instructions": len(body), **mix, "hmma_share": mix["hmma"] / len(body)}
