"""The custom kernel's C interface (CPU, no build): the extern "C" prototypes of mla_verify.cu
against kernels/abi.py, and where the loader looks for the library."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from decodecliff.kernels import abi, build, custom
from decodecliff.study import paths

ROOT = Path(__file__).resolve().parents[1]


def c_exports() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """name -> (return kind, [(parameter name, kind)]) of each function in the extern "C" block."""
    source = build.SOURCE.read_text()
    block = source[source.index('extern "C" {') : source.index('}  // extern "C"')]
    block = re.sub(r"//[^\n]*", "", block)
    found = {}
    for ret, name, params in re.findall(r"([\w\s*]+?)\s*\b(dcmla_\w+)\(([^)]*)\)\s*\{", block):
        parsed = []
        for param in filter(None, (p.strip() for p in params.split(","))):
            ctype, pname = re.fullmatch(r"(.+?)\s*\b(\w+)", param).groups()
            parsed.append((pname, c_kind(ctype)))
        found[name] = (c_kind(ret.strip()), parsed)
    return found


def c_kind(ctype: str) -> str:
    """ptr, int or float: what a C type passes as (cudaStream_t is a pointer)."""
    if "*" in ctype or ctype == "cudaStream_t":
        return "ptr"
    return {"int": "int", "float": "float"}[ctype.replace("const ", "")]


def py_kind(ctype: type) -> str:
    if ctype in (ctypes.c_int,):
        return "int"
    if ctype in (ctypes.c_float,):
        return "float"
    assert ctype in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(ctype, ctypes._Pointer)
    return "ptr"


def test_c_parser_reads_the_attention_prototype() -> None:
    ret, params = c_exports()["dcmla_mla_attention"]
    assert ret == "int" and len(params) == 23
    assert params[0] == ("q", "ptr") and params[-2:] == [("sm_scale", "float"), ("stream", "ptr")]


def test_python_binds_exactly_the_exported_functions_with_their_c_signatures() -> None:
    exports = c_exports()
    assert set(exports) == set(abi.FUNCTIONS)
    for name, (restype, params) in abi.FUNCTIONS.items():
        py = (py_kind(restype), [(pname, py_kind(ctype)) for pname, ctype in params])
        assert py == exports[name], name


def test_attention_arguments_are_ordered_by_name() -> None:
    names = [name for name, _ in abi.MLA_ATTENTION[:-1]]
    assert abi.mla_attention_args({n: i for i, n in enumerate(reversed(names))}) == tuple(
        range(len(names) - 1, -1, -1)
    )
    with pytest.raises(TypeError, match=r"missing \['variant'\], unknown \['varient'\]"):
        abi.mla_attention_args({n: 0 for n in names if n != "variant"} | {"varient": 1})


def test_build_dirs_follow_the_pipeline() -> None:
    assert Path(paths.KERNEL_LIB) == custom.BUILD_DIRS[0] / build.LIB_NAME
    assert custom.BUILD_DIRS[1] == build.DEFAULT_OUT


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A working directory with no library above it, and no checkout build to fall back on."""
    monkeypatch.delenv(custom.LIB_ENV, raising=False)
    monkeypatch.setattr(custom, "CHECKOUT", tmp_path / "checkout")
    work = tmp_path / "project" / "notebooks"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return tmp_path


def put_library(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / build.LIB_NAME).write_bytes(b"")
    return (folder / build.LIB_NAME).resolve()


def test_loader_finds_the_pipeline_build_above_the_working_directory(elsewhere) -> None:
    manual = put_library(elsewhere / "project" / "build" / "kernels")
    assert custom.library_path() == manual
    pipeline = put_library(elsewhere / "project" / "results" / "build")
    assert custom.library_path() == pipeline  # the pipeline's build first
    nearer = put_library(elsewhere / "project" / "notebooks" / "build" / "kernels")
    assert custom.library_path() == nearer  # the nearest project root first


def test_loader_falls_back_to_the_checkout(elsewhere) -> None:
    lib = put_library(elsewhere / "checkout" / "results" / "build")
    assert custom.library_path() == lib


def test_explicit_library_wins_and_must_exist(elsewhere, monkeypatch) -> None:
    put_library(elsewhere / "project" / "results" / "build")
    env = put_library(elsewhere / "env")
    monkeypatch.setenv(custom.LIB_ENV, str(env))
    assert custom.library_path() == env
    arg = put_library(elsewhere / "arg")
    assert custom.library_path(arg) == arg
    with pytest.raises(FileNotFoundError, match="missing.so"):
        custom.library_path(elsewhere / "missing.so")


def test_missing_library_error_lists_every_place_looked(elsewhere) -> None:
    with pytest.raises(FileNotFoundError) as err:
        custom.library_path()
    message = str(err.value)
    for root in [Path.cwd(), *Path.cwd().parents, elsewhere / "checkout"]:
        for folder in custom.BUILD_DIRS:
            assert str(root / folder / build.LIB_NAME) in message
    assert "decodecliff build-kernel" in message


def test_a_library_of_another_interface_is_refused_by_name() -> None:
    """A library built from older source (no dcmla_abi_version, or another number) would read a
    launch's arguments in the wrong places: binding it is a clear error."""
    with pytest.raises(abi.StaleLibrary, match="has no interface version.*rebuild it"):
        abi.bind(ctypes.CDLL(None))  # this process: no dcmla_* at all
