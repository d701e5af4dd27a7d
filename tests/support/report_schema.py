"""The JSON Schema hangdoc ships for its ``--json`` output, as the tests check reports with it.

``check_report``/``check_error`` raise ``SchemaBroken`` naming where a value breaks the
schema (``$.ranks[3].op.kind: 'colective' is not one of [...]``). The validators are built
once, on first use (``jsonschema`` is a test dependency, imported only then).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from hangdoc.api import SCHEMA_PATH


class SchemaBroken(AssertionError):
    """A report or error object that does not hold the shipped schema."""


@functools.cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _validator(definition: str) -> Any:
    from jsonschema import Draft202012Validator

    whole = schema()
    return Draft202012Validator({"$schema": whole["$schema"], "$defs": whole["$defs"], "$ref": f"#/$defs/{definition}"})


def _check(definition: str, value: Any, what: str) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(_validator(definition).iter_errors(value))
    if error is not None:
        raise SchemaBroken(f"{what} breaks {SCHEMA_PATH.name} at {error.json_path}: {error.message[:400]}")


def check_report(report: Any, what: str = "the report") -> None:
    _check("report", report, what)


def check_error(error: Any, what: str = "the error object") -> None:
    _check("error", error, what)


def sampled(value: Any, keep: int = 128) -> Any:
    """``value`` with each list of more than ``2 * keep`` items cut to its first and last
    ``keep``: a report of 100,000 ranks is checked in milliseconds, each kind of entry still
    is (about 0.2 ms a rank entry), and the corpus tests check whole reports."""
    if isinstance(value, list):
        kept = value if len(value) <= 2 * keep else value[:keep] + value[-keep:]
        return [sampled(item, keep) for item in kept]
    if isinstance(value, dict):
        return {key: sampled(item, keep) for key, item in value.items()}
    return value


def check_output(value: Any, what: str = "the --json output") -> None:
    """Against the whole schema: a report or an error object, whichever ``value`` is."""
    check_error(value, what) if isinstance(value, dict) and "error" in value else check_report(value, what)


def key_paths(value: Any, maps: frozenset[str] = frozenset(), prefix: str = "") -> Iterator[str]:
    """Every key of a report as a path (``ranks[].op.kind``); the keys of a map (an object
    whose keys are data, ``maps``) are not followed."""
    if isinstance(value, list):
        for item in value:
            yield from key_paths(item, maps, f"{prefix}[]")
    elif isinstance(value, dict) and prefix not in maps:
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from key_paths(item, maps, path)


def schema_paths(node: dict[str, Any] | None = None, prefix: str = "") -> tuple[set[str], set[str]]:
    """The key paths the schema's report names, and those of its maps."""
    whole = schema()
    node = whole["$defs"]["report"] if node is None else node
    paths: set[str] = set()
    maps: set[str] = set()
    if "$ref" in node:
        sub = schema_paths(whole["$defs"][node["$ref"].rsplit("/", 1)[1]], prefix)
        return sub
    for alternative in node.get("anyOf", []) + node.get("oneOf", []):
        more, more_maps = schema_paths(alternative, prefix)
        paths |= more
        maps |= more_maps
    if "items" in node:
        more, more_maps = schema_paths(node["items"], f"{prefix}[]")
        paths |= more
        maps |= more_maps
    if node.get("type") == "object" and "properties" not in node and node.get("additionalProperties", True):
        maps.add(prefix)
    for key, sub_node in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        paths.add(path)
        more, more_maps = schema_paths(sub_node, path)
        paths |= more
        maps |= more_maps
    return paths, maps
