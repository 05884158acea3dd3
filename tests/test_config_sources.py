"""Each setting is defined once: EngineConfig for the server (its `serve` options are made from
it), SweepConfig for the sweep, analysis.targets for the target kinds; the study's config schema
repeats what it exposes and must agree. The option help answers without torch."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from decodecliff.analysis import targets
from decodecliff.engine.config import (
    DEVICES,
    PREFILL_ATTENTION,
    PRESETS,
    SPEC_MODES,
    EngineConfig,
    options,
)
from decodecliff.kernels.registry import BACKENDS
from decodecliff.server import cli as serve_cli
from decodecliff.sweep import cli as sweep_cli
from decodecliff.sweep.runner import SweepConfig

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
DEFS = SCHEMA["$defs"]
SWEEP = SCHEMA["properties"]["sweep"]["properties"]
ENGINE = {f.name: f for f in fields(EngineConfig)}
# Every option `decodecliff serve` had when its parser was written out by hand.
SERVE_FLAGS = [
    "--preset", "--backend", "--device", "--dtype", "--host", "--port", "--page-size",
    "--chunk-size", "--prefill-attention", "--max-total-tokens", "--mem-fraction",
    "--max-running-requests", "--spec", "--draft-len", "--tree-nodes", "--cuda-graph", "--defrag",
    "--defrag-threshold", "--defrag-interval", "--scatter-seed", "--seed", "--threads",
    "--log-level",
]  # fmt: skip


def _default(cls: type, name: str) -> object:
    return next(f.default for f in fields(cls) if f.name == name)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def test_schema_server_settings_are_the_engines() -> None:
    own = {name for name, (module, _) in BACKENDS.items() if not module.endswith(".peers")}
    assert set(DEFS["backend"]["enum"]) == own
    # a server (and the engine bench) may also run a peer's attention
    assert own < set(DEFS["engine_backend"]["enum"]) <= set(BACKENDS)
    # the engine bench's specs name the same backends, with options
    names = DEFS["engine_backend_spec"]["pattern"].split("(")[1].split(")")[0].split("|")
    assert names == DEFS["engine_backend"]["enum"]
    kernels = SCHEMA["properties"]["kernels"]["properties"]["backends"]["items"]["enum"]
    assert set(kernels) == set(BACKENDS)
    assert tuple(DEFS["device"]["enum"]) == DEVICES == ENGINE["device"].metadata["choices"]
    for section in ("engine", "sweep"):
        preset = SCHEMA["properties"][section]["properties"]["preset"]["enum"]
        assert sorted(preset) == sorted(PRESETS)
    spec = DEFS["spec"]["properties"]
    assert tuple(spec["mode"]["enum"]) == SPEC_MODES
    for key in ("draft_len", "tree_nodes"):
        meta, bounds = ENGINE[key].metadata, DEFS.get(key, spec[key])
        assert (bounds["minimum"], bounds["maximum"]) == (meta["min"], meta["max"]), key
        assert spec[key]["default"] == ENGINE[key].default, key
    # the engine bench's chain takes the servers' draft lengths
    engine = SCHEMA["properties"]["engine"]["properties"]["draft_len"]
    assert engine["$ref"] == spec["draft_len"]["$ref"] == "#/$defs/draft_len"
    server = DEFS["server"]["properties"]
    assert server["chunk_size"]["default"] == ENGINE["chunk_size"].default
    for key in ("chunk_size", "page_size"):
        assert DEFS["positive_int"]["minimum"] == ENGINE[key].metadata["min"], key
    for key in ("cuda_graph", "defrag"):
        assert server[key]["default"] is ENGINE[key].default is False, key


def test_configured_prefill_attention_is_a_choice_of_the_server() -> None:
    modes = set()
    for path in [REPO / "config.yaml", *sorted((REPO / "config").glob("*.yaml"))]:
        cfg = yaml.safe_load(path.read_text())
        for server in cfg.get("sweep", {}).get("servers", []):  # an overlay may name none
            modes |= set(re.findall(r"--prefill-attention[ =](\S+)", server.get("args", "")))
    assert modes and modes <= set(PREFILL_ATTENTION)


def test_sweep_defaults_agree_with_the_schema() -> None:
    assert SWEEP["start_timeout_s"]["default"] == _default(SweepConfig, "start_timeout_s")
    assert SWEEP["concurrency"]["default"] == _default(SweepConfig, "concurrency")
    flags = _flags(sweep_cli._parser())
    same = {"--start-timeout": "start_timeout_s", "--concurrency": "concurrency"}
    same |= {"--gen-tokens": "gen_tokens", "--requests-per-point": "requests_per_point"}
    same |= {"--warmup-tokens": "warmup_tokens", "--stop-grace": "stop_grace_s"}
    for flag, name in same.items():
        assert flags[flag].default == _default(SweepConfig, name), flag


def test_target_kinds_and_fields_agree_with_the_schema() -> None:
    target = DEFS["target"]
    assert tuple(target["properties"]["kind"]["enum"]) == targets.KINDS
    needs = {}
    for rule in target["allOf"]:
        for kind in rule["if"]["properties"]["kind"]["enum"]:
            needs[kind] = tuple(rule["then"]["required"])
    assert needs == targets.NEEDS
    known = {f.name: f.default for f in fields(targets.Target)}
    assert set(target["properties"]) == set(known)
    for key, prop in target["properties"].items():
        if "default" in prop:
            assert prop["default"] == known[key], key


def test_serve_options_are_the_engine_config_fields() -> None:
    parser = serve_cli.parser()
    flags = _flags(parser)
    assert set(SERVE_FLAGS) <= set(flags)
    for f in options():
        action = flags["--" + f.name.replace("_", "-")]
        assert action.dest == f.name and action.default == f.default, f.name
        assert action.choices == f.metadata.get("choices"), f.name
    # no options at all: the engine's own defaults (the device resolved separately)
    assert EngineConfig.from_args(parser.parse_args([]), device="cpu") == EngineConfig()
    argv = ["--spec", "tree", "--tree-nodes", "32", "--defrag", "--max-total-tokens", "4096"]
    argv += ["--dtype", "float64", "--threads", "2", "--prefill-attention", "mha"]
    cfg = EngineConfig.from_args(parser.parse_args(argv), device="cpu")
    assert (cfg.spec, cfg.tree_nodes, cfg.defrag, cfg.max_total_tokens) == ("tree", 32, True, 4096)
    assert (cfg.dtype, cfg.threads, cfg.prefill_attention) == ("float64", 2, "mha")
    with pytest.raises(SystemExit):  # one pool size, not two
        parser.parse_args(["--max-total-tokens", "4096", "--mem-fraction", "0.5"])


def test_validate_checks_the_limits_the_options_declare() -> None:
    for key, bad in (("draft_len", 65), ("tree_nodes", 8), ("chunk_size", 0), ("spec", "beam")):
        with pytest.raises(ValueError, match=key.replace("_", " ")):
            EngineConfig(**{key: bad}).validate()
    with pytest.raises(ValueError, match="backend must be one of"):
        EngineConfig(backend="nope").validate()


@pytest.mark.parametrize("command", ["serve", "sweep"])
def test_help_answers_without_torch_and_shows_every_default(command: str) -> None:
    probe = (
        "import sys; from decodecliff import cli\n"
        f"try:\n    cli.main([{command!r}, '--help'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('torch' in sys.modules, code)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("False 0"), done.stdout + done.stderr
    assert f"usage: decodecliff {command}" in done.stdout
    parser = serve_cli.parser() if command == "serve" else sweep_cli._parser()
    assert "``" not in (parser.description or "") + (parser.epilog or "")
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and "``" not in action.help, action.dest
        shown = parser.formatter_class("x")._get_help_string(action)
        # a default shown, or (no default to show) what happens without the option said
        assert action.required or "default" in shown or action.dest in ("server_cmd", "url"), (
            action.dest
        )


def test_the_api_key_s_variable_is_named_once(monkeypatch) -> None:
    """The variable whose key `decodecliff serve` requires, the sweep sends and the config check
    names: one name, serve's, which the others import."""
    from decodecliff.study import config
    from decodecliff.sweep import launcher

    name = serve_cli.API_KEY_ENV
    monkeypatch.setenv(name, "s3cret")
    assert serve_cli.parser().parse_args([]).api_key == "s3cret"
    assert launcher.auth() == {"Authorization": "Bearer s3cret"}
    cfg = config.merged([REPO / "config.yaml"])
    cfg["sweep"]["servers"][0]["args"] = "--api-key s3cret"
    with pytest.raises(config.ConfigError, match=re.escape(f"set ${name}, which both read")):
        config.validate(cfg)
    written = {p.relative_to(REPO).as_posix(): p.read_text().count(name)
               for p in (REPO / "src").rglob("*.py") if name in p.read_text()}  # fmt: skip
    assert written == {"src/decodecliff/server/cli.py": 1}
