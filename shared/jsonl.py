"""JSON-lines files of objects: each non-blank line one JSON object, errors naming the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
