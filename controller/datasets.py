"""Datasets: read JSONL / Parquet / Hugging Face rows, map fields, validate, normalize, dedup by hash.

Every source becomes one normalized JSONL file under `<data_dir>/datasets/<sha256>.jsonl`, one
PromptTask payload per line: {"prompt": str} or {"messages": [...]}, plus "reference" and "metadata".
The sha256 of that file is the dataset's identity, so the same rows registered twice (by upload, path
or hub, in either format) are one dataset. Validation collects the first `max_errors` bad rows with
their line (JSONL) or row (Parquet, hub) numbers; nothing is registered unless every row is good.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from shared.jsonl import row_metadata

PROMPT_CANDIDATES = ("prompt", "question", "problem", "input", "query", "instruction")
MESSAGES_CANDIDATES = ("messages", "conversation", "chat")
REFERENCE_CANDIDATES = ("reference", "answer", "solution", "target", "label", "output")


class FieldMapping(BaseModel):
    """Which columns of a row hold what. Unset prompt/messages/reference are auto-detected from row 1."""

    model_config = ConfigDict(extra="forbid")
    prompt: str | None = Field(None, description="Column with the prompt text.", max_length=200)
    messages: str | None = Field(
        None, description="Column with chat messages [{role, content}] (instead of prompt).", max_length=200
    )
    reference: str | None = Field(
        None, description="Column with the reference answer ('' = rows have none; unset = auto-detect).",
        max_length=200,
    )
    metadata: list[str] | None = Field(
        None, description="Columns copied into payload.metadata (unset = every other column); a column named "
        "'metadata' holding an object gives its keys (shared/jsonl.py:row_metadata).", max_length=1000
    )


class DatasetError(ValueError):
    """The data is unusable. `errors` lists bad rows: {line, field, error}."""

    def __init__(self, message: str, errors: list[dict] | None = None, status: int = 422):
        super().__init__(message)
        self.message = message
        self.errors = errors or []
        self.status = status


Row = tuple[int, Any]  # (line or row number, parsed object or a DatasetError)


# --- readers --------------------------------------------------------------------------------------


def sniff_format(path: Path, filename: str = "") -> str:
    name = (filename or path.name).lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    return "jsonl"


def read_jsonl(path: Path, max_line_bytes: int) -> Iterator[Row]:
    """Yield (line number, dict) per non-blank line; a bad line yields (line, DatasetError)."""
    with open(path, "rb") as f:
        n = 0
        while True:
            line = f.readline(max_line_bytes + 1)
            if not line:
                return
            n += 1
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                size = len(line)
                while True:  # skip the rest of the over-long line without holding it
                    chunk = f.readline(1 << 20)
                    size += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                yield n, DatasetError(
                    f"line is {size} bytes, over the limit of {max_line_bytes} bytes "
                    f"(controller.max_line_kb); shorten the row or raise the limit"
                )
                continue
            if n == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except UnicodeDecodeError as exc:
                yield n, DatasetError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            except json.JSONDecodeError as exc:
                yield n, DatasetError(f"not valid JSON: {exc.msg} at column {exc.colno}")
                continue
            if not isinstance(obj, dict):
                yield n, DatasetError(f"expected a JSON object per line, got {_type_name(obj)}")
                continue
            yield n, obj


def read_parquet(path: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise DatasetError(f"not a readable Parquet file: {exc}") from None
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=2048):
            for row in batch.to_pylist():
                n += 1
                yield n, row
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"Parquet file is corrupt after row {n}: {exc}") from None


def read_hf(name: str, split: str, subset: str | None = None, data_files: list[str] | None = None,
            revision: str | None = None, cache_dir: str | None = None) -> Iterator[Row]:
    """Rows of a Hugging Face dataset through the `datasets` library (a hub name, a local dataset dir,
    or a builder such as "json"/"parquet" with `data_files`)."""
    try:
        import datasets
    except ImportError:
        raise DatasetError("the `datasets` library is not installed: pip install 'jetrl[datasets]'", status=422) from None
    try:
        ds = datasets.load_dataset(name, subset, split=split, data_files=data_files, revision=revision,
                                   cache_dir=cache_dir)
    except Exception as exc:
        raise DatasetError(f"cannot load Hugging Face dataset {name!r} split {split!r}: "
                           f"{type(exc).__name__}: {exc}") from None
    if not hasattr(ds, "__iter__") or isinstance(ds, dict):
        raise DatasetError(f"dataset {name!r} did not return a single split; name one with split=")
    for i, row in enumerate(ds, 1):
        yield i, dict(row)


# --- where server-side data may come from ---------------------------------------------------------

# `datasets` builders that read the files named in data_files (never the hub).
FILE_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset", "imagefolder", "audiofolder",
                 "videofolder", "xml", "sql"}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
_HUB_FILE = re.compile(r"[A-Za-z0-9_.*?\[\]{}-][A-Za-z0-9_.*?/\[\]{},-]{0,511}")


def confine(path: str, roots: list[str], what: str = "path") -> Path:
    """`path` resolved (symlinks followed) when it lies under one of `roots`; else DatasetError 403.

    The refusal is the same whether or not the file exists, and names only what the client sent, so the
    answer tells nothing about the host's files outside the roots."""
    if not roots:
        raise DatasetError(f"{what} {path!r}: server-side paths are off (controller.path_roots is empty): upload "
                           f"the file, or add its directory to controller.path_roots", status=403)
    try:
        p = Path(path).expanduser()
        if not p.is_absolute():
            raise ValueError("relative")
        p = p.resolve()
        allowed = [Path(r).expanduser().resolve() for r in roots]
    except (OSError, RuntimeError, ValueError):
        p, allowed = None, []
    if p is None or not any(p.is_relative_to(r) for r in allowed):
        raise DatasetError(f"{what} {path!r} is not an absolute path under controller.path_roots {roots}", status=403)
    return p


def check_hf_source(name: str, data_files: list[str] | None, roots: list[str]) -> tuple[str, list[str] | None]:
    """What /v1/datasets/hf may load: a hub dataset id (its data_files relative names inside the repo), or
    local files/dirs under controller.path_roots (a builder such as json with data_files, or a dataset dir).
    Returns (name, data_files) with local paths resolved; DatasetError 403/422 otherwise."""
    local_name = name.startswith(("/", ".", "~")) or "\\" in name
    if local_name:
        name = str(confine(name, roots, "dataset dir"))
    elif name.lower() in FILE_BUILDERS:
        if not data_files:
            raise DatasetError(f"builder {name!r} reads data_files: name the files (under controller.path_roots)",
                               status=422)
        data_files = [str(confine(f, roots, "data file")) for f in data_files]
        return name, data_files
    elif not _HUB_ID.fullmatch(name) or ".." in name:
        raise DatasetError(f"name {name!r} is neither a Hugging Face hub id (owner/name) nor a builder "
                           f"({', '.join(sorted(FILE_BUILDERS))}) nor an absolute dataset dir", status=422)
    elif Path(name).exists():  # `datasets` would read a relative local dir of this name first
        name = str(confine(str(Path(name).absolute()), roots, "dataset dir"))
    if data_files:
        if local_name or Path(name).is_absolute():
            data_files = [str(confine(f, roots, "data file")) for f in data_files]
        else:  # files inside a hub repo: relative names only (no URLs, no absolute or parent paths)
            for f in data_files:
                if not _HUB_FILE.fullmatch(f) or ".." in f or "://" in f or f.startswith("/"):
                    raise DatasetError(f"data file {f!r} of hub dataset {name!r} must be a relative path inside "
                                       f"the dataset repo (no URL, no absolute path, no '..')", status=422)
    return name, data_files


# --- mapping and validation -----------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _jsonable(v: Any) -> Any:
    """Metadata values as plain JSON (dates, bytes and other exotic Parquet types become strings)."""
    return json.loads(json.dumps(v, default=str, ensure_ascii=False))


def resolve_mapping(mapping: FieldMapping, first: dict) -> FieldMapping:
    """Fill auto-detected columns from the first row; raise DatasetError naming the columns seen."""
    m = mapping.model_copy()
    cols = list(first.keys())
    if m.prompt is None and m.messages is None:
        m.prompt = next((c for c in PROMPT_CANDIDATES if c in first), None)
        if m.prompt is None:
            m.messages = next((c for c in MESSAGES_CANDIDATES if c in first), None)
        if m.prompt is None and m.messages is None:
            raise DatasetError(
                f"no prompt column found among {cols[:20]}: set mapping.prompt (or mapping.messages) to the "
                f"column that holds the prompt", [{"line": 1, "field": "prompt", "error": "no prompt column"}])
    elif m.prompt is not None and m.messages is not None:
        raise DatasetError("set mapping.prompt or mapping.messages, not both")
    if m.reference is None:
        m.reference = next((c for c in REFERENCE_CANDIDATES if c in first), "")
    if m.metadata is None:
        used = {m.prompt, m.messages, m.reference}
        m.metadata = [c for c in cols if c not in used]
    return m


def _check_messages(v: Any) -> str | None:
    if not isinstance(v, list) or not v:
        return f"must be a non-empty array of {{role, content}} objects, got {_type_name(v)}"
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            return f"item {i} must be an object with role and content, got {_type_name(item)}"
        for key in ("role", "content"):
            if not isinstance(item.get(key), str):
                return f"item {i}.{key} must be a string, got {_type_name(item.get(key))}"
    return None


def to_payload(row: dict, m: FieldMapping) -> tuple[dict | None, tuple[str, str] | None]:
    """The PromptTask payload of one row, or (None, (field, error))."""
    payload: dict[str, Any] = {}
    if m.prompt:
        if m.prompt not in row:
            return None, (m.prompt, f"missing field {m.prompt!r} (mapping.prompt)")
        v = row[m.prompt]
        if not isinstance(v, str):
            return None, (m.prompt, f"field {m.prompt!r} must be a string, got {_type_name(v)}")
        if not v.strip():
            return None, (m.prompt, f"field {m.prompt!r} is empty")
        payload["prompt"] = v
    else:
        if m.messages not in row:
            return None, (m.messages, f"missing field {m.messages!r} (mapping.messages)")
        problem = _check_messages(row[m.messages])
        if problem:
            return None, (m.messages, f"field {m.messages!r} {problem}")
        payload["messages"] = [{"role": x["role"], "content": x["content"]} for x in row[m.messages]]
    if m.reference:
        v = row.get(m.reference)
        if v is None:
            why = "is null" if m.reference in row else "is missing"
            return None, (m.reference, f"reference field {m.reference!r} {why} (mapping.reference; '' = no reference)")
        if not isinstance(v, (str, int, float, bool, list, dict)):
            return None, (m.reference, f"reference field {m.reference!r} has unsupported type {_type_name(v)}")
        payload["reference"] = _jsonable(v)
    meta = {k: _jsonable(v) for k, v in row_metadata(row, m.metadata or []).items()}
    if meta:
        payload["metadata"] = meta
    return payload, None


# --- normalize and register -----------------------------------------------------------------------


class Normalized(BaseModel):
    path: str
    content_hash: str
    num_rows: int
    mapping: FieldMapping


def normalize(rows: Iterator[Row], mapping: FieldMapping, out_dir: Path, *, max_errors: int = 10,
              max_row_bytes: int = 8 << 20, unit: str = "line") -> Normalized:
    """Validate and write every row's payload to a new file in `out_dir`; raise DatasetError listing
    the first `max_errors` bad rows (nothing is written then)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".tmp-{uuid.uuid4().hex}.jsonl"
    errors: list[dict] = []
    resolved: FieldMapping | None = None
    digest = hashlib.sha256()
    count = 0
    try:
        with open(tmp, "wb") as out:
            for n, row in rows:
                if isinstance(row, DatasetError):
                    errors.append({"line": n, "field": None, "error": row.message})
                elif not isinstance(row, dict):
                    errors.append({"line": n, "field": None, "error": f"expected an object, got {_type_name(row)}"})
                else:
                    if resolved is None:
                        try:
                            resolved = resolve_mapping(mapping, row)
                        except DatasetError as exc:
                            for e in exc.errors:
                                e["line"] = n
                            raise
                    payload, problem = to_payload(row, resolved)
                    if problem:
                        errors.append({"line": n, "field": problem[0], "error": problem[1]})
                    elif not errors:
                        line = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
                        data = line.encode() + b"\n"
                        if len(data) > max_row_bytes:
                            errors.append({"line": n, "field": None, "error": f"row is {len(data)} bytes as a "
                                           f"prompt payload, over {max_row_bytes} (controller.max_line_kb)"})
                        else:
                            out.write(data)
                            digest.update(data)
                            count += 1
                if len(errors) >= max_errors:
                    break
        if errors:
            first = errors[0]
            more = f" (first {len(errors)} bad rows listed)" if len(errors) > 1 else ""
            field = f" field {first['field']!r}:" if first["field"] else ""
            raise DatasetError(f"{unit} {first['line']}:{field} {first['error']}{more}",
                               [dict(e, where=f"{unit} {e['line']}") for e in errors])
        if count == 0:
            raise DatasetError("the dataset has no rows (empty file or only blank lines): add at least one row",
                               [{"line": 0, "field": None, "error": "no rows", "where": "file"}])
        content_hash = digest.hexdigest()
        final = out_dir / f"{content_hash}.jsonl"
        os.replace(tmp, final)
        return Normalized(path=str(final), content_hash=content_hash, num_rows=count, mapping=resolved)
    finally:
        if tmp.exists():
            tmp.unlink()


class DatasetReader:
    """Random access to the payloads of a normalized dataset file (mmap + line offsets)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._f = open(self.path, "rb")
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        nl = np.flatnonzero(np.frombuffer(self._mm, dtype=np.uint8) == 10)
        self._ends = nl
        self._starts = np.concatenate([[0], nl[:-1] + 1]) if len(nl) else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._ends)

    def raw(self, i: int) -> bytes:
        return self._mm[int(self._starts[i]) : int(self._ends[i])]

    def payload(self, i: int) -> dict:
        return json.loads(self.raw(i))

    def close(self) -> None:
        self._mm.close()
        self._f.close()
