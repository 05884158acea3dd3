"""papermill's engine ipc runs a notebook's kernel on Unix sockets (no TCP port to collide)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat


def test_papermill_ipc_engine_runs_the_kernel_on_unix_sockets(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "import json\nfrom ipykernel import get_connection_info\n"
            "info = get_connection_info(unpack=True)\n"
            "print(json.dumps({'transport': info['transport'], 'ip': info['ip']}))"
        )
    ]
    source, executed = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(notebook, source)
    run = subprocess.run(
        [sys.executable, "-m", "papermill", "--engine", "ipc", "-k", "python3", source, executed],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    printed = nbformat.read(executed, as_version=4).cells[0].outputs[0]["text"]
    info = json.loads(printed)
    assert info["transport"] == "ipc"
    assert len(info["ip"]) < 100  # a Unix socket's name has ~107 bytes
    assert not list(Path(info["ip"]).parent.glob(Path(info["ip"]).name + "-*"))  # cleaned up
