"""Weight publishing, the trainer's side: after an optimizer step the trainer hands the full state dict to
a WeightPublisher, which makes it version v and announces it in the weights KV (compare-and-set).

- StorePublisher: writes a Hugging Face model dir and hands it to
  weight_store.client.WeightStoreClient.publish_version (upload + commit + announcement, idempotent per
  (instance, version)).
- DirectoryPublisher: writes <publish_dir>/<run>/v<version>/ (config.json + model.safetensors +
  tokenizer, and the store's manifest: weight_store.manifest.new_manifest, manifest_bytes) and announces
  it with a file:// manifest url (single host, tests), through the same
  weight_store.client.publish_and_announce as the store (idempotent per (instance, version)).
Both write a Hugging Face model dir, so `from_pretrained` (and the rollout engines) load any version;
the trainer writes it once (`stage_version`) and drops the state dict before the upload, so the
snapshot of the weights does not stay in memory while the next step trains (trainer.publish_overlap)
and a retried publish re-sends the same files;
with `trainer.lora` they write a PEFT adapter dir instead (only the adapter's bytes travel) and mark
the version `kind: lora` on the run's base model (trainer_service/lora.py, weight_store/manifest.py).
Both check announcements against what they hold (weight_store.verify.StoreCheck): `latest()` is the
KV's announcement only when the store holds it as announced (else `on_refused` is told and it is None),
`newest_stored()` the store's own newest version, and an announcement newer than the one being
published that the store does not hold is overwritten (`on_refused` told) instead of a VersionConflict.
What to retry is the trainer's call (`retryable_publish_error`; Trainer._publish retries with back-off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shared.config import JetrlConfig
from shared.contract.messages import WeightVersion
from shared.io.linktree import link_tree
from weight_store.announce import VersionConflict, latest
from weight_store.client import VersionTakenError, WeightStoreClient, WeightStoreError, publish_and_announce
from weight_store.manifest import MANIFEST, file_digests, manifest_bytes, manifest_sha256, new_manifest
from weight_store.verify import StoreCheck

log = logging.getLogger("jetrl.trainer.publish")

__all__ = ["DirectoryPublisher", "StagedVersion", "StorePublisher", "VersionConflict", "VersionTakenError",
           "WeightPublisher", "make_publisher", "retryable_publish_error", "stage_version", "write_hf_dir",
           "write_version_dir"]


class WeightPublisher(Protocol):
    staging_root: Path | None  # where stage_version writes for this publisher (None: the system temp dir)
    on_refused: Any  # async (WeightVersion, why) -> None: an announcement the store does not hold

    async def latest(self) -> WeightVersion | None: ...
    async def newest_stored(self) -> int: ...
    async def publish(self, version: int, step: int, state: dict | StagedVersion, hf_config: Any, tokenizer: Any,
                      metadata: dict | None = None, short: int = 0) -> WeightVersion: ...
    async def close(self) -> None: ...


@dataclass
class StagedVersion:
    """A version's files, written once by `stage_version` to `path`; `adapter` is the manifest's
    adapter object with trainer.lora, else None. The owner removes it with `discard()`."""

    path: Path
    adapter: dict | None

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def stage_version(cfg: JetrlConfig, state_dict: dict, hf_config: Any, tokenizer: Any,
                  parent: Path | None = None) -> StagedVersion:
    """Write a version's files into a new temporary dir under `parent` (blocking: run it in a thread)."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=".staged-", dir=parent))
    try:
        return StagedVersion(path, write_version_dir(path, cfg, state_dict, hf_config, tokenizer))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


async def _staged(cfg: JetrlConfig, state: dict | StagedVersion, hf_config: Any, tokenizer: Any,
                  parent: Path | None) -> tuple[StagedVersion, bool]:
    """`state` as files: (staged version, whether this call wrote it and so must discard it)."""
    if isinstance(state, StagedVersion):
        return state, False
    return await asyncio.to_thread(stage_version, cfg, state, hf_config, tokenizer, parent), True


def write_version_dir(out: Path, cfg: JetrlConfig, state_dict: dict, hf_config: Any, tokenizer: Any) -> dict | None:
    """Write a version's files to `out`: an adapter dir with trainer.lora (returns the manifest's
    `adapter` object), else a HF model dir (returns None)."""
    if cfg.trainer.lora is not None:
        from trainer_service import lora

        lora.write_adapter_dir(out, state_dict, cfg.trainer.lora, cfg.model)
        return lora.adapter_info(cfg)
    write_hf_dir(out, cast_floats(state_dict, cfg.trainer.publish_dtype), hf_config, tokenizer,
                 tiny=not cfg.model.path)
    return None


def cast_floats(state_dict: dict, dtype: str) -> dict:
    """`state_dict` with its floating-point tensors in `dtype` (trainer.publish_dtype; as_trained = as is)."""
    if dtype == "as_trained":
        return state_dict
    import torch

    to = getattr(torch, dtype)
    return {k: v.to(to) if v.is_floating_point() else v for k, v in state_dict.items()}


def write_hf_dir(out: Path, state_dict: dict, hf_config: Any, tokenizer: Any, tiny: bool) -> Path:
    """A from_pretrained-loadable dir: config.json, model.safetensors, and the tokenizer."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer is not None:
        if tiny:
            from shared.model.tinymodel import save_tokenizer

            save_tokenizer(tokenizer, out / "tokenizer")
        else:
            tokenizer.save_pretrained(out)
    return out


# --- retry policy ----------------------------------------------------------------------------------


def retryable_publish_error(exc: BaseException) -> bool:
    """A publish failure that a later attempt can get past: the weight store or NATS is unreachable or
    restarting (connection refused or cut, timeouts, a 5xx answer, NATS client errors). Not: a version
    conflict (another trainer), a refused request (4xx), a bug."""
    from nats.errors import Error as NatsError

    if isinstance(exc, (VersionConflict, VersionTakenError)):
        return False
    if isinstance(exc, WeightStoreError):
        return exc.status >= 500
    return isinstance(exc, (OSError, NatsError))


# --- publishers -------------------------------------------------------------------------------------


async def _verified_latest(pub, check: StoreCheck) -> WeightVersion | None:
    """The KV's announcement when the store holds it as announced; else None (and `pub.on_refused` told)."""
    wv = await latest(pub.js, pub.cfg.run)
    if wv is None:
        return None
    why = await check.refusal(wv)
    if why is None:
        return wv
    log.error("run %s: ignoring the announced version %d: %s", pub.cfg.run, wv.version, why)
    if pub.on_refused is not None:
        await pub.on_refused(wv, why)
    return None


class _Directory:
    """The `directory` publisher's dir as a version store, like WeightStoreClient: committed versions
    (`commit`; `manifest`, `versions`, `manifest_url`) and their StoreCheck (`store_check`), for
    weight_store.client.publish_and_announce."""

    def __init__(self, root: Path, run: str):
        self.root = root
        self.check = StoreCheck(self, run)

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    async def manifest(self, run: str, version: int) -> dict:
        p = self.version_dir(version) / MANIFEST
        try:
            return json.loads(p.read_bytes())
        except FileNotFoundError:
            raise WeightStoreError(404, "not_found", f"{p} does not exist") from None

    async def versions(self, run: str) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in self.root.glob("v*") if p.name[1:].isdigit() and (p / MANIFEST).is_file())

    def manifest_url(self, run: str, version: int) -> str:
        return (self.version_dir(version) / MANIFEST).resolve().as_uri()

    def store_check(self, run: str) -> StoreCheck:
        return self.check

    def commit(self, run: str, version: int, step: int, staged: StagedVersion, metadata: dict | None) -> WeightVersion:
        """(Blocking.) `staged`'s files (hard-linked) and their manifest (weight_store.manifest.new_manifest)
        as v<version>/, in one rename; WeightStoreError 409 `exists` when that dir is already there."""
        final, tmp = self.version_dir(version), self.root / f".v{version:08d}.tmp"
        if final.exists():
            raise WeightStoreError(409, "exists", f"{final} is already committed")
        shutil.rmtree(tmp, ignore_errors=True)
        link_tree(staged.path, tmp)
        files = [{"name": str(p.relative_to(tmp)), "size": p.stat().st_size, **file_digests(p)}  # sha256, xxh3_128
                 for p in sorted(tmp.rglob("*")) if p.is_file()]
        manifest = new_manifest(run, version, step, files, metadata=metadata, adapter=staged.adapter)
        (tmp / MANIFEST).write_bytes(manifest_bytes(manifest))
        try:
            tmp.rename(final)  # refuses a non-empty existing target
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists():
                raise WeightStoreError(409, "exists", f"{final} is already committed") from None
            raise
        return WeightVersion(run=run, version=version, step=step, files=files, sha256=manifest_sha256(manifest),
                             manifest_url=self.manifest_url(run, version), created_at=manifest["created_at"])


class DirectoryPublisher:
    """Versions as <publish_dir>/<run>/v<version>/, committed (`_Directory.commit`) and announced through
    weight_store.client.publish_and_announce, the store publisher's own path."""

    def __init__(self, cfg: JetrlConfig, js):
        self.cfg, self.js = cfg, js
        self.root = Path(cfg.trainer.publish_dir) / cfg.run
        self.staging_root = self.root  # staged files hard-link into the version dir (same filesystem)
        self.dir = _Directory(self.root, cfg.run)
        self.check = self.dir.check
        self.on_refused = None

    async def latest(self) -> WeightVersion | None:
        return await _verified_latest(self, self.check)

    async def newest_stored(self) -> int:
        return await self.check.newest()

    async def publish(self, version, step, state, hf_config, tokenizer, metadata=None, short=0) -> WeightVersion:
        run = self.cfg.run
        staged, own = await _staged(self.cfg, state, hf_config, tokenizer, self.staging_root)
        try:
            return await publish_and_announce(
                self.js, self.dir, run, version, step, metadata,
                lambda: asyncio.to_thread(self.dir.commit, run, version, step, staged, metadata),
                on_forged=self.on_refused, short=short)
        finally:
            if own:
                staged.discard()

    async def close(self) -> None:
        return None


class StorePublisher:
    """The weight store: one WeightStoreClient.publish_version call per version."""

    def __init__(self, cfg: JetrlConfig, js):
        self.cfg, self.js = cfg, js
        self.client = WeightStoreClient(cfg.weights)
        self.staging_root: Path | None = None
        self.on_refused = None

    async def latest(self) -> WeightVersion | None:
        return await _verified_latest(self, self.client.store_check(self.cfg.run))

    async def newest_stored(self) -> int:
        return await self.client.store_check(self.cfg.run).newest()

    async def publish(self, version, step, state, hf_config, tokenizer, metadata=None, short=0) -> WeightVersion:
        staged, own = await _staged(self.cfg, state, hf_config, tokenizer, self.staging_root)
        try:
            return await self.client.publish_version(self.js, self.cfg.run, version, staged.path, step=step,
                                                     metadata=metadata, adapter=staged.adapter,
                                                     on_forged=self.on_refused, short=short)
        finally:
            if own:
                staged.discard()

    async def close(self) -> None:
        await self.client.close()


def make_publisher(cfg: JetrlConfig, js) -> WeightPublisher:
    if cfg.trainer.publisher == "directory":
        return DirectoryPublisher(cfg, js)
    return StorePublisher(cfg, js)
