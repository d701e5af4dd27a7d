"""Every place in a parsed JSON value, for tests that change a bundle one place at a time."""

from __future__ import annotations

from typing import Any


def containers(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) pair in ``value``: the places a mutation can hit."""
    found: list[tuple[Any, Any]] = []
    todo = [value]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            found.append((node, key))
            if isinstance(child, dict | list):
                todo.append(child)
    return found
