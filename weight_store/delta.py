"""Delta versions: version v of a run sent as its difference from an earlier version b that the reader
already holds, instead of whole (a client-side and store-side module: pure file work, no server code).

At RL learning rates most weights do not change in one step at the published precision (an update
below half an ulp leaves a bf16 value as it was), so `new XOR base` is mostly zero bytes. For each file
of v the store writes one blob under `<v>/.delta/`:

    copy  the file's sha256 equals the base's file of the same name (config.json, the tokenizer): no blob
    xor   same name and size in the base: zstd(new XOR base), byte for byte. A value that did not change
          is zero bytes; one that did is its changed bits. Reconstruction is `base XOR blob`, bit-exact
    zstd  anything else (a new file, another size): zstd(new)

and `delta.json`:

    {"format": 1, "run": "r", "version": 5, "base": 4, "manifest_sha256": "<hex>",
     "base_manifest_sha256": "<hex>", "full_bytes": 270000000, "delta_bytes": 19000000,
     "files": [{"name": "model.safetensors", "mode": "xor", "size": 19000000, "target_size": 269060552,
                "sha256": "<hex>", "xxh3_128": "<hex>"}, ...]}

`size`/`sha256`/`xxh3_128` are the blob's, `target_size` the reconstructed file's. The store writes a
delta only when it is smaller than `max_ratio` of the full version (`weights.delta_max_ratio`), so a
version is never sent as a delta that costs about what the full version does. Every version stays
whole in the store too: a reader without the base (a new worker, one that missed versions) fetches
the full version, and a chain is never longer than one link.

A reader trusts nothing here: `check_delta` validates the document against the version's manifest
(announced digest) and the base it holds; `apply_file` stops at `target_size` bytes of output (a blob
that would inflate further is refused); and the client checks every reconstructed file against the
version's manifest digest before it is used, falling back to the full download if any differs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import zstandard

from weight_store.manifest import file_digests, kind, manifest_sha256

DELTA_DIR = ".delta"
DELTA_JSON = "delta.json"
DELTA_FORMAT = 1
MODES = ("copy", "xor", "zstd")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 8 << 20


class DeltaRefused(ValueError):
    """A delta document or blob that does not describe the version it claims to (the reader fetches the
    full version instead)."""


def blob_name(name: str) -> str:
    """Where a file's blob lives under `<version>/.delta/`."""
    return f"{name}.zst"


def _xor_chunks(new: Path, base: Path):
    with open(new, "rb") as fn, open(base, "rb") as fb:
        while a := fn.read(_CHUNK):
            b = fb.read(len(a))
            yield np.bitwise_xor(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)).tobytes()


def _file_chunks(path: Path):
    with open(path, "rb") as f:
        while a := f.read(_CHUNK):
            yield a


def _compress(chunks, size: int, out: Path, level: int) -> None:
    cctx = zstandard.ZstdCompressor(level=level, threads=-1)
    with open(out, "wb") as f, cctx.stream_writer(f, size=size, closefd=False) as w:
        for c in chunks:
            w.write(c)


def build_delta(new_dir: Path, new_manifest: dict, base_dir: Path, base_manifest: dict, level: int = 3,
                max_ratio: float = 0.5) -> dict | None:
    """Write `<new_dir>/.delta/` (blobs + delta.json) describing `new_manifest`'s files against the base
    version in `base_dir`; returns the document, or None (nothing written) when a delta does not apply
    (either version is not a full model) or would not be smaller than `max_ratio` of the full version.
    Written into a temporary dir and renamed into place, so a reader sees all of it or none."""
    if kind(new_manifest) != "full" or kind(base_manifest) != "full":
        return None
    base_files = {f["name"]: f for f in base_manifest["files"]}
    full = sum(f["size"] for f in new_manifest["files"])
    tmp = new_dir / f".delta-{uuid.uuid4().hex}.tmp"
    tmp.mkdir()
    try:
        entries, total = [], 0
        for f in new_manifest["files"]:
            name, b = f["name"], base_files.get(f["name"])
            entry = {"name": name, "target_size": f["size"]}
            if b is not None and b["sha256"] == f["sha256"] and b["size"] == f["size"]:
                entries.append({**entry, "mode": "copy", "size": 0, "sha256": "", "xxh3_128": ""})
                continue
            out = tmp / blob_name(name)
            out.parent.mkdir(parents=True, exist_ok=True)
            if b is not None and b["size"] == f["size"]:
                mode, chunks = "xor", _xor_chunks(new_dir / name, base_dir / name)
            else:
                mode, chunks = "zstd", _file_chunks(new_dir / name)
            _compress(chunks, f["size"], out, level)
            size = out.stat().st_size
            total += size
            if total >= max_ratio * full:
                return None
            entries.append({**entry, "mode": mode, "size": size, **file_digests(out)})
        doc = {"format": DELTA_FORMAT, "run": new_manifest["run"], "version": new_manifest["version"],
               "base": base_manifest["version"], "manifest_sha256": manifest_sha256(new_manifest),
               "base_manifest_sha256": manifest_sha256(base_manifest), "full_bytes": full,
               "delta_bytes": total, "files": entries}
        (tmp / DELTA_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True))
        final = new_dir / DELTA_DIR
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        return doc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_delta(doc: object, manifest: dict, base_manifest: dict) -> dict:
    """The delta document `doc`, checked to describe exactly `manifest`'s files against `base_manifest`
    (both already trusted: the announced version and the base this reader verified); DeltaRefused says
    what does not fit."""
    if not isinstance(doc, dict) or doc.get("format") != DELTA_FORMAT:
        raise DeltaRefused("not a delta document of format 1")
    if doc.get("manifest_sha256") != manifest_sha256(manifest):
        raise DeltaRefused("the delta describes another manifest than the announced version's")
    if doc.get("base_manifest_sha256") != manifest_sha256(base_manifest) or doc.get("base") != base_manifest["version"]:
        raise DeltaRefused(f"the delta is against another base than version {base_manifest['version']} held here")
    files = doc.get("files")
    if not isinstance(files, list) or not all(isinstance(e, dict) for e in files):
        raise DeltaRefused("delta.files must be a list of objects")
    want = {f["name"]: f for f in manifest["files"]}
    base_files = {f["name"]: f for f in base_manifest["files"]}
    if sorted(str(e.get("name")) for e in files) != sorted(want):
        raise DeltaRefused("the delta's files are not the version's files")
    for e in files:
        name, mode, size = e["name"], e.get("mode"), e.get("size")  # names: the manifest's (checked above)
        if mode not in MODES:
            raise DeltaRefused(f"file {name!r}: unknown mode {mode!r}"[:200])
        if e.get("target_size") != want[name]["size"]:
            raise DeltaRefused(f"file {name!r}: target size is not the manifest's")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise DeltaRefused(f"file {name!r}: bad blob size")
        b = base_files.get(name)
        if mode in ("copy", "xor") and (b is None or b["size"] != want[name]["size"]):
            raise DeltaRefused(f"file {name!r}: mode {mode} needs a base file of the same size")
        if mode != "copy" and not (isinstance(e.get("sha256"), str) and _HEX64.fullmatch(e["sha256"])):
            raise DeltaRefused(f"file {name!r}: blob sha256 must be 64 hex digits")
    return doc


def apply_file(entry: dict, blob: Path | None, base: Path | None, out: Path) -> None:
    """Write the file `entry` describes to `out`: the base file (`copy`), base XOR the blob (`xor`) or the
    blob decompressed (`zstd`). Exactly `target_size` bytes: a blob that yields fewer or more is refused
    (and never inflated past `target_size`)."""
    target, mode = entry["target_size"], entry["mode"]
    out.parent.mkdir(parents=True, exist_ok=True)
    if mode == "copy":
        shutil.copyfile(base, out)
        return
    dctx = zstandard.ZstdDecompressor()
    written = 0
    try:
        with open(blob, "rb") as fz, dctx.stream_reader(fz) as r, open(out, "wb") as fo:
            fb = open(base, "rb") if mode == "xor" else None
            try:
                while written < target:
                    piece = r.read(min(_CHUNK, target - written))
                    if not piece:
                        break
                    if fb is not None:
                        b = fb.read(len(piece))
                        piece = np.bitwise_xor(np.frombuffer(piece, np.uint8), np.frombuffer(b, np.uint8)).tobytes()
                    fo.write(piece)
                    written += len(piece)
                extra = r.read(1)
            finally:
                if fb is not None:
                    fb.close()
    except zstandard.ZstdError as exc:
        raise DeltaRefused(f"file {entry['name']!r}: the blob does not decompress ({exc})") from None
    if written != target or extra:
        raise DeltaRefused(f"file {entry['name']!r}: the blob yields {'more' if extra else written} bytes, "
                           f"the manifest says {target}")
