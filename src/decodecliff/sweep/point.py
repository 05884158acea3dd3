"""The point file's shape: point.schema.json, checked on every record before it is written.

The schema stays the one definition of a point file: this module reads it and checks a record
against it with the JSON Schema keywords it uses (jsonschema is not a dependency of the sweep,
which runs where only the core dependencies are installed). A schema that uses any other
keyword is refused when loaded, so the check never silently skips a rule.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

from decodecliff.values import is_integral, is_number

SCHEMA_PATH = Path(__file__).with_name("point.schema.json")

# Keywords that only describe; every other keyword of the schema is checked below.
ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "default"}
CHECKED = {
    "type", "const", "enum", "required", "properties", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "minimum", "exclusiveMinimum", "maximum", "pattern",
    "$ref", "allOf", "if", "then", "else",
}  # fmt: skip
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list | tuple),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": is_number,
    "integer": is_integral,
}


class PointError(Exception):
    """A point record that does not match point.schema.json: a bug of the runner, not a result."""


@functools.cache
def schema() -> dict:
    """point.schema.json, after checking that it uses only the keywords this module checks."""
    loaded = json.loads(SCHEMA_PATH.read_text())
    unknown = sorted(_keywords(loaded) - ANNOTATIONS - CHECKED)
    if unknown:
        raise PointError(f"{SCHEMA_PATH.name} uses keywords the check does not know: {unknown}")
    return loaded


def _keywords(node: dict) -> set[str]:
    """Every keyword of a schema, nested schemas included (not property names, not values)."""
    found = set(node)
    for key, value in node.items():
        if key in ("properties", "$defs"):
            nested = list(value.values())
        elif key in ("allOf", "prefixItems"):
            nested = list(value)
        elif isinstance(value, dict) and key not in ("const", "default"):
            nested = [value]
        else:
            nested = []
        for sub in nested:
            found |= _keywords(sub)
    return found


def check(record: dict) -> None:
    """Raise PointError naming the first place where ``record`` breaks the schema."""
    problem = error(record)
    if problem is not None:
        ctx = record.get("requested_ctx") if isinstance(record, dict) else None
        raise PointError(
            f"the point record of ctx {ctx} does not match {SCHEMA_PATH.name}: {problem}"
        )


def error(record: object) -> str | None:
    """The first place where ``record`` breaks the schema, as 'where: why'; None if it fits."""
    root = schema()
    return _error(record, root, root, "point")


def _same(a: object, b: object) -> bool:
    """JSON equality: true and 1 differ."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _error(value: object, node: dict, root: dict, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON cannot hold it: the writer refuses it, and the runner nulls it
    checks = (_ref, _type, _value, _number, _string, _object, _array, _logic)
    for step in checks:
        problem = step(value, node, root, where)
        if problem is not None:
            return problem
    return None


def _ref(value: object, node: dict, root: dict, where: str) -> str | None:
    if "$ref" not in node:
        return None
    target = root
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return _error(value, target, root, where)


def _type(value: object, node: dict, root: dict, where: str) -> str | None:
    if "type" not in node:
        return None
    allowed = node["type"] if isinstance(node["type"], list) else [node["type"]]
    if any(TYPES[t](value) for t in allowed):
        return None
    return f"{where}: {value!r} is not of type {' or '.join(allowed)}"


def _value(value: object, node: dict, root: dict, where: str) -> str | None:
    if "const" in node and not _same(value, node["const"]):
        return f"{where}: {value!r} is not {node['const']!r}"
    if "enum" in node and not any(_same(value, option) for option in node["enum"]):
        return f"{where}: {value!r} is not one of {node['enum']}"
    return None


def _number(value: object, node: dict, root: dict, where: str) -> str | None:
    if not TYPES["number"](value):
        return None
    if "minimum" in node and value < node["minimum"]:
        return f"{where}: {value!r} is below the minimum {node['minimum']}"
    if "exclusiveMinimum" in node and value <= node["exclusiveMinimum"]:
        return f"{where}: {value!r} is not above {node['exclusiveMinimum']}"
    if "maximum" in node and value > node["maximum"]:
        return f"{where}: {value!r} is above the maximum {node['maximum']}"
    return None


def _string(value: object, node: dict, root: dict, where: str) -> str | None:
    if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
        return f"{where}: {value!r} does not match {node['pattern']!r}"
    return None


def _object(value: object, node: dict, root: dict, where: str) -> str | None:
    if not isinstance(value, dict):
        return None
    for key in node.get("required", []):
        if key not in value:
            return f"{where}.{key}: missing (it is required)"
    props = node.get("properties", {})
    for key, item in value.items():
        if key in props:
            problem = _error(item, props[key], root, f"{where}.{key}")
        elif node.get("additionalProperties") is False:
            problem = f"{where}.{key}: unknown key (known: {', '.join(props)})"
        elif isinstance(node.get("additionalProperties"), dict):
            problem = _error(item, node["additionalProperties"], root, f"{where}.{key}")
        else:
            problem = None
        if problem is not None:
            return problem
    return None


def _array(value: object, node: dict, root: dict, where: str) -> str | None:
    if not TYPES["array"](value):
        return None
    if len(value) < node.get("minItems", 0):
        return f"{where}: {len(value)} items, fewer than {node['minItems']}"
    if "maxItems" in node and len(value) > node["maxItems"]:
        return f"{where}: {len(value)} items, more than {node['maxItems']}"
    prefix = node.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else node.get("items")
        problem = None if sub is None else _error(item, sub, root, f"{where}[{i}]")
        if problem is not None:
            return problem
    return None


def _logic(value: object, node: dict, root: dict, where: str) -> str | None:
    for sub in node.get("allOf", []):
        problem = _error(value, sub, root, where)
        if problem is not None:
            return problem
    if "if" in node:
        branch = "then" if _error(value, node["if"], root, where) is None else "else"
        if branch in node:
            return _error(value, node[branch], root, where)
    return None
