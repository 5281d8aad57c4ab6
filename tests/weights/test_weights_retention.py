"""Retention (newest K + pinned, never a version being downloaded) and readers racing commits."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

import torch
from weights_helpers import raw_request, state_dict

from weight_store import transfer
from weight_store.client import WeightStoreClient


async def test_retention_keeps_the_newest_k_plus_pinned_versions(store, tmp_path):
    srv = store(keep_last=2)
    client = WeightStoreClient(srv.cfg)
    sd = state_dict(n=1)
    await client.publish("ret", 0, sd)
    await client.pin("ret", 0)
    for v in range(1, 5):
        await client.publish("ret", v, sd)
    assert await client.versions("ret") == [0, 3, 4]
    assert sorted(int(p.name) for p in (tmp_path / "root" / "ret").iterdir()) == [0, 3, 4]
    listing = json.loads(raw_request(srv.url, target="/v1/runs/ret/versions")[2])
    assert listing["pinned"] == [0] and listing["latest"] == 4
    await client.unpin("ret", 0)
    assert await client.versions("ret") == [3, 4]


async def test_retention_never_deletes_a_version_while_it_is_being_downloaded(store):
    srv = store(keep_last=1, chunk_mb=1)
    client = WeightStoreClient(srv.cfg)
    sd = {"w": torch.randn(4096, 4096)}  # 64 MiB: more than the socket buffers hold
    wv = await client.publish("busy", 0, sd)
    f = wv.files[0]
    # a slow reader: reads the head and a little of the body, then stalls
    s = socket.create_connection(("127.0.0.1", srv.cfg.port))
    s.sendall(f"GET /v1/runs/busy/versions/0/files/{f['name']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")
    await client.publish("busy", 1, sd)  # retention would remove version 0 now...
    assert await client.versions("busy") == [0, 1]  # ...but a reader is on it
    h = hashlib.sha256()
    head, _, body = got.partition(b"\r\n\r\n")
    h.update(body)
    n = len(body)

    def drain() -> int:
        nonlocal n
        while n < f["size"]:
            chunk = s.recv(1 << 20)
            assert chunk, "download cut"
            h.update(chunk)
            n += len(chunk)
        s.close()
        return n

    await asyncio.to_thread(drain)
    assert h.hexdigest() == f["sha256"]  # the reader got every byte of the version it asked for
    deadline = time.monotonic() + 20
    while await client.versions("busy") != [1]:  # once the reader is gone, retention catches up
        assert time.monotonic() < deadline, await client.versions("busy")
        await asyncio.sleep(0.05)


async def test_readers_polling_latest_while_versions_commit_never_see_a_partial_version(store, tmp_path):
    srv = store(keep_last=50, shard_size_mb=1)
    client = WeightStoreClient(srv.cfg)
    root = tmp_path / "root" / "race"
    n_versions = 8
    done = asyncio.Event()
    seen: list[int] = []
    problems: list[str] = []

    def check(manifest: dict) -> None:
        vdir = root / str(manifest["version"])
        names = sorted(p.relative_to(vdir).as_posix() for p in vdir.rglob("*") if p.is_file())
        if any(n.startswith(".delta/") for n in names) and ".delta/delta.json" not in names:
            problems.append(f"v{manifest['version']}: a delta without its document")
        if ".pieces.json" not in names:
            problems.append(f"v{manifest['version']}: no piece digests")
        # the version's delta (weight_store/delta.py) and piece digests (weight_store/pieces.py)
        names = [n for n in names if not n.startswith(".delta/") and n != ".pieces.json"]
        want = sorted([f["name"] for f in manifest["files"]] + ["manifest.json"])
        if names != want:
            problems.append(f"v{manifest['version']}: on disk {names}, manifest {want}")
        for f in manifest["files"]:
            if (vdir / f["name"]).stat().st_size != f["size"]:
                problems.append(f"v{manifest['version']}: {f['name']} has the wrong size")

    async def reader() -> None:
        last = -1
        while not done.is_set():
            try:
                status, _, raw = await asyncio.to_thread(transfer.request, "GET", srv.url + "/v1/runs/race/latest")
            except transfer.WeightStoreError as exc:
                assert exc.status == 404  # before the first commit
                await asyncio.sleep(0)
                continue
            m = json.loads(raw)
            if m["version"] < last:
                problems.append(f"latest went back from {last} to {m['version']}")
            last = m["version"]
            seen.append(last)
            check(m)
            # the newest version's first file downloads whole and matches its digest
            f = m["files"][0]
            _, _, body = await asyncio.to_thread(transfer.request, "GET", transfer.file_url(
                srv.url, "race", m["version"], f["name"]))
            if hashlib.sha256(body).hexdigest() != f["sha256"]:
                problems.append(f"v{m['version']}: {f['name']} does not match its sha256")

    readers = [asyncio.create_task(reader()) for _ in range(3)]
    for v in range(n_versions):
        await client.publish("race", v, state_dict(n=6, seed=v))
    await asyncio.sleep(0.2)
    done.set()
    await asyncio.gather(*readers)
    assert not problems, problems[:5]
    assert seen and max(seen) == n_versions - 1
