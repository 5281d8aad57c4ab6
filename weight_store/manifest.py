"""The manifest of a weight version: the contract between the weight store, its client, the trainer and
eval (a client-side module: no server code, importable by any service).

A committed version is the directory `<weights.root>/<run>/<version>/` holding its files and
`manifest.json` (written last, by the store, at commit):

    {"format": 1, "run": "demo", "version": 4, "step": 4, "dtype": "float32", "created_at": 1.7e9,
     "files": [{"name": "model.safetensors", "size": 123, "sha256": "<hex>"}, ...], "metadata": {...}}

Its bytes are `manifest_bytes(manifest)` (JSON, indent 1, sorted keys), and `WeightVersion.sha256` is
`manifest_sha256(manifest)`, the sha256 of those bytes (the server's `manifest_sha256` and the `ETag`
of /latest). Hosts that mount the store's directory (`weights.shared_fs`) read versions in place:
`version_dir`, `committed_versions`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def manifest_bytes(manifest: dict) -> bytes:
    """The manifest's canonical encoding, as stored in `manifest.json`."""
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def manifest_sha256(manifest: dict) -> str:
    """The digest a WeightVersion announcing this manifest carries (`WeightVersion.sha256`)."""
    return hashlib.sha256(manifest_bytes(manifest)).hexdigest()


def version_dir(root: str | os.PathLike, run: str, version: int) -> Path:
    """Where version `version` of `run` lives under the store's root directory."""
    return Path(root) / run / str(version)


def committed_versions(root: str | os.PathLike, run: str) -> list[int]:
    """The run's committed versions (a version dir holding its manifest) under `root`, oldest first."""
    d = Path(root) / run
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file())
