"""`decodecliff <command> ...`: each command lives in the module that owns the concept."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "build-kernel": ("decodecliff.kernels.build", "build the custom CUDA kernel library (nvcc)"),
    "bench-kernels": (
        "decodecliff.bench.kernels",
        "time the attention backends against the roofline",
    ),
    "serve": ("decodecliff.server.app", "serve the synthetic MLA model over SGLang's HTTP API"),
    "sweep": ("decodecliff.sweep.cli", "run a chunked context sweep against a server"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        lines = [f"  {name:<14} {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: decodecliff <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.cli(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
