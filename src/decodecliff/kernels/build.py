"""`decodecliff build-kernel`: compile the custom MLA kernel into one fat shared library.

nvcc builds SASS for every requested architecture plus PTX for the highest one, and the step then
checks what it built: the SASS targets in the binary (``cuobjdump --list-elf``), and per kernel the
registers, spills and shared memory from ``ptxas -v`` plus the dynamic shared memory the library
reports. ``build.json`` beside the library records all of it.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .. import envinfo
from ..jsonio import not_a_folder
from . import abi, sass

CSRC = Path(__file__).parent / "csrc"
SOURCE = CSRC / "mla_verify.cu"
# Every file a build compiles (the library, its header, the sm_120 model's shim): the pipeline's
# build_kernel rule takes them as inputs, so an edit rebuilds the library instead of reusing it.
SOURCES = (SOURCE, CSRC / "mla_ptx.cuh", CSRC / "smem_per_sm_shim.c")
LIB_NAME = "libdecodecliff_mla.so"
DEFAULT_OUT = Path("build/kernels")
DEFAULT_ARCHS = (120, 90, 80)
REQUIRED_ARCHS = (120, 90)
CUDA_ROOTS = ("/usr/local/cuda",)  # searched after PATH, $CUDA_HOME and $CUDA_PATH
SMEM_LIMIT = 101_376  # sm_120: 99 KB of shared memory per block


class BuildError(RuntimeError):
    pass


def find_nvcc() -> str:
    candidates = [shutil.which("nvcc")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *CUDA_ROOTS):
        if root:
            candidates.append(str(Path(root) / "bin" / "nvcc"))
    for path in candidates:
        if path and Path(path).is_file():
            return path
    raise BuildError(
        "nvcc not found: install the CUDA toolkit or put nvcc on PATH (or set CUDA_HOME)"
    )


def find_tool(name: str) -> str | None:
    """A CUDA binary tool from PATH, an NVIDIA wheel (nvidia-cuda-cuobjdump, -nvdisasm), or
    Triton's wheel (in that order)."""
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(root).glob(f"*/bin/{name}")):
            return str(path)
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / name
        if path.is_file():
            return str(path)
    return None


def nvcc_command(
    nvcc: str,
    archs: list[int],
    lib: Path,
    defines: tuple[str, ...] = (),
    source: Path = SOURCE,
) -> list[str]:
    """nvcc's command for a fat shared library of ``source`` (the MLA kernel, or another of
    csrc/: the persistent MLP kernel's bench builds it the same way)."""
    cmd = [nvcc, "-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    cmd += [f"-D{name}" for name in defines]
    cmd += ["--threads", "0"]  # one ptxas per architecture in parallel
    for arch in sorted(set(archs)):
        cmd += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    top = max(archs)
    cmd += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    return cmd + ["-I", str(CSRC), "-o", str(lib), str(source)]


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[dict]:
    """One record per (kernel, arch) from ``ptxas -v`` output."""
    kernels: list[dict] = []
    current: dict | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = {
                "kernel": m.group(1),
                "arch": int(m.group(2)),
                "registers": None,
                "stack_bytes": 0,
                "spill_stores": 0,
                "spill_loads": 0,
                "static_smem": 0,
            }
            kernels.append(current)
        elif current is None:
            continue
        elif m := _SPILL.search(line):
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(
                int, m.groups()
            )
        elif m := _USED.search(line):
            current["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                current["static_smem"] = int(s.group(1))
    return kernels


_ATTN = re.compile(r"mla_attn_kernelILi(\d+)ELi(\d+)E")  # template <int MT, int V>


def attn_params(kernel: str) -> tuple[int, int] | None:
    """(m-tiles, variant) of an attention kernel from its mangled name; None for other kernels."""
    m = _ATTN.search(kernel)
    return (int(m.group(1)), int(m.group(2))) if m else None


def dynamic_smem(handle: ctypes.CDLL, kernel: str) -> int:
    """Dynamic shared memory a kernel launches with, as the library itself reports it."""
    params = attn_params(kernel)
    if params is None:
        return 0
    nbytes = int(handle.dcmla_smem_bytes(params[1], params[0]))
    if nbytes < 0:
        raise BuildError(f"the library does not know kernel {kernel}")
    return nbytes


def sass_archs(cuobjdump: str | None, lib: Path) -> list[int] | None:
    if cuobjdump is None:
        return None
    out = subprocess.run([cuobjdump, "--list-elf", str(lib)], capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildError(f"cuobjdump --list-elf failed: {out.stderr.strip()}")
    return sorted({int(a) for a in re.findall(r"\.sm_(\d+)\.cubin", out.stdout)})


def record_main_loops(
    kernels: list[dict], cuobjdump: str | None, lib: Path, archs: Iterable[int]
) -> str:
    """Each kernel's main loop from the SASS (kernels/sass.py) into its record; informative, so
    a machine without the tools builds all the same and says why the loops are missing."""
    nvdisasm = find_tool("nvdisasm")  # cuobjdump -sass disassembles through it
    if cuobjdump is None or nvdisasm is None:
        return "not read: cuobjdump or nvdisasm not found"
    try:
        for arch in archs:
            loops = sass.functions(sass.dump(cuobjdump, lib, arch, nvdisasm))
            for k in (k for k in kernels if k["arch"] == arch):
                k["main_loop"] = sass.main_loop(loops.get(k["kernel"], []))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
        return f"not read: {exc}"
    return f"read with {cuobjdump} through {nvdisasm}"


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def build(
    archs: list[int],
    out_dir: Path,
    required: list[int],
    lib_name: str = LIB_NAME,
    defines: tuple[str, ...] = (),
) -> dict:
    """Compile, inspect and write ``build.json``; raises BuildError when a check fails.

    The library, its record and its ptxas log are made in a staging folder beside ``out_dir``'s
    files and moved in only when every check passes, so a failed build leaves the last good one
    whole (its own files stay in ``out_dir/failed-<record>/`` to read). ``lib_name`` and
    ``defines`` build another flavour of the same source beside it (the sm_120-model library of
    kernels/sm120_model.py), whose record is ``<lib stem>.json``."""
    nvcc = find_nvcc()
    out_dir.mkdir(parents=True, exist_ok=True)
    record = "build" if lib_name == LIB_NAME else Path(lib_name).stem
    record_file = f"{record}.json"
    log_file = "ptxas.log" if record == "build" else f"{record}.ptxas.log"
    stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    try:
        info = _build_in(nvcc, archs, stage, required, lib_name, defines, record_file, log_file)
    except BuildError as exc:
        failed = out_dir / f"failed-{record}"
        shutil.rmtree(failed, ignore_errors=True)
        stage.rename(failed)
        raise BuildError(
            f"{exc} (this build's files: {failed}; {out_dir}'s are untouched)"
        ) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    # the old record goes first and the new one is written last, whole: a build stopped in the
    # swap leaves no record rather than one of another library
    (out_dir / record_file).unlink(missing_ok=True)
    for name in (lib_name, log_file):
        os.replace(stage / name, out_dir / name)
    info["library"] = str((out_dir / lib_name).resolve())
    info["command"] = [a.replace(str(stage), str(out_dir)) for a in info["command"]]
    (stage / record_file).write_text(json.dumps(info, indent=2) + "\n")
    os.replace(stage / record_file, out_dir / record_file)
    shutil.rmtree(stage, ignore_errors=True)
    return info


def _build_in(
    nvcc: str,
    archs: list[int],
    out_dir: Path,
    required: list[int],
    lib_name: str,
    defines: tuple[str, ...],
    record_file: str,
    log_file: str,
) -> dict:
    lib = out_dir / lib_name
    cmd = nvcc_command(nvcc, archs, lib, defines)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out_dir / log_file).write_text(log)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed (exit {proc.returncode}):\n{log[-4000:]}")
    kernels = parse_ptxas(log)
    handle = abi.bind(ctypes.CDLL(str(lib.resolve())))  # host-only queries: need no GPU
    for k in kernels:
        params = attn_params(k["kernel"])
        if params is not None:
            k["mtiles"], k["variant"] = params[0], f"v{params[1]}"
        k["dynamic_smem"] = dynamic_smem(handle, k["kernel"])
        k["smem_total"] = k["static_smem"] + k["dynamic_smem"]
        k["smem_ok"] = k["smem_total"] <= SMEM_LIMIT
        k["spill_ok"] = k["spill_stores"] == 0 and k["spill_loads"] == 0
    cuobjdump = find_tool("cuobjdump")
    found = sass_archs(cuobjdump, lib)
    missing = sorted(set(required) - set(found or []))
    sass_note = record_main_loops(kernels, cuobjdump, lib, found or [])
    info = {
        "library": str(lib.resolve()),
        "nvcc": nvcc,
        "nvcc_version": nvcc_version(nvcc),
        "command": cmd,
        "archs_requested": sorted(set(archs)),
        "ptx_arch": max(archs),
        "cuobjdump": cuobjdump,
        "sass_archs": found,
        "main_loops": sass_note,
        "kernels": kernels,
        "smem_limit": SMEM_LIMIT,
        "env": envinfo.collect(),  # the report's setup table names the build's commit and host
        "ok": {
            "sass": found is not None and not missing,
            "smem": all(k["smem_ok"] for k in kernels),
            "spills": all(k["spill_ok"] for k in kernels),
        },
    }
    problems = []
    if found is None:
        problems.append("cuobjdump not found (install nvidia-cuda-cuobjdump): cannot check SASS")
    elif missing:
        problems.append(f"SASS missing for sm_{missing} (found {found})")
    problems += [
        f"{k['kernel']} on sm_{k['arch']}: {k['smem_total']} B shared memory > {SMEM_LIMIT} B"
        for k in kernels
        if not k["smem_ok"]
    ]
    if not kernels:
        problems.append("no kernel found in the ptxas -v output")
    if problems:  # the failed build's record, kept with its files for reading
        (out_dir / record_file).write_text(json.dumps(info, indent=2) + "\n")
        raise BuildError("; ".join(problems))
    return info


def summary(info: dict) -> str:
    lines = [f"built {info['library']} (nvcc {info['nvcc_version']}, SASS {info['sass_archs']})"]
    for k in info["kernels"]:
        name = k["kernel"]
        if "variant" in k:
            name = f"mla_attn_kernel {k['variant']} {16 * k['mtiles']} rows"
        loop = k.get("main_loop")
        per_tile = f"  loop {loop['instructions']:>4} SASS, {loop['hmma']:>3} HMMA" if loop else ""
        lines.append(
            f"  sm_{k['arch']:<4} {name[:48]:<48} regs {k['registers']:>3}  "
            f"smem {k['smem_total']:>6} B  spills {k['spill_stores'] + k['spill_loads']}{per_tile}"
        )
    return "\n".join(lines)


def _words(values) -> str:
    return " ".join(map(str, values))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="decodecliff build-kernel",
        description="Compile the custom MLA kernel into one fat shared library and check it: the "
        "SASS targets in the binary, and per kernel the registers, spills and shared memory "
        "(recorded in build.json beside the library).",
    )
    p.add_argument(
        "--arch",
        type=int,
        nargs="+",
        default=list(DEFAULT_ARCHS),
        help=f"SM architectures to build SASS for (default: {_words(DEFAULT_ARCHS)})",
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    p.add_argument(
        "--require",
        type=int,
        nargs="*",
        default=None,
        help="SASS that must be present, among --arch (default: those of "
        f"{_words(REQUIRED_ARCHS)} that --arch names)",
    )
    p.add_argument(
        "--sm120-model",
        type=int,
        metavar="ARCH",
        help="also build, for this GPU's architecture (90 on an H200; one of --arch), the "
        "library that runs with sm_120's per-SM resources and the shared-memory shim a peer is "
        "preloaded with (kernels/sm120_model.py); needs nvcc and a C compiler (default: not "
        "built)",
    )
    return p


MIN_ARCH = 80  # the kernel's mma.sync, ldmatrix and cp.async


def cli(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.require is None:
        args.require = [a for a in REQUIRED_ARCHS if a in args.arch]
    low = [
        a for a in [*args.arch, *args.require, args.sm120_model] if a is not None and a < MIN_ARCH
    ]
    if low:
        p.error(f"architecture {low[0]}: the kernel needs sm_{MIN_ARCH} or newer")
    if unbuilt := sorted(set(args.require) - set(args.arch)):
        p.error(f"--require {_words(unbuilt)}: not among --arch {_words(args.arch)}")
    if args.sm120_model is not None and args.sm120_model not in args.arch:
        p.error(f"--sm120-model {args.sm120_model}: not among --arch {_words(args.arch)}")
    if why := not_a_folder(args.out):
        p.error(f"--out {args.out}: {why}")
    try:
        info = build(args.arch, args.out, args.require)
        if args.sm120_model is not None:
            from . import sm120_model

            model = sm120_model.build(args.sm120_model, args.out)
    except BuildError as exc:
        print(f"build-kernel: error: {exc}", file=sys.stderr)
        return 1
    print(summary(info))
    if args.sm120_model is not None:
        print(summary(model))
    if not info["ok"]["spills"]:
        print("build-kernel: warning: register spills (see build.json)", file=sys.stderr)
    return 0
