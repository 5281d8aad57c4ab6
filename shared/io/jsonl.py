"""JSON-lines files of objects: each non-blank line one JSON object, errors naming the file and line; the
strict JSON parse every user-supplied document goes through (`loads_strict`); and the rule by which a dataset
row's extra fields become a task payload's `metadata` (the controller's datasets and `jetrl eval`'s held-out
rows both apply it)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

MAX_DEPTH = 64  # nesting of arrays/objects a user document may have (a prompt's metadata needs a handful)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack (the bus codec) can carry


class JSONInputError(ValueError):
    """A document is not plain, standard JSON that jetrl can carry; the message says why, without a traceback."""


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > 20:  # before int(): Python refuses > 4300 digits only after reading them all
        raise JSONInputError(f"an integer of {len(s.lstrip('-'))} digits is outside the 64-bit range")
    v = int(s)
    if not _INT_MIN <= v <= _INT_MAX:
        raise JSONInputError(f"integer {s} is outside the 64-bit range")
    return v


def _parse_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise JSONInputError(f"number {s[:40]} is out of range (a float overflows to Infinity)")
    return v


def _refuse_constant(name: str):
    raise JSONInputError(f"{name} is not standard JSON (write null or a string)")


def nesting_depth(v, limit: int) -> int:
    """Nesting depth of parsed JSON/YAML: how many arrays/objects lie inside one another (a scalar is 0,
    `[[1]]` is 2), counted up to just past `limit` (iterative: no RecursionError on a deep document)."""
    deepest, stack = 0, [(v, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list | tuple):
            d += 1
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d) for x in (node.values() if isinstance(node, dict) else node))
    return deepest


def check_plain(v, max_depth: int = MAX_DEPTH) -> None:
    """JSONInputError unless `v` (parsed YAML, a Parquet or Hugging Face row) is something standard JSON and
    the bus codec can carry: no NaN / Infinity, no integer outside 64 bits, nesting <= `max_depth`."""
    if nesting_depth(v, max_depth) > max_depth:
        raise JSONInputError(f"nested deeper than {max_depth} levels")
    stack = [v]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise JSONInputError(f"{node} is not standard JSON (write null or a string)")
        if isinstance(node, int) and not isinstance(node, bool) and not _INT_MIN <= node <= _INT_MAX:
            raise JSONInputError("an integer is outside the 64-bit range")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)


def loads_strict(text: str | bytes, max_depth: int = MAX_DEPTH):
    """json.loads for input from users (and from the policy): NaN / Infinity / -Infinity, numbers that
    overflow to Infinity, integers outside 64 bits and nesting deeper than `max_depth` raise JSONInputError
    (a ValueError), and so does broken JSON (json.JSONDecodeError's message, with its column). Never a
    RecursionError or Python's 4300-digit ValueError."""
    try:
        obj = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant)
    except JSONInputError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise JSONInputError(f"nested deeper than {max_depth} levels") from None
    if nesting_depth(obj, max_depth) > max_depth:
        raise JSONInputError(f"nested deeper than {max_depth} levels")
    return obj


def json_objects(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, object) for each non-blank line of `path`, where = "path:line"; ValueError naming the line
    when it is not JSON (or not standard JSON: loads_strict) or not an object."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                obj = loads_strict(line)
            except JSONInputError as exc:
                msg = str(exc).removeprefix("not valid JSON: ")
                raise ValueError(f"{where}: not JSON ({msg})") from None
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


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """`rows` as JSON lines at `path` (its directory made); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return p


def write_split(out: str | Path, train: list[dict], heldout: list[dict]) -> dict[str, Path]:
    """`out`/train.jsonl and `out`/heldout.jsonl; returns {"train": path, "heldout": path}."""
    d = Path(out)
    return {"train": write_jsonl(train, d / "train.jsonl"), "heldout": write_jsonl(heldout, d / "heldout.jsonl")}
