"""The held-out set: a JSONL file read into task payloads {"prompt" | "messages", "reference", "metadata"},
the fields found by name (eval.prompt_field / eval.reference_field) or by the usual names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.config.eval import EvalConfig
from shared.io.jsonl import json_objects, row_metadata

PROMPT_FIELDS = ("prompt", "question", "problem", "input")
REFERENCE_FIELDS = ("reference", "answer", "solution", "target")


def _pick(row: dict, name: str, candidates: tuple[str, ...], what: str, where: str) -> str:
    if name:
        if name not in row:
            raise ValueError(f"{where}: no field {name!r} (eval.{what}_field); the row has {sorted(row)}")
        return name
    for c in candidates:
        if c in row:
            return c
    raise ValueError(f"{where}: no {what} field (looked for {', '.join(candidates)}; the row has {sorted(row)}): "
                     f"set eval.{what}_field")


def read_rows(path: str | Path, ecfg: EvalConfig) -> list[dict]:
    """Task payloads {"prompt" | "messages", "reference", "metadata"} from a held-out JSONL file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"eval dataset {str(p)!r}: no such file")
    rows: list[dict] = []
    for where, row in json_objects(p):
        ref_key = _pick(row, ecfg.reference_field, REFERENCE_FIELDS, "reference", where)
        if "messages" in row and not ecfg.prompt_field:
            prompt_key = "messages"
            payload: dict[str, Any] = {"messages": row["messages"]}
        else:
            prompt_key = _pick(row, ecfg.prompt_field, PROMPT_FIELDS, "prompt", where)
            payload = {"prompt": str(row[prompt_key])}
        payload["reference"] = row[ref_key]
        payload["metadata"] = row_metadata(row, [k for k in row if k not in (ref_key, prompt_key)])
        rows.append(payload)
        if ecfg.limit and len(rows) >= ecfg.limit:
            break
    if not rows:
        raise ValueError(f"eval dataset {str(p)!r} has no rows")
    return rows
