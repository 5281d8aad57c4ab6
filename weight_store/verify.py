"""Checking a weight announcement against the store before acting on it: a forged one is refused.

The announcement (WeightVersion in the KV bucket) carries `sha256`, the digest of the version's manifest
(manifest.manifest_sha256: sha256 of its canonical bytes). A reader acts on an announced version only
when the store holds that version and its manifest hashes to the announced digest; the files are then
checked against that manifest (client.fetch). What each digest resists (docs/weight_store.md):
- a file's xxh3_128 / sha256 against the manifest: accidental corruption (xxh3 is not cryptographic);
- the manifest's sha256 in the announcement: tampering with the store's directory or the shared
  filesystem by someone who cannot write the KV (files and manifest.json rewritten to match no longer pass);
- nothing here resists someone who can write the KV: NATS permissions keep that to the trainer.

    check = StoreCheck(client, run)
    reason = await check.refusal(wv)     # None: the store holds it with the announced manifest
"""

from __future__ import annotations

import time
from collections import OrderedDict

from shared.contract.messages import WeightVersion
from weight_store.manifest import manifest_sha256
from weight_store.transfer import WeightStoreError


class AnnouncementRefused(WeightStoreError):
    """An announced version the store does not hold, or whose manifest differs from the announced digest."""

    def __init__(self, version: int, code: str, message: str):
        super().__init__(0, code, message)
        self.version = version


def manifest_refusal(wv: WeightVersion, manifest: dict) -> str | None:
    """Why `manifest` is not the one `wv` announced (None when it is)."""
    if not wv.sha256:
        return f"the announcement of version {wv.version} carries no manifest digest"
    got = manifest_sha256(manifest)
    if got != wv.sha256:
        return f"manifest of version {wv.version} has sha256 {got}, the announcement says {wv.sha256}"
    if manifest.get("version") != wv.version or manifest.get("run", wv.run) != wv.run:
        return f"manifest names run {manifest.get('run')!r} version {manifest.get('version')!r}, not {wv.version}"
    return None


class StoreCheck:
    """Does the store hold an announced version with the announced manifest? `source` has
    `manifest(run, version)` (WeightStoreError 404 when absent) and `versions(run)`, like WeightStoreClient.
    Manifests of committed versions are immutable, so found ones are cached; a miss is re-asked after
    `miss_ttl_s`."""

    def __init__(self, source, run: str, miss_ttl_s: float = 5.0, keep: int = 64):
        self.source, self.run, self.miss_ttl_s, self.keep = source, run, miss_ttl_s, keep
        self._found: OrderedDict[int, dict] = OrderedDict()
        self._missing: dict[int, float] = {}

    async def manifest(self, version: int) -> dict | None:
        if version in self._found:
            return self._found[version]
        if time.monotonic() - self._missing.get(version, -1e9) < self.miss_ttl_s:
            return None
        try:
            m = await self.source.manifest(self.run, version)
        except WeightStoreError as exc:
            if exc.status != 404:
                raise  # unreachable or failing: undecided, the caller retries
            self._missing[version] = time.monotonic()
            return None
        self._found[version] = m
        while len(self._found) > self.keep:
            self._found.popitem(last=False)
        return m

    async def refusal(self, wv: WeightVersion) -> str | None:
        """None when the store holds `wv` as announced, else why not (raises when the store cannot be asked)."""
        if wv.run != self.run:
            return f"announcement for run {wv.run!r} under run {self.run!r}"
        m = await self.manifest(wv.version)
        if m is None:
            return f"the weight store does not hold version {wv.version} of run {self.run!r}"
        return manifest_refusal(wv, m)

    async def newest(self) -> int:
        """The newest version the store holds (-1: none)."""
        vs = await self.source.versions(self.run)
        return max(vs) if vs else -1
