"""A GPU study's run folder: filled from the tars its device calls bring back, and described.

    python -m decodecliff.study.runs merge CALL_TAR [CALL_TAR ...] --into results/runs/h200/05f0426
    python -m decodecliff.study.runs describe results/runs/h200/05f0426
    python -m decodecliff.study.runs record --root . results/runs/h200/05f0426 [RUN_DIR ...]

`describe` prints what the folder holds, read from its files (commit, when, points and their
status): the table a published study's README gives for each run. `record` prints a published
study's RUNS.md: each run's table under the run folder's path relative to the repository's root
(however the path was typed). `point_seconds` and
`plan_calls` size what is left of a study into device calls by an earlier run's times.

`scripts/gpu_study_run.sh` packs what the rules wrote into ``study.tar`` after every key (a
call's own tar may hold it one level down, as ``*/study.tar``). The calls of one machine lease
each bring back everything measured so far, and a server's log gathers every launch of that
server on the machine, so a folder is filled by merging, not by copying over:

* a file the folder lacks is added; one it holds with the same bytes is left alone;
* a server log (``sweep/SERVER/server-SERVER.log``) gains the launches it lacks (each begins
  with a ``==== launch`` line, which names its time), and a launch a later call brings back
  longer (the same launch, logged further) is taken whole; a log and its ``.log.1`` (where the
  keeper moved the log over half its cap when it launched a server) merge as one log, each
  launch kept in the file the latest call holds it in, the earlier ones in ``.log.1``;
* a point that records a failure (a server that died, a timeout, a call cut short: ``status``
  neither ok nor skipped) never displaces what the folder holds, and an ok point displaces a
  failed one: the failed attempt is filed under ``failed/`` (its path, a hash of its bytes), with
  its rule log, so the key counts as missing until measured and its failures stay on record; a
  rule log that came back without its point (a key cut short) is filed there too;
* a bench document cut short (``bench_finished``: each bench rewrites it as it goes) is taken
  where the folder has none, and likewise never displaces one and gives way to a finished one,
  the cut attempt and its rule log filed under ``failed/``;
* a file it holds with other bytes (a point measured twice, another build record, a launch
  logged otherwise), a measurement of another commit or on another GPU (than the folder's
  others, or than a folder laid out as ``runs/GPU/COMMIT`` is named for), or a path that is not
  a file in the folder stops the merge before anything is written: which measurement stands is
  the publisher's decision;
* a tar with no study files, or a name that would land outside the folder, is refused;
* the build's logs (``build/`` and the rule's ``logs/build/``) come from the call that recorded
  the build (``build/build.json``): a later call's rebuild of the same commit, whose record must
  match (but for the machine and the order in which nvcc's threads listed the kernels), writes
  logs that differ only in temporary names and that order;
* the build's marker files and libraries are not results and are left out.
* each file is written whole (a temporary file renamed), so a merge stopped part way is
  completed by merging the same calls again.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

BUILD_RECORD = "build/build.json"
BUILD_LOGS = ("build/", "logs/build/")  # the build's own files and its rule's log
POINT = re.compile(r"^sweep/[^/]+/ctx\d+\.json$")  # paths.point_file, under results/
BENCH = re.compile(r"^(kernels|engine)/bench(-[^/]+)?\.json$")  # a bench's document, or a part's
# the rule logs of the points and the benches (logs/engine/bench_engine-slow.log: a part's)
RULE_LOG = re.compile(
    r"^logs/(sweep/[^/]+/ctx\d+|kernels/bench_kernels|engine/bench_engine(-[^/]+)?)\.log$"
)
FAILED = "failed"  # attempts that gave no key its result, kept on record
MEASURED_STATUS = ("ok", "skipped")  # a point's status where the point is the key's result
SERVER_LOG = re.compile(r"^sweep/[^/]+/server-[^/]+\.log$")
ROTATED = ".1"  # a server log's earlier part, moved aside at a launch (sweep/launcher.py: LOG.1)
LEFT_OUT = re.compile(r"(^build/\.built-by-rule-|\.so$)")
LAUNCH = re.compile(r"(?=\n==== launch )")  # the server writes a blank line before each


@dataclass
class Merge:
    """What merging a call's files into a run folder adds, extends and leaves alone."""

    added: dict[str, bytes] = field(default_factory=dict)
    extended: dict[str, bytes] = field(default_factory=dict)  # server logs: the whole new text
    replaced: dict[str, bytes] = field(default_factory=dict)  # failed points and their logs
    filed: dict[str, bytes] = field(default_factory=dict)  # failed attempts, under failed/
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    def writes(self) -> dict[str, bytes]:
        return {**self.added, **self.extended, **self.replaced, **self.filed}

    def holds(self, name: str, run_dir: Path) -> bytes | None:
        """The bytes ``name`` has once this merge is written (None: no such file)."""
        if (data := self.writes().get(name)) is not None:
            return data
        return (run_dir / name).read_bytes() if (run_dir / name).is_file() else None


def study_files(tar_path: Path) -> dict[str, bytes]:
    """The files of a call's study.tar (given, or inside a call's tar), by results/ path."""
    with tarfile.open(tar_path) as outer:
        inner = [m for m in outer.getmembers() if m.isfile() and m.name.endswith("study.tar")]
        if not inner:
            return _files(outer, str(tar_path))
        if len(inner) > 1:
            raise ValueError(f"{tar_path}: more than one study.tar ({[m.name for m in inner]})")
        data = outer.extractfile(inner[0]).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as study:  # a tar of no name: named here
        return _files(study, f"{tar_path}:{inner[0].name}")


def _files(tar: tarfile.TarFile, label: str) -> dict[str, bytes]:
    out = {}
    for member in tar.getmembers():
        name = member.name.removeprefix("./")
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{label}: {name!r} would land outside the run folder")
        if member.isfile() and not LEFT_OUT.search(name):
            out[name] = tar.extractfile(member).read()
    if not out:
        raise ValueError(f"{label}: holds no study files")
    if stray := sorted(n for n in out if n.split("/")[0] not in PACKED_DIRS):
        raise ValueError(
            f"{label}: {stray[0]!r} is no study file (those lie under "
            + ", ".join(f"{d}/" for d in PACKED_DIRS)
            + "): a call that stopped before packing its study.tar?"
        )
    return out


def launches(text: str) -> dict[str, str]:
    """A server log's launches by their ``==== launch`` line, each up to the next one."""
    blocks = LAUNCH.split("\n" + text)
    return {b.splitlines()[1]: b for b in blocks if b.startswith("\n==== launch ")}


def merged_log(have: str, new: str) -> str | None:
    """``have`` with the launches of ``new`` it lacks appended, in their order, and any launch
    ``new`` logged further taken whole; None where the two disagree (a launch logged otherwise,
    or logs of no launch that differ)."""
    known, theirs = launches(have), launches(new)
    if not known or not theirs:
        return have if have == new else None
    for header, block in theirs.items():
        mine = known.get(header)
        if mine is None or mine.startswith(block.rstrip("\n")):
            continue  # a launch it lacks (appended below), or one it holds as far or further
        if not block.startswith(mine.rstrip("\n")):
            return None
        if have.endswith(mine):  # the last launch: taken whole, to its end
            have = have.removesuffix(mine) + block
        else:
            have = have.replace(mine.rstrip("\n"), block.rstrip("\n"), 1)
    extra = [block for header, block in theirs.items() if header not in known]
    sep = "" if not have or have.endswith("\n") else "\n"
    return have + sep + "".join(extra) if extra else have


def _blocks(text: str) -> list[str]:
    """``text`` cut before each ``==== launch`` line (what comes before the first one first)."""
    blocks = LAUNCH.split("\n" + text)
    blocks[0] = blocks[0][1:]
    return blocks


def _header(block: str) -> str | None:
    """A launch's ``==== launch`` line (None for text before the first launch)."""
    return block.splitlines()[1] if block.startswith("\n==== launch ") else None


def _joined(older: str, log: str) -> str:
    """A server log and its LOG.1 as one text, LOG.1 first. A launch in both (a call packed as
    the keeper moved the log, a merge stopped between the two files' writes) is kept once, as
    LOG.1 holds it, where that is as far or further."""
    held = launches(older)

    def moved(block: str) -> bool:
        header = _header(block)
        return header in held and held[header].startswith(block.rstrip("\n"))

    return older + "".join(b for b in _blocks(log) if not moved(b))


def _split_after(text: str, earlier: set[str]) -> tuple[str, str]:
    """``text`` cut after the last launch named in ``earlier``: (LOG.1's part, the log's)."""
    cut = end = 0
    for block in _blocks(text):
        end += len(block)
        if _header(block) in earlier:
            cut = end
    return text[:cut], text[cut:]


def _merge_server_log(
    name: str, log: bytes | None, older: bytes | None, run_dir: Path, merge: Merge
) -> None:
    """A call's server log ``name`` and its LOG.1 (None: the call has no such file), merged with
    the folder's pair by their launches (``merged_log``) as one log, cut into the two again."""
    rotated = name + ROTATED
    have_log, have_older = merge.holds(name, run_dir), merge.holds(rotated, run_dir)
    # byte for byte (latin-1): a log packed while its server wrote may end inside a UTF-8
    # character (tqdm's bars) and is still a prefix of the log written further
    text = lambda data: (data or b"").decode("latin-1")  # noqa: E731
    new = _joined(text(older), text(log))
    if have_log is None and have_older is None:
        merged = new
    elif (merged := merged_log(_joined(text(have_older), text(have_log)), new)) is None:
        merge.conflicts.append(f"{name} (a launch logged otherwise)")
        return
    earlier = set(launches(text(have_older))) | set(launches(text(older)))
    parts = _split_after(merged, earlier)
    for part, came, have, data in zip(
        (rotated, name), (older, log), (have_older, have_log), parts, strict=True
    ):
        data = data.encode("latin-1")
        if have == data or (have is None and not data):
            if came is not None:
                merge.unchanged.append(part)
        elif have is None and not _free(run_dir, part):
            merge.conflicts.append(f"{part} (a folder, or under a file)")
        elif have is None or part in merge.added:
            merge.added[part] = data
        else:
            merge.extended[part] = data


def point_status(data: bytes) -> str | None:
    """A point file's ``status``; None where the bytes are no JSON object with one."""
    doc = _json_object(data)
    status = doc.get("status") if doc is not None else None
    return status if isinstance(status, str) else None


def _json_object(data: bytes) -> dict | None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def failed_point(data: bytes) -> bool:
    """Whether a point file records a failed attempt (a status, neither ok nor skipped)."""
    return point_status(data) not in (None, *MEASURED_STATUS)


def bench_finished(name: str, data: bytes) -> bool:
    """Whether the bench document ``name`` was written at its bench's end, not cut short."""
    doc = _json_object(data)
    return doc is not None and _finished(name, doc)


def _finished(name: str, doc: dict) -> bool:
    """Each bench rewrites its document after every point or group: the engine bench adds its
    targets last, the kernel bench sets ``complete`` (a document from before that field reads as
    finished)."""
    return "targets" in doc if name.startswith("engine/") else doc.get("complete", True) is True


def _rule_log(result: str) -> str:
    """The rule log beside a result: logs/sweep/S/ctxN.log for sweep/S/ctxN.json, and
    logs/engine/bench_engine-slow.log for engine/bench-slow.json."""
    folder, _, name = result.removesuffix(".json").partition("/")
    if BENCH.match(result):
        name = name.replace("bench", f"bench_{folder}", 1)
    return f"logs/{folder}/{name}.log"


def _result_of(log: str) -> str:
    """The result a rule log belongs to (the inverse of ``_rule_log``)."""
    folder, _, name = log.removeprefix("logs/").removesuffix(".log").partition("/")
    if RULE_LOG.match(log) and folder != "sweep":
        name = name.replace(f"bench_{folder}", "bench", 1)
    return f"{folder}/{name}.json"


def _attempt(name: str, data: bytes) -> bool:
    """Whether a point or bench file records an attempt, not its key's result: a point that
    failed, a bench document cut short (bytes that are neither merge by the usual rules)."""
    if POINT.match(name):
        return failed_point(data)
    doc = _json_object(data)
    return doc is not None and not _finished(name, doc)


def is_result(name: str, data: bytes) -> bool:
    """Whether a point or bench file (``name`` under results/) is its key's result: an ok or
    skipped point, a finished bench."""
    if POINT.match(name):
        return point_status(data) in MEASURED_STATUS
    return bench_finished(name, data)


def _file_away(name: str, data: bytes, run_dir: Path, merge: Merge, attempt: bytes) -> None:
    """Keep a failed attempt's file under failed/, named by its path and a hash of the attempt
    (its point's bytes, so a point and its log pair up; a log's own where no point came back)."""
    stem, dot, suffix = name.rpartition(".")
    filed = f"{FAILED}/{stem}-{hashlib.sha256(attempt).hexdigest()[:8]}{dot}{suffix}"
    if merge.holds(filed, run_dir) == data:
        merge.unchanged.append(filed)
    else:
        merge.filed[filed] = data


def _sort_attempts(files: dict[str, bytes], run_dir: Path, merge: Merge) -> dict[str, bytes]:
    """Take the failed or cut attempts, and the results that replace them, out of ``files`` into
    ``merge``; the files left merge by the usual rules."""
    files = dict(files)
    for result in sorted(n for n in files if POINT.match(n) or BENCH.match(n)):
        log = _rule_log(result)
        have, new = merge.holds(result, run_dir), files[result]
        if have is None or have == new:
            continue
        if _attempt(result, new):
            for name in (result, log):  # a failure never displaces what the folder holds
                if name in files:
                    _file_away(name, files.pop(name), run_dir, merge, new)
        elif _attempt(result, have) and is_result(result, new):
            for name in (result, log):
                # (a log the same as the one that came: written by a merge stopped part way)
                if (old := merge.holds(name, run_dir)) is not None and old != files.get(name):
                    _file_away(name, old, run_dir, merge, have)
                if name in files:  # added earlier in this merge, or on disk already
                    target = merge.added if name in merge.added else merge.replaced
                    target[name] = files.pop(name)
    for log in sorted(n for n in files if RULE_LOG.match(n)):
        result = _result_of(log)
        # a key cut short: no result came back, or the one the folder holds (a point is written
        # whole at its end, so a rerun cut short leaves the earlier one beside its own log)
        rerun = result not in files or files[result] == merge.holds(result, run_dir)
        if rerun and (data := files[log]) != merge.holds(log, run_dir):
            files.pop(log)
            _file_away(log, data, run_dir, merge, data)
    return files


def plan_merge(files: dict[str, bytes], run_dir: Path, merge: Merge | None = None) -> Merge:
    """What writing ``files`` into ``run_dir`` would do (nothing is written)."""
    merge = merge or Merge()
    files = _sort_attempts(files, run_dir, merge)
    for name in sorted({n.removesuffix(ROTATED) for n in files}):
        if SERVER_LOG.match(name):  # a server log and its LOG.1, together
            older = files.pop(name + ROTATED, None)
            _merge_server_log(name, files.pop(name, None), older, run_dir, merge)
    for name, data in sorted(files.items()):
        have = merge.holds(name, run_dir)
        if have is None and not _free(run_dir, name):
            merge.conflicts.append(f"{name} (a folder, or under a file)")
            continue
        recorded = BUILD_RECORD in merge.added or (run_dir / BUILD_RECORD).is_file()
        if name.startswith(BUILD_LOGS) and name != BUILD_RECORD and have is not None and recorded:
            merge.unchanged.append(name)  # the recorded build's own log stands
        elif have is None:
            merge.added[name] = data
        elif have == data or (name == BUILD_RECORD and _same_build(have, data)):
            merge.unchanged.append(name)
        else:
            merge.conflicts.append(name)
    return merge


def _same_build(have: bytes, new: bytes) -> bool:
    """Two records of one commit's build on two machines: alike but for the machine (``env``:
    host, cores; the folders the tree and nvcc lay in); the record first merged stands."""
    try:
        mine, theirs = json.loads(have), json.loads(new)
    except ValueError:
        return False
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return False
    for record in (mine, theirs):
        record.pop("env", None)
        if isinstance(record.get("kernels"), list):  # in the order nvcc's threads ended
            record["kernels"].sort(key=lambda k: json.dumps(k, sort_keys=True))
        for key in ("command", "library"):
            record[key] = _placeless(record.get(key))
    return mine == theirs


def _placeless(value: object) -> object:
    """A build command or path with each absolute path cut to its file name."""
    if isinstance(value, list):
        return [_placeless(v) for v in value]
    return PurePosixPath(value).name if isinstance(value, str) and value.startswith("/") else value


def _free(run_dir: Path, name: str) -> bool:
    """Whether ``name`` can be written under ``run_dir``: no folder there, no file above it."""
    dest = run_dir / name
    return not dest.exists() and not any(p.is_file() for p in dest.parents)


STUDY_DIRS = ("build", "kernels", "engine", "sweep")  # what the rules write; not gpu-logs/
PACKED_DIRS = (*STUDY_DIRS, "logs")  # what a call's study.tar holds: the results and rule logs
MEASURED_DIRS = (*STUDY_DIRS[1:], FAILED)  # what was measured (or attempted) on the GPU
SHORT = 7  # a commit as the scripts name it (DECODECLIFF_GIT_REV) and git's full hash alike


def _env(data: bytes) -> dict:
    """A result file's ``env`` (the machine and commit it was measured on); {} for other files."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    env = doc.get("env") if isinstance(doc, dict) else None
    return env if isinstance(env, dict) else {}


def commit_of(data: bytes) -> str | None:
    """The commit a result file was measured at (its ``env``), '-dirty' dropped, to its first
    seven characters; None for files without one (logs, a build record older than its env)."""
    return short_commit(_env(data).get("git"))


def short_commit(git: object) -> str | None:
    """An ``env.git`` as one commit: '-dirty' dropped (a mark of the checkout around the tree
    that ran, not of the tree), to its first seven characters; None where it is no string."""
    return git.removesuffix("-dirty")[:SHORT] if isinstance(git, str) else None


def gpu_of(data: bytes) -> str | None:
    """The GPU a result file was measured on ('NVIDIA H200'); None for files without one."""
    gpu = _env(data).get("gpu")
    return gpu if isinstance(gpu, str) and gpu else None


def _held(
    run_dir: Path, merge: Merge, read: Callable[[bytes], str | None], dirs: tuple[str, ...]
) -> dict[str, str]:
    """Each value ``read`` finds in the folder's and the merge's results under ``dirs``, with one
    file of it."""
    files = [f for d in dirs for f in (run_dir / d).rglob("*.json") if f.is_file()]
    held = {str(f.relative_to(run_dir)): f.read_bytes() for f in files}
    found: dict[str, str] = {}
    added = {n: d for n, d in merge.writes().items() if n.split("/")[0] in dirs}
    for name, data in {**held, **added}.items():
        if (value := read(data)) is not None:
            found.setdefault(value, name)
    return found


def _named(run_dir: Path) -> tuple[Callable[[str], bool] | None, Callable[[str], bool] | None]:
    """Whether a commit, and a GPU, is the one a run folder laid out as ``runs/GPU/COMMIT`` is
    named for (results/runs/h200/05f0426: 05f0426, an H200); None where it is not so laid out."""
    place = run_dir.resolve()
    if place.parent.parent.name != "runs" or not re.fullmatch(r"[0-9a-f]{7,40}", place.name):
        return None, None
    return (
        lambda commit: commit == place.name[:SHORT],
        lambda gpu: gpu_named(place.parent.name, gpu),
    )


def gpu_named(name: str, recorded: str) -> bool:
    """Whether the GPU a result file records ('NVIDIA H100 80GB HBM3') is the one ``name`` says
    (a run folder's 'h100', a config's study.gpu 'H100' or 'RTX PRO 6000'): its words, letters
    and digits alike, whole (an H20 is no H200, an A10 no A100)."""

    def words(text: str) -> str:
        return " " + " ".join(re.findall(r"[0-9a-z]+", text.lower())) + " "

    return bool(name.strip()) and words(name) in words(recorded)


def gpu_mismatch(results: Path, study_gpu: str | None) -> str | None:
    """Why the measurements of a study's runs, merged and laid out as results/, are not one
    study of ``study_gpu`` (its config's; None: it names none): measured on several GPUs, or on
    none or another than it names; None where they are. Each run folder holds one GPU's files
    (merge_calls), but a publication merges several runs."""
    found = _held(results, Merge(), gpu_of, MEASURED_DIRS)
    where = ", ".join(f"{value} ({name})" for value, name in found.items())
    if len(found) > 1:
        return f"the runs were measured on several GPUs, one study's on one: {where}"
    if study_gpu and not (found and gpu_named(study_gpu, next(iter(found)))):
        return (
            f"the config names study.gpu {study_gpu}, but its runs were measured on "
            f"{where or 'no GPU'} (give the config of theirs: config/h200.yaml:config/h100.yaml "
            "for an H100's)"
        )
    return None


def merge_calls(tars: list[Path], run_dir: Path) -> Merge:
    """Merge the calls' files into ``run_dir`` in the given order; on a conflict write nothing."""
    merge = Merge()
    for tar in tars:
        try:
            files = study_files(tar)
        except tarfile.TarError as exc:
            raise ValueError(f"{tar}: not a readable tar ({str(exc).splitlines()[0]})") from None
        plan_merge(files, run_dir, merge)
    # the build is the commit's whatever GPU compiled it (_same_build): its records have no say
    # in the GPU the measurements were taken on
    checks = (("commit", commit_of, (*STUDY_DIRS, FAILED)), ("GPU", gpu_of, MEASURED_DIRS))
    for (what, read, dirs), named in zip(checks, _named(run_dir), strict=True):
        if len(found := _held(run_dir, merge, read, dirs)) > 1:
            raise ValueError(
                f"a run folder holds one {what}'s measurements; these are of "
                + ", ".join(f"{value} ({name})" for value, name in found.items())
                + " (nothing written)"
            )
        if named is not None and (other := [v for v in found if not named(v)]):
            raise ValueError(
                f"{run_dir} is named for another {what} than its measurements': these are of "
                + ", ".join(f"{value} ({found[value]})" for value in other)
                + " (nothing written)"
            )
    if merge.conflicts:
        names = sorted(set(merge.conflicts))
        raise ValueError(
            f"{run_dir} holds other bytes for {len(names)} file(s) (nothing written): "
            + ", ".join(names)
        )
    # each file whole, the failed attempts first and the points and benches last (after their
    # logs), so that merging the same calls again completes a merge stopped part way: a point
    # that came is not read as a rerun cut short, nor does one displace what is not yet on record
    # (a server log's LOG.1 before the log: stopped between the two, LOG.1 holds what moved)
    writes = merge.writes()
    last = [n for n in writes if POINT.match(n) or BENCH.match(n)]
    rotated = lambda n: n.endswith(ROTATED) and SERVER_LOG.match(n.removesuffix(ROTATED))  # noqa: E731
    rest = sorted((n for n in writes if n not in last), key=lambda n: not rotated(n))
    for name in [*merge.filed, *rest, *last]:
        _write_whole(run_dir / name, writes[name])
    return merge


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` into a temporary file beside ``path``, renamed over it: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _when(stamps: list[str]) -> str:
    """The UTC span of ISO timestamps, to the minute ('2026-12-04 17:44 - 19:30')."""
    if not stamps:
        return "-"
    first, last = (t[:16].replace("T", " ") for t in (min(stamps), max(stamps)))
    return first if first == last else f"{first} - {last[11:] if last[:10] == first[:10] else last}"


def _ctx(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 else str(n)


def _read(path: Path) -> dict:
    """A result file's JSON object; ValueError naming the file where it is none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("env"), dict):
        raise ValueError(f"{path}: not a result file (no JSON object with an env)")
    return doc


def _point_files(server_dir: Path) -> list[tuple[int, Path]]:
    """A server folder's point files (sweep/SERVER/ctxN.json) with their contexts, in order."""
    files = server_dir.glob("ctx*.json")
    return sorted((int(f.stem[3:]), f) for f in files if f.stem[3:].isdigit())


def describe(run_dir: Path) -> str:
    """A markdown table of what ``run_dir`` holds: one row per bench and per swept server."""
    if not run_dir.is_dir():
        raise ValueError(f"no run folder {run_dir}")
    rows = ["| file(s) | commit | measured (UTC) | what |", "|---|---|---|---|"]
    rows += [_bench_row(run_dir, rel) for rel in bench_files(run_dir)]
    filed = run_dir / FAILED
    names = [f.relative_to(filed).as_posix() for f in sorted(filed.rglob("*.json"))]
    docs = [_read(filed / n) for n in names if not BENCH.match(_attempt_of(n))]
    benches = [n for n in names if BENCH.match(_attempt_of(n))]
    logs = [f.relative_to(filed).as_posix() for f in filed.rglob("*.log")]
    cut = [log for log in logs if not (filed / _result_of(log)).is_file()]  # no result beside it
    if docs or cut or benches:
        commits = ", ".join(f"`{c}`" for c in dict.fromkeys(d["env"].get("git") for d in docs))
        reasons = sorted({str(d.get("reason") or d.get("status")) for d in docs})
        rows.append(
            f"| `{FAILED}/` | {commits or '-'} | - | {len(docs)} failed points kept apart (their "
            f"keys measured again, or failed again): {'; '.join(reasons) or '-'}; {len(cut)} "
            f"logs of keys cut short before their point"
            + (f"; {len(benches)} benches cut short, measured again" if benches else "")
            + " |"
        )
    for server_dir in sorted((run_dir / "sweep").glob("*/")):
        points = _point_files(server_dir)
        docs = [_read(f) for _, f in points]
        if not docs:
            continue
        commits = ", ".join(f"`{c}`" for c in dict.fromkeys(d["env"].get("git") for d in docs))
        stamps = [t for d in docs for t in (d.get("started_at"), d.get("finished_at")) if t]
        status = [
            f"{_ctx(ctx)} {d.get('status', 'no status')}"
            for (ctx, _), d in zip(points, docs, strict=True)
        ]
        requests = sorted({len(d.get("requests") or []) for d in docs})
        rows.append(
            f"| `sweep/{server_dir.name}/` | {commits} | {_when(stamps)} | {len(docs)} "
            f"point{'' if len(docs) == 1 else 's'} "
            f"({', '.join(status)}), {' or '.join(map(str, requests))} requests each |"
        )
    return "\n".join(rows)


RUNS_TITLE = "# What each run held (generated from its files by publish_study.sh)"


def run_name(run_dir: Path, root: Path) -> str:
    """How RUNS.md names a run folder: its path relative to ``root`` (the repository) however it
    was typed ('./results/runs/h200/7fe4732/' and 'results/runs/h200/7fe4732' alike), its
    absolute path where it lies outside ``root``."""
    place, base = run_dir.resolve(), root.resolve()
    return place.relative_to(base).as_posix() if place.is_relative_to(base) else place.as_posix()


def record(run_dirs: list[Path], root: Path) -> str:
    """RUNS.md of a study published from ``run_dirs``: each run's ``describe`` table under its
    ``run_name``."""
    parts = [RUNS_TITLE]
    for run_dir in run_dirs:
        parts += [f"## `{run_name(run_dir, root)}`", describe(run_dir)]
    return "\n\n".join(parts) + "\n"


def bench_files(run_dir: Path) -> list[str]:
    """The bench documents (and parts of one) a run folder holds, under it, kernels' first."""
    found = (p for d in ("kernels", "engine") for p in sorted((run_dir / d).glob("*.json")))
    return [rel for p in found if BENCH.match(rel := p.relative_to(run_dir).as_posix())]


def cut_benches(run_dir: Path) -> list[str]:
    """The bench documents of a run folder that their bench did not finish."""
    return [b for b in bench_files(run_dir) if not bench_finished(b, (run_dir / b).read_bytes())]


def _bench_row(run_dir: Path, rel: str) -> str:
    doc = _read(run_dir / rel)
    what = "rows" if rel.startswith("engine/") else "points"
    items = doc.get(what, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"{run_dir / rel}: its {what!r} is no list of objects")
    failed = sum(1 for i in items if i.get("status", "ok") not in MEASURED_STATUS)
    cut = "" if _finished(rel, doc) else ", cut short"
    git = doc["env"].get("git")
    return f"| `{rel}` | `{git}` | - | {len(items):,} {what}, {failed} failed{cut} |"


def _attempt_of(filed: str) -> str:
    """The path a file under failed/ had (its attempt's hash taken off the name)."""
    return re.sub(r"-[0-9a-f]{8}(\.\w+)$", r"\1", filed)


def point_seconds(run_dir: Path) -> dict[str, float]:
    """Each sweep point's wall time in ``run_dir`` by key (``SERVER:CTX``): its server's launch,
    warm-up and requests, from the point file's own start and finish."""
    seconds = {}
    for server_dir in (run_dir / "sweep").glob("*/"):
        for ctx, f in _point_files(server_dir):
            doc = _read(f)
            start, finish = doc.get("started_at"), doc.get("finished_at")
            if start and finish:
                try:
                    span = datetime.fromisoformat(finish) - datetime.fromisoformat(start)
                except (TypeError, ValueError) as exc:  # no ISO time, or one with a zone and not
                    raise ValueError(f"{f}: started_at, finished_at: {exc}") from None
                seconds[f"{server_dir.name}:{ctx}"] = span.total_seconds()
    return seconds


def plan_calls(
    keys: list[str], seconds: dict[str, float], call_s: float
) -> tuple[list[list[str]], list[str]]:
    """``keys`` packed into device calls of at most ``call_s`` estimated seconds each, longest
    first (first fit, so the slow points lead their calls and no call starts one it cannot end;
    a key longer than ``call_s`` gets a call of its own), and the keys with no estimate."""
    timed = sorted((k for k in keys if k in seconds), key=lambda k: -seconds[k])
    calls: list[list[str]] = []
    loads: list[float] = []
    for k in timed:
        fit = next((i for i, load in enumerate(loads) if load + seconds[k] <= call_s), None)
        if fit is None:
            calls.append([k])
            loads.append(seconds[k])
        else:
            calls[fit].append(k)
            loads[fit] += seconds[k]
    return calls, [k for k in keys if k not in seconds]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    merge_p = sub.add_parser("merge", help="merge device calls' tars into a run folder")
    merge_p.add_argument(
        "tars", nargs="+", type=Path, help="call tars or study.tar files, in order"
    )
    merge_p.add_argument("--into", type=Path, required=True, help="the run folder (as results/)")
    describe_p = sub.add_parser("describe", help="what a run folder holds, as a markdown table")
    describe_p.add_argument("run_dir", type=Path)
    record_p = sub.add_parser(
        "record", help="RUNS.md: each run folder described under its path relative to --root"
    )
    record_p.add_argument("run_dirs", nargs="+", type=Path)
    record_p.add_argument("--root", type=Path, required=True, help="the repository's root")
    args = p.parse_args(argv)
    try:
        if args.command == "describe":
            print(describe(args.run_dir))
            return 0
        if args.command == "record":
            print(record(args.run_dirs, args.root), end="")
            return 0
        merge = merge_calls(args.tars, args.into)
    except (ValueError, tarfile.TarError, OSError) as exc:
        print(f"runs: {exc}", file=sys.stderr)
        return 1
    points = [n for n in {**merge.added, **merge.replaced} if POINT.match(n)]
    failed = [n for n in merge.filed if n.endswith(".json")]
    print(
        f"{args.into}: {len(merge.added)} files added, {len(merge.replaced)} replaced "
        f"({len(points)} sweep points), {len(merge.extended)} server logs extended, "
        f"{len(failed)} failed points filed under {FAILED}/, {len(set(merge.unchanged))} unchanged"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
