"""The study config: loaded from YAML, validated against the schema, checked beyond it.

The schema (workflow/schemas/config.schema.yaml) is the one definition of the keys, their limits
and their defaults: validation fills every missing key that has a default, as Snakemake's
``validate(..., set_default=True)`` does. A failure is a ConfigError naming the offending key
and, given the YAML files the config was merged from, the file and line that set it (the last
file that sets the key, else its nearest parent), e.g. ``invalid study config at
config.sweep.servers[0].spec.mode (config/h200.yaml, line 57): 'beam' is not one of ...``.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import yaml
from jsonschema import Draft202012Validator

from decodecliff.engine.config import DEFAULT_GEMM, EngineConfig
from decodecliff.helpformat import did_you_mean
from decodecliff.kernels import registry
from decodecliff.study import servers as srv
from decodecliff.values import is_finite_number, is_int, is_server_url

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

# The checkout's schema; the workflow passes its own copy's path (the same file).
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config mistake, found before any job runs; the message names the key (and, where known,
    the file and line that set it)."""

    def __init__(self, where: str, why: str, source: str | None = None) -> None:
        self.where, self.why, self.source = where, why, source
        at = f"{where} ({source})" if source else where
        super().__init__(f"invalid study config at {at}: {why}")

    def located(self, files: Sequence[str | Path], overrides: dict | None = None) -> ConfigError:
        """The same error with the file and line of its key among ``files`` (merged in order), or
        "--config" where ``overrides`` (Snakemake's --config values, applied last) set it."""
        if overrides and _sets(overrides, _parts(self.where)):
            # Snakemake gives a --config value below the top level as a string, whatever it reads
            nested = len(_parts(self.where)) > 1
            hint = (
                "; nested values given there arrive as strings: set nested keys in a --configfile"
            )
            source = "--config" + (hint if nested else "")
            return ConfigError(self.where, self.why, source)
        return ConfigError(self.where, self.why, locate(self.where, files) or self.source)


def _sets(overrides: dict, parts: list[str | int]) -> bool:
    """Whether ``overrides`` set the key at ``parts``: Snakemake merges a --config mapping into
    the files' values key by key, and a list or a scalar replaces the value it lands on whole."""
    node: object = overrides
    for part in parts:
        if not isinstance(node, dict):
            return True  # a list or a scalar above the key: the key's value is the override's
        if part not in node:
            return False
        node = node[part]
    return True


def _parts(where: str) -> list[str | int]:
    """[sweep, servers, 0, spec, mode] of `config.sweep.servers[0].spec.mode`."""
    return [
        int(index) if index else key
        for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", where.removeprefix("config"))
    ]


def _depth(node: yaml.Node | None, parts: list[str | int]) -> tuple[int, int, bool]:
    """(how many of ``parts`` the YAML node tree holds, the line of the deepest one, whether it
    sets a list on the way: the merge takes such a list whole from the last file that sets it)."""
    depth, line, sets_list = 0, 0, False
    for part in parts:
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if k.value == part]
            if not found:
                break
            key, node = found[-1]
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            sets_list = True
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
        depth += 1
    return depth, line, sets_list


def locate(where: str, files: Sequence[str | Path]) -> str | None:
    """'config/h200.yaml, line 57': where the key at ``where`` (or its nearest parent) is set,
    the later of ``files`` winning as in the merge (a list on the way is the last file's, whole);
    None where no file sets any of it."""
    parts, best = _parts(where), (0, None, 0)
    for path in files:
        try:
            node = yaml.compose(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue
        depth, line, sets_list = _depth(node, parts)
        if depth and (sets_list or depth >= best[0]):
            best = (depth, path, line)
    depth, path, line = best
    return f"{path}, line {line}" if path else None


def check_syntax(path: str | Path) -> None:
    """ConfigError naming the file and line of a YAML syntax error in ``path``."""
    try:
        yaml.safe_load(Path(path).read_text())
    except yaml.MarkedYAMLError as exc:
        mark, opened = exc.problem_mark or exc.context_mark, exc.context_mark
        where = f"{path}, line {mark.line + 1}" if mark else str(path)
        why = f"not valid YAML: {exc.problem or exc}"
        if opened and mark and opened.line != mark.line:  # e.g. a list left open lines before
            why += f" ({exc.context} from line {opened.line + 1})"
        raise ConfigError(where, why) from None


def load_schema(path: str | Path = SCHEMA) -> dict:
    return yaml.safe_load(Path(path).read_text())


def merge(base: dict, update: dict) -> dict:
    """``update`` over ``base`` as Snakemake merges config files: mappings key by key, anything
    else (lists included) replaced whole."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            value = merge(out[key], value)
        out[key] = value
    return out


def load(paths: Iterable[str | Path], schema: str | Path = SCHEMA) -> dict:
    """The validated config of YAML files given in order (config.yaml, then presets); an error
    names the file and line that set the offending key."""
    paths = list(paths)
    return validate(merged(paths), schema, paths)


def merged(paths: Iterable[str | Path]) -> dict:
    """YAML files given in order, each over the ones before it as Snakemake merges them; their
    syntax checked, their values not validated."""
    cfg: dict = {}
    for path in paths:
        check_syntax(path)
        cfg = merge(cfg, yaml.safe_load(Path(path).read_text()) or {})
    return cfg


# Numbers finite (a bound cannot judge NaN) and integers written as integers: JSON Schema counts
# 6.0 as an integer, but the commands the rules format from it (``--gen-tokens 6.0``) do not.
STRICT_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"number": lambda _, v: is_finite_number(v), "integer": lambda _, v: is_int(v)}
)


def _with_defaults(validator_class: type) -> type:
    """The validator class that sets each missing property's schema default as it validates
    (python-jsonschema's FAQ recipe, which Snakemake's validate uses), with numbers finite and
    integers written as integers."""
    check_properties = validator_class.VALIDATORS["properties"]

    def properties(validator: Validator, props: dict, instance: object, schema: dict) -> Iterator:
        if isinstance(instance, dict):
            for key, sub in props.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])  # never the schema's own list
        yield from check_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(
        validator_class, {"properties": properties}, type_checker=STRICT_TYPES
    )


def _json_path(path: Iterable) -> str:
    """`config.sweep.servers[1].spec.mode` for the jsonschema path [sweep, servers, 1, ...]."""
    out = "config"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def explain(err: jsonschema.ValidationError) -> ConfigError:
    """The ConfigError of a schema violation, naming the offending key."""
    where = _json_path(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = list(err.schema.get("properties", {}))
        unknown = [key for key in err.instance if key not in allowed]
        return ConfigError(
            f"{where}.{unknown[0]}", f"unknown key (allowed here: {', '.join(allowed)})"
        )
    if err.validator == "required":
        missing = [key for key in err.validator_value if key not in err.instance]
        return ConfigError(f"{where}.{missing[0]}", "missing (it is required)")
    if err.validator == "not":
        return ConfigError(where, "give either command or url, not both")
    if err.validator == "type" and isinstance(err.instance, float):
        if not math.isfinite(err.instance):
            return ConfigError(where, f"{err.instance} is not a finite number")
        if err.instance.is_integer() and "integer" in str(err.validator_value):
            whole = int(err.instance)
            return ConfigError(where, f"{err.instance} is not an integer: write {whole}")
    return ConfigError(where, err.message)


def validate(
    cfg: dict,
    schema: str | Path = SCHEMA,
    files: Sequence[str | Path] = (),
    overrides: dict | None = None,
) -> dict:
    """Fill in the schema's defaults (in place), validate, then run the checks a schema cannot
    express; returns ``cfg``. ConfigError names the first offending key, and the file and line
    that set it where ``files`` (the YAML files merged into ``cfg``, in order) are given, or
    --config where ``overrides`` (its values) set it."""
    if cfg.get("published") == "null":  # Snakemake's --config has no null: published=null
        cfg["published"] = None
    try:
        try:
            _with_defaults(Draft202012Validator)(load_schema(schema)).validate(cfg)
        except jsonschema.ValidationError as err:
            raise explain(err) from None
        check(cfg)
    except ConfigError as err:
        raise err.located(files, overrides) if files or overrides else err from None
    return cfg


def check(cfg: dict) -> None:
    """What the schema cannot say: the kernel modes' sizes, unique names and points, timeouts,
    backend options, templates, KV pools, the servers targets name, and what the engine bench can
    run on its device."""
    _check_gpu_study(cfg)
    _check_name(cfg["study"]["name"], "config.study.name", "study name")
    _check_kernel_modes(cfg["kernels"]["modes"])
    sweep = cfg["sweep"]
    names = [server["name"] for server in sweep["servers"]]
    for i, server in enumerate(sweep["servers"]):
        key = f"config.sweep.servers[{i}]"
        if server["name"] in names[:i]:
            raise ConfigError(
                f"{key}.name",
                f"server name {server['name']!r} is used twice (names must be unique)",
            )
        _check_name(server["name"], f"{key}.name", "server name")
        _check_points(server, key)
        # A GPU-only backend's server is recorded as skipped on a CPU: its switches never run.
        gpu_only = server["backend"] in registry.GPU_ONLY
        if server["cuda_graph"] and sweep["device"] != "cuda" and not gpu_only:
            raise ConfigError(f"{key}.cuda_graph", "CUDA graphs need sweep.device: cuda")
        try:
            # as the server reads them from its command line (--backend-option KEY=VALUE)
            given = {
                k: registry.option_value(k, str(v)) for k, v in server["backend_options"].items()
            }
            registry.check_options(server["backend"], given)
        except ValueError as exc:
            raise ConfigError(f"{key}.backend_options", str(exc)) from None
        if server.get("url") and not is_server_url(server["url"]):
            why = f"{server['url']!r} is no http(s)://HOST[:PORT][/PREFIX]"
            raise ConfigError(f"{key}.url", why)
        if server.get("url") and server["backend_options"]:
            why = (
                "a server given by url runs with the options it was started with: the sweep "
                "passes --backend-option only to a server it launches (start that server with "
                "them, and drop them here)"
            )
            raise ConfigError(f"{key}.backend_options", why)
        if not server.get("url"):
            _check_template(sweep, server, key)
            if not (gpu_only and sweep["device"] != "cuda"):  # else recorded as skipped
                _check_serve_options(sweep, server, key)
            _check_pool(sweep, server, key)
    for i, target in enumerate(cfg.get("targets", [])):
        for field in ("server", "baseline_server"):
            name = target.get(field)
            if name and name not in names:
                why = f"no server {name!r} in the sweep; {did_you_mean(name, names)}"
                raise ConfigError(f"config.targets[{i}].{field}", why)
    engine = cfg.get("engine", {})
    if "graphs" in engine.get("paths", []) and engine["device"] != "cuda":
        raise ConfigError("config.engine.paths", "CUDA graphs (graphs) need engine.device: cuda")
    if set(engine.get("gemms", [])) - {DEFAULT_GEMM} and engine["device"] != "cuda":
        why = f"GEMM paths other than {DEFAULT_GEMM} need engine.device: cuda"
        raise ConfigError("config.engine.gemms", why)
    for i, spec in enumerate(engine.get("backends", [])):
        try:
            registry.parse_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"config.engine.backends[{i}]", str(exc)) from None
    _check_sm120_model(cfg)  # after the specs it parses are checked


# Names pandas reads from a CSV cell (and papermill from a -p value) as other than text: missing
# values and booleans, beside whatever float() takes (64, 1e3, nan, inf).
NOT_TEXT = {"na", "null", "none", "true", "false"}


def _reads_back_as_text(name: str) -> bool:
    """Whether a name reads back as itself from the summary CSV and a notebook's -p."""
    try:
        float(name)
    except ValueError:
        return name.lower() not in NOT_TEXT
    return False


def check_inputs(
    cfg: dict, workdir: str | Path, files: Sequence[str | Path] = (), overrides: dict | None = None
) -> None:
    """The files the config names as inputs exist under ``workdir`` (Snakemake's): a missing
    reference table would otherwise stop the run with Snakemake's MissingInputException, which
    names the rule needing it, not the key that set it."""
    path = Path(workdir) / cfg["reference"]
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        err = ConfigError("config.reference", f"{cfg['reference']}: {what} under {workdir}")
        raise err.located(files, overrides) if files or overrides else err


def published_warning(cfg: dict, workdir: str | Path) -> str | None:
    """One line where ``published`` names a folder that is not there: the report then shows no
    published study, which a mistyped path would do without a word. A warning, not an error:
    a copy of the workflow without the published results (a cluster's work folder, a study not
    yet published) is run on purpose."""
    published = cfg.get("published")
    if not published:
        return None
    root = Path(workdir) / published
    if not root.is_dir():
        return (
            f"published: {published}: no such study folder under {workdir}; the report shows no "
            "published study (published: null says so on purpose)"
        )
    if is_study_folder(root):
        return None
    # e.g. results/published, the folder of the published studies, named for one of them
    inside = [f"{published.rstrip('/')}/{sub.name}" for sub in sorted(root.iterdir())]
    inside = [name for name in inside if is_study_folder(Path(workdir) / name)]
    return (
        f"published: {published}: no study (no kernels/bench.json or summary/kernels.csv, or no "
        "sweep/<server>/ctx<N>.json or summary/sweep.csv); the report shows no published study"
        + (f"; {did_you_mean(published, inside)}" if inside else "")
    )


# What a study folder holds, either form of each part (summarize.load_study reads both).
STUDY_PARTS = (
    ("kernels/bench.json", "summary/kernels.csv"),
    ("sweep/*/ctx*.json", "summary/sweep.csv"),
)


def is_study_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a study's kernel and sweep results, raw or summarised: the notebooks
    draw a folder without them as a study of empty tables, and fail on them."""
    root = Path(path)
    return root.is_dir() and all(
        any(next(root.glob(pattern), None) for pattern in part) for part in STUDY_PARTS
    )


def _check_points(server: dict, key: str) -> None:
    """Each context once per server; no request allowed longer than the job around it."""
    seen: set[int] = set()
    for j, chunk in enumerate(server["chunks"]):
        for ctx in chunk["contexts"]:
            if ctx in seen:
                raise ConfigError(
                    f"{key}.chunks[{j}].contexts",
                    f"context {ctx} appears in more than one chunk of server {server['name']!r}",
                )
            seen.add(ctx)
        if chunk["point_timeout_s"] > chunk["timeout_s"]:
            raise ConfigError(
                f"{key}.chunks[{j}].point_timeout_s",
                f"{chunk['point_timeout_s']:g} s is longer than the chunk's timeout_s "
                f"({chunk['timeout_s']:g} s), which covers server start, every request and stop",
            )


def _check_sm120_model(cfg: dict) -> None:
    """build.sm120_model is one of the architectures built, and set wherever the sm_120 model
    runs: the kernel bench's timing of it, or a backend with model=sm120 (a sweep server or an
    engine bench configuration, on cuda: elsewhere it is recorded as skipped), which loads the
    sm_120-model library or preloads its shim."""
    arch, archs = cfg["build"].get("sm120_model"), cfg["build"]["archs"]
    if arch is not None and arch not in archs:
        why = f"{arch} is not among build.archs ({', '.join(map(str, archs))}): add it there"
        raise ConfigError("config.build.sm120_model", why)
    if arch is not None:
        return
    why = "the sm_120 model needs its library: set build.sm120_model to the GPU's architecture "
    why += "(90 for an H200)"
    if cfg["kernels"].get("sm120_model"):
        raise ConfigError("config.kernels.sm120_model", why)
    sweep = cfg["sweep"]
    for i, server in enumerate(sweep["servers"]):  # one given by url has no options (check)
        if server["backend_options"].get("model") == "sm120" and sweep["device"] == "cuda":
            raise ConfigError(f"config.sweep.servers[{i}].backend_options", why)
    engine = cfg.get("engine", {})
    for i, spec in enumerate(engine.get("backends", [])):
        if engine["device"] == "cuda" and registry.parse_spec(spec)[1].get("model") == "sm120":
            raise ConfigError(f"config.engine.backends[{i}]", why)


# The sizes of the verify step a kernel mode times, as the engine takes them: chainN a chain of
# --draft-len N tokens, treeN a tree of --tree-nodes N nodes.
MODE_SIZES = {"chain": "draft_len", "tree": "tree_nodes"}


def _check_kernel_modes(modes: list[str]) -> None:
    """Each chainN and treeN of kernels.modes is a verify step the engine runs (the schema says
    only that N is a positive number)."""
    meta = {f.name: f.metadata for f in fields(EngineConfig)}
    ranges = {kind: (meta[name]["min"], meta[name]["max"]) for kind, name in MODE_SIZES.items()}
    for i, mode in enumerate(modes):
        match = re.fullmatch(r"(chain|tree)(\d+)", mode)  # else decode: the schema says so
        if not match or ranges[match[1]][0] <= int(match[2]) <= ranges[match[1]][1]:
            continue
        allowed = ", ".join(
            f"{k}{low}..{k}{high} (the engine's --{MODE_SIZES[k].replace('_', '-')} range)"
            for k, (low, high) in ranges.items()
        )
        why = f"{mode}: no server verifies it; the modes are decode, {allowed}"
        raise ConfigError(f"config.kernels.modes[{i}]", why)


def _check_name(name: str, key: str, what: str) -> None:
    """A name results use as text must read back as text."""
    if not _reads_back_as_text(name):
        why = (
            f"{what} {name!r} reads as a number or a missing value in the summary tables and "
            f"notebook parameters; give it a letter (e.g. 'p{name}')"
        )
        raise ConfigError(key, why)


def _check_gpu_study(cfg: dict) -> None:
    """A study that names its GPU measures on it: a preset's overlay given alone (config/h100.yaml
    without config/h200.yaml) would name a GPU over the CPU study's devices."""
    gpu = cfg["study"].get("gpu")
    if not gpu:
        return
    for part in ("kernels", "sweep", "engine"):
        device = cfg.get(part, {}).get("device", "cuda")
        if device != "cuda":
            why = (
                f"a study on an {gpu} measures on cuda, but {part}.device is {device}: an overlay "
                "of a preset goes after it (--configfile config/h200.yaml config/h100.yaml)"
            )
            raise ConfigError("config.study.gpu", why)


def _check_template(sweep: dict, server: dict, key: str) -> None:
    """The launch template names only known placeholders and gets a {port} for every launch."""
    where = f"{key}.command" if server.get("command") else "config.sweep.command"
    try:
        names = srv.placeholders(srv.template(sweep, server))
    except srv.TemplateError as exc:
        raise ConfigError(where, str(exc)) from None
    unknown = sorted(names - srv.TEMPLATE_FIELDS)
    if unknown:
        known = ", ".join(f"{{{n}}}" for n in sorted(srv.TEMPLATE_FIELDS))
        raise ConfigError(where, f"unknown placeholder {{{unknown[0]}}} (known: {known})")
    if "port" not in names:
        raise ConfigError(where, "the template has no {port}: every launch gets a free port there")


def _check_serve_options(sweep: dict, server: dict, key: str) -> None:
    """A `decodecliff serve` command parses as serve parses it, its values in range: a typo fails
    here, not as a server that exits at every point. The command without the server's args is
    checked first, so a mistake is laid at the template's door or the args', where it is."""
    from decodecliff.server import cli as serve  # its parser, not the server
    from decodecliff.sweep.launcher import render_command  # as the sweep launches it

    template = f"{key}.command" if server.get("command") else "config.sweep.command"
    for where, entry in ((template, {**server, "args": ""}), (f"{key}.args", server)):
        try:
            words = render_command(srv.command(sweep, entry), "127.0.0.1", 0)[1]
        except ValueError as exc:  # an unbalanced quote
            raise ConfigError(where, f"the launch command does not parse: {exc}") from None
        at = next((i for i, w in enumerate(words[:-1]) if w.endswith("decodecliff") and
                   words[i + 1] == "serve"), None)  # fmt: skip
        if at is None:
            return  # another server's command (SGLang's own, a script): its options are its own
        try:
            args = serve.check(words[at + 2 :], auto_device=sweep["device"])
        except ValueError as exc:
            raise ConfigError(where, f"decodecliff serve would refuse it: {exc}") from None
        if any(w == "--api-key" or w.startswith("--api-key=") for w in words[at + 2 :]):
            why = "--api-key: the sweep would send no key; "
            why += f"set ${serve.API_KEY_ENV}, which both read"
            raise ConfigError(where, why)
    _check_labels(sweep, server, key, args)  # as launched: the template with the args


# The settings a server's name stands for in the results (analysis.summarize labels its points
# with the backend, page size, spec, CUDA graphs and defrag read from the config), each as (its
# key under the server, the serve option it reaches the server as, the placeholder that puts it
# there: servers.fields, servers.switches). A spec's size counts in its mode only.
LABELS = (
    ("backend", "--backend", "backend"),
    ("page_size", "--page-size", "page_size"),
    ("chunk_size", "--chunk-size", "chunk_size"),
    ("spec.mode", "--spec", "spec_mode"),
    ("spec.draft_len", "--draft-len", "draft_len"),
    ("spec.tree_nodes", "--tree-nodes", "tree_nodes"),
    ("cuda_graph", "--cuda-graph", "switches"),
    ("defrag", "--defrag", "switches"),
    ("backend_options", "--backend-option", "switches"),
)
SPEC_SIZES = {"spec.draft_len": "chain", "spec.tree_nodes": "tree"}


def _check_labels(sweep: dict, server: dict, key: str, args: argparse.Namespace) -> None:
    """Every setting the server's points are labelled with reaches `decodecliff serve` as that
    value (``args``: its launch command as serve parses it): a template without {switches} or
    {page_size}, or args that set an option again, would run a server other than the one its
    results name."""
    from decodecliff.server import cli as serve

    defaults, mode = serve.parser(), server["spec"]["mode"]
    names = srv.placeholders(srv.template(sweep, server))
    for setting, flag, field in LABELS:
        if SPEC_SIZES.get(setting, mode) != mode:
            continue
        dest = flag[2:].replace("-", "_")
        want, got, default = server, getattr(args, dest), defaults.get_default(dest)
        for part in setting.split("."):
            want = want[part]
        if dest == "backend_option":  # KEY=VALUE, each value as serve reads it
            want = {k: registry.option_value(k, str(v)) for k, v in want.items()}
            got, default = dict(got), {}
        if want == got:
            continue
        if isinstance(got, dict):
            shown = " ".join(f"{k}={v}" for k, v in want.items()) or "none"
            given = " ".join(f"{flag} {k}={v}" for k, v in got.items())
        else:
            shown = str(want).lower() if isinstance(want, bool) else want
            given = flag if isinstance(got, bool) else f"{flag} {got}"
        runs = f"with {given}" if got or not isinstance(got, bool | dict) else f"without {flag}"
        place = "{switches}" if field == "switches" else f"{flag} {{{field}}}"
        fix = f"put {place} in the command"
        if got != default or field in names:  # the command or the args set it otherwise
            fix = f"drop {given} from its command and args; {place} in the command passes the "
            fix += "setting"
        why = f"{shown} here, but its command launches decodecliff serve {runs} ({fix})"
        raise ConfigError(f"{key}.{setting}", why)


def _check_pool(sweep: dict, server: dict, key: str) -> None:
    """Every point fits the server's KV pool (concurrency streams of prompt + generated tokens +
    a verify step's drafts), where the config fixes the pool; elsewhere the sweep checks it
    against the running server."""
    pool = srv.pool_tokens(sweep, server)
    if pool is None:
        return
    gen, k, name = sweep["gen_tokens"], srv.concurrency(sweep, server), server["name"]
    page = server["page_size"]
    if pool == 0:
        raise ConfigError(
            f"{key}.page_size", f"a page of {page} tokens is larger than server {name!r}'s KV pool"
        )
    drafts = srv.draft_reserve(server)
    also = f" + {drafts} draft tokens of a verify step" if drafts else ""
    held = f"{pool} tokens" if page == 1 else f"{pool} tokens in whole pages of {page}"
    for j, chunk in enumerate(server["chunks"]):
        for ctx in chunk["contexts"]:
            if ctx + gen + drafts > pool:
                raise ConfigError(
                    f"{key}.chunks[{j}].contexts",
                    f"context {ctx} + {gen} generated tokens{also} exceed the KV pool of "
                    f"server {name!r} ({held})",
                )
            if k * (ctx + gen + drafts) > pool:
                raise ConfigError(
                    f"{key}.concurrency",
                    f"{k} streams of {ctx} + {gen} tokens{also} exceed the KV pool of server "
                    f"{name!r} ({held})",
                )
