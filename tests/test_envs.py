"""envs/*.yaml agree with pyproject.toml: the same packages with the same lower bounds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CORE = PYPROJECT["project"]["dependencies"]
STUDY = PYPROJECT["project"]["optional-dependencies"]["study"]

# Which of the package's dependencies each rule group's environment must carry. The analysis
# jobs run papermill/nbconvert and the package, not Snakemake or its plugins.
GROUPS = {
    "kernels": CORE,
    "serve": CORE,
    "analysis": CORE + [r for r in STUDY if not Requirement(r).name.startswith("snakemake")],
}
# conda packages that are not Python distributions of pyproject: the interpreter, pip, nvcc.
NON_PYTHON = {"python", "pip", "cuda-nvcc"}


def spec_key(text: str) -> tuple[str, str, str]:
    req = Requirement(text)
    return canonicalize_name(req.name), str(req.specifier), str(req.marker or "")


def env_file(group: str) -> dict:
    return yaml.safe_load((ROOT / "envs" / f"{group}.yaml").read_text())


def pip_section(env: dict) -> list[str]:
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, "one pip section per environment"
    return sections[0]


def test_every_env_file_is_a_known_group() -> None:
    found = {p.stem for p in (ROOT / "envs").glob("*.yaml")}
    assert found == set(GROUPS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_pip_packages_match_pyproject(group: str) -> None:
    pip = pip_section(env_file(group))
    packages = [line for line in pip if not line.startswith("-")]
    assert sorted(map(spec_key, packages)) == sorted(map(spec_key, GROUPS[group]))
    assert "-e .." in pip, "the environment installs the project itself"


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_conda_packages_are_the_toolchain_only(group: str) -> None:
    conda = [d for d in env_file(group)["dependencies"] if isinstance(d, str)]
    names = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0] for d in conda}
    assert names <= NON_PYTHON, names - NON_PYTHON
    python = next(d for d in conda if d.startswith("python"))
    assert python == "python" + PYPROJECT["project"]["requires-python"]


def test_every_rule_names_an_existing_env() -> None:
    used = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        # rules under `if` or `for` are indented; a rule defined in a loop has its name inside
        rules = len(re.findall(r"^\s*rule(?: \w+)?:", text, re.M))
        envs = re.findall(r'^\s+conda:\n\s+"\.\./\.\./envs/(\w+)\.yaml"', text, re.M)
        assert len(envs) == rules, f"{smk.name}: every rule needs a conda: environment"
        used.update(envs)
    assert used == set(GROUPS), f"unused or missing environments: {used ^ set(GROUPS)}"
