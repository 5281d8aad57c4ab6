"""The weight store client used by the trainer (publish) and the rollout workers (fetch).

    client = WeightStoreClient(cfg.weights)
    wv = await client.publish_version(js, run, version, hf_dir, step=step, metadata={"instance": me})
    path = await client.fetch(run, version)      # a dir: config.json + safetensors, from_pretrained-able
    sd = load_state_dict(path)

`publish_version` is a version's whole way out: upload + commit (`publish`) + announcement in the
weights KV with compare-and-set (weight_store.announce), idempotent per (instance, version) so a
retry after a lost reply finishes instead of failing. It goes through `publish_and_announce`, the one
commit-then-announce path of every publisher (the trainer's `directory` publisher commits into its own
dir and takes the same path). `publish` streams safetensors shards (at most
`shard_size_mb` of tensor data each) from tensor memory or a dir's files, `parallel_transfers` at a
time, then commits the version (no announcement). `fetch` uses the store's own files
in place when `root` is mounted here (`shared_fs`), else downloads into `cache_dir` with resume and
sha256 checks. Blocking socket and file work runs in threads; the API is async.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import torch

from shared.config import WeightStoreConfig
from shared.contract.messages import WeightVersion
from weight_store import shards as sh
from weight_store import transfer
from weight_store.announce import VersionConflict, announce, latest
from weight_store.delta import DELTA_DIR, DeltaRefused, apply_file, blob_name, check_delta
from weight_store.manifest import (
    MANIFEST,
    check_adapter,
    file_digest,
    hash_file,
    kind,
    manifest_bytes,
    manifest_sha256,
)
from weight_store.storage import check_file_name, check_run, check_version
from weight_store.transfer import DigestMismatch, TransferError, WeightStoreError
from weight_store.verify import AnnouncementRefused, StoreCheck, manifest_refusal

log = logging.getLogger("jetrl.weights.client")

__all__ = ["AnnouncementRefused", "DigestMismatch", "TransferError", "VersionConflict", "VersionStore",
           "VersionTakenError", "WeightStoreClient", "WeightStoreError", "load_state_dict", "publish_and_announce"]


class VersionTakenError(RuntimeError):
    """The weight store already holds this version from another publisher instance that never announced
    it (it died between commit and announcement): skip the number, the store's versions are immutable."""


class VersionStore(Protocol):
    """Where a publisher commits versions, as `publish_and_announce` reads it: WeightStoreClient, or the
    trainer's directory publisher's dir (trainer_service/publish.py)."""

    async def manifest(self, run: str, version: int) -> dict:
        """The committed manifest (WeightStoreError 404 when the version is absent)."""

    def manifest_url(self, run: str, version: int) -> str: ...
    def store_check(self, run: str) -> StoreCheck: ...


async def publish_and_announce(js, store: VersionStore, run: str, version: int, step: int, metadata: dict | None,
                               commit: Callable[[], Awaitable[WeightVersion]], on_forged=None,
                               short: int = 0) -> WeightVersion:
    """The one way a version goes out, whatever the store: `commit()` (the store's upload + commit; it
    raises WeightStoreError 409 `exists` when the store already holds the version), then `announce` in
    the weights KV (compare-and-set; an announcement the store does not hold as announced is overwritten
    and `on_forged` told).

    Idempotent per (instance, version), the instance being named in `metadata` (same step and metadata =
    the same publish): a retry whose commit or announcement went through and only the reply was lost
    finishes. Raises VersionConflict when this version or a newer one is already announced (another
    publisher is ahead), VersionTakenError when another publisher committed this version but never
    announced it (skip the number). `short` goes into the announcement (WeightVersion.short)."""
    try:
        wv = await commit()
    except WeightStoreError as exc:
        if exc.status != 409 or exc.code != "exists":
            raise
        wv = await _committed_before(js, store, run, version, step, metadata or {})
    wv.short = short
    await announce(js, wv, refusal=store.store_check(run).refusal, on_forged=on_forged)
    return wv


async def _committed_before(js, store: VersionStore, run: str, version: int, step: int,
                            metadata: dict) -> WeightVersion:
    """The store already has `version`. Committed by an earlier attempt of this very publish (the
    commit's reply was lost): use it. Committed by another publisher instance: if that version (or a
    newer one) is announced, another publisher is ahead (VersionConflict); if not, it died between
    commit and announcement (VersionTakenError: skip the number)."""
    m = await store.manifest(run, version)
    if m.get("step") != step or m.get("metadata") != metadata:
        announced = await latest(js, run)
        if announced is not None and announced.version >= version and \
                await store.store_check(run).refusal(announced) is None:
            raise VersionConflict(run, version, announced.version)
        raise VersionTakenError(
            f"run {run!r}: version {version} is already in the weight store from another trainer "
            f"instance (step {m.get('step')}, metadata {m.get('metadata')}), but was never announced")
    return WeightVersion(run=run, version=version, step=step, manifest_url=store.manifest_url(run, version),
                         files=m["files"], sha256=manifest_sha256(m), created_at=m["created_at"])


class WeightStoreClient:
    def __init__(self, cfg: WeightStoreConfig):
        self.cfg = cfg
        self.base = cfg.url.rstrip("/")
        self.chunk = cfg.chunk_mb << 20
        self._sem = asyncio.Semaphore(cfg.parallel_transfers)
        self._fetching: dict[tuple[str, int], asyncio.Lock] = {}
        self._checks: dict[str, StoreCheck] = {}
        self.cache = Path(cfg.cache_dir) if cfg.cache_dir else Path(tempfile.gettempdir()) / "jetrl-weights-cache"
        # HTTP fetches so far: versions rebuilt from a delta / downloaded whole (from the store or, of those,
        # `relay_fetches` through the relay chain), their bytes, and deltas refused (a rebuilt file that did
        # not match the manifest, a malformed delta document)
        self.stats = Counter({"delta_fetches": 0, "full_fetches": 0, "delta_bytes": 0, "full_bytes": 0,
                              "delta_refused": 0, "relay_fetches": 0})
        self.relay = None  # weights.fanout=relay: this host's RelayNode (weight_store/relay.py), made at first use

    # --- small requests ---------------------------------------------------------------------------

    def _headers(self, write: bool) -> dict[str, str]:
        tok = self.cfg.secret("token") if write else (self.cfg.secret("read_token") or self.cfg.secret("token"))
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    async def _json(self, method: str, path: str, body: dict | None = None, write: bool = False) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        _, _, raw = await asyncio.to_thread(transfer.request, method, self.base + path, self._headers(write), data,
                                            self.cfg.timeout_s)
        return json.loads(raw)

    def _vpath(self, run: str, version: int) -> str:
        return f"/v1/runs/{quote(check_run(run))}/versions/{check_version(version)}"

    def manifest_url(self, run: str, version: int) -> str:
        return self.base + self._vpath(run, version) + "/manifest"

    async def runs(self) -> list[str]:
        return (await self._json("GET", "/v1/runs"))["runs"]

    async def versions(self, run: str) -> list[int]:
        return (await self._json("GET", f"/v1/runs/{quote(check_run(run))}/versions"))["versions"]

    async def latest(self, run: str) -> dict | None:
        """The manifest of the run's newest committed version, or None when it has none."""
        try:
            return await self._json("GET", f"/v1/runs/{quote(check_run(run))}/latest")
        except WeightStoreError as exc:
            if exc.status == 404:
                return None
            raise

    async def manifest(self, run: str, version: int) -> dict:
        return await self._json("GET", self._vpath(run, version) + "/manifest")

    async def pin(self, run: str, version: int) -> None:
        await self._json("PUT", self._vpath(run, version) + "/pin", write=True)

    async def unpin(self, run: str, version: int) -> None:
        await self._json("DELETE", self._vpath(run, version) + "/pin", write=True)

    # --- publish ----------------------------------------------------------------------------------

    async def publish(self, run: str, version: int, state_dict_or_dir: Mapping[str, torch.Tensor] | str | os.PathLike,
                      step: int = 0, metadata: dict | None = None,
                      files: Mapping[str, str | os.PathLike | bytes] | None = None,
                      adapter: dict | None = None) -> WeightVersion:
        """Upload a state dict (as safetensors shards) or every file of a dir (subdirs too, dot-files
        skipped), then commit the version.

        `files` adds more files by name (config.json, tokenizer files) from paths or bytes. `adapter`
        makes it a LoRA version on a named base (weight_store/manifest.py, check_adapter). Does not
        announce: `publish_version` does both.
        """
        run, version = check_run(run), check_version(version)
        uploads: list[tuple[str, int, transfer.Buffers]] = []  # (name, size, buffers)
        dtype = ""
        if isinstance(state_dict_or_dir, (str, os.PathLike)):
            src = Path(state_dict_or_dir)
            if not src.is_dir():
                raise FileNotFoundError(f"publish: {src} is not a directory")
            for p in sorted(src.rglob("*")):
                rel = p.relative_to(src).as_posix()
                if p.is_file() and not any(seg.startswith(".") for seg in rel.split("/")):
                    uploads.append((check_file_name(rel), p.stat().st_size, transfer.file_buffers(p, self.chunk)))
            if not uploads:
                raise FileNotFoundError(f"publish: {src} holds no files")
        elif isinstance(state_dict_or_dir, Mapping):
            shards = sh.plan_shards(state_dict_or_dir, self.cfg.shard_size_mb << 20)
            dtype = sh.dtype_of(state_dict_or_dir)
            uploads += [(s.name, s.size, s.buffers(self.chunk)) for s in shards]
            if len(shards) > 1:
                idx = sh.index_json(shards)
                uploads.append((sh.INDEX_NAME, len(idx), _bytes_buffers(idx)))
        else:
            raise TypeError(f"publish: expected a state dict or a directory, got {type(state_dict_or_dir).__name__}")
        for name, item in (files or {}).items():
            check_file_name(name)
            if isinstance(item, (bytes, bytearray)):
                uploads.append((name, len(item), _bytes_buffers(bytes(item))))
            else:
                p = Path(item)
                uploads.append((name, p.stat().st_size, transfer.file_buffers(p, self.chunk)))
        names = [u[0] for u in uploads]
        if len(set(names)) != len(names):
            raise ValueError(f"publish: file names repeat: {sorted(n for n in names if names.count(n) > 1)}")
        vpath = self._vpath(run, version)

        async def put(name: str, size: int, buffers) -> dict:
            url = f"{self.base}{vpath}/files/{quote(name)}"
            async with self._sem:
                for attempt in range(self.cfg.retries + 1):
                    try:
                        _, digest = await asyncio.to_thread(transfer.put_stream, url, buffers, size,
                                                            self._headers(True), self.cfg.timeout_s)
                        return {"name": name, "size": size, "sha256": digest}
                    except TransferError:
                        if attempt == self.cfg.retries:
                            raise
                        await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            raise AssertionError("unreachable")

        declared = await asyncio.gather(*(put(*u) for u in uploads))
        body = {"files": declared, "step": step, "dtype": dtype, "metadata": metadata or {}}
        if adapter is not None:
            body["adapter"] = check_adapter(adapter)
        res = await self._json("POST", vpath + "/commit", body, write=True)
        m = res["manifest"]
        return WeightVersion(run=run, version=version, step=step, manifest_url=self.manifest_url(run, version),
                             files=m["files"], sha256=res["manifest_sha256"], created_at=m["created_at"])

    async def publish_version(self, js, run: str, version: int,
                              state_dict_or_dir: Mapping[str, torch.Tensor] | str | os.PathLike, step: int = 0,
                              metadata: dict | None = None,
                              files: Mapping[str, str | os.PathLike | bytes] | None = None,
                              adapter: dict | None = None, on_forged=None, short: int = 0) -> WeightVersion:
        """Upload + commit (`publish`) + announce in the weights KV (compare-and-set): the one call that
        makes a version visible to the rollout workers (`publish_and_announce` on this store: idempotent
        per (instance, version); VersionConflict, VersionTakenError)."""
        return await publish_and_announce(
            js, self, run, version, step, metadata,
            lambda: self.publish(run, version, state_dict_or_dir, step=step, metadata=metadata, files=files,
                                 adapter=adapter),
            on_forged=on_forged, short=short)

    def store_check(self, run: str) -> StoreCheck:
        """This run's weight_store.verify.StoreCheck (manifests cached): is an announcement the store's?"""
        return self._checks.setdefault(run, StoreCheck(self, run))

    # --- fetch ------------------------------------------------------------------------------------

    async def fetch(self, run: str, version: int, expect_sha256: str | None = None) -> Path:
        """A local dir holding the version's files: the store's own dir when mounted here, else a
        verified download in `cache_dir` (a partial download is resumed). `expect_sha256`: the manifest
        digest the announcement carries (WeightVersion.sha256); the manifest read (HTTP or shared FS)
        must hash to it, else AnnouncementRefused (code `manifest_mismatch`) and nothing is returned."""
        run, version = check_run(run), check_version(version)
        local = self._shared_dir(run, version)
        if local is not None:
            manifest = json.loads((local / MANIFEST).read_bytes())
            _expect(run, version, manifest, expect_sha256)
            await asyncio.to_thread(_check_files, local, manifest,
                                    self.cfg.digest if self.cfg.verify_shared_sha256 else None, self.chunk)
            return local
        async with self._fetching.setdefault((run, version), asyncio.Lock()):  # one download per version
            return await self._download(run, version, expect_sha256)

    async def _download(self, run: str, version: int, expect_sha256: str | None = None) -> Path:
        manifest = await self.manifest(run, version)
        _expect(run, version, manifest, expect_sha256)
        dest = self.cache / run / str(version)
        if (dest / MANIFEST).is_file():
            try:
                await asyncio.to_thread(_check_files, dest, manifest, None, self.chunk)
                return dest
            except WeightStoreError:
                shutil.rmtree(dest, ignore_errors=True)
        part = self.cache / run / f".{version}.partial"
        part.mkdir(parents=True, exist_ok=True)
        if not (self.cfg.delta and kind(manifest) == "full" and await self._from_delta(run, version, manifest, part)):
            relay = self.cfg.fanout == "relay" and sum(f["size"] for f in manifest["files"]) >= self.cfg.relay_min_mb << 20
            if not (relay and await self._from_relay(run, version, manifest, part, dest)):
                await self._download_full(run, version, manifest, part)
        (part / MANIFEST).write_bytes(manifest_bytes(manifest))
        tmp = self.cache / run / f".{version}.{uuid.uuid4().hex}.old"
        if dest.exists():
            dest.rename(tmp)
        part.rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        await asyncio.to_thread(self._prune_cache, run)
        return dest

    async def _download_full(self, run: str, version: int, manifest: dict, part: Path) -> None:
        vpath = self._vpath(run, version)

        async def get(f: dict) -> None:
            name = check_file_name(f["name"])
            async with self._sem:
                await asyncio.to_thread(transfer.get_file, f"{self.base}{vpath}/files/{quote(name)}", part / name,
                                        f["size"], f["sha256"], headers=self._headers(False), chunk=self.chunk,
                                        timeout=self.cfg.timeout_s, retries=self.cfg.retries,
                                        check=file_digest(f, self.cfg.digest) if self.cfg.verify_sha256 else None)

        await asyncio.gather(*(get(f) for f in manifest["files"]))
        self._count_full(manifest)

    def _count_full(self, manifest: dict) -> None:
        self.stats["full_fetches"] += 1
        self.stats["full_bytes"] += sum(f["size"] for f in manifest["files"])

    async def _from_relay(self, run: str, version: int, manifest: dict, part: Path, dest: Path) -> bool:
        """Fetch the version through the relay chain (weight_store/relay.py); False when the store has no
        piece digests for it. Every file is then checked against the manifest; a mismatch (which checked
        pieces should make impossible) empties `part` and the version is downloaded whole."""
        if self.relay is None:
            from weight_store.relay import RelayNode

            self.relay = RelayNode(self.cfg)
        if not await self.relay.fetch(self, run, version, manifest, part, dest):
            return False
        try:
            await asyncio.to_thread(_check_files, part, manifest, self.cfg.digest, self.chunk)
        except WeightStoreError as exc:
            log.error("run %s: version %d through the relays does not match its manifest (%s); fetching it whole",
                      run, version, exc)
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True, exist_ok=True)
            return False
        self.stats["relay_fetches"] += 1  # of the full fetches, those that went through the relay chain
        self._count_full(manifest)
        return True

    async def _from_delta(self, run: str, version: int, manifest: dict, part: Path) -> bool:
        """Rebuild `version` in `part` from the store's delta against a version in the cache; False (and
        `part` emptied) when the store has no delta, its base is not cached here, or the delta is refused
        (weight_store/delta.py: a document that does not fit, a blob that does not decompress to its size,
        a rebuilt file whose digest is not the manifest's: every file is checked, whatever verify_sha256)."""
        vpath = self._vpath(run, version)
        try:
            doc = await self._json("GET", vpath + "/delta")
        except WeightStoreError as exc:
            if exc.status == 404:
                return False
            raise
        base = doc.get("base") if isinstance(doc, dict) else None
        base_dir = self.cache / run / str(base) if isinstance(base, int) and not isinstance(base, bool) else None
        if base_dir is None or not (base_dir / MANIFEST).is_file():
            return False
        try:
            check_delta(doc, manifest, json.loads((base_dir / MANIFEST).read_bytes()))

            async def get(e: dict) -> None:
                name = check_file_name(e["name"])
                blob = None
                if e["mode"] != "copy":
                    blob = part / DELTA_DIR / blob_name(name)
                    async with self._sem:
                        await asyncio.to_thread(
                            transfer.get_file, f"{self.base}{vpath}/delta/files/{quote(name)}", blob, e["size"],
                            e["sha256"], headers=self._headers(False), chunk=self.chunk, timeout=self.cfg.timeout_s,
                            retries=self.cfg.retries, check=file_digest(e, self.cfg.digest))
                await asyncio.to_thread(apply_file, e, blob, base_dir / name, part / name)

            await asyncio.gather(*(get(e) for e in doc["files"]))
            shutil.rmtree(part / DELTA_DIR, ignore_errors=True)
            await asyncio.to_thread(_check_files, part, manifest, self.cfg.digest, self.chunk)
        except (DeltaRefused, DigestMismatch, WeightStoreError, FileNotFoundError) as exc:
            self.stats["delta_refused"] += 1
            log.warning("run %s: refused the delta of version %d against %s (%s); fetching it whole", run, version,
                        base, exc)
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True, exist_ok=True)
            return False
        self.stats["delta_fetches"] += 1
        self.stats["delta_bytes"] += sum(e["size"] for e in doc["files"])
        return True

    def _shared_dir(self, run: str, version: int) -> Path | None:
        if not self.cfg.shared_fs:
            return None
        d = Path(self.cfg.root) / run / str(version)
        return d if (d / MANIFEST).is_file() else None

    def _prune_cache(self, run: str) -> None:
        d = self.cache / run
        vs = sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())
        for v in vs[: -self.cfg.cache_keep]:
            shutil.rmtree(d / str(v), ignore_errors=True)

    async def close(self) -> None:
        """Stops the relay server (fanout=relay); nothing else is held between calls (one connection per
        request)."""
        if self.relay is not None:
            await self.relay.close()

    @staticmethod
    def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
        return load_state_dict(path)


def _bytes_buffers(data: bytes) -> transfer.Buffers:
    return lambda: [memoryview(data)]


def _expect(run: str, version: int, manifest: dict, sha256: str | None) -> None:
    if sha256 is None:
        return
    why = manifest_refusal(WeightVersion(run=run, version=version, sha256=sha256), manifest)
    if why is not None:
        raise AnnouncementRefused(version, "manifest_mismatch", why)


def _check_files(d: Path, manifest: dict, digest: str | None, chunk: int) -> None:
    """Every file of `manifest` is in `d` with its size and, unless `digest` is None, the digest
    manifest.file_digest picks for it (`digest` where the manifest has it, else sha256)."""
    for f in manifest["files"]:
        p = d / check_file_name(f["name"])
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise WeightStoreError(0, "missing_file", f"{p} is missing", str(p)) from None
        if size != f["size"]:
            raise WeightStoreError(0, "size_mismatch", f"{p} has {size} bytes, the manifest says {f['size']}", str(p))
        if digest is None:
            continue
        algo, want = file_digest(f, digest)
        if (got := hash_file(p, algo, chunk)) != want:
            raise DigestMismatch(str(p), want, got, algo)


def load_state_dict(path: str | os.PathLike, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file `path`, or of all *.safetensors files in the dir `path`."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {p}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f, device=device))
    return out
