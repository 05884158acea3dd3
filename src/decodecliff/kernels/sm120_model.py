"""sm_120's per-SM resources on a bigger GPU: the kernels as an RTX PRO 6000 would configure them.

The study's GPU is an H200 (sm_90): 228 KB of shared memory per SM where sm_120 has 100 KB. Both
the custom kernel and FlashInfer's MLA kernel use the difference (two custom v4 CTAs per SM;
FlashInfer two stages of 64-token tiles instead of one stage of 16), so their H200 times are not
what an sm_120 GPU runs. This module runs each as it would configure itself on sm_120, same code:

* the custom kernel from a library built with ``DCMLA_SM120_MODEL`` (``build``): sm_120's register
  budget, occupancy and split count planned for 100 KB per SM, and the SM's carveout set to it;
* FlashInfer with the shared-memory shim preloaded (``LD_PRELOAD``, csrc/smem_per_sm_shim.c):
  while ``smem_per_sm(SMEM_PER_SM)`` holds, its dispatch reads 100 KB per SM and picks the
  configuration it takes on sm_120 (the unmodified kernel of that configuration runs).

What stays the H200's: its SM count, clocks, L2 and memory bandwidth, and mma.sync's rate.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from . import build as kernel_build

SMEM_PER_SM = 102_400  # sm_120: 100 KB of shared memory per SM (99 KB per block)
LIB_NAME = "libdecodecliff_mla_sm120model.so"
SHIM_NAME = "libdecodecliff_smem_shim.so"
SHIM_SOURCE = kernel_build.CSRC / "smem_per_sm_shim.c"
DEFINE = "DCMLA_SM120_MODEL"
REEXEC_ENV = "DECODECLIFF_SHIM_PRELOADED"  # set on the re-executed process: never loop
PRELOAD_HINT = (
    "run the process with LD_PRELOAD=<build dir>/" + SHIM_NAME + " (built by "
    "`decodecliff build-kernel --sm120-model 90`)"
)


def build(arch: int, out_dir: Path) -> dict:
    """The sm_120-model kernel library for ``arch`` (the GPU it runs on) and the shim."""
    info = kernel_build.build([arch], out_dir, [arch], LIB_NAME, (DEFINE,))
    info["shim"] = str(build_shim(out_dir))
    return info


def build_shim(out_dir: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise kernel_build.BuildError("no C compiler (cc) found to build the shared-memory shim")
    out = out_dir / SHIM_NAME
    cmd = [compiler, "-O2", "-shared", "-fPIC", "-o", str(out), str(SHIM_SOURCE), "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise kernel_build.BuildError(f"shim build failed: {proc.stderr[-2000:]}")
    return out


def library_path(build_dir: str | Path | None = None) -> Path:
    """The sm_120-model library: in ``build_dir``, else beside the custom kernel's library."""
    from .custom import library_path as custom_library

    folder = Path(build_dir) if build_dir else custom_library().parent
    path = folder / LIB_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"sm_120-model kernel library not found at {path}: build it with "
            "`decodecliff build-kernel --sm120-model 90`"
        )
    return path


def shim_missing() -> str | None:
    """Why the shared-memory shim cannot act in this process, or None if it is preloaded."""
    if getattr(ctypes.CDLL(None), "dc_set_smem_per_sm", None) is None:
        return f"the sm_120 model of a peer needs the shared-memory shim: {PRELOAD_HINT}"
    return None


def wanted(specs: list[str]) -> bool:
    """Whether backend specs ("flashinfer:model=sm120") ask for FlashInfer's sm_120 model."""
    from .registry import parse_spec

    return any(
        name == "flashinfer" and options.get("model") == "sm120"
        for name, options in map(parse_spec, specs)
    )


def preload_shim(command: list[str]) -> None:
    """Run this process's decodecliff ``command`` again with the shim preloaded, unless it is.

    FlashInfer binds the CUDA runtime when its module loads, so the shim must be in the process
    from its start (LD_PRELOAD). Without a built shim beside the kernel library nothing happens:
    the sm_120 model of FlashInfer then records why it cannot run."""
    if shim_missing() is None:
        return
    if os.environ.get(REEXEC_ENV):
        raise RuntimeError(f"{SHIM_NAME} was preloaded but does not act in this process")
    try:
        shim = library_path().parent / SHIM_NAME
    except FileNotFoundError:
        return
    if not shim.is_file():
        return
    env = dict(os.environ, **{REEXEC_ENV: "1"})
    env["LD_PRELOAD"] = " ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD")]))
    print(f"decodecliff: running again with LD_PRELOAD={shim} (the sm_120 model)", file=sys.stderr)
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "decodecliff.cli", *command], env)


@contextlib.contextmanager
def smem_per_sm(limit: int = SMEM_PER_SM) -> Iterator[None]:
    """Within the block, the preloaded shim reports at most ``limit`` B of shared memory per SM."""
    if (reason := shim_missing()) is not None:
        raise RuntimeError(reason)
    process = ctypes.CDLL(None)
    previous = process.dc_smem_per_sm_limit()
    process.dc_set_smem_per_sm(limit)
    try:
        yield
    finally:
        process.dc_set_smem_per_sm(previous)
