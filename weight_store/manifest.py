"""The manifest of a weight version: the contract between the weight store, its client, the trainer and
eval (a client-side module: no server code, importable by any service).

A committed version is the directory `<weights.root>/<run>/<version>/` holding its files and
`manifest.json` (written last, by the store, at commit; the trainer's `directory` publisher writes the
same manifest into its own dirs), built by `new_manifest`, the one writer of its fields:

    {"format": 1, "run": "demo", "version": 4, "step": 4, "dtype": "float32", "created_at": 1.7e9,
     "files": [{"name": "model.safetensors", "size": 123, "sha256": "<hex>", "xxh3_128": "<hex>"}, ...],
     "metadata": {...}}

Each file carries its sha256 (declared by the uploader, checked by the store) and, from stores of jetrl
0.3.3 on, its xxh3_128 (32 hex digits, computed by the store from the bytes it received). Readers check
the digest `weights.digest` names (`file_digest`): xxh3_128 by default, since hashing a GiB with sha256
costs ~0.6 s of a core, and four workers fetching at once on one host spent ~40 % of their time on it
(docs/benchmarks.md); sha256 where the manifest has no xxh3_128.

A LoRA version (a PEFT adapter dir: adapter_config.json + adapter_model.safetensors) adds

    "kind": "lora", "adapter": {"base_model": "HuggingFaceTB/SmolLM2-135M", "base_sha256": "<hex>", "rank": 8,
                                "alpha": 16.0, "target_modules": ["q_proj", "v_proj"], "modules_to_save": []}

(`check_adapter` validates it; a manifest without `kind` is a full model, kind `full`). A worker applies
an adapter only on the base whose sha256 it names (shared/model/adapters.py, base_fingerprint).

Its bytes are `manifest_bytes(manifest)` (JSON, indent 1, sorted keys), and `WeightVersion.sha256` is
`manifest_sha256(manifest)`, the sha256 of those bytes (the server's `manifest_sha256` and the `ETag`
of /latest). Hosts that mount the store's directory (`weights.shared_fs`) read versions in place:
`version_dir`, `committed_versions`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import xxhash

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MODULE = re.compile(r"[A-Za-z0-9_.]{1,128}")


def new_hasher(algo: str):
    """A hashlib-style hasher (`update`, `hexdigest`) for a manifest digest: xxh3_128 or sha256."""
    if algo == "xxh3_128":
        return xxhash.xxh3_128()
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest {algo!r} (xxh3_128 or sha256)")


def file_digests(path: str | os.PathLike, algos: tuple[str, ...] = ("sha256", "xxh3_128"),
                 chunk: int = 8 << 20) -> dict[str, str]:
    """{algorithm: hex digest} of a file for each of `algos` (new_hasher), in one read of `chunk` pieces."""
    hs = {a: new_hasher(a) for a in algos}
    buf = bytearray(chunk)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(mv):
            for h in hs.values():
                h.update(mv[:n])
    return {a: h.hexdigest() for a, h in hs.items()}


def hash_file(path: str | os.PathLike, algo: str = "sha256", chunk: int = 8 << 20) -> str:
    """The hex digest (new_hasher: sha256 or xxh3_128) of a file, read in `chunk` pieces."""
    return file_digests(path, (algo,), chunk)[algo]


def file_digest(entry: dict, prefer: str) -> tuple[str, str]:
    """(algorithm, hex) to check a manifest file entry with: `prefer` where the entry carries it, else
    its sha256 (every entry has one)."""
    got = entry.get(prefer)
    if isinstance(got, str) and got:
        return prefer, got
    return "sha256", entry["sha256"]


def kind(manifest: dict) -> str:
    """`lora` for an adapter version, `full` for a whole model."""
    return manifest.get("kind", "full")


def check_adapter(adapter: object) -> dict:
    """The `adapter` object of a LoRA version's manifest, checked; ValueError names what is wrong."""
    if not isinstance(adapter, dict):
        raise ValueError("adapter must be an object")
    want = {"base_model", "base_sha256", "rank", "alpha", "target_modules", "modules_to_save"}
    if set(adapter) != want:
        raise ValueError(f"adapter must have exactly the fields {sorted(want)}, got {sorted(adapter)}"[:300])
    if not isinstance(adapter["base_model"], str) or not 0 < len(adapter["base_model"]) <= 512:
        raise ValueError("adapter.base_model must be a string of 1..512 characters")
    if not isinstance(adapter["base_sha256"], str) or not _HEX64.fullmatch(adapter["base_sha256"]):
        raise ValueError("adapter.base_sha256 must be 64 lowercase hex digits")
    r = adapter["rank"]
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 1024:
        raise ValueError(f"adapter.rank must be an integer in 1..1024, got {r!r}"[:200])
    a = adapter["alpha"]
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not a > 0:
        raise ValueError(f"adapter.alpha must be a positive number, got {a!r}"[:200])
    for field in ("target_modules", "modules_to_save"):
        v = adapter[field]
        if not isinstance(v, list) or len(v) > 256 or not all(isinstance(m, str) and _MODULE.fullmatch(m) for m in v):
            raise ValueError(f"adapter.{field} must be a list of module names")
    if not adapter["target_modules"]:
        raise ValueError("adapter.target_modules must name at least one module")
    return adapter


def new_manifest(run: str, version: int, step: int, files: list[dict], dtype: str = "",
                 metadata: dict | None = None, adapter: dict | None = None) -> dict:
    """A version's manifest (the fields above; `created_at` now): `files` as {name, size, sha256,
    xxh3_128}, `adapter` (already checked, `check_adapter`) making it a LoRA version."""
    manifest = {"format": MANIFEST_FORMAT, "run": run, "version": version, "step": step, "dtype": dtype,
                "created_at": time.time(), "files": files, "metadata": metadata or {}}
    if adapter is not None:
        manifest["kind"] = "lora"
        manifest["adapter"] = adapter
    return manifest


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
