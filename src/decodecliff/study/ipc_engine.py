"""papermill's engine ``ipc``: nbclient with the kernel on Unix sockets instead of TCP ports.

A TCP kernel's ports are picked by its manager (bind to port 0, close) and bound later by the
kernel; another process starting at the same moment (Snakemake runs notebooks side by side, and
the test suite runs studies side by side) can take a port in between, and the kernel dies with
"Address already in use" while papermill waits out its start timeout. Unix sockets are files
named after the kernel, so no two kernels can ask for the same one. Registered under
``papermill.engine`` in pyproject.toml: ``papermill --engine ipc``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from jupyter_client.manager import KernelManager
from papermill.engines import NBClientEngine
from traitlets import default


class IpcKernelManager(KernelManager):
    """A kernel manager whose kernel listens on Unix sockets under the temp directory."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        # A short path: a Unix socket's name is limited to ~107 bytes, and jupyter's runtime
        # directory (the default's root) sits under $HOME, whose depth nobody controls.
        return os.path.join(tempfile.gettempdir(), f"kernel-{uuid.uuid4().hex[:16]}-ipc")


class IpcEngine(NBClientEngine):
    """papermill's nbclient engine with the kernel on Unix sockets."""

    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("kernel_manager_class", IpcKernelManager)
        return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)
