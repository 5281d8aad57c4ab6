"""Datasets: read JSONL / Parquet / Hugging Face rows, map fields, validate, normalize, dedup by hash.

Every source becomes one normalized JSONL file under `<data_dir>/datasets/<sha256>.jsonl`, one
PromptTask payload per line: {"prompt": str} or {"messages": [...]}, plus "reference" and "metadata".
The sha256 of that file is the dataset's identity, so the same rows registered twice (by upload, path
or hub, in either format) are one dataset. Validation collects the first `max_errors` bad rows with
their line (JSONL) or row (Parquet, hub) numbers; nothing is registered unless every row is good.
Every reader counts the bytes it decompresses against a ReadBudget and stops at the limit (a 1 KB
Parquet or gzip file must not become gigabytes); rows must be standard JSON (no NaN, no huge integers,
no deep nesting: shared/io/jsonl.py). Where server-side files may come from: controller/sources.py.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import mmap
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from shared.io.jsonl import JSONInputError, check_plain, loads_strict, row_metadata

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
        "'metadata' holding an object gives its keys (shared/io/jsonl.py:row_metadata).", max_length=1000
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


class ReadBudget:
    """How many decompressed bytes a source may still yield: controller.max_dataset_mb in all, and for a
    file of `source_bytes` on disk at most max_expansion_ratio times that (at least 1 MiB). Readers `add`
    what they decompress as they go, so a bomb stops at the limit instead of after it has been read."""

    def __init__(self, max_bytes: int, ratio: float = 0.0, source_bytes: int | None = None):
        self.limit, self.why, self.used = max_bytes, f"controller.max_dataset_mb ({max_bytes >> 20} MiB)", 0
        if ratio and source_bytes is not None:
            cap = max(int(ratio * source_bytes), 1 << 20)
            if cap < self.limit:
                self.limit = cap
                self.why = f"controller.max_expansion_ratio: {ratio:g} x the {source_bytes}-byte source, at least 1 MiB"

    def add(self, n: int, where: str) -> None:
        self.used += n
        if self.used > self.limit:
            raise DatasetError(f"{where}: the data decompresses to more than {self.limit} bytes ({self.why}); "
                               f"reading stopped there. Split the dataset, or raise the limit if it is genuine",
                               status=413)


_UNLIMITED = ReadBudget(1 << 62)


def sniff_format(path: Path, filename: str = "") -> str:
    name = (filename or path.name).lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    return "jsonl"


def _open_jsonl(path: Path):
    """The file as a binary stream, decompressed on the fly when it starts with a gzip, bz2 or xz header."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
    if head.startswith(b"BZh"):
        return bz2.open(path, "rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        raise DatasetError("zstd-compressed JSONL is not supported: send it plain or gzip/bz2/xz-compressed", status=415)
    return open(path, "rb")


def read_jsonl(path: Path, max_line_bytes: int, budget: ReadBudget | None = None) -> Iterator[Row]:
    """Yield (line number, dict) per non-blank line; a bad line yields (line, DatasetError). A gzip, bz2 or
    xz file is decompressed while it is read; `budget` counts every decompressed byte (413 past it)."""
    budget = budget or _UNLIMITED
    n = 0
    try:
        with _open_jsonl(path) as f:
            while True:
                line = f.readline(max_line_bytes + 1)
                if not line:
                    return
                n += 1
                budget.add(len(line), f"line {n}")
                if len(line) > max_line_bytes and not line.endswith(b"\n"):
                    size = len(line)
                    while True:  # skip the rest of the over-long line without holding it
                        chunk = f.readline(1 << 20)
                        size += len(chunk)
                        budget.add(len(chunk), f"line {n}")
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
                    obj = loads_strict(line)
                except UnicodeDecodeError as exc:
                    yield n, DatasetError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                    continue
                except JSONInputError as exc:
                    yield n, DatasetError(str(exc))
                    continue
                if not isinstance(obj, dict):
                    yield n, DatasetError(f"expected a JSON object per line, got {_type_name(obj)}")
                    continue
                yield n, obj
    except (OSError, EOFError, lzma.LZMAError) as exc:  # a truncated or corrupt compressed stream
        raise DatasetError(f"compressed file is corrupt after line {n}: {exc}") from None


def _row_sizes(arr) -> np.ndarray:
    """Bytes each row of an Arrow array holds once decoded (strings and binaries by length, dictionary
    values by the length of the entry each row points to, lists and structs as the sum of their parts),
    computed from offsets and dictionaries without decoding a value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(arr)
    t = arr.type
    if pa.types.is_dictionary(t):
        per_entry = _row_sizes(arr.dictionary)
        idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return per_entry[idx] if len(per_entry) else np.zeros(n, np.int64)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or \
            pa.types.is_large_string(t):
        return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) + 8
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        flat = arr.flatten() if arr.offset == 0 and arr.null_count == 0 else None
        if flat is None:  # slices and nulls: rebuild per row from value offsets
            offsets = arr.value_offsets().to_numpy(zero_copy_only=False).astype(np.int64)
            child = _row_sizes(arr.values)
            csum = np.concatenate([[0], np.cumsum(child)])
            return csum[offsets[1:]] - csum[offsets[:-1]] + 8
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        csum = np.concatenate([[0], np.cumsum(_row_sizes(flat))])
        return csum[offsets[1:] - offsets[0]] - csum[offsets[:-1] - offsets[0]] + 8
    if pa.types.is_struct(t):
        out = np.full(n, 8, np.int64)
        for i in range(t.num_fields):
            out += _row_sizes(arr.field(i))
        return out
    if t.bit_width is not None and t.bit_width > 0 and not pa.types.is_fixed_size_list(t):
        return np.full(n, max(t.bit_width // 8, 1), np.int64)
    return np.full(n, -(-arr.nbytes // max(n, 1)) + 8, np.int64)  # other nested types: their share


def rows_of_batches(batches: Iterable, budget: ReadBudget | None = None, max_row_bytes: int | None = None,
                    unit: str = "row", chunk_bytes: int = 16 << 20) -> Iterator[Row]:
    """(row number, dict) from Arrow record batches, counting each row's decoded size against `budget`
    and refusing a row over `max_row_bytes` BEFORE it becomes Python objects; rows are turned into Python a
    slice of <= `chunk_bytes` at a time, so memory holds one slice (and Arrow's dictionaries), not a batch."""
    budget = budget or _UNLIMITED
    n = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        sizes = np.zeros(batch.num_rows, np.int64)
        for col in batch.columns:
            sizes += _row_sizes(col)
        i = 0
        while i < batch.num_rows:
            j, acc = i, 0
            while j < batch.num_rows and (j == i or acc + sizes[j] <= chunk_bytes):
                if max_row_bytes is not None and sizes[j] > max_row_bytes:
                    break
                acc += int(sizes[j])
                j += 1
            for k in range(i, j):
                budget.add(int(sizes[k]), f"{unit} {n + k - i + 1}")
            for row in batch.slice(i, j - i).to_pylist():
                n += 1
                yield n, row
            if j < batch.num_rows and max_row_bytes is not None and sizes[j] > max_row_bytes:
                n += 1
                budget.add(int(sizes[j]), f"{unit} {n}")
                yield n, DatasetError(f"row holds about {int(sizes[j])} bytes, over the limit of {max_row_bytes} "
                                      f"bytes (controller.max_line_kb); shorten the row or raise the limit")
                j += 1
            i = j


def read_parquet(path: Path, budget: ReadBudget | None = None, max_row_bytes: int | None = None) -> Iterator[Row]:
    """Rows of a Parquet file, read a record batch at a time. Byte-array columns are read as dictionaries
    (rows_of_batches sizes each row from its dictionary entry), so 50 rows pointing at one 8 MB
    dictionary value count as 400 MB before any of it is decoded."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
        byte_arrays = [meta.schema.column(i).path for i in range(len(meta.schema))
                       if meta.schema.column(i).physical_type == "BYTE_ARRAY"]
        pf = pq.ParquetFile(path, read_dictionary=byte_arrays)
    except Exception as exc:
        raise DatasetError(f"not a readable Parquet file: {exc}") from None
    n = 0
    try:
        for n, row in rows_of_batches(pf.iter_batches(batch_size=1024), budget, max_row_bytes):
            yield n, row
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"Parquet file is corrupt after row {n}: {exc}") from None


# --- mapping and validation -----------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _jsonable(v: Any) -> Any:
    """Metadata values as plain JSON (dates, bytes and other exotic Parquet types become strings)."""
    return json.loads(json.dumps(v, default=str, ensure_ascii=False, allow_nan=False))


def _not_plain(row: dict) -> str | None:
    """Why a row cannot be stored as standard JSON and carried on the bus (NaN, Infinity, a huge integer,
    deep nesting), or None."""
    try:
        check_plain(row)
    except JSONInputError as exc:
        return str(exc)
    return None


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


def private_dir(path: Path) -> Path:
    """`path` (and missing parents) created 0700, and made 0700 if it exists: what the controller writes
    there (datasets, uploads, hf-cache) is for its own user only, whatever the umask."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(path, 0o700)
    except PermissionError:  # an existing dir of another owner: left as its owner set it
        pass
    return path


def private_tree(path: Path) -> None:
    """Every dir under `path` 0700 and every file 0600 (what a library such as `datasets` left there under
    the process umask: lock files, streamed-module caches); symlinks are not followed."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o700 if name in dirs else 0o600)


class Normalized(BaseModel):
    path: str
    content_hash: str
    num_rows: int
    mapping: FieldMapping


def normalize(rows: Iterator[Row], mapping: FieldMapping, out_dir: Path, *, max_errors: int = 10,
              max_row_bytes: int = 8 << 20, unit: str = "line") -> Normalized:
    """Validate and write every row's payload to a new file in `out_dir`; raise DatasetError listing
    the first `max_errors` bad rows (nothing is written then)."""
    private_dir(out_dir)
    tmp = out_dir / f".tmp-{uuid.uuid4().hex}.jsonl"
    errors: list[dict] = []
    resolved: FieldMapping | None = None
    digest = hashlib.sha256()
    count = 0
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            for n, row in rows:
                if isinstance(row, DatasetError):
                    errors.append({"line": n, "field": None, "error": row.message})
                elif not isinstance(row, dict):
                    errors.append({"line": n, "field": None, "error": f"expected an object, got {_type_name(row)}"})
                elif (bad := _not_plain(row)) is not None:
                    errors.append({"line": n, "field": None, "error": bad})
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
                        line = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                                          allow_nan=False)
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
