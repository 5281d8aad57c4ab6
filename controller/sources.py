"""Where server-side dataset files may come from: every local path a client names (a /v1/datasets/path
file, a /v1/datasets/hf builder's data_files, a local dataset dir) is resolved and confined to
controller.path_roots before anything is read, and the Hugging Face `datasets` library is handed only
those resolved files.

Rules (docs/controller.md, "Auth and what a client cannot do"):
- A relative path is taken relative to the FIRST root, never the controller's working directory.
- Symlinks are resolved; the resolved file must lie under a root. `..` segments in a glob are refused.
- A glob is expanded here (under its non-glob directory, itself confined); every match is confined.
- Missing, unreadable and forbidden paths get one and the same answer (403 naming only what the client
  sent), so the answer tells nothing about the host's files.
- Every `datasets` builder is treated alike: its data_files are local paths (no allow-list of "file
  builders" to go stale; the builder names come from datasets.packaged_modules). Remote URLs (http://,
  hf://, s3://...) in data_files are refused; a hub dataset is named by its id and loaded as
  hf://datasets/<id>, so a directory of that name under the working directory is never read.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from pathlib import Path

from controller.datasets import DatasetError, ReadBudget, Row, rows_of_batches

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
_HUB_FILE = re.compile(r"[A-Za-z0-9_.*?\[\]{}-][A-Za-z0-9_.*?/\[\]{},-]{0,511}")
_MAGIC = re.compile(r"[*?\[\]{}]")
MAX_MATCHES = 10_000


def builders() -> set[str]:
    """The packaged builders of the installed `datasets` (json, csv, parquet, text, xml, ...)."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return set()
    return set(_PACKAGED_DATASETS_MODULES)


def _refused(path: str, roots: list[str], what: str) -> DatasetError:
    if not roots:
        return DatasetError(f"{what} {path!r}: server-side paths are off (controller.path_roots is empty): upload "
                            f"the file, or add its directory to controller.path_roots", status=403)
    return DatasetError(f"{what} {path!r}: not found, not readable, or not under controller.path_roots {roots} "
                        f"(relative paths are taken from the first root; symlinks are resolved)", status=403)


def _resolved_roots(roots: list[str]) -> list[Path]:
    out = []
    for r in roots:
        try:
            out.append(Path(r).expanduser().resolve(strict=True))
        except (OSError, RuntimeError):
            continue
    return out


def _inside(p: Path, allowed: list[Path]) -> bool:
    return any(p.is_relative_to(r) for r in allowed)


def _absolute(path: str, allowed: list[Path]) -> Path | None:
    if "\x00" in path or "://" in path or not allowed:
        return None
    p = Path(path)
    return p if p.is_absolute() else allowed[0] / p


def _resolve_under(p: Path | None, allowed: list[Path], kind: str) -> Path | None:
    try:
        if p is None:
            return None
        p = p.resolve(strict=True)
        ok = _inside(p, allowed) and os.access(p, os.R_OK) and \
            {"file": p.is_file(), "dir": p.is_dir(), "any": p.is_file() or p.is_dir()}[kind]
    except (OSError, RuntimeError, ValueError):
        return None
    return p if ok else None


def confine(path: str, roots: list[str], what: str = "path", kind: str = "file") -> Path:
    """`path` resolved (symlinks followed) when it is an existing readable `kind` ("file", "dir" or "any")
    under one of `roots`; else DatasetError 403, the same for every reason."""
    allowed = _resolved_roots(roots)
    p = _resolve_under(_absolute(path, allowed), allowed, kind)
    if p is None:
        raise _refused(path, roots, what)
    return p


def expand(pattern: str, roots: list[str], what: str = "data file") -> list[Path]:
    """The files `pattern` (a path or a glob) names under the roots, each resolved and confined."""
    if not _MAGIC.search(pattern):
        return [confine(pattern, roots, what, "any")]
    allowed = _resolved_roots(roots)
    p = _absolute(pattern, allowed)
    if p is None or ".." in p.parts:
        raise _refused(pattern, roots, what)
    fixed = []
    for part in p.parts:
        if _MAGIC.search(part):
            break
        fixed.append(part)
    base = _resolve_under(Path(*fixed), allowed, "dir")  # the listing starts inside a root
    if base is None:
        raise _refused(pattern, roots, what)
    rest = str(p.relative_to(Path(*fixed)))
    out: list[Path] = []
    for m in glob.iglob(glob.escape(str(base)) + os.sep + rest, recursive=True):
        try:
            r = Path(m).resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if r.is_file():
            if not _inside(r, allowed) or not os.access(r, os.R_OK):
                raise _refused(pattern, roots, what)  # a match escapes (a symlink): refuse, read nothing
            out.append(r)
        if len(out) > MAX_MATCHES:
            raise DatasetError(f"{what} {pattern!r} matches more than {MAX_MATCHES} files: narrow it", status=422)
    if not out:
        raise _refused(pattern, roots, what)
    return sorted(set(out))


def _no_magic(files: list[Path], what: str) -> list[str]:
    for f in files:  # `datasets` globs every data file again: a name with glob characters could widen
        if _MAGIC.search(str(f)):
            raise DatasetError(f"{what}: a file name with glob characters ({f.name!r}) cannot be loaded: rename it",
                               status=422)
    return [str(f) for f in files]


def hf_source(name: str, data_files: list[str] | None, roots: list[str]) -> tuple[str, object, int | None]:
    """What /v1/datasets/hf loads: (name for load_dataset, data_files, bytes on disk of the local files or
    None for a hub dataset). DatasetError 403 / 422 for anything else."""
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:  # a local dataset dir
        if data_files:
            raise DatasetError("a local dataset dir takes no data_files: name a builder (json, parquet, ...) with "
                               "data_files instead", status=422)
        d = confine(name, roots, "dataset dir", "dir")
        return _local_dir(d, name, roots)
    if name in builders():
        if not data_files:
            raise DatasetError(f"builder {name!r} reads data_files: name the files (under controller.path_roots)",
                               status=422)
        files = [f for pat in data_files for f in expand(pat, roots)]
        return name, _no_magic(files, "data_files"), sum(f.stat().st_size for f in files)
    if not _HUB_ID.fullmatch(name) or ".." in name:
        raise DatasetError(f"name {name!r} is neither a Hugging Face hub id (owner/name) nor a builder "
                           f"({', '.join(sorted(builders()))}) nor a local dataset dir (/... or ./...)", status=422)
    for f in data_files or []:  # files inside a hub repo: relative names only
        if not _HUB_FILE.fullmatch(f) or ".." in f or "://" in f or f.startswith("/"):
            raise DatasetError(f"data file {f!r} of hub dataset {name!r} must be a relative path inside "
                               f"the dataset repo (no URL, no absolute path, no '..')", status=422)
    return f"hf://datasets/{name}", data_files, None


def _local_dir(d: Path, name: str, roots: list[str]) -> tuple[str, object, int]:
    """A local dataset dir as `datasets` lays it out (split names from file and dir names), every file
    resolved and confined; the builder is inferred from the files' extensions. README configs are not read."""
    from datasets.data_files import DataFilesDict, get_data_patterns
    from datasets.load import infer_module_for_data_files

    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(d)), base_path=str(d))
        module, kwargs = infer_module_for_data_files(files, path=str(d))
    except Exception:
        raise DatasetError(f"dataset dir {name!r}: no data files that `datasets` can read", status=422) from None
    out, size = {}, 0
    allowed = _resolved_roots(roots)
    for split, names in files.items():
        resolved = []
        for f in names:
            r = Path(f).resolve()
            if not _inside(r, allowed) or not r.is_file():
                raise _refused(name, roots, "dataset dir")
            resolved.append(r)
            size += r.stat().st_size
        out[split] = _no_magic(resolved, f"dataset dir {name!r}")
    if module is None or kwargs:
        raise DatasetError(f"dataset dir {name!r}: cannot tell which builder reads its files", status=422)
    return module, out, size


def read_hf(name: str, split: str, subset: str | None = None, data_files=None, revision: str | None = None,
            cache_dir: str | None = None, budget: ReadBudget | None = None,
            max_row_bytes: int | None = None) -> Iterator[Row]:
    """Rows of a Hugging Face dataset, streamed (nothing is copied into the cache) as Arrow batches, each row
    counted against `budget` before it is decoded (datasets.rows_of_batches). `name`/`data_files` must come
    from hf_source."""
    try:
        import datasets
    except ImportError:
        raise DatasetError("the `datasets` library is not installed: pip install 'jetrl[datasets]'", status=422) from None
    try:
        ds = datasets.load_dataset(name, subset, split=split, data_files=data_files, revision=revision,
                                   cache_dir=cache_dir, streaming=True)
    except Exception as exc:
        raise DatasetError(f"cannot load Hugging Face dataset {name.removeprefix('hf://datasets/')!r} split "
                           f"{split!r}: {type(exc).__name__}{_hint(exc)}") from None
    if isinstance(ds, dict) or not hasattr(ds, "iter"):
        raise DatasetError(f"dataset {name!r} did not return a single split; name one with split=")

    def batches():
        for table in ds.with_format("arrow").iter(batch_size=256):
            yield from table.to_batches()

    n = 0
    try:
        for n, row in rows_of_batches(batches(), budget, max_row_bytes):
            yield n, row
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"reading the dataset failed after row {n}: {type(exc).__name__}{_hint(exc)}") from None


def _hint(exc: Exception) -> str:
    """The library's message without host paths (they may name files the client never sent)."""
    text = re.sub(r"(/[^\s'\",:]+)+", "<path>", str(exc))[:300]
    return f": {text}" if text else ""
