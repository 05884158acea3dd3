"""One server entry of ``sweep.servers``: its launch command, its KV pool, whether it runs here.

Functions take the validated ``sweep`` section (defaults filled in) and one of its servers.
"""

from __future__ import annotations

import re
import shlex
import string

from decodecliff.engine.config import EngineConfig
from decodecliff.kernels import registry

# Placeholders of a server command template: the server's settings (fields()) and the two the
# sweep runner fills per launch.
TEMPLATE_FIELDS = {
    "name", "preset", "device", "backend", "page_size", "chunk_size", "spec_mode", "draft_len",
    "tree_nodes", "switches", "args", "host", "port",
}  # fmt: skip
LAUNCH_FIELDS = {"host", "port"}
# The embedded server's KV pool on a CPU when its command sets no --max-total-tokens.
CPU_DEFAULT_POOL = EngineConfig.CPU_DEFAULT_TOKENS


class TemplateError(ValueError):
    """A command template that cannot be expanded."""


def template(sweep: dict, server: dict) -> str:
    """The server's own command template, else the sweep's."""
    return server.get("command") or sweep["command"]


def placeholders(text: str) -> set[str]:
    """The placeholder names of a template; TemplateError for one str.format cannot read."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as exc:
        raise TemplateError(
            f"not a valid template ({exc}); write {{{{ and }}}} for braces"
        ) from exc


def switches(server: dict) -> list[str]:
    """The `decodecliff serve` flags of the server's engine switches and backend options."""
    flags = [f"--{flag}" for flag in ("cuda-graph", "defrag") if server[flag.replace("-", "_")]]
    for key, value in server.get("backend_options", {}).items():
        flags += ["--backend-option", shlex.quote(f"{key}={value}")]
    return flags


def fields(sweep: dict, server: dict) -> dict[str, str]:
    """The values of the placeholders a command template may use, but {host} and {port}."""
    spec = server["spec"]
    return {
        "name": server["name"],
        "preset": sweep["preset"],
        "device": sweep["device"],
        "backend": server["backend"],
        "page_size": str(server["page_size"]),
        "chunk_size": str(server["chunk_size"]),
        "spec_mode": spec["mode"],
        "draft_len": str(spec["draft_len"]),
        "tree_nodes": str(spec["tree_nodes"]),
        "switches": " ".join(switches(server)),
        "args": server["args"],
    }


class _KeepLaunchFields(dict):
    """format_map mapping that leaves {host} and {port} (filled per launch) in place."""

    def __missing__(self, key: str) -> str:
        if key not in LAUNCH_FIELDS:
            raise KeyError(key)
        return f"{{{key}}}"


def _doubled(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class _LaunchTemplate(string.Formatter):
    """Fills a server's settings into its command template and gives a template again, of
    {host} and {port}, which the sweep runner formats per launch: a literal brace (written {{ or
    }} in the template, or in a value such as the args) stays doubled there, so it reaches the
    server as one brace."""

    def parse(self, format_string: str):
        for literal, name, spec, conversion in super().parse(format_string):
            yield _doubled(literal), name, spec, conversion

    def format_field(self, value: object, format_spec: str) -> str:
        text = _doubled(super().format_field(value, format_spec))
        for key in LAUNCH_FIELDS:  # the template's {host} / {port}, and those in args, stay fields
            text = text.replace(f"{{{{{key}}}}}", f"{{{key}}}")
        return text


def command(sweep: dict, server: dict) -> str:
    """The launch command with the server's settings filled in; {host} and {port} stay, and it
    is itself a template of those two (a literal brace doubled)."""
    try:
        text = _LaunchTemplate().vformat(
            template(sweep, server), (), _KeepLaunchFields(fields(sweep, server))
        )
    except (ValueError, IndexError, KeyError) as exc:
        raise TemplateError(f"bad command template of server {server['name']!r}: {exc}") from None
    return " ".join(text.split())


def target(sweep: dict, server: dict) -> str:
    """`decodecliff sweep`'s --server-cmd (launched and stopped around a point) or --url."""
    if server.get("url"):
        return f"--url {shlex.quote(server['url'])}"
    return f"--server-cmd {shlex.quote(command(sweep, server))}"


def concurrency(sweep: dict, server: dict) -> int:
    """Streams per round of the server's points: its own setting, else the sweep's."""
    return server.get("concurrency") or sweep["concurrency"]


def draft_reserve(server: dict) -> int:
    """KV slots a verify step takes beyond a request's output: its draft tokens but one (what
    the sweep reads from a running server's speculative_num_draft_tokens)."""
    spec = server["spec"]
    return {"none": 1, "chain": spec["draft_len"], "tree": spec["tree_nodes"]}[spec["mode"]] - 1


def pool_tokens(sweep: dict, server: dict) -> int | None:
    """The server's KV pool when the config fixes it (--max-total-tokens in its command, or the
    embedded server's CPU default), in whole pages; None when it depends on the GPU's memory.
    Read from the command it is launched with: its args count only where the template puts
    {args}."""
    text = command(sweep, server)
    found = re.findall(r"--max-total-tokens[ =]+(\d+)", text)
    if found:
        tokens = int(found[-1])
    elif "decodecliff serve" in text and sweep["device"] == "cpu":
        tokens = CPU_DEFAULT_POOL
    else:
        return None
    return tokens // server["page_size"] * server["page_size"]


def skip_reason(sweep: dict, server: dict) -> str | None:
    """Why the server cannot be launched on this machine (its backend needs a GPU the study's
    device is not, or a package not installed), or None. A server given by URL runs elsewhere."""
    if server.get("url"):
        return None
    return registry.unavailable(server["backend"], sweep["device"])
