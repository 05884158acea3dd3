"""One engine bench document from parts measured in separate calls of one commit's bench.

A `bench-engine` run that a time limit cuts keeps every group it finished (the document is written
after each backend, path and mode), so the rest can be measured by a second run of the same command
with the backends still missing. This joins such parts: the same commit, GPU and software, each
row measured once; rows, loops and errors in order, the backends of all parts, the targets
recomputed, and every part's command and ceilings kept under ``parts``.

    python -m decodecliff.bench.engine_merge first.json rest.json --out bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from decodecliff.jsonio import write_json

from .engine import check_targets

SAME_ENV = ("git", "gpu", "driver", "torch", "triton", "cuda_runtime")  # what parts must share
LISTS = ("rows", "loop", "drafter", "host", "errors")
ROW_KEY = ("backend", "path", "mode", "context", "batch")
LOOP_KEY = ("backend", "path", "context")


def _keys(items: list[dict], fields: tuple[str, ...]) -> list[tuple]:
    return [tuple(item.get(f) for f in fields) for item in items]


def merge(docs: list[dict]) -> dict:
    """The parts as one; refuses parts of another commit or GPU, or a row measured twice."""
    if not docs:
        raise ValueError("nothing to merge")
    first = docs[0]
    for doc in docs[1:]:
        differ = [k for k in SAME_ENV if doc["env"].get(k) != first["env"].get(k)]
        if differ:
            raise ValueError(f"parts differ in {', '.join(differ)}: not one measurement")
    out = {**first, **{name: [x for d in docs for x in d.get(name, [])] for name in LISTS}}
    for name, fields in (("rows", ROW_KEY), ("loop", LOOP_KEY)):
        keys = _keys(out[name], fields)
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if twice:
            raise ValueError(f"{name} measured in more than one part: {twice}")
    backends = [b for d in docs for b in d["args"]["backends"]]
    out["args"] = {**first["args"], "backends": list(dict.fromkeys(backends))}
    out["parts"] = [{"command": d["command"], "ceilings": d.get("ceilings")} for d in docs]
    out["targets"] = check_targets(out["rows"], out["loop"])
    return out


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m decodecliff.bench.engine_merge",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("parts", nargs="+", type=Path, help="bench-engine JSON documents, in order")
    p.add_argument("--out", required=True, type=Path, help="the merged document")
    args = p.parse_args(argv)
    try:
        doc = merge([json.loads(path.read_text()) for path in args.parts])
    except (OSError, ValueError, KeyError) as exc:
        p.error(str(exc))
    write_json(args.out, doc)
    print(f"{args.out}: {len(doc['rows'])} rows, {len(doc['loop'])} loops from {len(args.parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
