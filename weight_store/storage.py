"""The on-disk layout of the weight store, and the only code that changes it.

    <root>/<run>/<version>/manifest.json + weight and config files   committed, immutable
    <root>/.staging/<run>/<version>/                                  uploads not yet committed
    <root>/.pins/<run>/<version>                                      pin markers (retention skips them)
    <root>/.trash/                                                    versions being deleted

A version becomes visible in one atomic `rename` of its complete staging dir (manifest last), so a
reader listing `<root>/<run>/` never sees a partial version, and a crash at any moment leaves at most
staging or trash leftovers, removed by `clean_leftovers()` at start-up. Run ids follow
shared.subjects.check_run_id (`[A-Za-z0-9_-]`), so they never collide with the dot-dirs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.subjects import check_run_id
from weight_store.manifest import MANIFEST, MANIFEST_FORMAT, manifest_bytes

_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSION_RE = re.compile(r"^[0-9]{1,12}$")


class StoreError(Exception):
    """A refused request: `status` is the HTTP status, `code` a short machine-readable reason."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def bad_name(what: str, value: object, rule: str) -> StoreError:
    return StoreError(400, "bad_name", f"{what} {str(value)[:200]!r} is invalid: {rule}")


def check_run(run: str) -> str:
    try:
        return check_run_id(run)
    except ValueError as exc:
        raise StoreError(400, "bad_name", str(exc)) from None


def check_version(version: str | int) -> int:
    text = str(version)
    if isinstance(version, bool) or not _VERSION_RE.match(text):
        raise bad_name("version", version, "use a non-negative integer of at most 12 digits")
    return int(text)


def check_file_name(name: str) -> str:
    """A relative file path of plain segments (`config.json`, `tokenizer/tokenizer.json`): no `..`,
    no absolute path, no empty segment, no odd characters; the top-level `manifest.json` is the store's."""
    rule = ("use '/'-separated segments of 1-128 characters of A-Z a-z 0-9 . _ -, each starting with a letter "
            "or digit, at most 8 deep, no '..'")
    if not isinstance(name, str) or len(name) > 512:
        raise bad_name("file name", name, rule)
    segments = name.split("/")
    if len(segments) > 8 or not all(_FILE_RE.match(seg) and ".." not in seg for seg in segments):
        raise bad_name("file name", name, rule)
    if name == MANIFEST:
        raise bad_name("file name", name, "manifest.json is written by the store at commit")
    return name


def _record_name(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest() + ".json"


@dataclass
class FileRecord:
    name: str
    size: int
    sha256: str

    def as_dict(self) -> dict:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Storage:
    """Versions of runs under one root directory. Methods are blocking; the server calls them in threads."""

    def __init__(self, root: str | os.PathLike, fsync: bool = False):
        self.root = Path(root).resolve()
        self.fsync = fsync
        self.staging = self.root / ".staging"
        self.pins = self.root / ".pins"
        self.trash = self.root / ".trash"
        for d in (self.root, self.staging, self.pins, self.trash):
            d.mkdir(parents=True, exist_ok=True)

    # --- start-up ---------------------------------------------------------------------------------

    def clean_leftovers(self) -> int:
        """Remove uncommitted uploads and half-deleted versions left by a crash; returns how many."""
        n = 0
        for parent in (self.staging, self.trash):
            for child in parent.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
                n += 1
        return n

    def clean_stale_staging(self, ttl_s: float) -> int:
        """Remove staging dirs untouched for `ttl_s` (abandoned uploads)."""
        n, cutoff = 0, time.time() - ttl_s
        for run_dir in self.staging.iterdir():
            for vdir in run_dir.iterdir():
                try:
                    if vdir.stat().st_mtime < cutoff:
                        shutil.rmtree(vdir, ignore_errors=True)
                        n += 1
                except FileNotFoundError:
                    pass
        return n

    # --- reading ----------------------------------------------------------------------------------

    def runs(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def versions(self, run: str) -> list[int]:
        d = self.root / check_run(run)
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if _VERSION_RE.match(p.name))

    def latest(self, run: str) -> int | None:
        vs = self.versions(run)
        return vs[-1] if vs else None

    def version_dir(self, run: str, version: int) -> Path:
        return self.root / check_run(run) / str(check_version(version))

    def manifest_raw(self, run: str, version: int) -> bytes:
        try:
            return (self.version_dir(run, version) / MANIFEST).read_bytes()
        except FileNotFoundError:
            raise StoreError(404, "not_found", f"run {run!r} has no version {version}") from None

    def manifest(self, run: str, version: int) -> dict:
        return json.loads(self.manifest_raw(run, version))

    def file_entry(self, run: str, version: int, name: str) -> tuple[Path, dict]:
        check_file_name(name)
        manifest = self.manifest(run, version)
        for f in manifest["files"]:
            if f["name"] == name:
                return self.version_dir(run, version) / name, f
        raise StoreError(404, "not_found", f"version {version} of run {run!r} has no file {name!r}")

    # --- uploading --------------------------------------------------------------------------------

    def staging_dir(self, run: str, version: int) -> Path:
        d = self.staging / check_run(run) / str(check_version(version))
        (d / ".files").mkdir(parents=True, exist_ok=True)
        os.utime(d)
        return d

    def new_part(self, run: str, version: int, name: str) -> Path:
        """A fresh temporary path inside the version's staging dir for one upload of `name`."""
        check_file_name(name)
        if (self.version_dir(run, version) / MANIFEST).exists():
            raise StoreError(409, "exists", f"version {version} of run {run!r} is already committed")
        return self.staging_dir(run, version) / f".{uuid.uuid4().hex}.part"

    def finish_part(self, run: str, version: int, name: str, part: Path, size: int, sha256: str) -> FileRecord:
        """Move a fully received, digest-checked upload to its name in staging and record its digest."""
        d = self.staging_dir(run, version)
        if self.fsync:
            fd = os.open(part, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, d / name)
        rec = FileRecord(name, size, sha256)
        tmp = d / ".files" / f".{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(rec.as_dict()))
        os.replace(tmp, d / ".files" / _record_name(name))
        return rec

    def staged_files(self, run: str, version: int) -> dict[str, FileRecord]:
        d = self.staging / check_run(run) / str(check_version(version)) / ".files"
        out = {}
        if d.is_dir():
            for p in d.glob("*.json"):
                rec = json.loads(p.read_text())
                out[rec["name"]] = FileRecord(rec["name"], rec["size"], rec["sha256"])
        return out

    def abort(self, run: str, version: int) -> bool:
        d = self.staging / check_run(run) / str(check_version(version))
        existed = d.exists()
        shutil.rmtree(d, ignore_errors=True)
        return existed

    def commit(self, run: str, version: int, declared: list[dict], step: int = 0, dtype: str = "",
               metadata: dict | None = None) -> tuple[dict, bytes]:
        """Check the declared files against what was uploaded, write the manifest, rename into place.

        Returns (manifest, manifest bytes). Raises StoreError 409 if the version exists, 400 if a
        declared file is missing or differs from the upload.
        """
        run, version = check_run(run), check_version(version)
        final = self.version_dir(run, version)
        if final.exists():
            raise StoreError(409, "exists", f"version {version} of run {run!r} is already committed")
        staged = self.staged_files(run, version)
        if not declared:
            raise StoreError(400, "bad_commit", "a commit must list at least one file")
        names = set()
        for f in declared:
            name = check_file_name(str(f.get("name", "")))
            if name in names:
                raise StoreError(400, "bad_commit", f"file {name!r} is listed twice")
            names.add(name)
            got = staged.get(name)
            if got is None:
                raise StoreError(400, "missing_file", f"file {name!r} was not uploaded for version {version}")
            if int(f.get("size", -1)) != got.size or str(f.get("sha256", "")).lower() != got.sha256:
                raise StoreError(400, "digest_mismatch",
                                 f"file {name!r}: declared size {f.get('size')} sha256 {f.get('sha256')}, "
                                 f"uploaded size {got.size} sha256 {got.sha256}")
        manifest = {
            "format": MANIFEST_FORMAT,
            "run": run,
            "version": version,
            "step": int(step),
            "dtype": dtype,
            "created_at": time.time(),
            "files": [staged[n].as_dict() for n in sorted(names)],
            "metadata": metadata or {},
        }
        raw = manifest_bytes(manifest)
        stage = self.staging_dir(run, version)
        shutil.rmtree(stage / ".files", ignore_errors=True)
        for extra in list(stage.rglob("*")):  # files uploaded but not declared, unfinished parts
            if extra.is_file() and extra.relative_to(stage).as_posix() not in names:
                extra.unlink(missing_ok=True)
        (stage / MANIFEST).write_bytes(raw)
        if self.fsync:
            for n in [*names, MANIFEST]:
                fd = os.open(stage / n, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            _fsync_dir(stage)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(stage, final)  # the commit: atomic, and refuses a non-empty existing target
        except OSError:
            if final.exists():
                raise StoreError(409, "exists", f"version {version} of run {run!r} is already committed") from None
            raise
        if self.fsync:
            _fsync_dir(final.parent)
        return manifest, raw

    # --- retention --------------------------------------------------------------------------------

    def pinned(self, run: str) -> set[int]:
        d = self.pins / check_run(run)
        return {int(p.name) for p in d.iterdir() if _VERSION_RE.match(p.name)} if d.is_dir() else set()

    def pin(self, run: str, version: int) -> None:
        self.manifest_raw(run, version)  # 404 if absent
        d = self.pins / check_run(run)
        d.mkdir(parents=True, exist_ok=True)
        (d / str(check_version(version))).touch()

    def unpin(self, run: str, version: int) -> bool:
        p = self.pins / check_run(run) / str(check_version(version))
        existed = p.exists()
        p.unlink(missing_ok=True)
        return existed

    def to_retire(self, run: str, keep_last: int, busy: set[int] = frozenset()) -> list[int]:
        """Versions beyond the newest `keep_last` that are neither pinned nor being read."""
        vs = self.versions(run)
        keep = set(vs[-keep_last:]) | self.pinned(run) | set(busy)
        return [v for v in vs if v not in keep]

    def delete(self, run: str, version: int) -> None:
        """Remove a committed version: one rename makes it vanish whole, then the files go."""
        src = self.version_dir(run, version)
        dst = self.trash / f"{run}-{version}-{uuid.uuid4().hex}"
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return
        shutil.rmtree(dst, ignore_errors=True)
        (self.pins / run / str(version)).unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    buf = bytearray(chunk)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(mv):
            h.update(mv[:n])
    return h.hexdigest()
