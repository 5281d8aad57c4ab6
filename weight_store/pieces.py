"""A version cut into pieces for relay fan-out (weight_store/relay.py): fixed-size byte ranges of its files,
each with its xxh3_128, so a host can check a piece it got from a peer before it writes or forwards it.

The store writes `<version>/.pieces.json` at commit (Storage.commit, before the version appears):

    {"format": 1, "manifest_sha256": "<hex>", "piece_size": 4194304,
     "files": {"model.safetensors": ["<xxh3_128 of bytes 0..4 MiB>", ...], "config.json": ["<hex>"]}}

A reader takes this document from the store only (never from a peer) and checks that it belongs to the
announced manifest (`check_pieces`); the whole-file digests of the manifest are checked at the end as
for any fetch, so a piece list that lies is caught there too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import xxhash

from weight_store.manifest import manifest_sha256

PIECES_JSON = ".pieces.json"
PIECES_FORMAT = 1
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Piece:
    index: int  # position in the version: files in manifest order, then offset
    name: str
    offset: int
    length: int
    xxh3_128: str


def piece_digests(path: Path, piece_size: int) -> list[str]:
    """The xxh3_128 of each `piece_size` range of the file (one for an empty file)."""
    out = []
    with open(path, "rb") as f:
        while True:
            data = f.read(piece_size)
            if not data and out:
                break
            out.append(xxhash.xxh3_128_hexdigest(data))
            if len(data) < piece_size:
                break
    return out


def write_pieces(version_dir: Path, manifest: dict, piece_size: int) -> dict:
    doc = {"format": PIECES_FORMAT, "manifest_sha256": manifest_sha256(manifest), "piece_size": piece_size,
           "files": {f["name"]: piece_digests(version_dir / f["name"], piece_size) for f in manifest["files"]}}
    (version_dir / PIECES_JSON).write_text(json.dumps(doc, sort_keys=True))
    return doc


def check_pieces(doc: object, manifest: dict) -> list[Piece]:
    """The pieces of the announced `manifest`, from the store's document; ValueError when it does not fit."""
    if not isinstance(doc, dict) or doc.get("format") != PIECES_FORMAT:
        raise ValueError("not a pieces document of format 1")
    if doc.get("manifest_sha256") != manifest_sha256(manifest):
        raise ValueError("the pieces document is for another manifest")
    size, files = doc.get("piece_size"), doc.get("files")
    if isinstance(size, bool) or not isinstance(size, int) or not 4096 <= size <= 1 << 30:
        raise ValueError("piece_size must be an integer in 4096..1 GiB")
    if not isinstance(files, dict) or sorted(files) != sorted(f["name"] for f in manifest["files"]):
        raise ValueError("the pieces document lists other files than the manifest")
    pieces: list[Piece] = []
    for f in manifest["files"]:
        digests = files[f["name"]]
        n = max(1, -(-f["size"] // size))
        if not isinstance(digests, list) or len(digests) != n or not all(
                isinstance(d, str) and _HEX32.fullmatch(d) for d in digests):
            raise ValueError(f"file {f['name']!r}: expected {n} xxh3_128 digests")
        for k, d in enumerate(digests):
            off = k * size
            pieces.append(Piece(len(pieces), f["name"], off, min(size, f["size"] - off), d))
    return pieces
