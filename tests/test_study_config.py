"""The study configuration (decodecliff.study) without Snakemake: loading and validating the
configs, defaults from the schema, server commands, skipped servers, point lookups."""

from __future__ import annotations

import copy
import importlib.util
import shlex
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from decodecliff.engine.config import DEFAULT_GEMM, GEMMS, EngineConfig
from decodecliff.kernels import registry
from decodecliff.study import config, notebooks, paths, servers
from decodecliff.study.plan import PointError, Study

REPO = Path(__file__).resolve().parents[1]
PRESETS = {
    "h200": [REPO / "config/h200.yaml"],
    "rtx-pro-6000": [REPO / "config/rtx-pro-6000.yaml"],
    "h100": [REPO / "config/h200.yaml", REPO / "config/h100.yaml"],  # an overlay of h200
}
PEERS = ("sglang-graph-p1", "flashinfer-graph-p1")


def study(preset: str | None = None) -> Study:
    files = [REPO / "config.yaml", *(PRESETS[preset] if preset else [])]
    return Study(config.load(files))


def raw(preset: str | None = None) -> dict:
    """The YAML of config.yaml (and a preset) merged, not validated."""
    return config.merged([REPO / "config.yaml", *(PRESETS[preset] if preset else [])])


def by_name(s: Study, name: str) -> dict:
    return s.servers[name]


@pytest.mark.parametrize("preset", [None, "h200", "rtx-pro-6000", "h100"])
def test_the_repository_configs_are_valid(preset: str | None) -> None:
    s = study(preset)
    assert set(PEERS) <= set(s.servers)
    assert len(s.point_files()) == sum(len(s.server_points(n)) for n in s.servers)


def test_the_h100_study_is_the_h200_study_under_its_own_name() -> None:
    h100, h200 = study("h100").config, study("h200").config
    assert (h100["study"]["name"], h200["study"]["name"]) == ("h100", "h200")
    assert (h100["study"]["gpu"], h200["study"]["gpu"]) == ("H100", "H200")
    assert {k: v for k, v in h100.items() if k != "study"} == {
        k: v for k, v in h200.items() if k != "study"
    }


def test_a_gpu_study_s_overlay_alone_is_refused() -> None:
    with pytest.raises(config.ConfigError, match="a study on an H100 measures on cuda") as err:
        config.load([REPO / "config.yaml", REPO / "config/h100.yaml"])
    assert err.value.where == "config.study.gpu"


def test_a_backend_run_as_on_sm120_needs_its_library_built() -> None:
    """model=sm120 (a sweep server's, an engine configuration's) loads the library and shim that
    only build.sm120_model builds: without it the config is refused, not every such point."""

    def sm120(server: dict) -> bool:
        return server.get("backend_options", {}).get("model") == "sm120"

    cfg = raw("h200")
    del cfg["build"]["sm120_model"]
    cfg["kernels"]["sm120_model"] = False
    servers = cfg["sweep"]["servers"]
    first = next(i for i, server in enumerate(servers) if sm120(server))
    with pytest.raises(config.ConfigError, match="set build.sm120_model") as err:
        Study(copy.deepcopy(cfg))
    assert err.value.where == f"config.sweep.servers[{first}].backend_options"
    cfg["sweep"]["servers"] = [server for server in servers if not sm120(server)]
    with pytest.raises(config.ConfigError, match="set build.sm120_model") as err:
        Study(copy.deepcopy(cfg))
    assert err.value.where == "config.engine.backends[1]"  # custom:model=sm120
    cfg["engine"]["backends"] = [b for b in cfg["engine"]["backends"] if "sm120" not in b]
    Study(cfg)  # nothing left that runs the model


def test_defaults_are_the_schemas_own() -> None:
    schema = config.load_schema()
    cfg = study().config
    sweep = schema["properties"]["sweep"]["properties"]
    assert cfg["sweep"]["concurrency"] == sweep["concurrency"]["default"]
    spec = schema["$defs"]["spec"]["properties"]
    server = cfg["sweep"]["servers"][0]
    assert server["spec"]["tree_nodes"] == spec["tree_nodes"]["default"]
    assert (server["cuda_graph"], server["defrag"], server["backend_options"]) == (False, False, {})
    # the default targets, each with the target's own defaults (heads, page size, ...) filled in
    defaults = schema["properties"]["targets"]["default"]
    for target, default in zip(cfg["targets"], defaults, strict=True):
        assert target.items() >= default.items() and target["heads"] == 8
    # a filled-in default is a copy: changing the config never changes the schema's
    cfg["targets"].clear()
    assert Study(raw()).config["targets"]


def test_defaults_are_read_from_the_schema_file(tmp_path: Path) -> None:
    schema = config.load_schema()
    schema["properties"]["sweep"]["properties"]["concurrency"]["default"] = 2
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    assert Study(raw(), path).sweep["concurrency"] == 2


def test_presets_replace_lists_whole_and_merge_mappings() -> None:
    merged = config.merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}})
    assert merged == {"a": {"x": 1, "y": [3]}, "b": 1}
    h200 = study("h200")
    assert h200.sweep["device"] == "cuda" and "torch-chain16-p1" not in h200.servers
    assert h200.sweep["command"] == raw()["sweep"]["command"]  # kept from config.yaml


def _set(path: str, value: object):
    """A change to a config: the key at ``path`` (dots and [i]) set to ``value``."""

    def change(cfg: dict) -> None:
        keys = path.replace("[", ".").replace("]", "").split(".")
        node = cfg
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        last = keys[-1]
        node[int(last) if last.isdigit() else last] = value

    return change


SERVE_ARGS = "sweep.servers[1].args"  # a Triton server, launched by decodecliff serve

BAD = {
    "minimum": (_set("sweep.gen_tokens", 0), "config.sweep.gen_tokens"),
    "one-token": (_set("sweep.gen_tokens", 1), "config.sweep.gen_tokens"),  # no verify step
    "unknown-key": (_set("kernels.devise", "cpu"), "config.kernels.devise"),
    "enum": (_set("sweep.servers[1].spec.mode", "beam"), "config.sweep.servers[1].spec.mode"),
    "backend": (_set("sweep.servers[0].backend", "cublas"), "config.sweep.servers[0].backend"),
    "duplicate-server": (
        _set("sweep.servers[1].name", "torch-chain16-p1"),
        "config.sweep.servers[1].name",
    ),
    "numeric-server-name": (_set("sweep.servers[1].name", "64"), "config.sweep.servers[1].name"),
    "float-server-name": (_set("sweep.servers[0].name", "1e3"), "config.sweep.servers[0].name"),
    "missing-value-server-name": (
        _set("sweep.servers[2].name", "NA"),
        "config.sweep.servers[2].name",
    ),
    "boolean-server-name": (_set("sweep.servers[1].name", "True"), "config.sweep.servers[1].name"),
    "numeric-study-name": (_set("study.name", "2026"), "config.study.name"),
    "float-study-name": (_set("study.name", "1e3"), "config.study.name"),
    "missing-value-study-name": (_set("study.name", "NA"), "config.study.name"),
    "duplicate-point": (
        lambda c: c["sweep"]["servers"][0]["chunks"].append(
            {"contexts": [256], "timeout_s": 10, "point_timeout_s": 5}
        ),
        "config.sweep.servers[0].chunks[1].contexts",
    ),
    "missing": (lambda c: c["build"].pop("archs"), "config.build.archs"),
    "no-port": (
        lambda c: c["sweep"].update(command=c["sweep"]["command"].replace("{port}", "8000")),
        "config.sweep.command",
    ),
    "unknown-placeholder": (
        _set("sweep.servers[0].command", "serve --port {port} {prot}"),
        "config.sweep.servers[0].command",
    ),
    "beyond-pool": (
        _set("sweep.servers[0].chunks[0].contexts", [65536]),
        "config.sweep.servers[0].chunks[0].contexts",
    ),
    "streams-beyond-pool": (
        _set("sweep.servers[2].chunks[0].contexts", [16384]),
        "config.sweep.servers[2].concurrency",
    ),
    "point-timeout-over-chunk": (
        _set("sweep.servers[0].chunks[0].point_timeout_s", 600),
        "config.sweep.servers[0].chunks[0].point_timeout_s",
    ),
    "graphs-on-cpu": (
        _set("sweep.servers[0].cuda_graph", True),
        "config.sweep.servers[0].cuda_graph",
    ),
    "backend-option-key": (
        _set("sweep.servers[4].backend_options", {"not a key": "x"}),
        "config.sweep.servers[4].backend_options",
    ),
    "drafts-beyond-pool": (  # fits without the 15 draft slots a chain16 step takes
        _set("sweep.servers[0].chunks[0].contexts", [servers.CPU_DEFAULT_POOL - 6 - 1]),
        "config.sweep.servers[0].chunks[0].contexts",
    ),
    "nan": (_set("sweep.start_timeout_s", float("nan")), "config.sweep.start_timeout_s"),
    "infinite": (
        _set("sweep.servers[0].chunks[0].timeout_s", float("inf")),
        "config.sweep.servers[0].chunks[0].timeout_s",
    ),
    "integer-as-float": (_set("sweep.gen_tokens", 6.0), "config.sweep.gen_tokens"),
    "context-as-float": (
        _set("sweep.servers[0].chunks[0].contexts", [256.0]),
        "config.sweep.servers[0].chunks[0].contexts[0]",
    ),
    "unknown-backend-option": (
        _set("sweep.servers[0].backend_options", {"foo": "bar"}),
        "config.sweep.servers[0].backend_options",
    ),
    "engine-backend-option": (
        _set("engine.backends", ["torch:foo=bar"]),
        "config.engine.backends[0]",
    ),
    "engine-draft-len": (_set("engine.draft_len", 100), "config.engine.draft_len"),
    "command-and-url": (_set("sweep.servers[0].url", "http://h:1"), "config.sweep.servers[0]"),
    "sm120-model-unbuilt": (_set("kernels.sm120_model", True), "config.kernels.sm120_model"),
    "sm120-model-arch-unbuilt": (_set("build.sm120_model", 89), "config.build.sm120_model"),
    # what `decodecliff serve` refuses fails here, not at every point as a server that exits
    **{
        f"serve-args-{name}": (_set(SERVE_ARGS, args), f"config.{SERVE_ARGS}")
        for name, args in {
            "choice": "--prefill-attention mah",
            "unknown": "--bogus",
            "type": "--max-total-tokens=abc",
            "nan": "--new-token-ratio nan",
            "body-limit-inf": "--max-request-mb inf",
            "body-limit-tiny": "--max-request-mb 1e-9",
            "quote": "--prefill-attention 'mha",
            "backend-option": "--backend-option decode=bogus",
            "help": "--help",
        }.items()
    },
    "backend-option-value": (
        _set("sweep.servers[1].backend_options", {"decode": "bogus"}),
        "config.sweep.servers[1].backend_options",
    ),
    "engine-backend-option-value": (
        _set("engine.backends", ["triton:decode=bogus"]),
        "config.engine.backends[0]",
    ),
    # values a bench refuses when its job runs (after the previous output is gone)
    "kernel-mode-chain0": (_set("kernels.modes", ["decode", "chain0"]), "config.kernels.modes[1]"),
    "kernel-triton-config": (
        _set("kernels.triton_configs", ["sm1"]),
        "config.kernels.triton_configs[0]",
    ),
    "target-server": (
        _set(
            "targets",
            [{"kind": "verify_steps_per_s", "ctx": 1024, "min": 1, "server": "torch-chian16-p1"}],
        ),
        "config.targets[0].server",
    ),
    "engine-graphs-on-cpu": (_set("engine.paths", ["graphs"]), "config.engine.paths"),
    "engine-gemm-on-cpu": (_set("engine.gemms", ["cublas", "fused"]), "config.engine.gemms"),
    "engine-backend-option-count": (
        _set("engine.backends", ["custom:num_splits=many"]),
        "config.engine.backends[0]",
    ),
    "serve-template": (
        lambda c: c["sweep"].update(command=c["sweep"]["command"] + " --page-size 0"),
        "config.sweep.command",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_config_mistake_names_its_key(name: str) -> None:
    change, key = BAD[name]
    cfg = raw()
    if name == "command-and-url":
        cfg["sweep"]["servers"][0]["command"] = cfg["sweep"]["command"]
    change(cfg)
    with pytest.raises(config.ConfigError, match=r"^invalid study config at ") as err:
        Study(cfg)
    assert str(err.value).startswith(f"invalid study config at {key}:"), str(err.value)


def test_a_reference_table_that_is_not_there_names_its_key_and_line(tmp_path: Path) -> None:
    preset = tmp_path / "study.yaml"
    preset.write_text("reference: data/reference/missing.csv\n")
    files = [REPO / "config.yaml", preset]
    cfg = config.load(files)
    with pytest.raises(config.ConfigError) as err:
        config.check_inputs(cfg, REPO, files)
    assert str(err.value).startswith(
        f"invalid study config at config.reference ({preset}, line 1): "
        "data/reference/missing.csv: no such file under "
    ), str(err.value)
    (tmp_path / "data/reference/missing.csv").mkdir(parents=True)
    with pytest.raises(config.ConfigError, match="missing.csv: a folder under"):
        config.check_inputs(cfg, tmp_path)
    config.check_inputs(raw(), REPO)  # the default's table is there


def test_an_error_is_laid_at_the_door_of_what_set_its_key() -> None:
    """--config merges into the files key by key: a key it did not set keeps its file and line."""
    files = [REPO / "config.yaml"]
    nested = {"sweep": {"gen_tokens": "8"}}
    err = config.ConfigError("config.sweep.servers[0].name", "bad")
    assert "(--config" not in str(err.located(files, nested))
    assert "config.yaml, line" in str(err.located(files, nested))
    said = str(config.ConfigError("config.sweep.gen_tokens", "bad").located(files, nested))
    assert "(--config; nested values given there arrive as strings" in said
    top = config.ConfigError("config.published", "bad").located(files, {"published": "x"})
    assert str(top) == "invalid study config at config.published (--config): bad"
    whole = config.ConfigError("config.sweep.servers[1].name", "bad")
    assert "(--config;" in str(whole.located(files, {"sweep": {"servers": "x"}}))


def test_a_published_folder_that_is_not_there_is_said_once() -> None:
    cfg = config.load([REPO / "config.yaml"])
    assert config.published_warning(cfg, REPO) is None  # the published study is there
    cfg["published"] = "results/published/h2OO"
    assert config.published_warning(cfg, REPO).startswith(
        "published: results/published/h2OO: no such study folder under "
    )
    cfg["published"] = None
    assert config.published_warning(cfg, REPO) is None
    assert config.validate({**raw(), "published": "null"})["published"] is None  # --config's null


def test_a_published_folder_that_holds_no_study_is_said_and_shown_as_none(monkeypatch) -> None:
    """The folder of the published studies (results/published) named for one of them: there,
    but no study, it stopped the run in the compare notebook with a KeyError."""
    cfg = config.load([REPO / "config.yaml"])
    cfg["published"] = "results/published"
    warning = config.published_warning(cfg, REPO)
    assert warning is not None and warning.startswith("published: results/published: no study ")
    for study in ("results/published/h100", "results/published/h200"):  # the studies in it
        assert study in warning, warning
    monkeypatch.chdir(REPO)  # Snakemake's workdir, against which the path is read
    s = Study(cfg)
    assert s.published_dir() == "" and s.published_inputs() == []
    cfg["published"] = "results/published/h200"
    assert Study(cfg).published_dir() == "results/published/h200"


def test_what_serve_would_take_passes_the_check() -> None:
    """The serve check refuses only what serve refuses, and checks only serve's commands."""
    cfg = raw("h200")  # a CUDA study: --device auto (or none) is the GPU there
    for device in ("--device auto", ""):
        cfg["sweep"]["command"] = raw("h200")["sweep"]["command"].replace(
            "--device {device}", device
        )
        Study(copy.deepcopy(cfg))
    cfg = raw()
    cfg["sweep"]["command"] = "env OMP_NUM_THREADS=1 " + cfg["sweep"]["command"]
    cfg["sweep"]["servers"][1]["args"] = "--prefill-attention backend --new-token-ratio 0.5"
    cfg["sweep"]["servers"][2]["command"] = "python -m sglang.launch_server --port {port} --tp 8"
    cfg["sweep"]["servers"][3]["args"] = "--not-a-serve-option"  # a GPU-only server: skipped here
    Study(cfg)


# The user's command: every setting but the engine switches ({switches}), {tree_nodes} and {args}
NO_SWITCHES = (
    "decodecliff serve --preset {preset} --backend {backend} --device {device} "
    "--page-size {page_size} --chunk-size {chunk_size} --spec {spec_mode} --draft-len {draft_len} "
    "--host {host} --port {port}"
)
FULL = raw()["sweep"]["command"]

# A server's setting that its `decodecliff serve` command would not pass on (or would pass on
# as another value): (preset, server, its changes, the key named, the reason given).
UNPASSED = {
    "defrag-without-switches": (
        None,
        0,
        {"defrag": True, "command": NO_SWITCHES},
        "defrag",
        "true here, but its command launches decodecliff serve without --defrag "
        "(put {switches} in the command)",
    ),
    "graphs-without-switches": (
        "h200",
        1,
        {"command": NO_SWITCHES},
        "cuda_graph",
        "true here, but its command launches decodecliff serve without --cuda-graph "
        "(put {switches} in the command)",
    ),
    "backend-options-without-switches": (
        None,
        1,
        {"backend_options": {"index_dtype": "int32"}, "command": NO_SWITCHES},
        "backend_options",
        "index_dtype=int32 here, but its command launches decodecliff serve without "
        "--backend-option (put {switches} in the command)",
    ),
    "page-size-without-placeholder": (
        None,
        0,
        {"page_size": 64, "command": NO_SWITCHES.replace(" --page-size {page_size}", "")},
        "page_size",
        "64 here, but its command launches decodecliff serve with --page-size 1 "
        "(put --page-size {page_size} in the command)",
    ),
    "chunk-size-without-placeholder": (
        None,
        0,
        {"chunk_size": 256, "command": FULL.replace("--chunk-size {chunk_size}", "")},
        "chunk_size",
        "256 here, but its command launches decodecliff serve with --chunk-size 512 "
        "(put --chunk-size {chunk_size} in the command)",
    ),
    "spec-mode-without-placeholder": (
        None,
        0,
        {"command": FULL.replace("--spec {spec_mode}", "")},
        "spec.mode",
        "chain here, but its command launches decodecliff serve with --spec none "
        "(put --spec {spec_mode} in the command)",
    ),
    "draft-len-without-placeholder": (
        None,
        0,
        {
            "spec": {"mode": "chain", "draft_len": 8},
            "command": FULL.replace("--draft-len {draft_len}", ""),
        },
        "spec.draft_len",
        "8 here, but its command launches decodecliff serve with --draft-len 16 "
        "(put --draft-len {draft_len} in the command)",
    ),
    "tree-nodes-without-placeholder": (
        None,
        0,
        {"spec": {"mode": "tree", "tree_nodes": 32}, "command": NO_SWITCHES},
        "spec.tree_nodes",
        "32 here, but its command launches decodecliff serve with --tree-nodes 64 "
        "(put --tree-nodes {tree_nodes} in the command)",
    ),
    "backend-written-in": (
        None,
        0,
        {"command": FULL.replace("{backend}", "triton")},
        "backend",
        "torch here, but its command launches decodecliff serve with --backend triton "
        "(drop --backend triton from its command and args; --backend {backend} in the command "
        "passes the setting)",
    ),
    "page-size-in-args": (
        None,
        0,
        {"args": "--prefill-attention mha --page-size 16"},
        "page_size",
        "1 here, but its command launches decodecliff serve with --page-size 16 "
        "(drop --page-size 16 from its command and args; --page-size {page_size} in the command "
        "passes the setting)",
    ),
    "defrag-in-args": (
        None,
        0,
        {"args": "--defrag"},
        "defrag",
        "false here, but its command launches decodecliff serve with --defrag "
        "(drop --defrag from its command and args; {switches} in the command passes the "
        "setting)",
    ),
}


@pytest.mark.parametrize("name", list(UNPASSED))
def test_a_setting_a_serve_command_does_not_pass_on_is_refused(name: str) -> None:
    """The summary labels a server's points with its settings, read from the config: a setting
    its `decodecliff serve` command does not pass on (a template without {switches} or
    {page_size}, args that set it again) would label them as a server that never ran."""
    preset, i, changes, setting, why = UNPASSED[name]
    cfg = raw(preset)
    cfg["sweep"]["servers"][i].update(changes)
    with pytest.raises(config.ConfigError) as err:
        Study(cfg)
    key = f"config.sweep.servers[{i}].{setting}"
    assert str(err.value).startswith(f"invalid study config at {key}: {why}"), str(err.value)


def test_a_setting_a_serve_command_passes_on_or_never_needs_is_no_mistake() -> None:
    """Where the server runs as labelled, whatever the template names: serve's own default
    (page size 1, no defrag), a draft length of no chain, and servers not launched by
    `decodecliff serve` (another server's command, a server given by url)."""
    cfg = raw()
    plain = cfg["sweep"]["servers"][0]
    plain["command"] = NO_SWITCHES.replace(" --page-size {page_size}", "")  # page size 1, no defrag
    tree = copy.deepcopy(plain) | {"name": "torch-tree-p1"}
    tree["spec"] = {"mode": "tree", "draft_len": 8, "tree_nodes": 64}  # serve's default size
    nochain = copy.deepcopy(plain) | {"name": "torch-none-p1", "spec": {"mode": "none"}}
    nochain["spec"]["draft_len"] = 8  # no chain: the length is moot
    nochain["command"] = FULL.replace("--draft-len {draft_len}", "")
    other = copy.deepcopy(plain) | {"name": "sglang-own-p16", "page_size": 16, "defrag": True}
    other["command"] = "python -m sglang.launch_server --port {port} --page-size 1"
    remote = copy.deepcopy(plain) | {"name": "remote-p16", "page_size": 16, "defrag": True}
    del remote["command"]
    remote["url"] = "http://gpu-node:30000"
    cfg["sweep"]["servers"] += [tree, nochain, other, remote]
    Study(cfg)


def test_a_gpu_only_servers_graphs_are_no_mistake_on_a_cpu() -> None:
    """It is recorded as skipped there, so its CUDA-graph switch never runs."""
    s = study()
    assert s.sweep["device"] == "cpu"
    assert all(by_name(s, name)["cuda_graph"] for name in PEERS)


def test_template_fields_are_what_a_server_fills_in_and_the_launch() -> None:
    s = study()
    fields = servers.fields(s.sweep, by_name(s, "torch-chain16-p1"))
    assert set(fields) | servers.LAUNCH_FIELDS == servers.TEMPLATE_FIELDS


def test_server_command_fills_the_entry_and_keeps_host_and_port() -> None:
    s = study()
    cmd = servers.command(s.sweep, by_name(s, "torch-chain16-p1-k4"))
    assert cmd.startswith("decodecliff serve --preset tiny --backend torch --device cpu")
    assert "--spec chain --draft-len 16 --tree-nodes 64" in cmd and "{switches}" not in cmd
    assert cmd.endswith("--prefill-attention mha --host {host} --port {port}")
    assert "  " not in cmd
    target = Study(raw()).point("torch-chain16-p1", 256).target
    assert target.startswith("--server-cmd 'decodecliff serve")


def test_a_literal_brace_reaches_the_launched_server_as_written() -> None:
    """A brace the template writes {{ or }} (as its error asks), or one in the args, is launched
    as one brace: the point's --server-cmd is a template again, of {host} and {port}, for the
    sweep runner."""
    from decodecliff.sweep import launcher

    cfg = raw()
    override = """--json-model-override-args '{{"rope": {{"factor": 2}}}}'"""
    cfg["sweep"]["servers"][0]["command"] = (
        f"python -m sglang.launch_server {override} {{args}} --host {{host}} --port {{port}}"
    )
    cfg["sweep"]["servers"][0]["args"] = "--chat-template '{a}' --dist-init-addr {host}:5000"
    words = shlex.split(Study(cfg).point("torch-chain16-p1", 256).target)
    assert words[0] == "--server-cmd"
    _, argv = launcher.render_command(words[1], "127.0.0.1", 30000)
    assert argv == [
        "python", "-m", "sglang.launch_server", "--json-model-override-args",
        '{"rope": {"factor": 2}}', "--chat-template", "{a}", "--dist-init-addr",
        "127.0.0.1:5000", "--host", "127.0.0.1", "--port", "30000",
    ]  # fmt: skip


@pytest.mark.parametrize("preset", [None, "h200"])
def test_backend_options_of_a_server_given_by_url_are_refused(tmp_path: Path, preset) -> None:
    """backend_options reach a server only as the --backend-option flags of the command the sweep
    launches it with: a server given by url runs as it was started, so {model: sm120} there was
    taken without a word (and made its points wait for the kernel library) but never applied."""
    cfg = raw(preset)
    i = next(i for i, s in enumerate(cfg["sweep"]["servers"]) if s["backend"] == "flashinfer")
    server = cfg["sweep"]["servers"][i]
    server.update(url="http://gpu-node:30000", backend_options={"backend": "fa2", "model": "sm120"})
    server.pop("command", None)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(config.ConfigError) as err:
        config.load([path])
    said = str(err.value)
    assert said.startswith(
        f"invalid study config at config.sweep.servers[{i}].backend_options ({path}, line "
    ), said
    assert "given by url" in said and "--backend-option" in said and "\n" not in said
    server["backend_options"] = {}  # what it runs is what it was started with
    point = Study(cfg).point(server["name"], server["chunks"][0]["contexts"][0])
    assert point.target == "--url http://gpu-node:30000" and not point.needs_kernel_lib


def test_a_custom_server_given_by_url_waits_for_no_kernel_library_here() -> None:
    """The kernel library is built for servers the sweep launches: one given by url runs its own,
    so its points do not wait for (or fail with) this machine's build."""
    cfg = raw("h200")
    server = next(s for s in cfg["sweep"]["servers"] if s["backend"] == "custom")
    launched = Study(copy.deepcopy(cfg)).point(server["name"], server["chunks"][0]["contexts"][0])
    assert launched.needs_kernel_lib
    server.update(url="http://gpu-node:30000", backend_options={})
    server.pop("command", None)
    point = Study(cfg).point(server["name"], server["chunks"][0]["contexts"][0])
    assert point.target == "--url http://gpu-node:30000" and not point.needs_kernel_lib


def test_url_server_is_swept_where_it_runs() -> None:
    cfg = raw()
    cfg["sweep"]["servers"][0]["url"] = "http://gpu-node:30000"
    point = Study(cfg).point("torch-chain16-p1", 256)
    assert point.target == "--url http://gpu-node:30000" and point.skip_reason is None
    del cfg["sweep"]["servers"][0]["url"]
    for key in ("--api-key secret", "--api-key=secret"):  # the sweep could not send it
        cfg["sweep"]["servers"][0]["args"] = key
        with pytest.raises(config.ConfigError, match=r"\.args.*set \$DECODECLIFF_API_KEY"):
            config.check(cfg)
    cfg["sweep"]["servers"][0].pop("args")
    for url in ("http://gpu-node:abc", "http://gpu-node:99999", "gpu-node:30000"):
        cfg["sweep"]["servers"][0]["url"] = url
        with pytest.raises(config.ConfigError, match=r"servers\[0\]\.url.*no http\(s\)://HOST"):
            config.check(cfg)


@pytest.mark.parametrize("preset", ["h200", "rtx-pro-6000"])
def test_peer_servers_run_on_the_triton_servers_chunks(preset: str) -> None:
    s = study(preset)
    triton = by_name(s, "triton-graph-p1")
    # fa3 (Hopper's wgmma) on the H200 only: sm_120 has mma.sync, so fa2 there; the H200 also
    # serves the sm_120 pairing (the custom kernel's and FlashInfer's sm_120 configurations)
    h200 = ["flashinfer-fa3-graph-p1", "flashinfer-sm120-graph-p1"] if preset == "h200" else []
    peers = [n for n in s.servers if by_name(s, n)["backend"] in ("sglang", "flashinfer")]
    assert peers == [*PEERS, *h200]
    if preset == "h200":
        peers.append("custom-sm120-graph-p1")
    for name in peers:
        server = by_name(s, name)
        assert server["chunks"] == triton["chunks"], name
        assert server["cuda_graph"] and server["page_size"] == 1, name
        assert server["spec"] == {"mode": "chain", "draft_len": 16, "tree_nodes": 64}, name
        assert server["args"] == "--prefill-attention mha --scatter-seed 0", name
        assert [s.point(name, c).requests for c in (1024, 185000)] == [5, 3], name


@pytest.mark.parametrize(
    ("preset", "name", "variant"),
    [
        (None, "flashinfer-graph-p1", "fa2"),
        ("h200", "flashinfer-graph-p1", "fa2"),
        ("h200", "flashinfer-fa3-graph-p1", "fa3"),
        ("rtx-pro-6000", "flashinfer-graph-p1", "fa2"),
    ],
)
def test_the_flashinfer_variant_reaches_the_server_command(preset, name, variant) -> None:
    s = study(preset)
    cmd = servers.command(s.sweep, by_name(s, name))
    assert "--backend flashinfer" in cmd
    assert f"--cuda-graph --backend-option backend={variant} " in cmd


def test_backend_options_are_repeated_flags_quoted_for_the_shell() -> None:
    server = {"cuda_graph": False, "defrag": True, "backend_options": {"backend": "fa3", "x": 2}}
    assert servers.switches(server) == [
        "--defrag", "--backend-option", "backend=fa3", "--backend-option", "x=2",
    ]  # fmt: skip
    assert servers.switches({"cuda_graph": False, "defrag": False}) == []


def test_h200_engine_bench_times_every_served_configuration() -> None:
    h200 = study("h200")
    specs = {registry.parse_spec(s)[0]: [] for s in h200.config["engine"]["backends"]}
    for spec in h200.config["engine"]["backends"]:
        name, options = registry.parse_spec(spec)
        specs[name].append(options)
    for server in h200.config["sweep"]["servers"]:
        assert server.get("backend_options", {}) in specs[server["backend"]], server["name"]
    flags = h200.engine_flags()
    assert "--parts anatomy loop --loop-contexts 185000" in flags
    assert "--backends custom custom:model=sm120 triton sglang " in flags


def test_engine_flags_fill_the_schemas_defaults() -> None:
    flags = study().engine_flags()
    assert "--modes chain --gemm cublas --draft-len 16 --repeats 5" in flags
    assert flags.endswith("--threads 1") and "--loop-contexts" not in flags


@pytest.mark.parametrize("mode", ["chain999", "chain65", "chain1", "tree257", "tree8"])
def test_a_kernel_mode_the_engine_cannot_verify_is_refused(tmp_path: Path, mode: str) -> None:
    """chainN and treeN time the verify step of a server's chain of N tokens or tree of N nodes:
    N beyond the engine's --draft-len or --tree-nodes range was timed as no server runs it."""
    preset = tmp_path / "study.yaml"
    preset.write_text(f"kernels:\n  modes: [decode, chain16, {mode}]\n")
    with pytest.raises(config.ConfigError) as err:
        config.load([REPO / "config.yaml", preset])
    said = str(err.value)
    assert said.startswith(
        f"invalid study config at config.kernels.modes[2] ({preset}, line 2): {mode}: "
    ), said
    assert "chain2..chain64" in said and "tree16..tree256" in said and "\n" not in said
    meta = {f.name: f.metadata for f in fields(EngineConfig)}
    limits = [(meta[name]["min"], meta[name]["max"]) for name in ("draft_len", "tree_nodes")]
    assert limits == [(2, 64), (16, 256)]  # the ranges the message names


def test_kernel_modes_at_the_engines_limits_are_valid() -> None:
    cfg = raw()
    cfg["kernels"]["modes"] = ["decode", "chain2", "chain64", "tree16", "tree256"]
    assert Study(cfg).config["kernels"]["modes"][-1] == "tree256"


def test_the_engine_sections_gemm_paths_are_the_engines() -> None:
    gemms = config.load_schema()["properties"]["engine"]["properties"]["gemms"]
    assert tuple(gemms["items"]["enum"]) == GEMMS and gemms["default"] == [DEFAULT_GEMM]


def test_bench_flags_only_what_the_config_sets() -> None:
    assert study().bench_extra_flags() == "--repeats 3 --decode-splits 8 64"
    h200 = study("h200").bench_extra_flags()
    assert h200 == (
        "--repeats 20 --triton-config sm90 sm120 --decode-splits sglang 8 64"
        " --custom-variants auto v4 v5 --sm120-model"
    )
    assert study().build_extra_flags() == ""
    assert study("h200").build_extra_flags() == "--sm120-model 90"


def test_cpu_pool_is_the_engines_default() -> None:
    s = study()
    assert servers.CPU_DEFAULT_POOL == EngineConfig.CPU_DEFAULT_TOKENS
    server = by_name(s, "torch-chain16-p1")
    assert servers.pool_tokens(s.sweep, server) == EngineConfig.CPU_DEFAULT_TOKENS
    fixed = server | {"args": "--max-total-tokens 1000", "page_size": 64}
    assert servers.pool_tokens(s.sweep, fixed) == 960  # whole pages
    gpu = study("h200")
    assert servers.pool_tokens(gpu.sweep, by_name(gpu, "custom-p1")) is None  # the GPU decides


def test_the_pool_is_what_the_launch_command_passes() -> None:
    """--max-total-tokens in a server's args sets its pool only where its command puts {args}: a
    command without it launches the server at its default pool, which the check took for the
    args' pool (refusing points that fit it, passing points beyond it)."""
    s = study()
    server = by_name(s, "torch-chain16-p1")
    own = "decodecliff serve --preset {preset} --backend {backend} --device {device} --port {port}"
    # its spec (the chain its points are labelled with); the rest at serve's defaults
    own += " --spec {spec_mode}"
    dropped = server | {"command": own, "args": "--max-total-tokens 1000"}
    assert servers.pool_tokens(s.sweep, dropped) == servers.CPU_DEFAULT_POOL
    assert servers.pool_tokens(s.sweep, dropped | {"command": f"{own} {{args}}"}) == 1000
    in_command = dropped | {"command": f"{own} --max-total-tokens 2000"}
    assert servers.pool_tokens(s.sweep, in_command) == 2000
    cfg = raw()
    cfg["sweep"]["servers"][0].update(command=own, args="--max-total-tokens 100")
    Study(copy.deepcopy(cfg))  # its points fit the pool it is launched with
    cfg["sweep"]["servers"][0].update(args="--max-total-tokens 100000")
    cfg["sweep"]["servers"][0]["chunks"][0]["contexts"] = [70000]
    with pytest.raises(config.ConfigError, match=r"exceed the KV pool .* \(65536 tokens\)") as err:
        Study(cfg)
    assert err.value.where == "config.sweep.servers[0].chunks[0].contexts"


def test_a_page_larger_than_the_pool_is_named_as_such() -> None:
    cfg = raw()
    cfg["sweep"]["servers"][0].update(page_size=64, args="--max-total-tokens 1000")
    cfg["sweep"]["servers"][0]["chunks"][0]["contexts"] = [990]
    with pytest.raises(config.ConfigError, match=r"\(960 tokens in whole pages of 64\)$"):
        Study(copy.deepcopy(cfg))
    cfg["sweep"]["servers"][0].update(page_size=100000)
    with pytest.raises(config.ConfigError, match="a page of 100000 tokens is larger than") as err:
        Study(cfg)
    assert err.value.where == "config.sweep.servers[0].page_size"


def test_peers_are_skipped_on_a_cpu_with_the_reason() -> None:
    s = study()
    for name in PEERS:
        point = s.point(name, 256)
        backend = by_name(s, name)["backend"]
        assert point.skip_reason == f"the {backend} backend needs a CUDA GPU (the device is cpu)"
        assert not point.needs_kernel_lib
    assert s.point("torch-chain16-p1", 256).skip_reason is None


def test_a_missing_package_on_the_gpu_machine_skips_its_servers(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util, "find_spec", lambda n, *a: None if n == "sglang" else real(n, *a)
    )
    s = study("h200")
    reason = s.point("sglang-graph-p1", 1024).skip_reason
    assert reason and "needs the sglang package" in reason and "peers" in reason
    custom = s.point("custom-p1", 1024)
    assert custom.skip_reason is None and custom.needs_kernel_lib


def test_point_lookups() -> None:
    s = study()
    point = s.point("triton-chain16-p1", "1024")
    assert (point.ctx, point.requests, point.concurrency) == (1024, 2, 1)
    assert point.file == paths.point_file("triton-chain16-p1", 1024)
    assert point.file == "results/sweep/triton-chain16-p1/ctx1024.json"
    assert point.runtime_min == 5 + 2  # the chunk's 300 s, and room for the job around it
    assert s.point("torch-chain16-p1-k4", 256).concurrency == 4
    assert s.point("torch-chain16-p1", 256).requests == 3  # the sweep's
    priorities = [s.point(n, c).priority for n, c in s.order()]
    assert priorities == sorted(priorities, reverse=True)  # config order first
    with pytest.raises(
        PointError, match=r"context 999 .* did you mean 1024\? \(its points: 256, 1024;"
    ):
        s.point("triton-chain16-p1", 999)
    with pytest.raises(PointError, match="no server 'nope'"):
        s.point("nope", 256)
    # a mistyped name: the valid ones, the closest first
    with pytest.raises(
        PointError, match=r"did you mean 'triton-chain16-p1'\? \(valid: triton-chain16-p1, "
    ):
        s.point("trition-chain16-p1", 256)


@pytest.mark.parametrize("file", ["ctx01024.json", "ctx1k.json", "1024.json"])
def test_a_file_name_no_point_has_names_the_valid_ones(file: str) -> None:
    """Only ctx<N>.json, N as the config writes it, is a point's file: ctx01024.json would be
    measured at 1024 and written as ctx1024.json, never as the file asked for."""
    s = study()
    assert s.point_at("triton-chain16-p1", "ctx1024.json") == s.point("triton-chain16-p1", 1024)
    said = (
        rf"no point file '{file}' of server 'triton-chain16-p1' \(a point's is ctx<N>\.json, N "
        r"its context in tokens\); did you mean 'ctx1024\.json'\? \(valid: ctx1024\.json, "
    )
    with pytest.raises(PointError, match=said):
        s.point_at("triton-chain16-p1", file)
    if file.startswith("ctx"):  # the sweep_point rule's {ctx}
        with pytest.raises(PointError, match=said):
            s.point("triton-chain16-p1", file.removeprefix("ctx").removesuffix(".json"))
    with pytest.raises(PointError, match="no server 'nope'"):
        s.point_at("nope", file)


def test_final_outputs_and_server_names() -> None:
    s = study()
    outputs = s.final_outputs()
    assert outputs[:2] == [paths.BUILD_INFO, paths.KERNEL_BENCH]
    assert outputs[-2:] == [paths.REPORT, paths.NOTES]
    assert "results/sweep/sglang-graph-p1/ctx256.json" in outputs
    assert s.server_names_pattern().split("|")[-1] == r"flashinfer\-graph\-p1"


def test_notebook_table() -> None:
    s = study()
    table = notebooks.notebooks(s)
    assert list(table) == ["kernels", "sweep", "compare", "engine", "report"]
    no_engine = raw()
    no_engine.pop("engine")
    assert "engine" not in notebooks.notebooks(Study(no_engine))
    figures = table["report"].inputs["figures"](None)
    assert "results/figures/sweep/sglang-graph-p1/metrics.png" in figures
    wildcards = SimpleNamespace(server="sglang-graph-p1")
    values = table["sweep"].parameters(wildcards)
    assert values["server"] == "sglang-graph-p1" and values["tau"] == 3.0
    # the files a notebook is given are the files its rule waits for
    for name, book in table.items():
        files = {v for v in book.inputs.values() if isinstance(v, str)}
        given = {v for k, v in book.parameters(wildcards).items() if k.endswith(("_csv", "_json"))}
        assert given and given <= files, name
    assert notebooks.output("sweep") == "results/notebooks/sweep-{server}.ipynb"
    assert notebooks.log("report", "report") == "results/logs/report/notebook_report.log"


def test_the_report_waits_for_this_runs_notes() -> None:
    """The report shows results/NOTES.md under this run's targets: rendered first, never an
    earlier run's."""
    assert paths.NOTES in notebooks.notebooks(study())["report"].inputs.values()


def test_papermill_options_put_yaml_parameters_first() -> None:
    text = notebooks.papermill_options({"a": 1, "config": {"k": "it's"}, "published": ""})
    assert text.startswith('-y \'{"config": {"k": "it\'"\'"\'s"}}\' -y \'{"published": ""}\'')
    assert text.endswith("-p a 1")


def test_validation_fills_in_place() -> None:
    cfg = raw("h200")
    assert "concurrency" not in cfg["sweep"]
    assert config.validate(cfg) is cfg and cfg["sweep"]["concurrency"] == 1


@pytest.mark.parametrize("preset", [None, "h200", "rtx-pro-6000"])
def test_every_server_command_is_a_valid_serve_command_line(preset: str | None) -> None:
    from decodecliff.server import cli as serve_cli

    s = study(preset)
    for name, server in s.servers.items():
        argv = shlex.split(servers.command(s.sweep, server).format(host="127.0.0.1", port=1))
        assert argv[:2] == ["decodecliff", "serve"], name
        args = serve_cli.parse_args(argv[2:])
        assert args.backend == server["backend"] and args.cuda_graph == server["cuda_graph"]
        assert dict(args.backend_option) == server["backend_options"], name


def test_a_config_mistake_names_the_file_and_line_that_set_it(tmp_path: Path) -> None:
    preset = tmp_path / "preset.yaml"
    preset.write_text(
        "kernels:\n  device: cpu\n  heads: [8,\n    eight]\nsweep:\n  gen_tokens: 6\n"
    )
    with pytest.raises(config.ConfigError) as err:
        config.load([REPO / "config.yaml", preset])
    assert str(err.value).startswith(
        f"invalid study config at config.kernels.heads[1] ({preset}, line 4): 'eight' is not of"
    ), str(err.value)
    # a key the preset does not set: the file that does (the later one wins, as in the merge)
    cfg = config.merge(raw(), yaml.safe_load(preset.read_text()))
    cfg["kernels"]["heads"] = [8]
    cfg["sweep"]["servers"][1]["spec"]["mode"] = "beam"
    with pytest.raises(config.ConfigError, match=r"\(.*config\.yaml, line \d+\)") as err:
        config.validate(cfg, files=[REPO / "config.yaml", preset])
    line = int(str(err.value).split(", line ")[1].split(")")[0])
    assert "spec:" in (REPO / "config.yaml").read_text().splitlines()[line - 1]
    # where the schema wants a missing key, its parent's line
    where = config.locate("config.sweep.servers[0].nope", [REPO / "config.yaml"])
    assert (
        where
        and "- name: torch-chain16-p1"
        in (REPO / "config.yaml").read_text().splitlines()[int(where.rsplit(" ", 1)[1]) - 1]
    )
    assert config.locate("config.nothing", [preset]) is None
    # a list is the last file's whole (the merge replaces it): a key its item lacks is that
    # file's, however deep the earlier file's item holds it
    servers = tmp_path / "servers.yaml"
    servers.write_text("sweep:\n  servers:\n    - backend: torch\n")
    where = config.locate("config.sweep.servers[0].name", [REPO / "config.yaml", servers])
    assert where == f"{servers}, line 3"


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kernels:\n  device: cpu\n  heads: [8\n")
    with pytest.raises(config.ConfigError, match=rf"at {bad}, line 4: not valid YAML"):
        config.load([bad])


def test_a_gpu_config_without_a_gpu_says_what_fails_here() -> None:
    s = study("h200")
    assert s.cuda_sections() == ["kernels.device", "engine.device", "sweep.device"]
    assert s.gpu_warning(have_gpu=True) is None
    warning = s.gpu_warning(have_gpu=False)
    assert warning and "\n" not in warning
    assert "bench_kernels fails" in warning and "bench_engine fails" in warning
    assert f"of the sweep's {len(s.order())} points are recorded as failed" in warning
    assert study().gpu_warning(have_gpu=False) is None  # the CPU study asks for no GPU


def test_a_gpu_config_without_a_gpu_counts_only_the_points_that_fail_here(monkeypatch) -> None:
    """A server skipped here (its package missing) records its points as skipped, and one swept
    at its URL runs elsewhere: the warning counted their points among those recorded as failed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        registry.importlib.util, "find_spec", lambda n, *a: None if n == "sglang" else real(n, *a)
    )
    cfg = raw("h200")
    by_url = next(server for server in cfg["sweep"]["servers"] if server["name"] == "triton-p1")
    by_url.update(url="http://gpu-node:30000")
    s = Study(cfg)
    # skipped: sglang's points, and those of any other peer not installed on this machine
    skipped = sum(
        len(s.point_files(name))
        for name, server in s.servers.items()
        if servers.skip_reason(s.sweep, server)
    )
    assert skipped >= len(s.point_files("sglang-graph-p1")) > 0
    remote = len(s.point_files("triton-p1"))
    failing = len(s.order()) - skipped - remote
    warning = s.gpu_warning(have_gpu=False)
    assert f"{failing} of the sweep's {len(s.order())} points are recorded as failed" in warning
    assert f"{skipped} as skipped" in warning and f"{remote} swept at their url" in warning


def test_the_schemas_triton_configs_are_the_baselines_own() -> None:
    from decodecliff.kernels.triton_baseline import ARCH_CONFIGS

    schema = config.load_schema()
    item = schema["properties"]["kernels"]["properties"]["triton_configs"]["items"]
    assert item["enum"] == ["auto", *ARCH_CONFIGS]


def test_a_servers_option_is_checked_as_the_server_reads_it() -> None:
    """Options reach `serve` as --backend-option KEY=VALUE text: "false" is a flag's false, and
    "8" a count, as the server reads them; other text is refused before any job."""
    cfg = raw()
    server = cfg["sweep"]["servers"][0]
    server.update(backend="sglang", backend_options={"interpreted": "false"})
    Study(cfg)
    server["backend_options"] = {"interpreted": "no"}
    with pytest.raises(config.ConfigError, match="must be true or false"):
        Study(cfg)
    server.update(backend="custom", backend_options={"num_splits": "8"})
    Study(cfg)
