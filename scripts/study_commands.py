#!/usr/bin/env python3
"""The measuring commands of a GPU study, as the pipeline's rules would run them, one per line:

    scripts/study_commands.py config/h200.yaml > scripts/study-h200.txt
    scripts/study_commands.py config/h200.yaml:config/h100.yaml     # the same commands
    scripts/study_commands.py --missing scripts/study-h200.txt results/runs/h200/05f0426
    scripts/study_commands.py --missing scripts/study-h200.txt results/runs/h200/7fe4732 \
        --like results/runs/h200/05f0426 --call-s 400
    scripts/study_commands.py --split-engine scripts/study-h200.txt slow='triton sglang' \
        > scripts/study-h200-engine.txt

A study's config is a file, or several joined by ':' (each overlaying the ones before it), as
`publish_study.sh` takes it. Each line is ``KEY<TAB>COMMAND``: ``build_kernel``,
``bench_kernels``, ``bench_engine`` or ``SERVER:CTX`` (one sweep point), the rule's own shell
command from ``snakemake -n -p`` on a copy of the workflow. `gpu_study_run.sh` runs them on a GPU
machine that has no Snakemake, so a study too long for one machine lease is measured in parts at
one commit. Run it where the peers are
visible (FlashInfer importable, DECODECLIFF_SGLANG_PATH or SGLang installed): a point the plan
would skip here (`--skip-reason`) stops it, since it would be skipped there too. `--missing`
prints the keys of such a file whose result a run folder (laid out as results/) lacks yet (a
point that failed and a bench cut short count as lacking; a key ``bench_engine_PART``, a part of
``bench_engine`` written to engine/bench-PART.json, counts as measured once that part finished or
the parts were joined into engine/bench.json);
with `--like` an earlier run of the same study, one line per device call instead: the keys,
longest first, packed into calls of at most `--call-s` seconds of that run's point times (give
the call's 10 minutes less the start of the slowest point: each call's last key may start late),
then the keys it has no time for (the benches). `--split-engine` prints a commands file with
``bench_engine`` split by its backends into parts that fit a call each: ``bench_engine_NAME``
for each ``NAME=BACKENDS`` given, then ``bench_engine_rest`` for the backends left, each the
rule's command writing engine/bench-NAME.json and its own log (join them with
``python -m decodecliff.bench.engine_merge``); a file split already is refused.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from decodecliff.study import paths
from decodecliff.study.runs import is_result, plan_calls, point_seconds

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = [
    "Snakefile",
    "config.yaml",
    "workflow",
    "notebooks",
    "config",
    "data",
    "envs",
    "profiles",
]
RULES = {  # command -> (key, the file its rule writes, under results/)
    "build-kernel": ("build_kernel", paths.BUILD_INFO),
    "bench-kernels": ("bench_kernels", paths.KERNEL_BENCH),
    "bench-engine": ("bench_engine", paths.ENGINE_BENCH),
}
OUTPUTS = dict(RULES.values())


def dry_run(*configs: Path) -> str:
    """``snakemake -n -p`` of the study of ``configs`` (each over the ones before it)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in WORKFLOW:
            src = REPO / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, Path(tmp) / name)
        cmd = ["snakemake", "-n", "-p", "--configfile", *(str(c.resolve()) for c in configs)]
        cmd += ["--config", "published=null"]
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if done.returncode:  # snakemake's own words: a config it refuses, a rule it lacks
            named = ":".join(map(str, configs))
            sys.exit(f"snakemake -n failed on {named}:\n{done.stderr.strip()[-2000:]}")
        return done.stdout


def key(command: str) -> str | None:
    if point := re.search(r"exec decodecliff sweep .* --name (\S+) --contexts (\d+) ", command):
        return f"{point[1]}:{point[2]}"
    return next((k for word, (k, _) in RULES.items() if f"decodecliff {word} " in command), None)


ENGINE_PART = re.compile(r"bench_engine_(\w+)")  # a part of bench_engine: engine/bench-PART.json


def result_of(name: str) -> str:
    """The file under results/ that the command of key ``name`` writes last."""
    if ":" in name:
        path = paths.point_file(*name.split(":", 1))
    elif part := ENGINE_PART.fullmatch(name):
        path = paths.ENGINE_BENCH.replace("bench.json", f"bench-{part[1]}.json")
    elif name in OUTPUTS:
        path = OUTPUTS[name]
    else:
        raise ValueError(f"unknown key {name!r}: not a rule's, bench_engine_PART or SERVER:CTX")
    return path.removeprefix(f"{paths.RESULTS}/")


def missing(commands: Path, run: Path) -> list[str]:
    """The keys of ``commands`` with no result in ``run``: no file, a point that failed, or a
    bench cut short (an engine part counts as measured once the parts are joined, too)."""
    keys = [line.split("\t")[0] for line in commands.read_text().splitlines() if line]
    return [k for k in keys if not measured(run, k)]


def measured(run: Path, key: str) -> bool:
    if ENGINE_PART.fullmatch(key) and measured(run, "bench_engine"):
        return True
    rel = result_of(key)
    return (run / rel).is_file() and is_result(rel, (run / rel).read_bytes())


def split_engine(commands: str, parts: list[str]) -> str:
    """``commands`` with ``bench_engine`` also given as parts, each ``NAME=BACKENDS`` (the rest of
    its backends: ``rest``), each writing engine/bench-NAME.json and its own log."""
    lines = commands.splitlines()
    keyed = [ln.partition("\t") for ln in lines]  # (key, tab, command)
    if split := [k for k, _, _ in keyed if ENGINE_PART.fullmatch(k)]:
        # parts again would give a key two commands (the runner runs both) and a backend two parts
        raise ValueError(f"the commands are split already ({' '.join(split)}): split the whole")
    whole = next((c for k, _, c in keyed if k == "bench_engine"), "")
    found = re.search(r"--backends (.+?) --", whole)
    if found is None:
        raise ValueError("no bench_engine command with --backends")
    backends, named = found[1].split(), {}
    for part in parts:
        name, _, given = part.partition("=")
        if not re.fullmatch(r"\w+", name) or name == "rest" or name in named or not given.split():
            raise ValueError(f"{part!r}: give NAME=BACKENDS, each NAME a word other than rest")
        named[name] = given.split()
    taken = [b for each in named.values() for b in each]
    unknown = [b for b in taken if b not in backends]
    if unknown or len(set(taken)) < len(taken):
        raise ValueError(f"not a split of {' '.join(backends)}: {' '.join(unknown or taken)}")
    if rest := [b for b in backends if b not in taken]:
        named["rest"] = rest
    for name, chosen in named.items():
        command = whole.replace(found[0], f"--backends {' '.join(chosen)} --")
        command = command.replace("engine/bench.json", f"engine/bench-{name}.json")
        command = command.replace("bench_engine.log", f"bench_engine-{name}.log")
        lines.append(f"bench_engine_{name}\t{command}")
    return "\n".join(lines) + "\n"


def calls(keys: list[str], like: Path, call_s: float) -> str:
    """One line per device call: its keys, then its estimate as a comment."""
    if not like.is_dir():
        sys.exit(f"no run folder {like}")
    seconds = point_seconds(like)
    packed, unknown = plan_calls(keys, seconds, call_s)
    lines = [
        f"{' '.join(c)}\t# call {i}: ~{sum(seconds[k] for k in c):.0f} s in {like}"
        for i, c in enumerate(packed, 1)
    ]
    return "\n".join(lines + [f"{k}\t# no time in {like}" for k in unknown])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description="Print a GPU study's measuring commands, as its rules would run them.",
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "config", nargs="?",
        help="a GPU study's config (config/h200.yaml), or several joined by ':' (an overlay last)",
    )  # fmt: skip
    p.add_argument(
        "--missing", nargs=2, type=Path, metavar=("COMMANDS", "RUN"),
        help="the keys of COMMANDS whose result the run folder RUN lacks yet",
    )  # fmt: skip
    p.add_argument(
        "--like", type=Path, metavar="EARLIER_RUN",
        help="with --missing: pack the keys into device calls by this run's point times",
    )  # fmt: skip
    p.add_argument("--call-s", type=float, default=400.0, help="seconds of points a call")
    p.add_argument(
        "--split-engine", nargs="+", metavar=("COMMANDS", "NAME=BACKENDS"),
        help="print COMMANDS with bench_engine also split into parts by its backends",
    )  # fmt: skip
    args = p.parse_args(argv)
    if sum(x is not None for x in (args.config, args.missing, args.split_engine)) != 1:
        p.error("give a config, --missing COMMANDS RUN or --split-engine COMMANDS NAME=BACKENDS")
    if args.like is not None and args.missing is None:
        p.error("--like plans what --missing finds: give --missing COMMANDS RUN")
    if not args.call_s > 0:
        p.error(f"--call-s must be > 0, not {args.call_s:g}")
    if args.split_engine:
        commands, *parts = args.split_engine
        if not Path(commands).is_file() or not parts:
            p.error(f"--split-engine: give a commands file and NAME=BACKENDS, not {commands}")
        try:
            print(split_engine(Path(commands).read_text(), parts), end="")
        except ValueError as exc:
            p.error(f"--split-engine: {exc}")
        return 0
    if args.missing:
        commands, run = args.missing
        if not commands.is_file():
            p.error(f"no commands file {commands}")
        if not run.is_dir():
            p.error(f"no run folder {run}")
        try:
            keys = missing(commands, run)
        except ValueError as exc:
            p.error(f"{commands}: {exc}")
        try:
            print(" ".join(keys) if args.like is None else calls(keys, args.like, args.call_s))
        except ValueError as exc:  # a file of the earlier run that gives no point's time
            p.error(f"--like: {exc}")
        return 0
    # the H100 study is config/h200.yaml:config/h100.yaml, as publish_study.sh is given it
    configs = [Path(c) for c in args.config.split(":")]
    if missing_file := next((c for c in configs if not c.is_file()), None):
        p.error(f"no config file {missing_file}")
    lines = []
    for command in re.findall(r"^Shell command: (.*)$", dry_run(*configs), re.M):
        if "--skip-reason" in command:
            sys.exit(f"a peer is missing here, so the plan skips a point: {command[:200]}...")
        if (name := key(command)) is not None:
            lines.append(f"{name}\t{command}")
    print("\n".join(sorted(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
