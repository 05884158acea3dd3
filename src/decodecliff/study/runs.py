"""A GPU study's run folder, filled from the tars its device calls bring back.

    python -m decodecliff.study.runs CALL_TAR [CALL_TAR ...] --into results/runs/h200/05f0426

`scripts/gpu_study_run.sh` packs what the rules wrote into ``study.tar`` after every key (a
call's own tar may hold it one level down, as ``*/study.tar``). The calls of one machine lease
each bring back everything measured so far, and a server's log gathers every launch of that
server on the machine, so a folder is filled by merging, not by copying over:

* a file the folder lacks is added; one it holds with the same bytes is left alone;
* a server log (``sweep/SERVER/server-SERVER.log``) gains the launches it lacks (each begins
  with a ``==== launch`` line, which names its time);
* a file it holds with other bytes (a point measured twice, another build record) stops the
  merge before anything is written: which measurement stands is the publisher's decision;
* the build's logs come from the call that recorded the build (``build/build.json``): a later
  call's rebuild of the same commit, whose record must match, writes logs that differ only in
  temporary names;
* the build's marker files and libraries are not results and are left out.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

BUILD_RECORD = "build/build.json"
POINT = re.compile(r"^sweep/[^/]+/ctx\d+\.json$")  # paths.point_file, under results/
SERVER_LOG = re.compile(r"^sweep/[^/]+/server-[^/]+\.log$")
LEFT_OUT = re.compile(r"(^build/\.built-by-rule-|\.so$)")
LAUNCH = re.compile(r"(?=\n==== launch )")  # the server writes a blank line before each


@dataclass
class Merge:
    """What merging a call's files into a run folder adds, extends and leaves alone."""

    added: dict[str, bytes] = field(default_factory=dict)
    extended: dict[str, bytes] = field(default_factory=dict)  # server logs: the whole new text
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def study_files(tar_path: Path) -> dict[str, bytes]:
    """The files of a call's study.tar (given, or inside a call's tar), by results/ path."""
    with tarfile.open(tar_path) as outer:
        inner = [m for m in outer.getmembers() if m.isfile() and m.name.endswith("study.tar")]
        if not inner:
            return _files(outer)
        if len(inner) > 1:
            raise ValueError(f"{tar_path}: more than one study.tar ({[m.name for m in inner]})")
        data = outer.extractfile(inner[0]).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as study:
        return _files(study)


def _files(tar: tarfile.TarFile) -> dict[str, bytes]:
    out = {}
    for member in tar.getmembers():
        name = member.name.removeprefix("./")
        if member.isfile() and not LEFT_OUT.search(name):
            out[name] = tar.extractfile(member).read()
    return out


def launches(text: str) -> dict[str, str]:
    """A server log's launches by their ``==== launch`` line, each up to the next one."""
    blocks = LAUNCH.split("\n" + text)
    return {b.splitlines()[1]: b for b in blocks if b.startswith("\n==== launch ")}


def merged_log(have: str, new: str) -> str:
    """``have`` with the launches of ``new`` it lacks appended, in their order."""
    known = launches(have)
    extra = [block for header, block in launches(new).items() if header not in known]
    if not extra:
        return have
    sep = "" if not have or have.endswith("\n") else "\n"
    return have + sep + "".join(extra)


def plan_merge(files: dict[str, bytes], run_dir: Path, merge: Merge | None = None) -> Merge:
    """What writing ``files`` into ``run_dir`` would do (nothing is written)."""
    merge = merge or Merge()
    for name, data in sorted(files.items()):
        dest = run_dir / name
        have = merge.added.get(name) or merge.extended.get(name)
        if have is None and dest.is_file():
            have = dest.read_bytes()
        recorded = BUILD_RECORD in merge.added or (run_dir / BUILD_RECORD).is_file()
        if name.startswith("build/") and name != BUILD_RECORD and have is not None and recorded:
            merge.unchanged.append(name)  # the recorded build's own log stands
        elif have is None:
            merge.added[name] = data
        elif have == data:
            merge.unchanged.append(name)
        elif SERVER_LOG.match(name):
            text = merged_log(have.decode(), data.decode()).encode()
            if text == have:
                merge.unchanged.append(name)
            else:
                target = merge.added if name in merge.added else merge.extended
                target[name] = text
        else:
            merge.conflicts.append(name)
    return merge


def merge_calls(tars: list[Path], run_dir: Path) -> Merge:
    """Merge the calls' files into ``run_dir`` in the given order; on a conflict write nothing."""
    merge = Merge()
    for tar in tars:
        plan_merge(study_files(tar), run_dir, merge)
    if merge.conflicts:
        names = sorted(set(merge.conflicts))
        raise ValueError(
            f"{run_dir} holds other bytes for {len(names)} file(s) (nothing written): "
            + ", ".join(names)
        )
    for name, data in {**merge.added, **merge.extended}.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    return merge


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tars", nargs="+", type=Path, help="call tars or study.tar files, in order")
    p.add_argument("--into", type=Path, required=True, help="the run folder (laid out as results/)")
    args = p.parse_args(argv)
    try:
        merge = merge_calls(args.tars, args.into)
    except (ValueError, tarfile.TarError, OSError) as exc:
        print(f"runs: {exc}", file=sys.stderr)
        return 1
    points = [n for n in merge.added if POINT.match(n)]
    print(
        f"{args.into}: {len(merge.added)} files added ({len(points)} sweep points), "
        f"{len(merge.extended)} server logs extended, {len(set(merge.unchanged))} unchanged"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
