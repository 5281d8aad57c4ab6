"""JSON-lines files of objects: each non-blank line one JSON object, errors naming the file and line; and the
rule by which a dataset row's extra fields become a task payload's `metadata` (the controller's datasets and
`jetrl eval`'s held-out rows both apply it)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path


def json_objects(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, object) for each non-blank line of `path`, where = "path:line"; ValueError naming the line
    when it is not JSON or not an object."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: a line must be a JSON object, got {type(obj).__name__}")
            yield where, obj


def row_metadata(row: dict, columns: Iterable[str]) -> dict:
    """A task payload's `metadata` from a dataset row's `columns`: a column named `metadata` holding an object
    gives its keys (so an agent reads task["metadata"]["corpus"], not task["metadata"]["metadata"]["corpus"]);
    every other column is a key of its own, and wins over a same-named key of that object."""
    nested: dict = {}
    meta: dict = {}
    for c in columns:
        if c not in row:
            continue
        if c == "metadata" and isinstance(row[c], dict):
            nested = row[c]
        else:
            meta[c] = row[c]
    return {**nested, **meta}
