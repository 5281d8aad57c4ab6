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
    if have.version >= wv.version:
        raise VersionConflictError(f"run {wv.run}: version {have.version} is already announced, cannot announce "
                                   f"{wv.version}")
    try:
        return await kv.update(wv.run, data, last=entry.revision)
    except KeyWrongLastSequenceError as exc:
        raise VersionConflictError(f"run {wv.run}: the weights key changed while announcing {wv.version}") from exc


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
        with tempfile.TemporaryDirectory(prefix=f"jetrl-publish-v{version}-") as d:
            await asyncio.to_thread(write_hf_dir, Path(d), state_dict, hf_config, tokenizer, not self.cfg.model.path)
            wv = await self.client.publish(self.cfg.run, version, Path(d), step=step, metadata=metadata)
        await announce(self.js, wv)
        return wv

    async def close(self) -> None:
        await self.client.close()


def make_publisher(cfg: JetrlConfig, js) -> WeightPublisher:
    if cfg.trainer.publisher == "directory":
        return DirectoryPublisher(cfg, js)
    return StorePublisher(cfg, js)
