"""Weight publishing behind one small protocol: after an optimizer step the trainer hands the full
state dict to a WeightPublisher, which stores it as version v and announces it in the weights KV (CAS).

- StorePublisher: weight_store.client.WeightStoreClient.publish + weight_store.announce.announce.
- DirectoryPublisher: writes <publish_dir>/<run>/v<version>/ (config.json + model.safetensors +
  tokenizer) and announces it with a file:// manifest url (single host, tests).
Both write a Hugging Face model dir, so `from_pretrained` (and the rollout engines) load any version.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from shared import codec, subjects
from shared.config import JetrlConfig
from shared.messages import WeightVersion

log = logging.getLogger("jetrl.trainer.publish")


class VersionConflictError(RuntimeError):
    """That version (or a newer one) is already announced for the run: another trainer published it."""


class VersionTakenError(RuntimeError):
    """The weight store already holds this version from another trainer instance that never announced
    it (it died between commit and announcement): skip the number, the store's versions are immutable."""


class WeightPublisher(Protocol):
    async def latest(self) -> WeightVersion | None: ...
    async def publish(self, version: int, step: int, state_dict: dict, hf_config: Any, tokenizer: Any,
                      metadata: dict | None = None) -> WeightVersion: ...
    async def close(self) -> None: ...


def write_hf_dir(out: Path, state_dict: dict, hf_config: Any, tokenizer: Any, tiny: bool) -> Path:
    """A from_pretrained-loadable dir: config.json, model.safetensors, and the tokenizer."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer is not None:
        if tiny:
            from shared.tinymodel import save_tokenizer

            save_tokenizer(tokenizer, out / "tokenizer")
        else:
            tokenizer.save_pretrained(out)
    return out


# --- announcements ----------------------------------------------------------------------------------


async def announce(js, wv: WeightVersion) -> int:
    """Announce through weight_store.announce when it is installed, else the same KV CAS here."""
    try:
        from weight_store import announce as ws_announce
    except ImportError:
        ws_announce = None
    if ws_announce is not None:
        try:
            return await ws_announce.announce(js, wv)
        except ws_announce.VersionConflict as exc:
            revision = await _revision_holding(js, wv)
            if revision is not None:
                return revision
            raise VersionConflictError(str(exc)) from exc
    from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    data = codec.encode(wv)
    try:
        entry = await kv.get(wv.run)
    except KeyNotFoundError:
        entry = None
    if entry is None or entry.value is None:
        try:
            return await kv.create(wv.run, data)
        except Exception as exc:
            raise VersionConflictError(f"run {wv.run}: another trainer announced first ({exc})") from exc
    have = codec.decode(entry.value, WeightVersion)
    if _same(have, wv):
        return entry.revision  # a retry of an announcement that went through (its reply was lost)
    if have.version >= wv.version:
        raise VersionConflictError(f"run {wv.run}: version {have.version} is already announced, cannot announce "
                                   f"{wv.version}")
    try:
        return await kv.update(wv.run, data, last=entry.revision)
    except KeyWrongLastSequenceError as exc:
        raise VersionConflictError(f"run {wv.run}: the weights key changed while announcing {wv.version}") from exc


def _same(have: WeightVersion, wv: WeightVersion) -> bool:
    """The same announcement: version and manifest digest (the manifest names the publishing instance)."""
    return bool(wv.sha256) and have.version == wv.version and have.sha256 == wv.sha256


async def _revision_holding(js, wv: WeightVersion) -> int | None:
    """The KV revision if the key already holds exactly `wv`: an earlier attempt of this announcement
    went through and only its reply was lost, so announcing it again is a no-op."""
    from nats.js.errors import KeyNotFoundError

    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    try:
        entry = await kv.get(wv.run)
    except KeyNotFoundError:
        return None
    if entry is None or not entry.value:
        return None
    return entry.revision if _same(codec.decode(entry.value, WeightVersion), wv) else None


async def latest_announced(js, run: str) -> WeightVersion | None:
    try:
        from weight_store import announce as ws_announce
    except ImportError:
        ws_announce = None
    if ws_announce is not None:
        return await ws_announce.latest(js, run)
    from nats.js.errors import KeyNotFoundError

    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    try:
        entry = await kv.get(run)
    except KeyNotFoundError:
        return None
    return codec.decode(entry.value, WeightVersion) if entry and entry.value else None


def retryable_publish_error(exc: BaseException) -> bool:
    """A publish failure that a later attempt can get past: the weight store or NATS is unreachable or
    restarting (connection refused or cut, timeouts, a 5xx answer, NATS client errors). Not: a version
    conflict (another trainer), a refused request (4xx), a bug."""
    from nats.errors import Error as NatsError

    from weight_store.transfer import WeightStoreError

    if isinstance(exc, (VersionConflictError, VersionTakenError)):
        return False
    if isinstance(exc, WeightStoreError):
        return exc.status >= 500
    return isinstance(exc, (OSError, NatsError))


# --- publishers -------------------------------------------------------------------------------------


class DirectoryPublisher:
    def __init__(self, cfg: JetrlConfig, js):
        self.cfg, self.js = cfg, js
        self.root = Path(cfg.trainer.publish_dir) / cfg.run

    async def latest(self) -> WeightVersion | None:
        return await latest_announced(self.js, self.cfg.run)

    async def publish(self, version, step, state_dict, hf_config, tokenizer, metadata=None) -> WeightVersion:
        final = self.root / f"v{version:08d}"
        tmp = self.root / f".v{version:08d}.tmp"

        def write() -> list[dict]:
            shutil.rmtree(tmp, ignore_errors=True)
            write_hf_dir(tmp, state_dict, hf_config, tokenizer, tiny=not self.cfg.model.path)
            files = []
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    files.append({"name": str(p.relative_to(tmp)), "size": p.stat().st_size,
                                  "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
            manifest = {"run": self.cfg.run, "version": version, "step": step, "files": files,
                        "metadata": metadata or {}}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            return files

        files = await asyncio.to_thread(write)
        sha = hashlib.sha256((final / "manifest.json").read_bytes()).hexdigest()
        wv = WeightVersion(run=self.cfg.run, version=version, step=step, files=files, sha256=sha,
                           manifest_url=(final / "manifest.json").resolve().as_uri())
        await announce(self.js, wv)
        return wv

    async def close(self) -> None:
        return None


class StorePublisher:
    """weight_store's client (upload + commit) and announcement; imported lazily."""

    def __init__(self, cfg: JetrlConfig, js):
        from weight_store.client import WeightStoreClient

        self.cfg, self.js = cfg, js
        self.client = WeightStoreClient(cfg.weights)

    async def latest(self) -> WeightVersion | None:
        return await latest_announced(self.js, self.cfg.run)

    async def publish(self, version, step, state_dict, hf_config, tokenizer, metadata=None) -> WeightVersion:
        from weight_store.client import WeightStoreError

        with tempfile.TemporaryDirectory(prefix=f"jetrl-publish-v{version}-") as d:
            await asyncio.to_thread(write_hf_dir, Path(d), state_dict, hf_config, tokenizer, not self.cfg.model.path)
            try:
                wv = await self.client.publish(self.cfg.run, version, Path(d), step=step, metadata=metadata)
            except WeightStoreError as exc:
                if exc.status != 409 or exc.code != "exists":
                    raise
                wv = await self._committed_before(version, step, metadata or {})
        await announce(self.js, wv)
        return wv

    async def _committed_before(self, version: int, step: int, metadata: dict) -> WeightVersion:
        """The store already has `version`. Committed by an earlier attempt of this very publish (the
        commit's reply was lost): use it. Committed by another trainer instance: if that version (or a
        newer one) is announced, another trainer is ahead (VersionConflictError); if not, it died between
        commit and announcement (VersionTakenError: skip the number)."""
        import hashlib

        from weight_store.storage import manifest_bytes

        m = await self.client.manifest(self.cfg.run, version)
        if m.get("step") != step or m.get("metadata") != metadata:
            announced = await self.latest()
            if announced is not None and announced.version >= version:
                raise VersionConflictError(f"run {self.cfg.run!r}: version {announced.version} is already announced, "
                                           f"cannot publish {version}")
            raise VersionTakenError(
                f"run {self.cfg.run!r}: version {version} is already in the weight store from another trainer "
                f"instance (step {m.get('step')}, metadata {m.get('metadata')}), but was never announced")
        return WeightVersion(run=self.cfg.run, version=version, step=step,
                             manifest_url=self.client.manifest_url(self.cfg.run, version),
                             files=m["files"], sha256=hashlib.sha256(manifest_bytes(m)).hexdigest(),
                             created_at=m["created_at"])

    async def close(self) -> None:
        await self.client.close()


def make_publisher(cfg: JetrlConfig, js) -> WeightPublisher:
    if cfg.trainer.publisher == "directory":
        return DirectoryPublisher(cfg, js)
    return StorePublisher(cfg, js)
