"""One way to write a JSON result: atomically, so a reader (a notebook, a resumed run, a rule that
checks for the file) sees the old file or the new one, never half of one. Torch-free."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json(
    path: str | os.PathLike,
    doc: Any,
    *,
    allow_nan: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """Write ``doc`` (indent 1, a final newline) to a temporary file in the target's folder, flush
    it to disk, then rename it over ``path``. ``allow_nan=False`` refuses NaN/inf (strict JSON);
    ``default`` as in ``json.dump`` (``str`` writes paths and devices as text)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")  # unique per writer
    try:
        with open(tmp, "x") as f:  # the umask's permissions, unlike mkstemp's 0600
            json.dump(doc, f, indent=1, allow_nan=allow_nan, default=default)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why ``write_json`` could not write ``path`` (a folder there, a folder that cannot be made
    or written above it), or None; makes that folder. Asked before a run measures anything it
    would then lose."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make its folder: {exc}"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"{path.parent} is not writable"
    return None


def not_a_folder(path: str | os.PathLike) -> str | None:
    """Why ``path`` could not be an output folder (it, or the first of its parents that exists, is
    a file), or None. Asked before a run that would write there does any work."""
    path = Path(path)
    held = next(q for q in (path, *path.absolute().parents) if q.exists())
    return None if held.is_dir() else f"{held} is a file, not a folder"
