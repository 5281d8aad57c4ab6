"""The on-disk layout of the weight store, and the only code that changes it.

    <root>/<run>/<version>/manifest.json + weight and config files   committed, immutable
    <root>/<run>/<version>/.delta/                                    its delta against an older version
    <root>/<run>/<version>/.pieces.json                               its piece digests (relay fan-out)
    <root>/.staging/<run>/<version>/                                  uploads not yet committed
    <root>/.pins/<run>/<version>                                      pin markers (retention skips them)
    <root>/.trash/                                                    versions being deleted

A version becomes visible in one atomic `rename` of its complete staging dir (manifest last), so a
reader listing `<root>/<run>/` never sees a partial version, and a crash at any moment leaves at most
staging or trash leftovers, removed by `clean_leftovers()` at start-up. Run ids follow
shared.contract.subjects.check_run_id (`[A-Za-z0-9_-]`), so they never collide with the dot-dirs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.contract.subjects import check_run_id
from weight_store.delta import build_delta
from weight_store.manifest import MANIFEST, manifest_bytes, new_manifest
from weight_store.pieces import write_pieces

# Always fullmatch: with re.match, `$` also matches before a trailing newline ("1\n" would pass).
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
log = logging.getLogger("jetrl.weights.server")
_VERSION_RE = re.compile(r"[0-9]{1,12}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
    if isinstance(version, bool) or not _VERSION_RE.fullmatch(text):
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
    if len(segments) > 8 or not all(_FILE_RE.fullmatch(seg) and ".." not in seg for seg in segments):
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
    xxh3_128: str = ""  # computed by the store from the received bytes ('' in records of older stores)

    def as_dict(self) -> dict:
        d = {"name": self.name, "size": self.size, "sha256": self.sha256}
        if self.xxh3_128:
            d["xxh3_128"] = self.xxh3_128
        return d

    @classmethod
    def of(cls, r: dict) -> FileRecord:
        return cls(r["name"], r["size"], r["sha256"], r.get("xxh3_128", ""))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Storage:
    """Versions of runs under one root directory. Methods are blocking; the server calls them in threads."""

    def __init__(self, root: str | os.PathLike, fsync: bool = False):
        self._records_lock = threading.Lock()
        self.root = Path(root).resolve()
        self.fsync = fsync
        self.last_delta: dict | None = None  # the delta document the last commit wrote (None: none)
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
        return sorted(int(p.name) for p in d.iterdir() if _VERSION_RE.fullmatch(p.name))

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

    def finish_part(self, run: str, version: int, name: str, part: Path, size: int, sha256: str,
                    xxh3_128: str = "") -> FileRecord:
        """Record a fully received, digest-checked upload of `name`. The upload stays in its own part file
        and the record names that part: two uploads of the same name can never pair one's bytes with the
        other's digest (the last record written wins, whole). Commit moves the recorded part to `name`."""
        d = self.staging_dir(run, version)
        if self.fsync:
            fd = os.open(part, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        rec = FileRecord(name, size, sha256, xxh3_128)
        record = d / ".files" / _record_name(name)
        tmp = d / ".files" / f".{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(dict(rec.as_dict(), part=part.name)))
        with self._records_lock:
            old = self._read_record(record)
            os.replace(tmp, record)
        if old is not None and old.get("part") and old["part"] != part.name:
            (d / old["part"]).unlink(missing_ok=True)  # the replaced upload's bytes
        return rec

    @staticmethod
    def _read_record(path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def staged_files(self, run: str, version: int) -> dict[str, FileRecord]:
        return {name: FileRecord.of(r) for name, r in self._staged_records(run, version).items()}

    def _staged_records(self, run: str, version: int) -> dict[str, dict]:
        d = self.staging / check_run(run) / str(check_version(version)) / ".files"
        out = {}
        if d.is_dir():
            for p in d.glob("*.json"):
                rec = self._read_record(p)
                if rec is not None:
                    out[rec["name"]] = rec
        return out

    def abort(self, run: str, version: int) -> bool:
        d = self.staging / check_run(run) / str(check_version(version))
        existed = d.exists()
        shutil.rmtree(d, ignore_errors=True)
        return existed

    def commit(self, run: str, version: int, declared: list[dict], step: int = 0, dtype: str = "",
               metadata: dict | None = None, adapter: dict | None = None,
               delta: tuple[int, float] | None = None, piece_size: int = 0) -> tuple[dict, bytes]:
        """Check the declared files against what was uploaded, write the manifest, rename into place.
        With `delta` = (zstd level, max ratio), the version's delta against the run's newest older version
        (weight_store/delta.py) is written first, so the version appears with it (`self.last_delta`: its
        document, or None); with `piece_size`, its piece digests for relay fan-out (weight_store/pieces.py).

        Returns (manifest, manifest bytes). Raises StoreError 409 if the version exists, 400 if a
        declared file is missing, malformed, in conflict with another name, or differs from the upload.
        The caller must keep uploads of this version from running meanwhile (the server does).
        """
        run, version = check_run(run), check_version(version)
        final = self.version_dir(run, version)
        if final.exists():
            raise StoreError(409, "exists", f"version {version} of run {run!r} is already committed")
        if not declared:
            raise StoreError(400, "bad_commit", "a commit must list at least one file")
        records = self._staged_records(run, version)
        names: set[str] = set()
        for f in declared:
            name = check_file_name(f.get("name", "") if isinstance(f.get("name"), str) else "")
            if name in names:
                raise StoreError(400, "bad_commit", f"file {name!r} is listed twice")
            names.add(name)
            size, sha = f.get("size"), f.get("sha256")
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
                raise StoreError(400, "bad_commit", f"file {name!r}: size must be a non-negative integer, got {size!r}"[:300])
            if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha.lower()):
                raise StoreError(400, "bad_commit", f"file {name!r}: sha256 must be 64 hex digits, got {sha!r}"[:300])
            got = records.get(name)
            if got is not None and not (self.staging / run / str(version) / got.get("part", "")).is_file():
                got = None  # its bytes are gone (an abort, a staging clean-up)
            if got is None:
                raise StoreError(400, "missing_file", f"file {name!r} was not uploaded for version {version}")
            if size != got["size"] or sha.lower() != got["sha256"]:
                raise StoreError(400, "digest_mismatch",
                                 f"file {name!r}: declared size {size} sha256 {sha}, "
                                 f"uploaded size {got['size']} sha256 {got['sha256']}")
        for name in names:  # `cfg` and `cfg/x` cannot both exist
            parts = name.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in names:
                    raise StoreError(400, "name_conflict", f"files {'/'.join(parts[:i])!r} and {name!r} conflict: "
                                                           "one would be the directory of the other")
        manifest = new_manifest(run, version, step, [FileRecord.of(records[n]).as_dict() for n in sorted(names)],
                                dtype=dtype, metadata=metadata, adapter=adapter)
        raw = manifest_bytes(manifest)
        stage = self.staging_dir(run, version)
        for n in sorted(names):
            dest = stage / n
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / records[n]["part"], dest)
        shutil.rmtree(stage / ".files", ignore_errors=True)
        for extra in sorted(stage.rglob("*"), reverse=True):  # undeclared uploads, unfinished parts, empty dirs
            rel = extra.relative_to(stage).as_posix()
            if extra.is_dir() and not extra.is_symlink():
                if not any(n.startswith(rel + "/") for n in names):
                    shutil.rmtree(extra, ignore_errors=True)
            elif rel not in names:
                extra.unlink(missing_ok=True)
        (stage / MANIFEST).write_bytes(raw)
        self.last_delta = self._write_delta(run, version, stage, manifest, delta) if delta else None
        if piece_size:
            write_pieces(stage, manifest, piece_size)
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

    def _write_delta(self, run: str, version: int, stage: Path, manifest: dict, delta: tuple[int, float]) -> dict | None:
        older = [v for v in self.versions(run) if v < version]
        if not older:
            return None
        try:
            return build_delta(stage, manifest, self.version_dir(run, older[-1]), self.manifest(run, older[-1]),
                               *delta)
        except (OSError, ValueError, KeyError, StoreError) as exc:  # the base went away or is malformed
            log.warning("no delta for version %d of run %s (%s: %s)", version, run, type(exc).__name__, exc)
            return None

    # --- retention --------------------------------------------------------------------------------

    def pinned(self, run: str) -> set[int]:
        d = self.pins / check_run(run)
        return {int(p.name) for p in d.iterdir() if _VERSION_RE.fullmatch(p.name)} if d.is_dir() else set()

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

