"""One engine bench document from parts measured in separate calls of one commit's bench.

A `bench-engine` run that a time limit cuts keeps every group it finished (the document is written
after each backend, path and mode), so the rest can be measured by a second run of the same command
with the backends still missing. This joins such parts: the same commit, GPU and software, each
row measured once, every option but what to measure the same; rows, loops and errors in order,
the backends (modes, contexts, ...) of all parts, the targets recomputed, and every part's
command, ceilings and errors kept under ``parts`` (a group one part failed and another measured
is no error of the whole).

    python -m decodecliff.bench.engine_merge first.json rest.json --out bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from decodecliff.engine.config import DEFAULT_GEMM, gemm_label
from decodecliff.jsonio import unwritable, write_json
from decodecliff.study.runs import short_commit

from .engine import check_targets

SAME_ENV = ("git", "gpu", "driver", "torch", "triton", "cuda_runtime")  # what parts must share
# The options that pick what a part measured may differ (and are joined); every other option says
# how a row was measured, and must be the same in every part.
SELECTION = ("backends", "gemm", "paths", "modes", "contexts", "parts", "loop_contexts", "out")
# Each list's rows, and what names one: a row measured in two parts is refused.
LISTS = {
    "rows": ("backend", "path", "mode", "context", "batch"),
    "loop": ("backend", "path", "context"),
    "drafter": ("mode", "context"),
    "host": ("spec", "context"),
    "errors": None,
}
JOINED = {"command", "args", "env", "ceilings", "targets_spec", "targets", "parts", *LISTS}


def _check_alike(docs: list[dict]) -> None:
    first = docs[0]
    for doc in docs[1:]:
        differ = [k for k in SAME_ENV if _env_value(doc, k) != _env_value(first, k)]
        differ += [
            k for k in {*doc["args"], *first["args"]} - set(SELECTION)
            if doc["args"].get(k) != first["args"].get(k)
        ]  # fmt: skip
        if differ:
            raise ValueError(f"parts differ in {', '.join(sorted(differ))}: not one measurement")


def _env_value(doc: dict, key: str) -> object:
    """An ``env`` entry as parts must share it: the commit as `runs` compares commits."""
    value = doc["env"].get(key)
    return short_commit(value) if key == "git" else value


def _joined_args(docs: list[dict]) -> dict:
    args = dict(docs[0]["args"])
    for key in SELECTION[:-1]:  # each selection joined in order; out: the first part's
        lists = [d["args"].get(key) for d in docs if d["args"].get(key) is not None]
        args[key] = list(dict.fromkeys(x for each in lists for x in each)) if lists else None
    return args


def _others(docs: list[dict]) -> dict:
    """Keys beyond the lists (a part's ``gemms``): from the one part that measured them."""
    out: dict = {}
    for doc in docs:
        for key, value in doc.items():
            if key in JOINED or value is None:
                continue
            if key in out:
                raise ValueError(f"{key} measured in more than one part")
            out[key] = value
    return out


def _superseded(error: dict, merged: dict) -> bool:
    """A part's failed group that another part measured (``what`` as bench/engine.py names it:
    "anatomy LABEL PATH MODE", "loop LABEL PATH CONTEXT", "drafter MODE CONTEXT", "host SPEC
    CONTEXT", "gemms"; a label may hold spaces: "custom (sm120) + fused GEMMs")."""
    kind, _, rest = error.get("what", "").partition(" ")
    names = tuple(rest.rsplit(" ", 2))
    if kind == "anatomy" and len(names) == 3:
        return any((r["backend"], r["path"], r["mode"]) == names for r in merged["rows"])
    if kind == "loop" and len(names) == 3:
        return any((r["backend"], r["path"], str(r["context"])) == names for r in merged["loop"])
    if kind in ("drafter", "host") and len(names) == 2:
        field = "mode" if kind == "drafter" else "spec"
        return any((r[field], str(r["context"])) == names for r in merged[kind])
    return kind == "gemms" and merged.get("gemms") is not None


def _named_by_gemm(doc: dict) -> dict:
    """A document of one GEMM path (``--gemm`` took one path once) as bench/engine.py writes one
    now: its path in a list, its rows named "custom + pdl GEMMs" where the path was not cuBLAS."""
    gemm = doc["args"].get("gemm")
    if not isinstance(gemm, str):
        return doc
    named = {
        key: [{**r, "backend": gemm_label(r["backend"], gemm), "gemm": gemm} for r in doc[key]]
        for key in ("rows", "loop")
        if key in doc and gemm != DEFAULT_GEMM
    }
    return {**doc, "args": {**doc["args"], "gemm": [gemm]}, **named}


def _parts(doc: dict) -> list[dict]:
    """What each measurement in ``doc`` ran: its own, or a merged document's parts (so a merge
    of merges keeps every part's command, ceilings and errors)."""
    if doc.get("parts"):
        return list(doc["parts"])
    return [
        {
            "command": doc["command"],
            "ceilings": doc.get("ceilings"),
            "errors": doc.get("errors", []),
        }
    ]


def merge(docs: list[dict]) -> dict:
    """The parts as one; refuses parts measured otherwise (another commit, GPU or option) and a
    row measured twice."""
    if not docs:
        raise ValueError("nothing to merge")
    _check_alike(docs)
    docs = [_named_by_gemm(d) for d in docs]
    out = {**docs[0], **_others(docs)}
    for name, fields in LISTS.items():
        out[name] = [x for d in docs for x in d.get(name, [])]
        keys = [tuple(x.get(f) for f in fields) for x in out[name]] if fields else []
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if twice:
            raise ValueError(f"{name} measured in more than one part: {twice}")
    # a group one part failed and another measured: its error stays with that part only
    out["errors"] = [e for e in out["errors"] if not _superseded(e, out)]
    out["args"] = _joined_args(docs)
    # the ceilings of the first part that measured them (each part's own under parts: its rows'
    # floors come from those)
    out["ceilings"] = next((d["ceilings"] for d in docs if d.get("ceilings")), None)
    out["parts"] = [part for d in docs for part in _parts(d)]
    out["targets"] = check_targets(out["rows"], out["loop"])
    return out


def _rows(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, dict) for x in value)


def _document(path: Path) -> dict:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not {"command", "args", "env"} <= set(doc):
        raise ValueError(f"{path}: not a bench-engine document")
    wrong = [k for k in ("args", "env") if not isinstance(doc[k], dict)]
    wrong += [k for k in LISTS if not _rows(doc.get(k, []))]
    if wrong:
        raise ValueError(f"{path}: {', '.join(wrong)} not as bench-engine writes them")
    return doc


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m decodecliff.bench.engine_merge",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("parts", nargs="+", type=Path, help="bench-engine JSON documents, in order")
    p.add_argument("--out", required=True, type=Path, help="the merged document")
    args = p.parse_args(argv)
    if (why := unwritable(args.out)) is not None:
        p.error(f"--out: {why}")
    try:
        doc = merge([_document(path) for path in args.parts])
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    except KeyError as exc:  # a row or document without a field a merge reads
        p.error(f"a part lacks {exc} (not a bench-engine document?)")
    write_json(args.out, doc)
    print(f"{args.out}: {len(doc['rows'])} rows, {len(doc['loop'])} loops from {len(args.parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
