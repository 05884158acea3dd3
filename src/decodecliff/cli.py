"""`decodecliff <command> ...`: each command lives in the module that owns the concept.

The top level only dispatches: a command's own options are parsed by its module's ``cli(argv)``,
imported when the command runs, so `decodecliff --help` never imports torch. An option error
(a mistyped command, backend or preset) is one line naming the valid values, the closest first.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from decodecliff import __version__, helpformat

COMMANDS = {
    "build-kernel": ("decodecliff.kernels.build", "build the custom CUDA kernel library (nvcc)"),
    "bench-kernels": (
        "decodecliff.bench.kernels",
        "time the attention backends against the roofline",
    ),
    "check-kernel": (
        "decodecliff.bench.check_kernel",
        "check the custom kernel on a GPU: correctness, planted masks, sanitizers, timing",
    ),
    "bench-engine": ("decodecliff.bench.engine", "a verify step's anatomy beside its floor"),
    "bench-load": ("decodecliff.bench.load", "the server under concurrent streams and disconnects"),
    "serve": ("decodecliff.server.cli", "serve the synthetic MLA model over SGLang's HTTP API"),
    "sweep": ("decodecliff.sweep.cli", "run a chunked context sweep against a server"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="decodecliff",
        description="Long-context MLA verify decode: kernels, engine, server, sweep.",
        epilog="Run `decodecliff <command> --help` for a command's options.",
    )
    top.add_argument("--version", action="version", version=f"decodecliff {__version__}")
    commands = top.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, (_, help_) in COMMANDS.items():
        # The command's module parses its own options (and answers its own --help).
        commands.add_parser(name, help=help_, add_help=False)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    helpformat.install()  # an option error in one line: a mistyped name gets the valid ones
    args, rest = parser().parse_known_args(argv[:1])  # exits 2 on an unknown command
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.cli(argv[1:] + rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
